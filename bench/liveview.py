"""What the live view costs: CPU of the supervisor with 20 running tasks.

Each run: a fresh tmp repository and ``FLEETRUN_HOME``, 20 tasks whose agent is the
fake Claude Code (``fleetrun.testing.fake_claude``) writing a file every 2 s for about
20 s (so each row's "last tool call" changes and the view has logs to read), all 20
at once (``--max-tasks 20``), ``fleetrun tasks.toml`` on a real pty (pexpect), its
output drained. Two ways in the same run, alternating:

- **baseline**: the pty's ``TERM=dumb``: the same run, the same transition lines, no
  live view;
- **live**: ``TERM=xterm``: the live region redrawn from the loop's wait.

Measured: the supervisor process's own CPU (user + system, psutil) over a window of
``--window`` seconds that starts once all 20 tasks are RUNNING (the shepherds and
agents are not its children and do not count). Printed: CPU seconds per second of
each run, the medians, and the ratio live / baseline.

Run::

    python bench/liveview.py                 # once each way
    python bench/liveview.py --repeat 3      # the median of 3 runs each way
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GIT_ENV = {
    "GIT_AUTHOR_NAME": "bench",
    "GIT_AUTHOR_EMAIL": "bench@example.invalid",
    "GIT_COMMITTER_NAME": "bench",
    "GIT_COMMITTER_EMAIL": "bench@example.invalid",
}


def git(cwd: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(cwd), *args],
        check=True,
        env=dict(os.environ, **GIT_ENV),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    )


def setup(work: Path, n: int, seconds: float) -> dict[str, str]:
    """The repository, the tasks, the fake claude; :return: the environment to run in."""
    from fleetrun.testing import fake_claude

    repo = work / "repo"
    repo.mkdir(parents=True)
    git(repo, "init", "-q")
    git(repo, "symbolic-ref", "HEAD", "refs/heads/main")
    (repo / "README.md").write_text("bench\n")
    git(repo, "add", "README.md")
    git(repo, "commit", "-q", "-m", "initial commit")
    fake = work / "fake"
    (fake / "bin").mkdir(parents=True)
    (fake / "claude-config").mkdir()
    exe = fake / "bin" / "claude"
    exe.write_text(
        f'#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(str(Path(fake_claude.__file__).parent))} "$@"\n'
    )
    exe.chmod(0o755)
    steps = max(1, int(seconds / 2))
    actions = [a for i in range(steps) for a in (["write", f"f{i}.txt", "x"], ["sleep", 2])]
    (fake / "scenario.json").write_text(json.dumps({"default": [{"actions": actions, "cost": 0.01}]}))
    home = work / "home"
    home.mkdir()
    (home / "config.toml").write_text(f'[claude]\nexecutable = "{exe}"\n')
    lines = []
    for i in range(n):
        lines += ["[[task]]", f'name = "t{i:02d}"', 'cwd = "repo"', 'prompt = "p"', 'git_ref = "main"', ""]
    (work / "tasks.toml").write_text("\n".join(lines))
    return dict(
        os.environ,
        FLEETRUN_HOME=str(home),
        FAKE_CLAUDE_SCENARIO=str(fake / "scenario.json"),
        FAKE_CLAUDE_STATE=str(fake),
        CLAUDE_CONFIG_DIR=str(fake / "claude-config"),
        PATH=f"{fake / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        **GIT_ENV,
    )


def running(home: Path) -> int:
    try:
        db = sqlite3.connect(f"file:{home / 'state.db'}?mode=ro", uri=True, timeout=1)
        try:
            return int(db.execute("SELECT COUNT(*) FROM tasks WHERE state='RUNNING'").fetchone()[0])
        finally:
            db.close()
    except sqlite3.Error:
        return 0


def one_run(live: bool, n: int, seconds: float, window: float) -> float:
    """:return: the supervisor's CPU seconds per second over the window."""
    import pexpect
    import psutil

    with tempfile.TemporaryDirectory(prefix="fleetrun-bench-live-") as tmp:
        work = Path(tmp)
        env = setup(work, n, seconds)
        env.pop("NO_COLOR", None)
        env["TERM"] = "xterm" if live else "dumb"
        child = pexpect.spawn(
            sys.executable,
            ["-m", "fleetrun", "tasks.toml", "--max-tasks", str(n)],
            cwd=str(work),
            env=env,
            dimensions=(50, 140),
            timeout=5,
        )
        proc = psutil.Process(child.pid)
        home = work / "home"
        out = b""
        t0 = cpu0 = None
        result = None
        deadline = time.monotonic() + seconds + 120
        while time.monotonic() < deadline:
            try:
                out += child.read_nonblocking(1 << 16, timeout=0.2)
            except pexpect.TIMEOUT:
                pass
            except pexpect.EOF:
                break
            now = time.monotonic()
            if t0 is None and running(home) == n:
                t0, c = now, proc.cpu_times()
                cpu0 = c.user + c.system
            elif t0 is not None and cpu0 is not None and result is None and now - t0 >= window:
                c = proc.cpu_times()
                result = (c.user + c.system - cpu0) / (now - t0)
        child.close()
        if result is None:
            raise SystemExit(
                f"never had {n} tasks running for {window}s (exit {child.exitstatus}):\n"
                + out.decode(errors="replace")[-3000:]
            )
        if live and b"running, " not in out:
            raise SystemExit("the live run showed no live view")
        return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=20, help="tasks running at once (default 20)")
    ap.add_argument("--seconds", type=float, default=24.0, help="how long each agent runs")
    ap.add_argument("--window", type=float, default=10.0, help="seconds of CPU measured")
    ap.add_argument("--repeat", type=int, default=1)
    a = ap.parse_args()
    runs: dict[str, list[float]] = {"baseline": [], "live": []}
    for i in range(a.repeat):
        for name in ("baseline", "live"):
            v = one_run(name == "live", a.n, a.seconds, a.window)
            runs[name].append(v)
            print(f"run {i + 1} {name:8}: supervisor CPU {v * 1000:.1f} ms/s ({v * 100:.2f}% of a core)")
    base, live = statistics.median(runs["baseline"]), statistics.median(runs["live"])
    print(f"median baseline (no live view): {base * 1000:.1f} ms/s")
    print(f"median live view:               {live * 1000:.1f} ms/s")
    print(
        f"ratio live / baseline: {live / base:.2f}x (+{(live - base) * 1000:.1f} ms of CPU per second, "
        f"{a.n} tasks running)"
    )


if __name__ == "__main__":
    main()

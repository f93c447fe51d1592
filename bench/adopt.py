"""How long a restarted supervisor takes to adopt N running attempts.

Queues N tasks whose command agent sleeps (20 s by default), lets ``fleetrun work``
start all of them (``[local] max_tasks = N``), SIGKILLs the supervisor, then times a
restarted ``fleetrun work`` until it prints ``adopted N running attempt(s)``. For
scale, it also times ``fleetrun --version`` (interpreter and imports), a whole
``fleetrun work --until-idle`` on an empty home, and the first ``fleetrun status``
after the kill. At the end it cancels every task (the
shepherds end their agents) and checks nothing of the run is left.

    python bench/adopt.py [--n 50] [--sleep 20]
"""

from __future__ import annotations

import argparse
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

AGENT = '[agents.sleeper]\ncommand = ["{python}", "-c", "import time; time.sleep(%s)"]\n'


def tasks_file(n: int, sleep: float) -> str:
    parts = [AGENT % sleep]
    for i in range(n):
        parts.append(f'[[task]]\nname = "t{i:03d}"\nprompt = "p"\nagent = "sleeper"\n')
    return "\n".join(parts)


def running(db: Path) -> int:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        return conn.execute("SELECT COUNT(*) FROM attempts WHERE state='running'").fetchone()[0]
    except sqlite3.OperationalError:
        return 0
    finally:
        conn.close()


def wait_line(proc: subprocess.Popen, want: str, timeout: float) -> tuple[float, list[str]]:
    """Read ``proc``'s stdout until a line starts with ``want``; :return: (when, lines)."""
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    os.set_blocking(proc.stdout.fileno(), False)
    buf = b""
    while time.monotonic() < deadline:
        chunk = proc.stdout.read()
        if chunk:
            buf += chunk
            *done, buf = buf.split(b"\n")
            for raw in done:
                line = raw.decode(errors="replace")
                lines.append(line)
                if line.startswith(want):
                    return time.perf_counter(), lines
        elif proc.poll() is not None:
            break
        else:
            time.sleep(0.002)
    raise SystemExit(f"never saw {want!r}; output:\n" + "\n".join(lines))


def leftovers(root: Path) -> list[int]:
    import psutil

    out = []
    for p in psutil.process_iter():
        try:
            if p.pid == os.getpid() or p.status() == "zombie":
                continue
            if any(str(root) in a for a in p.cmdline()) or p.cwd().startswith(str(root)):
                out.append(p.pid)
        except psutil.Error:
            pass
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--sleep", type=float, default=20.0)
    args = ap.parse_args()
    n = args.n
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        home = root / "home"
        home.mkdir()
        (home / "policy.toml").write_text(f"[local]\nmax_tasks = {n}\n")
        (root / "tasks.toml").write_text(tasks_file(n, args.sleep))
        env = dict(os.environ, FLEETRUN_HOME=str(home), PYTHONUNBUFFERED="1")
        env.pop("FLEETRUN_CRASH_AT", None)

        def fleetrun(*a: str, **kw) -> subprocess.CompletedProcess:
            return subprocess.run(
                [sys.executable, "-m", "fleetrun", *a], cwd=root, env=env, capture_output=True, text=True, **kw
            )

        t = time.perf_counter()
        fleetrun("--version", check=True)
        startup = time.perf_counter() - t
        (root / "empty").mkdir()
        t = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "fleetrun", "work", "--until-idle"],
            cwd=root,
            check=True,
            env=dict(env, FLEETRUN_HOME=str(root / "empty")),
            capture_output=True,
        )
        idle = time.perf_counter() - t
        fleetrun("queue", "tasks.toml", check=True)

        first = second = None
        try:
            t0 = time.perf_counter()
            first = subprocess.Popen(
                [sys.executable, "-m", "fleetrun", "work"],
                cwd=root,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            deadline = time.monotonic() + 120
            while running(home / "state.db") < n:
                if time.monotonic() > deadline or first.poll() is not None:
                    raise SystemExit(f"only {running(home / 'state.db')} of {n} attempts started")
                time.sleep(0.02)
            started_all = time.perf_counter() - t0
            first.send_signal(signal.SIGKILL)
            first.wait()
            left_s = args.sleep - (time.perf_counter() - t0)

            t = time.perf_counter()
            status = fleetrun("status")
            status_s = time.perf_counter() - t
            assert status.stdout.startswith("supervisor: not running"), status.stdout

            t1 = time.perf_counter()
            second = subprocess.Popen(
                [sys.executable, "-m", "fleetrun", "work"],
                cwd=root,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
            )
            when, _ = wait_line(second, f"adopted {n} running attempt(s)", timeout=max(10.0, left_s - 1))
            adopt_s = when - t1
            still = running(home / "state.db")
        finally:
            for p in (first, second):
                if p is not None and p.poll() is None:
                    p.kill()
                    p.wait()
            if second is not None and second.stdout is not None:
                second.stdout.close()
            # cancel every task: each shepherd ends its agent's process tree
            t = time.perf_counter()
            for i in range(n):
                fleetrun("cancel", f"t{i:03d}")
            cancel_s = time.perf_counter() - t
            deadline = time.monotonic() + 30
            while leftovers(root) and time.monotonic() < deadline:
                time.sleep(0.1)
            stray = leftovers(root)
            for pid in stray:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except OSError:
                    pass

        print(f"attempts:                   {n} (agents sleep {args.sleep:g}s)")
        print(f"interpreter + import:       {startup * 1000:.0f} ms  (fleetrun --version)")
        print(f"work --until-idle, empty:   {idle * 1000:.0f} ms  (start-up, plugins, ledger, exit)")
        print(f"first loop started all {n}:  {started_all:.2f} s")
        print(f"status after the SIGKILL:   {status_s * 1000:.0f} ms")
        print(
            f"restart -> 'adopted {n}':   {adopt_s * 1000:.0f} ms  "
            f"(the empty loop's whole run takes {idle * 1000:.0f} ms)"
        )
        print(f"still running after adoption: {still} of {n} (none restarted)")
        print(f"cancel x{n} (CLI, loop dead): {cancel_s:.1f} s; left running afterwards: {len(stray)}")


if __name__ == "__main__":
    main()

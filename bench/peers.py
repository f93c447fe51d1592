"""What a peer costs: SSH connect, one verb over the open transport, fetch-back, and a
trivial task end to end on a 127.0.0.1 peer against the same task run locally.

Starts a real ``sshd`` on a free 127.0.0.1 port (its own host key and
``authorized_keys``, a fresh client key, as ``tests/sshd.py`` does) with a fleetrun home
of its own for the peer side. Skips, saying why, when there is no ``sshd``.

Run::

    python bench/peers.py                    # 30 rounds of each verb, 5 tasks each way
    python bench/peers.py --rounds 100 --tasks 10 --repeat 3

What is printed:

- **connect**: a fresh transport (TCP, SSH handshake, host key check, public key
  authentication), the median of ``--connects``.
- **per verb over the open transport**: a bare ``true`` (channel + the peer's shell:
  the floor), ``fleetrun host status`` through the full CLI (plugins loaded: forced
  with ``-v``), through the fast path (``fleetrun.plugins.relay.peer.verbs.fast_main``, which
  ``fleetrun.cli.main`` calls before loading any plugin once it has the fast-path
  patch; here a ``python -c`` shim that imports ``fleetrun.cli`` and calls it, the
  same work), and as installed (``python -m fleetrun host status``: fast if this
  checkout's ``cli.py`` has the patch), and ``host probe`` (full, cached tools). The
  same commands are also timed as local processes, so the SSH share shows.
- **fetch-back**: ``SSHHost.fetch_bundle`` of a one-commit branch whose base this
  side has (header + bundle), and the same with nothing in common (the whole branch).
- **end to end**: ``python -m fleetrun tasks.toml`` with N trivial tasks (a command
  agent that writes one file and commits it, ``run = "true"``), once locally and once
  with the supervisor drained and the peer taking every task; one at a time and
  4-way (2N tasks, ``--max-tasks 4`` and ``[peers] max_tasks = 4``); wall time per
  task and the ratio to local, and the same from the ledger without the run's
  start-up (first task RUNNING to last DONE: the supervisor's start, and a peer
  worker's first start, are paid once per run).
- **end -> VERIFYING**: from each attempt's end (the shepherd's ``ended``; the peer
  shares this machine's clock) to its task's RUNNING -> VERIFYING transition in the
  ledger, over every task of the end-to-end runs: how soon the supervisor knows.

Quote ratios and differences, not bare times: a busy machine slows both sides.
"""

from __future__ import annotations

import argparse
import getpass
import inspect
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional

ROOT = Path(__file__).resolve().parent.parent
GIT_ENV = {
    "GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@example.invalid",
    "GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "bench@example.invalid",
    "GIT_TERMINAL_PROMPT": "0",
}
SH_AGENT = ("echo done > bench.txt && git add bench.txt && "
            "git -c user.name=bench -c user.email=bench@example.invalid commit -q -m bench")
#: What ``fleetrun.cli.main`` does for a fast verb once it has the fast-path patch.
FAST_SHIM = ("import sys, fleetrun.cli\nfrom fleetrun.plugins.relay.peer.verbs import fast_main\n"
             "sys.exit(fast_main(sys.argv[1:], sys.stdout, sys.stderr))")


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(cwd), *args], check=True, env=dict(os.environ, **GIT_ENV),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True).stdout.strip()


def make_repo(path: Path) -> Path:
    path.mkdir(parents=True)
    git(path, "init", "-q")
    git(path, "symbolic-ref", "HEAD", "refs/heads/main")
    (path / "README.md").write_text("bench\n")
    git(path, "add", "README.md")
    git(path, "commit", "-q", "-m", "initial commit")
    return path


def ms(xs: list[float]) -> str:
    return f"{statistics.median(xs) * 1000:8.1f} ms" if xs else "       -"


def timed(fn: Callable[[], Any], rounds: int) -> list[float]:
    fn()  # warm up (bytecode, caches)
    out = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def fast_path_in_cli() -> bool:
    import fleetrun.cli

    return "fast_main" in inspect.getsource(fleetrun.cli.main)


# -- the peer ---------------------------------------------------------------------------


class Lab:
    """An sshd on 127.0.0.1 with its own keys; a client HOME with its key; homes."""

    def __init__(self, work: Path, hide_bashrc: bool = False) -> None:
        sys.path.insert(0, str(ROOT / "tests"))
        from sshd import Sshd, keygen  # noqa: PLC0415 - the tests' own helper

        self.work = work
        self.client_home = work / "client"
        ssh = self.client_home / ".ssh"
        ssh.mkdir(parents=True, mode=0o700)
        self.key = keygen(ssh / "id_ed25519", "fleetrun-bench")
        os.environ["HOME"] = str(self.client_home)  # paramiko and fleetrun look for keys here
        os.environ.pop("SSH_AUTH_SOCK", None)
        binds = []
        rc = Path(os.path.expanduser(f"~{getpass.getuser()}")) / ".bashrc"
        if hide_bashrc and rc.exists():  # in sshd's own mount namespace only
            (work / "empty-bashrc").write_text("")
            binds.append((work / "empty-bashrc", rc))
        self.sshd = Sshd(work / "sshd", [self.key.with_suffix(".pub").read_text()], binds=binds)
        self.sshd.start()
        self.peer_home = work / "peerhome"
        self.peer_home.mkdir(mode=0o700)
        self.address = f"{getpass.getuser()}@127.0.0.1:{self.sshd.port}"

    def env_prefix(self) -> list[str]:
        env = {"FLEETRUN_HOME": str(self.peer_home), "FLEETRUN_DISABLE_PLUGIN_AUTOLOAD": "1", **GIT_ENV}
        if os.environ.get("PYTHONPATH"):
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        return ["env", *(f"{k}={v}" for k, v in env.items())]

    def command(self, how: str = "installed") -> list[str]:
        """``installed``: ``python -m fleetrun``; ``full``: the same with ``-v`` before
        ``host``, which the fast path does not take; ``fast``: the fast-path shim."""
        if how == "fast":
            return [*self.env_prefix(), sys.executable, "-c", FAST_SHIM]
        return [*self.env_prefix(), sys.executable, "-m", "fleetrun", *(["-v"] if how == "full" else [])]

    def peer(self, how: str = "installed") -> Any:
        from fleetrun.plugins.relay.peers import Peer

        return Peer(name="bench", address=self.address, key=str(self.key), command=self.command(how))

    def close(self) -> None:
        self.sshd.stop()


def bench_connect(lab: Lab, home: Path, n: int) -> list[float]:
    from fleetrun.plugins.relay.transport import connect

    connect(lab.peer(), home, accept_new=True).close()  # records the host key once
    out = []
    for _ in range(n):
        t = time.perf_counter()
        tr = connect(lab.peer(), home)
        out.append(time.perf_counter() - t)
        tr.close()
    return out


def bench_verbs(lab: Lab, home: Path, rounds: int) -> list[tuple[str, list[float], list[float]]]:
    """(what, over SSH, as a local process) for each verb."""
    from fleetrun.plugins.relay.host import SSHHost
    from fleetrun.plugins.relay.transport import run_command

    installed, full, fast = (SSHHost(lab.peer(how), home) for how in ("installed", "full", "fast"))
    t = installed.transport()
    full._transport = fast._transport = t  # one transport for all: only the command differs
    status = ["--attempt", "task_bench_1_a1"]
    local_env = dict(os.environ, FLEETRUN_HOME=str(lab.peer_home), FLEETRUN_DISABLE_PLUGIN_AUTOLOAD="1")

    def local(argv: list[str]) -> Callable[[], Any]:
        return lambda: subprocess.run(argv, env=local_env, stdin=subprocess.DEVNULL, capture_output=True, check=False)

    py = sys.executable
    rows = [
        ("`true` (channel + shell: the floor)", lambda: run_command(t, "true"), local(["true"])),
        ("host status, full CLI (plugins loaded)", lambda: full.call("status", *status),
         local([py, "-m", "fleetrun", "-v", "host", "status", "--json", *status])),
        ("host status, fast path", lambda: fast.call("status", *status),
         local([py, "-c", FAST_SHIM, "host", "status", "--json", *status])),
        ("host status, as installed", lambda: installed.call("status", *status),
         local([py, "-m", "fleetrun", "host", "status", "--json", *status])),
        ("host probe (full; tools cached)", lambda: installed.call("probe"),
         local([py, "-m", "fleetrun", "host", "probe", "--json"])),
    ]
    worker = SSHHost(lab.peer(), home, worker=True) if "worker" in inspect.signature(SSHHost).parameters else None
    if worker is not None:  # a request to the long-lived `host serve` on its own channel
        worker._transport = t
        rows += [("host status, through the worker", lambda: worker.call("status", *status), local(["true"])),
                 ("host probe, through the worker", lambda: worker.call("probe"), local(["true"]))]
    out = []
    for what, remote, here in rows:
        out.append((what, timed(remote, rounds), timed(here, max(5, rounds // 3))))
    if worker is not None:
        worker.live_worker() and worker.live_worker().close()  # type: ignore[union-attr]
    installed.close()
    return out


def bench_fetch(lab: Lab, home: Path, rounds: int) -> list[tuple[str, list[float], int]]:
    """``fetch_bundle`` of a one-commit branch: with its base known here, and with nothing."""
    from fleetrun.plugins.relay.host import SSHHost

    repo = make_repo(lab.work / "fetchrepo")
    git(repo, "checkout", "-q", "-b", "fleetrun/bench-1")
    (repo / "bench.txt").write_text("done\n")
    git(repo, "add", "bench.txt")
    git(repo, "commit", "-q", "-m", "bench")
    base = git(repo, "rev-parse", "main")
    host = SSHHost(lab.peer(), home)
    dest = lab.work / "fetch.bundle"
    out = []
    for what, have in (("a one-commit branch, its base known here", [base]),
                       ("the same branch, nothing in common", [])):
        sizes: list[int] = []

        def once(have: list[str] = have, sizes: list[int] = sizes) -> None:
            sizes.append(int(host.fetch_bundle(str(repo), "fleetrun/bench-1", "main", have, dest)["bytes"]))

        out.append((what, timed(once, rounds), sizes[-1]))
    host.close()
    return out


# -- end to end ---------------------------------------------------------------------------


def write_tasks(folder: Path, repo: Path, n: int) -> Path:
    lines = ["[agents.bench]", f"command = {json.dumps(['/bin/sh', '-c', SH_AGENT])}", ""]
    for i in range(n):
        lines += ["[[task]]", f'name = "t{i:03d}"', f"cwd = {json.dumps(str(repo))}", 'agent = "bench"',
                  'prompt = "write bench.txt and commit it"', 'git_ref = "main"', "  [[task.verify]]",
                  '  run = "true"', ""]
    path = folder / "tasks.toml"
    path.write_text("\n".join(lines))
    return path


def fleetrun(home: Path, cwd: Path, *args: str) -> tuple[int, str, float]:
    env = dict(os.environ, FLEETRUN_HOME=str(home), **GIT_ENV)
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "fleetrun", *args], env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=900)
    return p.returncode, p.stdout + p.stderr, time.perf_counter() - t


def end_to_verifying(home: Path) -> list[float]:
    """Seconds from each attempt's end (the shepherd's own ``ended``, on the same clock:
    the peer is this machine) to its task's RUNNING -> VERIFYING transition."""
    import sqlite3

    conn = sqlite3.connect(f"file:{home / 'state.db'}?mode=ro", uri=True)
    try:
        rows = conn.execute(
            "SELECT a.ended, (SELECT MIN(t.time) FROM transitions t WHERE t.task_id = a.task_id "
            "AND t.from_state = 'RUNNING' AND t.to_state = 'VERIFYING' AND t.time >= a.ended) "
            "FROM attempts a WHERE a.ended IS NOT NULL").fetchall()
    finally:
        conn.close()
    return [v - e for e, v in rows if v is not None]


def steady_s(home: Path) -> float:
    """From the first task RUNNING to the last one DONE, in the ledger: the run without
    its start-up (the supervisor's, and on a peer the worker's first start)."""
    import sqlite3

    conn = sqlite3.connect(f"file:{home / 'state.db'}?mode=ro", uri=True)
    try:
        first, last = conn.execute("SELECT MIN(CASE WHEN to_state = 'RUNNING' THEN time END), MAX(time) "
                                   "FROM transitions").fetchone()
    finally:
        conn.close()
    return float(last - first)


def end_to_end(lab: Lab, n: int, on_peer: bool, tag: str, ways: int = 1,
               lags: Optional[list[float]] = None, steady: Optional[list[float]] = None) -> float:
    work = lab.work / f"e2e-{tag}"
    work.mkdir()
    repo = make_repo(work / "repo")
    tasks = write_tasks(work, repo, n)
    home = work / "home"
    if on_peer:
        code, out, _ = fleetrun(home, work, "relay", "add", "bench", lab.address, "--accept-new", "--key",
                                str(lab.key), "--command", shlex.join(lab.command()))
        if code != 0:
            raise SystemExit(f"relay add failed:\n{out}")
        fleetrun(home, work, "drain")
    if on_peer:
        (home / "policy.toml").write_text(f"[peers]\nmax_tasks = {ways}\n")
    code, out, wall = fleetrun(home, work, str(tasks), "--max-tasks", str(ways))
    if code != 0:
        raise SystemExit(f"fleetrun exited {code}:\n{out[-3000:]}")
    if on_peer and out.count(" on bench ") < n:
        raise SystemExit(f"not every task ran on the peer:\n{out[-3000:]}")
    if lags is not None:
        lags.extend(end_to_verifying(home))
    if steady is not None:
        steady.append(steady_s(home))
    return wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=30, help="timed calls of each verb (default 30)")
    ap.add_argument("--connects", type=int, default=10, help="fresh connections timed (default 10)")
    ap.add_argument("--tasks", type=int, default=5, help="trivial tasks end to end, each way (default 5)")
    ap.add_argument("--repeat", type=int, default=1, help="end-to-end runs each way; the median is shown")
    ap.add_argument("--hide-bashrc", action="store_true",
                    help="run sshd with an empty ~/.bashrc bind-mounted over yours (root, unshare): "
                         "bash runs it for every SSH command, and a slow one (pyenv init...) is in every figure")
    ap.add_argument("--keep", action="store_true", help="keep the temp folder")
    a = ap.parse_args()
    sshd = shutil.which("sshd") or "/usr/sbin/sshd"
    if not os.path.exists(sshd) or not shutil.which("ssh-keygen"):
        print(f"skipped: no {sshd} / ssh-keygen here (apt-get install openssh-server)")
        return 0
    if os.geteuid() == 0:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="fleetrun-bench-peers-"))
    home = work / "home"
    home.mkdir(mode=0o700)
    if a.hide_bashrc and (os.geteuid() != 0 or not shutil.which("unshare")):
        print("--hide-bashrc needs root and unshare (a private mount namespace for sshd)")
        return 2
    lab = Lab(work, a.hide_bashrc)
    try:
        print(f"peer: sshd on 127.0.0.1:{lab.sshd.port}{' (~/.bashrc hidden)' if a.hide_bashrc else ''}; "
              f"python {sys.version.split()[0]}; "
              f"fast path in fleetrun.cli: {'yes' if fast_path_in_cli() else 'no (the patch is not applied)'}")
        print(f"\nconnect (fresh transport, median of {a.connects}): {ms(bench_connect(lab, home, a.connects))}")
        print(f"\nper verb, median of {a.rounds}{'':18}over SSH   as a local process")
        for what, remote, here in bench_verbs(lab, home, a.rounds):
            print(f"  {what:42} {ms(remote)}   {ms(here)}")
        print(f"\nfetch-back (fetch_bundle over the open transport, median of {max(5, a.rounds // 3)})")
        try:
            for what, times, size in bench_fetch(lab, home, max(5, a.rounds // 3)):
                print(f"  {what:42} {ms(times)}   {size} bytes")
        except Exception as e:  # noqa: BLE001 - a peer sends only a branch it prepared for a task
            print(f"  skipped: {e}")
        lags: dict[str, list[float]] = {"local": [], "peer": []}
        for ways in (1, 4):
            walls: dict[str, list[float]] = {"local": [], "peer": []}
            steady: dict[str, list[float]] = {"local": [], "peer": []}
            n = a.tasks if ways == 1 else a.tasks * 2
            for r in range(a.repeat):
                for where in ("local", "peer"):
                    walls[where].append(end_to_end(lab, n, where == "peer", f"{where}-{ways}-{r}", ways,
                                                   lags[where], steady[where]))
            loc, peer = statistics.median(walls["local"]), statistics.median(walls["peer"])
            print(f"\nend to end, {n} trivial tasks {'one at a time' if ways == 1 else f'{ways}-way'} "
                  f"(median of {a.repeat}):")
            print(f"  locally            {loc:7.2f} s   {loc / n * 1000:7.0f} ms per task")
            print(f"  on the 127.0.0.1 peer {peer:4.2f} s   {peer / n * 1000:7.0f} ms per task")
            print(f"  the peer adds      {(peer - loc) / n * 1000:7.0f} ms per task ({peer / loc:.2f}x local)")
            sl, sp = statistics.median(steady["local"]), statistics.median(steady["peer"])
            print(f"  first RUNNING -> last DONE (no start-up): locally {sl * 1000 / n:5.0f} ms per task, "
                  f"on the peer {sp * 1000 / n:5.0f} ms ({sp / sl:.2f}x local)")
        print("\nan attempt's end -> its task VERIFYING (median, max; every task above):")
        for where in ("local", "peer"):
            xs = lags[where]
            if xs:
                print(f"  {where:6} {statistics.median(xs) * 1000:7.1f} ms  {max(xs) * 1000:7.1f} ms  ({len(xs)} tasks)")
    finally:
        lab.close()
        if a.keep:
            print(f"\nkept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What a peer costs: SSH connect, one verb over the open transport, fetch-back, and a
trivial task end to end on a 127.0.0.1 peer against the same task run locally.

Starts a real ``sshd`` on a free 127.0.0.1 port (its own host key and
``authorized_keys``, a fresh client key, as ``tests/sshd.py`` does) with a fleetrun home
of its own for the peer side. Skips, saying why, when there is no ``sshd``.

Run::

    python bench/peers.py                    # 30 rounds of each verb, 5 tasks each way
    python bench/peers.py --rounds 100 --tasks 10 --repeat 3
    python bench/peers.py --hide-bashrc --repeat 3 --against ../wt-main   # before/after

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
- **where a task's time goes** (one at a time): the median of each phase of a task,
  locally and on the peer, from the ledger's transitions, the shepherd's status file
  and, on the peer, the worker's timing files (``FLEETRUN_RELAY_TIMING`` on this
  side: when each request went out and its reply or event came in;
  ``FLEETRUN_SERVE_TIMING`` on the peer: when each request arrived and was answered,
  when an end was heard and pushed). ``rtt`` is a request's round trip, ``peer`` the
  part of it the worker spent answering. A worker that chains starts the first ``run``
  verifier inside the collect request (no ``verify-start`` rows then); a checkout
  without the timing files (``--against`` an older one) has the ledger's rows only.
- ``--against DIR``: the same end-to-end runs with the fleetrun of another checkout
  (``PYTHONPATH=DIR``, on both sides), interleaved with this one's: before/after.

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
    "GIT_AUTHOR_NAME": "bench",
    "GIT_AUTHOR_EMAIL": "bench@example.invalid",
    "GIT_COMMITTER_NAME": "bench",
    "GIT_COMMITTER_EMAIL": "bench@example.invalid",
    "GIT_TERMINAL_PROMPT": "0",
}
SH_AGENT = (
    "echo done > bench.txt && git add bench.txt && "
    "git -c user.name=bench -c user.email=bench@example.invalid commit -q -m bench"
)
#: What ``fleetrun.cli.main`` does for a fast verb once it has the fast-path patch.
FAST_SHIM = (
    "import sys, fleetrun.cli\nfrom fleetrun.plugins.relay.peer.verbs import fast_main\n"
    "sys.exit(fast_main(sys.argv[1:], sys.stdout, sys.stderr))"
)


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(cwd), *args],
        check=True,
        env=dict(os.environ, **GIT_ENV),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
    ).stdout.strip()


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

    def env_prefix(self, extra: Optional[dict[str, str]] = None) -> list[str]:
        env = {"FLEETRUN_HOME": str(self.peer_home), "FLEETRUN_DISABLE_PLUGIN_AUTOLOAD": "1", **GIT_ENV}
        if os.environ.get("PYTHONPATH"):
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        env.update(extra or {})
        return ["env", *(f"{k}={v}" for k, v in env.items())]

    def command(self, how: str = "installed", extra: Optional[dict[str, str]] = None) -> list[str]:
        """``installed``: ``python -m fleetrun``; ``full``: the same with ``-v`` before
        ``host``, which the fast path does not take; ``fast``: the fast-path shim.
        ``extra``: more of the peer's environment."""
        if how == "fast":
            return [*self.env_prefix(extra), sys.executable, "-c", FAST_SHIM]
        return [*self.env_prefix(extra), sys.executable, "-m", "fleetrun", *(["-v"] if how == "full" else [])]

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
        (
            "host status, full CLI (plugins loaded)",
            lambda: full.call("status", *status),
            local([py, "-m", "fleetrun", "-v", "host", "status", "--json", *status]),
        ),
        (
            "host status, fast path",
            lambda: fast.call("status", *status),
            local([py, "-c", FAST_SHIM, "host", "status", "--json", *status]),
        ),
        (
            "host status, as installed",
            lambda: installed.call("status", *status),
            local([py, "-m", "fleetrun", "host", "status", "--json", *status]),
        ),
        (
            "host probe (full; tools cached)",
            lambda: installed.call("probe"),
            local([py, "-m", "fleetrun", "host", "probe", "--json"]),
        ),
    ]
    worker = SSHHost(lab.peer(), home, worker=True) if "worker" in inspect.signature(SSHHost).parameters else None
    if worker is not None:  # a request to the long-lived `host serve` on its own channel
        worker._transport = t
        rows += [
            ("host status, through the worker", lambda: worker.call("status", *status), local(["true"])),
            ("host probe, through the worker", lambda: worker.call("probe"), local(["true"])),
        ]
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
    for what, have in (
        ("a one-commit branch, its base known here", [base]),
        ("the same branch, nothing in common", []),
    ):
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
        lines += [
            "[[task]]",
            f'name = "t{i:03d}"',
            f"cwd = {json.dumps(str(repo))}",
            'agent = "bench"',
            'prompt = "write bench.txt and commit it"',
            'git_ref = "main"',
            "  [[task.verify]]",
            '  run = "true"',
            "",
        ]
    path = folder / "tasks.toml"
    path.write_text("\n".join(lines))
    return path


def fleetrun(home: Path, cwd: Path, *args: str, env_extra: Optional[dict[str, str]] = None) -> tuple[int, str, float]:
    env = dict(os.environ, FLEETRUN_HOME=str(home), **GIT_ENV, **(env_extra or {}))
    t = time.perf_counter()
    p = subprocess.run(
        [sys.executable, "-m", "fleetrun", *args],
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=900,
    )
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
            "FROM attempts a WHERE a.ended IS NOT NULL"
        ).fetchall()
    finally:
        conn.close()
    return [v - e for e, v in rows if v is not None]


def steady_s(home: Path) -> float:
    """From the first task RUNNING to the last one DONE, in the ledger: the run without
    its start-up (the supervisor's, and on a peer the worker's first start)."""
    import sqlite3

    conn = sqlite3.connect(f"file:{home / 'state.db'}?mode=ro", uri=True)
    try:
        first, last = conn.execute(
            "SELECT MIN(CASE WHEN to_state = 'RUNNING' THEN time END), MAX(time) FROM transitions"
        ).fetchone()
    finally:
        conn.close()
    return float(last - first)


def end_to_end(
    lab: Lab,
    n: int,
    on_peer: bool,
    tag: str,
    ways: int = 1,
    lags: Optional[list[float]] = None,
    steady: Optional[list[float]] = None,
    against: Optional[Path] = None,
    phases: Optional[dict[str, list[float]]] = None,
) -> float:
    work = lab.work / f"e2e-{tag}"
    work.mkdir()
    repo = make_repo(work / "repo")
    tasks = write_tasks(work, repo, n)
    home = work / "home"
    sup_env = {"PYTHONPATH": str(against)} if against is not None else {}
    timing = {"sup": work / "sup-timing", "peer": work / "peer-timing"}
    if on_peer:
        sup_env["FLEETRUN_RELAY_TIMING"] = str(timing["sup"])
        peer_env = {"FLEETRUN_SERVE_TIMING": str(timing["peer"]), **({"PYTHONPATH": str(against)} if against else {})}
        code, out, _ = fleetrun(
            home,
            work,
            "relay",
            "add",
            "bench",
            lab.address,
            "--accept-new",
            "--key",
            str(lab.key),
            "--command",
            shlex.join(lab.command(extra=peer_env)),
            env_extra=sup_env,
        )
        if code != 0:
            raise SystemExit(f"relay add failed:\n{out}")
        fleetrun(home, work, "drain", env_extra=sup_env)
    if on_peer:
        (home / "policy.toml").write_text(f"[peers]\nmax_tasks = {ways}\n")
    t0 = time.time()
    code, out, wall = fleetrun(home, work, str(tasks), "--max-tasks", str(ways), env_extra=sup_env)
    if code != 0:
        raise SystemExit(f"fleetrun exited {code}:\n{out[-3000:]}")
    if on_peer and out.count(" on bench ") < n:
        raise SystemExit(f"not every task ran on the peer:\n{out[-3000:]}")
    if lags is not None:
        lags.extend(end_to_verifying(home))
    if steady is not None:
        steady.append(steady_s(home))
    if phases is not None:
        for k, v in task_phases(home, lab.peer_home if on_peer else home, timing if on_peer else None).items():
            phases.setdefault(k, []).extend(v)
        for k, x in run_phases(home, t0, t0 + wall, timing if on_peer else None).items():
            phases.setdefault(k, []).append(x)
    return wall


def read_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


#: The phases of a task, in order, as (name, from, to): names of the points in time
#: :func:`task_phases` finds for each attempt (a phase without both is left out).
PHASES = [
    ("lease (ASSIGNED) -> prepare sent", "ASSIGNED", "prepare.sent"),
    ("  prepare: rtt", "prepare.sent", "prepare.reply"),
    ("  prepare: on the peer", "prepare.recv", "prepare.answered"),
    ("prepare answered -> start sent", "prepare.reply", "start.sent"),
    ("  start: rtt", "start.sent", "start.reply"),
    ("  start: on the peer", "start.recv", "start.answered"),
    ("start answered -> RUNNING", "start.reply", "RUNNING"),
    ("lease (ASSIGNED) -> RUNNING", "ASSIGNED", "RUNNING"),
    ("RUNNING -> the agent starts", "RUNNING", "agent_started"),
    ("the agent (agent start -> shepherd's end)", "agent_started", "ended"),
    ("shepherd's end -> the worker hears it", "ended", "heard"),
    ("  heard -> ended pushed", "heard", "ended.push"),
    ("  ended pushed -> received here", "ended.push", "ended.event"),
    ("ended received -> collect sent", "ended.event", "collect.sent"),
    ("  collect: rtt", "collect.sent", "collect.reply"),
    ("  collect: on the peer", "collect.recv", "collect.answered"),
    ("collect answered -> VERIFYING", "collect.reply", "VERIFYING"),
    ("shepherd's end -> VERIFYING", "ended", "VERIFYING"),
    ("VERIFYING -> verify-start sent", "VERIFYING", "verify-start.sent"),
    ("  verify-start: rtt", "verify-start.sent", "verify-start.reply"),
    ("  verify-start: on the peer", "verify-start.recv", "verify-start.answered"),
    ("verify-start answered -> verified pushed", "verify-start.answered", "verified.push"),
    ("  verified pushed -> received here", "verified.push", "verified.event"),
    ("verified received -> DONE", "verified.event", "DONE"),
    ("VERIFYING -> DONE", "VERIFYING", "DONE"),
    ("DONE -> cleanup sent", "DONE", "cleanup.sent"),
    ("  cleanup: rtt", "cleanup.sent", "cleanup.reply"),
    ("  cleanup: on the peer", "cleanup.recv", "cleanup.answered"),
    ("DONE -> the next task's lease", "DONE", "next.ASSIGNED"),
    ("lease -> DONE (the whole task)", "ASSIGNED", "DONE"),
]


#: A run's own phases (once a run), as (name, from, to), from :func:`run_phases`.
RUN_PHASES = [
    ("run: start -> the worker's channel opens", "t0", "worker.start"),
    ("run: channel -> the worker's hello", "worker.start", "hello"),
    ("run: hello -> the first probe answered", "hello", "probe.reply"),
    ("run: start -> the first lease", "t0", "first.ASSIGNED"),
    ("run: the last DONE -> the process exits", "last", "exit"),
]


def run_phases(home: Path, t0: float, t1: float, timing: Optional[dict[str, Path]]) -> dict[str, float]:
    import sqlite3

    conn = sqlite3.connect(f"file:{home / 'state.db'}?mode=ro", uri=True)
    try:
        first, last = conn.execute(
            "SELECT MIN(CASE WHEN to_state = 'ASSIGNED' THEN time END), MAX(time) FROM transitions"
        ).fetchone()
    finally:
        conn.close()
    p = {"t0": t0, "exit": t1, "first.ASSIGNED": first, "last": last}
    if timing is not None:
        probes = set()
        for e in read_lines(timing["sup"]):
            if e["what"] == "start":
                p.setdefault("worker.start", e["t"])
            elif e["what"] == "hello":
                p.setdefault("hello", e["t"])
            elif e["what"] == "sent" and e["verb"] == "probe":
                probes.add(e["id"])
            elif e["what"] == "reply" and e["id"] in probes:
                p.setdefault("probe.reply", e["t"])
    return {name: p[b] - p[a] for name, a, b in RUN_PHASES if p.get(a) is not None and p.get(b) is not None}


def task_phases(home: Path, shepherd_home: Path, timing: Optional[dict[str, Path]]) -> dict[str, list[float]]:
    """Each phase of :data:`PHASES`: its length for every attempt of a run."""
    import sqlite3

    conn = sqlite3.connect(f"file:{home / 'state.db'}?mode=ro", uri=True)
    try:
        atts = conn.execute("SELECT id, task_id, number FROM attempts").fetchall()
        trans = conn.execute("SELECT task_id, to_state, time, attempt FROM transitions ORDER BY id").fetchall()
    finally:
        conn.close()
    points: dict[str, dict[str, float]] = {}
    task_of = {}
    for aid, tid, number in atts:
        p = points[aid] = {}
        task_of[tid, number] = aid
        try:
            st = json.loads((shepherd_home / "attempts" / aid / "status.json").read_text())
        except (OSError, ValueError):
            st = {}
        for key in ("agent_started", "ended"):
            if isinstance(st.get(key), (int, float)):
                p[key] = float(st[key])
    for tid, to, t, number in trans:
        aid = task_of.get((tid, number))
        if aid is not None:
            points[aid].setdefault(to, t)
    leases = sorted(p["ASSIGNED"] for p in points.values() if "ASSIGNED" in p)
    for p in points.values():
        if "DONE" in p:
            later = [t for t in leases if t > p["DONE"]]
            if later:
                p["next.ASSIGNED"] = later[0]
    if timing is not None:
        sent: dict[int, tuple[str, str]] = {}
        for e in read_lines(timing["sup"]):
            of = e.get("of")
            if e["what"] == "sent":
                aid = of if of in points else next((a for (tid, _), a in sorted(task_of.items()) if tid == of), None)
                if aid is not None:
                    sent[e["id"]] = (aid, e["verb"])
                    points[aid].setdefault(f"{e['verb']}.sent", e["t"])
            elif e["what"] == "reply" and e["id"] in sent:
                aid, verb = sent[e["id"]]
                points[aid].setdefault(f"{verb}.reply", e["t"])
            elif e["what"] in ("ended", "verified") and of in points:
                points[of].setdefault(f"{e['what']}.event", e["t"])
        recv: dict[int, str] = {}
        for e in read_lines(timing["peer"]):
            if e["what"] == "recv":
                recv[e["id"]] = e["verb"]
                vid = e["id"]
                if vid in sent:
                    points[sent[vid][0]].setdefault(f"{e['verb']}.recv", e["t"])
            elif e["what"] == "push" and e.get("event") == "reply" and e.get("id") in sent:
                points[sent[e["id"]][0]].setdefault(f"{sent[e['id']][1]}.answered", e["t"])
            elif e["what"] == "push" and e.get("of") in points:
                points[e["of"]].setdefault(f"{e['event']}.push", e["t"])
            elif e["what"] == "heard" and e.get("of") in points:
                points[e["of"]].setdefault("heard", e["t"])
    out: dict[str, list[float]] = {}
    for name, a, b in PHASES:
        for p in points.values():
            if a in p and b in p:
                out.setdefault(name, []).append(p[b] - p[a])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=30, help="timed calls of each verb (default 30)")
    ap.add_argument("--connects", type=int, default=10, help="fresh connections timed (default 10)")
    ap.add_argument("--tasks", type=int, default=5, help="trivial tasks end to end, each way (default 5)")
    ap.add_argument("--repeat", type=int, default=1, help="end-to-end runs each way; the median is shown")
    ap.add_argument(
        "--hide-bashrc",
        action="store_true",
        help="run sshd with an empty ~/.bashrc bind-mounted over yours (root, unshare): "
        "bash runs it for every SSH command, and a slow one (pyenv init...) is in every figure",
    )
    ap.add_argument(
        "--against",
        type=Path,
        default=None,
        metavar="DIR",
        help="also run the peer's end-to-end runs with the fleetrun of checkout DIR (PYTHONPATH, "
        "both sides), interleaved with this one's: before/after in one run",
    )
    ap.add_argument("--e2e-only", action="store_true", help="skip connect, the verbs and fetch-back")
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
    against = a.against.resolve() if a.against is not None else None
    if against is not None and not (against / "fleetrun" / "__init__.py").exists():
        print(f"--against {against}: no fleetrun/ there")
        return 2
    lab = Lab(work, a.hide_bashrc)
    try:
        print(
            f"peer: sshd on 127.0.0.1:{lab.sshd.port}{' (~/.bashrc hidden)' if a.hide_bashrc else ''}; "
            f"python {sys.version.split()[0]}; "
            f"fast path in fleetrun.cli: {'yes' if fast_path_in_cli() else 'no (the patch is not applied)'}"
        )
        if not a.e2e_only:
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
        ways_of = ["local", "peer"] + (["peer-before"] if against is not None else [])
        label = {
            "local": "locally",
            "peer": "on the 127.0.0.1 peer",
            "peer-before": f"the peer, {against.name if against else ''}",
        }
        lags: dict[str, list[float]] = {w: [] for w in ways_of}
        phases: dict[str, dict[str, list[float]]] = {w: {} for w in ways_of}
        for ways in (1, 4):
            walls: dict[str, list[float]] = {w: [] for w in ways_of}
            steady: dict[str, list[float]] = {w: [] for w in ways_of}
            n = a.tasks if ways == 1 else a.tasks * 2
            for r in range(a.repeat):
                order = ways_of if r % 2 == 0 else [ways_of[0], *reversed(ways_of[1:])]
                for where in order:
                    walls[where].append(
                        end_to_end(
                            lab,
                            n,
                            where != "local",
                            f"{where}-{ways}-{r}",
                            ways,
                            lags[where],
                            steady[where],
                            against if where == "peer-before" else None,
                            phases[where] if ways == 1 else None,
                        )
                    )
            loc = statistics.median(walls["local"])
            sl = statistics.median(steady["local"])
            print(
                f"\nend to end, {n} trivial tasks {'one at a time' if ways == 1 else f'{ways}-way'} "
                f"(median of {a.repeat}):"
            )
            for where in ways_of:
                w = statistics.median(walls[where])
                line = f"  {label[where]:30} {w:6.2f} s {w / n * 1000:6.0f} ms per task"
                if where != "local":
                    line += f"; adds {(w - loc) / n * 1000:4.0f} ms per task ({w / loc:.2f}x local)"
                print(line)
            for where in ways_of:
                sp = statistics.median(steady[where])
                print(
                    f"  first RUNNING -> last DONE (no start-up), {label[where]:24} {sp * 1000 / n:5.0f} ms per task"
                    + (f" ({sp / sl:.2f}x local)" if where != "local" else "")
                )
        print("\nan attempt's end -> its task VERIFYING (median, max; every task above):")
        for where in ways_of:
            xs = lags[where]
            if xs:
                print(
                    f"  {label[where]:30} {statistics.median(xs) * 1000:7.1f} ms  {max(xs) * 1000:7.1f} ms  "
                    f"({len(xs)} tasks)"
                )
        print("\nwhere a task's time goes, one at a time (median ms over every task of those runs):")
        print(f"  {'':46}" + "".join(f"{w:>13}" for w in ways_of))
        for name, _, _ in [*RUN_PHASES, *PHASES]:
            row = [phases[w].get(name) for w in ways_of]
            if any(row):
                print(
                    f"  {name:46}" + "".join(f"{statistics.median(x) * 1000:13.1f}" if x else f"{'-':>13}" for x in row)
                )
    finally:
        lab.close()
        if a.keep:
            print(f"\nkept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

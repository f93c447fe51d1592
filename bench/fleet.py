"""What supervising many peers costs: N peers in network namespaces, each its own sshd
and fleetrun home, heartbeating to one ``fleetrun work`` loop.

For each N in ``--peers`` (default 5, 10, 20) the bench registers the first N peers in a
fresh supervisor home (``relay add``), starts ``fleetrun work`` and, after a warm-up,
samples the supervisor's CPU time (its own process: the SSH transports and heartbeat
threads are in it) over ``--secs`` seconds. The baseline is the same loop with no peer,
measured in the same run. Then it queues one trivial task per peer (the local machine
drained, so every task goes to a peer) and reads from the ledger how long each took
from its attempt's end (the peer's shepherd's clock: the same machine's clock here)
to the supervisor recording VERIFYING: how soon the supervisor knows.

Needs root, ``ip`` and ``unshare`` (network namespaces), and sshd; skips saying why
otherwise. Run::

    python bench/fleet.py                      # 5, 10, 20 peers, 60 s each
    python bench/fleet.py --peers 5,20 --secs 20
    python bench/fleet.py --peers 5,20,50,100 --warmup 20 --timing
    PYTHONPATH=/path/to/older/checkout python bench/fleet.py ...   # the peers run it too

``--timing`` says where each end-to-VERIFYING went (the worker's push, the
supervisor's pass, the collect request, the peer's collect, the pass that reads its
reply; or, where the peer's worker collected at the end as the start asked it to, the
end to that collect, the collect, its push to the supervisor hearing it, and the pass
that takes it), from the timing files of the supervisor and of each peer's worker, and how
long the loop's passes took while the ends came and how many ledger commits each made
(the relay writes a line as each pass ends);
``--profile`` runs the tasks' run under cProfile and prints where its main thread,
the loop's, spent its time. The peers get addresses in 10.214.0.0/16 (the tests'
NetLab has a /24: 63 peers); each is an sshd, and, once paired, its ``host serve``
worker (a Python process, ~26 MB resident), so memory allows several hundred here: what
limits a run is the CPU of the peers' work on one machine's cores.

Printed: CPU seconds per minute of the loop alone; for each N the CPU per minute, the
extra per peer per minute, and its growth against N=5 (1.00x = linear in peers, more
= each peer costs more as the fleet grows); the end-to-VERIFYING latency (median, max).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

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


def git(cwd: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(cwd), *args],
        check=True,
        env=dict(os.environ, **GIT_ENV),
        stdin=subprocess.DEVNULL,
        capture_output=True,
    )


def make_repo(path: Path) -> Path:
    path.mkdir(parents=True)
    git(path, "init", "-q")
    git(path, "symbolic-ref", "HEAD", "refs/heads/main")
    (path / "README.md").write_text("bench\n")
    git(path, "add", "README.md")
    git(path, "commit", "-q", "-m", "initial commit")
    return path


def fleetrun(
    home: Path,
    cwd: Path,
    *args: str,
    check: bool = True,
    env_extra: Optional[dict[str, str]] = None,
    profile: Optional[Path] = None,
) -> str:
    env = dict(
        os.environ, FLEETRUN_HOME=str(home), FLEETRUN_DISABLE_PLUGIN_AUTOLOAD="1", **GIT_ENV, **(env_extra or {})
    )
    # cProfile sees the main thread: the loop's (the SSH and heartbeat threads are not in it)
    prof = ["-m", "cProfile", "-o", str(profile)] if profile is not None else []
    p = subprocess.run(
        [sys.executable, *prof, "-m", "fleetrun", *args],
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if check and p.returncode != 0:
        raise SystemExit(f"fleetrun {' '.join(args)} exited {p.returncode}:\n{p.stdout}{p.stderr}")
    return p.stdout


def cpu_of(pid: int) -> float:
    """User + system CPU seconds of a process, from /proc (no psutil needed)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wide_netlab(base: Any) -> Any:
    """The tests' :class:`NetLab` with room for 1,000 peers: its /24 holds 63 (a /30
    each), the bench's /16 (10.214.0.0/16, unreachable beyond this machine as the
    tests' subnet is) 16,000."""

    class WideNetLab(base):
        def __init__(self) -> None:
            super().__init__()
            self.subnet = "10.214.0.0/16"

        def add(self) -> tuple[str, str, str]:
            i = len(self.spaces)
            octet, low = 1 + i // 64, 4 * (i % 64)
            ns = f"fleetrun-{os.getpid()}-{i}"
            tag = f"{os.getpid() % 100000}{i}"
            host_if, peer_if = f"frh{tag}", f"frp{tag}"
            here, there = f"10.214.{octet}.{low + 1}", f"10.214.{octet}.{low + 2}"
            run = self.run
            run("ip", "netns", "add", ns)
            self.spaces.append((ns, host_if, peer_if))
            run("ip", "link", "add", host_if, "type", "veth", "peer", "name", peer_if, "netns", ns)
            run("ip", "addr", "add", f"{here}/30", "dev", host_if)
            run("ip", "link", "set", host_if, "up")
            run("ip", "-n", ns, "addr", "add", f"{there}/30", "dev", peer_if)
            run("ip", "-n", ns, "link", "set", peer_if, "up")
            run("ip", "-n", ns, "link", "set", "lo", "up")
            return ns, there, peer_if

        @staticmethod
        def run(*argv: str) -> None:
            subprocess.run(argv, check=True, capture_output=True, text=True)

    return WideNetLab


class Fleet:
    """N peers, each in a namespace of its own with an sshd on port 22 and a home."""

    def __init__(self, work: Path, n: int) -> None:
        sys.path.insert(0, str(ROOT / "tests"))
        from sshd import NetLab, Sshd, keygen  # noqa: PLC0415 - the tests' own helpers

        self.work = work
        client = work / "client" / ".ssh"
        client.mkdir(parents=True, mode=0o700)
        self.key = keygen(client / "id_ed25519", "fleetrun-bench")
        os.environ["HOME"] = str(work / "client")
        os.environ.pop("SSH_AUTH_SOCK", None)
        self.net = wide_netlab(NetLab)()
        self.net.setup()
        self.peers: list[tuple[str, str, Path, Any]] = []
        self.repo = make_repo(work / "repo")
        try:
            for i in range(n):
                ns, address, _ = self.net.add()
                folder = work / f"peer{i}"
                home = folder / "home"
                home.mkdir(parents=True, mode=0o700)
                # tests/sshd.py enters the namespace only around its bind mounts; an empty
                # ~/.bashrc also keeps a slow one (pyenv init...) out of every SSH command
                (folder / "bashrc").write_text("")
                rc = Path("/root/.bashrc")
                binds = [(folder / "bashrc", rc)] if rc.exists() else [(folder, folder)]
                sshd = Sshd(
                    folder / "sshd",
                    [self.key.with_suffix(".pub").read_text()],
                    listen=address,
                    port=22,
                    netns=ns,
                    binds=binds,
                )
                sshd.start()
                self.peers.append((f"p{i:02d}", address, home, sshd))
        except BaseException:
            self.close()
            raise

    def command(self, home: Path, timing: Optional[Path] = None) -> str:
        env = {"FLEETRUN_HOME": str(home), "FLEETRUN_DISABLE_PLUGIN_AUTOLOAD": "1", **GIT_ENV}
        if timing is not None:  # the peer's worker writes when each request came and went
            env["FLEETRUN_SERVE_TIMING"] = str(timing)
        if os.environ.get("PYTHONPATH"):  # the peers run the fleetrun the supervisor runs (a "before" checkout)
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        return shlex.join(["env", *(f"{k}={v}" for k, v in env.items()), sys.executable, "-m", "fleetrun"])

    def close(self) -> None:
        for *_, sshd in self.peers:
            sshd.stop()
        self.net.teardown()


def supervise(
    fleet: Fleet, n: int, secs: float, warmup: float, tasks: bool, timing: bool = False, profile: bool = False
) -> tuple[float, list[float], dict[str, list[float]]]:
    """A fresh supervisor home with the first ``n`` peers: CPU seconds per minute of its
    ``fleetrun work`` loop, and (``tasks``) the end-to-VERIFYING latencies of one task per
    peer, and (``timing``) the legs of each (:func:`legs`)."""
    sup = fleet.work / f"sup-{n}"
    home = sup / "home"
    sup.mkdir()
    (home).mkdir(mode=0o700)
    (home / "config.toml").write_text("[relay]\nheartbeat_secs = 5\n")
    times = sup / "timing"
    times.mkdir()
    for name, address, phome, _ in fleet.peers[:n]:
        fleetrun(
            home,
            sup,
            "relay",
            "add",
            name,
            f"root@{address}",
            "--accept-new",
            "--key",
            str(fleet.key),
            "--command",
            fleet.command(phome, times / f"{name}.jsonl" if timing else None),
        )
    env = dict(os.environ, FLEETRUN_HOME=str(home), FLEETRUN_DISABLE_PLUGIN_AUTOLOAD="1", **GIT_ENV)
    if timing:  # the supervisor's side: when each request went out, each reply and event came in
        env["FLEETRUN_RELAY_TIMING"] = str(times / "supervisor.jsonl")
    with open(sup / "work.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fleetrun", "work"],
            env=env,
            cwd=sup,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    latencies: list[float] = []
    parts: dict[str, list[float]] = {}
    try:
        time.sleep(warmup)
        if proc.poll() is not None:
            raise SystemExit(f"fleetrun work exited {proc.returncode}:\n{(sup / 'work.log').read_text()[-3000:]}")
        c0, t0 = cpu_of(proc.pid), time.monotonic()
        time.sleep(secs)
        per_min = (cpu_of(proc.pid) - c0) / (time.monotonic() - t0) * 60
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    if tasks and n:
        rows = run_tasks(
            fleet,
            sup,
            home,
            n,
            {"FLEETRUN_RELAY_TIMING": str(times / "supervisor.jsonl")} if timing else {},
            sup / "tasks.prof" if profile else None,
        )
        if profile:
            show_profile(sup / "tasks.prof")
        latencies = [verifying - ended for _, _, ended, verifying in rows]
        if timing:
            parts = legs(rows, times)
    return per_min, latencies, parts


def read_lines(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


#: the legs of a peer attempt's end to VERIFYING, in order (``--timing``)
LEGS = (
    "end -> its worker pushes it",
    "pushed -> the supervisor hears it",
    "heard -> collect sent",
    "sent -> the peer reads it",
    "the peer's collect",
    "its reply -> VERIFYING recorded",
)
#: the same for an end its worker pushed collected (its start asked it to collect at the end)
AT_END_LEGS = (
    "end -> its worker collects it",
    "the peer's collect, at the end",
    "collected and pushed -> heard",
    "heard -> VERIFYING recorded",
)

#: ``--timing``: the ledger commits of each pass from the first end to the last VERIFYING
COMMITS = "commits a pass (those passes)"


def legs(rows: list[tuple[str, str, float, float]], times: Path) -> dict[str, list[float]]:
    """Where each attempt's end-to-VERIFYING time went, from the timing files of the
    supervisor (``FLEETRUN_RELAY_TIMING``) and of each peer's worker
    (``FLEETRUN_SERVE_TIMING``): one clock, as every peer is on this machine."""
    sup = read_lines(times / "supervisor.jsonl")
    heard = {x["of"]: x["t"] for x in sup if x.get("what") == "ended" and x.get("of")}
    sent = {x["of"]: (x["t"], x["id"]) for x in sup if x.get("what") == "sent" and x.get("verb") == "collect"}
    out: dict[str, list[float]] = {k: [] for k in (*LEGS, *AT_END_LEGS)}
    # the loop's passes from the first end to the last VERIFYING: how long, how many commits each
    first, last = min(r[2] for r in rows), max(r[3] for r in rows)
    passes = [x for x in sup if x.get("what") == "pass" and first <= x["t"] <= last + 0.5]
    out["a pass of the loop (while ends came)"] = [x["dur"] for x in passes]
    commits = [x.get("commits") for x in passes]
    out[COMMITS] = [float(b - a) for a, b in zip(commits, commits[1:]) if isinstance(a, int) and isinstance(b, int)]
    for attempt, peer, ended, verifying in rows:
        there = read_lines(times / f"{peer}.jsonl")
        pushed = next((x["t"] for x in there if x.get("event") == "ended" and x.get("of") == attempt), None)
        t_sent, rid = sent.get(attempt, (None, None))
        at_end = next((x["t"] for x in there if x.get("what") == "at_end" and x.get("of") == attempt), None)
        if t_sent is None and at_end is not None:  # no collect request: its end came collected
            points = [ended, at_end, pushed, heard.get(attempt), verifying]
            if all(p is not None for p in points):
                for name, a, b in zip(AT_END_LEGS, points, points[1:]):
                    out[name].append(b - a)
            continue
        # ids are per worker, and an earlier worker (`relay add`'s) may have used the same one
        late = [x for x in there if t_sent is not None and x["t"] >= t_sent - 1.0]
        recv = next((x["t"] for x in late if x.get("what") == "recv" and x.get("id") == rid), None)
        reply = next((x["t"] for x in late if x.get("event") == "reply" and x.get("id") == rid), None)
        points = [ended, pushed, heard.get(attempt), t_sent, recv, reply, verifying]
        if any(p is None for p in points):
            continue  # an end polled, not pushed (no worker): its legs are not these
        for name, a, b in zip(LEGS, points, points[1:]):
            out[name].append(b - a)
    return out


def show_profile(path: Path, top: int = 25) -> None:
    """The loop's thread in the tasks' run: fleetrun's functions by cumulative time."""
    import pstats

    print(f"        the run's main thread (cProfile, {path}): fleetrun's functions by cumulative time")
    stats = pstats.Stats(str(path))
    rows = sorted(
        (
            (v[3], v[0], k)
            for k, v in stats.stats.items()  # type: ignore[attr-defined]
            if "fleetrun" in k[0]
        ),
        reverse=True,
    )[:top]
    for cum, calls, (file, line, fn) in rows:
        where = file.split("fleetrun/", 1)[-1]
        print(f"          {cum:7.3f} s  {calls:6d} calls  {where}:{line} {fn}")


def run_tasks(
    fleet: Fleet, sup: Path, home: Path, n: int, env_extra: dict[str, str], profile: Optional[Path] = None
) -> list[tuple[str, str, float, float]]:
    """One trivial task per peer, run to DONE: (attempt, peer, its end, VERIFYING recorded) of each."""
    lines = ["[agents.bench]", f"command = {json.dumps(['/bin/sh', '-c', SH_AGENT])}", ""]
    for i in range(n):
        lines += [
            "[[task]]",
            f'name = "t{i:03d}"',
            f"cwd = {json.dumps(str(fleet.repo))}",
            'agent = "bench"',
            'prompt = "write bench.txt and commit it"',
            'git_ref = "main"',
            "  [[task.verify]]",
            '  run = "true"',
            "",
        ]
    (sup / "tasks.toml").write_text("\n".join(lines))
    fleetrun(home, sup, "drain")
    out = fleetrun(home, sup, "tasks.toml", check=False, env_extra=env_extra, profile=profile)
    db = sqlite3.connect(home / "state.db")
    try:
        done = db.execute("SELECT count(*) FROM tasks WHERE state = 'DONE'").fetchone()[0]
        if done < n:
            raise SystemExit(f"only {done} of {n} tasks are DONE:\n{out[-3000:]}")
        rows = db.execute(
            "SELECT a.id, a.host, a.ended, min(t.time) FROM attempts a JOIN transitions t ON t.task_id = a.task_id "
            "AND t.attempt = a.number AND t.to_state = 'VERIFYING' WHERE a.ended IS NOT NULL "
            "AND a.host != 'local' GROUP BY a.id"
        ).fetchall()
    finally:
        db.close()
    return [r for r in rows if r[3] is not None]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peers", default="5,10,20", help="fleet sizes, comma-separated (default 5,10,20)")
    ap.add_argument("--secs", type=float, default=60.0, help="seconds of CPU sampling per size (default 60)")
    ap.add_argument("--warmup", type=float, default=8.0, help="seconds before sampling (connects, first probes)")
    ap.add_argument("--no-tasks", action="store_true", help="skip the end-to-VERIFYING latency")
    ap.add_argument("--keep", action="store_true", help="keep the temp folder")
    ap.add_argument(
        "--timing",
        action="store_true",
        help="say where the end-to-VERIFYING time goes: the median of each leg, from the timing files "
        "of the supervisor and of each peer's worker",
    )
    ap.add_argument(
        "--profile",
        action="store_true",
        help="run the tasks' run under cProfile and print where its main thread (the loop's) spent its time",
    )
    a = ap.parse_args()
    sizes = sorted({int(x) for x in a.peers.split(",") if x.strip()})
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("unshare"):
        print("skipped: network namespaces need root, ip (iproute2) and unshare")
        return 0
    if not os.path.exists("/usr/sbin/sshd") or not shutil.which("ssh-keygen"):
        print("skipped: no /usr/sbin/sshd / ssh-keygen here (apt-get install openssh-server)")
        return 0
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="fleetrun-bench-fleet-"))
    fleet = Fleet(work, max(sizes))
    try:
        print(
            f"{max(sizes)} peers in network namespaces, each its own sshd and home; "
            f"CPU sampled over {a.secs:.0f} s after {a.warmup:.0f} s of warm-up; heartbeat every 5 s"
        )
        base, _, _ = supervise(fleet, 0, a.secs, a.warmup, tasks=False)
        print(f"\n  the loop alone (no peer)   {base:6.2f} CPU s/min   (the baseline)")
        first: float | None = None
        for n in sizes:
            per_min, lat, parts = supervise(
                fleet, n, a.secs, a.warmup, tasks=not a.no_tasks, timing=a.timing, profile=a.profile
            )
            per_peer = (per_min - base) / n
            first = per_peer if first is None else first
            growth = per_peer / first if first > 0 else float("nan")
            print(
                f"  {n:3d} peers                  {per_min:6.2f} CPU s/min   {per_peer * 1000:7.1f} ms/min per "
                f"peer   {per_min / base if base > 0 else float('nan'):5.1f}x the loop alone   "
                f"per-peer growth vs N={sizes[0]}: {growth:.2f}x"
            )
            if lat:
                print(
                    f"        end of a peer's attempt -> VERIFYING: median {statistics.median(lat) * 1000:.0f} ms, "
                    f"max {max(lat) * 1000:.0f} ms ({len(lat)} tasks)"
                )
            for name, values in parts.items():
                if values and name == COMMITS:
                    print(
                        f"          {name:38s} median {statistics.median(values):6.0f},    "
                        f"max {max(values):6.0f}     ({len(values) + 1} passes)"
                    )
                elif values:
                    print(
                        f"          {name:38s} median {statistics.median(values) * 1000:6.0f} ms, "
                        f"max {max(values) * 1000:6.0f} ms"
                    )
    finally:
        fleet.close()
        if a.keep:
            print(f"\nkept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

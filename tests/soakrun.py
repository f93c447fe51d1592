"""The chaos soak (issue 21): a queue of tasks with dependencies (some with ``base =
"dependencies"``), retries, reviewers, malformed agent output and known costs, run by
``fleetrun work --until-idle`` as a subprocess (with peers in network namespaces, when
given :class:`NetPeers`) while chaos strikes at random moments: SIGKILLs of the
supervisor (restarted at once), SIGKILLs of a running attempt's shepherd, a full home
disk for a while, a peer's link down for a while. Then the invariants are checked and
every violation is reported with its task, what broke and the evidence.

One harness, two front-ends: ``bench/soak.py`` (hundreds of tasks, ``--long`` for
1,000) and ``tests/acceptance/test_soak.py`` (a bounded run in the default suite).
Both drive a :class:`fleetrun.fleeter.Fleeter` and its ``FakeClaude`` (the bench builds
them with a ``pytest.MonkeyPatch`` of its own), and the durability checks are the
crash-point tests' own :func:`check_invariants`, so a check added there holds here too.

The queue and the chaos schedule are functions of the seed; when each blow lands
relative to the work is up to the machine, so a seed replays the same queue and the
same blows, not the same interleaving.
"""

from __future__ import annotations

import errno
import json
import os
import random
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from acceptance.test_crash_points import (
    check_invariants,
    describe_procs,
    read_status,
    wait_no_leftovers,
)

from fleetrun.fleeter import GIT_ENV, whole_call
from fleetrun.osutil import proc_token

#: What a file under the home may weigh at most: the soak's ``[output] max_bytes`` (item
#: 5 of issue 21), plus the one line that says what was cut (:data:`MARKER_ROOM`).
CAP_BYTES = 1_000_000
#: A cut file holds the cap's head and tail and, between them, the marker line
#: (``[fleetrun: N bytes cut: output over its 1.0 MB cap]``, well under this).
MARKER_ROOM = 200
#: What a chatty agent prints: over the cap, so an uncapped log shows.
CHATTY_BYTES = 1_500_000
TERMINAL = ("DONE", "NEEDS_HUMAN", "CANCELLED")


@dataclass
class TaskPlan:
    """One task of the queue, as generated from the seed."""

    name: str
    kind: str
    deps: list[str]
    merge_deps: bool  # base = "dependencies"
    steps: list[dict[str, Any]]
    review: Optional[list[dict[str, Any]]] = None

    def verify(self) -> str:
        if self.kind == "retry":
            return f"test \"$(cat fix-{self.name}.txt)\" = final || {{ echo 'fix-{self.name}.txt must say final'; exit 1; }}"
        return f"test -f {self.name}.txt"


@dataclass
class SoakOptions:
    """What to run and which blows to strike (each optional)."""

    tasks: int = 300
    seed: int = 1
    parallel: int = 4
    supervisor_kills: bool = True
    shepherd_kills: bool = True
    disk_full: bool = True
    malformed: bool = True
    #: tasks whose agent prints more than the cap, and whose agent detaches a process
    #: with setsid: what items 5 and 6 of issue 21 fix
    chatty: int = 2
    detach: int = 1
    #: seconds between blows (uniform)
    gap: tuple[float, float] = (0.5, 3.0)
    deadline: float = 1800.0
    #: drop a peer's link for 1-4 s (with peers)
    peer_links: bool = True
    cap_bytes: int = CAP_BYTES
    log: Any = None  # a callable taking a line: progress while it runs


@dataclass(frozen=True)
class Violation:
    kind: str
    task: str
    what: str
    evidence: str = ""

    def __str__(self) -> str:
        ev = f"\n      evidence: {self.evidence}" if self.evidence else ""
        return f"[{self.kind}] {self.task}: {self.what}{ev}"


@dataclass
class SoakReport:
    tasks: int = 0
    states: Counter[str] = field(default_factory=Counter)
    kinds: Counter[str] = field(default_factory=Counter)
    kills: Counter[str] = field(default_factory=Counter)
    supervisor_runs: int = 0
    attempts: int = 0
    unknown_costs: int = 0
    killed_shepherds: set[int] = field(default_factory=set)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)

    def lines(self) -> list[str]:
        by_kind = Counter(v.kind for v in self.violations)
        out = [
            f"tasks: {self.tasks} ({', '.join(f'{k} {n}' for k, n in sorted(self.kinds.items()))})",
            f"end states: {', '.join(f'{k} {n}' for k, n in sorted(self.states.items())) or '-'}",
            f"attempts: {self.attempts} ({self.unknown_costs} whose reported cost was lost with its "
            f"output: unknown in the ledger); supervisor runs: {self.supervisor_runs}; {self.seconds:.1f}s",
            "kills: " + (", ".join(f"{k} {n}" for k, n in sorted(self.kills.items())) or "none"),
            *(f"note: {n}" for n in self.notes),
            f"violations: {len(self.violations)}"
            + (" (" + ", ".join(f"{k} {n}" for k, n in sorted(by_kind.items())) + ")" if by_kind else ""),
        ]
        out += [f"  {v}" for v in self.violations]
        return out


# ---------------------------------------------------------------------------------
# the queue


def plan_queue(opts: SoakOptions) -> list[TaskPlan]:
    """The tasks, from the seed alone."""
    rng = random.Random(opts.seed)
    n = opts.tasks
    special: dict[int, str] = {}
    spots = rng.sample(range(n), min(n, opts.chatty + opts.detach))
    for i, spot in enumerate(spots):
        special[spot] = "chatty" if i < opts.chatty else "detach"
    plans: list[TaskPlan] = []
    for i in range(n):
        name = f"t{i:04d}"
        kind = (
            special.get(i)
            or rng.choices(["plain", "retry", "malformed", "reviewed"], weights=[5, 2, 1 if opts.malformed else 0, 2])[
                0
            ]
        )
        deps: list[str] = []
        if i and rng.random() < 0.4:
            # chains and fan-in among the last few, so dependents wait on running work
            pool = range(max(0, i - 8), i)
            deps = sorted({f"t{j:04d}" for j in rng.sample(list(pool), min(len(pool), rng.choice([1, 1, 2, 3])))})
        merge = bool(deps) and rng.random() < 0.5

        def cost(k: int, i: int = i) -> float:
            return round(0.001 * (i + 1) + 0.0001 * (k + 1), 6)

        def nap() -> list[Any]:
            return ["sleep", round(rng.uniform(0.05, 0.6), 3)]

        done = [["write", f"{name}.txt", name], ["commit", name]]
        if kind == "retry":
            steps = [
                {"actions": [nap(), ["write", f"fix-{name}.txt", "draft"], ["commit", "draft"]], "cost": cost(0)},
                {"actions": [nap(), ["write", f"fix-{name}.txt", "final"], ["commit", "final"]], "cost": cost(1)},
            ]
        elif kind == "malformed":
            steps = [
                {
                    "mode": "raw",
                    "actions": [nap()],
                    "cost": cost(0),
                    "raw": [
                        '{"type":"result","subtype":"success","total_cost_usd":"a lot"',
                        "\x00\xff not json",
                        '{"type": "result", "is_error": 7}',
                    ],
                },
                {"actions": [nap(), *done], "cost": cost(1)},
            ]
        elif kind == "chatty":
            steps = [
                {"actions": [nap(), ["bash", f"head -c {CHATTY_BYTES} /dev/zero | tr '\\0' x"], *done], "cost": cost(0)}
            ]
        elif kind == "detach":
            # a process the agent leaves behind in a session of its own (item 6)
            steps = [
                {"actions": [nap(), ["bash", "setsid sleep 3600 </dev/null >/dev/null 2>&1 &"], *done], "cost": cost(0)}
            ]
        else:
            steps = [{"actions": [nap(), *done], "cost": cost(0)}]
        # later steps (a resumed session after a kill) do the work again, at their own cost
        steps.append(
            {
                "actions": [
                    nap(),
                    *(done if kind != "retry" else [["write", f"fix-{name}.txt", "final"], ["commit", "final"]]),
                ],
                "cost": cost(len(steps)),
            }
        )
        review = None
        if kind == "reviewed":
            review = [
                {
                    "structured": {"verdict": "PASS", "reason": "looks right"},
                    "result": "PASS",
                    "cost": round(0.00001 * (i + 1), 8),
                }
            ]
        plans.append(TaskPlan(name, kind, deps, merge, steps, review))
    return plans


def tasks_toml(plans: list[TaskPlan]) -> str:
    blocks = []
    for p in plans:
        lines = [
            "[[task]]",
            f'name = "{p.name}"',
            'cwd = "repo"',
            f'prompt = "Do {p.name}."',
            'git_ref = "main"',
            "max_retries = 4",
        ]
        if p.deps:
            lines.append("depends_on = " + json.dumps(p.deps))
        if p.merge_deps:
            lines.append('base = "dependencies"')
        lines += ["  [[task.verify]]", f"  run = {json.dumps(p.verify())}"]
        if p.review:
            lines += ["  [[task.verify]]", '  agent = "Review the change."']
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def write_queue(fleeter: Any, fake_claude: Any, plans: list[TaskPlan], opts: SoakOptions, costs: Path) -> None:
    fleeter.make_repo()
    fleeter.monkeypatch.setenv("FAKE_CLAUDE_COSTS", str(costs))
    base = f'[claude]\nexecutable = "{fake_claude.executable}"\nallowed_tools = ["Bash"]\n'
    # the output cap of item 5, where this fleetrun has it
    fleeter.write_config(base + f"\n[output]\nmax_bytes = {opts.cap_bytes}\n")
    fleeter.write_policy(f"[local]\nmax_tasks = {opts.parallel}\n")
    fleeter.write_tasks(tasks_toml(plans))
    steps: dict[str, list[dict[str, Any]]] = {p.name: p.steps for p in plans}
    steps.update({f"{p.name}:review": p.review for p in plans if p.review})
    fake_claude.script(**steps)
    r = fleeter.runsub("queue", "tasks.toml")
    if r.ret == 4 and "output: unknown table" in r.stderr:
        fleeter.write_config(base)
        if opts.log:
            opts.log(
                f"no [output] max_bytes in this fleetrun: files over {opts.cap_bytes} bytes are reported all the same"
            )
        r = fleeter.runsub("queue", "tasks.toml")
    if r.ret != 0:
        raise RuntimeError(f"fleetrun queue exited {r.ret}:\n{r.stdout}{r.stderr}")


# ---------------------------------------------------------------------------------
# the chaos


def _ro(home: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{home / 'state.db'}?mode=ro", uri=True, timeout=30)


def _states(home: Path) -> dict[str, str]:
    try:
        conn = _ro(home)
        try:
            return dict(conn.execute("SELECT name, state FROM tasks").fetchall())
        finally:
            conn.close()
    except sqlite3.Error:
        return {}


def _is_shepherd_of(pid: int, token: Optional[str], home: Path) -> bool:
    """Whether ``pid`` is still the shepherd the ledger recorded: a shepherd by its
    command line, and the one of this home (run by path, its attempt folder is on it) or
    the very process (forked by the supervisor's starter, its command line is the
    starter's: its start-time token tells it from a reused pid)."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    if not any(b"shepherd" in part for part in cmd):
        return False
    return any(str(home).encode() in part for part in cmd) or (token is not None and proc_token(pid) == token)


def fill(path: Path) -> int:
    """Write ``path`` until its file system is full; :return: bytes written."""
    n = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for size in (1 << 20, 65536, 4096, 512):
            chunk = b"\0" * size
            while True:
                try:
                    n += os.write(fd, chunk)
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
                    break
    finally:
        os.close(fd)
    return n


class NetPeers:
    """Peers in network namespaces of their own (tests/sshd.py's PeerLab: a real sshd
    each, behind a veth link), each with a clone of the repository at its path, as on
    another machine: a task placed on one runs in that peer's home, on a branch of its
    clone (fetched back here when the task has dependents). Their homes are folders of
    this machine, which the checks read."""

    def __init__(self, root: Path, monkeypatch: Any, n: int) -> None:
        """:raises Exception: (pytest's Skipped among them) when this machine cannot."""
        from sshd import PeerLab, keygen

        (root / "client-key").mkdir(mode=0o700)
        key = keygen(root / "client-key" / "id_ed25519", "fleetrun-soak")
        self.n = n
        self.lab = PeerLab(root, monkeypatch, key)
        try:
            self.net = self.lab.netlab()
        except BaseException:
            self.lab.close()
            raise
        self.machines: list[Any] = []
        self.down: dict[int, float] = {}  # peer index -> when its link comes back

    def pair(self, fleeter: Any, repo: Path) -> None:
        """Start them, each with its clone of ``repo``, and pair them with ``fleeter``'s home."""
        for i in range(self.n):
            m = self.lab.machine(f"p{i}", netns=True, repo=repo)
            self.machines.append(m)
            m.write("policy.toml", "[local]\nmax_tasks = 2\n")
            m.pair(fleeter)

    def drop(self, i: int, until: float) -> None:
        self.net.link(self.machines[i].netns, up=False)
        self.down[i] = until

    def restore(self, now: float) -> None:
        for i, until in list(self.down.items()):
            if now >= until:
                self.net.link(self.machines[i].netns, up=True)
                del self.down[i]

    def home_of(self, host: str) -> Optional[Path]:
        return next((m.home for m in self.machines if m.name == host), None)

    def close(self) -> None:
        self.restore(float("inf"))
        self.lab.close()


class Soak:
    """Runs the queue under chaos; :meth:`run` returns the report."""

    def __init__(
        self,
        fleeter: Any,
        fake_claude: Any,
        opts: SoakOptions,
        root: Path,
        small_disk: Optional[str] = None,
        peers: Optional[NetPeers] = None,
    ) -> None:
        """:param root: everything of this soak is under it (the orphan scan's needle).
        :param small_disk: why the home is not on a small file system, or None when it
            is (the disk-full blow needs one)."""
        self.fleeter = fleeter
        self.fake = fake_claude
        self.opts = opts
        self.root = root
        self.home: Path = fleeter.home
        # the blows' kinds and gaps from one generator, their targets (which depend on what
        # runs at that moment) from another: the schedule stays the seed's whatever the timing
        self.rng = random.Random(opts.seed * 7919 + 1)
        self.aim = random.Random(opts.seed * 7919 + 2)
        self.plans = plan_queue(opts)
        self.by_name = {p.name: p for p in self.plans}
        self.report = SoakReport(tasks=len(self.plans), kinds=Counter(p.kind for p in self.plans))
        self.costs = root / "fake-costs.ndjson"
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.out = open(root / "supervisor.out", "ab")  # noqa: SIM115 - closed in run()
        self.filler: Optional[Path] = None
        self.fill_until = 0.0
        self.hit: Counter[str] = Counter()  # shepherd kills per task
        self.peers = peers
        self.blows = [
            k
            for k, on in (
                ("supervisor", opts.supervisor_kills),
                ("shepherd", opts.shepherd_kills),
                ("disk_full", opts.disk_full and small_disk is None),
                ("peer_link", opts.peer_links and peers is not None),
            )
            if on
        ]
        if opts.disk_full and small_disk is not None:
            self.report.notes.append(f"no full disk: {small_disk}")

    def say(self, line: str) -> None:
        if self.opts.log:
            self.opts.log(line)

    def start_supervisor(self) -> None:
        self.report.supervisor_runs += 1
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fleetrun", "work", "--until-idle"],
            cwd=self.fleeter.path,
            stdin=subprocess.DEVNULL,
            stdout=self.out,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, TERM="dumb"),
        )

    def kill_supervisor(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            return False
        self.proc.kill()  # SIGKILL, the supervisor only: shepherds run in sessions of their own
        self.proc.wait(timeout=60)
        self.proc = None  # started again at once; not an exit of its own
        return True

    def kill_shepherd(self) -> bool:
        """SIGKILL the shepherd of a running attempt whose task can take one more resume
        (RESUME_CAP is 3: a task's blows stay under it, so the queue can still end DONE)."""
        try:
            conn = _ro(self.home)
            try:
                rows = conn.execute(
                    "SELECT t.name, t.resumes, a.shepherd_pid, a.shepherd_token "
                    "FROM attempts a JOIN tasks t "
                    "ON a.task_id = t.id WHERE a.state = 'running' AND a.shepherd_pid IS NOT NULL "
                    "AND t.state = 'RUNNING' AND a.host = 'local' ORDER BY t.name"
                ).fetchall()
            finally:
                conn.close()
        except sqlite3.Error:
            return False
        fit = [
            (name, pid, token)
            for name, resumes, pid, token in rows
            if resumes + self.hit[name] < 2 and self.by_name[name].kind != "malformed"
        ]
        if not fit:
            return False
        name, pid, token = self.aim.choice(fit)
        if not _is_shepherd_of(pid, token, self.home):
            return False
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            return False
        self.hit[name] += 1
        self.report.killed_shepherds.add(pid)
        return True

    def fill_disk(self) -> bool:
        if self.filler is not None:
            return False
        self.filler = self.home / "soak-filler"
        fill(self.filler)
        self.fill_until = time.monotonic() + self.rng.uniform(1.0, 3.0)
        return True

    def free_disk(self) -> None:
        if self.filler is not None:
            self.filler.unlink(missing_ok=True)
            self.filler = None

    def drop_link(self) -> bool:
        assert self.peers is not None
        i = self.rng.randrange(len(self.peers.machines))
        until = time.monotonic() + self.rng.uniform(1.0, 4.0)
        if i in self.peers.down:
            return False
        self.peers.drop(i, until)
        return True

    def strike(self) -> None:
        kind = self.rng.choice(self.blows)
        if {
            "supervisor": self.kill_supervisor,
            "shepherd": self.kill_shepherd,
            "disk_full": self.fill_disk,
            "peer_link": self.drop_link,
        }[kind]():
            self.report.kills[kind] += 1

    def run(self) -> SoakReport:
        started = time.monotonic()
        try:
            write_queue(self.fleeter, self.fake, self.plans, self.opts, self.costs)
            if self.peers is not None:
                self.peers.pair(self.fleeter, self.fleeter.path / "repo")
            self.drive(started)
        finally:
            self.free_disk()
            if self.peers is not None:
                self.peers.restore(float("inf"))
            if self.proc is not None and self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(timeout=60)
            self.out.close()
        self.report.seconds = time.monotonic() - started
        self.report.violations = check(
            self.fleeter, self.fake, self.plans, self.costs, self.root, self.opts.cap_bytes, self.report, self.peers
        )
        return self.report

    def drive(self, started: float) -> None:
        next_blow = time.monotonic() + self.rng.uniform(*self.opts.gap)
        last_idle: Optional[dict[str, str]] = None
        last_say = 0.0
        while True:
            now = time.monotonic()
            if self.filler is not None and now >= self.fill_until:
                self.free_disk()
            if self.peers is not None:
                self.peers.restore(now)
            if self.proc is None or self.proc.poll() is not None:
                states = _states(self.home)
                if self.proc is not None and self.filler is None:
                    # it ended by itself (idle, or an error it printed): done, or nothing
                    # more can move when nothing moved since its last such end
                    if all(s in TERMINAL for s in states.values()) or states == last_idle:
                        return
                    last_idle = states
                self.start_supervisor()
            if self.blows and now >= next_blow:
                self.strike()
                next_blow = now + self.rng.uniform(*self.opts.gap)
            if now - last_say >= 10:
                last_say = now
                c = Counter(_states(self.home).values())
                self.say(f"{now - started:6.0f}s {dict(sorted(c.items()))} kills {dict(self.report.kills)}")
            if now - started > self.opts.deadline:
                self.report.violations.append(
                    Violation(
                        "deadline",
                        "-",
                        f"the queue did not end in {self.opts.deadline:g}s",
                        json.dumps(dict(Counter(_states(self.home).values()))),
                    )
                )
                return
            time.sleep(0.05)


# ---------------------------------------------------------------------------------
# the checks

#: check_invariants' lines, by what they are about
_KINDS = [
    (r"overlapped", "overlap"),
    (r"started \d+ times|no call for it|abandoned as never started", "ran_twice"),
    (r"transition|the log ends|first transition", "transitions"),
    (r"verdict", "verdicts"),
    (r"still (leased|starting|running)|never wrote an end|no status.json|shepherd", "attempts"),
    (r"worktree", "worktree"),
]


def _classify(line: str) -> Violation:
    task = line.split(" ", 1)[0].rstrip(":")
    for pattern, kind in _KINDS:
        if re.search(pattern, line):
            return Violation(kind, task, line.split(" ", 1)[1] if " " in line else line)
    return Violation("durability", task, line)


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, env=dict(os.environ, **GIT_ENV), timeout=120
    )


def _env_of(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(p.decode(errors="replace").split("=", 1) for p in raw.split(b"\0") if b"=" in p)


def timeline(led: Any, t: Any) -> str:
    """A task's transitions, short: the evidence of how it got where it is."""
    return "transitions: " + ", ".join(f"{r.to_state}({r.cause[:80]})" for r in led.transitions(t.id))


def read_costs(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    return [c for c in map(whole_call, text[: text.rfind("\n") + 1].splitlines()) if c is not None]


def check(
    fleeter: Any,
    fake_claude: Any,
    plans: list[TaskPlan],
    costs: Path,
    root: Path,
    cap: int,
    report: SoakReport,
    peers: Optional[NetPeers] = None,
) -> list[Violation]:
    """Every violation, each with its task, what broke and the evidence."""
    bad: list[Violation] = list(report.violations)
    led = fleeter.ledger()
    if peers is not None:
        # a peer attempt's status.json is in the peer's home: the checks below read each
        # attempt's in this home's attempt folder, so it is linked there (the run is over)
        for a in led.attempts():
            there = peers.home_of(a.host)
            src = there / "attempts" / a.id / "status.json" if there is not None else None
            if src is not None and src.exists():
                adir = fleeter.home / "attempts" / a.id
                adir.mkdir(parents=True, exist_ok=True)
                if not (adir / "status.json").exists():
                    (adir / "status.json").symlink_to(src)
        report.notes.append(
            "attempts by host: "
            + ", ".join(f"{h} {n}" for h, n in sorted(Counter(a.host for a in led.attempts()).items()))
        )
    tasks = {t.name: t for t in led.tasks()}
    by_id = {t.id: t for t in tasks.values()}
    report.states = Counter(t.state.value for t in tasks.values())
    report.attempts = len(led.attempts())

    # -- every task ended, DONE (each blow stays within what a task may take)
    for p in plans:
        t = tasks.get(p.name)
        if t is None:
            bad.append(Violation("lost", p.name, "not in the ledger"))
        elif t.state.value != "DONE":
            bad.append(
                Violation(
                    "end_state", p.name, f"ended {t.state.value}, not DONE", f"{t.reason[:300]}; {timeline(led, t)}"
                )
            )

    # -- the crash-point tests' invariants (transitions, attempts, verdicts, worktrees)
    actual = {name: t.state.value for name, t in tasks.items()}  # end states are checked above
    # an agent whose shepherd we killed may die before the fake logs its call
    struck = {
        f"{by_id[a.task_id].name} attempt {a.number}: an agent ran but the fake has no call for it"
        for a in led.attempts()
        if a.shepherd_pid in report.killed_shepherds
    }
    # an attempt counted as a session that died, though its shepherd recorded nothing (it
    # refuses to start what it cannot record: a full disk) and no agent ran
    called = {(c["env"].get("FLEETRUN_TASK_ID"), c["env"].get("FLEETRUN_ATTEMPT")) for c in fake_claude.calls()}
    unstarted: dict[str, Violation] = {}
    for a in led.attempts():
        adir = fleeter.home / "attempts" / a.id
        if a.outcome == "died" and read_status(adir) is None and (a.task_id, str(a.number)) not in called:
            t = by_id[a.task_id]
            out = (
                (adir / "shepherd.out").read_text(errors="replace").strip()[:300]
                if (adir / "shepherd.out").exists()
                else ""
            )
            unstarted[f"{t.name} attempt {a.number} (ended) has no status.json"] = Violation(
                "died_unstarted",
                t.name,
                f"attempt {a.number} was counted as a session that died (a resume "
                "spent) though its shepherd never wrote status.json and no agent ran",
                f"shepherd {a.shepherd_pid}, shepherd.out {out!r}, resumes {t.resumes}; {timeline(led, t)}",
            )
    # an attempt whose shepherd ended before recording a start is ended start_failed,
    # with no status.json: nothing ran, nothing to find
    struck |= {
        f"{by_id[a.task_id].name} attempt {a.number} (ended) has no status.json"
        for a in led.attempts()
        if a.outcome == "start_failed"
    }
    for line in check_invariants(fleeter, fake_claude, actual):
        if line in struck:
            continue
        bad.append(unstarted.pop(line) if line in unstarted else _classify(line))
    bad += unstarted.values()

    # -- every task ended once: one move into a terminal state, nothing after it
    for t in tasks.values():
        rows = led.transitions(t.id)
        ends = [i for i, r in enumerate(rows) if r.to_state in TERMINAL]
        if len(ends) > 1:
            bad.append(
                Violation(
                    "ended_twice",
                    t.name,
                    f"{len(ends)} moves into a terminal state",
                    "; ".join(f"{rows[i].from_state}->{rows[i].to_state} ({rows[i].cause})" for i in ends),
                )
            )
        if ends and ends[0] != len(rows) - 1:
            after = rows[ends[0] + 1 :]
            bad.append(
                Violation(
                    "after_terminal",
                    t.name,
                    f"{len(after)} transitions after {rows[ends[0]].to_state}",
                    "; ".join(f"{r.from_state}->{r.to_state} ({r.cause})" for r in after[:5]),
                )
            )

    # -- a DONE task of base = "dependencies" holds each dependency's head
    repo = fleeter.path / "repo"
    for p in plans:
        t = tasks.get(p.name)
        if not p.merge_deps or t is None or t.state.value != "DONE":
            continue
        for dep in p.deps:
            d = tasks.get(dep)
            if d is None or not d.branch or not t.branch:
                bad.append(Violation("deps_merged", p.name, f"no branch to compare with {dep}"))
                continue
            head = _git(repo, "rev-parse", d.branch).stdout.strip()
            r = _git(repo, "merge-base", "--is-ancestor", head, t.branch)
            if r.returncode != 0:
                bad.append(
                    Violation(
                        "deps_merged",
                        p.name,
                        f"DONE without {dep}'s head",
                        f"{dep} {d.branch} at {head[:12]} is not an ancestor of {t.branch} "
                        f"({_git(repo, 'rev-parse', t.branch).stdout.strip()[:12]}); "
                        f"{timeline(led, t)}",
                    )
                )

    # -- the ledger's costs are the agents' reported costs
    reported: dict[tuple[str, str, bool], list[float]] = {}
    for c in read_costs(costs):
        reported.setdefault((c.get("task_id") or "?", c.get("attempt") or "?", bool(c.get("verifier"))), []).append(
            float(c["cost"])
        )
    for t in tasks.values():
        total = 0.0
        for a in led.attempts(t.id):
            said = reported.get((t.id, str(a.number), False), [])
            if a.cost_usd is not None:
                total += a.cost_usd
            if a.cost_usd and not said:
                bad.append(
                    Violation(
                        "cost",
                        t.name,
                        f"attempt {a.number} costs {a.cost_usd} in the ledger, but its agent reported no cost",
                    )
                )
            elif (
                said
                and a.cost_usd is not None
                and a.state in ("ended", "verified")
                and abs(a.cost_usd - said[-1]) > 1e-9
            ):
                bad.append(
                    Violation(
                        "cost",
                        t.name,
                        f"attempt {a.number}: ledger {a.cost_usd} != reported {said[-1]}",
                        f"outcome {a.outcome}",
                    )
                )
            elif said and a.cost_usd is None:
                st = read_status(fleeter.home / "attempts" / a.id) or {}
                if st.get("log_dropped") or st.get("state") != "ended":
                    # its result line never reached the log (a full disk; a killed shepherd):
                    # the ledger says unknown, not a made-up figure, and the task's cost is a floor
                    report.unknown_costs += 1
                else:
                    bad.append(
                        Violation(
                            "cost",
                            t.name,
                            f"attempt {a.number} reported {said[-1]} but its cost is unknown in the ledger",
                            f"outcome {a.outcome}, status {st}",
                        )
                    )
            for v in led.verdicts(attempt_id=a.id):
                total += v.cost_usd
                if v.kind == "agent":
                    rev = reported.get((t.id, str(a.number), True), [])
                    # 0: a reviewer that never printed its result (a full disk, a timeout)
                    if v.cost_usd and not any(abs(v.cost_usd - x) <= 1e-9 for x in rev):
                        bad.append(
                            Violation(
                                "cost",
                                t.name,
                                f"attempt {a.number}'s reviewer verdict costs {v.cost_usd}, reported: {rev}",
                            )
                        )
        if abs(total - t.cost_usd) > 1e-6:
            bad.append(
                Violation(
                    "cost", t.name, f"the task's cost {t.cost_usd} != its attempts' and verdicts' {round(total, 8)}"
                )
            )

    # -- no output file over the cap: the agents', reviewers', verifiers' and setups'
    # output is kept in the attempt folders (the ledger and the event log are not output)
    owners = {a.id: by_id[a.task_id].name for a in led.attempts()}
    homes = [("", fleeter.home)] + [(f"{m.name}:", m.home) for m in (peers.machines if peers else [])]
    for where, home in homes:
        for dirpath, _dirs, files in os.walk(home / "attempts"):
            for f in files:
                path = Path(dirpath) / f
                try:
                    size = path.lstat().st_size
                except OSError:
                    continue
                if size > cap + MARKER_ROOM:
                    rel = path.relative_to(home)
                    owner = owners.get(rel.parts[1], "-") if len(rel.parts) > 1 else "-"
                    bad.append(
                        Violation("file_cap", owner, f"{where}{rel} is {size} bytes (cap {cap}, and a marker line)")
                    )

    # -- no orphan process: nothing whose command line, cwd or environment is this soak's
    left = wait_no_leftovers(root)
    for proc in left:
        try:
            cmd = " ".join(proc.cmdline())
        except Exception:
            cmd = ""
        if peers is not None and ("sshd" in cmd or " host " in f" {cmd} " or cmd.endswith(" host")):
            continue  # a peer's sshd or the `fleetrun host` worker of a connection: the lab's, not a task's
        env = _env_of(proc.pid)
        bad.append(
            Violation(
                "orphan",
                env.get("FLEETRUN_TASK_NAME", "-"),
                f"process {proc.pid} outlived the run",
                describe_procs([proc]),
            )
        )
    return bad


def kill_orphans(root: Path) -> None:
    from acceptance.test_crash_points import kill_leftovers

    kill_leftovers(root)

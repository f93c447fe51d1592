"""The ends of many peers' attempts are handled together: one pass takes every end its
polls return and sends their collect requests, and the pass that reads the collects'
replies moves every one of those tasks to VERIFYING and starts their verifiers, each
pass with one commit of the ledger (an fsync), not one a peer (issue 24: a peer's end to
VERIFYING grew with the fleet, 0.7 s at 20 peers, one commit after another).

Counted, not timed: the commits of the loop's ledger connection in each pass. So
that the ends and the replies come in one pass whatever the machine's speed, a plugin
holds the loop at a pass's end (``fleetrun_loop_pass``, on the loop's thread) until
every peer has pushed its attempt's end, then until every collect's reply is in.
"""

from __future__ import annotations

import os
import shlex
import shutil
import time
from pathlib import Path
from typing import Any, Callable

from fleetrun.hookimpl import hookimpl
from fleetrun.ledger import LEDGER_KEY

pytest_plugins = ["sshd"]

PEERS = 3
#: a bound for a hung run, not a timing
HANG_S = 120.0


def wait_until(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + HANG_S
    while not cond():
        assert time.monotonic() < deadline, f"waited {HANG_S:g}s for {what}"
        time.sleep(0.02)


class TaskCommits:
    """The commits of the loop's ledger connection that wrote a task's rows (an SQL trace
    callback, as tests/test_commits.py counts them): one that writes only the ``meta``
    table (the waits ``status`` shows, saved when they changed) is left out, as its
    number depends on the machine's speed."""

    def __init__(self) -> None:
        self.n = 0
        self.tasks = False
        self.conn: Any = None

    def attach(self, led: Any) -> int:
        """Count ``led``'s commits from now on. :return: the count so far."""
        if self.conn is not led.conn:
            self.conn = led.conn
            led.conn.set_trace_callback(self)
        return self.n

    def __call__(self, sql: str) -> None:
        word = sql.split(None, 1)[0].upper() if sql.strip() else ""
        if word == "BEGIN":
            self.tasks = False
        elif word in ("INSERT", "UPDATE", "DELETE") and " meta " not in f" {sql} ":
            self.tasks = True
        elif word == "COMMIT" and self.tasks:
            self.n += 1


class PassCommits:
    """The part of the plugins below that records, at each pass's end, the commits of the
    loop's ledger connection in that pass and the moves it made."""

    def __init__(self) -> None:
        self.commits = TaskCommits()
        self.moves: list[str] = []
        self.passes: list[tuple[int, list[str]]] = []  # (commits, moves) of each pass
        self.mark = 0

    def fleetrun_transition(
        self, task: Any, from_state: str, to_state: str, cause: str, attempt: Any, config: Any
    ) -> None:
        self.moves.append(to_state)

    def record_pass(self, config: Any) -> Any:
        """Record the pass that just ended. :return: the loop's ledger."""
        led = config.stash[LEDGER_KEY]
        n = self.commits.attach(led)
        self.passes.append((n - self.mark, self.moves))
        self.mark, self.moves = n, []
        return led


class TogetherInOnePass(PassCommits):
    """A plugin: once every task runs, lets their agents end (``gate``) and holds the
    loop at that pass's end until every end is pushed, each with its collect's answer
    (the peer's worker collects at the end); at the next pass's end (it took the ends,
    moved the tasks to VERIFYING and sent their verifiers' starts), until every verdict
    is pushed; at the next (it recorded them and began the handoffs), until every branch
    is fetched back. So each of those passes takes all the peers' at once. Records each
    pass's commits and moves."""

    def __init__(self, gate: Path) -> None:
        super().__init__()
        self.gate = gate
        self.phase = "running"
        self.ends_pass = -1  # the index of the pass that took the ends
        self.handoffs: list[Any] = []

    def fleetrun_loop_pass(self, config: Any, duration_s: float) -> None:
        led = self.record_pass(config)
        relay = config.pluginmanager.get_plugin("relay-peers")
        if self.phase == "running" and len(led.attempts(states={"running"})) == PEERS:
            self.gate.touch()  # every agent may end now

            def pushed() -> bool:
                running = {a.id for a in led.attempts(states={"running"})}
                got: set[str] = set()
                for host in relay.hosts.values():
                    w = host.live_worker()
                    got |= set(w.ended) & set(w.collected) if w is not None else set()
                return running <= got

            wait_until(pushed, "every peer's end pushed with its collect's answer")
            self.phase = "ended"
        elif self.phase == "ended":  # this pass took the ends, collected: VERIFYING, verifiers started
            self.ends_pass = len(self.passes) - 1
            assert not relay.collects, f"a collect request was sent: {relay.collects}"

            def verified() -> bool:
                got = set()
                for host in relay.hosts.values():
                    w = host.live_worker()
                    got |= {a for a, _ in w.verified} if w is not None else set()
                return len(got) == PEERS

            wait_until(verified, "every verdict pushed")
            self.phase = "verified"
        elif self.phase == "verified":  # this pass took the verdicts: the handoffs (fetch-backs) are under way
            assert len(self.handoffs) == PEERS, f"the verdicts were not taken in one pass: {self.handoffs}"
            wait_until(lambda: all(h.fut.done() for h in self.handoffs), "every branch fetched back")
            self.phase = "fetched"

    @hookimpl(wrapper=True)
    def fleetrun_handoff(self, task: Any, attempt: Any, host: Any, config: Any) -> Any:
        got = yield
        if hasattr(got, "fut"):  # made off the loop's thread
            self.handoffs.append(got)
        return got


class HeldAtPassEnd:
    """A plugin: at each pass's end, the requests its peers' workers hold (made by the
    pass and not waited for), before the relay gives them to the senders and after."""

    def __init__(self) -> None:
        self.passes: list[tuple[int, int]] = []

    @hookimpl(wrapper=True, tryfirst=True)
    def fleetrun_loop_pass(self, config: Any, duration_s: float) -> Any:
        relay = config.pluginmanager.get_plugin("relay-peers")

        def held() -> int:
            workers = [h.live_worker() for h in relay.hosts.values()]
            return sum(w.held() for w in workers if w is not None)

        before = held()
        got = yield
        self.passes.append((before, held()))
        return got


def test_the_ends_verdicts_and_handoffs_of_several_peers_tasks_are_each_handled_in_one_pass_with_one_commit(
    fleeter, fake_claude, peer_lab, tmp_path
):
    fleeter.make_repo()
    names = [f"p{i}" for i in range(PEERS)]
    for name in names:
        peer_lab.machine(name).pair(fleeter)
    gate = tmp_path / "agents-may-end"
    fleeter.write_tasks(
        "\n".join(
            f"""
        [[task]]
        name = "t{name}"
        cwd = "repo"
        prompt = "Write out.txt."
        git_ref = "main"
        peer = "{name}"
        allowed_tools = ["Bash"]

          [[task.verify]]
          run = "test -f out.txt"
    """
            for name in names
        )
    )
    wait = ["bash", f"while [ ! -e {shlex.quote(str(gate))} ]; do sleep 0.05; done"]
    fake_claude.script(
        **{f"t{name}": [{"actions": [wait, ["write", "out.txt", "x"], ["commit", "out"]]}] for name in names}
    )
    seen, held = TogetherInOnePass(gate), HeldAtPassEnd()
    r = fleeter.run("tasks.toml", plugins=[seen, held])
    assert r.ret == 0, r.stdout + r.stderr
    assert {t.name: (t.state.value, t.host) for t in fleeter.ledger().tasks()} == {
        f"t{name}": ("DONE", name) for name in names
    }
    assert seen.phase == "fetched", f"the run went past what the test holds it for ({seen.phase})"
    took_ends = seen.passes[seen.ends_pass]
    # the pass that took the ends (each pushed with its collect's answer) wrote them,
    # moved every task to VERIFYING and sent its verifier's start, with no commit between;
    # before, it committed before asking each peer, and before each verifier's start
    assert took_ends == (1, ["VERIFYING"] * PEERS), f"the pass that took {PEERS} ends: (commits, moves) {took_ends}"
    # and its verifiers' starts went to the workers' senders together as it ended, none
    # between its ends (each send, paramiko's Python, took the loop's thread's GIL): a
    # request given to a sender would have given it every one held before it
    assert held.passes[seen.ends_pass] == (PEERS, 0), f"(held, after) at each pass's end: {held.passes}"
    # the pass that read the verdicts recorded them and began every handoff (each branch
    # fetched back off the loop's thread); before, it committed before each handoff
    took_verdicts, took_handoffs = seen.passes[seen.ends_pass + 1], seen.passes[seen.ends_pass + 2]
    assert took_verdicts == (1, []), f"the pass that read the verdicts: {took_verdicts}"
    # the pass that read the fetch-backs: DONE, and every worktree removed after one
    # commit of their ends (docs/durability.md); before, one commit a DONE
    assert took_handoffs == (1, ["DONE"] * PEERS), f"the pass that read the fetch-backs: {took_handoffs}"


class PreparesAnsweredTogether(PassCommits):
    """A plugin: holds the loop at its first pass's end until every peer's first
    heartbeat is in (the tasks are then placed in one pass); keeps the handle of each
    peer's prepare request (a hookwrapper of ``fleetrun_prepare_workspace``); once every
    task's is sent, opens ``gate`` (the peers' ``git worktree add`` waits for it) at a
    pass's end and holds the loop there until every reply is in. Records each pass's
    commits and moves."""

    def __init__(self, gate: Path) -> None:
        super().__init__()
        self.gate = gate
        self.handles: list[Any] = []
        self.answered_before = -1  # the index of the pass after which every reply was in

    @hookimpl(wrapper=True)
    def fleetrun_prepare_workspace(self, task: Any, attempt: Any, host: Any, config: Any) -> Any:
        got = yield
        self.handles.append(got)
        return got

    def fleetrun_loop_pass(self, config: Any, duration_s: float) -> None:
        self.record_pass(config)
        relay = config.pluginmanager.get_plugin("relay-peers")
        # every peer heard from before the first placement: the tasks are placed in one pass
        wait_until(lambda: not relay.first_probe_pending(), "every peer's first heartbeat")
        if self.answered_before < 0 and len(self.handles) == PEERS:
            assert all(getattr(h, "sent", None) is not None for h in self.handles), self.handles
            self.gate.touch()
            wait_until(lambda: all(h.sent.done() for h in self.handles), "every prepare's reply")
            self.answered_before = len(self.passes) - 1


def test_the_leases_and_the_starts_of_several_peers_attempts_each_share_one_commit(
    fleeter, fake_claude, peer_lab, tmp_path
):
    """A lease is durable before its workspace is made, an attempt's ``starting`` before
    its start is sent (docs/durability.md): the leases of one pass's placements share
    one commit, and so do the starts of the prepares answered in one pass; not one a peer."""
    fleeter.make_repo()
    names = [f"p{i}" for i in range(PEERS)]
    bin_dir, gate = tmp_path / "peer-bin", tmp_path / "worktrees-may-be-made"
    bin_dir.mkdir()
    (bin_dir / "git").write_text(
        "#!/bin/sh\n"
        f'case " $* " in *" worktree add "*) while [ ! -e {shlex.quote(str(gate))} ]; do sleep 0.05; done;; esac\n'
        f'exec {shlex.quote(shutil.which("git") or "/usr/bin/git")} "$@"\n'
    )
    (bin_dir / "git").chmod(0o755)
    for name in names:
        peer_lab.machine(name).pair(fleeter, PATH=f"{bin_dir}:{os.environ['PATH']}")
    fleeter.write_tasks(
        "\n".join(
            f"""
        [[task]]
        name = "t{name}"
        cwd = "repo"
        prompt = "Write out.txt."
        git_ref = "main"
        peer = "{name}"

          [[task.verify]]
          run = "test -f out.txt"
    """
            for name in names
        )
    )
    fake_claude.script(**{f"t{name}": [{"actions": [["write", "out.txt", "x"], ["commit", "out"]]}] for name in names})
    seen = PreparesAnsweredTogether(gate)
    r = fleeter.run("tasks.toml", plugins=[seen])
    assert r.ret == 0, r.stdout + r.stderr
    assert {t.name: (t.state.value, t.host) for t in fleeter.ledger().tasks()} == {
        f"t{name}": ("DONE", name) for name in names
    }
    # the pass that placed them: every lease, one commit, then every prepare sent; before,
    # one commit a lease
    placed = [p for p in seen.passes if "ASSIGNED" in p[1]]
    assert placed == [(1, ["ASSIGNED"] * PEERS)], f"the passes that placed the tasks: {placed}"
    assert seen.answered_before >= 0, "the prepares were not all sent before one was answered"
    # the pass after every reply came: every workspace recorded with its attempt's
    # `starting`, one commit, then every start sent (their answers come in later passes);
    # before, one commit a start
    assert seen.passes[seen.answered_before + 1] == (1, []), seen.passes

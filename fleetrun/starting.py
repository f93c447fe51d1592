"""Placing and starting attempts: each pass the loop asks ``fleetrun_place`` where each
placeable task goes, leases it there, prepares its workspace (setup runs next, when the
task has any), builds its prompt and starts its agent under a shepherd.

The crash points (:mod:`fleetrun.crash`) mark the steps a crash may fall between;
adoption (:mod:`fleetrun.adoption`) picks up after each.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Any, Optional

from . import baseline, clock, crash
from .config import output_cap
from .decide import Placed, StartAttempt, WaitFor, budget_exhausted
from .exceptions import StateConflict, UsageError
from .gitutil import WorktreeTampered
from .hostapi import AgentNotFound, Host, StartRefused, candidates_of, get_host, missing_host_reason
from .ledger import Attempt, Task
from .links import task_links
from .liveness import sock_path
from .procutil import task_env
from .reports import (
    SESSION_NOT_FOUND,
    Candidate,
    Handoff,
    Placement,
    SpawnSpec,
    Started,
    StartHandle,
    Wait,
    Workspace,
    WorkspaceHandle,
)
from .states import ACTIVE, PLACEABLE, State

if TYPE_CHECKING:
    from .config import Config
    from .ending import Ending
    from .loop import Loop


def shepherd_spec(task: Task, att: Attempt, spawn: SpawnSpec, config: Config) -> dict[str, Any]:
    """What a shepherd runs for an attempt (``spec.json``): the agent's argv in its
    workspace (``att.workspace``, else the task's ``cwd``), the task environment and the
    agent's own variables, its timeouts, and the loop's wake-up socket."""
    cwd = str((att.workspace or {}).get("path") or task.spec.cwd)
    env = {**task_env(task, att, cwd, base={}), **(spawn.env or {})}
    return {
        "argv": spawn.argv,
        "cwd": cwd,
        "env": env,
        "stdin": spawn.stdin,
        "timeout_s": task.spec.timeout_min * 60.0,
        "stall_s": task.spec.stall_timeout_min * 60.0,
        "notify": sock_path(config.home),
        "max_output": output_cap(config),
    }


@dataclass
class Preparing:
    """A leased attempt whose workspace is made off the loop's thread (the task stays
    ASSIGNED, the attempt ``leased``, as while setup runs)."""

    attempt: Attempt
    handle: WorkspaceHandle
    kind: str
    prev: Optional[Attempt]


@dataclass
class Launching:
    """An attempt whose start was sent and not answered yet (a peer's: the task stays
    ASSIGNED, the attempt ``starting``, as a crash right after the start leaves it)."""

    attempt: Attempt
    host: Any
    handle: StartHandle


#: A candidate's measurements: they move on every pass (see :meth:`Starting.signature`).
_MEASURED = frozenset({"free_mem_mb", "load_per_core", "free_disk_mb", "mem_per_task_mb"})


def floors_met(c: Candidate) -> tuple[Optional[bool], Optional[bool], Optional[bool]]:
    """Whether ``c`` passes each of its floors as :func:`fleetrun.placement.why_not` checks
    them (free memory after a task, load per core, free disk): None for one not set."""
    mem = load = disk = None
    if c.min_free_mem_mb is not None:
        mem = c.free_mem_mb is not None and c.free_mem_mb - c.mem_per_task_mb >= c.min_free_mem_mb
    if c.max_load_per_core is not None:
        load = c.load_per_core is not None and c.load_per_core <= c.max_load_per_core
    if c.min_free_disk_mb is not None:
        disk = c.free_disk_mb is not None and c.free_disk_mb >= c.min_free_disk_mb
    return mem, load, disk


class Starting:
    """Places and starts attempts for the loop. ``loop`` gives the ledger, the hooks, the
    waits, the setup stage and the way an attempt that cannot start ends
    (``loop.ending``)."""

    def __init__(self, loop: Loop) -> None:
        self.loop = loop
        # the tasks that changed since the last placing pass (every task, at first)
        self._changed: set[str] = loop.view.subscribe()
        self._undecided: set[str] = set()  # placeable tasks not told to wait yet
        # task -> what its wait was decided on: (generation of the candidates and
        # policy, generation of the tasks holding slots or 0 when that does not
        # matter to it); the generations' values
        self._decided: dict[str, tuple[int, int]] = {}
        # the same by what they were decided on: which waits a change of the candidates or
        # of the slots may have cleared is found without a look at every waiting task
        self._by_key: dict[tuple[int, int], set[str]] = {}
        # kind ("candidates" or "slots") -> the values lately seen, with their numbers,
        # the most recently used last (see :meth:`generation`)
        self._gens: dict[str, list[tuple[int, Any]]] = {}
        self._next_gen = 1
        self._last = (0, 0)  # the generations the last pass ended on
        self._final = (0, 0)  # the generations as this pass's placements left them
        self.preparing = loop.pending.view(Preparing)  # task id -> its workspace being made
        self.launching = loop.pending.view(Launching)  # task id -> its attempt's start under way
        #: inside :meth:`together`: the attempts leased, to be prepared once the leases
        #: are committed, and the starts whose ``starting`` is written, to be sent once
        #: it is: each kind with one commit
        self._to_prepare: Optional[list[tuple[str, Callable[[], bool]]]] = None
        self._to_start: Optional[list[tuple[str, Callable[[], bool]]]] = None

    @contextmanager
    def together(self) -> Iterator[None]:
        """The attempts leased, and those that reach their start, inside this block (a
        pass's placements, its sweep of the workspaces made) share their durable points:
        the leases are committed once and then each workspace made (or its making sent);
        each start records ``starting``, and then the pass commits once and starts each
        (spawns its shepherd, or sends its peer's request), one task's failure
        contained. A hundred peers' tasks placed, or their prepares answered, in one pass
        cost a commit or two, not a hundred in a row (issue 24). Left by an exception
        (Ctrl-C, a ledger that cannot be written), nothing is prepared or started: the
        attempts are ``leased`` or ``starting``, as a crash there leaves them, and
        adoption settles them."""
        if self._to_start is not None:  # nested: part of the open one
            yield
            return
        self._to_prepare, self._to_start = [], []
        try:
            yield
            loop = self.loop
            prepares, self._to_prepare = self._to_prepare, None
            if prepares:
                loop.led.durable()  # the leases before their workspaces are made
                for task_id, go in prepares:
                    with loop.isolated(task_id):
                        go()  # a workspace made at once goes on to its start: queued below
            starts, self._to_start = self._to_start, None
            if starts:
                loop.led.durable()  # `starting` before the shepherds: a restart looks for each, never starts a second
                for task_id, go in starts:
                    with loop.isolated(task_id):
                        go()
        finally:
            self._to_prepare = self._to_start = None

    # -- placement ---------------------------------------------------------------------

    def pure_placement(self) -> bool:
        """Whether every ``fleetrun_place``, filter and score implementation comes from a
        plugin that declares ``PURE_PLACEMENT = True``: its decision depends only on the
        task, the candidates, the policy, the tasks holding slots and its backoff (the
        built-in ``placement`` plugin and the relay say so). Another plugin's, or a
        ``fleetconf.py``'s, may look at anything: then every waiting task is asked every
        pass."""
        hook = self.loop.config.hook
        for name in ("fleetrun_place", "fleetrun_place_filter", "fleetrun_place_score"):
            for impl in getattr(hook, name).get_hookimpls():
                if getattr(impl.plugin, "PURE_PLACEMENT", False) is not True:
                    return False
        return True

    def generation(self, kind: str, value: Any) -> int:
        """A number for ``value`` of ``kind``: the same for an equal value seen lately.

        Each kind keeps its own eight values, the most recently used kept longest: the
        tasks holding slots are a new value on almost every pass, and sharing one history
        with the candidates pushed out the candidates' value most tasks wait on (the
        machine full): every few ends the whole queue was asked again (issue 24)."""
        seen = self._gens.setdefault(kind, [])
        for k, (gen, old) in enumerate(seen):
            if old == value:
                seen.append(seen.pop(k))
                return gen
        gen = self._next_gen
        self._next_gen += 1
        seen.append((gen, value))
        del seen[:-8]
        return gen

    @staticmethod
    def signature(candidates: list[Candidate], policy: Any) -> list[Any]:
        """What a waiting task's decision depends on besides the task itself, its
        backoff and the tasks holding slots.

        A candidate that can take nothing (unreachable, stale, draining, its slots full)
        counts by those facts only: its free memory moves on every pass, and no task
        could be placed there whatever it is. One that has room counts by all it says
        but its measurements (free memory, load, free disk, the memory a task takes),
        which count by whether each passes its floor: a wait is decided by the filter's
        reasons, and the only ones a measurement changes are the floors (a plugin's
        filter is asked only of a candidate that passed them, and what it says is a
        wait only a person clears, :func:`fleetrun.placement.decide`; a score ranks
        places, it makes no wait). So tasks that wait for a tag or a tool no machine
        has, while one has room, are not asked again on every pass because its free
        memory moved. Backoffs and ``Wait.until`` come back by their wake-up
        (:meth:`~fleetrun.waiting.Waits.due`), reminders too.
        """
        sig: list[Any] = [policy]
        for c in candidates:
            if c.why_not or c.status != "live" or not c.fresh or c.drain or c.running >= c.max_tasks:
                sig.append((c.name, c.kind, c.why_not, c.status, c.fresh, c.drain, c.running, c.max_tasks))
            else:
                facts = {k: v for k, v in vars(c).items() if k not in _MEASURED}
                facts["floors"] = floors_met(c)
                sig.append(facts)
        return sig

    def holding(self) -> int:
        """The generation of the tasks holding slots, as a task in the user's checkout
        waits on them (:func:`~fleetrun.plugins.placement.checkout_in_use`): which they are
        and their states, since one leased but not yet started may be spawned there and
        holds the checkout, and once its attempt is delivered to a role's mailbox it holds
        none (a pass leases every task it places before starting any: Starting.together)."""
        return self.generation("slots", [(t.id, t.state) for t in self.loop.view.in_states(ACTIVE)])

    def _decide_on(self, task_id: str, on: tuple[int, int]) -> None:
        """Remember that ``task_id`` was told to wait on the generations ``on``."""
        self._undecide(task_id)
        self._decided[task_id] = on
        self._by_key.setdefault(on, set()).add(task_id)

    def _undecide(self, task_id: str) -> None:
        on = self._decided.pop(task_id, None)
        if on is not None:
            ids = self._by_key[on]
            ids.discard(task_id)
            if not ids:
                del self._by_key[on]

    @staticmethod
    def _holds(on: tuple[int, int], base: int, holding: int) -> bool:
        """Whether a wait decided on ``on`` still holds on the generations (base, holding)."""
        return on[0] == base and on[1] in (0, holding)

    def _stale(self, base: int, holding: int) -> list[set[str]]:
        """The tasks told to wait on generations other than (base, holding), by what they
        were decided on: their waits may have cleared."""
        return [ids for on, ids in self._by_key.items() if not self._holds(on, base, holding)]

    def place_all(self) -> None:
        try:
            with self.together():
                self._place_all()
        finally:
            self.loop.waits.save()  # what `fleetrun status` shows; written once a pass

    def _place_all(self) -> None:
        loop = self.loop
        waits = loop.waits
        view = loop.view
        view.refresh()
        at = clock.now()
        changed = set(self._changed)
        self._changed.clear()
        due = waits.due(at)
        gone = {i for i in changed if (t := view.get(i)) is None or t.state not in PLACEABLE}
        for i in gone:
            self._undecide(i)
        waits.prune(at, gone)
        if not view.count(PLACEABLE):
            return
        candidates = candidates_of(loop.config)
        waits.mark_paused(candidates, at)
        policy = loop.policy.policy
        # an attempt still ending (a cancel's grace period), or whose work is still being
        # collected (cancelled and retried meanwhile): nothing else runs in its worktree yet
        busy = {
            **{i: c.attempt for i, c in loop.ending.collecting.items()},
            **{a.task_id: a for a in loop.active_attempts()},
        }
        decided = self._decided
        if not self.pure_placement():
            decided.clear()
            self._by_key.clear()
        base = self.generation("candidates", self.signature(candidates, policy))
        holding = self.holding()
        # a task is asked again when it changed, its wake-up came, it was not told to
        # wait, or what its wait was decided on moved (a task in the user's checkout,
        # without git_ref, also waits for the tasks holding slots: checkout_in_use)
        force = changed | due | self._undecided
        self._undecided = set()
        if not decided:  # every one is asked (the first pass, or a placement that is not pure)
            tasks, whole = view.in_states(PLACEABLE), True
        elif self._stale(base, holding):
            # in queue order, until none is left whose wait may have cleared: a freed slot
            # asks the next task, and once it is placed the others' waits hold again
            tasks, whole = view.in_states(PLACEABLE), False
        else:
            tasks, whole = view.ordered(force), False
        self._final = (base, holding)
        try:
            self._place(tasks, force, candidates, policy, busy, base, holding, at, whole)
        finally:
            if self._final != (base, holding):  # a placement changed the candidates: those
                # told to wait on them as they were are asked again on them as they are
                for ids in self._stale(*self._final):
                    self._undecided.update(ids)
            self._last = self._final

    def _place(
        self,
        tasks: list[Task],
        force: set[str],
        candidates: list[Candidate],
        policy: Any,
        busy: dict[str, Attempt],
        base: int,
        holding: int,
        at: float,
        whole: bool = True,
    ) -> None:
        """Ask ``fleetrun_place`` about ``tasks`` in order, passing over those told to wait
        on what has not moved; unless ``whole``, stop once none is left to ask (those in
        ``force``, or told to wait on what has moved since)."""
        loop = self.loop
        waits = loop.waits
        view = loop.view
        decided = self._decided
        qid = loop.queue_id
        asked: set[str] = set()
        ons: dict[tuple[int, int], tuple[int, int]] = {}
        pure = self.pure_placement()
        # forced: the placeable tasks of ``force`` (it holds others: a task that ended, a pause)
        left_forced = sum(
            1 for i in force if (t := view.get(i)) is not None and t.state in PLACEABLE and qid in (None, t.queue_id)
        )
        left_stale = -1 if whole else sum(len(ids) for ids in self._stale(base, holding))
        for k, task in enumerate(tasks):
            if not whole and left_forced <= 0 and left_stale <= 0:
                break  # the rest were told to wait on what holds now: they would be told so again
            if task.state not in PLACEABLE or (qid is not None and task.queue_id != qid):
                continue
            seen = decided.get(task.id)
            forced = task.id in force
            if seen is not None and not forced and self._holds(seen, base, holding):
                continue  # told to wait on what has not moved: it would be told so again
            left_forced -= forced
            left_stale -= seen is not None and not self._holds(seen, base, holding)
            asked.add(task.id)
            # only a task in the user's checkout (no git_ref, with a role or not) waits on
            # the others holding slots; the tasks decided on the same generations keep one
            # tuple of them (30,000 READY tasks kept a tuple each)
            on = (base, 0 if task.spec.git_ref else holding)
            on = ons.setdefault(on, on)
            self._undecide(task.id)
            self._undecided.add(task.id)  # until it is told to wait
            with loop.isolated(task.id):
                if loop.stopping:
                    self._undecided.update(t.id for t in tasks[k:])
                    return
                if task.id in busy:  # the previous attempt is still ending
                    waits.still_ending(task, busy[task.id].number, at)
                    continue
                # less than the agent can be given (--max-budget-usd 0.0000 is refused) is none
                if budget_exhausted(task.spec.budget_usd, task.cost_usd):
                    loop.decide(task, None, Placed(budget=task.spec.budget_usd, spent=task.cost_usd))
                    continue
                decision = loop.hook.fleetrun_place(task=task, candidates=candidates, policy=policy, config=loop.config)
                if isinstance(decision, Placement):
                    # nothing could start it there: wait, lease nothing
                    missing = missing_host_reason(loop.config, decision.host)
                    obs = Placed(host=decision.host) if missing is None else Placed(wait=missing, operator=missing)
                elif isinstance(decision, Wait):
                    obs = Placed(wait=decision.reason, until=decision.until, operator=decision.operator)
                else:
                    assert decision is None, decision
                    obs = Placed()  # no plugin places tasks
                action = loop.decide(task, None, obs)[0]
                if isinstance(action, WaitFor):
                    waits.wait(task, Wait(action.reason, until=action.until, operator=action.operator), at)
                    self._undecided.discard(task.id)
                    self._decide_on(task.id, on)
                    if pure:  # asked again only when what it waits on moves: its spec is read again then
                        view.unload(task.id)
                    continue
                assert isinstance(action, StartAttempt)
                decision = Placement(action.host)
                waits.placed(task.id)
                if self.start(task, decision.host):
                    loop.placed_last_pass = True
                    for c in candidates:
                        if c.name == decision.host:
                            c.running += 1
                            if c.free_mem_mb is not None:
                                c.free_mem_mb -= c.mem_per_task_mb
                    # the rest are decided on the candidates as they are now
                    view.refresh()
                    base = self.generation("candidates", self.signature(candidates, policy))
                    holding = self.holding()
                    self._final = (base, holding)
                    if not whole:  # what is left to ask, on the candidates as they are now
                        left_stale = sum(len(ids) - len(ids & asked) for ids in self._stale(base, holding))

    # -- starting ----------------------------------------------------------------------

    def start(self, task: Task, hostname: str) -> bool:
        loop = self.loop
        led = loop.led
        kind = {State.READY: "fresh", State.RETRYING: "retry", State.RESUMING: "resume"}[task.state]
        prev = led.latest_attempt(task.id)
        crash.point("before_transition:ASSIGNED")
        try:
            att = led.lease(task.id, task.state, hostname, kind)
        except StateConflict:
            return False
        go = partial(self._prepare, task, att, hostname, kind, prev)
        if self._to_prepare is not None:  # with the other leases of this stretch, after one commit
            self._to_prepare.append((task.id, go))
            return True
        led.durable()  # the lease before its workspace is made (docs/durability.md, durable points)
        return go()

    def _prepare(self, task: Task, att: Attempt, hostname: str, kind: str, prev: Optional[Attempt]) -> bool:
        """Make the workspace of an attempt whose lease is durable (or have it made)."""
        loop = self.loop
        led = loop.led
        ending = loop.ending
        crash.point("after_lease")
        prev_state = task.state
        task = loop.get(task.id)
        loop.notify(task, prev_state, State.ASSIGNED, "placed", att.number)
        crash.point("after_transition:ASSIGNED")
        host = get_host(loop.config, hostname)
        try:
            ws = loop.hook.fleetrun_prepare_workspace(task=task, attempt=att, host=host, config=loop.config)
        except Exception as e:
            return self.not_prepared(task, att, host, e)
        if ws is None:  # -p no:worktree, say: no pass will find a plugin that does
            led.update_attempt(att.id, state="abandoned", outcome="plugin_missing", ended=time.time())
            ending.give_up_at_once(
                task, att, "plugin_missing:no plugin prepared a workspace (is its plugin blocked? see -p no:NAME)"
            )
            return False
        if not isinstance(ws, Workspace):  # being made off the loop's thread: poll() goes on
            self.preparing[task.id] = Preparing(att, ws, kind, prev)
            return True
        return self.prepared(task, att, ws, host, kind, prev)

    def not_prepared(self, task: Task, att: Attempt, host: Host, e: Exception) -> bool:
        """``fleetrun_prepare_workspace`` (or its handle) raised: the attempt does not start.
        :return: False."""
        led = self.loop.led
        ending = self.loop.ending
        if isinstance(e, WorktreeTampered):  # the worktree a previous attempt left was tampered with
            led.update_attempt(att.id, state="abandoned", ended=time.time())
            ending.worktree_tampered(task, att, e, f"attempt {att.number} was not started in it")
            return False
        if getattr(e, "permanent", False):  # a bad ref, a branch checked out elsewhere...
            led.update_attempt(att.id, state="abandoned", outcome="workspace_failed", ended=time.time())
            made = getattr(e, "workspace", None)
            if isinstance(made, Workspace):  # made, and kept for a human (a merge stopped on a conflict)
                self.record_workspace(task, att, made, host)
            cause = getattr(e, "cause", None) or f"workspace_failed:{' '.join(str(e).split()) or type(e).__name__}"
            ending.give_up_at_once(self.loop.get(task.id), att, cause)
            return False
        led.update_attempt(att.id, state="abandoned", outcome="start_failed", ended=time.time())
        word = "peer_refused" if isinstance(e, StartRefused) else "start_failed"
        ending.not_started(task, att, f"{word}:{type(e).__name__ if not str(e) else e}")
        return False

    def poll_one(self, task_id: str, p: Preparing) -> None:
        """A workspace being made off the loop's thread (an entry of the loop's pending
        table): go on once it is made."""
        loop = self.loop
        try:
            ws = p.handle.poll()
        except Exception as e:
            failed: Optional[Exception] = e
            ws = None
        else:
            failed = None
            if ws is None:
                return
        del self.preparing[task_id]
        task = loop.led.get(task_id)
        att = loop.led.attempt(p.attempt.id)
        if task is None or att is None or task.state is not State.ASSIGNED or att.state != "leased":
            # cancelled while it was made (or given up by a new adoption): nothing starts;
            # a worktree made for a task that ended is recorded, so `fleetrun gc` finds it
            if att is not None and att.state == "leased":
                loop.led.update_attempt(att.id, state="abandoned", outcome="cancelled", ended=time.time())
            if ws is not None and task is not None and task.state.terminal and att is not None:
                self.record_workspace(task, att, ws, get_host(loop.config, att.host))
            return
        host = get_host(loop.config, att.host)
        if failed is not None:
            self.not_prepared(task, att, host, failed)
            return
        assert ws is not None
        self.prepared(task, att, ws, host, p.kind, p.prev)

    def poll_launch_one(self, task_id: str, s: Launching) -> None:
        """A start sent and not answered yet (an entry of the loop's pending table): go on
        once it is answered. A task cancelled meanwhile is handled as one cancelled while
        it started (its shepherd, if it was started, is stopped)."""
        loop = self.loop
        att = s.attempt

        def record(att_id: str = att.id, **fields: Any) -> None:
            loop.led.update_attempt(att_id, **fields)

        try:
            info = s.handle.poll()
        except Exception as e:
            del self.launching[task_id]
            self.start_failed(loop.get(task_id), att, e, record)
            return
        except BaseException:
            del self.launching[task_id]  # the task's internal error: it is set aside
            raise
        if info is None:
            return
        del self.launching[task_id]
        self.started(loop.get(task_id), loop.get_attempt(att.id), s.host, info, record)

    def drop_preparing(self) -> int:
        """Ctrl-C: forget the workspaces being made (their attempts stay ``leased``: the
        next adoption gives them up and the next attempt reuses what was made).

        :return: how many there were."""
        n = len(self.preparing)
        self.preparing.clear()
        return n

    def prepared(self, task: Task, att: Attempt, ws: Workspace, host: Host, kind: str, prev: Optional[Attempt]) -> bool:
        """The attempt's workspace is made: record it, then setup or the agent."""
        loop = self.loop
        crash.point("after_worktree")
        if not task.spec.setup and not baseline.steps(task):
            # recorded with the attempt's next write, before any effect (durability.md)
            return self.launch(task, att, ws, kind, prev, made=(ws, host))
        self.record_workspace(task, att, ws, host)
        loop.led.durable()  # the workspace before its setup commands run in it
        task = loop.get(task.id)
        att = loop.get_attempt(att.id)
        if loop.setup.needed(task, att, ws):
            loop.setup.begin(task, att, ws, kind, prev)  # launch() follows once it has passed
            return True
        return self.launch(task, att, ws, kind, prev)

    def record_workspace(
        self, task: Task, att: Attempt, ws: Workspace, host: Host, cur: Optional[sqlite3.Cursor] = None
    ) -> None:
        """The attempt's workspace, the task's worktree and branch (in ``cur``, or a tx)."""
        led = self.loop.led
        if cur is None:
            with led.tx() as c:
                return self.record_workspace(task, att, ws, host, c)
        led.update_attempt(att.id, cur=cur, workspace=asdict(ws), dir=str(host.attempt_dir(att.id)))
        led.update_task(task.id, cur=cur, worktree=ws.task_worktree, branch=ws.branch)

    def launch(
        self,
        task: Task,
        att: Attempt,
        ws: Workspace,
        kind: str,
        prev: Optional[Attempt],
        made: Optional[tuple[Workspace, Host]] = None,
    ) -> bool:
        """Build the prompt and start the agent in a prepared (and set up) workspace.

        :param made: a workspace just made and not yet recorded, and its host: it is
            written in the transaction of the attempt's next write, before any effect."""
        loop = self.loop
        host = get_host(loop.config, att.host)
        if made is not None:  # what the ledger will say once it is recorded
            att = replace(att, workspace=asdict(made[0]), dir=str(made[1].attempt_dir(att.id)))
            task = replace(task, worktree=made[0].task_worktree, branch=made[0].branch)

        def record(**fields: Any) -> None:
            nonlocal made
            with loop.led.tx() as cur:
                if made is not None:
                    self.record_workspace(task, att, made[0], made[1], cur)
                loop.led.update_attempt(att.id, cur=cur, **fields)
            made = None

        try:
            return self._launch(task, att, ws, kind, prev, host, loop.ending, record)
        except BaseException:  # a hook that raised, Ctrl-C: the worktree is the task's all the same
            if made is not None:
                with contextlib.suppress(Exception):  # what goes on up is the first exception
                    self.record_workspace(task, att, made[0], made[1])
            raise

    def _launch(
        self,
        task: Task,
        att: Attempt,
        ws: Workspace,
        kind: str,
        prev: Optional[Attempt],
        host: Host,
        ending: Ending,
        record: Callable[..., None],
    ) -> bool:
        loop, led = self.loop, self.loop.led
        context = self.prompt_context(task, kind, prev)
        left = None
        if task.spec.budget_usd is not None:
            left = max(0.0, task.spec.budget_usd - task.cost_usd)
            att.info["budget_left_usd"] = left
        if prev is not None and prev.session_id and prev.outcome != SESSION_NOT_FOUND:
            # a session the agent could not find to resume is not offered again: it
            # would only be not found again, resume after resume
            att.info["resume_session"] = prev.session_id
        prompt = loop.hook.fleetrun_build_prompt(task=task, attempt=att, config=loop.config, context=context)
        spawn: Optional[SpawnSpec]
        try:
            found = loop.hook.fleetrun_spawn(
                task=task, attempt=att, workspace=ws, prompt=prompt or task.spec.prompt, config=loop.config
            )
            spawn = SpawnSpec.coerce(found) if found is not None else None
        except UsageError as e:  # the agent's configuration, or a plugin's reply
            spawn = None
            err = e.message
        else:
            if found is None:  # -p no:claude, say: no pass will find a plugin that does
                record(state="abandoned", outcome="plugin_missing", ended=time.time())
                ending.give_up_at_once(
                    task,
                    att,
                    f"plugin_missing:no plugin spawns agent {task.spec.agent!r} "
                    "(is its plugin blocked? see -p no:NAME)",
                )
                return False
            err = ""
        if spawn is None:
            record(state="abandoned", outcome="start_failed", ended=time.time())
            ending.not_started(task, att, f"start_failed:{err}")
            return False
        record(state="starting", session_id=spawn.session_id, info={**att.info, "argv": spawn.argv})
        go = partial(self._send_start, task, att, host, spawn, prompt, record)
        if self._to_start is not None:  # with the other starts of this stretch, after one commit
            self._to_start.append((task.id, go))
            return True
        led.durable()  # `starting` before the shepherd: a restart looks for it, never starts a second
        return go()

    def _send_start(
        self,
        task: Task,
        att: Attempt,
        host: Host,
        spawn: SpawnSpec,
        prompt: Optional[str],
        record: Callable[..., None],
    ) -> bool:
        """Start the attempt, its ``starting`` durable: the shepherd, or a peer's request."""
        loop = self.loop
        att = loop.get_attempt(att.id)
        try:
            info = loop.hook.fleetrun_start_attempt(
                task=task, attempt=att, host=host, spawn=spawn, prompt=prompt or task.spec.prompt, config=loop.config
            )
        except Exception as e:
            return self.start_failed(task, att, e, record)
        if info is not None and not isinstance(info, Started):  # sent, not answered yet: poll() goes on
            self.launching[task.id] = Launching(att, host, info)
            return True
        return self.started(task, att, host, info, record)

    def start_failed(self, task: Task, att: Attempt, e: Exception, record: Callable[..., None]) -> bool:
        """``fleetrun_start_attempt`` (or its handle) raised: the attempt did not start."""
        loop = self.loop
        if isinstance(e, AgentNotFound):
            # an agent that is not installed here never starts: ask a human now, not after
            # ten backed-off tries (a peer's shepherd reports the same from its side)
            record(state="abandoned", outcome="agent_not_found", ended=time.time())
            loop.ending.give_up_at_once(loop.get(task.id), att, f"agent_not_found:{e}")
            return False
        # a peer refused, or could not be reached
        record(state="abandoned", outcome="start_failed", ended=time.time())
        word = "peer_refused" if isinstance(e, StartRefused) else "start_failed"
        loop.ending.not_started(loop.get(task.id), att, f"{word}:{e}")
        return False

    def started(
        self, task: Task, att: Attempt, host: Any, info: Optional[Started], record: Callable[..., None]
    ) -> bool:
        """The attempt's start answered: RUNNING (or given up when no plugin started it)."""
        loop, led, ending = self.loop, self.loop.led, self.loop.ending
        if info is None:  # -p no:shepherd, say: no pass will find a plugin that does
            record(state="abandoned", outcome="plugin_missing", ended=time.time())
            ending.give_up_at_once(
                loop.get(task.id),
                att,
                "plugin_missing:no plugin started the attempt (is its plugin blocked? see -p no:NAME)",
            )
            return False
        crash.point("after_shepherd_start")
        moved = {"host": info.host} if info.host else {}  # it runs elsewhere than placed (a mailbox)
        running: dict[str, Any] = dict(
            state="running",
            started=time.time(),
            shepherd_pid=info.pid,
            shepherd_token=info.token,
            dir=info.dir,
            **moved,
        )
        current = loop.get(task.id)
        mine = current.attempts == att.number
        if loop.get_attempt(att.id).state in ("ended", "verified"):
            # its end came before its start's answer (a peer's start is not waited for,
            # and the peer may push the attempt's end first): the end is recorded and
            # moved the task on (``adopted``, then on from the end); the answer changes
            # nothing, and the task is not moved again (found by the long soak)
            return True
        if mine and current.state is State.RUNNING:
            led.update_attempt(att.id, **running)  # adopted meanwhile: its shepherd is known now
            return True
        # the attempt's pid and the task's RUNNING in one commit: the shepherd already
        # runs, and a crash before it finds the attempt `starting`, whose shepherd the
        # restart looks for and adopts (as after_shepherd_start)
        now = (
            loop.move(
                task,
                State.RUNNING,
                info.cause or "started",
                attempt=att.number,
                also=lambda cur: led.update_attempt(att.id, cur=cur, **running),
            )
            if mine and current.state is State.ASSIGNED
            else None
        )
        if now is None:  # cancelled (or given up) while it was starting
            led.update_attempt(att.id, **running)  # its shepherd is known, to be stopped and reaped
            get_host(loop.config, info.host or att.host).stop(att.id, info.pid, info.token)
        loop.report(
            task.id,
            partial(
                loop.hook.fleetrun_attempt_started,
                task=now or loop.get(task.id),
                attempt=loop.get_attempt(att.id),
                host=host,
                config=loop.config,
            ),
        )
        return True

    def prompt_context(self, task: Task, kind: str, prev: Optional[Attempt]) -> dict[str, Any]:
        led = self.loop.led
        handoffs = []
        for dep_id in task.deps:
            dep = led.get(dep_id)
            if dep is not None and dep.handoff:
                handoff = Handoff(**dep.handoff)
                # attached after its DONE (a pull request): kept apart from the handoff
                handoff.links = {**handoff.links, **task_links(led, dep_id)}
                handoffs.append(handoff)
        failures = []
        if prev is not None and kind in ("retry", "resume"):
            # the failures of the newest attempt that reached a verdict
            for a in reversed([a for a in led.attempts(task.id) if a.number <= prev.number]):
                vs = [v for v in led.verdicts(attempt_id=a.id) if not v.passed]
                if vs:
                    failures = vs
                    break
                if kind == "retry":
                    break
        # why it resumes: the cause of the move to RESUMING, not the task's reason now
        # (that is ``placed``, from the lease just made), and the attempt it names; an
        # attempt given up as never started is passed over for the one before it
        resume_reason, previous = None, prev
        if kind == "resume":
            rows = [r for r in led.transitions(task.id) if r.to_state == State.RESUMING.value]
            row = next(
                (r for r in reversed(rows) if not r.cause.startswith("lease_expired")), rows[-1] if rows else None
            )
            if row is not None:
                resume_reason = row.cause
                previous = next((a for a in led.attempts(task.id) if a.number == row.attempt), prev)
        return {
            "kind": kind,
            "handoffs": handoffs,
            "failures": failures,
            "resume_reason": resume_reason,
            "previous": previous,
        }

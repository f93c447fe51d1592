"""The work loop: observe (ledger, shepherds, verifiers) -> decide -> call hooks.

Event-driven: it sleeps in ``select`` on a datagram socket the shepherds send to
when an agent ends, and on the verifiers' process handles; a task is verified as
soon as its agent exits, and a dependent starts as soon as its dependency is DONE.
A one-second timeout is the safety net (and the liveness heartbeat).
"""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from . import clock, crash, effects, ops
from .adoption import Adoption
from .decide import (
    Action,
    BackOff,
    CleanUp,
    Facts,
    Move,
    Note,
    NoteKeptWorktree,
    Observation,
    PauseHost,
    Ran,
    decide,
)
from .ending import Collecting, Ending
from .exceptions import ExitCode, UsageError, is_space_error
from .gitutil import GitError
from .hostapi import get_host
from .ledger import Attempt, Ledger, Task
from .liveness import Liveness, sock_path
from .pending import PendingTable
from .policy import POLICY_KEY, PolicyWatcher
from .queueing import load_new_queues
from .reports import Workspace
from .setupstage import SettingUp, SetupStage
from .starting import Launching, Preparing, Starting
from .states import STATE_ORDER, State
from .taskview import TASKVIEW_KEY, TaskView
from .verifying import Verifying, VerifyStage
from .waiting import BACKOFF_KEY, USAGE_PAUSE_KEY, Waits, interrupted_note

if TYPE_CHECKING:
    from .config import Config
    from .session import Session

INTERNAL_ERROR_LOG = "internal-error.log"


def log_internal_error(home: Path, text: str) -> Optional[Path]:
    """Append a traceback to ``$FLEETRUN_HOME/internal-error.log``, in the form the CLI
    writes for an internal error (exit 3). :return: the log, or None if it cannot be written."""
    from .version import __version__

    log = home / INTERNAL_ERROR_LOG
    try:
        home.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "a") as f:
            f.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} fleetrun {__version__}\n{text}\n")
    except OSError:
        return None
    return log


class Loop:
    """One run of the loop: the object the session, the stages and the hooks share.

    Each concern is a stage it owns: :class:`~fleetrun.adoption.Adoption` (``adoption``),
    :class:`~fleetrun.starting.Starting` (``starting``: placement, lease, start),
    :class:`~fleetrun.setupstage.SetupStage` (``setup``),
    :class:`~fleetrun.ending.Ending` (``ending``: an attempt's end, as
    :mod:`fleetrun.outcomes` decides it), :class:`~fleetrun.verifying.VerifyStage`
    (``verify``) and :class:`~fleetrun.waiting.Waits` (``waits``). The loop itself keeps
    the transitions, the containment of one task's failure and the pass.
    """

    def __init__(
        self, config: Config, ledger: Ledger, session: Session, queue_id: Optional[str], until_idle: bool
    ) -> None:
        self.config = config
        self.led = ledger
        self.session = session
        self.queue_id = queue_id
        self.until_idle = until_idle
        self.hook = config.hook
        self.policy = PolicyWatcher(config.home / "policy.toml")
        # the tasks, kept in memory: a pass reads again only the rows that changed
        self.view = TaskView(ledger)
        self._promote_seen = self.view.subscribe()
        self._promote_all = True  # the first pass looks at every PENDING task (by query)
        config.stash[TASKVIEW_KEY] = self.view
        # the one table of what the loop waits on, by task: workspaces being made, setup
        # commands, work being collected, verifiers and handoffs (each stage sees its kind)
        self.pending = PendingTable()
        self.waits = Waits(self)
        self.adoption = Adoption(self)
        self.starting = Starting(self)
        self.setup = SetupStage(self)  # tasks whose setup commands run before their agent
        self.ending = Ending(self)
        self.verify = VerifyStage(self)
        # transitions logged so far; those after it that the loop did not make itself
        # (`own`) were made from another shell and are shown too
        self.seen_transition = ledger.last_transition_id()
        # what this run reports and exits on when it has no queue of its own (`work`):
        # the tasks not yet terminal at its start, and those that moved since: every
        # move is a transition, so those not terminal now or with one after this mark
        self.started_at: Optional[int] = self.seen_transition if queue_id is None else None
        self.own: Counter[tuple[str, str, str]] = Counter()
        self.stopping: Optional[str] = None
        self.exitfirst = bool(config.getoption("exitfirst"))
        self.liveness = Liveness(config.home)
        self.sock: Optional[socket.socket] = None
        self.placed_last_pass = False
        self.io_error: Optional[str] = None
        self.readopt = False
        self._to_clean: Optional[list[Task]] = None  # inside cleanups_together: the tasks ended there
        self.config.stash.setdefault(BACKOFF_KEY, {})

    # -- plumbing ----------------------------------------------------------------------

    def notify(self, task: Task, src: State, dst: State, cause: str, attempt: Optional[int]) -> None:
        self.own[(task.id, dst.value, cause)] += 1
        # the hooks hear of it once it is committed (the pass's batch: Ledger.after_commit)
        self.report(
            task.id,
            partial(
                self.hook.fleetrun_transition,
                task=task,
                from_state=src.value,
                to_state=dst.value,
                cause=cause,
                attempt=attempt,
                config=self.config,
            ),
        )
        if self.exitfirst and dst is State.NEEDS_HUMAN and self.in_scope(task):
            self.stopping = self.stopping or f"stopping after the first NEEDS_HUMAN ({task.name}) (-x)"

    def report(self, task_id: str, call: Callable[[], object]) -> None:
        """Call a reporting hook of ``task_id`` (``fleetrun_transition``,
        ``fleetrun_attempt_started``, ``fleetrun_verdict``...) once what the pass wrote
        so far is committed, in the order they were made: a hook hears only of what a
        restart will find (:meth:`~fleetrun.ledger_schema.LedgerFile.after_commit`)."""

        def told() -> None:
            with self.isolated(task_id):  # a hook that raises is that task's internal error, as before
                call()

        self.led.after_commit(told)

    def before_host_io(self, host: Optional[str]) -> None:
        """Commit what the pass wrote before asking a host other than this machine's
        (a peer over SSH, a scheduler): its answer may take seconds, which other
        writers (a ``cancel``, a ``mailbox done``) must not spend waiting for the
        pass's write lock (docs/durability.md, *One commit a pass*)."""
        if host != "local":
            self.led.durable()

    def move(
        self,
        task: Task,
        to: State,
        cause: str,
        attempt: Optional[int] = None,
        also: Optional[Callable[[sqlite3.Cursor], None]] = None,
        **fields: Any,
    ) -> Optional[Task]:
        return ops.move(self.led, task, to, cause, self.notify, attempt=attempt, also=also, **fields)

    # -- the decision, applied ---------------------------------------------------------

    def facts(self, task: Task, att: Optional[Attempt]) -> Facts:
        """What :func:`fleetrun.decide.decide` knows of ``task`` and its attempt ``att``."""
        host = att.host if att is not None else (task.host or "local")
        return Facts(
            state=task.state,
            name=task.name,
            kind=att.kind if att is not None else "fresh",
            host=host,
            attempt=att.number if att is not None else 0,
            resumes=task.resumes,
            retries=task.retries,
            max_retries=task.spec.max_retries,
            no_start=task.no_start,
            verifiers=len(task.spec.verify),
            backoff=self.waits.backoff_of(task.id, host),
            pause=self.waits.pause_of(host),
            now=time.time(),
            clock_now=clock.now(),
        )

    def decide(self, task: Task, att: Optional[Attempt], obs: Observation) -> list[Action]:
        """Decide for ``task`` on ``obs`` and apply what the ledger, the waits and the
        hooks carry out (:meth:`apply`). :return: the actions left to the stage that
        observed (collect, start a verifier, hand off, run a setup step, start the agent
        or the attempt, wait, drop)."""
        return self.apply(task, att, decide(self.facts(task, att), obs))

    def apply(self, task: Task, att: Optional[Attempt], actions: list[Action]) -> list[Action]:
        """Apply ``actions`` for ``task`` (whose attempt is ``att``) in order: a move, the
        attempt's record written with it, notes, backoffs, pauses, the cleanup of a
        terminal task. A move the ledger refuses (the task moved meanwhile) ends the
        list; the attempt's own record is written all the same (it is over).

        :return: the actions that are the observing stage's to carry out."""
        rest: list[Action] = []
        now: Optional[Task] = task
        for a in actions:
            if isinstance(a, Move):
                write = self._attempt_write(att, a)
                now = self.move(
                    task, a.to, a.cause, attempt=att.number if att is not None else None, also=write, **a.fields
                )
                if now is None:
                    if write is not None:
                        write(None)
                    return []
                task = now
            elif isinstance(a, Ran):
                assert att is not None
                self.waits.clear_backoff(task.id, att.host)
                if task.no_start:
                    self.led.update_task(task.id, no_start=0)
                    task = self.get(task.id)
            elif isinstance(a, PauseHost):
                assert att is not None
                self.waits.pause_host(att.host, (a.until, a.count))
                self.report(
                    task.id,
                    partial(
                        self.hook.fleetrun_host_paused, host=att.host, until=a.until, reason=a.cause, config=self.config
                    ),
                )
                # the pause committed before the move (one commit more, on a usage limit only):
                # a restart between the two decides the end again, to the same pause
                self.led.durable()
                crash.point("after_pause")
            elif isinstance(a, BackOff):
                assert att is not None
                self.waits.back_off(task.id, att.host, a.backoff)
            elif isinstance(a, Note):
                self.led.add_note(task.id, a.text)
            elif isinstance(a, NoteKeptWorktree):
                if task.worktree:  # git refuses to remove it now, even with --force: say how
                    self.led.add_note(
                        task.id,
                        f"kept worktree {task.worktree} as the agent left it; to start "
                        "over, remove that folder and run `git worktree prune` in the "
                        "repository",
                    )
            elif isinstance(a, CleanUp):
                self.finish_terminal(task)
            else:
                rest.append(a)
        return rest

    def _attempt_write(self, att: Optional[Attempt], m: Move) -> Optional[Callable[[Optional[sqlite3.Cursor]], None]]:
        """The attempt's record that moves with ``m`` (in its transaction, or alone)."""
        if att is None or (m.attempt_state is None and m.outcome is None and not m.info):
            return None
        fields: dict[str, Any] = {}
        if m.attempt_state is not None:
            fields["state"] = m.attempt_state
            if m.attempt_state == "abandoned":
                fields["ended"] = time.time()
        if m.outcome is not None:
            fields["outcome"] = m.outcome
        led, att_id, info = self.led, att.id, m.info

        def write(cur: Optional[sqlite3.Cursor]) -> None:
            if info:
                current = led.attempt(att_id)
                merged = {**(current.info if current is not None else {}), **info}
                fields["info"] = {k: v for k, v in merged.items() if v is not None}
            led.update_attempt(att_id, cur=cur, **fields)

        return write

    # -- isolation ---------------------------------------------------------------------

    @contextmanager
    def isolated(self, task_id: str) -> Iterator[None]:
        """Handle one task's event so that a bug (in fleetrun, a plugin or a fleetconf.py
        hook) stops that task, not the fleet: the exception is logged with its
        traceback and the task goes to NEEDS_HUMAN ``internal_error:<Type: message>``.

        What is not the task's own goes on up as before: a usage error, Ctrl-C, a full
        disk or a ledger that cannot be written (the loop or the CLI handle those).
        """
        try:
            yield
        except (UsageError, sqlite3.OperationalError):
            raise
        except OSError as e:
            if is_space_error(e):
                raise
            self.internal_error(task_id, e)
        except Exception as e:
            self.internal_error(task_id, e)

    def internal_error(self, task_id: str, exc: Exception) -> None:
        """Contain an unexpected exception raised while handling ``task_id`` (called in
        the ``except`` block, so the traceback is the current one)."""
        text = traceback.format_exc()
        log = log_internal_error(self.config.home, text)
        detail = " ".join(f"{type(exc).__name__}: {exc}".split())
        detail = "".join(c if c.isprintable() else "?" for c in detail)[:200]
        try:
            ended = self._contain(task_id, detail)
        except Exception as again:  # the ledger itself fails: not one task's problem
            raise exc from again
        where = f"the traceback is in {log}" if log else "the traceback follows:\n" + text
        what = f"it stays {ended.value} (a note in its logs says so)" if ended else "it needs a human"
        self.config.err.write(f"fleetrun: internal error while handling a task ({detail}); {what}; {where}\n")

    def _contain(self, task_id: str, detail: str) -> Optional[State]:
        """Set the task aside. :return: its state when it had already ended (DONE, say:
        a cleanup hook raised), which it keeps; None when it now needs a human."""
        self.verify.drop(task_id)
        for att in self.led.attempts(task_id):
            if att.state not in ("leased", "starting", "running"):
                continue
            # the task will not be looked after any more: nothing of it may run on
            if att.state != "leased":
                try:
                    get_host(self.config, att.host).stop(att.id, att.shepherd_pid, att.shepherd_token)
                except Exception as e:
                    self.led.add_note(task_id, f"could not stop attempt {att.number}: {type(e).__name__}: {e}")
            self.led.update_attempt(
                att.id,
                state="ended" if att.state == "running" else "abandoned",
                outcome="internal_error",
                ended=time.time(),
            )
        task = self.led.get(task_id)
        if task is None:
            return None
        if task.state.terminal:
            self.led.add_note(task_id, f"internal error after it was {task.state}: {detail}")
            return task.state
        now = self.move(task, State.NEEDS_HUMAN, f"internal_error:{detail}", attempt=task.attempts or None)
        if now is not None:
            try:
                self.finish_terminal(now)
            except Exception as e:  # a cleanup hook that fails too: the task is already set aside
                self.led.add_note(task_id, f"cleanup failed: {type(e).__name__}: {e}")
        return None

    def get(self, task_id: str) -> Task:
        task = self.led.get(task_id)
        assert task is not None, task_id
        return task

    def get_attempt(self, attempt_id: str) -> Attempt:
        att = self.led.attempt(attempt_id)
        assert att is not None, attempt_id
        return att

    def in_scope(self, task: Task) -> bool:
        return self.queue_id is None or task.queue_id == self.queue_id

    def scope_in(self, states: Iterable[State]) -> list[Task]:
        """The tasks in scope in ``states``, in queue order, from the view (refreshed):
        held states (:data:`~fleetrun.taskview.HELD`) only, the others are asked of the
        ledger (:meth:`scope_count`)."""
        self.view.refresh()
        tasks = self.view.in_states(states)
        return tasks if self.queue_id is None else [t for t in tasks if t.queue_id == self.queue_id]

    def scope_count(self, states: Iterable[State], at_most: Optional[int] = None) -> int:
        """How many tasks in scope are in ``states`` (the ledger counts them, up to
        ``at_most`` when given)."""
        return self.led.count_tasks(set(states), queue_id=self.queue_id, at_most=at_most)

    def promote(self) -> None:
        """:func:`ops.promote` for the PENDING tasks that a change frees: those that
        changed, and those depending on a task that did (a dependency that ended), found
        by query; on the first pass, every PENDING task whose dependencies have ended."""
        view = self.view
        view.refresh()
        seen = self._promote_seen
        if self._promote_all:
            self._promote_all = False
            seen.clear()
            ids = self.led.promotable()
        elif not seen:
            return
        else:
            changed = set(seen)
            seen.clear()
            ids = self.led.promotable(changed)
        ended: dict[str, Task] = {}  # the dependencies looked up that have ended (100,000 share one)

        def lookup(task_id: str) -> Optional[Task]:
            dep = ended.get(task_id) or self.led.get(task_id)
            if dep is not None and dep.state.terminal:
                ended[task_id] = dep
            return dep

        for k in range(0, len(ids), 500):  # a batch at a time: a dependency may free 100,000
            ops.promote(self.led, self.notify, self.led.listed_by_id(ids[k : k + 500]), lookup=lookup)
            self.led.bound()

    def run_tasks(self) -> list[tuple[str, str, float]]:
        """(id, state, cost) of what this run reports and exits on, in queue order: its
        queue's tasks (``fleetrun FILE``), or (``fleetrun work``) those not terminal at
        its start and those that moved since."""
        return self.led.run_tasks(self.queue_id, self.started_at)

    def show_others(self) -> None:
        """Show the transitions of the tasks in scope that another process made (a
        ``fleetrun cancel`` or ``retry`` from another shell); the loop's own were shown
        as it made them."""
        rows = self.led.transitions_after(self.seen_transition)
        if not rows:
            return
        self.seen_transition = rows[-1].id
        # the process that made it has written it to the logs every process shares
        # already: the plugins that keep one say so (SHARED_TRANSITION_LOG), none is named
        pm = self.config.pluginmanager
        shared = [p for p in pm.get_plugins() if getattr(p, "SHARED_TRANSITION_LOG", False) is True]
        hook = (
            pm.subset_hook_caller("fleetrun_transition", remove_plugins=shared)
            if shared
            else self.hook.fleetrun_transition
        )
        for k in range(0, len(rows), 500):  # a `queue` of 100,000 from another shell: a batch at a time
            theirs = []
            for row in rows[k : k + 500]:
                key = (row.task_id, row.to_state, row.cause)
                if self.own[key] > 0:
                    self.own[key] -= 1
                    if not self.own[key]:
                        del self.own[key]
                    continue
                theirs.append(row)
            # their tasks as listed (the spec read only if a hook uses it), one query a batch
            tasks = {t.id: t for t in self.led.listed_by_id(sorted({r.task_id for r in theirs}))} if theirs else {}
            for row in theirs:
                task = tasks.get(row.task_id)
                if task is None or not self.in_scope(task):
                    continue
                hook(
                    task=task,
                    from_state=row.from_state or "",
                    to_state=row.to_state,
                    cause=row.cause,
                    attempt=row.attempt,
                    config=self.config,
                )

    def _open_socket(self) -> None:
        path = sock_path(self.config.home)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        s.bind(path)
        os.chmod(path, 0o600)
        s.setblocking(False)
        self.sock = s

    def _close_socket(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
            try:
                os.unlink(sock_path(self.config.home))
            except FileNotFoundError:
                pass

    # -- the loop ----------------------------------------------------------------------

    def run(self) -> int:
        self.config.stash[POLICY_KEY] = self.policy.load_strict()
        # a usage limit reported before a restart still holds until its reset time
        self.config.stash.setdefault(USAGE_PAUSE_KEY, {}).update(self.led.usage_pauses())
        self._open_socket()
        old_term = None
        if threading.current_thread() is threading.main_thread():

            def on_term(signum: int, frame: Any) -> None:  # a service manager's stop: as Ctrl-C
                self.session.stopped_by_sigterm = True
                raise KeyboardInterrupt

            old_term = signal.signal(signal.SIGTERM, on_term)
        try:
            self.readopt = True  # the first pass adopts what the ledger says is in flight
            while True:
                try:
                    if self.io_error is not None:
                        # writable again? only a real write says so
                        self.led.set_meta("write_probe", str(time.time()))
                        self.liveness.beat(force=True, strict=True)
                        self.config.err.write("fleetrun: the home is writable again; starting work again\n")
                        self.io_error = None
                    if self.readopt:
                        self.readopt = False
                        self.adoption.adopt()
                    self.liveness.beat(running=len(self.active_attempts()))
                    self.step()
                except (sqlite3.OperationalError, OSError) as e:
                    if not is_space_error(e):
                        raise
                    if self.io_error is None:
                        self.config.err.write(
                            f"fleetrun: cannot write to {self.config.home} ({e}); starting nothing new "
                            "until it clears. Running attempts go on; nothing is lost.\n"
                        )
                    self.io_error = str(e)
                    self.verify.cancel_all()  # their verdicts are rerun once we can record them
                    self.setup.cancel_all()  # run again from the start once adoption abandons them
                    self.readopt = True
                    time.sleep(1.0)
                    continue
                if self.waits.finished():
                    break
                self.waits.sleep()
        except KeyboardInterrupt:
            stopped = self.verify.cancel_all()
            setups = self.setup.cancel_all()
            self.session.final_notes.append(
                self.interrupted_note(
                    len(self.active_attempts()) - setups - self.starting.drop_preparing(), stopped, setups
                )
            )
            self.session.interrupted = True
        finally:
            if old_term is not None:
                signal.signal(signal.SIGTERM, old_term)
            self._close_socket()
            self.liveness.clear()
            self.config.stash.pop(TASKVIEW_KEY, None)
        return self.exit_code()

    def step(self) -> None:
        began = time.monotonic()
        with self.led.batch():  # the pass's writes: one commit, and the durable points
            self._step()
        self.hook.fleetrun_loop_pass(config=self.config, duration_s=time.monotonic() - began)

    def _step(self) -> None:
        self.show_others()
        msg = self.policy.refresh()
        if msg:
            self.config.err.write(msg + "\n")
        self.config.stash[POLICY_KEY] = self.policy.policy
        if self.queue_id is None:  # `work`: what was queued meanwhile brings its agents
            load_new_queues(self.config)
        self.promote()
        effects.deliver(self.config)  # the worker's effects that are over (their notes)
        with self.cleanups_together():  # the tasks ended in the stages: one commit before their cleanups
            for stage in (
                self.poll_pending,  # workspaces made, work collected, verdicts, setup commands' ends
                self.ending.poll,  # the attempts that run, one poll per host
                self.adoption.reverify,
            ):  # `fleetrun retry` of a task a verifier could not judge
                stage()
                self.led.bound()  # a slow stage (a peer's poll) does not keep other writers waiting
        self.promote()
        self.placed_last_pass = False
        if not self.stopping and self.io_error is None:
            self.starting.place_all()

    def poll_pending(self) -> None:
        """Every entry of the pending table, oldest first, in one sweep: each is polled by
        its stage (poll the handle, re-read the task's row, go on or drop it), one task's
        failure contained. An entry an earlier one removed is passed over."""
        stages: dict[type, Callable[[str, Any], None]] = {
            Preparing: self.starting.poll_one,
            Launching: self.starting.poll_launch_one,
            SettingUp: self.setup.poll_one,
            Collecting: self.ending.poll_one,
            Verifying: self.verify.poll_one,
        }
        with self.starting.together():  # the starts of the workspaces made here: one commit for them all
            for task_id, entry in self.pending.items():
                view = self.pending.view(type(entry))
                if view.get(task_id) is not entry:
                    continue
                with self.isolated(task_id):
                    stages[type(entry)](task_id, entry)

    def active_attempts(self) -> list[Attempt]:
        return self.led.attempts(states={"leased", "starting", "running"})

    def exit_code(self) -> int:
        tasks = self.run_tasks()  # rows, not tasks: a run of 100,000 builds no object of each
        older = self.scope_count(set(State)) - len(tasks)
        self.session.older_tasks = older  # the summary says they are not counted
        counts: Counter[str] = Counter(state for _, state, _ in tasks)
        self.session.counts = {s.value: counts[s.value] for s in STATE_ORDER if counts.get(s.value)}
        self.session.task_ids = [tid for tid, _, _ in tasks]  # the summary lists what of them needs a human
        self.session.cost_usd = sum(cost for _, _, cost in tasks)
        self.session.cost_unknown = not self.led.unknown_cost().isdisjoint(self.session.task_ids)
        if self.session.interrupted:
            if self.session.stopped_by_sigterm and self.queue_id is None and not self.until_idle:
                # `fleetrun work` serves until stopped: a stop is its normal end, and a
                # service manager counts anything but 0 (or death by the signal) as a failure
                return ExitCode.OK
            return ExitCode.INTERRUPTED
        if all(state == State.DONE.value for _, state, _ in tasks):  # none at all: nothing failed either
            return ExitCode.OK
        return ExitCode.TASKS_FAILED

    def finish_terminal(self, task: Task) -> None:
        """:class:`~fleetrun.decide.CleanUp`: cascade a NEEDS_HUMAN or CANCELLED task to its
        dependents, and clean its workspace up (inside :meth:`cleanups_together`, with
        the other tasks ended there, after one commit)."""
        crash.point("before_cleanup")  # terminal, not cleaned up: adoption cleans a DONE one up
        if task.state in (State.NEEDS_HUMAN, State.CANCELLED):
            ops.cascade(self.led, task, self.notify)
        if self._to_clean is not None:
            self._to_clean.append(task)
            return
        self.led.durable()  # its end before its worktree goes: a restart must not verify a removed one
        self._clean_up(task)

    @contextmanager
    def cleanups_together(self) -> Iterator[None]:
        """The tasks that end inside this block (a pass's stages: twenty peers' verdicts
        read in one pass) have their workspaces cleaned up as it ends, after one commit
        of their ends, not one each (issue 24). Left by an exception, nothing is cleaned
        up: the tasks are terminal with their workspaces, as a crash there leaves them,
        and adoption cleans a DONE one up."""
        if self._to_clean is not None:  # nested: part of the open one
            yield
            return
        self._to_clean = []
        try:
            yield
            ended, self._to_clean = self._to_clean, None
            if ended:
                self.led.durable()  # their ends before their worktrees go
                for task in ended:
                    with self.isolated(task.id):
                        self._clean_up(task)
        finally:
            self._to_clean = None

    def _clean_up(self, task: Task) -> None:
        try:
            self.hook.fleetrun_cleanup_workspace(task=task, host=get_host(self.config, task.host), config=self.config)
        except (GitError, OSError) as e:
            self.led.add_note(task.id, f"cleanup failed: {e}")

    # -- the stages, for the session, setup, hooks and tests ------------------------------

    @staticmethod
    def interrupted_note(running: int, verifiers: int, setups: int = 0) -> str:
        """:func:`fleetrun.waiting.interrupted_note`."""
        return interrupted_note(running, verifiers, setups)

    def launch(self, task: Task, att: Attempt, ws: Workspace, kind: str, prev: Optional[Attempt]) -> bool:
        """Start the agent in a prepared (and set up) workspace (the setup stage calls it)."""
        return self.starting.launch(task, att, ws, kind, prev)

    def verdict_failed(self, task: Task, v: Verifying, label: str, output: str = "") -> None:
        """A verifier failed (just now, or before a crash): retry, or ask a human."""
        self.verify.verdict_failed(task, v, label, output)

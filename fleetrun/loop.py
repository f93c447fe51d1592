"""The work loop: observe (ledger, shepherds, verifiers) -> decide -> call hooks.

Event-driven: it sleeps in ``select`` on a datagram socket the shepherds send to
when an agent ends, and on the verifiers' process handles; a task is verified as
soon as its agent exits, and a dependent starts as soon as its dependency is DONE.
A one-second timeout is the safety net (and the liveness heartbeat).
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sqlite3
import threading
import time
import traceback
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional

from . import clock, crash, ops
from .exceptions import ExitCode, StateConflict, UsageError, is_space_error
from .gitutil import GitError, WorktreeTampered
from .hosts import executable_problem, get_host, kill_recorded_children
from .ledger import Attempt, Ledger, Task
from .liveness import Liveness, sock_path
from .placement import Backoff, backoff_delay
from .policy import PolicyWatcher
from .reports import MIN_BUDGET_USD, Handoff, Placement, Verdict, Wait, Workspace
from .setupstage import SetupStage
from .states import ACTIVE, PLACEABLE, State
from .textutil import safe_name, safe_text

RESUME_CAP = 3
USAGE_BACKOFF_S = 60.0  # 1, 2, 4 ... minutes after a usage limit that gave no reset time
USAGE_BACKOFF_MAX_S = 30 * 60.0
NEVER_STARTED_CAP = 10
REMIND_S = 5 * 60.0  # a task that waits this long is mentioned again, and again after as long
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


@dataclass
class Verifying:
    attempt: Attempt
    workspace: Workspace
    idx: int
    handle: Any = None


class Loop:
    def __init__(self, config: Any, ledger: Ledger, session: Any, queue_id: Optional[str], until_idle: bool) -> None:
        self.config = config
        self.led = ledger
        self.session = session
        self.queue_id = queue_id
        self.until_idle = until_idle
        self.hook = config.hook
        self.host = get_host(config, "local")
        self.policy = PolicyWatcher(config.home / "policy.toml")
        self.verifying: dict[str, Verifying] = {}
        self.setup = SetupStage(self)  # tasks whose setup commands run before their agent
        self.waits: dict[str, str] = {}
        self.wait_until: dict[str, float] = {}
        self.wait_operator: dict[str, str] = {}  # task -> what only a person can change for it
        self.wait_since: dict[str, float] = {}  # when a task began to wait (fake-clock time)
        self.remind_after: dict[str, float] = {}  # its next reminder, in seconds of waiting
        # what this run reports and exits on when it has no queue of its own
        # (`work`): the tasks not yet terminal at its start, and those it sees move
        self.run_ids: Optional[set[str]] = (
            {t.id for t in ledger.tasks() if not t.state.terminal} if queue_id is None else None)
        # transitions logged so far; those after it that the loop did not make itself
        # (`own`) were made from another shell and are shown too
        self.seen_transition = ledger.last_transition_id()
        self.own: Counter[tuple[str, str, str]] = Counter()
        self.stopping: Optional[str] = None
        self.exitfirst = bool(config.getoption("exitfirst"))
        self.liveness = Liveness(config.home)
        self.sock: Optional[socket.socket] = None
        self.placed_last_pass = False
        self.io_error: Optional[str] = None
        self.readopt = False
        self.waits_dirty = False
        self.config.stash.setdefault("backoff", {})

    # -- plumbing ----------------------------------------------------------------------

    def notify(self, task: Task, src: State, dst: State, cause: str, attempt: Optional[int]) -> None:
        self.own[(task.id, dst.value, cause)] += 1
        if self.run_ids is not None:
            self.run_ids.add(task.id)
        self.hook.fleetrun_transition(task=task, from_state=src.value, to_state=dst.value, cause=cause,
                                      attempt=attempt, config=self.config)
        if self.exitfirst and dst is State.NEEDS_HUMAN and self.in_scope(task):
            self.stopping = self.stopping or f"stopping after the first NEEDS_HUMAN ({task.name}) (-x)"

    def move(self, task: Task, to: State, cause: str, attempt: Optional[int] = None, **fields: Any) -> Optional[Task]:
        return ops.move(self.led, task, to, cause, self.notify, attempt=attempt, **fields)

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
            self._contain(task_id, detail)
        except Exception as again:  # the ledger itself fails: not one task's problem
            raise exc from again
        where = f"the traceback is in {log}" if log else "the traceback follows:\n" + text
        self.config.err.write(f"fleetrun: internal error while handling a task ({detail}); it needs a human; "
                              f"{where}\n")

    def _contain(self, task_id: str, detail: str) -> None:
        v = self.verifying.pop(task_id, None)
        if v is not None and v.handle is not None and hasattr(v.handle, "cancel"):
            v.handle.cancel()
        for att in self.led.attempts(task_id):
            if att.state not in ("leased", "starting", "running"):
                continue
            # the task will not be looked after any more: nothing of it may run on
            if att.state != "leased":
                try:
                    get_host(self.config, att.host).stop(att.id, att.shepherd_pid, att.shepherd_token)
                except Exception as e:
                    self.led.add_note(task_id, f"could not stop attempt {att.number}: {type(e).__name__}: {e}")
            self.led.update_attempt(att.id, state="ended" if att.state == "running" else "abandoned",
                                    outcome="internal_error", ended=time.time())
        task = self.led.get(task_id)
        if task is None:
            return
        if task.state.terminal:
            self.led.add_note(task_id, f"internal error after it was {task.state}: {detail}")
            return
        now = self.move(task, State.NEEDS_HUMAN, f"internal_error:{detail}", attempt=task.attempts or None)
        if now is not None:
            try:
                self.finish_terminal(now)
            except Exception as e:  # a cleanup hook that fails too: the task is already set aside
                self.led.add_note(task_id, f"cleanup failed: {type(e).__name__}: {e}")

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

    def scope_tasks(self) -> list[Task]:
        return self.led.tasks(queue_id=self.queue_id)

    def run_tasks(self) -> list[Task]:
        """What this run reports and exits on: its queue's tasks (``fleetrun FILE``), or
        (``fleetrun work``) those not terminal at its start and those that moved since."""
        tasks = self.scope_tasks()
        if self.run_ids is None:
            return tasks
        return [t for t in tasks if t.id in self.run_ids or not t.state.terminal]

    def show_others(self) -> None:
        """Show the transitions of the tasks in scope that another process made (a
        ``fleetrun cancel`` or ``retry`` from another shell); the loop's own were shown
        as it made them."""
        rows = self.led.transitions_after(self.seen_transition)
        if not rows:
            return
        self.seen_transition = rows[-1].id
        # the process that made it has written it to the shared event log already
        events = self.config.pluginmanager.get_plugin("events")
        hook = (self.config.pluginmanager.subset_hook_caller("fleetrun_transition", remove_plugins=[events])
                if events is not None else self.hook.fleetrun_transition)
        for row in rows:
            key = (row.task_id, row.to_state, row.cause)
            if self.own[key] > 0:
                self.own[key] -= 1
                if not self.own[key]:
                    del self.own[key]
                continue
            task = self.led.get(row.task_id)
            if task is None or not self.in_scope(task):
                continue
            if self.run_ids is not None:
                self.run_ids.add(task.id)
            hook(task=task, from_state=row.from_state or "", to_state=row.to_state, cause=row.cause,
                 attempt=row.attempt, config=self.config)

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
        self.config.stash["policy"] = self.policy.load_strict()
        # a usage limit reported before a restart still holds until its reset time
        self.config.stash.setdefault("usage_pause", {}).update(self.led.usage_pauses())
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
                        self.adopt()
                    self.liveness.beat(running=len(self.active_attempts()))
                    self.step()
                except (sqlite3.OperationalError, OSError) as e:
                    if not is_space_error(e):
                        raise
                    if self.io_error is None:
                        self.config.err.write(
                            f"fleetrun: cannot write to {self.config.home} ({e}); starting nothing new "
                            "until it clears. Running attempts go on; nothing is lost.\n")
                    self.io_error = str(e)
                    for v in self.verifying.values():  # their verdicts are rerun once we can record them
                        if v.handle is not None and hasattr(v.handle, "cancel"):
                            v.handle.cancel()
                    self.verifying.clear()
                    self.setup.cancel_all()  # run again from the start once adoption abandons them
                    self.readopt = True
                    time.sleep(1.0)
                    continue
                if self.finished():
                    break
                self.wait()
        except KeyboardInterrupt:
            stopped = 0
            for v in self.verifying.values():
                if v.handle is not None and hasattr(v.handle, "cancel"):
                    v.handle.cancel()
                    stopped += 1
            setups = self.setup.cancel_all()
            self.session.final_notes.append(
                self.interrupted_note(len(self.active_attempts()) - setups, stopped, setups))
            self.session.interrupted = True
        finally:
            if old_term is not None:
                signal.signal(signal.SIGTERM, old_term)
            self._close_socket()
            self.liveness.clear()
        return self.exit_code()

    @staticmethod
    def interrupted_note(running: int, verifiers: int, setups: int = 0) -> str:
        """What Ctrl-C interrupted and what becomes of it: an agent runs on under its
        shepherd and is adopted; a verifier is ended with the loop and, its verdict not
        recorded, runs again from the start (docs/durability.md)."""
        parts = []
        if running:
            parts.append(f"{running} running attempt{' goes' if running == 1 else 's go'} on and will be "
                         "adopted by the next `fleetrun work`")
        if verifiers:
            parts.append(f"{verifiers} verifier{' was' if verifiers == 1 else 's were'} stopped and will "
                         f"run again {'then' if running else 'on the next `fleetrun work`'}")
        if setups:
            parts.append(f"{setups} setup{' was' if setups == 1 else 's were'} stopped and will run again "
                         "from the start")
        return "interrupted: " + ("; ".join(parts) if parts else "nothing was running")

    def step(self) -> None:
        self.show_others()
        msg = self.policy.refresh()
        if msg:
            self.config.err.write(msg + "\n")
        self.config.stash["policy"] = self.policy.policy
        ops.promote(self.led, self.notify)
        self.poll_attempts()
        self.poll_verifiers()
        self.setup.poll()
        ops.promote(self.led, self.notify)
        self.placed_last_pass = False
        if not self.stopping and self.io_error is None:
            self.place_all()

    def wait(self) -> None:
        timeout = 1.0
        now = clock.now()
        fds: list[Any] = [self.sock]
        for v in self.verifying.values():
            h = v.handle
            if h is not None and hasattr(h, "fileno") and h.fileno() >= 0:
                fds.append(h)
            if h is not None and hasattr(h, "next_deadline"):
                timeout = min(timeout, max(0.0, h.next_deadline() - time.monotonic()))
        for h in self.setup.handles():
            if hasattr(h, "fileno") and h.fileno() >= 0:
                fds.append(h)
            if hasattr(h, "next_deadline"):
                timeout = min(timeout, max(0.0, h.next_deadline() - time.monotonic()))
        for until in self.wait_until.values():
            timeout = min(timeout, max(0.0, until - now))
        ready, _, _ = select.select(fds, [], [], max(timeout, 0.005))
        if self.sock in ready:
            try:
                while self.sock.recv(1024):  # type: ignore[union-attr]
                    pass
            except (BlockingIOError, OSError):
                pass

    def active_attempts(self) -> list[Attempt]:
        return self.led.attempts(states={"leased", "starting", "running"})

    def finished(self) -> bool:
        if self.io_error is not None:
            return False  # wait for the disk, then finish the work
        tasks = self.scope_tasks()
        active = [t for t in tasks if t.state in ACTIVE]
        if active:
            return False
        if self.stopping:
            return True
        live = [t for t in tasks if not t.state.terminal]
        if not live:
            return not (self.queue_id is None and not self.until_idle)
        if self.queue_id is None and not self.until_idle:
            return False
        if self.placed_last_pass:
            return False
        # a task that waits for what can change by itself (memory, load, disk, slots, a
        # stale peer, a backoff, a pause) or by a live policy edit keeps the run going
        if any(t.state in PLACEABLE and t.id not in self.wait_operator for t in live):
            return False
        # only waits a person must clear (or dependents of those): end, and say why
        for t in live:
            if t.id in self.wait_operator:
                self.session.final_notes.append(f"cannot place: {t.name}: {self.wait_operator[t.id]}")
            else:
                self.session.final_notes.append(f"still waiting: {t.name} [{t.state}] {t.reason}")
        return True

    def exit_code(self) -> int:
        tasks = self.run_tasks()
        older = len(self.scope_tasks()) - len(tasks)
        self.session.older_tasks = older  # the summary says they are not counted
        counts: dict[str, int] = {}
        for t in tasks:
            counts[t.state.value] = counts.get(t.state.value, 0) + 1
        order = ["DONE", "NEEDS_HUMAN", "CANCELLED", "RUNNING", "VERIFYING", "READY", "PENDING",
                 "RETRYING", "RESUMING", "ASSIGNED"]
        self.session.counts = {s: counts[s] for s in order if counts.get(s)}
        self.session.cost_usd = sum(t.cost_usd for t in tasks)
        self.session.cost_unknown = bool(self.led.unknown_cost() & {t.id for t in tasks})
        if getattr(self.session, "interrupted", False):
            if getattr(self.session, "stopped_by_sigterm", False) and self.queue_id is None and not self.until_idle:
                # `fleetrun work` serves until stopped: a stop is its normal end, and a
                # service manager counts anything but 0 (or death by the signal) as a failure
                return ExitCode.OK
            return ExitCode.INTERRUPTED
        if all(t.state is State.DONE for t in tasks):  # none at all: nothing failed either
            return ExitCode.OK
        return ExitCode.TASKS_FAILED

    # -- adoption ----------------------------------------------------------------------

    def adopt(self) -> None:
        """Pick up what the ledger says is in flight (after a restart or a crash)."""
        adopted = 0
        for att in self.active_attempts():
            with self.isolated(att.task_id):
                task = self.led.get(att.task_id)
                if task is None:
                    continue
                host = get_host(self.config, att.host)
                if att.state == "leased" or (att.state == "starting" and not att.shepherd_pid):
                    st = self.starting_status(att) if att.state == "starting" else {}
                    if st.get("state") == "unreachable":  # it may be running there: poll_attempts asks again
                        adopted += 1
                        continue
                    if not st.get("shepherd_pid") and hasattr(host, "give_up"):
                        # decide under the shepherd's start lock: a late shepherd then runs nothing
                        st = host.give_up(att.id) or st
                    if att.state == "leased" and att.host in (None, "local"):
                        kill_recorded_children(host.attempt_dir(att.id))  # a setup command the crash left
                    if st.get("shepherd_pid"):  # it did start: watch it (a dead one is resumed)
                        self.led.update_attempt(att.id, state="running", shepherd_pid=st["shepherd_pid"],
                                                shepherd_token=st.get("shepherd_token"), started=st.get("started"))
                        if task.state is State.ASSIGNED:
                            self.move(task, State.RUNNING, "adopted", attempt=att.number)
                        if st.get("state") in ("starting", "running"):
                            adopted += 1
                        continue
                    self.led.update_attempt(att.id, state="abandoned", outcome="never_started", ended=time.time())
                    back = {"fresh": State.READY, "retry": State.RETRYING, "resume": State.RESUMING}[att.kind]
                    if task.state is State.ASSIGNED:
                        self.move(task, back, "lease_expired:never started", attempt=att.number)
                    continue
                if task.state is State.ASSIGNED:
                    self.move(task, State.RUNNING, "adopted", attempt=att.number)
                st = host.status(att.id, att.shepherd_pid, att.shepherd_token)
                if st.get("state") in ("starting", "running", "unreachable"):
                    adopted += 1  # a dead or finished one is handled by poll_attempts, not announced
        for task in self.led.tasks({State.RUNNING}):
            with self.isolated(task.id):
                # the attempt's end was recorded, the transition after it was not (a crash
                # between the two): decide again from the status file, without recording twice
                last = self.led.latest_attempt(task.id)
                if last is not None and last.state == "ended":
                    host = get_host(self.config, last.host)
                    self.finish_attempt(last, host.status(last.id, last.shepherd_pid, last.shepherd_token),
                                        record=False)
        for task in self.led.tasks({State.VERIFYING}):
            with self.isolated(task.id):
                if not self.in_scope(task) and self.queue_id is not None:
                    continue
                if task.id in self.verifying:
                    continue
                last = self.led.latest_attempt(task.id)
                if last is None or last.workspace is None:
                    continue
                if last.host in (None, "local"):
                    # a verifier the crashed supervisor left running is ended before it runs again
                    kill_recorded_children(get_host(self.config, last.host).attempt_dir(last.id))
                verdicts = self.led.verdicts(attempt_id=last.id)
                v = Verifying(last, Workspace(**last.workspace), len(verdicts))
                failed = next((x for x in verdicts if not x.passed), None)
                if failed is not None:  # its failure was recorded, the transition after it was not
                    self.verdict_failed(task, v, failed.label)
                    continue
                self.verifying[task.id] = v
                self.start_verifier(task.id)
        for task in self.led.tasks({State.DONE}):
            with self.isolated(task.id):
                # DONE, but the crash came before its workspace was cleaned up
                if task.worktree and task.host in (None, "local") and os.path.exists(os.path.join(task.worktree, ".git")):
                    self.finish_terminal(task)
        if adopted:
            self.config.out.write(f"adopted {adopted} running attempt(s)\n")

    def starting_status(self, att: Attempt) -> dict[str, Any]:
        """The status of an attempt whose shepherd may have been started just before a
        crash: give a freshly spawned shepherd a moment to write its first status."""
        host = get_host(self.config, att.host)
        deadline = time.time() + 2.0
        while True:
            st = host.status(att.id, None, None)
            if st.get("shepherd_pid") or time.time() >= deadline:
                return st
            if att.host != "local" or not (host.attempt_dir(att.id) / "spec.json").exists():
                return st
            time.sleep(0.05)

    # -- attempts ----------------------------------------------------------------------

    def poll_attempts(self) -> None:
        for att in self.led.attempts(states={"starting", "running"}):
            with self.isolated(att.task_id):
                host = get_host(self.config, att.host)
                st = host.status(att.id, att.shepherd_pid, att.shepherd_token)
                if st.get("state") in ("ended", "died"):
                    self.finish_attempt(att, st)

    def finish_attempt(self, att: Attempt, st: dict[str, Any], record: bool = True) -> None:
        """An attempt ended: record it (``record``; False when adopt() finds it recorded
        but not acted on), then move its task on."""
        task = self.led.get(att.task_id)
        assert task is not None
        host = get_host(self.config, att.host)
        exit_code = st.get("exit_code")
        reason = st.get("reason") if st.get("state") == "ended" else "died"
        res = self.hook.fleetrun_agent_result(task=task, attempt=att, log_path=str(host.log_path(att.id)),
                                              exit_code=exit_code, config=self.config)
        cost = res.cost_usd if res is not None else None  # None: unknown, not zero
        outcome = "ok" if (res is not None and res.ok and reason == "exited") else (
            reason if reason != "exited" else (res.reason if res is not None else "unknown"))
        if record:
            with self.led.tx() as cur:
                self.led.update_attempt(att.id, cur=cur, state="ended", ended=st.get("ended") or time.time(),
                                        exit_code=exit_code, outcome=outcome,
                                        session_id=(res.session_id if res else None) or att.session_id,
                                        cost_usd=cost, result_text=res.result_text if res else None,
                                        info={**att.info, "denials": res.permission_denials if res else [],
                                              "error": st.get("error"), "signal": st.get("signal")})
                cur.execute("UPDATE tasks SET cost_usd = cost_usd + ? WHERE id=?", (cost or 0.0, task.id))
        task = self.get(task.id)
        att = self.get_attempt(att.id)
        if task.state is not State.RUNNING:
            return  # cancelled meanwhile: the attempt is over, nothing else to do
        if reason == "start_failed:agent_not_found":
            self.give_up_at_once(task, att, f"agent_not_found:{st.get('error') or 'the agent cannot be run'}")
            return
        if (reason or "").startswith("start_failed"):
            self.not_started(task, att, f"start_failed:{st.get('error') or 'the agent did not start'}",
                             from_running=True)
            return
        if reason == "exited" and res is not None and (res.reason or "").startswith("rejected_arguments:"):
            # the agent refused its command line: the next attempt would get the same one
            self.give_up_at_once(task, att, f"agent_rejected_arguments:{res.reason.split(':', 1)[1]}")
            return
        # it ran: that machine is good for this task again, and the never-started count restarts
        limited = self.config.stash["backoff"].get(task.id, {}).get(att.host)
        self.clear_backoff(task, att.host)
        if task.no_start:
            self.led.update_task(task.id, no_start=0)
            task = self.get(task.id)
        if res is not None and res.usage_limit:
            self.pause_host(att.host, res.usage_reset_at)
            self.move(task, State.RESUMING, f"usage_limit:{self.pause_text(att.host)}", attempt=att.number)
            return
        if res is not None and res.reason == "rate_limited":
            # a 429 that gave no reset time: back off (1, 2, 4 ... 30 min), not a pause of the
            # machine until a made-up time; no resume is used, as for a usage limit
            n = (limited.count + 1) if limited is not None and limited.cause == "rate_limited" else 1
            until = time.time() + min(USAGE_BACKOFF_MAX_S, USAGE_BACKOFF_S * 2 ** (n - 1))
            self.config.stash["backoff"].setdefault(task.id, {})[att.host] = Backoff(n, until, "rate_limited")
            self.wait_until[task.id] = until
            why = " ".join(res.result_text.split())[:200] or "HTTP 429"
            self.move(task, State.RESUMING, f"rate_limited:{why}", attempt=att.number)
            return
        if res is not None and res.reason == "budget":
            now = self.move(task, State.NEEDS_HUMAN, "budget_exhausted:the agent reached its --max-budget-usd",
                            attempt=att.number)
            if now is not None:
                self.finish_terminal(now)
            return
        if outcome != "ok":
            word = {"timeout": "timeout", "stalled": "stalled", "cancelled": "session_died",
                    "stopped": "session_died", "died": "session_died"}.get(reason or "", "session_died")
            detail = None if word in ("timeout", "stalled") else (outcome if outcome != reason else reason)
            cause = f"{word}:{detail}" if detail else word
            if res is not None and res.reason.startswith("api_error:") and reason == "exited":
                cause = res.reason  # a 500 or 529: the API's fault, transient; resumed
            self.resume_or_give_up(task, att, cause)
            return
        ws = Workspace(**att.workspace) if att.workspace else Workspace(path=task.spec.cwd)
        try:  # before VERIFYING: after a crash between the two it is simply done again
            self.hook.fleetrun_collect_work(task=task, attempt=att, workspace=ws, config=self.config)
        except WorktreeTampered as e:
            self.worktree_tampered(task, att, e, "nothing was committed")
            return
        except GitError as e:
            self.led.add_note(task.id, f"could not commit the attempt's work: {e}")
        moved = self.move(task, State.VERIFYING, "exited", attempt=att.number)
        if moved is None:
            return
        self.verifying[task.id] = Verifying(att, ws, 0)
        self.start_verifier(task.id)

    def worktree_tampered(self, task: Task, att: Attempt, e: WorktreeTampered, what: str) -> None:
        """The agent rewrote, replaced or removed its worktree's ``.git``: nothing is
        committed or run there, and a human looks (a retry would only repeat it)."""
        self.led.update_attempt(att.id, outcome="worktree_tampered")
        # the reason quotes what the agent wrote into .git: one line, no control characters
        reason = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in " ".join(str(e).split()))
        reason = (reason[:300] + "...") if len(reason) > 300 else reason
        now = self.move(task, State.NEEDS_HUMAN, f"worktree_tampered:{reason or 'its .git was changed'}; {what}",
                        attempt=att.number)
        if now is not None:
            if now.worktree:  # git refuses to remove it now, even with --force: say how
                self.led.add_note(task.id, f"kept worktree {now.worktree} as the agent left it; to start over, "
                                           "remove that folder and run `git worktree prune` in the repository")
            self.finish_terminal(now)

    def resume_or_give_up(self, task: Task, att: Attempt, cause: str) -> None:
        if task.resumes >= RESUME_CAP:
            now = self.move(task, State.NEEDS_HUMAN, f"resume_cap:{cause}", attempt=att.number)
            if now is not None:
                self.finish_terminal(now)
            return
        self.move(task, State.RESUMING, cause, attempt=att.number, resumes=task.resumes + 1)

    def give_up_at_once(self, task: Task, att: Attempt, cause: str) -> None:
        """A start that can never succeed as things are (the agent is not installed, it
        rejects its arguments, git refuses the workspace): NEEDS_HUMAN now, no backoff."""
        now = self.move(task, State.NEEDS_HUMAN, cause, attempt=att.number)
        if now is not None:
            self.finish_terminal(now)

    def not_started(self, task: Task, att: Attempt, cause: str, from_running: bool = False) -> None:
        """An attempt that never started: back off from that machine; a retry is not used."""
        count = task.no_start + 1
        bo = self.config.stash["backoff"].setdefault(task.id, {})
        prev = bo.get(att.host)
        n = (prev.count if prev else 0) + 1
        bo[att.host] = Backoff(n, time.time() + backoff_delay(n), cause.split(":", 1)[0])
        self.wait_until[task.id] = bo[att.host].until  # not idle: it is placed again after the backoff
        if count >= NEVER_STARTED_CAP:
            now = self.move(task, State.NEEDS_HUMAN,
                            f"never_started:{count} attempts in a row didn't start; the last was {cause} on {att.host}",
                            attempt=att.number, no_start=count)
            if now is not None:
                self.finish_terminal(now)
            return
        back = {"fresh": State.READY, "retry": State.RETRYING, "resume": State.RESUMING}[att.kind]
        if from_running:
            back = State.RESUMING if back is State.READY else back
            if back is State.RETRYING:
                back = State.RESUMING
        self.move(task, back, cause, attempt=att.number, no_start=count)

    def pause_host(self, host: str, until: Optional[float]) -> None:
        """A usage or rate limit: start nothing on ``host`` until the reset time it gave,
        or back off 1, 2, 4 ... 30 minutes when it gave none. Kept in the ledger, so a
        restarted loop waits for the same reset."""
        pauses = self.config.stash.setdefault("usage_pause", {})
        now = clock.now()
        prev = pauses.get(host)
        count = (prev[1] + 1) if prev and prev[0] > now - 3600 else 1
        if until is None or until <= now:
            until = now + min(USAGE_BACKOFF_MAX_S, USAGE_BACKOFF_S * 2 ** (count - 1))
        pauses[host] = (until, count)
        # one that ended over an hour ago no longer counts toward the next backoff
        self.led.set_usage_pauses({h: p for h, p in pauses.items() if p[0] > now - 3600})

    def pause_text(self, host: str) -> str:
        until = self.config.stash.get("usage_pause", {}).get(host, (0, 0))[0]
        return f"usage limit, resumes at {time.strftime('%H:%M', time.localtime(until))}"

    def clear_backoff(self, task: Task, host: str) -> None:
        self.config.stash["backoff"].get(task.id, {}).pop(host, None)

    # -- verifiers ---------------------------------------------------------------------

    def start_verifier(self, task_id: str) -> None:
        v = self.verifying[task_id]
        found = self.led.get(task_id)
        if found is None or found.state is not State.VERIFYING:
            self.verifying.pop(task_id, None)
            return
        task = found
        while v.idx < len(task.spec.verify):
            spec = task.spec.verify[v.idx]
            try:
                res = self.hook.fleetrun_verify(task=task, verifier=spec, workspace=v.workspace,
                                                attempt=v.attempt, config=self.config)
            except Exception as e:  # a verifier that cannot reach a verdict fails
                res = Verdict(False, spec.kind, spec.label, reason=f"verifier error: {type(e).__name__}: {e}")
            if res is None:
                res = Verdict(False, spec.kind, spec.label, reason=f"no plugin runs {spec.kind!r} verifiers")
            if isinstance(res, Verdict):
                if not self.record_verdict(task, v, res):
                    return
                task = self.get(task_id)
                continue
            v.handle = res
            crash.point("mid_verifier")
            return
        self.all_passed(task, v)

    def poll_verifiers(self) -> None:
        for task_id, v in list(self.verifying.items()):
            with self.isolated(task_id):
                if v.handle is None:
                    continue
                current = self.led.get(task_id)
                if current is None or current.state is not State.VERIFYING:  # cancelled meanwhile
                    if hasattr(v.handle, "cancel"):
                        v.handle.cancel()
                    self.verifying.pop(task_id, None)
                    continue
                verdict = v.handle.poll()
                if verdict is None:
                    continue
                v.handle = None
                task = self.led.get(task_id)
                if task is None or task.state is not State.VERIFYING:
                    self.verifying.pop(task_id, None)
                    continue
                if self.record_verdict(task, v, verdict):
                    self.start_verifier(task_id)

    def record_verdict(self, task: Task, v: Verifying, verdict: Verdict) -> bool:
        """Record one verdict. :return: True to go on with the next verifier."""
        self.led.add_verdict(task.id, v.attempt.id, v.idx, verdict)
        crash.point("after_verdict")
        self.hook.fleetrun_verdict(task=task, verdict=verdict, attempt=v.attempt, config=self.config)
        task = self.get(task.id)
        if verdict.passed:
            v.idx += 1
            return True
        self.verdict_failed(task, v, verdict.label)
        return False

    def verdict_failed(self, task: Task, v: Verifying, label: str) -> None:
        """A verifier failed (just now, or before a crash): retry, or ask a human."""
        self.verifying.pop(task.id, None)
        self.led.update_attempt(v.attempt.id, state="verified")
        label = label.replace("\n", " ")
        if task.retries < task.spec.max_retries:
            self.move(task, State.RETRYING, f"verify_fail:{label}", attempt=v.attempt.number,
                      retries=task.retries + 1)
        else:
            now = self.move(task, State.NEEDS_HUMAN, f"retries_exhausted:{label}", attempt=v.attempt.number)
            if now is not None:
                self.finish_terminal(now)

    def all_passed(self, task: Task, v: Verifying) -> None:
        self.verifying.pop(task.id, None)
        self.led.update_attempt(v.attempt.id, state="verified")
        handoff = self.hook.fleetrun_handoff(task=task, attempt=v.attempt, config=self.config)
        fields: dict[str, Any] = {}
        if handoff is not None:
            fields["handoff"] = asdict(handoff)
        now = self.move(task, State.DONE, "verify_pass" if task.spec.verify else "exited",
                        attempt=v.attempt.number, **fields)
        if now is not None:
            self.finish_terminal(now)

    def finish_terminal(self, task: Task) -> None:
        if task.state in (State.NEEDS_HUMAN, State.CANCELLED):
            ops.cascade(self.led, task, self.notify)
        try:
            self.hook.fleetrun_cleanup_workspace(task=task, config=self.config)
        except (GitError, OSError) as e:
            self.led.add_note(task.id, f"cleanup failed: {e}")

    # -- placement ---------------------------------------------------------------------

    def place_all(self) -> None:
        try:
            self._place_all()
        finally:
            if self.waits_dirty:  # what `fleetrun status` shows; written once a pass
                self.led.set_meta("waits", json.dumps(self.waits))
                self.waits_dirty = False

    def _place_all(self) -> None:
        tasks = [t for t in self.led.tasks(set(PLACEABLE)) if self.in_scope(t) or self.queue_id is None]
        at = clock.now()
        self.wait_until = {k: u for k, u in self.wait_until.items() if u > at}
        placeable = {t.id for t in tasks}
        for gone in [k for k in self.wait_since if k not in placeable]:
            self.forget_wait(gone)
        if not tasks:
            return
        candidates = [c for cs in self.hook.fleetrun_candidates(config=self.config) for c in (cs or [])]
        pauses = self.config.stash.get("usage_pause", {})
        for c in candidates:
            until = pauses.get(c.name, (0, 0))[0]
            if until > at and not c.why_not:
                c.why_not = f"is paused: {self.pause_text(c.name)}"
                self.wait_until[f"pause:{c.name}"] = until
        policy = self.policy.policy
        busy = {a.task_id: a for a in self.active_attempts()}
        for task in tasks:
            with self.isolated(task.id):
                if self.stopping:
                    return
                if task.id in busy:  # the previous attempt is still ending (a cancel's grace period)
                    reason = f"attempt {busy[task.id].number} is still ending"
                    if self.waits.get(task.id) != reason:
                        self.waits[task.id] = reason
                        self.hook.fleetrun_task_waiting(task=task, reason=reason, config=self.config)
                    self.wait_operator.pop(task.id, None)
                    self.wait_until[task.id] = at + 1.0
                    continue
                # less than the agent can be given (--max-budget-usd 0.0000 is refused) is none
                if task.spec.budget_usd is not None and task.spec.budget_usd - task.cost_usd < MIN_BUDGET_USD:
                    now = self.move(task, State.NEEDS_HUMAN,
                                    f"budget_exhausted:spent ${task.cost_usd:.2f} of ${task.spec.budget_usd:.2f}")
                    if now is not None:
                        self.finish_terminal(now)
                    continue
                decision = self.hook.fleetrun_place(task=task, candidates=candidates, policy=policy, config=self.config)
                if decision is None:
                    decision = Wait("no plugin places tasks", operator="no plugin places tasks")
                if isinstance(decision, Wait):
                    if self.waits.get(task.id) != decision.reason:
                        self.waits[task.id] = decision.reason
                        self.hook.fleetrun_task_waiting(task=task, reason=decision.reason, config=self.config)
                        self.waits_dirty = True
                    if decision.operator:
                        self.wait_operator[task.id] = decision.operator
                    else:
                        self.wait_operator.pop(task.id, None)
                    if decision.until:
                        self.wait_until[task.id] = decision.until
                    self.remind(task, decision.reason, at)
                    continue
                assert isinstance(decision, Placement)
                if self.waits.pop(task.id, None) is not None:
                    self.waits_dirty = True
                self.forget_wait(task.id)
                self.wait_until.pop(task.id, None)
                if self.start(task, decision.host):
                    self.placed_last_pass = True
                    for c in candidates:
                        if c.name == decision.host:
                            c.running += 1
                            if c.free_mem_mb is not None:
                                c.free_mem_mb -= c.mem_per_task_mb

    def remind(self, task: Task, reason: str, now: float) -> None:
        """Say again, every :data:`REMIND_S` of waiting, that a task still waits and why
        (its reason is shown when it changes; a wait of hours would be silent)."""
        since = self.wait_since.setdefault(task.id, now)
        waited = now - since
        if waited < self.remind_after.get(task.id, REMIND_S):
            return
        self.remind_after[task.id] = (waited // REMIND_S + 1) * REMIND_S
        if self.config.verbosity >= 0:
            self.config.out.write(f"still waiting after {int(waited // 60)} min: {safe_name(task.name)} "
                                  f"[{task.state}] {safe_text(reason)}\n")
            self.config.out.flush()

    def forget_wait(self, task_id: str) -> None:
        self.wait_operator.pop(task_id, None)
        self.wait_since.pop(task_id, None)
        self.remind_after.pop(task_id, None)

    def start(self, task: Task, hostname: str) -> bool:
        kind = {State.READY: "fresh", State.RETRYING: "retry", State.RESUMING: "resume"}[task.state]
        prev = self.led.latest_attempt(task.id)
        crash.point("before_transition:ASSIGNED")
        try:
            att = self.led.lease(task.id, task.state, hostname, kind)
        except StateConflict:
            return False
        crash.point("after_lease")
        prev_state = task.state
        task = self.get(task.id)
        self.notify(task, prev_state, State.ASSIGNED, "placed", att.number)
        crash.point("after_transition:ASSIGNED")
        host = get_host(self.config, hostname)
        try:
            ws = self.hook.fleetrun_prepare_workspace(task=task, attempt=att, config=self.config)
            if ws is None:
                raise UsageError("no plugin prepared a workspace")
        except WorktreeTampered as e:  # the worktree a previous attempt left was tampered with
            self.led.update_attempt(att.id, state="abandoned", ended=time.time())
            self.worktree_tampered(task, att, e, f"attempt {att.number} was not started in it")
            return False
        except Exception as e:
            if getattr(e, "permanent", False):  # a bad ref, a branch checked out elsewhere...
                self.led.update_attempt(att.id, state="abandoned", outcome="workspace_failed", ended=time.time())
                self.give_up_at_once(task, att, f"workspace_failed:{' '.join(str(e).split()) or type(e).__name__}")
                return False
            self.led.update_attempt(att.id, state="abandoned", outcome="start_failed", ended=time.time())
            word = "peer_refused" if type(e).__name__ == "StartRefused" else "start_failed"
            self.not_started(task, att, f"{word}:{type(e).__name__ if not str(e) else e}")
            return False
        crash.point("after_worktree")
        with self.led.tx() as cur:
            self.led.update_attempt(att.id, cur=cur, workspace=asdict(ws), dir=str(host.attempt_dir(att.id)))
            self.led.update_task(task.id, cur=cur, worktree=ws.root or (ws.path if ws.is_worktree else None),
                                 branch=ws.branch)
        task = self.get(task.id)
        att = self.get_attempt(att.id)
        if self.setup.needed(task, att, ws):
            self.setup.begin(task, att, ws, kind, prev)  # launch() follows once it has passed
            return True
        return self.launch(task, att, ws, kind, prev)

    def launch(self, task: Task, att: Attempt, ws: Workspace, kind: str, prev: Optional[Attempt]) -> bool:
        """Build the prompt and start the agent in a prepared (and set up) workspace."""
        host = get_host(self.config, att.host)
        context = self.prompt_context(task, kind, prev)
        left = None
        if task.spec.budget_usd is not None:
            left = max(0.0, task.spec.budget_usd - task.cost_usd)
            att.info["budget_left_usd"] = left
        if prev is not None and prev.session_id:
            att.info["resume_session"] = prev.session_id
        prompt = self.hook.fleetrun_build_prompt(task=task, attempt=att, config=self.config, context=context)
        try:
            spawn = self.hook.fleetrun_spawn(task=task, attempt=att, workspace=ws, prompt=prompt or task.spec.prompt,
                                             config=self.config)
        except UsageError as e:
            spawn = None
            err = e.message
        else:
            err = f"no plugin spawns agent {task.spec.agent!r}"
        if spawn is None:
            self.led.update_attempt(att.id, state="abandoned", outcome="start_failed", ended=time.time())
            self.not_started(task, att, f"start_failed:{err}")
            return False
        env = {
            "FLEETRUN_TASK_ID": task.id,
            "FLEETRUN_TASK_NAME": task.name,
            "FLEETRUN_ATTEMPT": str(att.number),
            "FLEETRUN_WORKTREE": ws.path,
            **(spawn.get("env") or {}),
        }
        spec = {
            "argv": spawn["argv"],
            "cwd": ws.path,
            "env": env,
            "stdin": spawn.get("stdin"),
            "timeout_s": task.spec.timeout_min * 60.0,
            "stall_s": task.spec.stall_timeout_min * 60.0,
            "notify": sock_path(self.config.home),
        }
        # an agent that is not installed here never starts: ask a human now, not after
        # ten backed-off tries (a peer's shepherd reports the same from its side)
        missing = executable_problem(spawn["argv"][0], env.get("PATH", os.environ.get("PATH"))) \
            if att.host in (None, "local") and spawn["argv"] else None
        if missing:
            self.led.update_attempt(att.id, state="abandoned", outcome="agent_not_found", ended=time.time())
            self.give_up_at_once(task, att, f"agent_not_found:{missing}")
            return False
        self.led.update_attempt(att.id, state="starting", session_id=spawn.get("session_id"),
                                info={**att.info, "argv": spawn["argv"]})
        try:
            info = host.start(att.id, spec, prompt or task.spec.prompt)
        except Exception as e:  # a peer refused, or could not be reached
            self.led.update_attempt(att.id, state="abandoned", outcome="start_failed", ended=time.time())
            word = "peer_refused" if type(e).__name__ == "StartRefused" else "start_failed"
            self.not_started(self.get(task.id), att, f"{word}:{e}")
            return False
        crash.point("after_shepherd_start")
        with self.led.tx() as cur:
            self.led.update_attempt(att.id, cur=cur, state="running", started=time.time(),
                                    shepherd_pid=info["pid"], shepherd_token=info["token"], dir=info["dir"])
        if self.move(task, State.RUNNING, "started", attempt=att.number) is None:
            host.stop(att.id, info["pid"], info["token"])  # cancelled while it was starting
        return True

    def prompt_context(self, task: Task, kind: str, prev: Optional[Attempt]) -> dict[str, Any]:
        handoffs = []
        for dep_id in task.deps:
            dep = self.led.get(dep_id)
            if dep is not None and dep.handoff:
                handoffs.append(Handoff(**dep.handoff))
        failures = []
        if prev is not None and kind in ("retry", "resume"):
            # the failures of the newest attempt that reached a verdict
            for a in reversed([a for a in self.led.attempts(task.id) if a.number <= prev.number]):
                vs = [v for v in self.led.verdicts(attempt_id=a.id) if not v.passed]
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
            rows = [r for r in self.led.transitions(task.id) if r.to_state == State.RESUMING.value]
            row = next((r for r in reversed(rows) if not r.cause.startswith("lease_expired")),
                       rows[-1] if rows else None)
            if row is not None:
                resume_reason = row.cause
                previous = next((a for a in self.led.attempts(task.id) if a.number == row.attempt), prev)
        return {"kind": kind, "handoffs": handoffs, "failures": failures,
                "resume_reason": resume_reason, "previous": previous}

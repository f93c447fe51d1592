"""An attempt's end, applied: the loop polls the attempts that run, records how each
ended, and carries out what :mod:`fleetrun.decide` decides for its task (resume, back
off, pause the machine, ask a human, or collect the work and verify it).

Collecting the work may take a while (the ``worktree`` plugin's ``git status`` and
commit run on a worker of :mod:`fleetrun.effects`): ``fleetrun_collect_work`` then
returns a :class:`~fleetrun.reports.CollectHandle`, polled each pass (:class:`Collecting`)
while the task stays RUNNING with its attempt ``ended``, as a crash between the two
leaves it, and adoption collects again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Optional

from . import crash
from .capped import DEFAULT_MAX_BYTES, cut_note
from .decide import (
    AttemptEnded,
    Collect,
    Collected,
    NotStarted,
    StartUnconfirmed,
    StartVerifier,
    attempt_outcome,
    end_reason,
    tampered,
)
from .gitutil import GitError, WorktreeTampered
from .hostapi import AttemptRef, get_host, poll_statuses
from .ledger import Attempt, Task
from .reports import CollectHandle, Workspace
from .states import State
from .verifying import Verifying

if TYPE_CHECKING:
    from .loop import Loop


@dataclass
class Collecting:
    """An ended attempt whose work is collected off the loop's thread; :class:`Collected`
    is decided once ``handle`` has its answer."""

    attempt: Attempt
    workspace: Workspace
    handle: CollectHandle


#: The attempt's ``info`` key of the status its end was recorded from, and its keys.
END_STATUS = "end_status"
END_STATUS_KEYS = ("state", "reason", "exit_code", "signal", "error", "ended", "log_cut", "log_cap")


class Ending:
    """Ends attempts for the loop. ``loop`` gives the ledger, the hooks, the waits (for
    backoffs and pauses) and the verify stage an attempt that exited goes on to."""

    def __init__(self, loop: Loop) -> None:
        self.loop = loop
        self.collecting = loop.pending.view(Collecting)  # task id -> its attempt's work being collected

    def poll(self) -> None:
        """Every running attempt's status, one poll per host, then every end those polls
        gave, in this pass: all the hosts are asked before any end is handled, so the
        pass commits at most once for them (:meth:`~fleetrun.loop.Loop.before_host_io`),
        not once a peer, and the ends of a hundred peers' attempts are handled together,
        their collect requests sent one after the other without a commit between."""
        loop = self.loop
        by_host: dict[Optional[str], list[Attempt]] = {}
        for att in loop.led.attempts(states={"starting", "running"}):
            by_host.setdefault(att.host, []).append(att)
        polled: list[tuple[list[Attempt], dict[str, dict[str, Any]]]] = []
        for name, atts in by_host.items():  # one poll per host per pass (a peer: one request)
            host = get_host(loop.config, name)
            loop.before_host_io(name)  # a no-op after the first: nothing is written between
            try:
                polled.append(
                    (atts, poll_statuses(host, [AttemptRef(a.id, a.shepherd_pid, a.shepherd_token) for a in atts]))
                )
            except Exception as e:  # a host's bug: each of its tasks is contained, as one task's would be
                for att in atts:
                    with loop.isolated(att.task_id):
                        raise e
        for atts, statuses in polled:
            for att in atts:
                with loop.isolated(att.task_id):
                    self.take(att, statuses[att.id])

    def take(self, att: Attempt, st: dict[str, Any]) -> None:
        """What a poll said of ``att``: its end finished, or nothing."""
        loop = self.loop
        if (
            st.get("state") == "died"
            and att.state == "starting"
            and not att.shepherd_pid
            and att.task_id not in loop.starting.launching
        ):
            # its start was never confirmed (the answer lost with a restart, its
            # host out of reach then) and its host knows of no shepherd for it:
            # it did not start, as adoption decides it; not a session that
            # died, which would spend a resume (found by the long soak)
            task = loop.led.get(att.task_id)
            if task is not None:
                loop.adoption.settle_unconfirmed(task, att, st)
            return
        if st.get("state") in ("ended", "died"):
            self.finish_attempt(att, st)

    def finish_attempt(self, att: Attempt, st: dict[str, Any], record: bool = True) -> None:
        """An attempt ended: record it (``record``; False when adopt() finds it recorded
        but not acted on), then move its task on."""
        loop = self.loop
        led = loop.led
        if not record and att.task_id in self.collecting:
            return  # a new adoption (the disk is writable again) while its work is collected
        task = led.get(att.task_id)
        assert task is not None
        host = get_host(loop.config, att.host)
        exit_code = st.get("exit_code")
        res = loop.hook.fleetrun_agent_result(
            task=task, attempt=att, log_path=str(host.log_path(att.id)), exit_code=exit_code, config=loop.config
        )
        cost = res.cost_usd if res is not None else None  # None: unknown, not zero
        if record:
            with led.tx() as cur:
                led.update_attempt(
                    att.id,
                    cur=cur,
                    state="ended",
                    ended=st.get("ended") or time.time(),
                    exit_code=exit_code,
                    outcome=attempt_outcome(end_reason(st), res),
                    session_id=(res.session_id if res else None) or att.session_id,
                    cost_usd=cost,
                    result_text=res.result_text if res else None,
                    info={
                        **att.info,
                        "denials": res.permission_denials if res else [],
                        "error": st.get("error"),
                        "signal": st.get("signal"),
                        # how it ended, as its host said: what a restart
                        # decides from (the host may not answer then)
                        END_STATUS: {k: st.get(k) for k in END_STATUS_KEYS if k in st},
                        **({"log_cut": st["log_cut"]} if st.get("log_cut") else {}),
                    },
                )
                if st.get("log_cut"):  # the task that flooded pays: its record says so
                    led.add_note(
                        task.id,
                        f"attempt {att.number}: its log was cut: "
                        f"{cut_note(st['log_cut'], st.get('log_cap') or DEFAULT_MAX_BYTES)}",
                        cur=cur,
                    )
                cur.execute("UPDATE tasks SET cost_usd = cost_usd + ? WHERE id=?", (cost or 0.0, task.id))
        task = loop.get(task.id)
        att = loop.get_attempt(att.id)
        if task.state is State.ASSIGNED and task.attempts == att.number:
            # its start was never confirmed (a crash before RUNNING, a peer's reply lost
            # with its link) and yet it ran: its end is the task's all the same
            loop.decide(task, att, StartUnconfirmed())
            task = loop.get(task.id)
        if record:  # reported once, by the loop that recorded it
            loop.report(
                task.id,
                partial(loop.hook.fleetrun_attempt_ended, task=task, attempt=att, result=res, config=loop.config),
            )
        rest = loop.decide(task, att, AttemptEnded(st, res))
        if not any(isinstance(a, Collect) for a in rest):
            return  # moved on (or cancelled meanwhile: the attempt is over, nothing else to do)
        task = loop.get(task.id)
        ws = Workspace(**att.workspace) if att.workspace else Workspace(path=task.spec.cwd)
        crash.point("before_collect")  # the end recorded, nothing committed: collected again
        try:  # before VERIFYING: after a crash between the two it is simply done again
            got = loop.hook.fleetrun_collect_work(task=task, attempt=att, workspace=ws, host=host, config=loop.config)
        except (WorktreeTampered, GitError) as e:
            self.collected(task, att, ws, e)
            return
        if got is not None and not isinstance(got, str):  # a handle: poll_collecting goes on
            self.collecting[task.id] = Collecting(att, ws, got)
            return
        self.collected(task, att, ws, None)

    def collected(self, task: Task, att: Attempt, ws: Workspace, e: Optional[Exception]) -> None:
        """The attempt's work is collected (``e``: ``fleetrun_collect_work`` or its handle
        raised ``WorktreeTampered``, a human looks, or ``GitError``, noted): VERIFYING, and
        its first verifier."""
        obs = (
            Collected(tampered=str(e))
            if isinstance(e, WorktreeTampered)
            else Collected(error=str(e))
            if e is not None
            else Collected()
        )
        for a in self.loop.decide(task, att, obs):
            if isinstance(a, StartVerifier):
                self.loop.verify.begin(task.id, Verifying(att, ws, a.idx))

    def poll_one(self, task_id: str, c: Collecting) -> None:
        """The work being collected off the loop's thread (an entry of the loop's pending
        table): go on with what is collected. A task cancelled (or given up) meanwhile
        goes no further: what the effect did is done, its answer is dropped."""
        led = self.loop.led
        failed: Optional[Exception] = None
        try:
            if c.handle.poll() is None:
                return
        except (WorktreeTampered, GitError) as e:
            failed = e
        except BaseException:
            del self.collecting[task_id]  # the task's internal error: it is set aside
            raise
        del self.collecting[task_id]
        task = led.get(task_id)
        att = led.attempt(c.attempt.id)
        if (
            task is None
            or att is None
            or task.state is not State.RUNNING
            or att.state != "ended"
            or task.attempts != att.number
        ):
            return
        self.collected(task, att, c.workspace, failed)

    def worktree_tampered(self, task: Task, att: Attempt, e: WorktreeTampered, what: str) -> None:
        """The agent rewrote, replaced or removed its worktree's ``.git``: nothing is
        committed or run there, and a human looks (a retry would only repeat it)."""
        self.loop.apply(task, att, tampered(str(e), what))

    def give_up_at_once(self, task: Task, att: Attempt, cause: str) -> None:
        """A start that can never succeed as things are (the agent is not installed, it
        rejects its arguments, git refuses the workspace): NEEDS_HUMAN now, no backoff."""
        self.loop.decide(task, att, NotStarted(cause, at_once=True))

    def not_started(self, task: Task, att: Attempt, cause: str) -> None:
        """An attempt that never started: back off from that machine; a retry is not used."""
        self.loop.decide(task, att, NotStarted(cause))

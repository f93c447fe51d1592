"""An attempt's end, applied: the loop polls the attempts that run, records how each
ended, and carries out what :mod:`fleetrun.outcomes` decides for its task (resume, back
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
from typing import Any, Optional

from . import clock
from .capped import DEFAULT_MAX_BYTES, cut_note
from .gitutil import GitError, WorktreeTampered
from .hostapi import AttemptRef, get_host, poll_statuses
from .ledger import Attempt, Task
from .outcomes import Ended, Transition, attempt_outcome, decide_end, decide_not_started, end_reason
from .reports import CollectHandle, Workspace
from .states import State
from .verifying import Verifying


@dataclass
class Collecting:
    """An ended attempt whose work is collected off the loop's thread; ``decision`` (its
    move to VERIFYING) is applied once ``handle`` has its answer."""

    attempt: Attempt
    workspace: Workspace
    decision: Transition
    handle: CollectHandle


#: The attempt's ``info`` key of the status its end was recorded from, and its keys.
END_STATUS = "end_status"
END_STATUS_KEYS = ("state", "reason", "exit_code", "signal", "error", "ended", "log_cut", "log_cap")


class Ending:
    """Ends attempts for the loop. ``loop`` gives the ledger, the hooks, the waits (for
    backoffs and pauses) and the verify stage an attempt that exited goes on to."""

    def __init__(self, loop: Any) -> None:
        self.loop = loop
        self.collecting: dict[str, Collecting] = {}  # task id -> its attempt's work being collected

    def poll(self) -> None:
        loop = self.loop
        if self.collecting:
            self.poll_collecting()
        by_host: dict[Optional[str], list[Attempt]] = {}
        for att in loop.led.attempts(states={"starting", "running"}):
            by_host.setdefault(att.host, []).append(att)
        for name, atts in by_host.items():  # one poll per host per pass (a peer: one request)
            host = get_host(loop.config, name)
            loop.before_host_io(name)
            try:
                statuses = poll_statuses(host, [AttemptRef(a.id, a.shepherd_pid, a.shepherd_token) for a in atts])
            except Exception as e:  # a host's bug: each of its tasks is contained, as one task's would be
                for att in atts:
                    with loop.isolated(att.task_id):
                        raise e
                continue
            for att in atts:
                with loop.isolated(att.task_id):
                    st = statuses[att.id]
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
        res = loop.hook.fleetrun_agent_result(task=task, attempt=att, log_path=str(host.log_path(att.id)),
                                              exit_code=exit_code, config=loop.config)
        cost = res.cost_usd if res is not None else None  # None: unknown, not zero
        if record:
            with led.tx() as cur:
                led.update_attempt(att.id, cur=cur, state="ended", ended=st.get("ended") or time.time(),
                                   exit_code=exit_code, outcome=attempt_outcome(end_reason(st), res),
                                   session_id=(res.session_id if res else None) or att.session_id,
                                   cost_usd=cost, result_text=res.result_text if res else None,
                                   info={**att.info, "denials": res.permission_denials if res else [],
                                         "error": st.get("error"), "signal": st.get("signal"),
                                         # how it ended, as its host said: what a restart
                                         # decides from (the host may not answer then)
                                         END_STATUS: {k: st.get(k) for k in END_STATUS_KEYS if k in st},
                                         **({"log_cut": st["log_cut"]} if st.get("log_cut") else {})})
                if st.get("log_cut"):  # the task that flooded pays: its record says so
                    led.add_note(task.id, f"attempt {att.number}: its log was cut: "
                                 f"{cut_note(st['log_cut'], st.get('log_cap') or DEFAULT_MAX_BYTES)}", cur=cur)
                cur.execute("UPDATE tasks SET cost_usd = cost_usd + ? WHERE id=?", (cost or 0.0, task.id))
        task = loop.get(task.id)
        att = loop.get_attempt(att.id)
        if task.state is State.ASSIGNED and task.attempts == att.number:
            # its start was never confirmed (a crash before RUNNING, a peer's reply lost
            # with its link) and yet it ran: its end is the task's all the same
            loop.move(task, State.RUNNING, "adopted", attempt=att.number)
            task = loop.get(task.id)
        if record:  # reported once, by the loop that recorded it
            loop.report(task.id, partial(loop.hook.fleetrun_attempt_ended, task=task, attempt=att, result=res,
                                         config=loop.config))
        waits = loop.waits
        decision = decide_end(Ended(
            status=st, result=res, task_state=task.state, kind=att.kind, host=att.host, resumes=task.resumes,
            no_start=task.no_start, backoff=waits.backoff_of(task.id, att.host), pause=waits.pause_of(att.host),
            now=time.time(), clock_now=clock.now()))
        if decision is None:
            return  # cancelled meanwhile: the attempt is over, nothing else to do
        if decision.ran:  # that machine is good for this task again, and the never-started count restarts
            waits.clear_backoff(task.id, att.host)
            if task.no_start:
                led.update_task(task.id, no_start=0)
                task = loop.get(task.id)
        if not decision.verify:
            self.apply(task, att, decision)
            return
        ws = Workspace(**att.workspace) if att.workspace else Workspace(path=task.spec.cwd)
        try:  # before VERIFYING: after a crash between the two it is simply done again
            got = loop.hook.fleetrun_collect_work(task=task, attempt=att, workspace=ws, host=host,
                                                  config=loop.config)
        except (WorktreeTampered, GitError) as e:
            if not self.not_collected(task, att, e):
                return
        else:
            if got is not None and not isinstance(got, str):  # a handle: poll_collecting goes on
                self.collecting[task.id] = Collecting(att, ws, decision, got)
                return
        self.collected(task, att, ws, decision)

    def not_collected(self, task: Task, att: Attempt, e: Exception) -> bool:
        """``fleetrun_collect_work`` (or its handle) raised ``WorktreeTampered`` (a human
        looks) or ``GitError`` (noted). :return: whether the verifiers run all the same."""
        if isinstance(e, WorktreeTampered):
            self.worktree_tampered(task, att, e, "nothing was committed")
            return False
        self.loop.led.add_note(task.id, f"could not commit the attempt's work: {e}")
        return True

    def collected(self, task: Task, att: Attempt, ws: Workspace, decision: Transition) -> None:
        """The attempt's work is collected: VERIFYING, and its first verifier."""
        if self.apply(task, att, decision) is None:
            return
        self.loop.verify.begin(task.id, Verifying(att, ws, 0))

    def poll_collecting(self) -> None:
        """The work being collected off the loop's thread: go on with what is collected.
        A task cancelled (or given up) meanwhile goes no further: what the effect did is
        done, its answer is dropped."""
        loop = self.loop
        led = loop.led
        for task_id, c in list(self.collecting.items()):
            with loop.isolated(task_id):
                failed: Optional[Exception] = None
                try:
                    if c.handle.poll() is None:
                        continue
                except (WorktreeTampered, GitError) as e:
                    failed = e
                except BaseException:
                    del self.collecting[task_id]  # the task's internal error: it is set aside
                    raise
                del self.collecting[task_id]
                task = led.get(task_id)
                att = led.attempt(c.attempt.id)
                if task is None or att is None or task.state is not State.RUNNING or att.state != "ended" \
                        or task.attempts != att.number:
                    continue
                if failed is not None and not self.not_collected(task, att, failed):
                    continue
                self.collected(task, att, c.workspace, c.decision)

    def apply(self, task: Task, att: Attempt, decision: Transition) -> Optional[Task]:
        """Carry out a decision for ``task``, whose attempt ``att`` ended or did not start:
        the pause or backoff first, then the move. :return: the task as moved, or None
        when it had moved meanwhile."""
        loop = self.loop
        if decision.pause is not None:
            loop.waits.pause_host(att.host, decision.pause)
            loop.report(task.id, partial(loop.hook.fleetrun_host_paused, host=att.host, until=decision.pause[0],
                                         reason=decision.cause, config=loop.config))
        if decision.backoff is not None:
            loop.waits.back_off(task.id, att.host, decision.backoff)
        now = loop.move(task, decision.to, decision.cause, attempt=att.number, **decision.fields)
        if now is not None and decision.terminal:
            loop.finish_terminal(now)
        return now

    def worktree_tampered(self, task: Task, att: Attempt, e: WorktreeTampered, what: str) -> None:
        """The agent rewrote, replaced or removed its worktree's ``.git``: nothing is
        committed or run there, and a human looks (a retry would only repeat it)."""
        loop = self.loop
        loop.led.update_attempt(att.id, outcome="worktree_tampered")
        # the reason quotes what the agent wrote into .git: one line, no control characters
        reason = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in " ".join(str(e).split()))
        reason = (reason[:300] + "...") if len(reason) > 300 else reason
        now = loop.move(task, State.NEEDS_HUMAN, f"worktree_tampered:{reason or 'its .git was changed'}; {what}",
                        attempt=att.number)
        if now is not None:
            if now.worktree:  # git refuses to remove it now, even with --force: say how
                loop.led.add_note(task.id, f"kept worktree {now.worktree} as the agent left it; to start over, "
                                           "remove that folder and run `git worktree prune` in the repository")
            loop.finish_terminal(now)

    def give_up_at_once(self, task: Task, att: Attempt, cause: str) -> None:
        """A start that can never succeed as things are (the agent is not installed, it
        rejects its arguments, git refuses the workspace): NEEDS_HUMAN now, no backoff."""
        self.apply(task, att, Transition(State.NEEDS_HUMAN, cause))

    def not_started(self, task: Task, att: Attempt, cause: str) -> None:
        """An attempt that never started: back off from that machine; a retry is not used."""
        backoff = self.loop.waits.backoff_of(task.id, att.host)
        self.apply(task, att, decide_not_started(att.kind, task.no_start, backoff, att.host, cause, time.time()))

"""The ``verify`` stage: a task's verifiers, one after the other, without blocking the loop.

A verifier answers at once (a :class:`~fleetrun.reports.Verdict`) or with a handle the
loop polls (and sleeps on, with ``fileno()`` and ``next_deadline()``). Each verdict is
recorded before the next verifier starts; a crash between a recorded failure and the
transition after it is finished by adoption (:meth:`VerifyStage.verdict_failed`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Optional

from . import crash
from .hostapi import get_host
from .ledger import Attempt, Task
from .reports import Cancellable, Handoff, HandoffHandle, Verdict, VerifyHandle, Workspace
from .states import State
from .verdicttext import failed_cause


@dataclass
class Verifying:
    attempt: Attempt
    workspace: Workspace
    idx: int
    handle: Optional[VerifyHandle] = None
    #: every verifier passed and the handoff is made off the loop's thread
    handoff: Optional[HandoffHandle] = None


class VerifyStage:
    """Runs verifiers for the loop. ``loop`` gives the ledger, the hooks and the way on:
    ``move``/``finish_terminal`` end a task."""

    def __init__(self, loop: Any) -> None:
        self.loop = loop
        self.running: dict[str, Verifying] = {}

    def begin(self, task_id: str, v: Verifying) -> None:
        self.running[task_id] = v
        self.start(task_id)

    def start(self, task_id: str) -> None:
        """Start the task's next verifier, or, with none left, move it to DONE."""
        loop = self.loop
        v = self.running[task_id]
        found = loop.led.get(task_id)
        if found is None or found.state is not State.VERIFYING:
            self.running.pop(task_id, None)
            return
        task = found
        while v.idx < len(task.spec.verify):
            spec = task.spec.verify[v.idx]
            try:
                res = loop.hook.fleetrun_verify(task=task, verifier=spec, workspace=v.workspace,
                                                attempt=v.attempt, host=get_host(loop.config, v.attempt.host),
                                                config=loop.config)
            except Exception as e:  # a verifier that cannot reach a verdict fails
                res = Verdict(False, spec.kind, spec.label, reason=f"verifier error: {type(e).__name__}: {e}")
            if res is None:
                res = Verdict(False, spec.kind, spec.label, reason=f"no plugin runs {spec.kind!r} verifiers")
            if isinstance(res, Verdict):
                if not self.record_verdict(task, v, res):
                    return
                task = loop.get(task_id)
                continue
            v.handle = res
            crash.point("mid_verifier")
            return
        self.all_passed(task, v)

    def poll(self) -> None:
        loop = self.loop
        for task_id, v in list(self.running.items()):
            with loop.isolated(task_id):
                if v.handoff is not None:
                    self.poll_handoff(task_id, v, v.handoff)
                    continue
                if v.handle is None:
                    continue
                current = loop.led.get(task_id)
                if current is None or current.state is not State.VERIFYING:  # cancelled meanwhile
                    if isinstance(v.handle, Cancellable):
                        v.handle.cancel()
                    self.running.pop(task_id, None)
                    continue
                verdict = v.handle.poll()
                if verdict is None:
                    continue
                v.handle = None
                task = loop.led.get(task_id)
                if task is None or task.state is not State.VERIFYING:
                    self.running.pop(task_id, None)
                    continue
                if self.record_verdict(task, v, verdict):
                    self.start(task_id)

    def record_verdict(self, task: Task, v: Verifying, verdict: Verdict) -> bool:
        """Record one verdict. :return: True to go on with the next verifier."""
        loop = self.loop
        loop.led.add_verdict(task.id, v.attempt.id, v.idx, verdict)
        crash.point("after_verdict")
        loop.hook.fleetrun_verdict(task=task, verdict=verdict, attempt=v.attempt, config=loop.config)
        task = loop.get(task.id)
        if verdict.passed:
            v.idx += 1
            return True
        self.verdict_failed(task, v, verdict.label, verdict.output)
        return False

    def verdict_failed(self, task: Task, v: Verifying, label: str, output: str = "") -> None:
        """A verifier failed (just now, or before a crash): retry, or ask a human.

        :param label: the failed verifier's label.
        :param output: what it printed: the cause quotes its summary line
            (:func:`~fleetrun.verdicttext.failed_cause`).
        """
        loop = self.loop
        self.running.pop(task.id, None)
        verified = self.verified(v)
        if task.retries < task.spec.max_retries:
            now = loop.move(task, State.RETRYING, failed_cause("verify_fail", label, output),
                            attempt=v.attempt.number, also=verified, retries=task.retries + 1)
        else:
            now = loop.move(task, State.NEEDS_HUMAN, failed_cause("retries_exhausted", label, output),
                            attempt=v.attempt.number, also=verified)
            if now is not None:
                loop.finish_terminal(now)
        if now is None:  # moved meanwhile (cancelled): the attempt is over all the same
            verified(None)

    def verified(self, v: Verifying) -> Callable[[Optional[sqlite3.Cursor]], None]:
        """The attempt's ``verified``, written in the transaction of the move its
        verdicts decide (one commit, not two). A crash before that commit leaves the
        attempt ``ended`` with its verdicts recorded, which the restart acts on as after
        a crash just after the last verdict (``after_verdict``)."""
        led = self.loop.led
        return lambda cur: led.update_attempt(v.attempt.id, cur=cur, state="verified")

    def all_passed(self, task: Task, v: Verifying) -> None:
        loop = self.loop
        self.running.pop(task.id, None)
        got = loop.hook.fleetrun_handoff(task=task, attempt=v.attempt, host=get_host(loop.config, task.host),
                                         config=loop.config)
        if got is not None and not isinstance(got, Handoff):  # a handle: poll_handoff goes on
            v.handoff = got
            self.running[task.id] = v
            return
        self.done(task, v, got)

    def poll_handoff(self, task_id: str, v: Verifying, handle: HandoffHandle) -> None:
        """The handoff made off the loop's thread: DONE once it is there. A task
        cancelled meanwhile goes no further (its handoff is dropped); a crash before it
        finds every verdict recorded, and adoption asks for the handoff again."""
        loop = self.loop
        try:
            handoff = handle.poll()
        except BaseException:
            self.running.pop(task_id, None)  # the task's internal error: it is set aside
            raise
        if handoff is None:
            return
        self.running.pop(task_id, None)
        task = loop.led.get(task_id)
        if task is None or task.state is not State.VERIFYING or task.attempts != v.attempt.number:
            return
        self.done(task, v, handoff)

    def done(self, task: Task, v: Verifying, handoff: Optional[Handoff]) -> None:
        """Every verifier passed and the handoff is made: DONE, then the cleanup."""
        loop = self.loop
        fields: dict[str, Any] = {}
        if handoff is not None:
            fields["handoff"] = asdict(handoff)
        verified = self.verified(v)
        now = loop.move(task, State.DONE, "verify_pass" if task.spec.verify else "exited",
                        attempt=v.attempt.number, also=verified, **fields)
        if now is None:
            verified(None)
            return
        loop.finish_terminal(now)

    # -- for the loop's wait, its interruptions and its containment -----------------------

    def handles(self) -> list[VerifyHandle]:
        return [v.handle for v in self.running.values() if v.handle is not None]

    def drop(self, task_id: str) -> None:
        """Stop the task's verifier, if one runs: the task is set aside."""
        v = self.running.pop(task_id, None)
        if v is not None and isinstance(v.handle, Cancellable):
            v.handle.cancel()

    def cancel_all(self) -> int:
        """Stop every verifier (Ctrl-C, a full disk): their verdicts are not recorded, so
        they run again from the start once the loop can record them.

        :return: how many were stopped."""
        stopped = 0
        for v in self.running.values():
            if isinstance(v.handle, Cancellable):
                v.handle.cancel()
                stopped += 1
        self.running.clear()
        return stopped

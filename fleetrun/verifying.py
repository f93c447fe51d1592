"""The ``verify`` stage: a task's verifiers, one after the other, without blocking the loop.

A verifier answers at once (a :class:`~fleetrun.reports.Verdict`) or with a handle the
loop polls (and sleeps on, with ``fileno()`` and ``next_deadline()``). Each verdict is
recorded before the next verifier starts; a crash between a recorded failure and the
transition after it is finished by adoption (:meth:`VerifyStage.verdict_failed`).

A verifier that could not judge (a :class:`~fleetrun.reports.Verdict` with ``error``)
never sends the agent back to work (:meth:`VerifyStage.could_not_judge`): a permanent
error moves the task to NEEDS_HUMAN at once (``verifier_error:LABEL: WHY``), a
transient one runs that verifier again, alone, after a backoff, and goes NEEDS_HUMAN
after a bounded number of tries. Neither is a verdict row (the verifier gave none):
the attempt's ``info`` keeps the error and the backoff, so a restart resumes the wait
and ``fleetrun retry`` re-verifies the kept work from the verifier that could not judge.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Optional

from . import clock, crash
from .decide import HandOff, HandoffMade, StartVerifier, VerdictGiven, VerifierWait
from .exceptions import is_space_error, says_space_error
from .gitutil import WorktreeTampered
from .hostapi import get_host, hands_off_without_waiting, verifies_without_waiting
from .ledger import Attempt, Task
from .records import REVERIFY, VERIFY_ERROR, VERIFY_WAIT  # noqa: F401 - their users import them from here too
from .reports import (
    PERMANENT,
    TRANSIENT,
    Cancellable,
    Handoff,
    HandoffHandle,
    Verdict,
    VerifyHandle,
    Workspace,
)
from .states import State

if TYPE_CHECKING:
    from .loop import Loop

#: ``[fleetrun]`` settings: how many times a verifier that could not judge (a transient
#: error) is tried in all, and the first backoff (doubled each time, at most an hour:
#: :data:`fleetrun.decide.MAX_VERIFIER_BACKOFF_S`).
ERROR_TRIES, ERROR_BACKOFF_S = 5, 30.0


class VerifierBackoff:
    """The wait before a verifier that could not judge runs again: a
    :class:`~fleetrun.reports.VerifyHandle` that never gives a verdict, so the loop
    sleeps on its deadline (the loop's clock, which a test may move)."""

    def __init__(self, until: float, reason: str) -> None:
        self.until = until
        self.reason = reason

    def due(self) -> bool:
        return clock.now() >= self.until

    def poll(self) -> Optional[Verdict]:
        return None

    def next_deadline(self) -> float:
        return time.monotonic() + max(0.0, self.until - clock.now())


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

    def __init__(self, loop: Loop) -> None:
        self.loop = loop
        self.running = loop.pending.view(Verifying)

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
        host = get_host(loop.config, v.attempt.host)
        if not (
            verifies_without_waiting(host, task.spec.verify[v.idx].kind)
            if v.idx < len(task.spec.verify)
            else hands_off_without_waiting(host)
        ):
            # a peer's verifier is asked to start over SSH; one sent and not waited for
            # (its reply wakes the loop) is not: the ends of a pass start theirs together
            loop.before_host_io(v.attempt.host)
        while v.idx < len(task.spec.verify):
            spec = task.spec.verify[v.idx]
            try:
                res = loop.hook.fleetrun_verify(
                    task=task,
                    verifier=spec,
                    workspace=v.workspace,
                    attempt=v.attempt,
                    host=host,
                    config=loop.config,
                )
            except Exception as e:  # a verifier that cannot reach a verdict never passes
                res = Verdict(
                    False,
                    spec.kind,
                    spec.label,
                    reason=f"verifier error: {type(e).__name__}: {e}",
                    error=error_kind_of(e),
                )
            if res is None:
                res = Verdict(
                    False, spec.kind, spec.label, reason=f"no plugin runs {spec.kind!r} verifiers", error=PERMANENT
                )
            if isinstance(res, Verdict):
                if not self.record_verdict(task, v, res):
                    return
                task = loop.get(task_id)
                continue
            v.handle = res
            crash.point("mid_verifier")
            return
        self.all_passed(task, v)

    def poll_one(self, task_id: str, v: Verifying) -> None:
        """A verifier, its backoff or the handoff (an entry of the loop's pending table):
        record its verdict and go on, or stop it if the task left VERIFYING."""
        loop = self.loop
        if v.handoff is not None:
            self.poll_handoff(task_id, v, v.handoff)
            return
        if v.handle is None:
            return
        current = loop.led.get(task_id)
        if current is None or current.state is not State.VERIFYING:  # cancelled meanwhile
            if isinstance(v.handle, Cancellable):
                v.handle.cancel()
            if isinstance(v.handle, VerifierBackoff):
                loop.waits.placed(task_id)  # it waits no more
            self.running.pop(task_id, None)
            return
        if isinstance(v.handle, VerifierBackoff):
            if v.handle.due():
                v.handle = None
                loop.waits.placed(task_id)
                self.start(task_id)
            return
        verdict = v.handle.poll()
        if verdict is None:
            return
        v.handle = None
        task = loop.led.get(task_id)
        if task is None or task.state is not State.VERIFYING:
            self.running.pop(task_id, None)
            return
        if self.record_verdict(task, v, verdict):
            self.start(task_id)

    def record_verdict(self, task: Task, v: Verifying, verdict: Verdict) -> bool:
        """Record one verdict. :return: True to go on with the next verifier."""
        loop = self.loop
        if verdict.error:
            loop.report(
                task.id,
                partial(loop.hook.fleetrun_verdict, task=task, verdict=verdict, attempt=v.attempt, config=loop.config),
            )
            self.could_not_judge(loop.get(task.id), v, verdict)
            return False
        loop.led.add_verdict(task.id, v.attempt.id, v.idx, verdict)
        if verdict.cost_usd:
            loop.led.durable()  # a verdict that cost money is not paid for twice after a crash
        loop.led.after_commit(lambda: crash.point("after_verdict"))  # once it is committed
        loop.report(
            task.id,
            partial(loop.hook.fleetrun_verdict, task=task, verdict=verdict, attempt=v.attempt, config=loop.config),
        )
        task = loop.get(task.id)
        if verdict.passed:
            rest = loop.decide(task, v.attempt, VerdictGiven(v.idx, True, verdict.label))
            if not any(isinstance(a, (StartVerifier, HandOff)) for a in rest):
                self.running.pop(task.id, None)  # moved meanwhile
                return False
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
        self.running.pop(task.id, None)
        self.loop.decide(task, v.attempt, VerdictGiven(v.idx, False, label, output))

    def could_not_judge(self, task: Task, v: Verifying, verdict: Verdict) -> None:
        """Verifier ``v.idx`` could not judge the work: never the agent's failure
        (:func:`fleetrun.decide.decide` says whether a human is asked or it waits and
        runs again). What a wait needs after a restart is in the attempt's ``info``,
        written before the wait begins."""
        loop = self.loop
        info = dict(loop.get_attempt(v.attempt.id).info)
        why = " ".join((verdict.reason or "could not judge").split())
        prev = info.get(VERIFY_WAIT)
        tries = 0
        if isinstance(prev, dict) and prev.get("idx") == v.idx and isinstance(prev.get("tries"), int):
            tries = prev["tries"]
        limit = _setting(loop.config, "verifier_error_tries", ERROR_TRIES, int)
        base = _setting(loop.config, "verifier_error_backoff_s", ERROR_BACKOFF_S, (int, float))
        obs = VerdictGiven(
            v.idx,
            False,
            verdict.label,
            verdict.output or "",
            error=verdict.error,
            reason=why,
            prev_tries=tries,
            space=verdict.error == TRANSIENT and says_space_error(why),
            limit=limit,
            backoff_s=float(base),
        )
        if task.state is not State.VERIFYING:  # moved meanwhile: the move would be refused
            self.running.pop(task.id, None)
            loop.waits.placed(task.id)
            return
        for a in loop.decide(task, v.attempt, obs):
            if isinstance(a, VerifierWait):
                info[VERIFY_WAIT] = {"idx": a.idx, "tries": a.tries, "until": a.until, "reason": a.reason}
                loop.led.update_attempt(v.attempt.id, info=info)
                # once the wait is committed (with its pass): the restart resumes it
                loop.led.after_commit(lambda: crash.point("after_verifier_wait"))
                self.wait(task, v, info[VERIFY_WAIT], limit)
                return
        self.running.pop(task.id, None)
        loop.waits.placed(task.id)

    def wait(self, task: Task, v: Verifying, wait: dict[str, Any], limit: Optional[int] = None) -> None:
        """Wait, saying why, before verifier ``v.idx`` runs again (just now, or after a
        restart: ``wait`` is what the attempt's ``info`` holds)."""
        loop = self.loop
        if limit is None:
            limit = _setting(loop.config, "verifier_error_tries", ERROR_TRIES, int)
        label = task.spec.verify[v.idx].label if v.idx < len(task.spec.verify) else "?"
        left = max(0.0, float(wait["until"]) - clock.now())
        reason = (
            f"verifier {label.replace(chr(10), ' ')} could not judge: {wait.get('reason', '')}; "
            f"again in {left:.0f} s (try {int(wait['tries']) + 1} of {limit})"
        )
        v.handle = VerifierBackoff(float(wait["until"]), reason)
        self.running[task.id] = v
        waits = loop.waits
        if waits.waits.get(task.id) != reason:
            waits.waits[task.id] = reason
            waits.dirty = True
            waits.save()  # `fleetrun status` says it by the time the run does
            loop.report(task.id, partial(loop.hook.fleetrun_task_waiting, task=task, reason=reason, config=loop.config))

    def all_passed(self, task: Task, v: Verifying) -> None:
        loop = self.loop
        self.running.pop(task.id, None)
        crash.point("before_handoff")  # every verdict recorded: the restart asks for the handoff again
        got = loop.hook.fleetrun_handoff(
            task=task, attempt=v.attempt, host=get_host(loop.config, task.host), config=loop.config
        )
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
        self.loop.decide(task, v.attempt, HandoffMade(asdict(handoff) if handoff is not None else None))

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


def _setting(config: Any, key: str, default: Any, types: Any) -> Any:
    """A ``[fleetrun]`` number of config.toml (checked when it is loaded), else ``default``."""
    value = config.setting("fleetrun", key, default)
    return value if isinstance(value, types) and not isinstance(value, bool) and value > 0 else default


def error_kind_of(e: Exception) -> Optional[str]:
    """What a verifier's exception says of the work (the verify stage's, and a plugin's
    that catches its own, as ``verify_brain`` does): a worktree that no longer
    pins to its repository is the agent's doing (a FAIL: the next attempt's preparation
    finds it ``worktree_tampered``); a full disk clears by itself (found by the soak);
    anything else is a verifier that cannot judge, and will not by trying again."""
    if isinstance(e, WorktreeTampered):
        return None
    return TRANSIENT if is_space_error(e) else PERMANENT

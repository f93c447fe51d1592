"""The pure decision the loop makes when an attempt ends or does not start.

``attempt outcome + task -> transition``: :func:`decide_end` takes what is known when an
attempt ends (the shepherd's status, the agent's :class:`~fleetrun.reports.AgentResult`,
the task's counters, the machine's backoff and pause) as plain data and returns a
:class:`Transition`: the next state, its cause, the ledger fields that move with it and
what else the loop must do (back off, pause the machine, collect and verify). Nothing
here reads the ledger, a clock or a process; the loop (:mod:`fleetrun.ending`) gathers
the inputs and applies the result, so every outcome is tested without processes
(``tests/test_outcomes.py``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Optional

from .placement import Backoff, backoff_delay
from .reports import AgentResult
from .states import State

#: Resumes of one task before a human is asked (``resume_cap:<cause>``).
RESUME_CAP = 3
#: After a usage limit that gave no reset time, or a 429: 1, 2, 4 ... minutes, at most 30.
USAGE_BACKOFF_S = 60.0
USAGE_BACKOFF_MAX_S = 30 * 60.0
#: Attempts in a row that did not start before a human is asked (``never_started:``).
NEVER_STARTED_CAP = 10
#: A usage pause that ended longer ago than this no longer counts toward the next one.
PAUSE_MEMORY_S = 3600.0

#: Where a task goes back to when its attempt did not start, by the attempt's kind.
BACK_STATE: Mapping[str, State] = {"fresh": State.READY, "retry": State.RETRYING, "resume": State.RESUMING}
#: The same once the task was RUNNING (its shepherd started, its agent did not): the
#: state machine lets RUNNING go back only to RESUMING.
BACK_STATE_FROM_RUNNING: Mapping[str, State] = {"fresh": State.RESUMING, "retry": State.RESUMING,
                                                "resume": State.RESUMING}

#: How an attempt delivered to a role's mailbox (the ``mailbox`` plugin) ended, as the
#: ``reason`` of its host's status: the role reported a failure (``error`` is its
#: reason); nobody claimed it in time and no session answered to the role (withdrawn:
#: the task is spawned next, a resume that uses up no retry and no resume); claimed but
#: not reported by the task's ``timeout_min``; withdrawn otherwise. (Reported done, it
#: ends ``exited``, like an agent that exited.)
MAILBOX_FAILED = "mailbox_failed"
MAILBOX_UNCLAIMED = "mailbox_unclaimed"
MAILBOX_CLAIMED_NO_COMPLETION = "mailbox_claimed_no_completion"
MAILBOX_WITHDRAWN = "mailbox_withdrawn"

#: The cause word of an attempt that ended without a usable result, by the shepherd's reason.
_FAILURE_WORD = {"timeout": "timeout", "stalled": "stalled", "cancelled": "session_died",
                 "stopped": "session_died", "died": "session_died"}


@dataclass(frozen=True)
class Transition:
    """What the loop does with a task whose attempt ended or did not start.

    :ivar to: the task's next state.
    :ivar cause: the transition's cause (``reason`` in the ledger and the event log).
    :ivar fields: task fields written with the move (``resumes``, ``no_start``).
    :ivar ran: the agent ran: its machine is good for this task again (the task's
        backoff there is cleared) and the never-started count starts again at 0.
    :ivar backoff: try this task on that machine again only after ``backoff.until``
        (set after ``ran`` clears the old one); the loop wakes up then.
    :ivar pause: ``(until, count)``: start nothing on that machine before ``until``
        (a usage limit); ``count`` is how many pauses in a row it has had.
    :ivar verify: collect the attempt's work, then verify it (``to`` is VERIFYING).
    """

    to: State
    cause: str
    fields: Mapping[str, Any] = field(default_factory=dict)
    ran: bool = False
    backoff: Optional[Backoff] = None
    pause: Optional[tuple[float, int]] = None
    verify: bool = False

    @property
    def terminal(self) -> bool:
        """The task is set aside: what depends on it is cascaded, its workspace cleaned."""
        return self.to.terminal


@dataclass(frozen=True)
class Ended:
    """What is known when an attempt ends, as plain data.

    :ivar status: the shepherd's status (``state``, ``reason``, ``exit_code``, ``error``).
    :ivar result: what the agent's output says, or None when no plugin read it.
    :ivar task_state: the task's state now (a cancel may have come first).
    :ivar kind: the attempt's kind (``fresh``, ``retry``, ``resume``).
    :ivar host: the machine it ran on.
    :ivar resumes: the task's resumes so far.
    :ivar no_start: the task's attempts in a row that did not start.
    :ivar backoff: the task's backoff on that machine before this end, if any.
    :ivar pause: the machine's usage pause ``(until, count)`` before this end, if any.
    :ivar now: the wall clock (``time.time()``), for backoffs.
    :ivar clock_now: the loop's wait clock (:func:`fleetrun.clock.now`), for pauses.
    """

    status: Mapping[str, Any]
    result: Optional[AgentResult]
    task_state: State = State.RUNNING
    kind: str = "fresh"
    host: str = "local"
    resumes: int = 0
    no_start: int = 0
    backoff: Optional[Backoff] = None
    pause: Optional[tuple[float, int]] = None
    now: float = 0.0
    clock_now: float = 0.0


def end_reason(status: Mapping[str, Any]) -> Optional[str]:
    """Why the shepherd says the attempt ended (``exited``, ``timeout``...); ``died`` when
    the shepherd itself is gone."""
    return status.get("reason") if status.get("state") == "ended" else "died"


def attempt_outcome(reason: Optional[str], result: Optional[AgentResult]) -> Optional[str]:
    """The attempt's ``outcome`` in the ledger: ``ok``, the shepherd's reason when the
    agent did not simply exit, else what its output says was wrong."""
    if result is not None and result.ok and reason == "exited":
        return "ok"
    if reason != "exited":
        return reason
    return result.reason if result is not None else "unknown"


def back_state(kind: str, from_running: bool = False) -> State:
    """Where a task goes when its attempt of ``kind`` did not start."""
    return (BACK_STATE_FROM_RUNNING if from_running else BACK_STATE)[kind]


def next_pause(prev: Optional[tuple[float, int]], until: Optional[float], now: float) -> tuple[float, int]:
    """A machine's usage pause after a usage limit that resets at ``until`` (None: it did
    not say): that time, or 1, 2, 4 ... 30 minutes from ``now`` counting the pauses in a
    row. :return: ``(until, count)``."""
    count = (prev[1] + 1) if prev and prev[0] > now - PAUSE_MEMORY_S else 1
    if until is None or until <= now:
        until = now + min(USAGE_BACKOFF_MAX_S, USAGE_BACKOFF_S * 2 ** (count - 1))
    return until, count


def pause_text(until: float) -> str:
    """How a usage pause is shown, in a cause and in a wait reason."""
    return f"usage limit, resumes at {time.strftime('%H:%M', time.localtime(until))}"


def resume_or_give_up(resumes: int, cause: str) -> Transition:
    """An attempt that failed in a way the next session may get past: resume it, unless it
    has been resumed :data:`RESUME_CAP` times already."""
    if resumes >= RESUME_CAP:
        return Transition(State.NEEDS_HUMAN, f"resume_cap:{cause}")
    return Transition(State.RESUMING, cause, fields={"resumes": resumes + 1})


def decide_not_started(kind: str, no_start: int, backoff: Optional[Backoff], host: str, cause: str,
                       now: float, from_running: bool = False) -> Transition:
    """An attempt that never started: back off from that machine (no retry is used);
    after :data:`NEVER_STARTED_CAP` in a row, ask a human.

    :param kind: the attempt's kind.
    :param no_start: the task's attempts in a row that did not start, before this one.
    :param backoff: the task's backoff on ``host`` before this one.
    :param cause: why it did not start (its first word names the backoff's cause).
    :param now: the wall clock.
    :param from_running: the task is RUNNING (the shepherd started, the agent did not).
    """
    count = no_start + 1
    n = (backoff.count if backoff else 0) + 1
    # not idle: the task is placed again after the backoff
    bo = Backoff(n, now + backoff_delay(n), cause.split(":", 1)[0])
    if count >= NEVER_STARTED_CAP:
        return Transition(State.NEEDS_HUMAN,
                          f"never_started:{count} attempts in a row didn't start; the last was {cause} on {host}",
                          fields={"no_start": count}, backoff=bo)
    return Transition(back_state(kind, from_running), cause, fields={"no_start": count}, backoff=bo)


def decide_mailbox_end(reason: Optional[str], error: Optional[str]) -> Optional[Transition]:
    """The transition of a delivered attempt's end that no agent's end shares (the
    ``MAILBOX_*`` reasons above), or None for any other reason."""
    if reason == MAILBOX_FAILED:
        return Transition(State.NEEDS_HUMAN, f"{MAILBOX_FAILED}:{error or 'the role reported a failure'}", ran=True)
    if reason == MAILBOX_UNCLAIMED:
        # the role never saw it: spawn it (not a failed attempt; no retry or resume is used)
        return Transition(State.RESUMING, f"{MAILBOX_UNCLAIMED}:{error or 'nobody claimed it in time'}")
    if reason == MAILBOX_CLAIMED_NO_COMPLETION:
        return Transition(State.NEEDS_HUMAN, MAILBOX_CLAIMED_NO_COMPLETION, ran=True)
    if reason == MAILBOX_WITHDRAWN:
        return Transition(State.NEEDS_HUMAN, f"{MAILBOX_WITHDRAWN}:{error or 'the message was withdrawn'}")
    return None


def decide_end(e: Ended) -> Optional[Transition]:
    """The transition of a task whose attempt ended. :return: None when there is nothing
    to do (the task left RUNNING meanwhile, a cancel)."""
    if e.task_state is not State.RUNNING:
        return None
    reason = end_reason(e.status)
    res = e.result
    error = e.status.get("error")
    mailbox = decide_mailbox_end(reason, error)
    if mailbox is not None:
        return mailbox
    if reason == "start_failed:agent_not_found":  # it can never start as things are: no backoff
        return Transition(State.NEEDS_HUMAN, f"agent_not_found:{error or 'the agent cannot be run'}")
    if (reason or "").startswith("start_failed"):
        return decide_not_started(e.kind, e.no_start, e.backoff, e.host,
                                  f"start_failed:{error or 'the agent did not start'}", e.now, from_running=True)
    if reason == "exited" and res is not None and (res.reason or "").startswith("rejected_arguments:"):
        # the agent refused its command line: the next attempt would get the same one
        return Transition(State.NEEDS_HUMAN, f"agent_rejected_arguments:{res.reason.split(':', 1)[1]}")
    # from here on it ran: that machine is good for this task again
    if res is not None and res.usage_limit:
        pause = next_pause(e.pause, res.usage_reset_at, e.clock_now)
        return Transition(State.RESUMING, f"usage_limit:{pause_text(pause[0])}", ran=True, pause=pause)
    if res is not None and res.reason == "rate_limited":
        # a 429 that gave no reset time: back off (1, 2, 4 ... 30 min), not a pause of the
        # machine until a made-up time; no resume is used, as for a usage limit
        n = (e.backoff.count + 1) if e.backoff is not None and e.backoff.cause == "rate_limited" else 1
        until = e.now + min(USAGE_BACKOFF_MAX_S, USAGE_BACKOFF_S * 2 ** (n - 1))
        why = " ".join(res.result_text.split())[:200] or "HTTP 429"
        return Transition(State.RESUMING, f"rate_limited:{why}", ran=True,
                          backoff=Backoff(n, until, "rate_limited"))
    if res is not None and res.reason == "budget":
        return Transition(State.NEEDS_HUMAN, "budget_exhausted:the agent reached its --max-budget-usd", ran=True)
    if res is not None and res.reason == "max_turns":
        # the task's max_turns: a cap the user set, as budget_usd is; a resumed session
        # would only take that many turns again
        return Transition(State.NEEDS_HUMAN, "max_turns:the agent reached its --max-turns", ran=True)
    outcome = attempt_outcome(reason, res)
    if outcome != "ok":
        word = _FAILURE_WORD.get(reason or "", "session_died")
        detail = None if word in ("timeout", "stalled") else (outcome if outcome != reason else reason)
        cause = f"{word}:{detail}" if detail else word
        if res is not None and res.reason.startswith("api_error:") and reason == "exited":
            cause = res.reason  # a 500 or 529: the API's fault, transient; resumed
        return replace(resume_or_give_up(e.resumes, cause), ran=True)
    return Transition(State.VERIFYING, "exited", ran=True, verify=True)

"""The attempt-end decisions of fleetrun.decide: every attempt end the loop handles, without processes."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Optional

import pytest

from fleetrun import decide as outcomes
from fleetrun.decide import (
    NEVER_STARTED_CAP,
    RESUME_CAP,
    Ended,
    Transition,
    attempt_outcome,
    back_state,
    decide_end,
    decide_not_started,
    end_reason,
    next_pause,
    pause_text,
)
from fleetrun.placement import Backoff, backoff_delay
from fleetrun.plugins.claude import end_of as claude_end
from fleetrun.plugins.mailbox.host import (
    MAILBOX_CLAIMED_NO_COMPLETION,
    MAILBOX_FAILED,
    MAILBOX_UNCLAIMED,
    MAILBOX_WITHDRAWN,
)
from fleetrun.plugins.mailbox.host import end_of as mailbox_end
from fleetrun.reports import AgentResult
from fleetrun.states import State

NOW = 1_000_000.0


def ended(
    reason: Optional[str] = "exited",
    result: Optional[AgentResult] = None,
    *,
    state: str = "ended",
    error: Optional[str] = None,
    **kw: Any,
) -> Ended:
    status: dict[str, Any] = {"state": state, "exit_code": 0}
    if reason is not None and state == "ended":
        status["reason"] = reason
    if error is not None:
        status["error"] = error
    kw.setdefault("now", NOW)
    kw.setdefault("clock_now", NOW)
    if result is not None and result.end is None:  # as the claude plugin classifies it
        result = dataclasses.replace(result, end=claude_end(result))
    return Ended(status=status, result=result, **kw)


def delivered(reason: str, error: Optional[str] = None, **kw: Any) -> Ended:
    """A delivered attempt's end: its host's status, and the mailbox plugin's result."""
    status: dict[str, Any] = {"state": "ended", "reason": reason, "exit_code": None}
    if error is not None:
        status["error"] = error
    kw.setdefault("now", NOW)
    kw.setdefault("clock_now", NOW)
    return Ended(status=status, result=AgentResult(ok=False, end=mailbox_end(status)), **kw)


def failed(reason: str, **kw: Any) -> AgentResult:
    return AgentResult(ok=False, reason=reason, **kw)


OK = AgentResult(ok=True)

#: (shepherd's reason, the agent's result) -> (next state, cause); each one ran, is resumed
#: (its resume count goes up by one) unless it goes to VERIFYING.
RESUMED = [
    pytest.param("timeout", OK, "timeout", id="timeout"),
    pytest.param("stalled", OK, "stalled", id="stalled"),
    pytest.param("cancelled", None, "session_died:cancelled", id="cancelled"),
    pytest.param("stopped", None, "session_died:stopped", id="stopped"),
    pytest.param("killed", None, "session_died:killed", id="other-shepherd-reason"),
    pytest.param(
        "exited",
        failed("malformed_output:line 3: not JSON"),
        "session_died:malformed_output:line 3: not JSON",
        id="malformed_output",
    ),
    pytest.param("exited", failed("is_error"), "session_died:is_error", id="is_error"),
    pytest.param("exited", failed("no_result"), "session_died:no_result", id="no_result"),
    pytest.param("exited", None, "session_died:unknown", id="no-plugin-read-the-result"),
    pytest.param("exited", failed("api_error:529"), "api_error:529", id="api_error"),
    pytest.param("exited", failed("api_error:500"), "api_error:500", id="api_error-500"),
]


@pytest.mark.parametrize(("reason", "result", "cause"), RESUMED)
def test_a_failed_session_is_resumed(reason: str, result: Optional[AgentResult], cause: str) -> None:
    t = decide_end(ended(reason, result, resumes=1))
    assert t == Transition(State.RESUMING, cause, fields={"resumes": 2}, ran=True)


@pytest.mark.parametrize(("reason", "result", "cause"), RESUMED)
def test_the_resume_cap_asks_a_human(reason: str, result: Optional[AgentResult], cause: str) -> None:
    t = decide_end(ended(reason, result, resumes=RESUME_CAP))
    assert t == Transition(State.NEEDS_HUMAN, f"resume_cap:{cause}", ran=True)
    assert t.terminal


def test_a_dead_shepherd_is_a_session_that_died() -> None:
    e = ended(None, OK, state="died")
    assert end_reason(e.status) == "died"
    assert decide_end(e) == Transition(State.RESUMING, "session_died:died", fields={"resumes": 1}, ran=True)


def test_an_agent_that_exited_ok_is_verified() -> None:
    t = decide_end(ended("exited", OK))
    assert t == Transition(State.VERIFYING, "exited", ran=True, verify=True)
    assert t is not None and not t.terminal


@pytest.mark.parametrize("state", [s for s in State if s is not State.RUNNING])
def test_nothing_to_do_once_the_task_left_running(state: State) -> None:
    assert decide_end(ended("exited", OK, task_state=state)) is None


def test_an_agent_that_is_not_installed_asks_a_human_at_once() -> None:
    t = decide_end(ended("start_failed:agent_not_found", error="claude: not found", no_start=3))
    assert t == Transition(State.NEEDS_HUMAN, "agent_not_found:claude: not found")  # no backoff, not "ran"
    assert decide_end(ended("start_failed:agent_not_found")) == Transition(
        State.NEEDS_HUMAN, "agent_not_found:the agent cannot be run"
    )


def test_rejected_arguments_ask_a_human_at_once() -> None:
    t = decide_end(ended("exited", failed("rejected_arguments:--max-budget-usd"), resumes=0))
    assert t == Transition(State.NEEDS_HUMAN, "agent_rejected_arguments:--max-budget-usd")


@pytest.mark.parametrize("kind", ["fresh", "retry", "resume"])
def test_an_agent_that_did_not_start_under_its_shepherd_backs_off(kind: str) -> None:
    prev = Backoff(2, NOW - 1, "start_failed")
    t = decide_end(ended("start_failed", error="exec format error", kind=kind, no_start=1, backoff=prev, host="mini"))
    # RUNNING may go back only to RESUMING; the never-started count goes on
    assert t == Transition(
        State.RESUMING,
        "start_failed:exec format error",
        fields={"no_start": 2},
        backoff=Backoff(3, NOW + backoff_delay(3), "start_failed"),
    )
    assert decide_end(ended("start_failed")).cause == "start_failed:the agent did not start"  # type: ignore[union-attr]


def test_usage_limit_with_a_reset_time_pauses_the_machine_until_then() -> None:
    reset = NOW + 3 * 3600
    t = decide_end(ended("exited", failed("is_error", usage_limit=True, usage_reset_at=reset), resumes=RESUME_CAP))
    # a pause uses no resume, even at the cap
    assert t == Transition(State.RESUMING, f"usage_limit:{pause_text(reset)}", ran=True, pause=(reset, 1))


def test_usage_limit_without_a_reset_time_backs_off_doubling() -> None:
    t = decide_end(ended("exited", failed("is_error", usage_limit=True)))
    assert t is not None and t.pause == (NOW + 60.0, 1)
    # a second one while the first is remembered: twice as long
    t = decide_end(ended("exited", failed("is_error", usage_limit=True), pause=(NOW - 10, 1)))
    assert t is not None and t.pause == (NOW + 120.0, 2)
    assert t.cause == f"usage_limit:{pause_text(NOW + 120.0)}"
    # one that ended over an hour ago is forgotten
    t = decide_end(ended("exited", failed("is_error", usage_limit=True), pause=(NOW - 3601, 5)))
    assert t is not None and t.pause == (NOW + 60.0, 1)


def test_next_pause_is_capped_and_ignores_a_reset_time_in_the_past() -> None:
    assert next_pause((NOW, 20), None, NOW) == (NOW + outcomes.USAGE_BACKOFF_MAX_S, 21)
    assert next_pause(None, NOW - 5, NOW) == (NOW + 60.0, 1)


def test_the_same_reset_time_is_the_same_pause() -> None:
    """Two ends in one limit window, or one end decided again after a crash (its reset
    passed meanwhile): the pause recorded stands, its count is not raised."""
    assert next_pause((NOW + 600, 1), NOW + 600, NOW) == (NOW + 600, 1)
    assert next_pause((NOW - 5, 2), NOW - 5, NOW) == (NOW - 5, 2)
    assert next_pause((NOW - 5, 2), NOW + 600, NOW) == (NOW + 600, 3)
    assert pause_text(NOW) == f"usage limit, resumes at {time.strftime('%H:%M', time.localtime(NOW))}"


def test_rate_limited_backs_off_the_task_on_that_machine() -> None:
    t = decide_end(ended("exited", failed("rate_limited", result_text="Too many\nrequests"), resumes=RESUME_CAP))
    assert t == Transition(
        State.RESUMING, "rate_limited:Too many requests", ran=True, backoff=Backoff(1, NOW + 60.0, "rate_limited")
    )
    # after two 429s in a row: the third waits four minutes
    t = decide_end(ended("exited", failed("rate_limited"), backoff=Backoff(2, NOW, "rate_limited")))
    assert t == Transition(
        State.RESUMING, "rate_limited:HTTP 429", ran=True, backoff=Backoff(3, NOW + 240.0, "rate_limited")
    )
    # a backoff for another cause does not count
    t = decide_end(ended("exited", failed("rate_limited"), backoff=Backoff(4, NOW, "peer_refused")))
    assert t is not None and t.backoff == Backoff(1, NOW + 60.0, "rate_limited")


def test_a_spent_budget_asks_a_human() -> None:
    t = decide_end(ended("exited", failed("budget")))
    assert t == Transition(State.NEEDS_HUMAN, "budget_exhausted:the agent reached its --max-budget-usd", ran=True)


def test_max_turns_reached_asks_a_human_even_with_resumes_left() -> None:
    t = decide_end(ended("exited", failed("max_turns"), resumes=0))
    assert t == Transition(State.NEEDS_HUMAN, "max_turns:the agent reached its --max-turns", ran=True)


@pytest.mark.parametrize(
    ("reason", "result", "outcome"),
    [
        ("exited", OK, "ok"),
        ("exited", failed("is_error"), "is_error"),
        ("exited", None, "unknown"),
        ("timeout", OK, "timeout"),
        ("died", None, "died"),
        (None, OK, None),
    ],
)
def test_the_recorded_outcome(reason: Optional[str], result: Optional[AgentResult], outcome: Optional[str]) -> None:
    assert attempt_outcome(reason, result) == outcome


@pytest.mark.parametrize(
    ("kind", "from_running", "back"),
    [
        ("fresh", False, State.READY),
        ("retry", False, State.RETRYING),
        ("resume", False, State.RESUMING),
        ("fresh", True, State.RESUMING),
        ("retry", True, State.RESUMING),
        ("resume", True, State.RESUMING),
    ],
)
def test_back_state(kind: str, from_running: bool, back: State) -> None:
    assert back_state(kind, from_running) is back
    t = decide_not_started(kind, 0, None, "local", "peer_refused:busy", NOW, from_running=from_running)
    assert t == Transition(
        back, "peer_refused:busy", fields={"no_start": 1}, backoff=Backoff(1, NOW + backoff_delay(1), "peer_refused")
    )


def test_never_started_cap_asks_a_human() -> None:
    t = decide_not_started(
        "retry", NEVER_STARTED_CAP - 1, Backoff(1, NOW, "start_failed"), "mini", "start_failed:boom", NOW
    )
    assert t.to is State.NEEDS_HUMAN and t.terminal
    assert t.cause == (
        f"never_started:{NEVER_STARTED_CAP} attempts in a row didn't start; the last was start_failed:boom on mini"
    )
    assert t.fields == {"no_start": NEVER_STARTED_CAP}
    assert t.backoff == Backoff(2, NOW + backoff_delay(2), "start_failed")


def test_the_constants_are_read_when_deciding(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests shorten the waits by patching fleetrun.decide (as the acceptance tests do)."""
    monkeypatch.setattr("fleetrun.decide.USAGE_BACKOFF_S", 1.0)
    monkeypatch.setattr("fleetrun.decide.NEVER_STARTED_CAP", 2)
    assert next_pause(None, None, NOW) == (NOW + 1.0, 1)
    assert decide_not_started("fresh", 1, None, "local", "start_failed:x", NOW).to is State.NEEDS_HUMAN


# -- attempts delivered to a role's mailbox (the mailbox plugin's host) ---------------


def test_a_role_reporting_done_is_verified_like_an_agent_that_exited() -> None:
    t = decide_end(ended("exited", AgentResult(ok=True, result_text="wrote it"), host="mailbox"))
    assert t is not None and (t.to, t.cause, t.verify) == (State.VERIFYING, "exited", True)


def test_a_role_reporting_failure_needs_a_human_with_its_reason() -> None:
    t = decide_end(delivered(MAILBOX_FAILED, error="the schema is not mine"))
    assert t is not None and (t.to, t.cause) == (State.NEEDS_HUMAN, "mailbox_failed:the schema is not mine")
    t = decide_end(delivered(MAILBOX_FAILED))
    assert t is not None and t.cause == "mailbox_failed:the role reported a failure"


def test_an_unclaimed_message_is_spawned_next_without_using_a_retry_or_resume() -> None:
    t = decide_end(delivered(MAILBOX_UNCLAIMED, error="role relay did not claim it in 300s", resumes=RESUME_CAP))
    assert t is not None and t.to is State.RESUMING  # even with every resume used: it never ran
    assert t.cause == "mailbox_unclaimed:role relay did not claim it in 300s"
    assert dict(t.fields) == {} and t.backoff is None and not t.ran


def test_claimed_but_never_reported_needs_a_human() -> None:
    t = decide_end(delivered(MAILBOX_CLAIMED_NO_COMPLETION, error="claimed and reported nothing"))
    assert t is not None and (t.to, t.cause) == (State.NEEDS_HUMAN, "mailbox_claimed_no_completion")


def test_a_withdrawn_message_after_a_cancel_changes_nothing() -> None:
    assert decide_end(delivered(MAILBOX_WITHDRAWN, task_state=State.CANCELLED)) is None
    t = decide_end(delivered(MAILBOX_WITHDRAWN, error="gone"))
    assert t is not None and (t.to, t.cause) == (State.NEEDS_HUMAN, "mailbox_withdrawn:gone")


def test_a_session_the_agent_could_not_find_is_resumed_as_a_died_one() -> None:
    """``session_not_found`` (a --resume the CLI found no conversation for) is resumed;
    what makes the next attempt fresh is that it is not offered that session
    (starting.py), not a decision here."""
    t = decide_end(ended("exited", failed("session_not_found"), resumes=1))
    assert (t.to, t.cause, t.fields, t.ran) == (State.RESUMING, "session_died:session_not_found", {"resumes": 2}, True)

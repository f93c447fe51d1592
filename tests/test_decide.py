"""The loop's one decision, as a table: state x observation -> actions, without processes.

Every (state, observation kind) pair has a row (``test_the_table_covers_every_state_and_observation``
fails when a state or an observation is added without one). The attempt-end details
(usage limits, rate limits, resume caps, the mailbox's ends...) are ``tests/test_outcomes.py``'s.
"""

from __future__ import annotations

from typing import Any

import pytest

from fleetrun.decide import (
    ACTIONS,
    NEVER_STARTED_CAP,
    OBSERVATIONS,
    RESUME_CAP,
    SPACE_RETRY_S,
    AttemptEnded,
    BackOff,
    CleanUp,
    Collect,
    Collected,
    Drop,
    Facts,
    HandOff,
    HandoffMade,
    LeaseFound,
    Move,
    Note,
    NoteKeptWorktree,
    NotStarted,
    Observation,
    PauseHost,
    Placed,
    Ran,
    RunSetupStep,
    SetupStepEnded,
    StartAgent,
    StartAttempt,
    StartUnconfirmed,
    StartVerifier,
    VerdictGiven,
    VerifierWait,
    WaitFor,
    decide,
    pause_text,
)
from fleetrun.placement import Backoff, backoff_delay
from fleetrun.reports import PERMANENT, TRANSIENT, AgentEnd, AgentResult
from fleetrun.states import PLACEABLE, State

NOW = 1_000_000.0
S = State
EXITED = AttemptEnded({"state": "ended", "reason": "exited", "exit_code": 0}, AgentResult(ok=True))
DIED = AttemptEnded({"state": "died"}, None)


def facts(state: State, **kw: Any) -> Facts:
    kw.setdefault("now", NOW)
    kw.setdefault("clock_now", NOW)
    return Facts(state=state, name="t1", **kw)


def kinds(actions: list[Any]) -> list[str]:
    return [type(a).__name__ for a in actions]


def bo(n: int, cause: str) -> Backoff:
    return Backoff(n, NOW + backoff_delay(n), cause)


#: (state, facts' other fields, observation, the actions expected)
TABLE: list[tuple[State, dict[str, Any], Observation, list[Any]]] = [
    # -- an attempt ended: only a RUNNING task's end moves it ------------------------------
    (S.RUNNING, {}, EXITED, [Ran(), Collect()]),
    (S.RUNNING, {"resumes": 1}, DIED, [Ran(), Move(S.RESUMING, "session_died:died", fields={"resumes": 2})]),
    (S.RUNNING, {"resumes": RESUME_CAP}, DIED, [Ran(), Move(S.NEEDS_HUMAN, "resume_cap:session_died:died"), CleanUp()]),
    (
        S.RUNNING,
        {},
        AttemptEnded({"state": "ended", "reason": "exited"}, AgentResult(ok=False, end=AgentEnd.pause_host(NOW + 600))),
        [
            Ran(),
            PauseHost(NOW + 600, 1, f"usage_limit:{pause_text(NOW + 600)}"),
            Move(S.RESUMING, f"usage_limit:{pause_text(NOW + 600)}"),
        ],
    ),
    *[(s, {}, EXITED, []) for s in State if s is not S.RUNNING],
    # -- an attempt did not start: ASSIGNED goes back and backs off; else only the backoff -
    (
        S.ASSIGNED,
        {},
        NotStarted("start_failed:boom"),
        [BackOff(bo(1, "start_failed")), Move(S.READY, "start_failed:boom", fields={"no_start": 1})],
    ),
    (
        S.ASSIGNED,
        {"kind": "retry"},
        NotStarted("peer_refused:full"),
        [BackOff(bo(1, "peer_refused")), Move(S.RETRYING, "peer_refused:full", fields={"no_start": 1})],
    ),
    (
        S.ASSIGNED,
        {"kind": "resume", "no_start": NEVER_STARTED_CAP - 1},
        NotStarted("start_failed:x"),
        [
            BackOff(bo(1, "start_failed")),
            Move(
                S.NEEDS_HUMAN,
                f"never_started:{NEVER_STARTED_CAP} attempts in a row didn't start; the last was "
                "start_failed:x on local",
                fields={"no_start": NEVER_STARTED_CAP},
            ),
            CleanUp(),
        ],
    ),
    (
        S.ASSIGNED,
        {},
        NotStarted("agent_not_found:claude", at_once=True),
        [Move(S.NEEDS_HUMAN, "agent_not_found:claude"), CleanUp()],
    ),
    *[(s, {}, NotStarted("start_failed:boom"), [BackOff(bo(1, "start_failed"))]) for s in State if s is not S.ASSIGNED],
    # -- the ended attempt's work is collected ----------------------------------------------
    (S.RUNNING, {}, Collected(), [Move(S.VERIFYING, "exited"), StartVerifier(0)]),
    (
        S.RUNNING,
        {},
        Collected(error="git failed"),
        [Note("could not commit the attempt's work: git failed"), Move(S.VERIFYING, "exited"), StartVerifier(0)],
    ),
    (
        S.RUNNING,
        {},
        Collected(tampered="gitdir:\x1b/elsewhere"),
        [
            Move(
                S.NEEDS_HUMAN,
                "worktree_tampered:gitdir:\\x1b/elsewhere; nothing was committed",
                outcome="worktree_tampered",
            ),
            NoteKeptWorktree(),
            CleanUp(),
        ],
    ),
    *[(s, {}, Collected(), [Drop()]) for s in State if s is not S.RUNNING],
    # -- a verifier answered -------------------------------------------------------------
    (S.VERIFYING, {"verifiers": 2}, VerdictGiven(0, True, "tests"), [StartVerifier(1)]),
    (S.VERIFYING, {"verifiers": 2}, VerdictGiven(1, True, "lint"), [HandOff()]),
    (
        S.VERIFYING,
        {"max_retries": 2, "retries": 1},
        VerdictGiven(0, False, "tests", "1 failed"),
        [Move(S.RETRYING, "verify_fail:tests: 1 failed", attempt_state="verified", fields={"retries": 2})],
    ),
    (
        S.VERIFYING,
        {"max_retries": 1, "retries": 1},
        VerdictGiven(0, False, "tests", "1 failed"),
        [Move(S.NEEDS_HUMAN, "retries_exhausted:tests: 1 failed", attempt_state="verified"), CleanUp()],
    ),
    (
        S.VERIFYING,
        {},
        VerdictGiven(0, False, "brain", error=PERMANENT, reason="no key"),
        [
            Move(
                S.NEEDS_HUMAN,
                "verifier_error:brain: no key",
                attempt_state="verified",
                info={
                    "verify_wait": None,
                    "verify_error": {"idx": 0, "label": "brain", "error": PERMANENT, "reason": "no key", "tries": 1},
                },
            ),
            CleanUp(),
        ],
    ),
    (
        S.VERIFYING,
        {},
        VerdictGiven(0, False, "brain", error=TRANSIENT, reason="503", prev_tries=1, backoff_s=30.0),
        [VerifierWait(0, 2, NOW + 60.0, "503")],
    ),
    (
        S.VERIFYING,
        {},
        VerdictGiven(0, False, "brain", error=TRANSIENT, reason="disk", prev_tries=1, space=True),
        [VerifierWait(0, 1, NOW + SPACE_RETRY_S, "disk")],
    ),
    (
        S.VERIFYING,
        {},
        VerdictGiven(0, False, "brain", error=TRANSIENT, reason="503", prev_tries=4, limit=5),
        [
            Move(
                S.NEEDS_HUMAN,
                "verifier_error:brain: 503 (tried 5 times)",
                attempt_state="verified",
                info={
                    "verify_wait": None,
                    "verify_error": {"idx": 0, "label": "brain", "error": TRANSIENT, "reason": "503", "tries": 5},
                },
            ),
            CleanUp(),
        ],
    ),
    *[(s, {}, VerdictGiven(0, True, "tests"), [Drop()]) for s in State if s is not S.VERIFYING],
    # -- the handoff is made ---------------------------------------------------------------
    (
        S.VERIFYING,
        {"verifiers": 1},
        HandoffMade({"summary": "s"}),
        [Move(S.DONE, "verify_pass", attempt_state="verified", fields={"handoff": {"summary": "s"}}), CleanUp()],
    ),
    (S.VERIFYING, {"verifiers": 0}, HandoffMade(None), [Move(S.DONE, "exited", attempt_state="verified"), CleanUp()]),
    *[(s, {}, HandoffMade(None), [Drop()]) for s in State if s is not S.VERIFYING],
    # -- a setup step ended ----------------------------------------------------------------
    (S.ASSIGNED, {}, SetupStepEnded(0, 2, True), [RunSetupStep(1)]),
    (S.ASSIGNED, {}, SetupStepEnded(1, 2, True), [StartAgent()]),
    (
        S.ASSIGNED,
        {},
        SetupStepEnded(0, 1, False, label="make env", reason="exit code 2", out="/a/setup-1.out"),
        [
            Move(
                S.NEEDS_HUMAN, "setup_failed:make env: exit code 2", attempt_state="abandoned", outcome="setup_failed"
            ),
            Note(
                "setup command 1 failed (exit code 2); its output is in /a/setup-1.out; fix the command or the "
                "environment, then `fleetrun retry t1` (setup runs again from the start)"
            ),
            CleanUp(),
        ],
    ),
    (
        S.ASSIGNED,
        {},
        SetupStepEnded(0, 1, False, baseline=True, label="tests", reason="exit code 1"),
        [
            Move(
                S.NEEDS_HUMAN, "baseline_fails:tests: exit code 1", attempt_state="abandoned", outcome="baseline_fails"
            ),
            Note(
                "verifier 'tests' already fails on the base commit (exit code 1), before any agent run; fix the "
                'base, or set baseline = "warn" or false, then `fleetrun retry t1`'
            ),
            CleanUp(),
        ],
    ),
    *[(s, {}, SetupStepEnded(0, 1, True), [Drop()]) for s in State if s is not S.ASSIGNED],
    # -- placement answered ----------------------------------------------------------------
    *[(s, {}, Placed(host="local"), [StartAttempt("local")]) for s in State if s in PLACEABLE],
    (S.READY, {}, Placed(wait="no free slot", until=NOW + 5), [WaitFor("no free slot", NOW + 5, None)]),
    (S.READY, {}, Placed(), [WaitFor("no plugin places tasks", None, "no plugin places tasks")]),
    (
        S.RETRYING,
        {},
        Placed(host="local", budget=1.0, spent=1.0),
        [Move(S.NEEDS_HUMAN, "budget_exhausted:spent $1.00 of $1.00"), CleanUp()],
    ),
    *[(s, {}, Placed(host="local"), []) for s in State if s not in PLACEABLE],
    # -- a restart found a lease whose shepherd never started -------------------------------
    (S.ASSIGNED, {"kind": "fresh"}, LeaseFound(), [Move(S.READY, "lease_expired:never started")]),
    (S.ASSIGNED, {"kind": "resume"}, LeaseFound(), [Move(S.RESUMING, "lease_expired:never started")]),
    *[(s, {}, LeaseFound(), []) for s in State if s is not S.ASSIGNED],
    # -- an attempt runs whose start was never recorded --------------------------------------
    (S.ASSIGNED, {}, StartUnconfirmed(), [Move(S.RUNNING, "adopted")]),
    *[(s, {}, StartUnconfirmed(), []) for s in State if s is not S.ASSIGNED],
]


@pytest.mark.parametrize(
    ("state", "extra", "obs", "want"),
    TABLE,
    ids=[f"{s.value}-{type(o).__name__}-{i}" for i, (s, _, o, _w) in enumerate(TABLE)],
)
def test_decide(state: State, extra: dict[str, Any], obs: Observation, want: list[Any]) -> None:
    assert decide(facts(state, **extra), obs) == want


def test_the_table_covers_every_state_and_observation() -> None:
    rows = {(s, type(o)) for s, _, o, _w in TABLE}
    missing = [(s.value, k.__name__) for s in State for k in OBSERVATIONS if (s, k) not in rows]
    assert not missing, f"no row in TABLE for: {missing}"


def test_every_action_is_decided_somewhere() -> None:
    """Each action kind is the answer of at least one row (or it is dead vocabulary)."""
    seen = {type(a) for _, _, _, want in TABLE for a in want}
    assert set(ACTIONS) - seen == set()


def test_every_action_says_what_a_crash_in_it_leaves() -> None:
    for kind in ACTIONS:
        assert "Crash:" in (kind.__doc__ or ""), kind.__name__


def test_a_move_is_compare_and_set_from_the_state_read() -> None:
    """The decision names the state it moves to, never from: the ledger refuses a move of a
    task that left the state it was read in (a cancel from another shell)."""
    assert all(isinstance(a, (Ran, Collect)) for a in decide(facts(S.RUNNING), EXITED))
    assert kinds(decide(facts(S.CANCELLED), EXITED)) == []


def test_decide_refuses_what_is_not_an_observation() -> None:
    with pytest.raises(TypeError):
        decide(facts(S.READY), "exited")  # type: ignore[arg-type]


def test_durability_doc_has_a_row_for_every_action() -> None:
    """docs/durability.md, "Crash safety per action": one row per action of the decision."""
    from pathlib import Path

    doc = (Path(__file__).resolve().parent.parent / "docs" / "durability.md").read_text()
    section = doc.split("### Crash safety per action", 1)[1].split("\n### ", 1)[0]
    rows = {line.split("|")[1].strip().strip("`") for line in section.splitlines() if line.startswith("| `")}
    assert rows == {kind.__name__ for kind in ACTIONS}

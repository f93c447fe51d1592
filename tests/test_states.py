"""The state machine and the cause vocabulary; and the ledger applying the machine."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetrun.ledger import Ledger
from fleetrun.states import (
    ACTIVE,
    ALLOWED,
    CAUSES,
    PLACEABLE,
    TERMINAL,
    State,
    allowed,
    cause,
    cause_word,
    is_valid_cause,
)
from fleetrun.taskspec import TaskSpec

ALL_PAIRS = [(src, dst) for src in State for dst in State]


def test_every_state_has_an_entry() -> None:
    assert set(ALLOWED) == set(State)


@pytest.mark.parametrize(("src", "dst"), [(s, d) for s in ALLOWED for d in sorted(ALLOWED[s])])
def test_listed_transitions_are_allowed(src: State, dst: State) -> None:
    assert allowed(src, dst)


def test_nothing_else_is_allowed() -> None:
    forbidden = [(s, d) for s, d in ALL_PAIRS if d not in ALLOWED[s]]
    assert not [(s, d) for s, d in forbidden if allowed(s, d)]
    # no state moves to itself, and nothing goes back to PENDING from a running attempt
    assert not any(allowed(s, s) for s in State)
    assert not any(allowed(s, State.PENDING) for s in ACTIVE)


def test_terminal_states() -> None:
    assert {State.DONE, State.NEEDS_HUMAN, State.CANCELLED} == TERMINAL
    assert [s for s in State if s.terminal] == [State.DONE, State.NEEDS_HUMAN, State.CANCELLED]
    assert ALLOWED[State.DONE] == frozenset()
    # the operator's ways out: retry (READY / PENDING; VERIFYING after a verifier_error:
    # the kept work is judged again), approve (DONE), cancel
    assert ALLOWED[State.NEEDS_HUMAN] == {State.READY, State.PENDING, State.VERIFYING, State.DONE, State.CANCELLED}
    assert ALLOWED[State.CANCELLED] == {State.READY, State.PENDING}


def test_done_is_reached_only_through_verifying_or_approval() -> None:
    assert {s for s in State if allowed(s, State.DONE)} == {State.VERIFYING, State.NEEDS_HUMAN}


def test_an_attempt_starts_only_from_a_placeable_state() -> None:
    assert {s for s in State if allowed(s, State.ASSIGNED)} == PLACEABLE
    assert {s for s in State if allowed(s, State.RUNNING)} == {State.ASSIGNED}


def test_every_non_terminal_state_can_end() -> None:
    """From anywhere, the operator can cancel, and the loop can give up to a human."""
    for s in State:
        if s is not State.DONE:
            assert allowed(s, State.CANCELLED) or s is State.CANCELLED
        if not s.terminal:
            assert allowed(s, State.NEEDS_HUMAN)


def test_state_str() -> None:
    assert str(State.NEEDS_HUMAN) == "NEEDS_HUMAN"
    assert State("READY") is State.READY
    assert f"{State.READY}" == "READY"


# -- causes -------------------------------------------------------------------------------


def test_cause_builds_word_and_detail() -> None:
    assert cause("verify_fail", "cargo test") == "verify_fail:cargo test"
    assert cause("peer_refused", "mini") == "peer_refused:mini"
    assert cause("never_started") == "never_started"
    assert cause("never_started", "") == "never_started"
    assert cause("verify_fail", "a: b:c") == "verify_fail:a: b:c"
    assert cause_word("verify_fail:a: b:c") == "verify_fail"
    assert cause_word("session_died") == "session_died"


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "Verify_fail",
        "verify fail",
        "verify-fail",
        "1st",
        "_x",
        "verify_fail:cargo",
        ":x",
        "é",
        " placed",
        "placed ",
    ],
)
def test_cause_rejects_bad_words(bad: str) -> None:
    with pytest.raises(ValueError, match="snake_case"):
        cause(bad, "detail")


def test_cause_rejects_a_trailing_newline() -> None:
    assert not is_valid_cause("queued\n")
    with pytest.raises(ValueError):
        cause("queued\n")


def test_the_vocabulary_is_snake_case() -> None:
    for word in CAUSES:
        assert cause(word) == word
        assert is_valid_cause(word)
        assert cause_word(cause(word, "x")) == word
    for word in (
        "queued",
        "placed",
        "started",
        "verify_pass",
        "verify_fail",
        "session_died",
        "retries_exhausted",
        "operator_cancel",
        "operator_retry",
        "operator_approve",
        "never_started",
        "dependency_cancelled",
    ):
        assert word in CAUSES


def test_plugins_declare_their_own_cause_words() -> None:
    """The core's vocabulary names no plugin's ends: an agent's (Claude Code's
    ``rate_limited``, ``max_turns``...) and the mailbox's are their plugins' ``CAUSE_WORDS``,
    which the run's vocabulary collects from the loaded plugins."""
    from fleetrun.pluginmanager import FleetPluginManager, cause_words

    pm = FleetPluginManager()
    pm.consider_builtins()
    pm.load_deferred()
    words = cause_words(pm)
    assert {
        "mailbox_claimed_no_completion",
        "mailbox_unclaimed",
        "rate_limited",
        "max_turns",
        "agent_rejected_arguments",
    } <= words
    assert not {w for w in CAUSES if w.startswith("mailbox_")}
    assert words >= CAUSES
    for word in words:
        assert cause(word) == word


WORDS = st.from_regex(r"[a-z][a-z0-9_]{0,20}", fullmatch=True)


@given(word=WORDS, detail=st.text(max_size=40))
def test_cause_roundtrip(word: str, detail: str) -> None:
    text = cause(word, detail)
    assert is_valid_cause(text)
    assert cause_word(text) == word
    if detail:
        assert text.split(":", 1)[1] == detail


@given(word=st.text(min_size=1, max_size=20).filter(lambda w: not w.endswith("\n")))
def test_cause_accepts_only_snake_case(word: str) -> None:
    good = word[0] in "abcdefghijklmnopqrstuvwxyz" and all(c in "abcdefghijklmnopqrstuvwxyz0123456789_" for c in word)
    if good:
        assert cause(word) == word
    else:
        with pytest.raises(ValueError):
            cause(word)


# -- random walks through a real ledger ------------------------------------------------


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ledger]:
    with Ledger(tmp_path_factory.mktemp("states") / "home" / "state.db") as led:
        yield led


def _spec(name: str, *deps: str) -> TaskSpec:
    return TaskSpec(name=name, prompt="p", cwd="/repo", depends_on=list(deps))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), steps=st.integers(min_value=0, max_value=25))
def test_random_walks_through_a_ledger(ledger: Ledger, data: st.DataObject, steps: int) -> None:
    """Any walk the machine allows is applied; the log replays as that same walk."""
    _, task = ledger.add_tasks([_spec("dep"), _spec("walker", "dep")])
    assert task.state == State.PENDING
    walk = [State.PENDING]
    leases = 0
    for _ in range(steps):
        here = walk[-1]
        if not ALLOWED[here]:
            break  # DONE
        to = data.draw(st.sampled_from(sorted(ALLOWED[here])), label=f"from {here}")
        word = data.draw(st.sampled_from(sorted(CAUSES)), label="cause")
        if to == State.ASSIGNED and data.draw(st.booleans(), label="via lease"):
            att = ledger.lease(task.id, here, host="h", kind="fresh", cause=cause(word, "walk"))
            leases += 1
            assert att.number == leases
            assert att.id == f"{task.id}_a{leases}"
        else:
            prev = ledger.transition(task.id, here, to, cause(word, "walk"))
            assert prev == here
        walk.append(to)

    got = ledger.get(task.id)
    assert got is not None and got.state == walk[-1]
    rows = ledger.transitions(task.id)
    assert len(rows) == len(walk)
    assert (rows[0].from_state, rows[0].to_state, rows[0].cause) == (None, "PENDING", "queued")
    for prev_row, row in zip(rows, rows[1:]):
        assert row.from_state == prev_row.to_state
        assert allowed(State(row.from_state), State(row.to_state))
        assert is_valid_cause(row.cause)
    assert [State(r.to_state) for r in rows] == walk
    assert [r.id for r in rows] == sorted(r.id for r in rows)
    assert [a.number for a in ledger.attempts(task.id)] == list(range(1, leases + 1))
    assert got.attempts == leases


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(src=st.sampled_from(list(State)), dst=st.sampled_from(list(State)))
def test_ledger_enforces_exactly_the_machine(ledger: Ledger, src: State, dst: State) -> None:
    """Put a task in ``src`` by an allowed path, then try ``src -> dst``."""
    path = {
        State.PENDING: [],
        State.READY: [State.READY],
        State.ASSIGNED: [State.READY, State.ASSIGNED],
        State.RUNNING: [State.READY, State.ASSIGNED, State.RUNNING],
        State.VERIFYING: [State.READY, State.ASSIGNED, State.RUNNING, State.VERIFYING],
        State.RETRYING: [State.READY, State.ASSIGNED, State.RETRYING],
        State.RESUMING: [State.READY, State.ASSIGNED, State.RESUMING],
        State.DONE: [State.READY, State.ASSIGNED, State.RUNNING, State.VERIFYING, State.DONE],
        State.NEEDS_HUMAN: [State.NEEDS_HUMAN],
        State.CANCELLED: [State.CANCELLED],
    }[src]
    _, task = ledger.add_tasks([_spec("dep"), _spec("t", "dep")])
    here = State.PENDING
    for to in path:
        ledger.transition(task.id, here, to, "operator_retry")
        here = to
    before = len(ledger.transitions(task.id))
    if allowed(src, dst):
        ledger.transition(task.id, src, dst, "operator_retry")
        assert len(ledger.transitions(task.id)) == before + 1
    else:
        with pytest.raises(ValueError, match="not allowed"):
            ledger.transition(task.id, src, dst, "operator_retry")
        assert len(ledger.transitions(task.id)) == before
    got = ledger.get(task.id)
    assert got is not None and got.state == (dst if allowed(src, dst) else src)


def test_the_architecture_docs_state_table_is_states_py() -> None:
    """docs/architecture.md's state table lists every state in ``STATE_ORDER`` with the
    moves ``ALLOWED`` lets it make: the doc is checked against the data, not copied."""
    from pathlib import Path

    from fleetrun.states import ALLOWED, STATE_ORDER

    doc = (Path(__file__).resolve().parent.parent / "docs" / "architecture.md").read_text()
    rows: list[tuple[str, set[str]]] = []
    for line in doc.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 2 and cells[0] in {s.value for s in State}:
            rows.append((cells[0], set() if cells[1] == "—" else {c.strip() for c in cells[1].split(",")}))
    assert [r[0] for r in rows] == [s.value for s in STATE_ORDER]
    for name, moves in rows:
        assert moves == {s.value for s in ALLOWED[State(name)]}, name

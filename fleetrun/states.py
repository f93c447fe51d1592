"""Task states, the transitions allowed between them, and the cause vocabulary.

Pure data: nothing here touches the ledger or a process.
"""

from __future__ import annotations

import enum
import re


class State(str, enum.Enum):
    PENDING = "PENDING"  # waiting for dependencies
    READY = "READY"  # waiting for a place
    ASSIGNED = "ASSIGNED"  # placed; the attempt is starting
    RUNNING = "RUNNING"
    VERIFYING = "VERIFYING"
    RETRYING = "RETRYING"  # a verifier failed; the next attempt gets the failure
    RESUMING = "RESUMING"  # the session died; the next attempt assesses first
    DONE = "DONE"
    NEEDS_HUMAN = "NEEDS_HUMAN"
    CANCELLED = "CANCELLED"

    def __str__(self) -> str:
        return self.value

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({State.DONE, State.NEEDS_HUMAN, State.CANCELLED})
#: States in which an attempt may be alive.
ACTIVE = frozenset({State.ASSIGNED, State.RUNNING, State.VERIFYING})
#: States waiting for a place (the next attempt).
PLACEABLE = frozenset({State.READY, State.RETRYING, State.RESUMING})

S = State
ALLOWED: dict[State, frozenset[State]] = {
    S.PENDING: frozenset({S.READY, S.NEEDS_HUMAN, S.CANCELLED}),
    S.READY: frozenset({S.ASSIGNED, S.PENDING, S.NEEDS_HUMAN, S.CANCELLED}),
    S.ASSIGNED: frozenset({S.RUNNING, S.READY, S.RETRYING, S.RESUMING, S.NEEDS_HUMAN, S.CANCELLED}),
    S.RUNNING: frozenset({S.VERIFYING, S.RESUMING, S.NEEDS_HUMAN, S.CANCELLED}),
    S.VERIFYING: frozenset({S.DONE, S.RETRYING, S.RESUMING, S.NEEDS_HUMAN, S.CANCELLED}),
    S.RETRYING: frozenset({S.ASSIGNED, S.NEEDS_HUMAN, S.CANCELLED}),
    S.RESUMING: frozenset({S.ASSIGNED, S.NEEDS_HUMAN, S.CANCELLED}),
    S.DONE: frozenset(),
    # VERIFYING: `retry` of a task a verifier could not judge re-verifies its kept work
    S.NEEDS_HUMAN: frozenset({S.READY, S.PENDING, S.VERIFYING, S.DONE, S.CANCELLED}),
    S.CANCELLED: frozenset({S.READY, S.PENDING}),
}


#: The order states are counted in for a person (a run's summary line, ``=== 2 done, 1
#: needs_human ... ===``): the ends first, then what is in flight, then what waits.
#: docs/architecture.md's state table lists them in this order, with ``ALLOWED``
#: (``tests/test_states.py`` checks the two agree).
STATE_ORDER: tuple[State, ...] = (
    S.DONE,
    S.NEEDS_HUMAN,
    S.CANCELLED,
    S.RUNNING,
    S.VERIFYING,
    S.READY,
    S.PENDING,
    S.RETRYING,
    S.RESUMING,
    S.ASSIGNED,
)
assert set(STATE_ORDER) == set(State) and len(STATE_ORDER) == len(State)


def allowed(src: State, dst: State) -> bool:
    """Whether the state machine allows ``src -> dst``."""
    return dst in ALLOWED[src]


# The core's cause vocabulary: snake_case words, optionally followed by ``:detail``. A
# plugin's own words (an agent's ends, a mailbox's) are its ``CAUSE_WORDS``, which
# :func:`fleetrun.pluginmanager.cause_words` adds to these.
CAUSES = frozenset(
    {
        "queued",
        "dependencies_done",
        "placed",
        "started",
        "exited",
        "verify_pass",
        "verify_fail",
        "session_died",
        "timeout",
        "stalled",
        "usage_limit",
        "peer_refused",
        "start_failed",
        "agent_not_found",  # the agent's executable is missing or cannot be run: never retried
        "workspace_failed",  # a workspace that cannot be made until someone changes something
        "merge_conflict",  # base = "dependencies": merging a dependency's branch stopped on a conflict
        "never_started",
        "retries_exhausted",
        "resume_cap",
        "budget_exhausted",
        "dependency_cancelled",
        "dependency_needs_human",
        "operator_cancel",
        "operator_retry",
        "operator_approve",
        "adopted",
        "lease_expired",
        "worktree_tampered",
        "plugin_missing",
        "internal_error",
        "setup_failed",
        "baseline_fails",  # a run verifier fails on the base commit, with nothing finer known
        "verifier_error",  # a verifier could not judge (not found, unreachable...): not the agent's failure
        "unchanged",  # queued DONE: the same definition as a DONE task of the file's last run
    }
)

_CAUSE_RE = re.compile(r"^[a-z][a-z0-9_]*(:.*)?$", re.DOTALL)


def cause(word: str, detail: str | None = None) -> str:
    """Build a cause string, ``word`` or ``word:detail``.

    :raises ValueError: if ``word`` is not snake_case.
    """
    if not _CAUSE_RE.fullmatch(word) or ":" in word:
        raise ValueError(f"cause must be snake_case: {word!r}")
    return f"{word}:{detail}" if detail else word


def cause_word(text: str) -> str:
    """The snake_case word of a cause, without its detail."""
    return text.split(":", 1)[0]


def is_valid_cause(text: str) -> bool:
    return bool(_CAUSE_RE.fullmatch(text))

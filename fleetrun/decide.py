"""The loop's one decision: ``(task, its attempt, what was observed) -> actions``.

:func:`decide` is a pure function of plain data: the task's :class:`Facts` (its state,
its counters, its attempt's kind and host, the backoff and pause known, the clocks)
and one observation (an attempt ended or did not start, its work was collected, a
verifier or a setup step answered, the handoff was made, placement answered, a
restart found a lease or a start not confirmed). It returns a list of
:data:`Action` (move to a state with a cause, back off, pause a host, collect, start a
verifier, run a setup step, start the agent, hand off, clean up, wait, note). Nothing
here reads the ledger, a clock or a process: the stages gather the observation and
apply the actions (:class:`fleetrun.loop.Loop.apply`), so every decision is tested
without processes (``tests/test_decide.py``, a table of every state and observation;
``tests/test_outcomes.py`` for the attempt-end details).

Each action says in its docstring what a restart finds if the process dies in the
middle of applying it, and how the loop completes or redoes it (docs/durability.md,
"Crash safety per action").
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Optional

from .placement import Backoff, backoff_delay
from .records import VERIFY_ERROR, VERIFY_WAIT
from .reports import MIN_BUDGET_USD, PERMANENT, AgentEnd, AgentResult
from .states import PLACEABLE, State, cause
from .verdicttext import baseline_fails_cause, failed_cause, setup_failed_cause

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
BACK_STATE_FROM_RUNNING: Mapping[str, State] = {
    "fresh": State.RESUMING,
    "retry": State.RESUMING,
    "resume": State.RESUMING,
}

#: The cause word of an attempt that ended without a usable result, by the shepherd's reason.
_FAILURE_WORD = {
    "timeout": "timeout",
    "stalled": "stalled",
    "cancelled": "session_died",
    "stopped": "session_died",
    "died": "session_died",
}


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
    row. The same reset time as the pause ``prev`` is that pause, not one more: another
    task's end in the same limit, or this end decided again after a crash between its
    pause and its move (which, its reset passed meanwhile, would otherwise pause the
    machine for minutes more: found by ``test_crash_point_after_a_usage_pause_is_recorded``).
    :return: ``(until, count)``."""
    if prev is not None and until is not None and prev[0] == until:
        return prev
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


def decide_not_started(
    kind: str, no_start: int, backoff: Optional[Backoff], host: str, cause: str, now: float, from_running: bool = False
) -> Transition:
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
        return Transition(
            State.NEEDS_HUMAN,
            f"never_started:{count} attempts in a row didn't start; the last was {cause} on {host}",
            fields={"no_start": count},
            backoff=bo,
        )
    return Transition(back_state(kind, from_running), cause, fields={"no_start": count}, backoff=bo)


def decide_end(e: Ended) -> Optional[Transition]:
    """The transition of a task whose attempt ended. :return: None when there is nothing
    to do (the task left RUNNING meanwhile, a cancel).

    The shepherd's reasons are the core's (a start that failed, a timeout, a stall, a
    death); what the agent's output says is its plugin's, classified into
    :class:`~fleetrun.reports.AgentEnd` (``result.end``): a usage limit, a rate limit or
    a cap it reached holds whatever stopped the process; the rest holds unless the
    shepherd stopped it."""
    if e.task_state is not State.RUNNING:
        return None
    reason = end_reason(e.status)
    res = e.result
    error = e.status.get("error")
    if reason == "start_failed:agent_not_found":  # it can never start as things are: no backoff
        return Transition(State.NEEDS_HUMAN, f"agent_not_found:{error or 'the agent cannot be run'}")
    if (reason or "").startswith("start_failed"):
        return decide_not_started(
            e.kind,
            e.no_start,
            e.backoff,
            e.host,
            f"start_failed:{error or 'the agent did not start'}",
            e.now,
            from_running=True,
        )
    end = res.end if res is not None else None
    if end is not None and (
        reason not in _FAILURE_WORD or end.kind in ("pause_host", "back_off") or (end.kind == "give_up" and end.ran)
    ):
        t = _from_end(e, end)
        if t is not None:
            return t
    # from here on it ran: that machine is good for this task again
    outcome = attempt_outcome(reason, res)
    if outcome != "ok":
        word = _FAILURE_WORD.get(reason or "", "session_died")
        detail = None if word in ("timeout", "stalled") else (outcome if outcome != reason else reason)
        return replace(resume_or_give_up(e.resumes, f"{word}:{detail}" if detail else word), ran=True)
    return Transition(State.VERIFYING, "exited", ran=True, verify=True)


def _from_end(e: Ended, end: AgentEnd) -> Optional[Transition]:
    """The transition an agent plugin's :class:`~fleetrun.reports.AgentEnd` asks for
    (None for ``ok``: verified as any attempt that exited well)."""
    if end.kind == "give_up":
        return Transition(State.NEEDS_HUMAN, end.cause, ran=end.ran)
    if end.kind == "resume":
        if not end.counted:  # the session never saw the task: no retry or resume is used
            return Transition(State.RESUMING, end.cause, ran=end.ran)
        return replace(resume_or_give_up(e.resumes, end.cause), ran=end.ran)
    if end.kind == "pause_host":
        pause = next_pause(e.pause, end.until, e.clock_now)
        return Transition(State.RESUMING, f"usage_limit:{pause_text(pause[0])}", ran=True, pause=pause)
    if end.kind == "back_off":
        # no reset time: back off (1, 2, 4 ... 30 min), not a pause of the machine until a
        # made-up time; no resume is used, as for a usage limit
        word = end.cause.split(":", 1)[0]
        n = (e.backoff.count + 1) if e.backoff is not None and e.backoff.cause == word else 1
        until = e.now + min(USAGE_BACKOFF_MAX_S, USAGE_BACKOFF_S * 2 ** (n - 1))
        return Transition(State.RESUMING, end.cause, ran=True, backoff=Backoff(n, until, word))
    if end.kind == "not_started":
        return decide_not_started(e.kind, e.no_start, e.backoff, e.host, end.cause, e.now, from_running=True)
    return None


# -- the actions ---------------------------------------------------------------------
#
# Each action is plain data; the loop applies a list of them in order
# (:meth:`fleetrun.loop.Loop.apply`). A :class:`Move` the ledger refuses (the task moved
# meanwhile: a cancel from another shell) ends the list: what follows it was decided for
# the state the task has left.


@dataclass(frozen=True)
class Move:
    """Move the task to ``to`` with ``cause`` (one transaction: the transition, ``fields``
    on the task, and the attempt's ``attempt_state``/``outcome``/``info`` when set).

    Crash: the move is one SQLite commit; a restart finds the task before it (and
    decides again from what it finds: the recorded end, verdicts or lease) or after it.
    """

    to: State
    cause: str
    fields: Mapping[str, Any] = field(default_factory=dict)
    #: the attempt's own record, written in the move's transaction (``verified`` once
    #: its verdicts decide; ``abandoned`` when it did not start)
    attempt_state: Optional[str] = None
    outcome: Optional[str] = None
    #: keys merged into the attempt's ``info`` in the same transaction (None: removed)
    info: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Ran:
    """The agent ran: its machine is good for this task again (the task's backoff there
    is cleared) and the never-started count starts again at 0.

    Crash: the backoff is the run's memory only; the count is one write, redone by the
    restart's decision of the same recorded end."""


@dataclass(frozen=True)
class BackOff:
    """Try this task on its attempt's machine again only after ``backoff.until``.

    Crash: kept for the run only; a restart places the task at once (a start that
    fails again backs off again)."""

    backoff: Backoff


@dataclass(frozen=True)
class PauseHost:
    """Start nothing on the attempt's machine before ``until`` (a usage limit); ``count``
    pauses in a row.

    Crash: written to the ledger (``usage_pauses``) before the move; a restart waits
    for the same reset."""

    until: float
    count: int
    cause: str


@dataclass(frozen=True)
class Collect:
    """Commit the ended attempt's work (``fleetrun_collect_work``, perhaps off the loop's
    thread), then observe :class:`Collected`.

    Crash: the task stays RUNNING with its attempt ``ended`` until it is collected; a
    restart decides the recorded end again (adoption) and collects again (a commit of
    nothing new is no commit)."""


@dataclass(frozen=True)
class StartVerifier:
    """Start verifier ``idx`` of the task (its earlier verdicts are recorded).

    Crash: a verdict is recorded before the next verifier starts; a restart runs the
    first verifier without a verdict again from the start (its process, if local, is
    ended first)."""

    idx: int


@dataclass(frozen=True)
class VerifierWait:
    """Verifier ``idx`` could not judge: run it again at ``until`` (the loop's clock),
    saying ``reason``; ``tries`` so far.

    Crash: the wait is written to the attempt's ``info`` before it begins; a restart
    resumes the same wait."""

    idx: int
    tries: int
    until: float
    reason: str


@dataclass(frozen=True)
class HandOff:
    """Every verifier passed: make the handoff (``fleetrun_handoff``, perhaps off the
    loop's thread), then observe :class:`HandoffMade`.

    Crash: every verdict is recorded and the task is VERIFYING; a restart finds no
    verifier left and asks for the handoff again."""


@dataclass(frozen=True)
class RunSetupStep:
    """Run setup step ``idx`` (a setup command or a verifier's baseline) in the leased
    attempt's workspace.

    Crash: the attempt stays ``leased`` while setup runs; a restart abandons it (its
    recorded commands are ended) and the next attempt runs setup again from the start."""

    idx: int


@dataclass(frozen=True)
class StartAgent:
    """Every setup step passed (or none was needed): build the prompt and start the agent
    under a shepherd.

    Crash: before the shepherd starts the attempt is ``leased`` (abandoned by a
    restart, the task goes back); after, ``starting`` (the restart looks for its
    shepherd under its start lock and adopts it, or gives it up)."""


@dataclass(frozen=True)
class StartAttempt:
    """Placement chose ``host``: lease the task there (ASSIGNED), prepare its workspace,
    then setup or the agent.

    Crash: the lease is one commit with the move to ASSIGNED; a restart finds a
    ``leased`` attempt and gives it up (``lease_expired:never started``); a workspace
    half made is checked and completed on reuse."""

    host: str


@dataclass(frozen=True)
class WaitFor:
    """The task cannot be placed now: show ``reason`` when it changes, wake at ``until``.

    Crash: nothing durable but ``waits.json`` (rewritten each pass); a restart asks
    placement again."""

    reason: str
    until: Optional[float] = None
    operator: Optional[str] = None


@dataclass(frozen=True)
class Note:
    """A line in the task's notes (``fleetrun logs``).

    Crash: one commit after the move it explains; lost only with a crash between the
    two (the move's cause says the same in fewer words)."""

    text: str


@dataclass(frozen=True)
class NoteKeptWorktree:
    """The task's worktree is kept as the agent left it: say how to start over (the note
    names the worktree as the ledger holds it after the move).

    Crash: as :class:`Note`."""


@dataclass(frozen=True)
class CleanUp:
    """The task is terminal: cascade to its dependents (NEEDS_HUMAN, CANCELLED) and clean
    up its workspace (``fleetrun_cleanup_workspace``).

    Crash: a restart finds a DONE task whose worktree is still there and cleans it up
    (adoption); a dependent not yet cascaded is cascaded by the next promotion."""


@dataclass(frozen=True)
class Drop:
    """The task left the state the pending work was for (a cancel): forget its handle
    (a verifier or setup command is stopped); nothing else moves.

    Crash: nothing durable."""


Action = (
    Move
    | Ran
    | BackOff
    | PauseHost
    | Collect
    | StartVerifier
    | VerifierWait
    | HandOff
    | RunSetupStep
    | StartAgent
    | StartAttempt
    | WaitFor
    | Note
    | NoteKeptWorktree
    | CleanUp
    | Drop
)
#: Every action kind (docs/durability.md's table lists each, and a test checks it).
ACTIONS: tuple[type, ...] = (
    Move,
    Ran,
    BackOff,
    PauseHost,
    Collect,
    StartVerifier,
    VerifierWait,
    HandOff,
    RunSetupStep,
    StartAgent,
    StartAttempt,
    WaitFor,
    Note,
    NoteKeptWorktree,
    CleanUp,
    Drop,
)


# -- what the loop knows of the task ---------------------------------------------------


@dataclass(frozen=True)
class Facts:
    """The task and its attempt, as plain data.

    :ivar state: the task's state as read (a :class:`Move` is compare-and-set from it).
    :ivar name: the task's name (notes say how to retry it).
    :ivar kind: its attempt's kind (``fresh``, ``retry``, ``resume``).
    :ivar host: the machine the attempt runs (or was to run) on.
    :ivar attempt: the attempt's number.
    :ivar resumes, retries, no_start: the task's counters.
    :ivar max_retries: the task's ``max_retries``.
    :ivar verifiers: how many verifiers the task has.
    :ivar backoff: the task's backoff on ``host`` before this, if any.
    :ivar pause: ``host``'s usage pause ``(until, count)`` before this, if any.
    :ivar now: the wall clock, for backoffs; ``clock_now``: the loop's clock, for pauses.
    """

    state: State
    name: str = "task"
    kind: str = "fresh"
    host: str = "local"
    attempt: int = 0
    resumes: int = 0
    retries: int = 0
    max_retries: int = 0
    no_start: int = 0
    verifiers: int = 0
    backoff: Optional[Backoff] = None
    pause: Optional[tuple[float, int]] = None
    now: float = 0.0
    clock_now: float = 0.0


# -- the observations --------------------------------------------------------------------


@dataclass(frozen=True)
class AttemptEnded:
    """The attempt's host says it ended (``status``); ``result`` is what its agent's
    plugin read from its output (None: no plugin did)."""

    status: Mapping[str, Any]
    result: Optional[AgentResult] = None


@dataclass(frozen=True)
class NotStarted:
    """The attempt did not start (``cause``); ``at_once``: it never can as things are
    (the agent is not installed, no plugin does it, git refuses the workspace)."""

    cause: str
    at_once: bool = False


@dataclass(frozen=True)
class Collected:
    """The ended attempt's work is collected. ``tampered``: its worktree's ``.git`` was
    changed (the text says how; ``what`` what that stopped); ``error``: committing
    failed (noted; the verifiers run all the same)."""

    tampered: Optional[str] = None
    what: str = "nothing was committed"
    error: Optional[str] = None


@dataclass(frozen=True)
class VerdictGiven:
    """Verifier ``idx`` answered.

    :ivar passed: its verdict.
    :ivar label: its label; ``output``: what it printed (the cause quotes its summary).
    :ivar error: ``transient``/``permanent`` when it could not judge (no verdict).
    :ivar reason: why it could not judge.
    :ivar prev_tries: the tries of a wait recorded for this same verifier, else 0.
    :ivar space: the error is this machine's full disk (waited out, no try used).
    :ivar limit: tries before a human is asked; ``backoff_s``: the first wait.
    """

    idx: int
    passed: bool
    label: str = ""
    output: str = ""
    error: Optional[str] = None
    reason: str = ""
    prev_tries: int = 0
    space: bool = False
    limit: int = 5
    backoff_s: float = 30.0


@dataclass(frozen=True)
class HandoffMade:
    """The handoff of a task whose every verifier passed is made (``handoff``: its fields,
    or None when no plugin made one)."""

    handoff: Optional[Mapping[str, Any]] = None


@dataclass(frozen=True)
class SetupStepEnded:
    """Setup step ``idx`` of ``steps`` ended.

    :ivar baseline: the step was a verifier's run on the base commit.
    :ivar label, reason, output: the step's label, its verdict's reason and output.
    :ivar out: where its whole output is, when known.
    """

    idx: int
    steps: int
    passed: bool
    baseline: bool = False
    label: str = ""
    reason: str = ""
    output: str = ""
    out: Optional[str] = None


@dataclass(frozen=True)
class Placed:
    """Placement's answer for a placeable task: ``host`` to start it on, or ``wait``
    (``until``, ``operator``: as :class:`~fleetrun.reports.Wait`); ``budget``/``spent``:
    the task's budget and what it spent (none left: a human is asked first)."""

    host: Optional[str] = None
    wait: Optional[str] = None
    until: Optional[float] = None
    operator: Optional[str] = None
    budget: Optional[float] = None
    spent: float = 0.0


@dataclass(frozen=True)
class LeaseFound:
    """A restart found the task's attempt ``leased`` (or ``starting`` without a shepherd)
    and its shepherd never started: the attempt is abandoned."""


@dataclass(frozen=True)
class StartUnconfirmed:
    """The attempt runs (or ran) but its start was never recorded (a crash before
    RUNNING, a peer's reply lost with its link)."""


Observation = (
    AttemptEnded
    | NotStarted
    | Collected
    | VerdictGiven
    | HandoffMade
    | SetupStepEnded
    | Placed
    | LeaseFound
    | StartUnconfirmed
)
#: Every observation kind (the table test has a row for each state and each of these).
OBSERVATIONS: tuple[type, ...] = (
    AttemptEnded,
    NotStarted,
    Collected,
    VerdictGiven,
    HandoffMade,
    SetupStepEnded,
    Placed,
    LeaseFound,
    StartUnconfirmed,
)

#: A verifier that could not judge waits at most this long before it runs again.
MAX_VERIFIER_BACKOFF_S = 3600.0
#: How soon a verifier that could not write its output (a full disk) runs again.
SPACE_RETRY_S = 2.0


def transition_actions(t: Transition) -> list[Action]:
    """A :class:`Transition` (an attempt's end or failed start) as actions, in the order
    they are applied: the machine is good again, the pause, the backoff, then the move
    (and the cleanup of a terminal task), or the collect that precedes VERIFYING."""
    out: list[Action] = []
    if t.ran:
        out.append(Ran())
    if t.pause is not None:
        out.append(PauseHost(t.pause[0], t.pause[1], t.cause))
    if t.backoff is not None:
        out.append(BackOff(t.backoff))
    if t.verify:
        out.append(Collect())
        return out
    out.append(Move(t.to, t.cause, fields=dict(t.fields)))
    if t.terminal:
        out.append(CleanUp())
    return out


def _ended(f: Facts, o: AttemptEnded) -> list[Action]:
    t = decide_end(
        Ended(
            status=o.status,
            result=o.result,
            task_state=f.state,
            kind=f.kind,
            host=f.host,
            resumes=f.resumes,
            no_start=f.no_start,
            backoff=f.backoff,
            pause=f.pause,
            now=f.now,
            clock_now=f.clock_now,
        )
    )
    return [] if t is None else transition_actions(t)


def _not_started(f: Facts, o: NotStarted) -> list[Action]:
    if o.at_once:
        t = Transition(State.NEEDS_HUMAN, o.cause)
    else:
        t = decide_not_started(f.kind, f.no_start, f.backoff, f.host, o.cause, f.now)
    if f.state is not State.ASSIGNED:
        # the task left ASSIGNED meanwhile (a cancel): its move would be refused; the
        # machine still did not start it
        return [a for a in transition_actions(t) if isinstance(a, BackOff)]
    return transition_actions(t)


def _collected(f: Facts, o: Collected) -> list[Action]:
    if f.state is not State.RUNNING:
        return [Drop()]  # cancelled or given up meanwhile: what the effect did is done
    if o.tampered is not None:
        return tampered(o.tampered, o.what)
    out: list[Action] = []
    if o.error is not None:
        out.append(Note(f"could not commit the attempt's work: {o.error}"))
    return [*out, Move(State.VERIFYING, "exited"), StartVerifier(0)]


def tampered(reason: str, what: str) -> list[Action]:
    """The agent rewrote, replaced or removed its worktree's ``.git``: nothing is committed
    or run there, and a human looks (a retry would only repeat it). ``reason`` quotes
    what the agent wrote into ``.git``: one line, no control characters."""
    reason = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in " ".join(reason.split()))
    reason = (reason[:300] + "...") if len(reason) > 300 else reason
    return [
        Move(
            State.NEEDS_HUMAN,
            f"worktree_tampered:{reason or 'its .git was changed'}; {what}",
            outcome="worktree_tampered",
        ),
        NoteKeptWorktree(),
        CleanUp(),
    ]


def _verdict(f: Facts, o: VerdictGiven) -> list[Action]:
    if f.state is not State.VERIFYING:
        return [Drop()]
    if o.error is not None:
        return _could_not_judge(f, o)
    if o.passed:
        return [StartVerifier(o.idx + 1)] if o.idx + 1 < f.verifiers else [HandOff()]
    if f.retries < f.max_retries:
        return [
            Move(
                State.RETRYING,
                failed_cause("verify_fail", o.label, o.output),
                attempt_state="verified",
                fields={"retries": f.retries + 1},
            )
        ]
    return [
        Move(State.NEEDS_HUMAN, failed_cause("retries_exhausted", o.label, o.output), attempt_state="verified"),
        CleanUp(),
    ]


def _could_not_judge(f: Facts, o: VerdictGiven) -> list[Action]:
    """Never the agent's failure: a permanent error, or a transient one tried ``limit``
    times, asks a human (the work kept); a transient one before that waits and runs
    that verifier again. A full disk (the verifier's output could not be written)
    clears by itself and is the fleet's, not this verifier's: waited out every few
    seconds without using up a try (found by the soak)."""
    why = " ".join((o.reason or "could not judge").split())
    tries = o.prev_tries + 1 - (1 if o.space else 0)
    if o.error == PERMANENT or tries >= o.limit:
        detail = why if o.error == PERMANENT else f"{why} (tried {tries} time{'s' if tries != 1 else ''})"
        return [
            Move(
                State.NEEDS_HUMAN,
                cause("verifier_error", f"{o.label.replace(chr(10), ' ')}: {detail}"),
                attempt_state="verified",
                info={
                    VERIFY_WAIT: None,
                    VERIFY_ERROR: {"idx": o.idx, "label": o.label, "error": o.error, "reason": why, "tries": tries},
                },
            ),
            CleanUp(),
        ]
    delay = SPACE_RETRY_S if o.space else min(float(o.backoff_s) * 2 ** (tries - 1), MAX_VERIFIER_BACKOFF_S)
    return [VerifierWait(o.idx, tries, f.clock_now + delay, why)]


def _handoff(f: Facts, o: HandoffMade) -> list[Action]:
    if f.state is not State.VERIFYING:
        return [Drop()]
    fields = {"handoff": dict(o.handoff)} if o.handoff is not None else {}
    return [
        Move(State.DONE, "verify_pass" if f.verifiers else "exited", attempt_state="verified", fields=fields),
        CleanUp(),
    ]


def _setup(f: Facts, o: SetupStepEnded) -> list[Action]:
    if f.state is not State.ASSIGNED:
        return [Drop()]
    if o.passed:
        return [RunSetupStep(o.idx + 1)] if o.idx + 1 < o.steps else [StartAgent()]
    if o.baseline:
        tail = "\n".join(o.output.rstrip().splitlines()[-20:])
        note = (
            f"verifier {o.label!r} already fails on the base commit ({o.reason}), before any agent run; "
            f'fix the base, or set baseline = "warn" or false, then `fleetrun retry {f.name}`'
            + (f"\n{tail}" if tail else "")
        )
        return [
            Move(
                State.NEEDS_HUMAN,
                baseline_fails_cause(o.label, o.reason, o.output),
                attempt_state="abandoned",
                outcome="baseline_fails",
            ),
            Note(note),
            CleanUp(),
        ]
    where = f"; its output is in {o.out}" if o.out else ""
    note = (
        f"setup command {o.idx + 1} failed ({o.reason}){where}; fix the command or the environment, then "
        f"`fleetrun retry {f.name}` (setup runs again from the start)"
    )
    return [
        Move(
            State.NEEDS_HUMAN,
            setup_failed_cause(o.label, o.reason, o.output),
            attempt_state="abandoned",
            outcome="setup_failed",
        ),
        Note(note),
        CleanUp(),
    ]


def budget_exhausted(budget: Optional[float], spent: float) -> bool:
    """Less than the agent can be given is left of the task's budget (placement is not
    asked then)."""
    return budget is not None and budget - spent < MIN_BUDGET_USD


def _placed(f: Facts, o: Placed) -> list[Action]:
    if f.state not in PLACEABLE:
        return []
    if budget_exhausted(o.budget, o.spent):
        return [Move(State.NEEDS_HUMAN, f"budget_exhausted:spent ${o.spent:.2f} of ${o.budget:.2f}"), CleanUp()]
    if o.host is None:
        reason = o.wait or "no plugin places tasks"
        return [WaitFor(reason, o.until, o.operator if o.wait else reason)]
    return [StartAttempt(o.host)]


def _lease_found(f: Facts, o: LeaseFound) -> list[Action]:
    if f.state is not State.ASSIGNED:
        return []
    return [Move(back_state(f.kind), "lease_expired:never started")]


def _unconfirmed(f: Facts, o: StartUnconfirmed) -> list[Action]:
    if f.state is not State.ASSIGNED:
        return []
    return [Move(State.RUNNING, "adopted")]


def decide(facts: Facts, obs: Observation) -> list[Action]:
    """What the loop does for a task, given what it knows of it and what it observed."""
    if isinstance(obs, AttemptEnded):
        return _ended(facts, obs)
    if isinstance(obs, NotStarted):
        return _not_started(facts, obs)
    if isinstance(obs, Collected):
        return _collected(facts, obs)
    if isinstance(obs, VerdictGiven):
        return _verdict(facts, obs)
    if isinstance(obs, HandoffMade):
        return _handoff(facts, obs)
    if isinstance(obs, SetupStepEnded):
        return _setup(facts, obs)
    if isinstance(obs, Placed):
        return _placed(facts, obs)
    if isinstance(obs, LeaseFound):
        return _lease_found(facts, obs)
    if isinstance(obs, StartUnconfirmed):
        return _unconfirmed(facts, obs)
    raise TypeError(f"not an observation: {obs!r}")

"""Operator actions and the state changes that follow from others (cascades).

Each function takes the ledger and a ``notify(task, from_state, to_state, cause,
attempt)`` callback that reports a transition once it is written: committed, or, in
the loop's pass (:meth:`~fleetrun.ledger_schema.LedgerFile.batch`), part of the pass's
transaction. The CLI's calls ``fleetrun_transition`` at once (its writes are committed
as they are made); the loop's queues it until the pass's commit
(:meth:`~fleetrun.ledger_schema.LedgerFile.after_commit`).
"""

from __future__ import annotations

import os
import sqlite3
from typing import Any, Callable, Optional

from . import crash
from .exceptions import StateConflict, UsageError
from .ledger import Ledger, Task
from .records import REVERIFY, VERIFY_ERROR, VERIFY_WAIT
from .states import TERMINAL, State, cause_word

Notify = Callable[[Task, State, State, str, Optional[int]], None]


def _noop(*args: object) -> None:
    pass


def move(
    ledger: Ledger,
    task: Task,
    to: State,
    cause: str,
    notify: Notify = _noop,
    attempt: Optional[int] = None,
    also: Optional[Callable[[sqlite3.Cursor], None]] = None,
    **fields: Any,
) -> Optional[Task]:
    """Compare-and-set ``task`` from the state it was read in to ``to``; report it.

    :param also: other writes that belong with the move (the attempt's own record, say),
        made in the transition's transaction: one commit (one fsync) instead of two, and
        nothing of them is written when the move is refused. ``notify`` is called once
        the move is written (see the module's docstring).
    :return: the task as it is now, or None if another process moved it first.
    """
    crash.point(f"before_transition:{to.value}")
    try:
        with ledger.tx() as cur:
            prev = ledger.transition(task.id, task.state, to, cause, attempt=attempt, host=task.host, cur=cur, **fields)
            if also is not None:
                also(cur)
    except StateConflict:
        return None
    now = ledger.get(task.id)
    assert now is not None
    notify(now, prev, to, cause, attempt)
    if ledger.pending():
        crash.point(f"uncommitted:{to.value}")  # written, its pass's commit to come
    # "after the move" is after its commit: at once, or with the loop's pass (Ledger.batch)
    ledger.after_commit(lambda: crash.point(f"after_transition:{to.value}"))
    return now


def cascade(ledger: Ledger, task: Task, notify: Notify = _noop) -> list[Task]:
    """Move the dependents of a CANCELLED or NEEDS_HUMAN task to NEEDS_HUMAN, down the chain."""
    moved: list[Task] = []
    word = "dependency_cancelled" if task.state is State.CANCELLED else "dependency_needs_human"
    for dep_id in ledger.dependents(task.id):
        dep = ledger.get(dep_id)
        if dep is None or dep.state in TERMINAL:
            continue
        if dep.state in (State.ASSIGNED, State.RUNNING, State.VERIFYING):
            continue  # already running: it finishes on its own merits
        now = move(ledger, dep, State.NEEDS_HUMAN, f"{word}:{task.name}", notify)
        if now is not None:
            moved.append(now)
            moved.extend(cascade(ledger, now, notify))
    return moved


def promote(
    ledger: Ledger,
    notify: Notify = _noop,
    tasks: Optional[list[Task]] = None,
    lookup: Optional[Callable[[str], Optional[Task]]] = None,
) -> list[Task]:
    """PENDING tasks whose dependencies are all DONE become READY; those with a
    dependency that needs a human or was cancelled go to NEEDS_HUMAN.

    :param tasks: the tasks to look at (default: every PENDING one).
    :param lookup: a task by id, as the ledger has it now (the loop's view); by
        default the dependencies are read from the ledger.
    """
    tasks = tasks if tasks is not None else ledger.tasks({State.PENDING})
    if not any(t.state is State.PENDING for t in tasks):
        return []
    get: Callable[[str], Optional[Task]] = lookup or ledger.get
    moved: list[Task] = []
    for t in tasks:
        if t.state is not State.PENDING:
            continue
        deps = [d for d in (get(x) for x in t.deps) if d is not None]
        blocked = next((d for d in deps if d.state in (State.CANCELLED, State.NEEDS_HUMAN)), None)
        if blocked is not None:
            now = move(ledger, t, State.NEEDS_HUMAN, f"{_dep_word(blocked)}:{blocked.name}", notify)
            if now is not None:
                moved.append(now)
                moved.extend(cascade(ledger, now, notify))
        elif all(d.state is State.DONE for d in deps):
            now = move(ledger, t, State.READY, "dependencies_done", notify)
            if now is not None:
                moved.append(now)
    return moved


def _dep_word(dep: Task) -> str:
    return "dependency_cancelled" if dep.state is State.CANCELLED else "dependency_needs_human"


def resolve(ledger: Ledger, ref: str) -> Task:
    task = ledger.find(ref)
    if task is None:
        raise UsageError(f"no task with id or name {ref!r} (fleetrun status lists them)", key="TASK")
    return task


#: The states each operator verb acts on (``cancel`` of a CANCELLED task says so and
#: changes nothing; ``retry --elsewhere`` also takes a running task).
ELIGIBLE: dict[str, frozenset[State]] = {
    "cancel": frozenset(set(State) - {State.DONE, State.CANCELLED}),
    "retry": frozenset({State.NEEDS_HUMAN, State.CANCELLED}),
    "approve": frozenset({State.NEEDS_HUMAN}),
}


def refusal(verb: str, task: Task) -> Optional[str]:
    """Why ``verb`` cannot act on ``task`` as it is now, or None."""
    if verb == "cancel" and task.state is State.DONE:
        return f"task {task.name} ({task.id}) is DONE; there is nothing to cancel"
    if verb == "retry" and task.state not in ELIGIBLE["retry"]:
        return f"task {task.name} ({task.id}) is {task.state}; only NEEDS_HUMAN or CANCELLED tasks can be retried"
    if verb == "approve" and task.state is not State.NEEDS_HUMAN:
        return f"task {task.name} ({task.id}) is {task.state}; only NEEDS_HUMAN tasks can be approved"
    return None


def cancel(ledger: Ledger, task: Task, notify: Notify = _noop) -> tuple[bool, list[Task]]:
    """Cancel a task (idempotent). :return: (whether it changed, dependents moved)."""
    for _ in range(5):
        if task.state is State.CANCELLED:
            return False, []
        why = refusal("cancel", task)
        if why:
            raise UsageError(why, key="TASK")
        now = move(ledger, task, State.CANCELLED, "operator_cancel", notify)
        if now is not None:
            return True, cascade(ledger, now, notify)
        fresh = ledger.get(task.id)
        assert fresh is not None
        task = fresh
    raise UsageError(f"task {task.id} keeps changing state; try again", key="TASK")


def _revive_dependents(ledger: Ledger, task: Task, notify: Notify) -> list[Task]:
    """Dependents parked as NEEDS_HUMAN because of ``task`` go back to PENDING."""
    moved: list[Task] = []
    for dep_id in ledger.dependents(task.id):
        dep = ledger.get(dep_id)
        if dep is None or dep.state is not State.NEEDS_HUMAN:
            continue
        if not dep.reason.startswith(("dependency_cancelled:", "dependency_needs_human:")):
            continue
        if dep.reason.split(":", 1)[1] != task.name:
            continue
        now = move(ledger, dep, State.PENDING, f"operator_retry:{task.name}", notify)
        if now is not None:
            moved.append(now)
            moved.extend(_revive_dependents(ledger, now, notify))
    return moved


def retry_elsewhere(ledger: Ledger, task: Task, notify: Notify = _noop) -> list[Task]:
    """Give up on the machine a task is running on (a peer that stopped answering) and
    let placement choose again. The operator vouches that the old attempt is gone: it
    could otherwise still be running there."""
    if task.state in (State.ASSIGNED, State.RUNNING, State.VERIFYING):
        att = ledger.latest_attempt(task.id)
        if att is not None and att.state in ("leased", "starting", "running", "ended"):
            ledger.update_attempt(att.id, state="abandoned", outcome="operator_elsewhere")
        away = task.host
        ledger.update_task(task.id, host=None, worktree=None)  # first, so nothing pins it back
        fresh = ledger.get(task.id)
        assert fresh is not None
        now = move(ledger, fresh, State.RESUMING, f"operator_retry:elsewhere, away from {away}", notify)
        if now is None:
            raise UsageError(f"task {task.id} changed state meanwhile; try again", key="TASK")
        return [now]
    moved = retry(ledger, task, notify, reverify=False)  # another machine: the work starts again
    ledger.update_task(task.id, host=None, worktree=None)
    return moved


def retry(ledger: Ledger, task: Task, notify: Notify = _noop, reverify: bool = True) -> list[Task]:
    """Send a NEEDS_HUMAN or CANCELLED task back to the queue, with fresh retry counts;
    or, for one a verifier could not judge (``verifier_error``), back to VERIFYING, its
    kept work judged again without a new attempt (unless not ``reverify``)."""
    why = refusal("retry", task)
    if why:
        raise UsageError(why, key="TASK")
    last = ledger.latest_attempt(task.id)
    if (
        reverify
        and task.state is State.NEEDS_HUMAN
        and cause_word(task.reason) == "verifier_error"
        and last is not None
        and last.workspace is not None
        and VERIFY_ERROR in last.info
        and _kept(last.host, last.workspace)
    ):
        # a verifier could not judge the work: once it is fixed, judge the same work (no
        # new agent session), from that verifier on, with fresh tries
        info = {k: v for k, v in last.info.items() if k not in (VERIFY_ERROR, VERIFY_WAIT)}
        now = move(
            ledger,
            task,
            State.VERIFYING,
            REVERIFY,
            notify,
            attempt=last.number,
            also=lambda cur: ledger.update_attempt(last.id, cur=cur, info=info),
            retries=0,
            resumes=0,
            no_start=0,
        )
        if now is None:
            raise UsageError(f"task {task.id} changed state meanwhile; try again", key="TASK")
        return [now]
    deps_done = all((d := ledger.get(x)) is not None and d.state is State.DONE for x in task.deps)
    to = State.READY if deps_done else State.PENDING
    now = move(ledger, task, to, "operator_retry", notify, retries=0, resumes=0, no_start=0)
    if now is None:
        raise UsageError(f"task {task.id} changed state meanwhile; try again", key="TASK")
    return [now, *_revive_dependents(ledger, now, notify)]


def _kept(host: str, workspace: dict[str, Any]) -> bool:
    """Whether an attempt's workspace is still there to judge again: a local one that
    was removed since (``fleetrun gc --force``) is not, and the work starts again. A
    peer's is on the peer: its verifier says if it is gone."""
    return host != "local" or os.path.isdir(str(workspace.get("path") or ""))


def approve(ledger: Ledger, task: Task, notify: Notify = _noop) -> list[Task]:
    """Accept a NEEDS_HUMAN task as DONE; dependents it held back are released."""
    why = refusal("approve", task)
    if why:
        raise UsageError(why, key="TASK")
    now = move(ledger, task, State.DONE, "operator_approve", notify)
    if now is None:
        raise UsageError(f"task {task.id} changed state meanwhile; try again", key="TASK")
    revived = _revive_dependents(ledger, now, notify)
    return [now, *revived, *promote(ledger, notify, revived)]


# ---------------------------------------------------------------------------------
# Choosing the tasks of a bulk operation (``cancel --all``, ``retry --state needs_human``)


def parse_state(text: str) -> State:
    """``needs_human`` or ``NEEDS_HUMAN`` as a :class:`State`.

    :raises UsageError: not a state's name.
    """
    try:
        return State(text.upper())
    except ValueError:
        raise UsageError(
            f"{text!r} is not a state; one of {', '.join(s.value.lower() for s in State)}", key="--state"
        ) from None


def current_tasks(ledger: Ledger) -> list[Task]:
    """The task each name stands for (the newest with it, as ``TASK`` resolves a name),
    in the order they were queued: the tasks a selector of a bulk operation looks at,
    so an older queue's task of a name run again since is not retried or approved."""
    newest: dict[str, Task] = {}
    for t in ledger.tasks():  # oldest first: the last one of a name wins
        newest[t.name] = t
    return list(newest.values())


def select(
    ledger: Ledger,
    refs: list[str],
    *,
    eligible: frozenset[State],
    everything: bool = False,
    state: Optional[State] = None,
    match: Optional[Callable[[Task], bool]] = None,
) -> list[Task]:
    """The tasks a bulk operation acts on.

    Named tasks (``refs``) are all resolved first, so a typo changes nothing; the
    selectors (``state``, ``match``: ``-k``/``-m``) narrow them, or, with no names,
    choose among the ledger's current tasks (:func:`current_tasks`) those in an
    ``eligible`` state. With ``everything`` (``cancel --all``) every task of the
    ledger in an eligible state is a candidate, older queues' too: all work stops.

    :return: the tasks, in the order named, else in the order queued. A named task
        keeps its state (the operation says why it cannot act on it); selected ones
        are only ever eligible ones.
    :raises UsageError: an unknown name.
    """
    named = [resolve(ledger, ref) for ref in refs]
    if named:
        pool = list({t.id: t for t in named}.values())  # a task named twice is acted on once
    elif everything:
        pool = [t for t in ledger.tasks() if t.state in eligible]
    else:
        pool = [t for t in current_tasks(ledger) if t.state in eligible]
    if state is not None:
        pool = [t for t in pool if t.state is state]
    if match is not None:
        pool = [t for t in pool if match(t)]
    return pool

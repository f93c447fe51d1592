"""The ledger's records: a task, an attempt, a transition and a verdict as read back
from their rows, and how a row becomes one.

Reading a row is all this module does: the SQL lives in :mod:`fleetrun.ledger`,
which re-exports these names (``from fleetrun.ledger import Task`` keeps working).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional

from .states import State
from .taskspec import TaskSpec

if TYPE_CHECKING:
    import sqlite3

__all__ = ["Attempt", "ListedTask", "Task", "TransitionRow", "VerdictRow"]


@dataclass(slots=True)
class Task:
    """A task as the ledger knows it: its spec plus where it stands.

    With slots, no ``__dict__``: the loop's view holds every READY task, and at 30,000 a
    dict each was most of their memory and as many more objects for each of the garbage
    collector's full passes to walk."""

    id: str
    name: str
    state: State
    spec: TaskSpec
    source: str
    queue_id: str
    created: float
    updated: float
    host: Optional[str] = None
    worktree: Optional[str] = None
    branch: Optional[str] = None
    cost_usd: float = 0.0
    attempts: int = 0
    retries: int = 0
    resumes: int = 0
    no_start: int = 0
    reason: str = ""
    handoff: Optional[dict[str, Any]] = None
    deps: list[str] = field(default_factory=list)

    def dependency_names(self) -> list[str]:
        """The names of the tasks it depends on (its spec's ``depends_on``)."""
        return list(self.spec.depends_on)

    def has_requirements(self) -> bool:
        """Whether its spec ``requires`` a tag or tool."""
        return bool(self.spec.requires)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "state": self.state.value,
            "attempts": self.attempts,
            "retries": self.retries,
            "resumes": self.resumes,
            "host": self.host,
            "worktree": self.worktree,
            "branch": self.branch,
            "cost_usd": round(self.cost_usd, 6),
            "reason": self.reason,
            "depends_on": self.dependency_names(),
            "source": self.source,
            "created": self.created,
            "updated": self.updated,
        }

    @classmethod
    def from_row(cls, row: sqlite3.Row, spec: TaskSpec, deps: list[str]) -> Task:
        """The task of a ``tasks`` row.

        :param spec: the row's ``spec``, parsed (the ledger caches parsed specs).
        :param deps: the ids of the tasks it depends on (the ``deps`` table).
        """
        return cls(
            id=row["id"],
            name=row["name"],
            state=State(row["state"]),
            spec=spec,
            source=row["source"],
            queue_id=row["queue_id"],
            created=row["created"],
            updated=row["updated"],
            host=row["host"],
            worktree=row["worktree"],
            branch=row["branch"],
            cost_usd=row["cost_usd"],
            attempts=row["attempts"],
            retries=row["retries"],
            resumes=row["resumes"],
            no_start=row["no_start"],
            reason=row["reason"],
            handoff=json.loads(row["handoff"]) if row["handoff"] else None,
            deps=deps,
        )


class ListedTask(Task):
    """A :class:`Task` read for a listing (``fleetrun status``): its spec is read and
    parsed only if it is used (with 10,000 tasks, parsing every spec was most of the
    command's time); ``depends_on`` comes from the row as read.

    One object a task (slots, no ``__dict__``): the reader of specs is shared by the
    tasks of one read and given the task's id, not a closure a task."""

    __slots__ = ("_read_spec", "_depends_on", "_requires")
    _read_spec: Callable[[str], str]  # reads a task's spec text by id; unset in a copy (replace())
    _depends_on: Optional[str]  # the spec's ``depends_on``, JSON
    _requires: Optional[str]  # the spec's ``requires``, JSON

    def __getattr__(self, name: str) -> Any:
        # only an unset slot comes here: ``spec`` of a listed task not read yet
        if name != "spec":
            raise AttributeError(name)
        try:
            read = self._read_spec
        except AttributeError:
            raise AttributeError(name) from None
        spec = TaskSpec.from_json(json.loads(read(self.id)))
        self.spec = spec
        return spec

    def unload_spec(self) -> None:
        """Forget the parsed spec (it is read and parsed again if used): a task that waits
        keeps its row's narrow columns only."""
        if hasattr(self, "_read_spec"):
            try:
                del self.spec
            except AttributeError:
                pass  # not read

    def dependency_names(self) -> list[str]:
        try:
            depends_on = self._depends_on
        except AttributeError:  # made by dataclasses.replace(): its spec is set
            return list(self.spec.depends_on)
        if not depends_on or depends_on == "[]":  # most tasks: not parsed, 10,000 times
            return []
        names = json.loads(depends_on)
        return [str(n) for n in names] if isinstance(names, list) else []

    def has_requirements(self) -> bool:
        # from the row: placement asks it of every placeable task before it places any
        # (whether to probe this machine's tools), and parsing each spec for it held
        # 30,000 parsed specs at once
        try:
            requires = self._requires
        except AttributeError:  # made by dataclasses.replace(): its spec is set
            return bool(self.spec.requires)
        return requires not in (None, "", "[]")

    @classmethod
    def listed(cls, row: tuple[Any, ...], deps: list[str], read_spec: Callable[[str], str]) -> ListedTask:
        """The task of a ``tasks`` row read as :data:`LISTED_COLUMNS` (no spec; the
        spec's ``$.depends_on`` and ``$.requires`` as JSON last).

        :param read_spec: reads a task's spec text given its id, on first use of ``spec``
            (one for every task of a read).
        """
        t = cls.__new__(cls)
        (
            t.id,
            t.name,
            state,
            t.source,
            t.queue_id,
            t.created,
            t.updated,
            t.host,
            t.worktree,
            t.branch,
            t.cost_usd,
            t.attempts,
            t.retries,
            t.resumes,
            t.no_start,
            t.reason,
            handoff,
            t._depends_on,
            t._requires,
        ) = row
        t.state = _STATES[state]
        t.handoff = json.loads(handoff) if handoff else None
        t.deps = deps
        t._read_spec = read_spec
        return t


#: The columns :meth:`ListedTask.listed` reads, in its order.
LISTED_COLUMNS = (
    "id, name, state, source, queue_id, created, updated, host, worktree, branch, cost_usd, attempts,"
    " retries, resumes, no_start, reason, handoff, json_extract(spec, '$.depends_on'), json_extract(spec, '$.requires')"
)
_STATES = {s.value: s for s in State}


@dataclass
class Attempt:
    """One run of an agent for a task (fresh, retry or resume)."""

    id: str
    task_id: str
    number: int
    kind: str
    host: str
    state: str  # leased / starting / running / ended / verified / abandoned
    created: float
    dir: Optional[str] = None
    workspace: Optional[dict[str, Any]] = None
    started: Optional[float] = None
    ended: Optional[float] = None
    exit_code: Optional[int] = None
    outcome: Optional[str] = None
    session_id: Optional[str] = None
    #: None: unknown (the agent never reported it: killed, died, no result)
    cost_usd: Optional[float] = 0.0
    result_text: Optional[str] = None
    shepherd_pid: Optional[int] = None
    shepherd_token: Optional[str] = None
    info: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> Attempt:
        """The attempt of an ``attempts`` row (its JSON columns parsed)."""
        d = dict(row)
        d["workspace"] = json.loads(d["workspace"]) if d["workspace"] else None
        d["info"] = json.loads(d["info"]) if d["info"] else {}
        return cls(**d)


@dataclass
class TransitionRow:
    """One row of the append-only log of state changes."""

    id: int
    task_id: str
    from_state: Optional[str]
    to_state: str
    cause: str
    time: float
    attempt: Optional[int]
    host: Optional[str]

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> TransitionRow:
        """The transition of a ``transitions`` row."""
        return cls(**dict(row))


@dataclass
class VerdictRow:
    """What one verifier said about one attempt."""

    task_id: str
    attempt_id: str
    idx: int
    kind: str
    label: str
    passed: bool
    reason: str
    output: str
    cost_usd: float
    duration_s: float
    host: str
    time: float

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> VerdictRow:
        """The verdict of a ``verdicts`` row (without its row id)."""
        d = dict(row)
        d.pop("id")
        d["passed"] = bool(d["passed"])
        return cls(**d)


#: The attempt's ``info`` key of the backoff of a verifier that could not judge
#: (:mod:`fleetrun.verifying`): ``{"idx", "tries", "until", "reason"}`` (``until``:
#: :func:`fleetrun.clock.now` time). Here, not in the verify stage, so that ``retry``
#: (:mod:`fleetrun.ops`) reads it without importing the loop's stages.
VERIFY_WAIT = "verify_wait"
#: The attempt's ``info`` key of the error that sent its task to NEEDS_HUMAN:
#: ``{"idx", "label", "error", "reason", "tries"}``; ``fleetrun retry`` re-verifies from it.
VERIFY_ERROR = "verify_error"
#: The cause of ``fleetrun retry``'s move of such a task back to VERIFYING.
REVERIFY = "operator_retry:re-verify"

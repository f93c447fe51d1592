"""The loop's tasks kept in memory, read again from the ledger only where they changed.

A loop pass used to read the whole queue several times (``Ledger.tasks()``); with
10,000 queued tasks that was most of a second of CPU, every second. :class:`TaskView`
reads the tasks once, then on each :meth:`~TaskView.refresh` only the rows that changed:

- this connection's own writes are seen by a TEMP trigger on ``tasks`` that calls a
  Python function with the row's id (TEMP: it lives in this connection only, nothing
  is written to the ledger's file or its schema; a raw ``UPDATE tasks`` is seen too);
- another process's writes (a ``fleetrun cancel``, ``queue``, ``retry`` or ``gc`` from
  another shell) move ``PRAGMA data_version``; only then the narrow columns of every
  row (no spec) are compared with what the view holds, and the rows that differ are
  read again.

So an idle pass costs a pragma and no scan, whatever the length of the queue. The view
belongs to one connection (the loop's ledger) and, like it, to one thread.

What it holds of a task is its row's narrow columns (:class:`~fleetrun.records.ListedTask`):
the spec, most of a row's bytes, is read and parsed when first used, which the loop does
for the tasks it places or runs, not for the 100,000 that wait (a spec parsed for each
was most of an idle supervisor's memory, and its first pass's time). Nor does it keep a
second copy of each row to find another process's changes: those rows are compared with
the tasks it holds.
"""

from __future__ import annotations

import functools
import json
import sqlite3
import threading
from collections.abc import Iterable
from typing import Any, Optional

from .ledger import LEDGER_KEY, Ledger, Task
from .records import LISTED_COLUMNS, ListedTask
from .stash import StashKey
from .states import State

#: The columns compared to find another process's changes: every one but the spec
#: (written once, with the task) and the name, source, queue and order (never changed).
_BRIEF = "id, state, updated, host, worktree, branch, cost_usd, attempts, retries, resumes, no_start, reason, handoff"

#: Where each of those is in a :data:`LISTED_COLUMNS` row.
_BRIEF_AT = (0, 2, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16)
_HANDOFF = 12  # the handoff's place in a brief: JSON text in the row, parsed in the task


#: The columns of a :data:`LISTED_COLUMNS` row a queue's tasks share a value of, kept
#: once: source, queue_id, created and the spec's depends_on (values that come with a
#: queue, so what is kept grows with the queues, not with each pass's updates).
_SHARED_AT = (3, 4, 5, 17)


def _brief_of(t: Task) -> tuple[Any, ...]:
    """A held task's brief, as its row's would be (the handoff parsed on both sides)."""
    return (
        t.id,
        t.state.value,
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
        t.handoff,
    )


#: The loop's view of its tasks, for the plugins that count tasks on every pass
#: (placement's slots and shared checkouts); unset outside a work loop.
TASKVIEW_KEY = StashKey["TaskView"]()


class TaskView:
    """Every task of the ledger, in queue order (created, seq), by id and by state.

    :param led: the ledger whose connection the view watches (its own writes through
        any code path, others' through ``data_version``).
    """

    def __init__(self, led: Ledger) -> None:
        self.led = led
        self._touched: set[str] = set()
        self._install_trigger()
        self._tasks: dict[str, Task] = {}
        self._thread = threading.get_ident()
        self._shared: dict[Any, Any] = {}
        self._by_state: dict[State, dict[str, Task]] = {s: {} for s in State}
        self._sorted: dict[State, Optional[list[Task]]] = {s: None for s in State}
        self._dependents: dict[str, list[str]] = {}
        self._keys: dict[str, tuple[float, int]] = {}
        self._gen: dict[State, int] = {s: 0 for s in State}
        self._multi: dict[tuple[State, ...], tuple[tuple[int, ...], list[Task]]] = {}
        self._subscribers: list[set[str]] = []
        #: reads of the whole tasks table so far (a test counts them per pass)
        self.full_reads = 0
        self._version = self._data_version()
        self._read_all()
        self._touched.clear()

    # -- watching the ledger -------------------------------------------------------------

    def _install_trigger(self) -> None:
        conn = self.led.conn
        conn.create_function("fleetrun_task_touched", 1, self._touch)
        for event in ("INSERT", "UPDATE"):
            conn.execute(
                f"CREATE TEMP TRIGGER IF NOT EXISTS fleetrun_view_{event.lower()} AFTER {event} "
                f"ON main.tasks BEGIN SELECT fleetrun_task_touched(new.id); END"
            )

    def _touch(self, task_id: Any) -> None:
        # called by SQLite inside the writing statement: remember, read nothing here
        if isinstance(task_id, str):
            self._touched.add(task_id)

    def _data_version(self) -> int:
        return int(self.led.conn.execute("PRAGMA data_version").fetchone()[0])

    def _changed_elsewhere(self) -> set[str]:
        """The ids whose row differs from the task held (or is not held, or is gone)."""
        cur = self.led.conn.cursor()
        cur.row_factory = None
        changed: set[str] = set()
        seen: set[str] = set()
        tasks = self._tasks
        for row in cur.execute(f"SELECT {_BRIEF} FROM tasks"):
            tid = row[0]
            seen.add(tid)
            held = tasks.get(tid)
            if held is None:
                changed.add(tid)
                continue
            brief = _brief_of(held)
            if row[:_HANDOFF] != brief[:_HANDOFF] or (
                (json.loads(row[_HANDOFF]) if row[_HANDOFF] else None) != brief[_HANDOFF]
            ):
                changed.add(tid)
        changed.update(i for i in tasks if i not in seen)
        return changed

    def refresh(self) -> set[str]:
        """Read again what changed since the last refresh.

        :return: the ids of the tasks read again (each subscriber gets them too).
        """
        changed = set(self._touched)
        self._touched.clear()
        version = self._data_version()
        if version != self._version:  # another connection committed: find its rows
            self._version = version
            changed.update(self._changed_elsewhere())
        if changed:
            self._reload(changed)
            for sub in self._subscribers:
                sub.update(changed)
        return changed

    def _reload(self, ids: set[str]) -> None:
        found = {t.id: t for t in self._read(sorted(ids))}
        for i in ids:
            if i in found:
                self._put(found[i])
            else:
                self._drop(i)

    def _read_all(self) -> None:
        conn = self.led.conn
        deps: dict[str, list[str]] = {}
        for tid, did in conn.execute("SELECT task_id, dep_id FROM deps"):
            deps.setdefault(tid, []).append(did)
        cur = conn.cursor()
        cur.row_factory = None
        for t in self._rows(cur.execute(f"SELECT seq, {LISTED_COLUMNS} FROM tasks"), deps):
            self._put(t)
        self.full_reads += 1

    def _read(self, ids: list[str]) -> list[Task]:
        out: list[Task] = []
        conn = self.led.conn
        cur = conn.cursor()
        cur.row_factory = None
        for k in range(0, len(ids), 500):  # SQLite's limit on bound parameters
            chunk = ids[k : k + 500]
            marks = ",".join("?" * len(chunk))
            deps: dict[str, list[str]] = {}
            for tid, did in conn.execute(f"SELECT task_id, dep_id FROM deps WHERE task_id IN ({marks})", chunk):
                deps.setdefault(tid, []).append(did)
            out.extend(
                self._rows(cur.execute(f"SELECT seq, {LISTED_COLUMNS} FROM tasks WHERE id IN ({marks})", chunk), deps)
            )
        return out

    def _rows(self, rows: Iterable[tuple[Any, ...]], deps: dict[str, list[str]]) -> list[Task]:
        out: list[Task] = []
        keys = self._keys
        reader = self._spec_text
        share = self._shared
        for r in rows:
            tid = r[1]
            row = list(r[1:])
            for k in _SHARED_AT:  # a queue's tasks have the same source, queue, reason...: one string
                row[k] = share.setdefault(row[k], row[k])
            out.append(
                ListedTask.listed(
                    tuple(row), [share.setdefault(d, d) for d in deps.get(tid, ())], functools.partial(reader, tid)
                )
            )
            keys[tid] = (r[6], r[0])  # (created, seq)
        return out

    def _spec_text(self, task_id: str) -> str:
        """A task's spec, read when first used. On the loop's thread through its
        connection; on another (a worker that makes a workspace) through one of its own,
        as a connection belongs to the thread that made it."""
        if threading.get_ident() == self._thread:
            return str(self.led.conn.execute("SELECT spec FROM tasks WHERE id=?", (task_id,)).fetchone()[0])
        conn = sqlite3.connect(self.led.path, timeout=30.0)
        try:
            return str(conn.execute("SELECT spec FROM tasks WHERE id=?", (task_id,)).fetchone()[0])
        finally:
            conn.close()

    def _put(self, t: Task) -> None:
        old = self._tasks.get(t.id)
        if old is None:
            for d in t.deps:
                self._dependents.setdefault(d, []).append(t.id)
        else:
            self._by_state[old.state].pop(t.id, None)
            self._dirty(old.state)
        self._tasks[t.id] = t
        self._by_state[t.state][t.id] = t
        self._dirty(t.state)

    def _drop(self, task_id: str) -> None:
        old = self._tasks.pop(task_id, None)
        if old is not None:
            self._by_state[old.state].pop(task_id, None)
            self._dirty(old.state)

    def _dirty(self, state: State) -> None:
        self._sorted[state] = None
        self._gen[state] += 1

    # -- reading it ----------------------------------------------------------------------

    def subscribe(self) -> set[str]:
        """A set that every refresh adds the changed ids to (its owner empties it);
        it starts with every task, so a new subscriber looks at each once."""
        sub = set(self._tasks)
        self._subscribers.append(sub)
        return sub

    def get(self, task_id: str) -> Optional[Task]:
        return self._tasks.get(task_id)

    def dependents(self, task_id: str) -> list[str]:
        return self._dependents.get(task_id, [])

    def count(self, states: Iterable[State]) -> int:
        return sum(len(self._by_state[s]) for s in states)

    def in_states(self, states: Iterable[State]) -> list[Task]:
        """The tasks in ``states``, in queue order (as ``Ledger.tasks(states)``); the
        list is kept until one of those states gains or loses a task (do not change it)."""
        wanted = tuple(sorted(set(states), key=lambda s: s.value))
        gens = tuple(self._gen[s] for s in wanted)
        hit = self._multi.get(wanted)
        if hit is not None and hit[0] == gens:
            return hit[1]
        out: list[Task] = []
        for s in wanted:
            lst = self._sorted[s]
            if lst is None:
                keys = self._keys
                lst = self._sorted[s] = sorted(self._by_state[s].values(), key=lambda t: keys[t.id])
            out.extend(lst)
        if len(wanted) > 1:
            keys = self._keys
            out.sort(key=lambda t: keys[t.id])
        self._multi[wanted] = (gens, out)
        return out

    def ordered(self, ids: Iterable[str]) -> list[Task]:
        """The tasks of ``ids`` the view holds, in queue order."""
        keys = self._keys
        return sorted((t for t in (self._tasks.get(i) for i in ids) if t is not None), key=lambda t: keys[t.id])

    def tasks(self, queue_id: Optional[str] = None) -> list[Task]:
        """Every task (of ``queue_id`` only, when given), in queue order."""
        out = self.in_states(list(State))
        return [t for t in out if t.queue_id == queue_id] if queue_id else out


def tasks_in(config: Any, states: Iterable[State]) -> list[Task]:
    """The tasks in ``states``: from the loop's view when a loop runs (no query on every
    pass: placement and the relay's candidates ask for them each pass), else from the
    ledger (None open: none)."""
    view = config.stash.get(TASKVIEW_KEY)
    if view is not None:
        view.refresh()
        return view.in_states(states)
    led = config.stash.get(LEDGER_KEY)
    return led.tasks(set(states)) if led is not None else []

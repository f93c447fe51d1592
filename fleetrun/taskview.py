"""The loop's tasks that can move, kept in memory, read again only where they changed.

A loop pass used to read the whole queue several times (``Ledger.tasks()``); then it kept
every task in memory, which at 100,000 queued tasks was most of an idle supervisor's
memory and its first pass's time. :class:`TaskView` holds the tasks in :data:`HELD`
states: those a pass may place, start, watch or verify (READY, RETRYING, RESUMING,
ASSIGNED, RUNNING, VERIFYING). A PENDING task waits for its dependencies, and a pass
finds those a dependency's end freed with a query by dependency
(:meth:`~fleetrun.ledger.Ledger.promotable`), not by holding them; a terminal one waits
for a person. Counts of the other states are asked of the ledger (an index on ``state``).

On each :meth:`~TaskView.refresh` it reads again only the rows that changed:

- this connection's own writes are seen by a TEMP trigger on ``tasks`` that calls a
  Python function with the row's id (TEMP: it lives in this connection only, nothing
  is written to the ledger's file or its schema; a raw ``UPDATE tasks`` is seen too);
- another process's writes (a ``fleetrun cancel``, ``queue``, ``retry`` or ``gc`` from
  another shell) move ``PRAGMA data_version``; only then it reads the transitions
  logged since it last looked (every change of state, and every task queued, is one)
  and compares the narrow columns of the rows in held states with what it holds (a
  ``gc`` writes no transition).

So an idle pass costs a pragma and no scan, whatever the length of the queue. The view
belongs to one connection (the loop's ledger) and, like it, to one thread.

What it holds of a task is its row's narrow columns (:class:`~fleetrun.records.ListedTask`):
the spec, most of a row's bytes, is read and parsed when first used, which the loop does
for the tasks it places or runs.
"""

from __future__ import annotations

import json
import sqlite3
import sys
import threading
from collections.abc import Iterable
from typing import Any, Optional

from .ledger import LEDGER_KEY, Ledger, Task
from .records import LISTED_COLUMNS, ListedTask
from .stash import StashKey
from .states import ACTIVE, PLACEABLE, State

#: The states whose tasks the view holds: what a pass can move without a dependency
#: ending or a person acting.
HELD = PLACEABLE | ACTIVE
_HELD_SQL = "state IN (" + ",".join(f"'{s.value}'" for s in sorted(HELD, key=lambda s: s.value)) + ")"

#: The columns compared to find another process's changes: every one but the spec
#: (written once, with the task) and the name, source, queue and order (never changed).
_BRIEF = "id, state, updated, host, worktree, branch, cost_usd, attempts, retries, resumes, no_start, reason, handoff"
_HANDOFF = 12  # the handoff's place in a brief: JSON text in the row, parsed in the task


#: The columns of a :data:`LISTED_COLUMNS` row a queue's tasks share a value of, kept
#: once: source, queue_id, created and the spec's depends_on and requires.
_SHARED_AT = (3, 4, 5, 17, 18)
_REASON = 15  # the reason's place in such a row


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
    """The ledger's tasks in :data:`HELD` states, in queue order (created, seq), by id
    and by state.

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
        self._reader = self._spec_text  # the bound method made once: its tasks share it
        self._by_state: dict[State, dict[str, Task]] = {s: {} for s in HELD}
        self._sorted: dict[State, Optional[list[Task]]] = {s: None for s in HELD}
        self._keys: dict[str, tuple[float, int]] = {}
        self._gen: dict[State, int] = {s: 0 for s in HELD}
        self._multi: dict[tuple[State, ...], tuple[tuple[int, ...], list[Task]]] = {}
        self._subscribers: list[set[str]] = []
        self._listing: Optional[dict[str, Task]] = None  # every task, once :meth:`tasks` is asked
        self._listing_changed: set[str] = set()
        #: reads of the held tasks' rows as a whole so far (a test counts them per pass)
        self.full_reads = 0
        self._version = self._data_version()
        self._mark = led.last_transition_id()  # the transitions looked at so far
        self._behind = False  # this connection logged transitions after the mark
        self._read_held()
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

    def _changed_elsewhere(self, committed: bool) -> set[str]:
        """The ids another connection changed: those of the transitions logged since the
        last look (a change of state, a task queued), and those of the rows in held
        states that differ from the task held (or are not held), and the held ones gone."""
        cur = self.led.conn.cursor()
        cur.row_factory = None
        changed: set[str] = set()
        mark = self._mark
        for rid, tid in cur.execute("SELECT id, task_id FROM transitions WHERE id > ?", (self._mark,)):
            changed.add(tid)
            mark = max(mark, rid)
        if committed:  # else some may be this connection's, not committed yet
            self._mark = mark
        seen: set[str] = set()
        tasks = self._tasks
        for row in cur.execute(f"SELECT {_BRIEF} FROM tasks WHERE {_HELD_SQL}"):
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

        :return: the ids of the tasks that changed, held or not (each subscriber gets
            them too): a task that left the held states is among them.
        """
        changed = set(self._touched)
        self._touched.clear()
        # the log's end, read before the pragma: if no other connection committed by then,
        # the transitions up to it are this connection's own (the trigger saw them). Only
        # a committed end counts: the ids of rows rolled back are given out again.
        committed = not self.led.conn.in_transaction
        self._behind = self._behind or bool(changed)  # this connection wrote: its log grew
        last = self.led.last_transition_id() if committed and self._behind else None
        version = self._data_version()
        if version != self._version:  # another connection committed: find its rows
            self._version = version
            changed.update(self._changed_elsewhere(committed))
            self._behind = self._behind and not committed
        elif last is not None:
            self._mark = max(self._mark, last)
            self._behind = False
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

    def _read_held(self) -> None:
        conn = self.led.conn
        deps: dict[str, list[str]] = {}
        for tid, did in conn.execute(
            f"SELECT task_id, dep_id FROM deps WHERE task_id IN (SELECT id FROM tasks WHERE {_HELD_SQL})"
        ):
            deps.setdefault(tid, []).append(did)
        cur = conn.cursor()
        cur.row_factory = None
        for t in self._rows(cur.execute(f"SELECT seq, {LISTED_COLUMNS} FROM tasks WHERE {_HELD_SQL}"), deps):
            self._put(t)
        self.full_reads += 1

    def _read(self, ids: list[str]) -> list[Task]:
        """The tasks of ``ids`` that are in held states."""
        out: list[Task] = []
        conn = self.led.conn
        cur = conn.cursor()
        cur.row_factory = None
        for k in range(0, len(ids), 500):  # SQLite's limit on bound parameters
            chunk = ids[k : k + 500]
            marks = ",".join("?" * len(chunk))
            rows = cur.execute(
                f"SELECT seq, {LISTED_COLUMNS} FROM tasks WHERE id IN ({marks}) AND {_HELD_SQL}", chunk
            ).fetchall()
            if not rows:
                continue
            held = [r[1] for r in rows]
            deps: dict[str, list[str]] = {}
            for tid, did in conn.execute(
                f"SELECT task_id, dep_id FROM deps WHERE task_id IN ({','.join('?' * len(held))})", held
            ):
                deps.setdefault(tid, []).append(did)
            out.extend(self._rows(rows, deps))
        return out

    def _rows(self, rows: Iterable[tuple[Any, ...]], deps: dict[str, list[str]]) -> list[Task]:
        out: list[Task] = []
        keys = self._keys
        reader = self._reader  # one for every task, given its id
        share = self._shared
        for r in rows:
            tid = r[1]
            row = list(r[1:])
            for k in _SHARED_AT:  # a queue's tasks have the same source, queue, reason...: one string
                row[k] = share.setdefault(row[k], row[k])
            row[_REASON] = sys.intern(row[_REASON])  # `queued` and the like: one string, freed once unused
            out.append(ListedTask.listed(tuple(row), [share.setdefault(d, d) for d in deps.get(tid, ())], reader))
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
        if old is not None:
            self._by_state[old.state].pop(t.id, None)
            self._dirty(old.state)
        self._tasks[t.id] = t
        self._by_state[t.state][t.id] = t
        self._dirty(t.state)

    def _drop(self, task_id: str) -> None:
        old = self._tasks.pop(task_id, None)
        self._keys.pop(task_id, None)
        if old is not None:
            self._by_state[old.state].pop(task_id, None)
            self._dirty(old.state)

    def _dirty(self, state: State) -> None:
        self._sorted[state] = None
        self._gen[state] += 1

    # -- reading it ----------------------------------------------------------------------

    def subscribe(self) -> set[str]:
        """A set that every refresh adds the changed ids to (its owner empties it);
        it starts with every task held, so a new subscriber looks at each once."""
        sub = set(self._tasks)
        self._subscribers.append(sub)
        return sub

    def get(self, task_id: str) -> Optional[Task]:
        """The task ``task_id`` if it is in a held state (as of the last refresh), else None."""
        return self._tasks.get(task_id)

    def count(self, states: Iterable[State]) -> int:
        """The tasks in ``states``: the held ones counted in memory, the others by the
        ledger (its index on ``state``)."""
        wanted = set(states)
        n = sum(len(self._by_state[s]) for s in wanted & HELD)
        rest = wanted - HELD
        if rest:
            marks = ",".join("?" * len(rest))
            row = self.led.conn.execute(
                f"SELECT count(*) FROM tasks WHERE state IN ({marks})", [s.value for s in rest]
            ).fetchone()
            n += int(row[0])
        return n

    def in_states(self, states: Iterable[State]) -> list[Task]:
        """The tasks in ``states``, in queue order (as ``Ledger.tasks(states)``). Held
        states are read from memory, and the list is kept until one of those states gains
        or loses a task (do not change it); any other state is a query of the ledger."""
        wanted = tuple(sorted(set(states), key=lambda s: s.value))
        if not set(wanted) <= HELD:
            return self.led.tasks(set(wanted), listed=True)
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

    def unload(self, task_id: str) -> None:
        """Forget the parsed spec of a held task until it is used again (placement calls
        it for a task told to wait: 30,000 READY tasks held their 30,000 specs)."""
        t = self._tasks.get(task_id)
        if isinstance(t, ListedTask):
            t.unload_spec()

    def ordered(self, ids: Iterable[str]) -> list[Task]:
        """The tasks of ``ids`` the view holds, in queue order."""
        keys = self._keys
        return sorted((t for t in (self._tasks.get(i) for i in ids) if t is not None), key=lambda t: keys[t.id])

    def tasks(self, queue_id: Optional[str] = None) -> list[Task]:
        """Every task (of ``queue_id`` only, when given), in queue order, as a listing
        (no spec read): what the live view shows. The first call reads every row and
        keeps them (only a view that shows every task holds every task); later ones
        read again the rows that changed since."""
        if self._listing is None:
            self._listing_changed = self.subscribe()
            self._listing_changed.clear()
            self._listing = {t.id: t for t in self.led.tasks(listed=True)}
        elif self._listing_changed:
            ids = sorted(self._listing_changed)
            self._listing_changed.clear()
            got = {t.id: t for t in self.led.listed_by_id(ids)}
            for i in ids:
                if i in got:
                    self._listing[i] = got[i]  # a new task (a queue added since) comes last, as queued
                else:
                    self._listing.pop(i, None)
        return [t for t in self._listing.values() if queue_id is None or t.queue_id == queue_id]


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

"""The ledger: one SQLite database that is the single source of truth.

Every state change is written at once: a compare-and-set on the task's state plus an
append-only transition row, one transaction (or one SAVEPOINT of the loop's pass,
:meth:`~fleetrun.ledger_schema.LedgerFile.batch`). After a crash, everything is
re-derived from here.

The ledger is three modules: :mod:`fleetrun.records` (the row types and how a row is
read), :mod:`fleetrun.ledger_schema` (the file, its pragmas, schema, migrations and
the write transaction) and this one (:class:`Ledger`: the SQL of every read and
write). Every name a caller imports from here is re-exported (``__all__``).

This module imports nothing of the loop, the plugins or the CLI.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Optional, overload

from .exceptions import StateConflict
from .ledger_schema import LATEST, SCHEMA_VERSION, LedgerFile, ensure_private_dir
from .records import LISTED_COLUMNS, Attempt, ListedTask, Task, TransitionRow, VerdictRow
from .stash import StashKey
from .states import State, allowed, is_valid_cause
from .taskspec import TaskSpec

if TYPE_CHECKING:
    from .config import Config

__all__ = [
    "SCHEMA_VERSION",
    "Attempt",
    "Ledger",
    "QueuedTasks",
    "Task",
    "TransitionRow",
    "VerdictRow",
    "ensure_private_dir",
    "new_token",
    "open_ledger",
]


def new_token() -> str:
    """A short id unique across processes: milliseconds (base 36) plus 24 random bits."""
    import secrets  # here: its hashlib and random are for writers, not for `status`

    ms = int(time.time() * 1000)
    digits = ""
    alphabet = "0123456789abcdefghijklmnopqrstuvwxyz"
    while ms:
        ms, r = divmod(ms, 36)
        digits = alphabet[r] + digits
    return digits + secrets.token_hex(3)


#: How many parsed specs a ledger keeps (a pass reads the same few tasks again and again).
SPEC_CACHE_SIZE = 4096

#: ``json.dumps`` of a spec as the ledger keeps it (the same text), without its check for
#: circular references (a dict of ids of the containers it is inside, kept for every
#: list and dict of every spec): a spec holds none, and 100,000 specs are encoded at once
_SPEC_JSON = json.JSONEncoder(check_circular=False).encode


_AFTER_DEPS: tuple[State, str, Optional[str]] = (State.PENDING, "queued", None)
_READY: tuple[State, str, Optional[str]] = (State.READY, "queued", None)


class QueuedTasks(Sequence[Task]):
    """The tasks :meth:`Ledger.add_tasks` queued, in the order of their specs: each
    :class:`Task` is made from its spec when it is read (``fleetrun queue`` reports each
    once), none kept, as the rows were written.

    :ivar queue_id: the queue they are in.
    :ivar created: when they were queued (``time.time()``).
    :ivar kept: by name, the DONE task of an earlier queue a spec stands for unchanged.
    """

    def __init__(self, queue_id: str, specs: list[TaskSpec], source: str, created: float, kept: dict[str, Task]):
        self.queue_id = queue_id
        self.specs = specs
        self.source = source
        self.created = created
        self.kept = kept
        #: by name, each spec's place (set once the rows are written)
        self.place: dict[str, int] = {}

    def id_of(self, i: int) -> str:
        """The id of the ``i``-th task."""
        return f"task_{self.queue_id}_{i}"

    def entry(self, spec: TaskSpec) -> tuple[State, str, Optional[str]]:
        """The state a spec enters in, why, and its host (a kept task's)."""
        old = self.kept.get(spec.name) if self.kept else None
        if old is None:
            return _AFTER_DEPS if spec.depends_on else _READY
        # named after the task that did the work, not a copy of it
        why = old.reason if old.reason.startswith("unchanged:") else f"unchanged:{old.id}"
        return State.DONE, why, old.host

    def row(self, i: int, spec_json: str, task_id: str, entry: tuple[State, str, Optional[str]]) -> tuple[Any, ...]:
        """The ``tasks`` row of the ``i``-th task, its spec as ``spec_json``, its id
        ``task_id`` and its :meth:`entry` ``entry`` (made once for every row kind)."""
        spec = self.specs[i]
        state, why, host = entry
        old = self.kept.get(spec.name) if self.kept else None
        handoff = json.dumps(old.handoff) if old is not None and old.handoff is not None else None
        return (
            task_id,
            spec.name,
            state.value,
            spec_json,
            spec.source or self.source,
            self.queue_id,
            i,
            self.created,
            self.created,
            why,
            host,
            old.branch if old is not None else None,
            handoff,
        )

    def shown(self) -> Iterator[tuple[str, str, State]]:
        """Each task's id, name and state as written, in ``specs`` order: what a
        ``queued`` line shows, without a :class:`Task` of each."""
        for i, spec in enumerate(self.specs):
            yield self.id_of(i), spec.name, self.entry(spec)[0]

    def entered(self) -> Iterator[tuple[str, str, State, str]]:
        """Each task's id, name, state and cause as written, in ``specs`` order (what
        ``fleetrun_queued`` reports), without a :class:`Task` of each."""
        for i, spec in enumerate(self.specs):
            state, why, _host = self.entry(spec)
            yield self.id_of(i), spec.name, state, why

    def __len__(self) -> int:
        return len(self.specs)

    @overload
    def __getitem__(self, i: int) -> Task: ...

    @overload
    def __getitem__(self, i: slice) -> list[Task]: ...

    def __getitem__(self, i: int | slice) -> Task | list[Task]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self.specs)
        spec = self.specs[i]
        state, why, host = self.entry(spec)
        old = self.kept.get(spec.name) if self.kept else None
        return Task(
            id=self.id_of(i),
            name=spec.name,
            state=state,
            spec=spec,
            source=spec.source or self.source,
            queue_id=self.queue_id,
            created=self.created,
            updated=self.created,
            reason=why,
            host=host,
            branch=old.branch if old is not None else None,
            handoff=json.loads(json.dumps(old.handoff)) if old is not None and old.handoff is not None else None,
            deps=sorted({self.id_of(self.place[d]) for d in spec.depends_on}),  # as the deps table's key orders them
        )

    def __iter__(self) -> Iterator[Task]:
        for i in range(len(self.specs)):
            yield self[i]


class Ledger(LedgerFile):
    """The SQLite ledger at ``path`` (opened by :class:`~fleetrun.ledger_schema.LedgerFile`).
    One connection per instance; not thread-safe."""

    # -- tasks ------------------------------------------------------------------------

    def add_tasks(
        self,
        specs: list[TaskSpec],
        source: str = "",
        source_hash: str = "",
        settings: Optional[dict[str, Any]] = None,
        kept: Optional[dict[str, Task]] = None,
    ) -> list[Task]:
        """Queue ``specs`` as one batch (:meth:`queue_tasks`); :return: the tasks queued."""
        return list(self.queue_tasks(specs, source, source_hash, settings, kept))

    def queue_tasks(
        self,
        specs: list[TaskSpec],
        source: str = "",
        source_hash: str = "",
        settings: Optional[dict[str, Any]] = None,
        kept: Optional[dict[str, Task]] = None,
    ) -> QueuedTasks:
        """Queue ``specs`` as one batch; ``depends_on`` names resolve within the batch.

        :param settings: the tasks files' own tables (``[agents.X]``, ``[brain]``), kept
            with the queue so a later ``fleetrun work`` knows them.
        :param kept: by name, the DONE task of an earlier queue that a spec stands for
            unchanged (:mod:`fleetrun.rerun`): the spec enters this queue DONE (cause
            ``unchanged:OLD_ID``) with that task's branch, host and handoff, so its
            dependents here are handed its work; it costs nothing and has no attempt.
        :return: the tasks queued, in ``specs`` order, each made as it is read (no
            :class:`Task` of each of 100,000 tasks kept: the rows are what was written).
        """
        queued = QueuedTasks(new_token(), specs, source, time.time(), kept or {})
        index = {s.name: i for i, s in enumerate(specs)}
        for spec in specs:
            for dep in spec.depends_on:
                if dep not in index:
                    raise ValueError(f"task {spec.name!r} depends on {dep!r}, not in this batch")
        queue_id, now = queued.queue_id, queued.created
        # each task's entry made once for the rows of every kind (100,000 tasks: asked
        # three times each), a shared tuple but for a kept task; its id made where used
        # (a list of 100,000 ids is 7 MB more at the queue's peak)
        entries = [queued.entry(spec) for spec in specs]
        prefix = f"task_{queue_id}_"
        # 100,000 rows are inserted in one statement each kind (executemany), and nothing
        # is read back or parsed twice
        with self.tx() as cur:
            cur.execute(
                "INSERT INTO queues (id, source, source_hash, created, settings) VALUES (?,?,?,?,?)",
                (queue_id, source, source_hash, now, json.dumps(settings or {})),
            )
            cur.executemany(
                "INSERT INTO tasks (id, name, state, spec, source, queue_id, seq, created, updated, reason,"
                " host, branch, handoff) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    queued.row(i, _SPEC_JSON(spec.json_view()), f"{prefix}{i}", entries[i])
                    for i, spec in enumerate(specs)
                ),
            )
            cur.executemany(
                "INSERT INTO transitions (task_id, from_state, to_state, cause, time, attempt, host)"
                " VALUES (?,NULL,?,?,?,NULL,?)",
                ((f"{prefix}{i}", state.value, reason, now, host) for i, (state, reason, host) in enumerate(entries)),
            )
            cur.executemany(
                "INSERT INTO notes (task_id, time, text) VALUES (?,?,?)",
                (
                    (
                        f"{prefix}{i}",
                        now,
                        f"unchanged since the file's last run: task {did} did this work "
                        f"(fleetrun logs {did}); --new-queue runs it again",
                    )
                    for i, spec in enumerate(specs)
                    if spec.name in queued.kept
                    for did in [entries[i][1].split(":", 1)[1]]
                ),
            )
            cur.executemany(
                "INSERT INTO deps (task_id, dep_id) VALUES (?,?)",  # in depends_on order
                ((f"{prefix}{i}", f"{prefix}{index[d]}") for i, spec in enumerate(specs) for d in spec.depends_on),
            )
        queued.place = index
        return queued

    def find_queue(self, source_hash: str) -> Optional[str]:
        """The newest queue made from files with this content hash whose tasks are
        still in the ledger (DONE or not), or None: running the same unchanged file
        again resumes that queue instead of doing DONE work twice."""
        row = self.conn.execute(
            "SELECT q.id FROM queues q WHERE q.source_hash=? AND EXISTS ("
            " SELECT 1 FROM tasks t WHERE t.queue_id=q.id) ORDER BY q.created DESC LIMIT 1",
            (source_hash,),
        ).fetchone()
        return row[0] if row else None

    def queue_hashes(self, source: str) -> list[str]:
        """The content hash (``source_hash``) of every queue made from ``source`` (the
        files of a command line): which digest versions the ledger holds of them."""
        return [h for (h,) in self.conn.execute("SELECT source_hash FROM queues WHERE source=?", (source,))]

    def tasks_of_source(self, source: str) -> list[tuple[Task, dict[str, Any]]]:
        """Every task of the queues made from ``source`` (the files of a command line),
        oldest first, each with its queue's settings (``[agents.X]``...)."""
        rows = self.conn.execute(
            "SELECT t.*, q.settings AS queue_settings FROM tasks t JOIN queues q ON q.id=t.queue_id"
            " WHERE q.source=? ORDER BY t.created, t.seq",
            (source,),
        ).fetchall()
        return [(self._row_to_task(r), json.loads(r["queue_settings"] or "{}")) for r in rows]

    def queues_mark(self) -> int:
        """A number that grows when a queue is added (its largest rowid): a loop compares
        it to see whether anything was queued since it last looked."""
        return int(self.conn.execute("SELECT coalesce(max(rowid), 0) FROM queues").fetchone()[0])

    def live_queues(self) -> list[tuple[str, list[str], dict[str, Any]]]:
        """(queue id, source files, settings) of every queue with unfinished tasks, oldest first."""
        rows = self.conn.execute(
            "SELECT q.id, q.source, q.settings FROM queues q WHERE EXISTS (SELECT 1 FROM tasks t"
            " WHERE t.queue_id=q.id AND t.state NOT IN ('DONE','NEEDS_HUMAN','CANCELLED')) ORDER BY q.created"
        ).fetchall()
        return [(r[0], [x for x in r[1].split(",") if x], json.loads(r[2] or "{}")) for r in rows]

    def _spec(self, text: str) -> TaskSpec:
        cache = self.__dict__.setdefault("_spec_cache", {})
        spec = cache.get(text)
        if spec is None:
            if len(cache) >= SPEC_CACHE_SIZE:  # a loop that works 100,000 tasks keeps no spec of each
                cache.clear()
            spec = cache[text] = TaskSpec.from_json(json.loads(text))
        return spec

    def _row_to_task(self, row: sqlite3.Row, deps: Optional[list[str]] = None) -> Task:
        return Task.from_row(row, self._spec(row["spec"]), deps if deps is not None else self.deps(row["id"]))

    def get(self, task_id: str) -> Optional[Task]:
        row = self.conn.execute("SELECT * FROM tasks WHERE id=?", (task_id,)).fetchone()
        return self._row_to_task(row) if row else None

    def find(self, ref: str) -> Optional[Task]:
        """A task by id, or the newest task with that name."""
        task = self.get(ref)
        if task is not None:
            return task
        row = self.conn.execute(
            "SELECT * FROM tasks WHERE name=? ORDER BY created DESC, seq DESC LIMIT 1", (ref,)
        ).fetchone()
        return self._row_to_task(row) if row else None

    def tasks(
        self,
        states: Optional[set[State]] = None,
        queue_id: Optional[str] = None,
        listed: bool = False,
        latest: bool = False,
    ) -> list[Task]:
        r"""The tasks (in ``states``, of ``queue_id``), in queue order.

        :param listed: for a listing: :class:`~fleetrun.records.ListedTask`\ s, whose
            spec is read only if it is used.
        :param latest: only each name's latest run (:data:`LATEST`), the states filtering
            those: what a person is shown by default.
        """
        where, args = _task_filter(states, queue_id, latest)
        sql = f"SELECT {LISTED_COLUMNS if listed else '*'} FROM tasks"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY created, seq"
        rows = (self.conn.execute(sql, args) if not listed else self._tuples(sql, args)).fetchall()
        alldeps: dict[str, list[str]] = {}
        if rows:  # the dependencies of these tasks only: this runs on every pass of the loop
            dep_sql = "SELECT task_id, dep_id FROM deps"
            if where:
                dep_sql += " WHERE task_id IN (SELECT id FROM tasks WHERE " + " AND ".join(where) + ")"
            for tid, did in self.conn.execute(dep_sql, args):
                alldeps.setdefault(tid, []).append(did)
        if listed:
            read = self.spec_text  # one reader for every task (a bound method made once)
            return [ListedTask.listed(r, alldeps.get(r[0], []), read) for r in rows]
        return [self._row_to_task(r, alldeps.get(r["id"], [])) for r in rows]

    def listed_batches(
        self, states: Optional[set[State]] = None, latest: bool = False, size: int = 500
    ) -> Iterator[list[ListedTask]]:
        r"""The tasks :meth:`tasks` (``listed=True``) returns, in queue order, ``size`` at a
        time, each batch with its dependencies: a listing of 100,000 tasks (``status
        --json``) holds one batch in memory, not every row."""
        where, args = _task_filter(states, None, latest)
        sql = f"SELECT {LISTED_COLUMNS} FROM tasks"
        if where:
            sql += " WHERE " + " AND ".join(where)
        rows = self._tuples(sql + " ORDER BY created, seq", args)
        while True:
            batch = rows.fetchmany(size)
            if not batch:
                return
            ids = [r[0] for r in batch]
            deps: dict[str, list[str]] = {}
            for tid, did in self.conn.execute(  # in the deps table's key order, as tasks() reads them
                f"SELECT task_id, dep_id FROM deps WHERE task_id IN ({','.join('?' * len(ids))})"
                " ORDER BY task_id, dep_id",
                ids,
            ):
                deps.setdefault(tid, []).append(did)
            read = self.spec_text
            yield [ListedTask.listed(r, deps.get(r[0], []), read) for r in batch]

    def _tuples(self, sql: str, args: list[Any]) -> sqlite3.Cursor:
        cur = self.conn.cursor()
        cur.row_factory = None  # plain tuples: a listing of 10,000 rows
        return cur.execute(sql, args)

    def spec_text(self, task_id: str) -> str:
        """A task's spec as its row holds it (JSON text)."""
        return str(self.conn.execute("SELECT spec FROM tasks WHERE id=?", (task_id,)).fetchone()[0])

    def count_tasks(
        self, states: Optional[set[State]] = None, queue_id: Optional[str] = None, at_most: Optional[int] = None
    ) -> int:
        """How many tasks (in ``states``, of ``queue_id``) the ledger holds; counted up to
        ``at_most`` only, when given (``at_most=1``: is there one?)."""
        where, args = _task_filter(states, queue_id, False)
        sql = "SELECT id FROM tasks" + (" WHERE " + " AND ".join(where) if where else "")
        if at_most is not None:
            sql += f" LIMIT {int(at_most)}"
        return int(self.conn.execute(f"SELECT count(*) FROM ({sql})", args).fetchone()[0])

    def run_tasks(self, queue_id: Optional[str], moved_after: Optional[int] = None) -> list[tuple[str, str, float]]:
        """(id, state, cost_usd) of a run's tasks, in queue order: those of ``queue_id``;
        else, with ``moved_after`` (a transition's id), those not terminal now and those
        with a transition after it (every task that moved since: a run's own, another
        shell's); else every task."""
        sql = "SELECT id, state, cost_usd FROM tasks"
        args: list[Any] = []
        if queue_id:
            sql += " WHERE queue_id=?"
            args.append(queue_id)
        elif moved_after is not None:
            sql += (
                " WHERE state NOT IN ('DONE','NEEDS_HUMAN','CANCELLED')"
                " OR id IN (SELECT task_id FROM transitions WHERE id > ?)"
            )
            args.append(moved_after)
        return [(r[0], r[1], r[2]) for r in self._tuples(sql + " ORDER BY created, seq", args)]

    def with_worktree(self, state: State) -> list[Task]:
        """The tasks in ``state`` whose worktree is still recorded (not removed), in queue
        order: a restart's adoption cleans up the DONE ones a crash left, without reading
        every DONE task of the ledger's history."""
        rows = self.conn.execute(
            "SELECT * FROM tasks WHERE state=? AND worktree IS NOT NULL ORDER BY created, seq", (state.value,)
        ).fetchall()
        return [self._row_to_task(r) for r in rows]

    def promotable(self, changed: Optional[Iterable[str]] = None) -> list[str]:
        """The ids of the PENDING tasks :func:`fleetrun.ops.promote` moves now, in queue
        order (read them with :meth:`listed_by_id`, a batch at a time): those
        every dependency of which is DONE, and those with one that needs a human or was
        cancelled. Found by query (the deps table, its index by dependency), so a loop
        keeps no PENDING task in memory.

        :param changed: only those among them that are in ``changed`` or depend on a
            task in it that has ended (the tasks that changed since the loop last looked:
            a dependency that ended frees its dependents; one that moved on but has not
            ended frees none); None: all of them (a loop's first pass).
        """
        # a dependency not in the ledger holds nothing up, as promote() reads it
        freed = (
            "(NOT EXISTS (SELECT 1 FROM deps d JOIN tasks x ON x.id=d.dep_id"
            " WHERE d.task_id=t.id AND x.state!='DONE') OR EXISTS (SELECT 1 FROM deps d JOIN tasks x"
            " ON x.id=d.dep_id WHERE d.task_id=t.id AND x.state IN ('NEEDS_HUMAN','CANCELLED')))"
        )
        # by id, the state is checked on the row (+: not through its index, which SQLite
        # would otherwise scan, every PENDING task, instead of looking the ids up)
        free, by_id = f"t.state='PENDING' AND {freed}", f"+t.state='PENDING' AND {freed}"
        found: list[tuple[float, int, str]] = []  # (created, seq, id): queue order
        if changed is None:
            # every PENDING task has a dependency (no task is deleted), and one that is freed
            # has one that ended: look from the smaller side, the PENDING tasks or the
            # ended ones' dependents (100,000 PENDING behind one task: no scan of them)
            ended = self.count_tasks({State.DONE, State.NEEDS_HUMAN, State.CANCELLED})
            if self.count_tasks({State.PENDING}) <= ended:
                sql = f"SELECT t.created, t.seq, t.id FROM tasks t WHERE {free}"
            else:
                sql = (  # CROSS JOIN: SQLite joins in the order written (the ended ones first)
                    "SELECT DISTINCT t.created, t.seq, t.id FROM tasks x CROSS JOIN deps e ON e.dep_id=x.id"
                    " CROSS JOIN tasks t ON t.id=e.task_id"
                    f" WHERE x.state IN ('DONE','NEEDS_HUMAN','CANCELLED') AND {free}"
                )
            found = self._tuples(sql, []).fetchall()
        else:
            ids = sorted(set(changed))
            for k in range(0, len(ids), 400):  # SQLite's limit on bound parameters (twice each)
                chunk = ids[k : k + 400]
                marks = ",".join("?" * len(chunk))
                found.extend(
                    self._tuples(
                        f"SELECT t.created, t.seq, t.id FROM tasks t WHERE t.id IN ({marks}) AND {by_id} UNION"
                        f" SELECT t.created, t.seq, t.id FROM tasks x CROSS JOIN deps e ON e.dep_id=x.id"
                        f" CROSS JOIN tasks t ON t.id=e.task_id WHERE x.id IN ({marks})"
                        f" AND +x.state IN ('DONE','NEEDS_HUMAN','CANCELLED') AND {by_id}",
                        chunk + chunk,
                    ).fetchall()
                )
        return [r[2] for r in sorted(set(found))]  # a task two changed ones free, once

    def listed_by_id(self, ids: list[str]) -> list[Task]:
        r"""The tasks of ``ids`` as :class:`~fleetrun.records.ListedTask`\ s (the spec read
        only if used), in the order of ``ids``; those not in the ledger left out."""
        got: dict[str, Task] = {}
        read = self.spec_text
        for k in range(0, len(ids), 500):
            chunk = ids[k : k + 500]
            marks = ",".join("?" * len(chunk))
            deps: dict[str, list[str]] = {}
            for tid, did in self.conn.execute(
                f"SELECT task_id, dep_id FROM deps WHERE task_id IN ({marks}) ORDER BY task_id, dep_id", chunk
            ):
                deps.setdefault(tid, []).append(did)
            for r in self._tuples(f"SELECT {LISTED_COLUMNS} FROM tasks WHERE id IN ({marks})", chunk):
                got[r[0]] = ListedTask.listed(r, deps.get(r[0], []), read)
        return [got[i] for i in ids if i in got]

    def deps(self, task_id: str) -> list[str]:
        return [r[0] for r in self.conn.execute("SELECT dep_id FROM deps WHERE task_id=?", (task_id,))]

    def dependents(self, task_id: str) -> list[str]:
        return [r[0] for r in self.conn.execute("SELECT task_id FROM deps WHERE dep_id=?", (task_id,))]

    def update_task(self, task_id: str, cur: Optional[sqlite3.Cursor] = None, **fields: Any) -> None:
        """Set bookkeeping columns (not ``state``: that goes through :meth:`transition`)."""
        if "state" in fields:
            raise ValueError("state changes go through transition()")
        if cur is not None:
            self._set(cur, "tasks", task_id, fields)
            return
        with self.tx() as c:
            self._set(c, "tasks", task_id, fields)

    @staticmethod
    def _set(cur: sqlite3.Cursor, table: str, row_id: str, fields: dict[str, Any]) -> None:
        if not fields:
            return
        cols = []
        vals = []
        for k, v in fields.items():
            if not k.isidentifier():
                raise ValueError(k)
            cols.append(f"{k}=?")
            vals.append(json.dumps(v) if isinstance(v, (dict, list)) else v)
        cur.execute(f"UPDATE {table} SET {', '.join(cols)} WHERE id=?", (*vals, row_id))

    # -- transitions --------------------------------------------------------------------

    def transition(
        self,
        task_id: str,
        expected: State | set[State],
        to: State,
        cause: str,
        attempt: Optional[int] = None,
        host: Optional[str] = None,
        cur: Optional[sqlite3.Cursor] = None,
        **fields: Any,
    ) -> State:
        """Compare-and-set the task's state and log the transition, in one transaction
        (``cur``'s, or a :meth:`tx` of its own).

        :param expected: the state (or states) the caller believes the task is in.
        :param fields: other task columns to set in the same transaction.
        :return: the state the task was in.
        :raises StateConflict: if the task is in another state (nothing is written).
        :raises ValueError: if the state machine does not allow the transition.
        """
        if cur is None:
            with self.tx() as c:
                return self.transition(task_id, expected, to, cause, attempt, host, cur=c, **fields)
        if not is_valid_cause(cause):
            raise ValueError(f"cause must be snake_case: {cause!r}")
        bad = {"state", "updated", "reason", "id"} & set(fields)
        if bad:
            raise ValueError(f"transition() sets {', '.join(sorted(bad))} itself")
        exp = {expected} if isinstance(expected, State) else set(expected)
        row = cur.execute("SELECT state FROM tasks WHERE id=?", (task_id,)).fetchone()
        if row is None:
            raise KeyError(task_id)
        current = State(row[0])
        if current not in exp:
            raise StateConflict(task_id, "/".join(sorted(s.value for s in exp)), current)
        if not allowed(current, to):
            raise ValueError(f"task {task_id}: {current} -> {to} is not allowed")
        now = time.time()
        sets = {"state": to.value, "updated": now, "reason": cause, **fields}
        cols = ", ".join(f"{k}=?" for k in sets)
        vals = [json.dumps(v) if isinstance(v, (dict, list)) else v for v in sets.values()]
        n = cur.execute(f"UPDATE tasks SET {cols} WHERE id=? AND state=?", (*vals, task_id, current.value)).rowcount
        if n != 1:  # pragma: no cover - BEGIN IMMEDIATE makes this unreachable
            raise StateConflict(task_id, current, "changed")
        self._log(cur, task_id, current, to, cause, now, attempt, host)
        return current

    @staticmethod
    def _log(
        cur: sqlite3.Cursor,
        task_id: str,
        src: Optional[State],
        dst: State,
        cause: str,
        now: float,
        attempt: Optional[int] = None,
        host: Optional[str] = None,
    ) -> None:
        cur.execute(
            "INSERT INTO transitions (task_id, from_state, to_state, cause, time, attempt, host)"
            " VALUES (?,?,?,?,?,?,?)",
            (task_id, src.value if src else None, dst.value, cause, now, attempt, host),
        )

    def transitions(self, task_id: Optional[str] = None) -> list[TransitionRow]:
        sql = "SELECT * FROM transitions" + (" WHERE task_id=?" if task_id else "") + " ORDER BY id"
        rows = self.conn.execute(sql, (task_id,) if task_id else ()).fetchall()
        return [TransitionRow.from_row(r) for r in rows]

    def transitions_after(self, after_id: int) -> list[TransitionRow]:
        """The transitions logged after row ``after_id``, oldest first, whoever made them
        (a running loop shows those another shell made: a ``cancel``, a ``retry``)."""
        rows = self.conn.execute("SELECT * FROM transitions WHERE id > ? ORDER BY id", (after_id,)).fetchall()
        return [TransitionRow.from_row(r) for r in rows]

    def last_transition_id(self) -> int:
        return int(self.conn.execute("SELECT COALESCE(MAX(id), 0) FROM transitions").fetchone()[0])

    # -- attempts ----------------------------------------------------------------------

    def lease(self, task_id: str, expected: State | set[State], host: str, kind: str, cause: str = "placed") -> Attempt:
        """Place a task: create its next attempt and move it to ASSIGNED, atomically."""
        now = time.time()
        with self.tx() as cur:
            n = (
                cur.execute("SELECT COALESCE(MAX(number), 0) FROM attempts WHERE task_id=?", (task_id,)).fetchone()[0]
                + 1
            )
            attempt_id = f"{task_id}_a{n}"
            self.transition(task_id, expected, State.ASSIGNED, cause, n, host, cur, attempts=n)
            cur.execute("UPDATE tasks SET host=? WHERE id=?", (host, task_id))
            cur.execute(
                "INSERT INTO attempts (id, task_id, number, kind, host, state, created) VALUES (?,?,?,?,?,?,?)",
                (attempt_id, task_id, n, kind, host, "leased", now),
            )
        att = self.attempt(attempt_id)
        assert att is not None
        return att

    def _row_to_attempt(self, row: sqlite3.Row) -> Attempt:
        return Attempt.from_row(row)

    def attempt(self, attempt_id: str) -> Optional[Attempt]:
        row = self.conn.execute("SELECT * FROM attempts WHERE id=?", (attempt_id,)).fetchone()
        return self._row_to_attempt(row) if row else None

    def attempts(
        self, task_id: Optional[str] = None, states: Optional[set[str]] = None, host: Optional[str] = None
    ) -> list[Attempt]:
        sql = "SELECT * FROM attempts"
        where: list[str] = []
        args: list[Any] = []
        if host:
            where.append("host=?")
            args.append(host)
        if task_id:
            where.append("task_id=?")
            args.append(task_id)
        if states:
            where.append(f"state IN ({','.join('?' * len(states))})")
            args.extend(states)
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY created, number"
        return [self._row_to_attempt(r) for r in self.conn.execute(sql, args)]

    def unknown_cost(self) -> set[str]:
        """The tasks with an ended attempt whose cost is unknown: their cost is a floor."""
        return {r[0] for r in self.conn.execute("SELECT DISTINCT task_id FROM attempts WHERE cost_usd IS NULL")}

    def latest_attempt(self, task_id: str) -> Optional[Attempt]:
        row = self.conn.execute(
            "SELECT * FROM attempts WHERE task_id=? ORDER BY number DESC LIMIT 1", (task_id,)
        ).fetchone()
        return self._row_to_attempt(row) if row else None

    def update_attempt(self, attempt_id: str, cur: Optional[sqlite3.Cursor] = None, **fields: Any) -> None:
        if cur is not None:
            self._set(cur, "attempts", attempt_id, fields)
            return
        with self.tx() as c:
            self._set(c, "attempts", attempt_id, fields)

    # -- verdicts ----------------------------------------------------------------------

    def add_verdict(
        self, task_id: str, attempt_id: str, idx: int, v: Any, cur: Optional[sqlite3.Cursor] = None
    ) -> bool:
        """Record verifier ``idx`` of an attempt; a second record of it is ignored.

        :return: True if this call recorded it.
        """
        if cur is None:
            with self.tx() as c:
                return self.add_verdict(task_id, attempt_id, idx, v, cur=c)
        n = cur.execute(
            "INSERT OR IGNORE INTO verdicts (task_id, attempt_id, idx, kind, label, passed, reason,"
            " output, cost_usd, duration_s, host, time) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                task_id,
                attempt_id,
                idx,
                v.kind,
                v.label,
                int(v.passed),
                v.reason,
                v.output,
                v.cost_usd,
                v.duration_s,
                v.host,
                time.time(),
            ),
        ).rowcount
        if n and v.cost_usd:
            cur.execute("UPDATE tasks SET cost_usd = cost_usd + ? WHERE id=?", (v.cost_usd, task_id))
        return bool(n)

    def verdicts(self, task_id: Optional[str] = None, attempt_id: Optional[str] = None) -> list[VerdictRow]:
        sql = "SELECT * FROM verdicts"
        if attempt_id:
            rows = self.conn.execute(sql + " WHERE attempt_id=? ORDER BY idx", (attempt_id,))
        elif task_id:
            rows = self.conn.execute(sql + " WHERE task_id=? ORDER BY id", (task_id,))
        else:
            rows = self.conn.execute(sql + " ORDER BY id")
        return [VerdictRow.from_row(r) for r in rows]

    def branch_owner(self, name: str, branch: str, repo: str) -> Optional[str]:
        """The id of the newest task named ``name`` that worked on ``branch`` in the
        repository at ``repo`` (its attempts' workspaces say where), or None.

        A task's ``branch`` column is only set from the workspace fleetrun prepared for
        it, and collection refuses a ``branch =`` that exists and is not fleetrun's, so a
        hit means fleetrun created that branch for a task of this name.
        """
        want = os.path.realpath(repo)
        rows = self.conn.execute(
            "SELECT id, spec FROM tasks WHERE name=? AND branch=? ORDER BY created DESC, seq DESC", (name, branch)
        ).fetchall()
        for row in rows:
            where = [str((a.workspace or {}).get("repo") or "") for a in self.attempts(row["id"])]
            where = [w for w in where if w] or [str(self._spec(row["spec"]).cwd)]
            for w in where:
                real = os.path.realpath(w)
                if real == want or real.startswith(want.rstrip(os.sep) + os.sep):
                    return str(row["id"])
        return None

    # -- notes -------------------------------------------------------------------------

    def add_note(self, task_id: str, text: str, cur: Optional[sqlite3.Cursor] = None) -> None:
        """Something the log should say about a task that is not a state change (in the
        transaction of ``cur``, when given)."""
        if cur is not None:
            cur.execute("INSERT INTO notes (task_id, time, text) VALUES (?,?,?)", (task_id, time.time(), text))
            return
        with self.tx() as c:
            c.execute("INSERT INTO notes (task_id, time, text) VALUES (?,?,?)", (task_id, time.time(), text))

    def notes(self, task_id: str) -> list[tuple[float, str]]:
        return [
            (r[0], r[1])
            for r in self.conn.execute("SELECT time, text FROM notes WHERE task_id=? ORDER BY id", (task_id,))
        ]

    # -- links -------------------------------------------------------------------------

    def set_link(self, task_id: str, name: str, url: str) -> None:
        """Record (or replace) the task's link called ``name`` (:mod:`fleetrun.links`
        checks both first)."""
        with self.tx() as cur:
            cur.execute(
                "INSERT OR REPLACE INTO links (task_id, name, url, time) VALUES (?,?,?,?)",
                (task_id, name, url, time.time()),
            )

    def links(self, task_id: Optional[str] = None) -> dict[str, dict[str, tuple[float, str]]]:
        """The links, task id -> name -> (time, url); of one task, or of all."""
        rows = self.conn.execute(
            "SELECT task_id, name, url, time FROM links"
            + (" WHERE task_id=?" if task_id else "")
            + " ORDER BY time, name",
            (task_id,) if task_id else (),
        )
        out: dict[str, dict[str, tuple[float, str]]] = {}
        for r in rows:
            out.setdefault(r[0], {})[r[1]] = (r[3], r[2])
        return out

    # -- meta --------------------------------------------------------------------------

    def usage_pauses(self) -> dict[str, tuple[float, int]]:
        """The usage-limit pauses: host -> (until, limits in a row), kept in the meta
        table (``usage_pause``) so that a restarted loop starts nothing before the reset
        time the agent reported. A value that is not what :meth:`set_usage_pauses`
        writes is no pause (the meta table needs no new schema version)."""
        try:
            raw = json.loads(self.get_meta("usage_pause") or "{}")
        except ValueError:
            return {}
        out: dict[str, tuple[float, int]] = {}
        if isinstance(raw, dict):
            for host, v in raw.items():
                if (
                    isinstance(host, str)
                    and isinstance(v, list)
                    and len(v) == 2
                    and isinstance(v[0], (int, float))
                    and not isinstance(v[0], bool)
                    and isinstance(v[1], int)
                    and not isinstance(v[1], bool)
                ):
                    out[host] = (float(v[0]), v[1])
        return out

    def set_usage_pauses(self, pauses: dict[str, tuple[float, int]]) -> None:
        self.set_meta("usage_pause", json.dumps({h: [u, n] for h, (u, n) in pauses.items()}) if pauses else None)


#: The run's open ledger: one SQLite connection shared by the loop, the verbs and the
#: plugins of one invocation (the CLI pops and closes it as the run ends).
LEDGER_KEY = StashKey[Ledger]()


def open_ledger(config: Config) -> Ledger:
    """The run's ledger, ``state.db`` in ``config.home``: opened on first use and kept in
    ``config.stash[LEDGER_KEY]`` (the CLI closes it as the run ends).

    :param config: the run's :class:`~fleetrun.config.Config` (untyped here: the ledger
        imports nothing above it).
    """
    led = config.stash.get(LEDGER_KEY)
    if led is None:
        led = config.stash[LEDGER_KEY] = Ledger(config.home / "state.db")
    assert isinstance(led, Ledger)
    return led


def _task_filter(states: Optional[set[State]], queue_id: Optional[str], latest: bool) -> tuple[list[str], list[Any]]:
    """The WHERE terms (and their arguments) of a listing of the tasks in ``states``, of
    ``queue_id``, only each name's latest run (``latest``)."""
    where: list[str] = []
    args: list[Any] = []
    if states:
        where.append(f"state IN ({','.join('?' * len(states))})")
        args.extend(s.value for s in states)
    if queue_id:
        where.append("queue_id=?")
        args.append(queue_id)
    if latest:
        where.append(LATEST)
    return where, args

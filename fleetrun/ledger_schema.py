"""The ledger's file: its private folder and mode, the connection's pragmas, the
schema and its migrations, and the write transaction every change goes through.

Durability: WAL with ``synchronous=FULL``, so every commit is an fsync: the loop
writes a whole pass in one transaction (:meth:`LedgerFile.batch`) and commits before an
effect that needs its writes (:meth:`LedgerFile.durable`). In WAL mode NORMAL survives a process
crash but can lose the last commits on power loss; a lost "attempt started" row is
exactly what could make a task run twice after a reboot, and a transition costs
well under a millisecond either way next to an agent session of minutes
(``bench/ledger.py`` measures both). So FULL.

:class:`LedgerFile` is the base of :class:`fleetrun.ledger.Ledger`, which adds the
rows; this module knows no row type and imports nothing of the loop, the plugins or
the CLI.
"""

from __future__ import annotations

import os
import re
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Optional, TypeVar

from .exceptions import UsageError

SCHEMA_VERSION = 4

#: Covering indexes for the listings (``status``): each name's latest run found in the
#: index alone (:data:`LATEST` asks, for every row, whether a later task
#: of its name exists), and the table's columns in queue order, so the listing reads
#: neither the rows' specs (most of a row's bytes) nor sorts.
LISTING_INDEXES = (
    ("tasks_latest", "CREATE INDEX IF NOT EXISTS tasks_latest ON tasks(name, created, seq)"),
    (
        "tasks_listing",
        "CREATE INDEX IF NOT EXISTS tasks_listing ON tasks(created, seq, state, name, attempts, host,"
        " cost_usd, branch, worktree, reason, id)",
    ),
)

#: A ``WHERE`` condition on ``tasks``: the row is its name's latest run (no task of
#: that name was queued after it: the task a name stands for, as ``logs NAME`` and the
#: selectors of ``retry``/``approve`` resolve it), or a run that has not ended (an
#: interrupted run's task still works besides the new one's). A file run three times
#: holds three tasks of each name; what needs a person now is the latest. Here, beside
#: the index it reads (``tasks_latest``), so ``status`` reads the ledger without the
#: row types of :mod:`fleetrun.ledger`; that module re-exports it.
LATEST = (
    "(state NOT IN ('DONE','NEEDS_HUMAN','CANCELLED') OR NOT EXISTS (SELECT 1 FROM tasks AS later"
    " WHERE later.name=tasks.name AND (later.created>tasks.created"
    " OR (later.created=tasks.created AND later.seq>tasks.seq))))"
)


_SCHEMA = """
CREATE TABLE IF NOT EXISTS tasks (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    state       TEXT NOT NULL,
    spec        TEXT NOT NULL,
    source      TEXT NOT NULL DEFAULT '',
    queue_id    TEXT NOT NULL DEFAULT '',
    seq         INTEGER NOT NULL DEFAULT 0,
    created     REAL NOT NULL,
    updated     REAL NOT NULL,
    host        TEXT,
    worktree    TEXT,
    branch      TEXT,
    cost_usd    REAL NOT NULL DEFAULT 0,
    attempts    INTEGER NOT NULL DEFAULT 0,
    retries     INTEGER NOT NULL DEFAULT 0,
    resumes     INTEGER NOT NULL DEFAULT 0,
    no_start    INTEGER NOT NULL DEFAULT 0,
    reason      TEXT NOT NULL DEFAULT '',
    handoff     TEXT
);
CREATE INDEX IF NOT EXISTS tasks_name ON tasks(name, created);
CREATE INDEX IF NOT EXISTS tasks_state ON tasks(state);
CREATE TABLE IF NOT EXISTS deps (
    task_id TEXT NOT NULL REFERENCES tasks(id),
    dep_id  TEXT NOT NULL REFERENCES tasks(id),
    PRIMARY KEY (task_id, dep_id)
);
CREATE INDEX IF NOT EXISTS deps_dep ON deps(dep_id);
CREATE TABLE IF NOT EXISTS queues (
    id          TEXT PRIMARY KEY,
    source      TEXT NOT NULL,
    source_hash TEXT NOT NULL,
    created     REAL NOT NULL,
    settings    TEXT
);
CREATE TABLE IF NOT EXISTS attempts (
    id          TEXT PRIMARY KEY,
    task_id     TEXT NOT NULL REFERENCES tasks(id),
    number      INTEGER NOT NULL,
    kind        TEXT NOT NULL,
    host        TEXT NOT NULL,
    state       TEXT NOT NULL,
    dir         TEXT,
    workspace   TEXT,
    created     REAL NOT NULL,
    started     REAL,
    ended       REAL,
    exit_code   INTEGER,
    outcome     TEXT,
    session_id  TEXT,
    cost_usd    REAL DEFAULT 0,
    result_text TEXT,
    shepherd_pid   INTEGER,
    shepherd_token TEXT,
    info        TEXT,
    UNIQUE (task_id, number)
);
CREATE INDEX IF NOT EXISTS attempts_state ON attempts(state);
CREATE TABLE IF NOT EXISTS verdicts (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id     TEXT NOT NULL REFERENCES tasks(id),
    attempt_id  TEXT NOT NULL REFERENCES attempts(id),
    idx         INTEGER NOT NULL,
    kind        TEXT NOT NULL,
    label       TEXT NOT NULL,
    passed      INTEGER NOT NULL,
    reason      TEXT NOT NULL,
    output      TEXT NOT NULL,
    cost_usd    REAL NOT NULL DEFAULT 0,
    duration_s  REAL NOT NULL DEFAULT 0,
    host        TEXT NOT NULL DEFAULT 'local',
    time        REAL NOT NULL,
    UNIQUE (attempt_id, idx)
);
CREATE TABLE IF NOT EXISTS transitions (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id     TEXT NOT NULL REFERENCES tasks(id),
    from_state  TEXT,
    to_state    TEXT NOT NULL,
    cause       TEXT NOT NULL,
    time        REAL NOT NULL,
    attempt     INTEGER,
    host        TEXT
);
CREATE INDEX IF NOT EXISTS transitions_task ON transitions(task_id, id);
CREATE TABLE IF NOT EXISTS notes (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id TEXT NOT NULL REFERENCES tasks(id),
    time    REAL NOT NULL,
    text    TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS links (
    task_id TEXT NOT NULL REFERENCES tasks(id),
    name    TEXT NOT NULL,
    url     TEXT NOT NULL,
    time    REAL NOT NULL,
    PRIMARY KEY (task_id, name)
);
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"""

#: The tables of a ledger (and SQLite's own); a database with others is not one.
_TABLES = frozenset(
    {"tasks", "deps", "queues", "attempts", "verdicts", "transitions", "notes", "links", "meta", "sqlite_sequence"}
)


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` (and any missing parents, each 0700); tighten it if it exists."""
    missing = []
    p = path
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        d.mkdir(mode=0o700, exist_ok=True)
        os.chmod(d, 0o700)  # mkdir's mode is masked by the umask
    try:
        if path.stat().st_mode & 0o077:
            os.chmod(path, 0o700)
    except OSError:
        pass
    return path


_Self = TypeVar("_Self", bound="LedgerFile")


class LedgerFile:
    """The SQLite file at ``path``, opened, checked and migrated. One connection per
    instance; not thread-safe."""

    def __init__(self, path: Path | str, timeout_s: float = 30.0, readonly: bool = False) -> None:
        """
        :param readonly: only read the ledger (``fleetrun report``): nothing is created,
            switched or migrated, so a home on a read-only mount, or one this process may
            not write, is read as it is (:meth:`_open_readonly`).
        """
        self.path = Path(path)
        self._after: list[Callable[[], None]] = []
        if readonly:
            self.conn = self._open_readonly(timeout_s)
            return
        ensure_private_dir(self.path.parent)
        if not self.path.exists():
            fd = os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600)
            os.close(fd)
        else:
            self._check_not_emptied()
        self.conn = sqlite3.connect(str(self.path), timeout=timeout_s, isolation_level=None)
        try:
            self.conn.row_factory = sqlite3.Row
            self.conn.execute(f"PRAGMA busy_timeout={int(timeout_s * 1000)}")
            self._enable_wal(timeout_s)
            self.conn.execute("PRAGMA synchronous=FULL")
            self.conn.execute("PRAGMA foreign_keys=ON")
            self._migrate()
        except sqlite3.DatabaseError as e:
            self.conn.close()
            if isinstance(e, sqlite3.OperationalError):  # locked, busy, disk full: not the file's fault
                raise
            # garbage, or a truncated copy: "file is not a database", "disk image is malformed"
            raise self._not_a_ledger(str(e)) from None
        except BaseException:
            self.conn.close()
            raise

    def _open_readonly(self, timeout_s: float) -> sqlite3.Connection:
        """A connection that writes nothing. ``mode=ro`` reads the WAL too (a running
        loop's newest rows); where SQLite cannot even make the WAL's shared-memory file
        (a read-only mount), ``immutable=1`` reads the database file as it is: rows a
        loop still holds in its WAL are not seen, which is why it is the fallback."""
        from urllib.parse import quote

        if not self.path.is_file():
            raise UsageError("no ledger here: nothing has been queued in this home", file=str(self.path))
        base = "file:" + quote(str(self.path.resolve()))
        conn: Optional[sqlite3.Connection] = None
        for mode in ("mode=ro", "immutable=1"):
            conn = sqlite3.connect(f"{base}?{mode}", uri=True, timeout=timeout_s, isolation_level=None)
            try:
                conn.row_factory = sqlite3.Row
                version = conn.execute("PRAGMA user_version").fetchone()[0]
                break
            except sqlite3.OperationalError:
                conn.close()
                if mode == "immutable=1":
                    raise
            except sqlite3.DatabaseError as e:
                conn.close()
                raise self._not_a_ledger(str(e)) from None
        assert conn is not None
        if version != SCHEMA_VERSION:
            conn.close()
            raise UsageError(
                f"the ledger has schema version {version} and this fleetrun reads {SCHEMA_VERSION}; "
                "run a fleetrun command that writes it (status) with this version first",
                file=str(self.path),
            )
        return conn

    def _not_a_ledger(self, why: str) -> UsageError:
        return UsageError(f"not a fleetrun ledger ({why}); move it aside to start a new one", file=str(self.path))

    def _check_not_emptied(self) -> None:
        """SQLite takes a 0-byte file for a new database. fleetrun's first open writes
        the header at once (switching to WAL does), so a 0-byte ledger next to a WAL
        file, or in a home that holds attempts or worktrees, is one whose tasks were
        lost: refuse to start afresh over it. A 0-byte file with nothing around it (a
        first open that stopped before the schema was written) is initialised."""
        try:
            if self.path.stat().st_size != 0:
                return
        except OSError:
            return
        why = None
        for side in ("-wal", "-journal"):
            if os.path.exists(str(self.path) + side):
                why = f"a {self.path.name}{side} file is beside it"
                break
        if why is None:
            home = self.path.parent
            for sub, what in (("attempts", "attempt folders"), ("worktrees", "worktrees")):
                try:
                    if any((home / sub).iterdir()):
                        why = f"{home / sub} holds {what} of earlier tasks"
                        break
                except OSError:
                    continue
        if why is not None:
            raise UsageError(
                f"the ledger is empty (0 bytes) but {why}, so its tasks were lost; move it aside to start a new one",
                file=str(self.path),
            )

    def _enable_wal(self, timeout_s: float) -> None:
        # Switching to WAL needs an exclusive lock and SQLite answers "locked" at once
        # (without the busy timeout) while another process writes: retry until the timeout.
        deadline = time.monotonic() + timeout_s
        delay = 0.005
        while True:
            try:
                mode = self.conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
                break
            except sqlite3.OperationalError as e:
                if ("locked" not in str(e) and "busy" not in str(e)) or time.monotonic() >= deadline:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 0.1)
        if str(mode).lower() != "wal":
            raise UsageError(f"the ledger cannot use WAL mode here (journal_mode={mode})", file=str(self.path))

    def close(self) -> None:
        self.conn.close()

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _migrate(self) -> None:
        version = self.conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise UsageError(
                f"the ledger has schema version {version}, newer than this fleetrun "
                f"understands ({SCHEMA_VERSION}); upgrade fleetrun, or use another "
                "FLEETRUN_HOME",
                file=str(self.path),
            )
        if version == 0:
            # a database of another program: adding our tables to it would be wrong twice
            foreign = sorted(
                r[0]
                for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
                if r[0] not in _TABLES
            )
            if foreign:
                raise self._not_a_ledger(f"it holds the tables {', '.join(foreign[:5])}")
        if version < SCHEMA_VERSION:
            with self.tx() as cur:
                if cur.execute("PRAGMA user_version").fetchone()[0] >= SCHEMA_VERSION:
                    return  # another process migrated it meanwhile
                for stmt in _SCHEMA.split(";"):
                    if stmt.strip():
                        cur.execute(stmt)
                cols = {r[1] for r in cur.execute("PRAGMA table_info(queues)")}
                if "settings" not in cols:  # version 2 -> 3
                    cur.execute("ALTER TABLE queues ADD COLUMN settings TEXT")
                # version 3 -> 4: the links table (a plugin's links of a task: a pull
                # request...), made by its CREATE TABLE IF NOT EXISTS above; nothing else
                # changes, so an older ledger keeps every row
                cur.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        self._attempt_cost_nullable()
        self._listing_indexes()

    def _listing_indexes(self) -> None:
        """The indexes ``status`` reads its rows from (:data:`LISTING_INDEXES`), added to
        a ledger of any version that lacks them: an index changes no row and no query's
        answer, so an older fleetrun reads the ledger as before (no version bump). One
        query when they are there; building them over 100,000 tasks takes about a second,
        once."""
        names = [name for name, _sql in LISTING_INDEXES]
        have = {
            r[0]
            for r in self.conn.execute(
                f"SELECT name FROM sqlite_master WHERE type='index' AND name IN ({','.join('?' * len(names))})", names
            )
        }
        if len(have) == len(names):
            return
        with self.tx() as cur:
            for _name, sql in LISTING_INDEXES:
                cur.execute(sql)

    def _attempt_cost_nullable(self) -> None:
        """Ledgers made before an attempt's cost could be unknown have
        ``attempts.cost_usd ... NOT NULL``: rebuild that one table without the constraint.

        Keyed on the constraint itself, not on ``user_version`` (another migration may
        bump the version at the same time): it runs once, whatever the version says,
        keeps whatever columns the table has, and is a no-op afterwards (one PRAGMA).
        """

        def not_null() -> bool:
            return any(r[1] == "cost_usd" and r[3] for r in self.conn.execute("PRAGMA table_info(attempts)"))

        if not not_null():
            return
        # a table rebuild needs foreign keys off, which cannot change inside a transaction
        self.conn.execute("PRAGMA foreign_keys=OFF")
        try:
            with self.tx() as cur:
                if not not_null():
                    return  # another process rebuilt it meanwhile
                sql = cur.execute("SELECT sql FROM sqlite_master WHERE type='table' AND name='attempts'").fetchone()[0]
                new = re.sub(r"(\bcost_usd\s+REAL)\s+NOT\s+NULL", r"\1", sql, count=1, flags=re.I)
                new = re.sub(
                    r"^CREATE TABLE\s+(IF NOT EXISTS\s+)?\"?attempts\"?",
                    "CREATE TABLE attempts_new",
                    new,
                    count=1,
                    flags=re.I,
                )
                indexes = [
                    r[0]
                    for r in cur.execute(
                        "SELECT sql FROM sqlite_master WHERE type='index' AND tbl_name='attempts' AND sql IS NOT NULL"
                    )
                ]
                cur.execute(new)
                cur.execute("INSERT INTO attempts_new SELECT * FROM attempts")
                cur.execute("DROP TABLE attempts")
                cur.execute("ALTER TABLE attempts_new RENAME TO attempts")
                for index in indexes:
                    cur.execute(index)
                if cur.execute("PRAGMA foreign_key_check").fetchone() is not None:
                    raise sqlite3.IntegrityError("foreign keys broken by the attempts rebuild")
        finally:
            self.conn.execute("PRAGMA foreign_keys=ON")

    # -- writing: one transaction per write, or one per pass (a batch) -----------------

    #: How long a batch may hold SQLite's write lock before a write in it commits what
    #: is pending (:meth:`tx`, :meth:`bound`): a ``cancel`` from another shell, a role
    #: session's ``mailbox done`` or a shepherd-side verb waits at most about this long
    #: behind a pass (readers never wait: WAL).
    BATCH_HOLD_S = 0.2

    _batch_open = False
    _tx_depth = 0
    _began = 0.0
    #: the COMMITs this connection made (bench/ledger.py, the tests count them)
    commits = 0

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Cursor]:
        """One write transaction (BEGIN IMMEDIATE: writers queue on the busy timeout).

        Inside :meth:`batch` it is a SAVEPOINT of the batch's one transaction instead: an
        exception rolls back this block's writes alone, and nothing is committed until
        the batch's next :meth:`durable` point or its end."""
        cur = self.conn.cursor()
        if not self._batch_open:
            cur.execute("BEGIN IMMEDIATE")
            try:
                yield cur
                cur.execute("COMMIT")
            except BaseException:
                if self.conn.in_transaction:
                    self.conn.execute("ROLLBACK")
                raise
            self.commits += 1
            return
        if not self.conn.in_transaction:  # the batch's first write since its last commit
            cur.execute("BEGIN IMMEDIATE")
            self._began = time.monotonic()
        name = f"fleetrun_tx{self._tx_depth}"
        cur.execute(f"SAVEPOINT {name}")
        self._tx_depth += 1
        try:
            yield cur
        except BaseException:
            if self.conn.in_transaction:
                self.conn.execute(f"ROLLBACK TO {name}")
                self.conn.execute(f"RELEASE {name}")
            else:  # SQLite rolled the whole transaction back (a full disk, say): none of it is written
                self._after.clear()
            raise
        else:
            cur.execute(f"RELEASE {name}")
        finally:
            self._tx_depth -= 1
        self.bound()

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Make every :meth:`tx` inside one transaction: the loop's pass, one commit (one
        fsync) for the transitions, notes and verdicts it decides, instead of one each.

        The transaction begins with the first write (a pass that writes nothing takes
        no lock and commits nothing) and is committed at the end, also when an
        exception ends the batch (what each inner block wrote is whole: a failed block
        rolled itself back, as a separate transaction would have been). Where an effect
        outside the ledger must find a write durable first, the caller calls
        :meth:`durable`; a batch holding the lock longer than :attr:`BATCH_HOLD_S`
        commits at its next write. A crash loses only what was not committed yet: the
        pass's decisions, which the restart makes again (docs/durability.md).
        Callbacks of :meth:`after_commit` run after each commit, in order."""
        if self._batch_open:  # nested: part of the open one
            yield
            return
        self._batch_open = True
        try:
            yield
        finally:
            try:
                self._commit_batch()
            finally:
                self._batch_open = False
                # what was committed is told, outside the batch (a callback's writes commit at once)
                self._deliver()

    def durable(self) -> None:
        """Commit what the open batch has written so far (a no-op outside a batch, or
        when nothing is pending); the batch goes on in a new transaction at its next
        write. Called before an effect that a restart must find recorded."""
        if not self.pending():
            return
        if self._tx_depth:
            raise RuntimeError("durable() inside a write transaction")
        self._commit_batch()
        self._deliver()

    def pending(self) -> bool:
        """Whether the open batch holds writes not committed yet."""
        return self._batch_open and self.conn.in_transaction

    def bound(self) -> None:
        """Commit the open batch if it has held the write lock longer than
        :attr:`BATCH_HOLD_S` (the loop calls it between its stages too)."""
        if (
            self._batch_open
            and not self._tx_depth
            and self.conn.in_transaction
            and time.monotonic() - self._began > self.BATCH_HOLD_S
        ):
            self.durable()

    def after_commit(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` once what was written so far is committed: now outside a batch
        (every write there is committed when its :meth:`tx` ends), else after the
        batch's next commit. The loop queues ``fleetrun_transition`` here, so a hook
        hears only of moves that are committed, in the order they were made."""
        if not self._batch_open or (not self.conn.in_transaction and not self._after):
            fn()  # everything written is committed already
            return
        self._after.append(fn)

    def _commit_batch(self) -> None:
        if not self.conn.in_transaction:
            return
        from . import crash  # a leaf module: the crash tests stop a batch before its commit

        crash.point("before_batch_commit")
        try:
            self.conn.execute("COMMIT")
        except BaseException:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
            self._after.clear()  # nothing of it is committed: nothing to tell
            raise
        self.commits += 1

    def _deliver(self) -> None:
        # what the callbacks write is told after it is committed in turn: at once outside
        # a batch, at the batch's next commit inside one
        pending, self._after = self._after, []
        for i, fn in enumerate(pending):
            try:
                fn()
            except BaseException:
                self._after[:0] = pending[i + 1 :]  # told at the next commit, still in order
                raise

    def get_meta(self, key: str, default: Optional[str] = None) -> Optional[str]:
        row = self.conn.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return row[0] if row else default

    def set_meta(self, key: str, value: Optional[str]) -> None:
        with self.tx() as cur:
            if value is None:
                cur.execute("DELETE FROM meta WHERE key=?", (key,))
            else:
                cur.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?,?)", (key, value))

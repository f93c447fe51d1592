"""The mailbox's own tables in the ledger file (``state.db``): roles, the edits that give
a role its focus, and the messages delivered to roles.

The tables are the plugin's, not the core's: made with ``CREATE TABLE IF NOT EXISTS`` on
first use (no core schema change, no migration), named ``mailbox_*`` so they never meet
a table of the core's. Every write is one transaction (``BEGIN IMMEDIATE``); every read
works on a bare :class:`sqlite3.Connection`, so the verbs a role's session runs and the
Stop hook's fast path need no loop and no :class:`~fleetrun.ledger.Ledger` (the loop
passes its ledger's connection).

Times of messages (``created``, ``claimed``, ``ended``) are the loop's clock
(:func:`fleetrun.clock.now`), so a test moves the claim timeout forward without sleeping.
"""

from __future__ import annotations

import os
import re
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Optional

#: Names no role may take (case-insensitive): who sends work and who watches it.
RESERVED = frozenset({"supervisor", "operator"})
#: A role's name: it is typed on command lines (``--role NAME``) and shown in causes.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
#: The longest message body kept (the prompt a role's session is given).
BODY_CAP = 64 * 1024
#: A summary or a reason a session reports, as kept.
REPORT_CAP = 4000
#: Edits kept per role, for its focus.
EDITS_KEPT = 50

MESSAGE_STATES = ("pending", "claimed", "done", "failed", "withdrawn")

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS mailbox_roles (
        name_key TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        dir TEXT NOT NULL,
        pid INTEGER,
        pid_started REAL,
        bound_at REAL NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS mailbox_role_edits (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        role_key TEXT NOT NULL,
        pid INTEGER,
        path TEXT NOT NULL,
        at REAL NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS mailbox_role_edits_role ON mailbox_role_edits (role_key, id)",
    """CREATE TABLE IF NOT EXISTS mailbox_messages (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        role TEXT NOT NULL,
        role_key TEXT NOT NULL,
        task_id TEXT NOT NULL,
        attempt_id TEXT NOT NULL UNIQUE,
        priority INTEGER NOT NULL DEFAULT 0,
        body TEXT NOT NULL,
        why TEXT NOT NULL DEFAULT '',
        state TEXT NOT NULL,
        created REAL NOT NULL,
        claimed REAL,
        claimed_by_pid INTEGER,
        ended REAL,
        summary TEXT,
        reason TEXT)""",
    "CREATE INDEX IF NOT EXISTS mailbox_messages_role ON mailbox_messages (role_key, state)",
    "CREATE INDEX IF NOT EXISTS mailbox_messages_task ON mailbox_messages (task_id)",
)


class StoreError(ValueError):
    """A name, folder or report the mailbox refuses; the message says why."""


@dataclass(frozen=True)
class Role:
    """A bound role: a name, a canonical folder, and optionally the process bound to it."""

    name: str
    dir: str
    pid: Optional[int] = None
    pid_started: Optional[float] = None
    bound_at: float = 0.0

    @property
    def key(self) -> str:
        return self.name.lower()


@dataclass(frozen=True)
class Message:
    """A task delivered to a role's mailbox (one per attempt)."""

    id: int
    role: str
    task_id: str
    attempt_id: str
    priority: int
    body: str
    why: str
    state: str
    created: float
    claimed: Optional[float] = None
    claimed_by_pid: Optional[int] = None
    ended: Optional[float] = None
    summary: Optional[str] = None
    reason: Optional[str] = None


def connect(path: str, timeout_s: float = 10.0) -> sqlite3.Connection:
    """A bare connection to the ledger file, for the verbs and the Stop hook (the loop
    uses its ledger's). WAL is the ledger's own setting and stays."""
    conn = sqlite3.connect(path, timeout=timeout_s, isolation_level=None)
    conn.row_factory = sqlite3.Row
    conn.execute(f"PRAGMA busy_timeout={int(timeout_s * 1000)}")
    return conn


@contextmanager
def tx(conn: sqlite3.Connection) -> Iterator[sqlite3.Cursor]:
    """One write transaction, the tables made first if they are not there yet."""
    cur = conn.cursor()
    if conn.in_transaction:
        # the loop's connection, in its pass's open transaction (Ledger.batch): a part of
        # it, committed with the pass
        cur.execute("SAVEPOINT mailbox_tx")
        try:
            for stmt in SCHEMA:
                cur.execute(stmt)
            yield cur
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK TO mailbox_tx")
                conn.execute("RELEASE mailbox_tx")
            raise
        cur.execute("RELEASE mailbox_tx")
        return
    cur.execute("BEGIN IMMEDIATE")
    try:
        for stmt in SCHEMA:
            cur.execute(stmt)
        yield cur
        cur.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def _rows(conn: sqlite3.Connection, sql: str, args: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
    """A read that finds no table yet as no rows (nothing was ever bound or delivered)."""
    try:
        return list(conn.execute(sql, args))
    except sqlite3.OperationalError as e:
        if "no such table" in str(e):
            return []
        raise


# -- checks ---------------------------------------------------------------------------


def check_name(name: str) -> str:
    """A role name as given, checked.

    :raises StoreError: a reserved name, or one that is not a short word.
    """
    if name.lower() in RESERVED:
        raise StoreError(f"{name!r} is reserved (supervisor and operator name fleetrun's own sides)")
    if not NAME_RE.match(name):
        raise StoreError(
            f"{name!r} is not a role name: letters, digits, '.', '_' and '-', "
            "starting with a letter or digit, at most 64"
        )
    return name


def check_dir(path: str) -> str:
    """A role's folder, canonical (``realpath``: ``/tmp`` and its real path are one place).

    :raises StoreError: control characters in it, or no such folder.
    """
    from ...textutil import safe_text

    if any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in path):
        raise StoreError(f"{safe_text(path)!r} has control characters in it")
    real = os.path.realpath(os.path.abspath(os.path.expanduser(path)))
    if not os.path.isdir(real):
        raise StoreError(f"{safe_text(path)!r} is not a folder")
    return real


def clean_text(text: str, cap: int) -> str:
    """Text kept for an agent to read: control characters stripped, capped."""
    from ...textutil import strip_control

    text = strip_control(text)
    return text if len(text) <= cap else text[: cap - 20] + "\n[... cut by fleetrun]"


# -- roles ----------------------------------------------------------------------------


def _role(row: sqlite3.Row) -> Role:
    return Role(
        name=row["name"], dir=row["dir"], pid=row["pid"], pid_started=row["pid_started"], bound_at=row["bound_at"]
    )


def roles(conn: sqlite3.Connection) -> list[Role]:
    """Every bound role, by name."""
    return [_role(r) for r in _rows(conn, "SELECT * FROM mailbox_roles ORDER BY name_key")]


def bind(
    conn: sqlite3.Connection, name: str, directory: str, pid: Optional[int] = None, pid_started: Optional[float] = None
) -> Role:
    """Bind (or bind again) ``name`` to ``directory`` and optionally a process; one
    transaction. The name and folder are checked here (:func:`check_name`, :func:`check_dir`)."""
    check_name(name)
    real = check_dir(directory)
    now = time.time()
    with tx(conn) as cur:
        cur.execute(
            "INSERT INTO mailbox_roles (name_key, name, dir, pid, pid_started, bound_at) VALUES (?,?,?,?,?,?) "
            "ON CONFLICT(name_key) DO UPDATE SET name=excluded.name, dir=excluded.dir, pid=excluded.pid, "
            "pid_started=excluded.pid_started, bound_at=excluded.bound_at",
            (name.lower(), name, real, pid, pid_started, now),
        )
    return Role(name, real, pid, pid_started, now)


def unbind(conn: sqlite3.Connection, name: str) -> bool:
    """Forget a role (its edits too; its messages stay, for the record). :return: whether it was bound."""
    with tx(conn) as cur:
        cur.execute("DELETE FROM mailbox_roles WHERE name_key=?", (name.lower(),))
        gone = cur.rowcount > 0
        cur.execute("DELETE FROM mailbox_role_edits WHERE role_key=?", (name.lower(),))
    return gone


def note_edit(conn: sqlite3.Connection, role: str, pid: Optional[int], path: str, at: Optional[float] = None) -> None:
    """Credit an edit of ``path`` to ``role`` (its focus); only the last
    :data:`EDITS_KEPT` of a role are kept."""
    key = role.lower()
    with tx(conn) as cur:
        cur.execute(
            "INSERT INTO mailbox_role_edits (role_key, pid, path, at) VALUES (?,?,?,?)",
            (key, pid, os.path.realpath(path), time.time() if at is None else at),
        )
        cur.execute(
            "DELETE FROM mailbox_role_edits WHERE role_key=? AND id NOT IN (SELECT id FROM "
            "mailbox_role_edits WHERE role_key=? ORDER BY id DESC LIMIT ?)",
            (key, key, EDITS_KEPT),
        )


def edits(conn: sqlite3.Connection) -> dict[str, list[str]]:
    """The recent edits of every role, by role key, oldest first."""
    out: dict[str, list[str]] = {}
    for r in _rows(conn, "SELECT role_key, path FROM mailbox_role_edits ORDER BY id"):
        out.setdefault(r["role_key"], []).append(r["path"])
    return out


# -- messages -------------------------------------------------------------------------


def _message(row: sqlite3.Row) -> Message:
    d = dict(row)
    d.pop("role_key", None)
    return Message(**d)


def deliver(
    cur: sqlite3.Cursor, role: str, task_id: str, attempt_id: str, body: str, why: str, now: float, priority: int = 0
) -> int:
    """Insert a message, inside the caller's transaction (:func:`tx`), so the delivery and
    what the caller records with it are one. :return: its id. Delivering one attempt
    twice is refused by the table (``attempt_id`` is unique)."""
    cur.execute(
        "INSERT INTO mailbox_messages (role, role_key, task_id, attempt_id, priority, body, why, state, "
        "created) VALUES (?,?,?,?,?,?,?,?,?)",
        (role, role.lower(), task_id, attempt_id, priority, clean_text(body, BODY_CAP), why, "pending", now),
    )
    return int(cur.lastrowid or 0)


def message_of_attempt(conn: sqlite3.Connection, attempt_id: str) -> Optional[Message]:
    rows = _rows(conn, "SELECT * FROM mailbox_messages WHERE attempt_id=?", (attempt_id,))
    return _message(rows[0]) if rows else None


def message_of_task(conn: sqlite3.Connection, task_id: str) -> Optional[Message]:
    """The task's newest message."""
    rows = _rows(conn, "SELECT * FROM mailbox_messages WHERE task_id=? ORDER BY id DESC LIMIT 1", (task_id,))
    return _message(rows[0]) if rows else None


def newest_by_task(conn: sqlite3.Connection) -> dict[str, Message]:
    """Every task's newest message, by task id (one read, for ``status``)."""
    rows = _rows(
        conn, "SELECT * FROM mailbox_messages WHERE id IN (SELECT max(id) FROM mailbox_messages GROUP BY task_id)"
    )
    return {r["task_id"]: _message(r) for r in rows}


def pending(conn: sqlite3.Connection, role: Optional[str] = None) -> list[Message]:
    """Pending messages (of one role, or all), the first to hand out first."""
    sql = "SELECT * FROM mailbox_messages WHERE state='pending'"
    args: tuple[Any, ...] = ()
    if role is not None:
        sql += " AND role_key=?"
        args = (role.lower(),)
    return [_message(r) for r in _rows(conn, sql + " ORDER BY priority DESC, id", args)]


def any_pending(conn: sqlite3.Connection) -> bool:
    """Whether any message waits at all (the Stop hook's fast answer without mail)."""
    return bool(_rows(conn, "SELECT 1 FROM mailbox_messages WHERE state='pending' LIMIT 1"))


def claim(conn: sqlite3.Connection, message_id: int, pid: Optional[int], now: float) -> bool:
    """Claim a pending message (compare-and-set). :return: False when another got it first."""
    with tx(conn) as cur:
        cur.execute(
            "UPDATE mailbox_messages SET state='claimed', claimed=?, claimed_by_pid=? WHERE id=? AND state='pending'",
            (now, pid, message_id),
        )
        return cur.rowcount == 1


def finish(
    conn: sqlite3.Connection,
    message_id: int,
    state: str,
    now: float,
    summary: Optional[str] = None,
    reason: Optional[str] = None,
    expect: tuple[str, ...] = ("pending", "claimed"),
) -> bool:
    """End a message: ``done`` (with a summary), ``failed`` (with a reason) or
    ``withdrawn``; only from one of ``expect``. :return: whether it moved."""
    assert state in ("done", "failed", "withdrawn")
    marks = ",".join("?" * len(expect))
    with tx(conn) as cur:
        cur.execute(
            f"UPDATE mailbox_messages SET state=?, ended=?, summary=?, reason=? WHERE id=? AND state IN ({marks})",
            (
                state,
                now,
                clean_text(summary, REPORT_CAP) if summary is not None else None,
                clean_text(reason, REPORT_CAP) if reason is not None else None,
                message_id,
                *expect,
            ),
        )
        return cur.rowcount == 1

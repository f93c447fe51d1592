"""Counts of a ledger, read through a read-only connection of their own.

For readers that run on a thread other than the loop's (a metrics scrape on its HTTP
server's thread, say): the loop's :class:`~fleetrun.ledger.Ledger` holds one SQLite
connection, which is the main thread's alone. :func:`ledger_counts` opens
``state.db`` read-only for each call and closes it again, so it never migrates,
repairs or locks the ledger for writing, and any thread may call it. The schema stays
this package's own: plugins read these counts, not its tables.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

from .states import State

#: The attempt states in which an attempt holds a place on its host (as the loop counts
#: its active attempts).
ACTIVE_ATTEMPT_STATES = ("leased", "starting", "running")


@dataclass(frozen=True)
class LedgerCounts:
    """What a ledger holds now, counted.

    :ivar tasks: task state (``"DONE"``…) → how many tasks are in it; every state of
        :class:`~fleetrun.State` is present, 0 when none is.
    :ivar active_by_host: host name → attempts that hold a place there now (leased,
        starting or running); every host that ever had an attempt is present, 0 when
        none is active there.
    :ivar cost_usd: what every task cost so far, summed (USD; a cost an agent did not
        report counts 0). It only grows: the ledger never deletes a task.
    """

    tasks: dict[str, int] = field(default_factory=dict)
    active_by_host: dict[str, int] = field(default_factory=dict)
    cost_usd: float = 0.0


def ledger_counts(home: Union[Path, str], timeout_s: float = 5.0) -> Optional[LedgerCounts]:
    """Count what the ledger of ``home`` holds, on a read-only connection of this call's own.

    Safe on any thread and while a loop writes (WAL: a reader sees the last committed
    transaction, and waits up to ``timeout_s`` for a lock).

    :param home: the fleetrun home (``config.home``); the ledger is its ``state.db``.
    :param timeout_s: how long to wait for SQLite's lock.
    :return: the counts, or None when the home has no ledger yet.
    :raises sqlite3.Error: the file cannot be read as a ledger.
    """
    db = Path(home) / "state.db"
    if not db.exists():
        return None
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=timeout_s, check_same_thread=True)
    try:
        conn.execute("BEGIN")  # one snapshot for every count below
        tasks = {s.value: 0 for s in State}
        for state, n in conn.execute("SELECT state, COUNT(*) FROM tasks GROUP BY state"):
            tasks[str(state)] = int(n)
        marks = ",".join("?" * len(ACTIVE_ATTEMPT_STATES))
        active = {
            str(host): int(n or 0)
            for host, n in conn.execute(
                f"SELECT host, SUM(state IN ({marks})) FROM attempts GROUP BY host", ACTIVE_ATTEMPT_STATES
            )
        }
        (cost,) = conn.execute("SELECT COALESCE(SUM(cost_usd), 0) FROM tasks").fetchone()
        conn.execute("COMMIT")
    finally:
        conn.close()
    return LedgerCounts(tasks=tasks, active_by_host=active, cost_usd=float(cost))

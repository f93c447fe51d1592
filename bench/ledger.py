"""How many ledger transitions per second, with ``synchronous=FULL`` and with ``NORMAL``.

The ledger commits every state change with ``synchronous=FULL`` (see the docstring of
``fleetrun/ledger.py`` for why). This measures what that costs next to ``NORMAL`` on
the disk that holds the temp folder (or ``--dir``)::

    python bench/ledger.py            # 2000 transitions each way
    python bench/ledger.py --n 10000 --dir ~/.fleetrun

Each transition is one real ``Ledger.transition()`` call: one ``BEGIN IMMEDIATE``
transaction with the compare-and-set UPDATE and the transition row, then COMMIT.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fleetrun.ledger import Ledger  # noqa: E402
from fleetrun.states import State  # noqa: E402
from fleetrun.taskspec import TaskSpec  # noqa: E402

#: A cycle of allowed transitions that leaves the task where it started.
CYCLE = [
    (State.READY, State.ASSIGNED, "placed"),
    (State.ASSIGNED, State.RUNNING, "started"),
    (State.RUNNING, State.VERIFYING, "exited"),
    (State.VERIFYING, State.RETRYING, "verify_fail:bench"),
    (State.RETRYING, State.NEEDS_HUMAN, "retries_exhausted"),
    (State.NEEDS_HUMAN, State.READY, "operator_retry"),
]


def run(folder: Path, n: int, synchronous: str) -> float:
    """Apply ``n`` transitions on a fresh ledger in ``folder``; return transitions/s."""
    with Ledger(folder / f"bench-{synchronous.lower()}.db") as led:
        led.conn.execute(f"PRAGMA synchronous={synchronous}")
        got = led.conn.execute("PRAGMA synchronous").fetchone()[0]
        want = {"OFF": 0, "NORMAL": 1, "FULL": 2, "EXTRA": 3}[synchronous]
        if got != want:
            raise SystemExit(f"PRAGMA synchronous={synchronous} did not take (got {got})")
        (task,) = led.add_tasks([TaskSpec(name="bench", prompt="p", cwd=str(folder))])
        # warm up: page cache, WAL file
        for src, dst, cause in CYCLE:
            led.transition(task.id, src, dst, cause)
        start = time.perf_counter()
        for i in range(n):
            src, dst, cause = CYCLE[i % len(CYCLE)]
            led.transition(task.id, src, dst, cause)
        elapsed = time.perf_counter() - start
        rows = led.conn.execute("SELECT COUNT(*) FROM transitions").fetchone()[0]
        if rows != n + len(CYCLE) + 1:
            raise SystemExit(f"expected {n + len(CYCLE) + 1} transition rows, found {rows}")
    return n / elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="transitions per run (default 2000)")
    parser.add_argument("--dir", type=Path, default=None,
                        help="folder to put the temp ledgers in (default: the system temp folder)")
    args = parser.parse_args(argv)
    if args.n < 1:
        parser.error("--n must be at least 1")
    with tempfile.TemporaryDirectory(prefix="fleetrun-bench-", dir=args.dir) as tmp:
        full = run(Path(tmp), args.n, "FULL")
        normal = run(Path(tmp), args.n, "NORMAL")
    print(f"transitions: {args.n} per run, ledger in {args.dir or tempfile.gettempdir()}")
    print(f"synchronous=FULL    {full:10.0f} transitions/s  ({1000 / full:.3f} ms each)")
    print(f"synchronous=NORMAL  {normal:10.0f} transitions/s  ({1000 / normal:.3f} ms each)")
    print(f"NORMAL / FULL       {normal / full:10.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""How many ledger transitions per second, with ``synchronous=FULL`` and with ``NORMAL``;
and what one transaction a pass saves.

The ledger commits with ``synchronous=FULL`` (see the docstring of
``fleetrun/ledger_schema.py`` for why). This measures what that costs next to
``NORMAL`` on the disk that holds the temp folder (or ``--dir``)::

    python bench/ledger.py            # 2000 transitions each way
    python bench/ledger.py --n 10000 --dir ~/.fleetrun

Each transition is one real ``Ledger.transition()`` call: one ``BEGIN IMMEDIATE``
transaction with the compare-and-set UPDATE and the transition row, then COMMIT.

Then passes as the loop makes them (``--per-pass`` tasks a pass, each a transition, a
note and a task update: what ending or verifying a task writes), with
``synchronous=FULL``, one commit a write (as before issue 23 item 3) against one
``Ledger.batch()`` a pass: commits (each an fsync), wall and CPU per task.
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


def run_passes(folder: Path, n: int, per_pass: int, batched: bool) -> tuple[float, float, int]:
    """``n`` task-writes in passes of ``per_pass``; :return: (wall s, CPU s, commits)."""
    import contextlib

    with Ledger(folder / f"bench-pass-{'batch' if batched else 'each'}.db") as led:
        tasks = led.add_tasks([TaskSpec(name=f"t{i}", prompt="p", cwd=str(folder)) for i in range(per_pass)])
        commits0 = led.commits
        cpu0, start = time.process_time(), time.perf_counter()
        for p in range(n // per_pass):
            with led.batch() if batched else contextlib.nullcontext():
                for t in tasks:
                    src, dst, cause = CYCLE[p % len(CYCLE)]
                    led.transition(t.id, src, dst, cause)
                    led.add_note(t.id, f"pass {p}")
                    led.update_task(t.id, no_start=p % 2)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu0
        return wall, cpu, led.commits - commits0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="transitions per run (default 2000)")
    parser.add_argument(
        "--dir", type=Path, default=None, help="folder to put the temp ledgers in (default: the system temp folder)"
    )
    parser.add_argument("--per-pass", type=int, default=6, help="tasks written a pass (default 6)")
    args = parser.parse_args(argv)
    if args.n < 1 or args.per_pass < 1:
        parser.error("--n and --per-pass must be at least 1")
    n = max(args.per_pass, args.n - args.n % args.per_pass)
    with tempfile.TemporaryDirectory(prefix="fleetrun-bench-", dir=args.dir) as tmp:
        full = run(Path(tmp), args.n, "FULL")
        normal = run(Path(tmp), args.n, "NORMAL")
        each = run_passes(Path(tmp), n, args.per_pass, batched=False)
        batch = run_passes(Path(tmp), n, args.per_pass, batched=True)
    print(f"transitions: {args.n} per run, ledger in {args.dir or tempfile.gettempdir()}")
    print(f"synchronous=FULL    {full:10.0f} transitions/s  ({1000 / full:.3f} ms each)")
    print(f"synchronous=NORMAL  {normal:10.0f} transitions/s  ({1000 / normal:.3f} ms each)")
    print(f"NORMAL / FULL       {normal / full:10.2f}x")
    print(f"passes of {args.per_pass} tasks (a transition, a note, an update each), {n} tasks, synchronous=FULL:")
    for name, (wall, cpu, commits) in (("a commit a write", each), ("a commit a pass", batch)):
        print(
            f"  {name:<17} {commits / n:5.2f} commits a task  {wall / n * 1000:7.3f} ms wall  "
            f"{cpu / n * 1000:7.3f} ms cpu a task"
        )
    print(
        f"  a pass / a write  {batch[2] / each[2]:5.2f}x commits  {batch[0] / each[0]:7.2f}x wall  "
        f"{batch[1] / each[1]:7.2f}x cpu"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

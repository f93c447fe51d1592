"""How long the verify stage adds to a task: a ``run = "true"`` verifier.

Runs N trivial tasks (a command agent that prints one line, no worktree) twice in the
same run: once with no verifier and once with ``run = "true"``, and reads from the
ledger how long each task spent in VERIFYING (VERIFYING -> DONE). Prints the median
verify-stage time, the median time per task of both runs, and their ratio.

    python bench/verify.py [--n 40]
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

AGENT = '[agents.noop]\ncommand = ["{python}", "-c", "print(1)"]\n'


def tasks_file(n: int, verify: bool) -> str:
    parts = [AGENT]
    for i in range(n):
        parts.append(f'[[task]]\nname = "t{i}"\nprompt = "p"\nagent = "noop"\n')
        if verify:
            parts.append('  [[task.verify]]\n  run = "true"\n')
    return "\n".join(parts)


def run(n: int, verify: bool) -> tuple[float, list[float]]:
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        (root / "tasks.toml").write_text(tasks_file(n, verify))
        (root / "home").mkdir()
        (root / "home" / "policy.toml").write_text("[local]\nmax_tasks = 4\n")
        env = dict(os.environ, FLEETRUN_HOME=str(root / "home"))
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "fleetrun", "-q", "tasks.toml"],
            cwd=root,
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        wall = time.perf_counter() - start
        conn = sqlite3.connect(root / "home" / "state.db")
        rows = conn.execute(
            "SELECT a.time, b.time FROM transitions a JOIN transitions b ON a.task_id = b.task_id "
            "WHERE a.to_state = 'VERIFYING' AND b.to_state = 'DONE'"
        ).fetchall()
        conn.close()
        return wall, [b - a for a, b in rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=40)
    args = ap.parse_args()
    base_wall, _ = run(args.n, verify=False)
    wall, stages = run(args.n, verify=True)
    med = statistics.median(stages)
    print(f"tasks: {args.n}, 4 at a time")
    print(
        f'verify stage (VERIFYING -> DONE) for run = "true": median {med * 1000:.1f} ms, '
        f"max {max(stages) * 1000:.1f} ms"
    )
    print(f"wall time without verifier: {base_wall:.2f}s ({base_wall / args.n * 1000:.0f} ms/task)")
    print(f'wall time with run = "true": {wall:.2f}s ({wall / args.n * 1000:.0f} ms/task)')
    print(f"ratio: {wall / base_wall:.2f}x")


if __name__ == "__main__":
    main()

"""How long one placement decision takes, and how that grows with the queue.

Places 1,000 / 2,000 / 5,000 / 10,000 queued tasks over 200 simulated candidates
with :func:`fleetrun.placement.decide`, one task after another, each placement
updating the chosen candidate's running count and free memory as the loop does
(``Loop.place_all``). Prints the time per decision at each size, split into
placements and waits, the growth from 1,000 to 10,000 tasks (about 1.0 per
decision, 10x in total, when it is linear), and the ratio to a baseline measured in
the same run: a bare loop finding the candidate with the most free memory::

    python bench/placement.py
    python bench/placement.py --candidates 50 --sizes 1000,10000 --seed 7

The fleet is seeded, so runs compare: a few candidates draining or stale, floors
set, tags and tools spread around, a tenth of the tasks with ``requires``, one in
fifty pinned to a peer, and a few backoffs.
"""

from __future__ import annotations

import argparse
import copy
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fleetrun.placement import Backoff, decide  # noqa: E402
from fleetrun.plugins.placement import same_pass  # noqa: E402
from fleetrun.reports import Candidate, Placement  # noqa: E402
from fleetrun.stash import Stash  # noqa: E402

REQUIRES = [[], [], [], [], [], [], [], [], [], ["docker"], ["node>=22"], ["gpu", "git"], ["claude:auth"]]


def make_fleet(n: int, rng: random.Random) -> list[Candidate]:
    fleet = [
        Candidate(
            "local",
            kind="local",
            free_mem_mb=rng.uniform(16_000, 64_000),
            load_per_core=0.3,
            free_disk_mb=200_000,
            max_tasks=8,
            tools={"git": "2.43.0", "claude": "2.1.0"},
            auth=frozenset({"claude"}),
            min_free_mem_mb=2048,
            min_free_disk_mb=5120,
        )
    ]
    for i in range(1, n):
        tools: dict[str, str | None] = {"git": "2.43.0"}
        if rng.random() < 0.5:
            tools["node"] = rng.choice(["18.19.0", "22.3.0"])
        if rng.random() < 0.7:
            tools["claude"] = "2.1.301"
        fleet.append(
            Candidate(
                f"peer{i:03d}",
                kind="peer",
                free_mem_mb=rng.uniform(32_000, 256_000) if rng.random() > 0.02 else None,
                load_per_core=rng.uniform(0, 1.2),
                free_disk_mb=rng.uniform(10_000, 500_000),
                running=rng.randint(0, 4),
                max_tasks=rng.randint(20, 80),
                drain=rng.random() < 0.03,
                fresh=rng.random() > 0.03,
                status="live",
                tags=frozenset(t for t in ("docker", "gpu") if rng.random() < 0.3),
                tools=tools,
                auth=frozenset({"claude"}) if "claude" in tools and rng.random() < 0.8 else frozenset(),
                mem_per_task_mb=rng.choice([1024.0, 1500.0, 2048.0]),
                min_free_mem_mb=2048,
                max_load_per_core=1.5,
                min_free_disk_mb=5120,
            )
        )
    return fleet


def make_tasks(
    n: int, fleet: list[Candidate], rng: random.Random, now: float
) -> list[tuple[list[str], str | None, dict[str, Backoff]]]:
    out = []
    for _ in range(n):
        pin = rng.choice(fleet).name if rng.random() < 0.02 else None
        backoff = {}
        if rng.random() < 0.05:
            c = rng.choice(fleet)
            backoff[c.name] = Backoff(3, now + 20, "peer_refused")
        out.append((rng.choice(REQUIRES), pin, backoff))
    return out


def run_decide(
    fleet: list[Candidate], tasks: list[tuple[list[str], str | None, dict[str, Backoff]]], now: float
) -> tuple[float, list[float], list[float]]:
    """Place every task in turn; return (total seconds, per-placement, per-wait)."""
    by_name = {c.name: c for c in fleet}
    placed: list[float] = []
    waited: list[float] = []
    clock = time.perf_counter
    start = clock()
    for requires, pin, backoff in tasks:
        t0 = clock()
        d = decide(requires, fleet, backoff, now, pin=pin)
        t1 = clock()
        if isinstance(d, Placement):
            placed.append(t1 - t0)
            c = by_name[d.host]  # what Loop.place_all does after a lease
            c.running += 1
            if c.free_mem_mb is not None:
                c.free_mem_mb -= c.mem_per_task_mb
        else:
            waited.append(t1 - t0)
    return clock() - start, placed, waited


def run_baseline(fleet: list[Candidate], n: int) -> float:
    """A bare loop: the candidate with the most free memory, n times, updating it."""
    free = [c.free_mem_mb if c.free_mem_mb is not None else float("-inf") for c in fleet]
    start = time.perf_counter()
    for _ in range(n):
        best = max(range(len(free)), key=free.__getitem__)
        free[best] -= 1024.0
    return time.perf_counter() - start


def run_full_pass(
    fleet: list[Candidate], tasks: list[tuple[list[str], str | None, dict[str, Backoff]]], now: float
) -> tuple[float, float]:
    """One pass of the loop over a queue that all waits (every slot taken): seconds
    through ``decide`` for each task, and through the plugin's per-pass memory."""
    for c in fleet:
        c.running = max(c.running, c.max_tasks)
    start = time.perf_counter()
    for requires, pin, backoff in tasks:
        decide(requires, fleet, backoff, now, pin=pin)
    bare = time.perf_counter() - start
    stash = Stash()
    start = time.perf_counter()
    for requires, pin, backoff in tasks:
        same_pass(stash, fleet, requires, pin, backoff)
    return bare, time.perf_counter() - start


def us(seconds: float) -> str:
    return f"{seconds * 1e6:8.1f} µs"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--candidates", type=int, default=200)
    ap.add_argument("--sizes", default="1000,2000,5000,10000")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3, help="runs per size; the fastest counts")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    rng = random.Random(args.seed)
    now = 1_000_000.0
    fleet0 = make_fleet(args.candidates, rng)
    all_tasks = make_tasks(max(sizes), fleet0, rng, now)
    capacity = sum(max(0, c.max_tasks - c.running) for c in fleet0)
    print(f"{args.candidates} candidates, {capacity} free slots in all; python {sys.version.split()[0]}")
    print(
        f"{'tasks':>6}  {'per decision':>12}  {'per placement':>13}  {'per wait':>11}  "
        f"{'placed':>6}  {'waits':>6}  {'total':>8}  {'baseline/dec':>12}  {'ratio':>6}"
    )
    per_decision: dict[int, float] = {}
    totals: dict[int, float] = {}
    for n in sizes:
        best = None
        base = float("inf")
        for _ in range(args.repeat):
            fleet = copy.deepcopy(fleet0)
            total, placed, waited = run_decide(fleet, all_tasks[:n], now)
            base = min(base, run_baseline(copy.deepcopy(fleet0), n))
            if best is None or total < best[0]:
                best = (total, placed, waited)
        assert best is not None
        total, placed, waited = best
        per_decision[n] = total / n
        totals[n] = total
        p = statistics.mean(placed) if placed else 0.0
        w = statistics.mean(waited) if waited else 0.0
        print(
            f"{n:>6}  {us(total / n):>12}  {us(p):>13}  {us(w):>11}  {len(placed):>6}  {len(waited):>6}  "
            f"{total * 1e3:6.0f} ms  {us(base / n):>12}  {total / base:5.0f}x"
        )
    lo, hi = sizes[0], sizes[-1]
    print(
        f"growth {lo} -> {hi} tasks: total x{totals[hi] / totals[lo]:.1f} for x{hi / lo:.0f} tasks; "
        f"per decision x{per_decision[hi] / per_decision[lo]:.2f} (1.00 is linear)"
    )
    print()
    print("one loop pass over a queue that all waits (every slot taken):")
    print(f"{'tasks':>6}  {'decide, per task':>16}  {'pass':>8}  {'plugin, per task':>16}  {'pass':>8}")
    for n in sizes:
        bare, memo = run_full_pass(copy.deepcopy(fleet0), all_tasks[:n], now)
        print(f"{n:>6}  {us(bare / n):>16}  {bare * 1e3:5.0f} ms  {us(memo / n):>16}  {memo * 1e3:5.0f} ms")


if __name__ == "__main__":
    main()

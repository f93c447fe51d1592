"""What the event stream costs.

Two measurements, each against a baseline taken in the same run:

1. Per line: N event lines appended to ``events.ndjson`` the way the ``events``
   plugin does it outside a work loop (one ``open`` + ``fstat`` + ``write`` + ``close``
   per line, so a file rotated by another process is never written into) and inside
   one (a pass's lines, ``--batch`` of them, in one ``open`` and one ``write`` of whole
   lines: ``HomeLog.write_lines``), against the same lines written to a descriptor kept
   open (``fstat`` + ``write``), and against building the line alone (``json.dumps``).
2. Per run: N trivial tasks (a command agent that prints one line, no worktree, no
   verifier) run by ``python -m fleetrun`` with the ``events`` plugin and with
   ``-p no:events``, alternately; wall time and the CPU of the run (the supervisor and
   the children it waited for), and how many event lines the run wrote.

    python bench/events.py [--n 100] [--lines 20000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fleetrun.plugins.events import VERSION, stamp
from fleetrun.plugins.events.log import FLAGS, HomeLog

AGENT = '[agents.noop]\ncommand = ["{python}", "-c", "print(1)"]\n'


def line(i: int) -> bytes:
    event = {
        "v": VERSION,
        "type": "transition",
        "at": stamp(time.time()),
        "task": f"task_bench_{i}",
        "name": f"t{i}",
        "from": "RUNNING",
        "to": "VERIFYING",
        "cause": "exited",
        "attempt": 1,
        "host": "local",
    }
    return (json.dumps(event) + "\n").encode()


def per_line(n: int, batch: int) -> dict[str, float]:
    """Seconds per line of each way."""
    out = {}
    with tempfile.TemporaryDirectory() as d:
        t = time.perf_counter()
        for i in range(n):
            line(i)
        out["build the line only"] = (time.perf_counter() - t) / n
        log = HomeLog(Path(d) / "events.ndjson")
        t = time.perf_counter()
        for i in range(n):
            log.write(line(i))
        out["open per line (the plugin)"] = (time.perf_counter() - t) / n
        log = HomeLog(Path(d) / "batched.ndjson")
        t = time.perf_counter()
        for start in range(0, n, batch):
            log.write_lines([line(i) for i in range(start, min(n, start + batch))])
        out[f"{batch} lines a write (a pass)"] = (time.perf_counter() - t) / n
        fd = os.open(Path(d) / "kept.ndjson", FLAGS, 0o600)
        t = time.perf_counter()
        for i in range(n):
            data = line(i)
            os.fstat(fd)  # the size check rotation needs
            os.write(fd, data)
        out["descriptor kept open"] = (time.perf_counter() - t) / n
        os.close(fd)
    return out


def tasks_file(n: int) -> str:
    return "\n".join([AGENT] + [f'[[task]]\nname = "t{i}"\nprompt = "p"\nagent = "noop"\n' for i in range(n)])


def one_run(n: int, events: bool) -> tuple[float, float, int]:
    """(wall s, CPU s, event lines) of one run."""
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        (root / "tasks.toml").write_text(tasks_file(n))
        (root / "home").mkdir()
        (root / "home" / "policy.toml").write_text("[local]\nmax_tasks = 4\n")
        env = dict(os.environ, FLEETRUN_HOME=str(root / "home"))
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        argv = [sys.executable, "-m", "fleetrun", "-q", "tasks.toml"] + ([] if events else ["-p", "no:events"])
        subprocess.run(argv, cwd=root, env=env, check=True, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        log = root / "home" / "events.ndjson"
        lines = len(log.read_text().splitlines()) if log.exists() else 0
        return wall, cpu, lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=100, help="tasks per run")
    ap.add_argument("--lines", type=int, default=20000, help="lines of the per-line measurement")
    ap.add_argument("--repeat", type=int, default=3, help="runs each way (medians)")
    ap.add_argument("--batch", type=int, default=100, help="lines of a pass, written together")
    args = ap.parse_args()

    costs = per_line(args.lines, args.batch)
    base = costs["build the line only"]
    print(f"per line ({args.lines} lines):")
    for what, s in costs.items():
        print(f"  {what:28s} {s * 1e6:7.1f} us  ({s / base:.2f}x building it)")

    runs: dict[bool, list[tuple[float, float, int]]] = {True: [], False: []}
    for _ in range(args.repeat):
        for events in (False, True):
            runs[events].append(one_run(args.n, events))
    print(f"\n{args.n} trivial tasks, 4 at a time, {args.repeat} runs each way (medians):")
    med = {}
    for events, rs in runs.items():
        wall = statistics.median(r[0] for r in rs)
        cpu = statistics.median(r[1] for r in rs)
        med[events] = (wall, cpu)
        print(
            f"  {'events' if events else '-p no:events':14s} wall {wall:6.2f}s  cpu {cpu:6.2f}s  event lines {rs[0][2]}"
        )
    lines = runs[True][0][2]
    spent = lines * costs["open per line (the plugin)"]
    batched = lines * costs[f"{args.batch} lines a write (a pass)"]
    print(
        f"  ratio (events / no events): wall {med[True][0] / med[False][0]:.3f}x, "
        f"cpu {med[True][1] / med[False][1]:.3f}x"
    )
    print(
        f"  the run's {lines} lines, built and written: {spent * 1000:.1f} ms at one open a line, "
        f"{batched * 1000:.1f} ms {args.batch} a write ({spent / med[True][0] * 100:.2f}% and "
        f"{batched / med[True][0] * 100:.2f}% of its wall time)"
    )


if __name__ == "__main__":
    main()

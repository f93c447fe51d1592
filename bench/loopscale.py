"""What a loop pass costs as the queue grows: pass time, idle CPU and RSS with 1,000
and 10,000 queued tasks that cannot start, and ``status`` at 10,000 tasks.

Each size gets a fresh ``FLEETRUN_HOME`` and a git repository with one commit; the
tasks are queued straight into the ledger (``Ledger.add_tasks``, as ``fleetrun queue``
does after collection). None can start, in two ways:

- ``ready``: READY tasks on a machine that takes none (``[local] drain = true`` in
  policy.toml: a policy that holds them; every pass asks where they go);
- ``pending``: one task that waits for a tag no machine has, and the others depending
  on it (PENDING).

Measured for each:

- **pass**: ``Loop.step`` timed in-process (``fleetrun work`` run by ``fleetrun.main``
  with the step wrapped and the sleep between passes skipped): the first pass (every
  task is placed or looked at once), wall and CPU (the CPU says more on a shared
  machine), the garbage collector's full collections (generation 2) during it and
  their time (each walks every object the process tracks: many long-lived objects
  made in one pass set them off), and the median of the next ``--passes`` (idle
  passes: nothing changed);
- **idle CPU**: ``python -m fleetrun work`` as a subprocess, its CPU (user + system,
  ``getrusage`` of the child through psutil) over ``--idle`` seconds after a warm-up,
  as a percentage of one core; and its RSS;
- **status** at the largest size: ``fleetrun status`` / ``--json`` / ``--graph``
  against ``python -c "import sqlite3"`` in the same run (medians of ``--runs``
  rounds, each timing all of them in turn), and ``status`` over an empty ledger
  (what start-up alone costs).

Ratios are printed against the baselines measured in the same run::

    python bench/loopscale.py
    python bench/loopscale.py --sizes 1000 --idle 5 --scenario ready
    python bench/loopscale.py --sizes 10000 --scenario ready --status-only --against ../main
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psutil  # noqa: E402

from fleetrun.ledger import Ledger  # noqa: E402
from fleetrun.taskspec import TaskSpec  # noqa: E402


def make_home(root: Path, n: int, scenario: str) -> tuple[Path, dict[str, str]]:
    """A home with ``n`` queued tasks that cannot start; :return: (home, env)."""
    repo = root / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=b", "-c", "user.email=b@b"]
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
    (repo / "README").write_text("bench\n")
    subprocess.run([*git, "add", "README"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "init"], check=True)
    home = root / "home"
    home.mkdir(mode=0o700)
    specs = []
    if scenario == "ready":
        (home / "policy.toml").write_text("[local]\ndrain = true\n")
        specs = [TaskSpec(name=f"t{i}", prompt="p", cwd=str(repo), git_ref="main") for i in range(n)]
    else:
        specs = [TaskSpec(name="head", prompt="p", cwd=str(repo), git_ref="main", requires=["bench-never"])]
        specs += [
            TaskSpec(name=f"t{i}", prompt="p", cwd=str(repo), git_ref="main", depends_on=["head"]) for i in range(1, n)
        ]
    with Ledger(home / "state.db") as led:
        led.add_tasks(specs, source=str(root / "tasks.toml"), source_hash="bench")
    env = {**os.environ, "FLEETRUN_HOME": str(home), "TERM": "dumb"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return home, env


class FirstPass:
    """What the first pass cost: wall and CPU seconds, and the collector's full
    collections during it (how many, seconds)."""

    def __init__(self) -> None:
        self.wall = self.cpu = self.gc_seconds = 0.0
        self.full_collections = 0
        self._began = 0.0

    def collector(self, phase: str, info: dict[str, Any]) -> None:
        """A ``gc.callbacks`` entry: counts and times the generation-2 collections."""
        if info["generation"] != 2:
            return
        if phase == "start":
            self.full_collections += 1
            self._began = time.perf_counter()
        else:
            self.gc_seconds += time.perf_counter() - self._began


def pass_times(home: Path, passes: int) -> tuple[FirstPass, list[float]]:
    """Run ``fleetrun work`` in-process for ``passes + 1`` passes, timing each
    ``Loop.step``. :return: (the first pass, the others' seconds)."""
    import fleetrun
    from fleetrun import loop as loopmod
    from fleetrun import waiting

    times: list[float] = []
    first = FirstPass()
    real_step = loopmod.Loop.step
    real_sleep = waiting.Waits.sleep

    def step(self: Any) -> None:
        if not times:
            gc.callbacks.append(first.collector)
            cpu = time.process_time()
        start = time.perf_counter()
        try:
            real_step(self)
        finally:
            if not times:
                first.cpu = time.process_time() - cpu
                gc.callbacks.remove(first.collector)
        times.append(time.perf_counter() - start)
        if len(times) > passes:
            raise KeyboardInterrupt

    old = os.environ.get("FLEETRUN_HOME")
    os.environ["FLEETRUN_HOME"] = str(home)
    loopmod.Loop.step = step  # type: ignore[method-assign]
    waiting.Waits.sleep = lambda self: None  # type: ignore[method-assign]
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            fleetrun.main(["work", "-q"])
    finally:
        loopmod.Loop.step = real_step  # type: ignore[method-assign]
        waiting.Waits.sleep = real_sleep  # type: ignore[method-assign]
        if old is None:
            os.environ.pop("FLEETRUN_HOME", None)
        else:
            os.environ["FLEETRUN_HOME"] = old
    first.wall = times[0]
    return first, times[1:]


def idle_cpu(env: dict[str, str], warmup: float, seconds: float) -> tuple[float, float]:
    """``fleetrun work`` as a process: (% of one core over ``seconds``, RSS MiB)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "fleetrun", "work", "-q"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        p = psutil.Process(proc.pid)
        time.sleep(warmup)
        if proc.poll() is not None:
            raise SystemExit(f"fleetrun work exited {proc.returncode}: {proc.stderr.read().decode()}")  # type: ignore[union-attr]
        c0 = p.cpu_times()
        t0 = time.perf_counter()
        time.sleep(seconds)
        c1 = p.cpu_times()
        wall = time.perf_counter() - t0
        rss = p.memory_info().rss / 2**20
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    used = (c1.user - c0.user) + (c1.system - c0.system)
    return 100.0 * used / wall, rss


def timed(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    # in the temp folder, not a checkout (`python -m` puts the current folder first on sys.path,
    # before PYTHONPATH: --against would time this checkout twice)
    proc = subprocess.run(
        argv,
        env=env,
        cwd=os.path.dirname(env["FLEETRUN_HOME"]),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    took = time.perf_counter() - start
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.decode(errors='replace')}")
    return took


def status_times(
    env: dict[str, str], empty: dict[str, str], runs: int, against: Optional[str] = None
) -> dict[str, float]:
    """Medians of ``runs`` rounds, each timing the baseline and then every ``status``
    form one after the other (so a busy moment slows them alike); ``status`` over an
    empty ledger (``empty``) says what start-up alone costs. With ``against``, each
    form is timed with that checkout's fleetrun too (first on ``PYTHONPATH``), in the
    same rounds."""
    forms: dict[str, tuple[list[str], dict[str, str]]] = {"baseline": ([sys.executable, "-c", "import sqlite3"], env)}
    ways = [("", env, empty)]
    if against:

        def first(e: dict[str, str]) -> dict[str, str]:
            return dict(e, PYTHONPATH=os.pathsep.join(filter(None, [against, e.get("PYTHONPATH")])))

        ways.append((f" of {Path(against).name}", first(env), first(empty)))
    for suffix, e, e_empty in ways:
        forms["status (no tasks)" + suffix] = ([sys.executable, "-m", "fleetrun", "status"], e_empty)
        for extra in ([], ["--json"], ["--graph"]):
            forms[" ".join(["status", *extra]) + suffix] = ([sys.executable, "-m", "fleetrun", "status", *extra], e)
    got: dict[str, list[float]] = {k: [] for k in forms}
    for _ in range(runs):
        for k, (argv, e) in forms.items():
            got[k].append(timed(argv, e))
    return {k: statistics.median(v) for k, v in got.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,10000")
    ap.add_argument("--scenario", choices=["ready", "pending", "both"], default="both")
    ap.add_argument("--passes", type=int, default=10, help="idle passes timed after the first")
    ap.add_argument("--idle", type=float, default=10.0, help="seconds of idle CPU measured")
    ap.add_argument("--warmup", type=float, default=5.0, help="seconds before the idle CPU is measured")
    ap.add_argument("--runs", type=int, default=7, help="runs of each status command")
    ap.add_argument("--no-status", action="store_true")
    ap.add_argument("--status-only", action="store_true", help="time status only (no pass, idle CPU or RSS)")
    ap.add_argument(
        "--against",
        metavar="DIR",
        help="also time status with the fleetrun of another checkout (first on PYTHONPATH), interleaved",
    )
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    scenarios = ["ready", "pending"] if args.scenario == "both" else [args.scenario]
    status_env: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="fleetrun-loopscale-") as tmp:
        print(
            f"{'scenario':<8} {'tasks':>6} {'1st pass':>10} {'1st CPU':>10} {'full gc':>14} {'idle pass':>10} "
            f"{'idle CPU':>9} {'RSS':>8}"
        )
        for scenario in scenarios:
            for n in sizes:
                root = Path(tmp) / f"{scenario}-{n}"
                root.mkdir()
                home, env = make_home(root, n, scenario)
                if args.status_only:
                    status_env = env if n == max(sizes) and scenario == scenarios[0] else status_env
                    continue
                first, rest = pass_times(home, args.passes)
                cpu, rss = idle_cpu(env, args.warmup, args.idle)
                print(
                    f"{scenario:<8} {n:>6} {first.wall * 1000:>8.1f}ms {first.cpu * 1000:>8.1f}ms "
                    f"{first.full_collections:>3} {first.gc_seconds * 1000:>7.1f}ms "
                    f"{statistics.median(rest) * 1000:>8.2f}ms {cpu:>8.2f}% {rss:>6.1f}MiB",
                    flush=True,
                )
                if n == max(sizes) and scenario == scenarios[0]:
                    status_env = env
        if args.no_status or not status_env:
            return
        empty = Path(tmp) / "empty-home"
        empty.mkdir(mode=0o700)
        got = status_times(status_env, {**status_env, "FLEETRUN_HOME": str(empty)}, args.runs, args.against)
        base = got.pop("baseline")
        print(
            f"\nstatus at {max(sizes)} tasks (medians of {args.runs} rounds); baseline python -c 'import sqlite3' "
            f"{base * 1000:.1f} ms"
        )
        for name, t in got.items():
            print(
                f"  {name:<18} {t * 1000:>7.1f} ms  {t / base:>5.1f}x"
                + ("" if "no tasks" in name else "  (target <= 3x)")
            )


if __name__ == "__main__":
    main()

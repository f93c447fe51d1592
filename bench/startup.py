"""How long fleetrun takes to start: ``--help``, ``--version`` and ``status``.

Each command runs ``--runs`` times (default 20) as ``python -m fleetrun ...`` with the
running interpreter and a fresh ``FLEETRUN_HOME``, next to ``python -c pass`` (the
interpreter's own start-up) as the baseline; the medians and the ratios are printed.
``status`` and ``logs TASK`` also run on a home with ``--tasks`` tasks (default 10,000:
a twentieth of them placed, here and on a peer no plugin provides), and ``status`` on
one with as many tasks none of which is placed (they wait: the table asks no plugin, so
no plugin is loaded, fleetrun.quickstatus), with their ratios to ``python -c "import
sqlite3"`` too (issue 16's and 24's goal: ``status`` at 10,000 tasks within 3x of it).
With ``--script`` the ``fleetrun`` console script next to the interpreter is timed too
(a version manager's shim on PATH, such as pyenv's, adds ~90 ms on top of that).

The package's byte-code is cached in a temporary ``PYTHONPYCACHEPREFIX`` for the runs
(``PYTHONDONTWRITEBYTECODE`` is dropped for them), as an installed package has its own:
otherwise every run would compile fleetrun's modules again and that is all it would
measure.

Then ``python -X importtime`` checks what each command imports: paramiko (SSH, only
for peers) and pexpect must not be imported by ``--help``, ``--version`` or
``status``, nor what ``--help`` and ``--version`` do not need (the ledger, git, the
loop: :data:`NOT_FOR_HELP`), and the slowest imports are listed::

    python bench/startup.py
    python bench/startup.py --runs 50 --script
    python bench/startup.py --against ../main   # before/after, in the same run
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

COMMANDS = [["--help"], ["--version"], ["status"]]
#: Run on the home with tasks (``TASK`` is one of them).
TASK_COMMANDS = [["status"], ["logs", "TASK"]]
#: Modules a start-up command must not import (they belong to running tasks / peers).
HEAVY = ("paramiko", "pexpect")
#: What ``--help`` and ``--version`` must not import either: they only read the command
#: line (tests/test_startup.py checks the same list).
NOT_FOR_HELP = (
    "sqlite3",
    "fleetrun.ledger",
    "fleetrun.gitutil",
    "fleetrun.loop",
    "fleetrun.claudecli",
    "fleetrun.plugins.worktree",
    "psutil",
    "socket",
    "subprocess",
)
#: What ``status`` and ``logs`` must not import on a home with tasks (tests/test_startup.py
#: checks a longer list).
NOT_FOR_VIEWING = (
    "subprocess",
    "uuid",
    "socket",
    "threading",
    "hashlib",
    "fleetrun.gitutil",
    "fleetrun.loop",
    "fleetrun.claudecli",
    "fleetrun.placement",
    "fleetrun.plugins.worktree",
    "fleetrun.plugins.relay.protocol",
)
#: What ``status`` must not import on the home where nothing is placed: no plugin takes
#: part in its table, so neither the plugin manager nor the installed plugins' look-up.
NOT_FOR_WAITING = ("pluggy", "importlib.metadata", "fleetrun.pluginmanager", "fleetrun.records")
#: The goal: each command within this ratio of ``python -c pass``.
GOAL = 2.0
#: The goal of ``status`` at 10,000 tasks: within this ratio of ``python -c "import sqlite3"``.
SQLITE_GOAL = 3.0


def make_home(home: Path, n: int, placed: bool = True) -> str:
    """A ledger of ``n`` tasks in ``home``: most READY, a twentieth placed (on this
    machine, a third of them on ``mini``, a peer no plugin provides), half of those
    RUNNING; with ``placed`` False, all READY. Returns the name of a running task (for
    ``logs``)."""
    from fleetrun.ledger import Ledger
    from fleetrun.states import State
    from fleetrun.taskspec import TaskSpec

    with Ledger(home / "state.db") as led:
        tasks = led.add_tasks([TaskSpec(name=f"t{i}", prompt=f"do thing {i}", cwd="/repo") for i in range(n)])
        for i, t in enumerate(tasks[: max(3, n // 20) if placed else 0]):
            host = "mini" if i % 3 == 0 else "local"
            led.lease(t.id, State.READY, host, "fresh")
            if i % 2:
                led.transition(t.id, State.ASSIGNED, State.RUNNING, "started", 1, host)
    return tasks[1].name


def once(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall s, CPU s: user + system) of one run of ``argv``. CPU time is the steadier
    figure on a busy machine, where the wall time also waits for a core."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    # in the temp folder: not a checkout's (`python -m` puts the current folder first on sys.path)
    proc = subprocess.run(
        argv,
        env=env,
        cwd=os.path.dirname(env["FLEETRUN_HOME"]),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    wall = time.perf_counter() - start
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.decode(errors='replace')}")
    return wall, r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime


def interleaved(ways: list[tuple[str, list[str], dict[str, str]]], runs: int) -> dict[str, tuple[float, float]]:
    """The medians of (wall, CPU) of each way, the ways run in turn ``runs`` times, so
    that a burst of load elsewhere falls on all of them."""
    got: dict[str, list[tuple[float, float]]] = {name: [] for name, _, _ in ways}
    for _ in range(runs):
        for name, argv, env in ways:
            got[name].append(once(argv, env))
    return {
        name: (statistics.median(w for w, _ in xs), statistics.median(c for _, c in xs)) for name, xs in got.items()
    }


def importtime(args: list[str], env: dict[str, str]) -> list[tuple[int, int, str]]:
    """(self µs, cumulative µs, module) for every import ``python -m fleetrun ARGS`` makes."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "fleetrun", *args],
        env=env,
        cwd=os.path.dirname(env["FLEETRUN_HOME"]),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    rows = []
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        parts = line[len("import time:") :].split("|")
        try:
            rows.append((int(parts[0]), int(parts[1]), parts[2].rstrip()))
        except ValueError:
            continue  # the header line
    return rows


def metadata_modules() -> set[str]:
    """What ``importlib.metadata.entry_points(group="fleetrun")`` imports (``email``,
    ``zipfile``, and through them ``socket``, ``threading``...): with autoload on, every
    command looks for the installed plugins with it."""
    code = (
        "import sys; before = set(sys.modules); import importlib.metadata as m; "
        "m.entry_points(group='fleetrun'); print(' '.join(set(sys.modules) - before))"
    )
    return set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split())


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="runs per command (default 20)")
    parser.add_argument(
        "--script", action="store_true", help="also time the fleetrun console script installed next to the interpreter"
    )
    parser.add_argument(
        "--tasks", type=int, default=10_000, help="tasks in the ledger status and logs read (default 10000)"
    )
    parser.add_argument("--top", type=int, default=8, help="slowest imports to list per command (default 8)")
    parser.add_argument(
        "--against",
        metavar="DIR",
        help="also time the fleetrun of another checkout (put first on PYTHONPATH), interleaved",
    )
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")

    failed = False
    with tempfile.TemporaryDirectory(prefix="fleetrun-startup-") as tmp:
        env = dict(os.environ, FLEETRUN_HOME=str(Path(tmp) / "home"), PYTHONPYCACHEPREFIX=str(Path(tmp) / "pycache"))
        env.pop("PYTHONPROFILEIMPORTTIME", None)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        full = dict(env, FLEETRUN_HOME=str(Path(tmp) / "home-tasks"))
        task = make_home(Path(full["FLEETRUN_HOME"]), max(3, args.tasks))
        waiting = dict(env, FLEETRUN_HOME=str(Path(tmp) / "home-waiting"))
        make_home(Path(waiting["FLEETRUN_HOME"]), max(3, args.tasks), placed=False)
        tasked = [[task if w == "TASK" else w for w in cmd] for cmd in TASK_COMMANDS]
        at = f" ({args.tasks} tasks)"
        none_placed = f" ({args.tasks}, none placed)"
        ways = [
            ("python -c pass", [sys.executable, "-c", "pass"], env),
            ('python -c "import sqlite3"', [sys.executable, "-c", "import sqlite3"], env),
        ]
        ways += [
            (f"python -m fleetrun {' '.join(cmd)}", [sys.executable, "-m", "fleetrun", *cmd], env) for cmd in COMMANDS
        ]
        ways += [
            (f"python -m fleetrun {' '.join(cmd)}{at}", [sys.executable, "-m", "fleetrun", *cmd], full)
            for cmd in tasked
        ]
        ways.append((f"python -m fleetrun status{none_placed}", [sys.executable, "-m", "fleetrun", "status"], waiting))
        if args.against:
            old = dict(env, PYTHONPATH=os.pathsep.join(filter(None, [args.against, env.get("PYTHONPATH")])))
            old_full = dict(old, FLEETRUN_HOME=full["FLEETRUN_HOME"])
            ways += [
                (f"  {' '.join(cmd)} of {Path(args.against).name}", [sys.executable, "-m", "fleetrun", *cmd], old)
                for cmd in COMMANDS
            ]
            ways += [
                (
                    f"  {' '.join(cmd)[:14]}{at} of {Path(args.against).name}",
                    [sys.executable, "-m", "fleetrun", *cmd],
                    old_full,
                )
                for cmd in tasked
            ]
            ways.append(
                (
                    f"  status{none_placed} of {Path(args.against).name}",
                    [sys.executable, "-m", "fleetrun", "status"],
                    dict(old, FLEETRUN_HOME=waiting["FLEETRUN_HOME"]),
                )
            )
        script = Path(sys.executable).with_name("fleetrun")
        if args.script:
            if script.exists():
                ways += [
                    (f"{script.name} {' '.join(cmd)} (console script)", [str(script), *cmd], env) for cmd in COMMANDS
                ]
            else:
                print(f"no console script at {script}; is fleetrun installed in this interpreter?")
        for _, argv_, env_ in ways:
            once(argv_, env_)  # warm the page cache and write the byte-code
        rows = interleaved(ways, args.runs)
        lookup = metadata_modules()
        base = rows["python -c pass"]
        lite = rows['python -c "import sqlite3"']

        print(
            f"python {sys.version.split()[0]} ({sys.executable}), {args.runs} runs each, interleaved, "
            "fresh FLEETRUN_HOME"
        )
        print(f"{'command':<52} {'wall':>9} {'ratio':>7} {'cpu':>9} {'ratio':>7} {'wall':>7} {'cpu':>7}")
        print(
            f"{'':<52} {'':>9} {'vs pass':>7} {'':>9} {'vs pass':>7} {'vs sqlite3':>15}  "
            f"(medians; goals <= {GOAL:.1f}x pass, status <= {SQLITE_GOAL:.1f}x sqlite3)"
        )
        for name, (wall, cpu) in rows.items():
            print(
                f"{name:<52} {wall * 1000:7.1f}ms {wall / base[0]:6.2f}x {cpu * 1000:7.1f}ms {cpu / base[1]:6.2f}x "
                f"{wall / lite[0]:6.2f}x {cpu / lite[1]:6.2f}x"
            )

        print()
        for cmd, cmd_env in [*((c, env) for c in COMMANDS), *((c, full) for c in tasked), (["status"], waiting)]:
            imports = importtime(cmd, cmd_env)
            mods = {m.strip() for _, _, m in imports}
            bad = sorted(m for m in mods if m.split(".")[0] in HEAVY)
            own = mods - lookup  # the installed plugins' look-up imports these for every command
            if cmd_env is not full and cmd != ["status"]:
                bad += sorted(m for m in own if m in NOT_FOR_HELP)
            if cmd_env is full or cmd_env is waiting:
                bad += sorted(m for m in own if m in NOT_FOR_VIEWING)
            if cmd_env is waiting:
                bad += sorted(m for m in mods if m in NOT_FOR_WAITING)
            total = sum(s for s, _, _ in imports)
            ours = len([m for m in mods if m.startswith("fleetrun")])
            verdict = f"imports {', '.join(bad)}: FAIL" if bad else "nothing it must not: ok"
            what = at if cmd_env is full else none_placed if cmd_env is waiting else ""
            print(
                f"fleetrun {' '.join(cmd)}{what}: {len(mods)} modules ({ours} of fleetrun's), {total / 1000:.1f}ms "
                f"importing; {verdict}"
            )
            failed = failed or bool(bad)
            top = sorted(
                (r for r in imports if r[2].strip().startswith("fleetrun") or not r[2].startswith(" ")),
                key=lambda r: -r[1],
            )[: args.top]
            for _, cum, name in top:
                print(f"    {cum / 1000:7.1f}ms  {name.strip()}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

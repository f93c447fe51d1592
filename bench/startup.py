"""How long fleetrun takes to start: ``--help``, ``--version`` and ``status``.

Each command runs ``--runs`` times (default 20) as ``python -m fleetrun ...`` with the
running interpreter and a fresh ``FLEETRUN_HOME``, next to ``python -c pass`` (the
interpreter's own start-up) as the baseline; the medians and the ratios are printed.
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
#: Modules a start-up command must not import (they belong to running tasks / peers).
HEAVY = ("paramiko", "pexpect")
#: What ``--help`` and ``--version`` must not import either: they only read the command
#: line (tests/test_startup.py checks the same list).
NOT_FOR_HELP = ("sqlite3", "fleetrun.ledger", "fleetrun.gitutil", "fleetrun.loop", "fleetrun.claudecli",
                "fleetrun.plugins.worktree", "importlib.metadata", "psutil", "socket", "subprocess")
#: The goal: each command within this ratio of ``python -c pass``.
GOAL = 2.0


def once(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall s, CPU s: user + system) of one run of ``argv``. CPU time is the steadier
    figure on a busy machine, where the wall time also waits for a core."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    # in the temp folder: not a checkout's (`python -m` puts the current folder first on sys.path)
    proc = subprocess.run(argv, env=env, cwd=os.path.dirname(env["FLEETRUN_HOME"]), stdin=subprocess.DEVNULL,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
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
    return {name: (statistics.median(w for w, _ in xs), statistics.median(c for _, c in xs)) for name, xs in got.items()}


def importtime(args: list[str], env: dict[str, str]) -> list[tuple[int, int, str]]:
    """(self µs, cumulative µs, module) for every import ``python -m fleetrun ARGS`` makes."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "fleetrun", *args], env=env,
                          cwd=os.path.dirname(env["FLEETRUN_HOME"]), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    rows = []
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        parts = line[len("import time:"):].split("|")
        try:
            rows.append((int(parts[0]), int(parts[1]), parts[2].rstrip()))
        except ValueError:
            continue  # the header line
    return rows


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="runs per command (default 20)")
    parser.add_argument("--script", action="store_true",
                        help="also time the fleetrun console script installed next to the interpreter")
    parser.add_argument("--top", type=int, default=8, help="slowest imports to list per command (default 8)")
    parser.add_argument("--against", metavar="DIR",
                        help="also time the fleetrun of another checkout (put first on PYTHONPATH), interleaved")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")

    failed = False
    with tempfile.TemporaryDirectory(prefix="fleetrun-startup-") as tmp:
        env = dict(os.environ, FLEETRUN_HOME=str(Path(tmp) / "home"), PYTHONPYCACHEPREFIX=str(Path(tmp) / "pycache"))
        env.pop("PYTHONPROFILEIMPORTTIME", None)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        ways = [("python -c pass", [sys.executable, "-c", "pass"], env)]
        ways += [(f"python -m fleetrun {' '.join(cmd)}", [sys.executable, "-m", "fleetrun", *cmd], env)
                 for cmd in COMMANDS]
        if args.against:
            old = dict(env, PYTHONPATH=os.pathsep.join(filter(None, [args.against, env.get("PYTHONPATH")])))
            ways += [(f"  {' '.join(cmd)} of {Path(args.against).name}", [sys.executable, "-m", "fleetrun", *cmd], old)
                     for cmd in COMMANDS]
        script = Path(sys.executable).with_name("fleetrun")
        if args.script:
            if script.exists():
                ways += [(f"{script.name} {' '.join(cmd)} (console script)", [str(script), *cmd], env)
                         for cmd in COMMANDS]
            else:
                print(f"no console script at {script}; is fleetrun installed in this interpreter?")
        for _, argv_, env_ in ways:
            once(argv_, env_)  # warm the page cache and write the byte-code
        rows = interleaved(ways, args.runs)
        base = rows["python -c pass"]

        print(f"python {sys.version.split()[0]} ({sys.executable}), {args.runs} runs each, interleaved, "
              "fresh FLEETRUN_HOME")
        print(f"{'command':<48} {'wall':>9} {'ratio':>7} {'cpu':>9} {'ratio':>7}  (medians; goal <= {GOAL:.1f}x)")
        for name, (wall, cpu) in rows.items():
            print(f"{name:<48} {wall * 1000:7.1f}ms {wall / base[0]:6.2f}x {cpu * 1000:7.1f}ms {cpu / base[1]:6.2f}x")

        print()
        for cmd in COMMANDS:
            imports = importtime(cmd, env)
            mods = {m.strip() for _, _, m in imports}
            bad = sorted(m for m in mods if m.split(".")[0] in HEAVY)
            if cmd != ["status"]:
                bad += sorted(m for m in mods if m in NOT_FOR_HELP)
            total = sum(s for s, _, _ in imports)
            ours = len([m for m in mods if m.startswith("fleetrun")])
            verdict = f"imports {', '.join(bad)}: FAIL" if bad else "nothing it must not: ok"
            print(f"fleetrun {' '.join(cmd)}: {len(mods)} modules ({ours} of fleetrun's), {total / 1000:.1f}ms "
                  f"importing; {verdict}")
            failed = failed or bool(bad)
            top = sorted((r for r in imports if r[2].strip().startswith("fleetrun")
                          or not r[2].startswith(" ")), key=lambda r: -r[1])[:args.top]
            for _, cum, name in top:
                print(f"    {cum / 1000:7.1f}ms  {name.strip()}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""How long fleetrun takes to start: ``--help``, ``--version`` and ``status``.

Each command runs ``--runs`` times (default 20) as ``python -m fleetrun ...`` with the
running interpreter and a fresh ``FLEETRUN_HOME``, next to ``python -c pass`` (the
interpreter's own start-up) as the baseline; the medians and the ratios are printed.
With ``--script`` the ``fleetrun`` console script next to the interpreter is timed too
(a version manager's shim on PATH, such as pyenv's, adds ~90 ms on top of that).

Then ``python -X importtime`` checks what each command imports: paramiko (SSH, only
for peers) and pexpect must not be imported by ``--help``, ``--version`` or
``status``, and the slowest imports are listed::

    python bench/startup.py
    python bench/startup.py --runs 50 --script
"""

from __future__ import annotations

import argparse
import os
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


def timed(argv: list[str], env: dict[str, str], runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        start = time.perf_counter()
        proc = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE)
        out.append(time.perf_counter() - start)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.decode(errors='replace')}")
    return out


def importtime(args: list[str], env: dict[str, str]) -> list[tuple[int, int, str]]:
    """(self µs, cumulative µs, module) for every import ``python -m fleetrun ARGS`` makes."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "fleetrun", *args], env=env,
                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
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
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")

    failed = False
    with tempfile.TemporaryDirectory(prefix="fleetrun-startup-") as tmp:
        env = dict(os.environ, FLEETRUN_HOME=str(Path(tmp) / "home"))
        env.pop("PYTHONPROFILEIMPORTTIME", None)
        timed([sys.executable, "-m", "fleetrun", "--version"], env, 1)  # warm the page cache and .pyc files
        rows: list[tuple[str, float]] = []
        base = statistics.median(timed([sys.executable, "-c", "pass"], env, args.runs))
        rows.append(("python -c pass", base))
        for cmd in COMMANDS:
            rows.append((f"python -m fleetrun {' '.join(cmd)}",
                         statistics.median(timed([sys.executable, "-m", "fleetrun", *cmd], env, args.runs))))
        script = Path(sys.executable).with_name("fleetrun")
        if args.script:
            if script.exists():
                for cmd in COMMANDS:
                    rows.append((f"{script.name} {' '.join(cmd)} (console script)",
                                 statistics.median(timed([str(script), *cmd], env, args.runs))))
            else:
                print(f"no console script at {script}; is fleetrun installed in this interpreter?")

        print(f"python {sys.version.split()[0]} ({sys.executable}), {args.runs} runs each, fresh FLEETRUN_HOME")
        print(f"{'command':<48} {'median':>9} {'ratio':>7}")
        for name, t in rows:
            print(f"{name:<48} {t * 1000:7.1f}ms {t / base:6.1f}x")

        print()
        for cmd in COMMANDS:
            imports = importtime(cmd, env)
            mods = {m.strip() for _, _, m in imports}
            bad = sorted(m for m in mods if m.split(".")[0] in HEAVY)
            total = sum(s for s, _, _ in imports)
            verdict = f"imports {', '.join(bad)}: FAIL" if bad else f"no {' or '.join(HEAVY)}: ok"
            print(f"fleetrun {' '.join(cmd)}: {len(mods)} modules, {total / 1000:.1f}ms importing; {verdict}")
            failed = failed or bool(bad)
            top = sorted((r for r in imports if r[2].strip().startswith("fleetrun")
                          or not r[2].startswith(" ")), key=lambda r: -r[1])[:args.top]
            for _, cum, name in top:
                print(f"    {cum / 1000:7.1f}ms  {name.strip()}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

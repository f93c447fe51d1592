"""What one shepherd costs: the CPU and wall time of a shepherd running ``/bin/true``.

Each run makes an attempt folder with a ``spec.json`` (argv ``/bin/true``) and runs the
shepherd on it as the host does (``python -I -S``), from its source and from the
byte-code the host compiles into the home (``fleetrun.shepherdrun``), next to
``python -I -S -c pass`` (the bare interpreter) as the baseline, interleaved. CPU is
user + system of the shepherd and its agent (``getrusage`` of the children)::

    python bench/shepherd.py                 # 40 runs of each
    python bench/shepherd.py --runs 100
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
from typing import Optional

from fleetrun import shepherd, shepherdrun


def once(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(cpu s, wall s) of one run of ``argv``."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdin=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime, wall


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40, help="runs of each (default 40)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="fleetrun-shepherd-") as tmp:
        pyc = shepherdrun.compiled(Path(tmp) / "cache")
        ways = {"python -I -S -c pass": ["-c", "pass"], "shepherd.py (source)": [shepherdrun.SHEPHERD_PATH]}
        if pyc is not None:
            ways["shepherd (byte-code)"] = [pyc]
        cpu: dict[str, list[float]] = {w: [] for w in ways}
        wall: dict[str, list[float]] = {w: [] for w in ways}
        env = dict(os.environ, **{shepherd.DEBUG_ENV: "1"})
        last: dict[str, Path] = {}
        for i in range(args.runs):
            for k, (name, code) in enumerate(ways.items()):
                adir = last[name] = Path(tmp) / f"{i}-{k}"
                adir.mkdir()
                (adir / shepherd.SPEC).write_text(json.dumps({"attempt_id": "a", "argv": ["/bin/true"], "env": {}}))
                extra = [str(adir)] if code != ["-c", "pass"] else []
                c, w = once([sys.executable, "-I", "-S", *code, *extra], env)
                cpu[name].append(c)
                wall[name].append(w)
        base_cpu = statistics.median(cpu["python -I -S -c pass"])
        base_wall = statistics.median(wall["python -I -S -c pass"])
        print(f"python {sys.version.split()[0]}, {args.runs} runs each (interleaved), agent /bin/true")
        print(f"{'':<24} {'cpu':>8} {'ratio':>6} {'wall':>9} {'ratio':>6}")
        for name in ways:
            c, w = statistics.median(cpu[name]), statistics.median(wall[name])
            print(f"{name:<24} {c * 1000:6.1f}ms {c / base_cpu:5.2f}x {w * 1000:7.1f}ms {w / base_wall:5.2f}x")
        names = (last[list(ways)[-1]] / shepherd.MODULES).read_text().splitlines()[1:]
        heavy = sorted(set(names) & {"json", "subprocess", "socket", "signal", "enum", "typing", "re"})
        print(f"the shepherd imported {len(names)} modules; of json/subprocess/socket/signal/enum/typing/re: "
              f"{', '.join(heavy) or 'none'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What one shepherd costs: the CPU and wall time of a shepherd running ``/bin/true``.

Each run makes an attempt folder with a ``spec.json`` (argv ``/bin/true``) and runs the
shepherd on it as the host does (``python -I -S``, by path), next to
``python -I -S -c pass`` (the bare interpreter) as the baseline, interleaved. CPU is
user + system of the shepherd and its agent (``getrusage`` of the children). With
``--against DIR`` the shepherd of another checkout runs too (and from the byte-code its
``fleetrun/shepherdrun.py`` compiled, when it has one: the way hosts ran it before
issue 23). ``forked by the starter`` is how the supervisor starts them since issue 24:
one ``shepherd.py --starter`` (:class:`fleetrun.hosts.ShepherdStarter`) forks each; its
CPU is the starter's whole life (its own start once, then every shepherd it forked and
reaped) over the runs, its wall the time from the request to the shepherd's exit.

Then the same for the wrapper every local verifier runs under (:mod:`fleetrun.capped`,
its command ``/bin/true``): ``python -I -S capped.py`` by path, as a host without a
starter runs it, against the wrapper forked by a starter of its own
(:meth:`fleetrun.hosts.ShepherdStarter.start_capped`, as the supervisor's host runs it
since issue 24), its wall the time from the request to its exit code::

    python bench/shepherd.py                 # 40 runs of each
    python bench/shepherd.py --runs 100
    python bench/shepherd.py --against ../main
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

from fleetrun import shepherd
from fleetrun.hosts import ShepherdStarter
from fleetrun.procutil import CAPPED_PATH


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
    parser.add_argument(
        "--against",
        type=Path,
        default=None,
        metavar="DIR",
        help="a checkout whose shepherd runs too (before/after in the same run)",
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="fleetrun-shepherd-") as tmp:
        ways = {"python -I -S -c pass": ["-c", "pass"], "shepherd.py": [shepherd.SHEPHERD_PATH]}
        if args.against is not None:
            old = args.against.resolve() / "fleetrun"
            ways[f"shepherd.py of {args.against.name}"] = [str(old / "shepherd.py")]
            pyc = _old_byte_code(old, Path(tmp) / "cache")
            if pyc is not None:
                ways[f"byte-code of {args.against.name}"] = [pyc]
        forked = "forked by the starter"
        cpu: dict[str, list[float]] = {w: [] for w in [*ways, forked]}
        wall: dict[str, list[float]] = {w: [] for w in [*ways, forked]}
        env = dict(os.environ, **{shepherd.DEBUG_ENV: "1"})
        last: dict[str, Path] = {}
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        starter = ShepherdStarter(Path(tmp) / "starter.out")
        starter_cpu = 0.0
        for i in range(args.runs):
            for k, (name, code) in enumerate(ways.items()):
                adir = last[name] = Path(tmp) / f"{i}-{k}"
                adir.mkdir()
                (adir / shepherd.SPEC).write_text(json.dumps({"attempt_id": "a", "argv": ["/bin/true"], "env": {}}))
                extra = [str(adir)] if code != ["-c", "pass"] else []
                c, w = once([sys.executable, "-I", "-S", *code, *extra], env)
                cpu[name].append(c)
                wall[name].append(w)
                starter_cpu -= c  # its children's CPU is ours only once it is reaped: below
            adir = Path(tmp) / f"{i}-starter"
            adir.mkdir()
            (adir / shepherd.SPEC).write_text(json.dumps({"attempt_id": "a", "argv": ["/bin/true"], "env": {}}))
            t0 = time.perf_counter()
            pid = starter.start(str(adir), env)
            while shepherd.proc_token(pid) is not None:  # until it has exited (a zombie has)
                time.sleep(0.0005)
            wall[forked].append(time.perf_counter() - t0)
        starter.close()
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        starter_cpu += r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime
        cpu[forked] = [starter_cpu / args.runs]
        capped_rows = _capped(Path(tmp), args.runs, env)
        for name, (c, w) in capped_rows.items():
            cpu[name], wall[name] = c, w
        base_cpu = statistics.median(cpu["python -I -S -c pass"])
        base_wall = statistics.median(wall["python -I -S -c pass"])
        print(f"python {sys.version.split()[0]}, {args.runs} runs each (interleaved), agent /bin/true")
        print(f"{'':<32} {'cpu':>8} {'ratio':>6} {'wall':>9} {'ratio':>6}")
        for name in [*ways, forked, *capped_rows]:
            c, w = statistics.median(cpu[name]), statistics.median(wall[name])
            print(f"{name:<32} {c * 1000:6.1f}ms {c / base_cpu:5.2f}x {w * 1000:7.1f}ms {w / base_wall:5.2f}x")
        names = (last["shepherd.py"] / shepherd.MODULES).read_text().splitlines()[1:]
        heavy = sorted(set(names) & {"json", "subprocess", "socket", "signal", "enum", "typing", "re"})
        print(
            f"the shepherd imported {len(names)} modules; of json/subprocess/socket/signal/enum/typing/re: "
            f"{', '.join(heavy) or 'none'}"
        )
    return 0


def _capped(tmp: Path, runs: int, env: dict[str, str]) -> dict[str, tuple[list[float], list[float]]]:
    """The wrapper of ``/bin/true`` by path and forked by a starter: {row: (cpu s, wall s)}
    (the forked one's CPU is its starter's whole life over the runs, as above)."""
    by_path, forked = "capped.py by path", "capped forked by the starter"
    cpu: dict[str, list[float]] = {by_path: [], forked: []}
    wall: dict[str, list[float]] = {by_path: [], forked: []}
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    starter = ShepherdStarter(tmp / "capped-starter.out")
    starter_cpu = 0.0
    for i in range(runs):
        out = str(tmp / f"capped-{i}.out")
        c, w = once([sys.executable, "-I", "-S", CAPPED_PATH, "20000000", out, "--", "/bin/true"], env)
        cpu[by_path].append(c)
        wall[by_path].append(w)
        starter_cpu -= c
        t0 = time.perf_counter()
        _pid, fd = starter.start_capped(20_000_000, out + ".f", ["/bin/true"], str(tmp), env, None)
        try:
            while os.read(fd, 64):  # its exit code, then the pipe's end
                pass
        finally:
            os.close(fd)
        wall[forked].append(time.perf_counter() - t0)
    starter.close()
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    starter_cpu += r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime
    cpu[forked] = [starter_cpu / runs]
    return {name: (cpu[name], wall[name]) for name in (by_path, forked)}


def _old_byte_code(package: Path, cache: Path) -> Optional[str]:
    """The shepherd's byte-code as an old checkout's ``shepherdrun.compiled`` made it,
    or None when that checkout has none (it runs its source)."""
    import importlib.util

    path = package / "shepherdrun.py"
    spec = importlib.util.spec_from_file_location("old_shepherdrun", path)
    if not path.exists() or spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    pyc = module.compiled(cache, str(package / "shepherd.py"))
    return str(pyc) if pyc else None


if __name__ == "__main__":
    raise SystemExit(main())

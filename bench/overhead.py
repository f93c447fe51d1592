"""What fleetrun costs on top of doing the same work by hand.

N trivial tasks (default 100), 4 at a time. Each task: a git worktree and branch made
from ``main`` in a fresh tmp repository, an agent that writes one file and commits it,
a ``run = "true"`` verifier, and the clean worktree removed afterwards. The same run
measures the work two ways, each on its own fresh repository:

- **fleetrun**: ``python -m fleetrun tasks.toml`` as a subprocess with a fresh
  ``FLEETRUN_HOME``, wall time from spawn to exit (interpreter start, plugin loading,
  collection, the ledger, a shepherd per attempt, all included).
- **baseline**: what you would do by hand, from a Python thread pool of the same width
  running the same processes: ``git worktree add -b BRANCH PATH main``, the agent in
  that worktree (output to a log file), ``/bin/sh -c true`` in it, and
  ``git worktree remove PATH``. ``git worktree add`` and ``remove`` are serialised by a
  lock, as fleetrun serialises them per repository (git's worktree and branch
  commands fail now and then when run concurrently on one repository); the agent and
  the verifier run in parallel.

Run::

    python bench/overhead.py                 # N=100, 4 at a time, once
    python bench/overhead.py --repeat 5      # the median of 5 runs each way
    python bench/overhead.py --n 20 --parallel 2 --agent python
    python bench/overhead.py --fsyncs        # and the supervisor's fsyncs per task (strace)
    python bench/overhead.py --profile P     # and cProfile of the supervisor's main thread to P

Goal: fleetrun within 1.25x of the baseline at N=100 (exit code 1 if a run is over
``--goal``, so it can gate CI if wanted). The fleetrun phases printed under the table
come from its own ledger and the shepherds' status files: where the time goes.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Optional

GIT_ENV = {
    "GIT_AUTHOR_NAME": "bench",
    "GIT_AUTHOR_EMAIL": "bench@example.invalid",
    "GIT_COMMITTER_NAME": "bench",
    "GIT_COMMITTER_EMAIL": "bench@example.invalid",
    "GIT_TERMINAL_PROMPT": "0",
}

#: The agent as a shell one-liner: write one file, commit it.
SH_AGENT = (
    "echo done > bench.txt && git add bench.txt && "
    "git -c user.name=bench -c user.email=bench@example.invalid commit -q -m bench"
)

#: The same agent as a Python script (what a real agent CLI's start-up looks like, roughly).
PY_AGENT = """\
import subprocess
with open("bench.txt", "w") as f:
    f.write("done\\n")
subprocess.run(["git", "add", "bench.txt"], check=True)
subprocess.run(["git", "-c", "user.name=bench", "-c", "user.email=bench@example.invalid",
                "commit", "-q", "-m", "bench"], check=True)
"""


def git(cwd: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(cwd), *args],
        check=True,
        env=dict(os.environ, **GIT_ENV),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def make_repo(path: Path) -> Path:
    """A fresh repository with one commit on ``main``."""
    path.mkdir(parents=True)
    git(path, "init", "-q")
    git(path, "symbolic-ref", "HEAD", "refs/heads/main")
    (path / "README.md").write_text("bench\n")
    git(path, "add", "README.md")
    git(path, "commit", "-q", "-m", "initial commit")
    return path


def agent_argv(kind: str, script: Path, python: str) -> list[str]:
    if kind == "sh":
        return ["/bin/sh", "-c", SH_AGENT]
    return [python, str(script)]


#: ``python -m fleetrun ARGS`` that writes its own CPU and its children's to ``sys.argv[1]``
#: as it exits (``getrusage``: the shepherds are its children, reaped, so they count).
RUSAGE_WRAPPER = """\
import atexit, json, resource, runpy, sys
out = sys.argv.pop(1)
def _dump():
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(out, "w") as f:
        json.dump({"self": s.ru_utime + s.ru_stime, "children": c.ru_utime + c.ru_stime}, f)
atexit.register(_dump)
sys.argv[0] = "fleetrun"
runpy.run_module("fleetrun", run_name="__main__", alter_sys=True)
"""

#: The same, under ``cProfile`` of its main thread (``time.thread_time``: its CPU, not
#: the time it waits), the stats dumped to ``sys.argv[1]`` as it exits. Not timed.
PROFILE_WRAPPER = """\
import atexit, cProfile, runpy, sys, time
out = sys.argv.pop(1)
prof = cProfile.Profile(time.thread_time)
def _dump():
    prof.disable()
    prof.dump_stats(out)
atexit.register(_dump)
sys.argv[0] = "fleetrun"
prof.enable()
runpy.run_module("fleetrun", run_name="__main__", alter_sys=True)
"""


def cpu_children() -> float:
    """User + system CPU seconds of every waited-for descendant so far."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def cpu_self() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def toml_str(s: str) -> str:
    return json.dumps(s)  # a JSON string is a valid TOML basic string


# -- fleetrun -------------------------------------------------------------------------


def write_tasks(folder: Path, repo: Path, n: int, kind: str, script: Path) -> Path:
    argv = agent_argv(kind, script, "{python}")
    lines = ["[agents.bench]", f"command = [{', '.join(toml_str(a) for a in argv)}]", ""]
    for i in range(n):
        lines += [
            "[[task]]",
            f'name = "t{i:04d}"',
            f"cwd = {toml_str(str(repo))}",
            'agent = "bench"',
            'prompt = "write bench.txt and commit it"',
            'git_ref = "main"',
            "  [[task.verify]]",
            '  run = "true"',
            "",
        ]
    path = folder / "tasks.toml"
    path.write_text("\n".join(lines))
    return path


def run_fleetrun(
    work: Path,
    n: int,
    parallel: int,
    kind: str,
    script: Path,
    against: Optional[Path] = None,
    fsyncs: bool = False,
    profile: Optional[Path] = None,
) -> dict[str, Any]:
    repo = make_repo(work / "repo")
    home = work / "home"
    tasks = write_tasks(work, repo, n, kind, script)
    env = fleetrun_env(work.parent, against)
    env["FLEETRUN_HOME"] = str(home)
    usage = work / "rusage.json"
    # run as `python -m fleetrun` would, the supervisor's own CPU and its children's
    # (shepherds, agents, git, verifiers: all waited for) written as it exits
    argv = [sys.executable, "-c", RUSAGE_WRAPPER, str(usage), str(tasks), "--max-tasks", str(parallel)]
    if profile is not None:
        argv = [sys.executable, "-c", PROFILE_WRAPPER, str(profile), str(tasks), "--max-tasks", str(parallel)]
    trace = work / "fsyncs.strace"
    if fsyncs:  # the supervisor's own syscalls only (no -f): the ledger's syncs, not git's or a shepherd's
        argv = ["strace", "-c", "-e", "trace=fsync,fdatasync", "-o", str(trace), *argv]
    out = work / "fleetrun.out"
    with open(out, "wb") as f:
        cpu0 = cpu_children()
        start = time.perf_counter()
        code = subprocess.call(argv, env=env, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT, cwd=work)
        wall = time.perf_counter() - start
        cpu = cpu_children() - cpu0
    if code != 0:
        tail = out.read_text(errors="replace")[-3000:]
        raise SystemExit(f"fleetrun exited {code} ({shlex.join(argv)}):\n{tail}")
    split = json.loads(usage.read_text()) if profile is None else {"self": 0.0, "children": 0.0}
    result = {"wall": wall, "cpu": cpu, "self": split["self"], "children": split["children"], **fleetrun_phases(home)}
    if fsyncs:
        result["fsyncs"] = strace_calls(trace)
    left = list((home / "worktrees").iterdir()) if (home / "worktrees").exists() else []
    if left:
        raise SystemExit(f"fleetrun left {len(left)} worktree(s) behind, e.g. {left[0]}")
    return result


def fleetrun_env(tmp: Path, against: Optional[Path] = None) -> dict[str, str]:
    """The environment fleetrun runs with: ``against``'s fleetrun/ first on the path, if
    given, and byte-code cached in ``tmp/pycache`` (``PYTHONDONTWRITEBYTECODE`` dropped),
    as an installed fleetrun has its own: where a session sets that variable, every run
    compiled ~100 modules from source (~0.14 s, ~1.4 ms a task at N=100), a cost of the
    session, not of fleetrun. The cache is filled by an untimed run of each fleetrun first
    (with a prefix, Python reads no ``__pycache__`` of the standard library either)."""
    env = dict(os.environ, PYTHONPYCACHEPREFIX=str(tmp / "pycache"))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if against is not None:  # the code to compare with: its fleetrun/ first on the path
        env["PYTHONPATH"] = str(against)
    return env


def strace_calls(path: Path) -> int:
    """The calls counted in a ``strace -c`` summary (its ``total`` line)."""
    for line in path.read_text().splitlines():
        cols = line.split()
        if cols and cols[-1] == "total":
            return int(cols[3] if len(cols) >= 5 else cols[2])
    return 0


def fleetrun_phases(home: Path) -> dict[str, Any]:
    """Per-task latency and phases, from the ledger and the shepherds' status files."""
    db = sqlite3.connect(f"file:{home / 'state.db'}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT task_id, from_state, to_state, time FROM transitions ORDER BY id").fetchall()
        atts = db.execute("SELECT id, task_id, created, started FROM attempts").fetchall()
        notes = db.execute("SELECT task_id, MAX(time) FROM notes GROUP BY task_id").fetchall()
        states = db.execute("SELECT state, COUNT(*) FROM tasks GROUP BY state").fetchall()
    finally:
        db.close()
    if dict(states).get("DONE", 0) != sum(n for _, n in states):
        raise SystemExit(f"not every task is DONE: {dict(states)}")
    t: dict[str, dict[str, float]] = {}
    for task_id, src, dst, when in rows:
        d = t.setdefault(task_id, {})
        if src == "READY" and "leave_ready" not in d:
            d["leave_ready"] = when
        d.setdefault(dst, when)
    cleaned = dict(notes)
    phases: dict[str, list[float]] = {
        k: []
        for k in (
            "latency",
            "lease->shepherd spawned",
            "shepherd spawn->agent exec",
            "agent",
            "agent end->VERIFYING",
            "VERIFYING->DONE",
            "DONE->worktree removed",
        )
    }
    for att_id, task_id, created, started in atts:
        d = t[task_id]
        st = _read_json(home / "attempts" / att_id / "status.json")
        end = max(d["DONE"], cleaned.get(task_id, 0.0))
        phases["latency"].append(end - d.get("leave_ready", created))
        phases["lease->shepherd spawned"].append(started - created)
        if st.get("agent_started") and st.get("ended"):
            phases["shepherd spawn->agent exec"].append(st["agent_started"] - started)
            phases["agent"].append(st["ended"] - st["agent_started"])
            phases["agent end->VERIFYING"].append(d["VERIFYING"] - st["ended"])
        phases["VERIFYING->DONE"].append(d["DONE"] - d["VERIFYING"])
        if task_id in cleaned:
            phases["DONE->worktree removed"].append(cleaned[task_id] - d["DONE"])
    return {"phases": phases}


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


# -- the baseline ---------------------------------------------------------------------


def run_baseline(work: Path, n: int, parallel: int, kind: str, script: Path) -> dict[str, Any]:
    repo = make_repo(work / "repo")
    wt = work / "worktrees"
    wt.mkdir()
    logs = work / "logs"
    logs.mkdir()
    agent = agent_argv(kind, script, sys.executable)
    lock = threading.Lock()  # like fleetrun's per-repository lock around worktree add/remove
    env = dict(os.environ)
    quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": subprocess.PIPE}
    phases: dict[str, list[float]] = {
        k: [] for k in ("latency", "worktree add", "agent", "verifier", "worktree remove")
    }

    def one(i: int) -> None:
        name = f"t{i:04d}"
        path = wt / name
        t0 = time.perf_counter()
        with lock:
            subprocess.run(
                ["git", "-C", str(repo), "worktree", "add", "-q", "-b", f"bench/{name}", "--", str(path), "main"],
                check=True,
                env=env,
                **quiet,
            )
        t1 = time.perf_counter()
        with open(logs / name, "wb") as log:
            subprocess.run(
                agent, cwd=path, env=env, check=True, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        t2 = time.perf_counter()
        with open(logs / f"{name}.verify", "wb") as log:
            subprocess.run(
                ["/bin/sh", "-c", "true"],
                cwd=path,
                env=env,
                check=True,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        t3 = time.perf_counter()
        with lock:
            subprocess.run(
                ["git", "-C", str(repo), "worktree", "remove", "--", str(path)], check=True, env=env, **quiet
            )
        t4 = time.perf_counter()
        for key, value in zip(phases, (t4 - t0, t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            phases[key].append(value)  # list.append is atomic under the GIL

    cpu0 = cpu_children() + cpu_self()
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        for fut in [pool.submit(one, i) for i in range(n)]:
            fut.result()
    wall = time.perf_counter() - start
    cpu = cpu_children() + cpu_self() - cpu0
    return {"wall": wall, "cpu": cpu, "phases": phases}


# -- report ---------------------------------------------------------------------------


#: what the whole run is inside (the command, the session, the loop and its pass): not listed
_WHOLE_RUN = frozenset({"console_main", "main", "cmd_run", "run_session", "run", "step", "_step"})


def print_profile(path: Path, n: int) -> None:
    """The supervisor's main thread from ``--profile``: its CPU, the loop's parts by
    cumulative CPU per task, and how often placement was asked (``fleetrun_place``)
    and this machine measured, per task."""
    import pstats

    stats = pstats.Stats(str(path))
    table: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    calls: dict[str, int] = {}
    rows = []
    for (file, line, func), (_cc, nc, _tt, ct, _callers) in table.items():
        if func in ("fleetrun_place", "measure_local", "step") and "/fleetrun/" in file:
            calls[func] = calls.get(func, 0) + nc
        if "/fleetrun/" in file and not func.startswith("<") and func not in _WHOLE_RUN:
            rows.append((ct, nc, f"{Path(file).parent.name}/{Path(file).name}:{line}({func})"))
    total = getattr(stats, "total_tt", 0.0)
    print(f"\nprofile of the supervisor's main thread (cProfile, its CPU; {path}): {total:.2f}s")
    print(
        f"  per task: {calls.get('fleetrun_place', 0) / n:.2f} fleetrun_place calls, "
        f"{calls.get('measure_local', 0) / n:.2f} measures of this machine, {calls.get('step', 0) / n:.2f} passes"
    )
    for ct, nc, name in sorted(rows, reverse=True)[:22]:
        print(f"  {ct / n * 1000:7.2f} ms/task  {nc:6d} calls  {name}")


def ms(x: float) -> str:
    return f"{x * 1000:7.1f}"


def summarize(name: str, phases: dict[str, list[float]]) -> list[str]:
    out = [f"  {name:<28} {'median':>7} {'p90':>7} {'max':>7}  (ms, per task)"]
    for key, values in phases.items():
        if not values:
            continue
        vs = sorted(values)
        p90 = vs[min(len(vs) - 1, int(round(0.9 * (len(vs) - 1))))]
        out.append(f"  {key:<28} {ms(statistics.median(vs))} {ms(p90)} {ms(vs[-1])}")
    return out


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100, help="tasks per run (default 100)")
    parser.add_argument("--parallel", type=int, default=4, help="tasks at a time (default 4)")
    parser.add_argument("--repeat", type=int, default=1, help="runs each way; the median is reported (default 1)")
    parser.add_argument(
        "--agent",
        choices=("sh", "python"),
        default="sh",
        help="the agent: a sh one-liner (default) or a Python script doing the same",
    )
    parser.add_argument("--goal", type=float, default=1.25, help="the ratio to stay under (default 1.25)")
    parser.add_argument("--dir", type=Path, default=None, help="folder for the temp files (default: system temp)")
    parser.add_argument("--keep", action="store_true", help="keep the temp folder (to look at logs and ledger)")
    parser.add_argument(
        "--against",
        type=Path,
        default=None,
        help="a folder holding another fleetrun/ (say `git archive REV fleetrun | tar -x -C DIR`): "
        "run it too, interleaved, as 'before'",
    )
    parser.add_argument(
        "--fsyncs",
        action="store_true",
        help="also count the supervisor's fsync/fdatasync calls (the ledger's commits), under "
        "strace, in one more run of each fleetrun (not timed)",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        metavar="PATH",
        help="also run fleetrun once more (not timed) under cProfile of its main thread's CPU, the stats "
        "written to PATH; print where it goes and the fleetrun_place calls per task",
    )
    args = parser.parse_args(argv)
    if args.n < 1 or args.parallel < 1 or args.repeat < 1:
        parser.error("--n, --parallel and --repeat must be at least 1")

    tmp = Path(tempfile.mkdtemp(prefix="fleetrun-overhead-", dir=args.dir))
    script = tmp / "agent.py"
    script.write_text(PY_AGENT)
    fleet: list[dict[str, Any]] = []
    base: list[dict[str, Any]] = []
    before: list[dict[str, Any]] = []
    print(
        f"{args.n} tasks, {args.parallel} at a time, {args.agent} agent, {args.repeat} run(s) each way; "
        f"python {sys.version.split()[0]}, {os.cpu_count()} cpus; temp {tmp}",
        flush=True,
    )
    try:
        # untimed: the byte-code cache filled (fleetrun_env), for each fleetrun
        run_fleetrun(tmp / "warm", 2, args.parallel, args.agent, script)
        if args.against is not None:
            run_fleetrun(tmp / "warm-before", 2, args.parallel, args.agent, script, against=args.against.resolve())
        for r in range(args.repeat):
            # alternate which goes first, so a warm cache or a noisy neighbour favours neither
            order: list[tuple[str, Any, list[dict[str, Any]]]] = [
                ("baseline", run_baseline, base),
                ("fleetrun", run_fleetrun, fleet),
            ]
            if args.against is not None:
                order.append(("before", lambda *a: run_fleetrun(*a, against=args.against.resolve()), before))
            if r % 2:
                order.reverse()
            for name, fn, results in order:
                res = fn(tmp / f"{name}-{r}", args.n, args.parallel, args.agent, script)
                results.append(res)
                own = f", supervisor {res['self']:.2f}s" if "self" in res else ""
                print(f"  run {r + 1}: {name:<8} {res['wall']:7.2f}s wall, {res['cpu']:6.2f}s cpu{own}", flush=True)
        if args.fsyncs:
            counts = [
                (
                    "fleetrun",
                    run_fleetrun(tmp / "fsyncs", args.n, args.parallel, args.agent, script, fsyncs=True)["fsyncs"],
                )
            ]
            if args.against is not None:
                counts.append(
                    (
                        "before",
                        run_fleetrun(
                            tmp / "fsyncs-before",
                            args.n,
                            args.parallel,
                            args.agent,
                            script,
                            against=args.against.resolve(),
                            fsyncs=True,
                        )["fsyncs"],
                    )
                )
            for name, got in counts:
                print(f"  {name:<8} {got} fsyncs of the supervisor, {got / args.n:.1f} per task", flush=True)
        if args.profile is not None:
            run_fleetrun(tmp / "profile", args.n, args.parallel, args.agent, script, profile=args.profile.resolve())
            print_profile(args.profile, args.n)
    finally:
        if not args.keep:
            subprocess.run(["rm", "-rf", "--", str(tmp)], check=False)
    fw = statistics.median(x["wall"] for x in fleet)
    bw = statistics.median(x["wall"] for x in base)
    ratio = fw / bw
    mid_f = sorted(fleet, key=lambda x: x["wall"])[(len(fleet) - 1) // 2]
    mid_b = sorted(base, key=lambda x: x["wall"])[(len(base) - 1) // 2]
    print()
    fc = statistics.median(x["cpu"] for x in fleet)
    bc = statistics.median(x["cpu"] for x in base)
    print(f"{'':10} {'wall (median)':>14} {'per task':>10} {'cpu (median)':>14} {'per task':>10}")
    print(f"{'baseline':10} {bw:13.2f}s {bw / args.n * 1000:8.1f}ms {bc:13.2f}s {bc / args.n * 1000:8.1f}ms")
    print(f"{'fleetrun':10} {fw:13.2f}s {fw / args.n * 1000:8.1f}ms {fc:13.2f}s {fc / args.n * 1000:8.1f}ms")
    if before:
        ow = statistics.median(x["wall"] for x in before)
        oc = statistics.median(x["cpu"] for x in before)
        print(f"{'before':10} {ow:13.2f}s {ow / args.n * 1000:8.1f}ms {oc:13.2f}s {oc / args.n * 1000:8.1f}ms")
        print(
            f"before     {ow / bw:13.2f}x  overhead {(ow - bw) / args.n * 1000:.1f}ms per task; "
            f"fleetrun/before {fw / ow:.2f}x wall, {fc / oc:.2f}x cpu"
        )
    print(f"ratio      {ratio:13.2f}x  (goal < {args.goal:g}x: {'met' if ratio < args.goal else 'NOT met'})")
    print(f"overhead   {(fw - bw) / args.n * 1000:13.1f}ms per task")
    print()
    # CPU per task against the floor (the baseline's CPU: git worktree add/remove, the
    # agent, the verifier, measured in the same run); the supervisor's own CPU apart
    # from its children's (shepherds, agents, git, verifiers)
    print(f"{'cpu per task (median)':<22} {'total':>8} {'/floor':>7} {'supervisor':>11} {'children':>9}")
    print(f"{'floor (baseline)':<22} {bc / args.n * 1000:6.1f}ms")
    for name, runs in (("fleetrun", fleet), ("before", before)):
        if runs:
            tot = statistics.median(x["cpu"] for x in runs) / args.n
            own = statistics.median(x["self"] for x in runs) / args.n
            kids = statistics.median(x["children"] for x in runs) / args.n
            print(
                f"{name:<22} {tot * 1000:6.1f}ms {tot / (bc / args.n):6.2f}x {own * 1000:9.1f}ms {kids * 1000:7.1f}ms"
            )
    print()
    print("\n".join(summarize("baseline (median run)", mid_b["phases"])))
    print("\n".join(summarize("fleetrun (median run)", mid_f["phases"])))
    if args.keep:
        print(f"\nkept {tmp}")
    return 0 if ratio < args.goal else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""What the number of TASKS costs: ``fleetrun queue``, the idle supervisor and ``status``
with 1,000, 10,000 and 100,000 queued tasks (and a 1,000-task DAG with fan-in and
fan-out), each against a baseline measured in the same run.

Each size gets a fresh ``FLEETRUN_HOME``, a git repository with one commit and a
``tasks.toml`` of that many tasks (a prompt, ``git_ref``, a ``run`` verifier). None can
start: the first task requires a tag no machine has and every other one depends on it
(``wait``: PENDING behind one task), or, with ``--scenario ready``, a draining policy
holds them all READY. The ``dag`` size is 1,000 tasks in layers of 50, each task
depending on two of the layer before (fan-in 2, fan-out up to 4), under the same head.

For each size, every figure a process's own (its CPU, user + system, in microseconds
from ``getrusage``; its peak RSS from GNU ``/usr/bin/time``):

- **queue**: ``python -m fleetrun queue tasks.toml``, against a plain SQLite insert of
  the same rows (a Python process that reads the same TOML with ``tomllib`` and inserts
  one row a task, name, prompt and the task as JSON, in one transaction);
- **first pass**: ``Loop.step``'s first pass, timed in a child process running
  ``fleetrun work`` (as ``loopscale.py`` does), and the median of the next ones;
- **idle**: ``python -m fleetrun work`` as a process: the time from its start to its
  second pass (``settled``: start-up, reading the ledger and the first pass; seen as
  the second beat in ``supervisor.json``, written before each pass), then its CPU over
  ``--idle`` seconds (% of one core) and its RSS at the end;
- **status**, **status --json**: against ``python -c "import sqlite3"``.

Medians of ``--repeat`` rounds; ratios to the baseline of the same round; and the growth
factor of each figure from one size to the next (x10 tasks: 10 is linear).

``--against DIR`` measures ``queue`` and ``status`` with the fleetrun of another
checkout too (``DIR`` first on ``PYTHONPATH``: ``git archive REV fleetrun | tar -x -C
DIR``), in the same rounds, each in a home of its own, the two taking turns (which goes
first alternates from round to round), so a busy moment of the shared machine slows
both alike; its rows are marked with ``DIR``'s name::

    python bench/scale.py
    python bench/scale.py --sizes 1000,10000 --repeat 3
    python bench/scale.py --sizes 100000 --idle 10
    python bench/scale.py --sizes 10000,100000 --no-loop --repeat 3 --against /tmp/main
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import psutil  # noqa: E402

TIME = "/usr/bin/time"

#: The plain insert the queue is compared with: the same TOML read, a row a task.
BASELINE_INSERT = r"""
import json, sqlite3, sys, tomllib
with open(sys.argv[1], "rb") as f:
    data = tomllib.load(f)
conn = sqlite3.connect(sys.argv[2])
conn.execute("CREATE TABLE tasks (id TEXT PRIMARY KEY, name TEXT, prompt TEXT, spec TEXT)")
with conn:
    conn.executemany("INSERT INTO tasks VALUES (?, ?, ?, ?)",
                     ((str(i), t["name"], t["prompt"], json.dumps(t)) for i, t in enumerate(data["task"])))
conn.close()
"""


def tasks_toml(n: int, repo: Path, scenario: str, dag: bool) -> str:
    out = [f'[[task]]\nname = "head"\ncwd = "{repo}"\nprompt = "p"\ngit_ref = "main"\n']
    if scenario == "wait":
        out[0] += 'requires = ["bench-never"]\n'
    width = 50
    for i in range(1, n):
        if dag:
            layer, k = divmod(i - 1, width)
            if layer == 0:
                deps = '["head"]'
            else:
                prev = (layer - 1) * width + 1
                deps = json.dumps([f"t{prev + k}", f"t{prev + (k + 1) % width}"])
        else:
            deps = '["head"]'
        if scenario == "ready" and not dag:
            deps = "[]"
        out.append(
            f'[[task]]\nname = "t{i}"\ncwd = "{repo}"\nprompt = "do item {i}"\ngit_ref = "main"\n'
            f'depends_on = {deps}\n\n  [[task.verify]]\n  run = "true"\n'
        )
    return "\n".join(out)


def make_home(home: Path, scenario: str) -> None:
    home.mkdir(mode=0o700)
    if scenario == "ready":
        (home / "policy.toml").write_text("[local]\ndrain = true\n")


def make_root(root: Path, n: int, scenario: str, dag: bool) -> dict[str, str]:
    """The repository, the tasks file and an empty home; :return: the env."""
    repo = root / "repo"
    repo.mkdir(parents=True)
    git = ["git", "-C", str(repo), "-c", "user.name=b", "-c", "user.email=b@b"]
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
    (repo / "README").write_text("bench\n")
    subprocess.run([*git, "add", "README"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "init"], check=True)
    home = root / "home"
    make_home(home, scenario)
    (root / "tasks.toml").write_text(tasks_toml(n, repo, scenario, dag))
    env = {**os.environ, "FLEETRUN_HOME": str(home), "TERM": "dumb"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def run(argv: list[str], env: dict[str, str], cwd: Path, ok: tuple[int, ...] = (0, 1)) -> tuple[float, float, float]:
    """Run ``argv`` under GNU ``time`` (a small process: the child's peak RSS is its own,
    not this bench's, which a forked child would inherit as its high-water mark);
    :return: (wall s, CPU s, peak RSS MiB) of that process alone."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as out:
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        proc = subprocess.run(
            [TIME, "-f", "%e %U %S %M", "-o", out.name, *argv],
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode not in ok:
            raise SystemExit(
                f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.decode(errors='replace')[-2000:]}"
            )
        wall, _user, _system, kib = out.read().split()[-4:]
    # the CPU in microseconds (GNU time's is in hundredths: a start-up of 20 ms against
    # one of 60 ms read 0.02 against 0.06 or 0.07); the time process's own adds well
    # under a millisecond
    cpu = r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime
    return float(wall), cpu, int(kib) / 1024


def first_pass(env: dict[str, str], cwd: Path, passes: int) -> tuple[float, float]:
    """The first ``Loop.step`` and the median of the next ``passes``, in a child process."""
    here = str(Path(__file__).parent)
    code = (
        f"import json, sys; sys.path.insert(0, {here!r}); import loopscale; from pathlib import Path; "
        f"f, rest = loopscale.pass_times(Path(sys.argv[1]), {passes}); "
        "print(json.dumps([f.wall, sorted(rest)[len(rest) // 2]]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, env["FLEETRUN_HOME"]],
        env=env,
        cwd=cwd,
        check=True,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
    ).stdout
    first, rest = json.loads(out.strip().splitlines()[-1])
    return float(first), float(rest)


def idle(env: dict[str, str], cwd: Path, seconds: float) -> tuple[float, float, float]:
    """``fleetrun work`` as a process: (seconds until its CPU settled, % of one core over
    ``seconds`` after that, RSS MiB at the end)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "fleetrun", "work", "-q"],
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        p = psutil.Process(proc.pid)
        start = time.perf_counter()
        deadline = start + 900
        # the loop beats (supervisor.json) before each pass, at most once a second: a
        # second beat is a pass after the first (start-up and the first pass are done)
        beats: set[float] = set()
        live = Path(env["FLEETRUN_HOME"]) / "supervisor.json"
        while len(beats) < 2 and time.perf_counter() < deadline:
            time.sleep(0.1)
            if proc.poll() is not None:
                raise SystemExit(f"fleetrun work exited {proc.returncode}: {proc.stderr.read().decode()}")  # type: ignore[union-attr]
            try:
                beats.add(float(json.loads(live.read_text())["beat"]))
            except (OSError, ValueError, KeyError, TypeError):
                continue
        settled = time.perf_counter() - start
        c0 = p.cpu_times()
        t0 = time.perf_counter()
        time.sleep(seconds)
        c1 = p.cpu_times()
        wall = time.perf_counter() - t0
        rss = p.memory_info().rss / 2**20
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        if proc.stderr:
            proc.stderr.close()
    return settled, 100.0 * ((c1.user - c0.user) + (c1.system - c0.system)) / wall, rss


def measure(root: Path, n: int, scenario: str, dag: bool, args: argparse.Namespace, turn: int = 0) -> dict[str, float]:
    env = make_root(root, n, scenario, dag)
    py = sys.executable
    got: dict[str, float] = {}
    bw, bc, bm = run([py, "-c", BASELINE_INSERT, str(root / "tasks.toml"), str(root / "baseline.db")], env, root)
    got.update({"insert wall": bw, "insert cpu": bc, "insert MiB": bm})
    # (suffix, env) of each fleetrun measured: this checkout's, and --against's in a home
    # of its own; which goes first alternates with the round
    ways = [("", env)]
    if args.against:
        home = root / "home-against"
        make_home(home, scenario)
        path = os.pathsep.join(filter(None, [args.against, env.get("PYTHONPATH")]))
        ways.append((f" [{Path(args.against).name}]", {**env, "FLEETRUN_HOME": str(home), "PYTHONPATH": path}))
        if turn % 2:
            ways.reverse()
    for suffix, e in ways:
        qw, qc, qm = run([py, "-m", "fleetrun", "queue", "tasks.toml"], e, root, ok=(0,))
        got.update({f"queue wall{suffix}": qw, f"queue cpu{suffix}": qc, f"queue MiB{suffix}": qm})
    if not args.no_loop:
        got["1st pass"], got["next pass"] = first_pass(env, root, args.passes)
        got["settled"], got["idle %cpu"], got["idle MiB"] = idle(env, root, args.idle)
    sw, sc, _ = run([py, "-c", "import sqlite3"], env, root)
    got.update({"sqlite3 wall": sw, "sqlite3 cpu": sc})
    for suffix, e in ways:
        for name, extra in (("status", []), ("status --json", ["--json"])):
            w, c, m = run([py, "-m", "fleetrun", "status", *extra], e, root)
            got.update({f"{name} wall{suffix}": w, f"{name} cpu{suffix}": c, f"{name} MiB{suffix}": m})
    return got


ROWS = [
    # (label, figure, baseline figure or None)
    ("queue CPU s", "queue cpu", "insert cpu"),
    ("queue wall s", "queue wall", "insert wall"),
    ("queue peak MiB", "queue MiB", "insert MiB"),
    ("1st pass s", "1st pass", None),
    ("next pass ms", "next pass", None),
    ("idle settled after s", "settled", None),
    ("idle CPU %", "idle %cpu", None),
    ("idle RSS MiB", "idle MiB", None),
    ("status wall s", "status wall", "sqlite3 wall"),
    ("status CPU s", "status cpu", "sqlite3 cpu"),
    ("status --json wall s", "status --json wall", "sqlite3 wall"),
    ("status --json CPU s", "status --json cpu", "sqlite3 cpu"),
    ("status --json MiB", "status --json MiB", None),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--sizes",
        default="1000,10000,100000,dag1000",
        help="task counts; dagN is an N-task DAG with fan-in and fan-out",
    )
    ap.add_argument("--scenario", choices=["wait", "ready"], default="wait")
    ap.add_argument("--repeat", type=int, default=1, help="rounds; medians are printed")
    ap.add_argument("--idle", type=float, default=10.0, help="seconds of idle CPU measured after the first pass")
    ap.add_argument("--passes", type=int, default=5, help="passes after the first (their median is printed)")
    ap.add_argument("--no-loop", action="store_true", help="queue and status only")
    ap.add_argument("--keep", metavar="DIR", help="make the homes under DIR and keep them")
    ap.add_argument(
        "--against",
        metavar="DIR",
        help="also measure queue and status with the fleetrun in DIR (first on PYTHONPATH), taking turns",
    )
    args = ap.parse_args()
    if args.against:
        args.against = str(Path(args.against).resolve())
    sizes = args.sizes.split(",")
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="fleetrun-scale-") as tmp:
        base = Path(args.keep) if args.keep else Path(tmp)
        for size in sizes:
            dag = size.startswith("dag")
            n = int(size[3:] if dag else size)
            rounds: list[dict[str, float]] = []
            for r in range(args.repeat):
                rounds.append(measure(base / f"{size}-{r}", n, args.scenario, dag, args, turn=r))
                print(
                    f"# {size} round {r + 1}: " + ", ".join(f"{k} {v:.3f}" for k, v in rounds[-1].items()),
                    file=sys.stderr,
                    flush=True,
                )
            results[size] = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    print(
        f"scenario {args.scenario}; medians of {args.repeat}; (xB) = ratio to the same run's baseline: "
        "a plain tomllib + SQLite insert for queue, python -c 'import sqlite3' for status"
    )
    width = 22
    rows = ROWS
    if args.against:  # each queue and status figure again, of --against's fleetrun, below its own
        mark = f" [{Path(args.against).name}]"
        rows = []
        for label, key, bkey in ROWS:
            rows.append((label, key, bkey))
            if key.startswith(("queue ", "status")):
                rows.append((label + mark, key + mark, bkey))
    label_width = max(22, *(len(r[0]) + 1 for r in rows))
    print(f"{'figure':<{label_width}}" + "".join(f"{s:>{width}}" for s in sizes))
    for label, key, bkey in rows:
        cells = []
        for s in sizes:
            v = results[s].get(key)
            if v is None:
                cells.append(f"{'-':>{width}}")
                continue
            shown = v * 1000 if label.endswith(" ms") else v
            ratio = f" ({v / results[s][bkey]:.1f}xB)" if bkey and results[s].get(bkey) else ""
            cells.append(f"{f'{shown:.2f}{ratio}':>{width}}")
        print(f"{label:<{label_width}}" + "".join(cells))
    plain = [s for s in sizes if not s.startswith("dag")]
    if len(plain) > 1:
        print("\ngrowth from one size to the next (tasks x10 -> 10 is linear)")
        for label, key, _b in rows:
            steps = []
            for a, b in zip(plain, plain[1:]):
                va, vb = results[a].get(key), results[b].get(key)
                steps.append(f"{a}->{b} x{vb / va:.1f}" if va and vb else f"{a}->{b} -")
            print(f"  {label:<{label_width}} " + "   ".join(steps))


if __name__ == "__main__":
    main()

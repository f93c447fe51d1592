"""What running on Slurm costs: fleetrun-slurm's submit -> RUNNING and end -> DONE
against ``sbatch`` alone, measured in the same run on the same test cluster.

Starts a real cluster from nothing (``plugins/fleetrun-slurm/tests/slurmcluster.py``:
munged, slurmctld, three slurmd in UTS namespaces on loopback; needs root and Debian's
``slurm-wlm`` and ``munge``), then, ``--repeat`` times:

- **sbatch alone**: ``--tasks`` jobs whose script writes the time it starts and the
  time it ends. *submit -> running*: from just before ``sbatch`` to the script's first
  line; *end -> gone*: from the script's last line to the job leaving ``squeue``
  (polled every 20 ms): when Slurm itself knows it ended.
- **fleetrun**: ``python -m fleetrun tasks.toml -p fleetrun_slurm`` with ``--tasks``
  trivial tasks (a command agent that writes a file; ``run = "true"``), this machine
  given no slots so that every task is a job. *submit -> running*: from just before
  ``sbatch`` (``slurm_job.json``'s ``submitted``) to the agent's start in its job (the
  shepherd's ``agent_started``); *end -> DONE*: from the shepherd's ``ended`` to the
  task's DONE in the ledger (the end noticed by the next ``squeue`` pass or the
  shepherd's wake-up, the work collected, the verifier run as a job of its own, the
  handoff), and of that the verifier job's *submit -> running* (from its ``sbatch`` to
  its script's start) and *end -> DONE* (from its script's end); *end ->
  VERIFYING*: the same to the RUNNING -> VERIFYING transition (how soon the end is
  known).

Run::

    python bench/slurm.py                  # 5 tasks, 4 rounds
    python bench/slurm.py --tasks 10 --repeat 3

The two sides take turns going first. Medians (and the spread) in milliseconds. Quote differences, not bare times.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PLUGIN = ROOT / "plugins" / "fleetrun-slurm"
sys.path.insert(0, str(PLUGIN / "tests"))

from slurmcluster import TOOLS, Cluster  # noqa: E402


def sbatch_alone(c: Cluster, work: Path, n: int) -> tuple[list[float], list[float]]:
    work.mkdir(parents=True)
    t0: dict[int, float] = {}
    outs: dict[int, Path] = {}
    for i in range(n):
        out = work / f"job{i}.times"
        script = f"date +%s.%N > {out}; date +%s.%N >> {out}"
        t = time.time()
        r = c.client(
            ["sbatch", "--parsable", "--mem=100M", "--no-requeue", f"--output={work}/job{i}.out", "--wrap", script]
        )
        assert r.returncode == 0, r.stderr
        job = int(r.stdout.strip().split(";")[0])
        t0[job], outs[job] = t, out
    gone: dict[int, float] = {}
    deadline = time.monotonic() + 300
    while len(gone) < n and time.monotonic() < deadline:
        q = c.client(["squeue", "-h", "-o", "%i"]).stdout.split()
        now = time.time()
        for job in t0:
            if job not in gone and str(job) not in q and outs[job].exists() and len(outs[job].read_text().split()) == 2:
                gone[job] = now
        time.sleep(0.02)
    starts, ends = [], []
    for job, out in outs.items():
        began, ended = (float(x) for x in out.read_text().split())
        starts.append(began - t0[job])
        ends.append(gone[job] - ended)
    return starts, ends


def with_fleetrun(
    c: Cluster, work: Path, n: int
) -> tuple[list[float], list[float], list[float], float, list[float], list[float]]:
    home, repo, shared = work / "home", work / "repo", work / "shared"
    for d in (home, repo, shared):
        d.mkdir(parents=True)
    env = dict(
        os.environ,
        FLEETRUN_HOME=str(home),
        SLURM_CONF=str(c.conf),
        FLEETRUN_DISABLE_PLUGIN_AUTOLOAD="1",
        PYTHONPATH=os.pathsep.join([str(PLUGIN), str(ROOT)]),
        GIT_AUTHOR_NAME="b",
        GIT_AUTHOR_EMAIL="b@b",
        GIT_COMMITTER_NAME="b",
        GIT_COMMITTER_EMAIL="b@b",
    )
    for args in (["init", "-q", "-b", "main"], ["commit", "-q", "--allow-empty", "-m", "init"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True, env=env)
    (home / "config.toml").write_text(f'[slurm]\nshared_dir = "{shared}"\nmem_mb = 100\n')
    (home / "policy.toml").write_text("[local]\nmax_tasks = 0\n")
    agent = f"{sys.executable} -c \"open('out.txt', 'w').write('x')\""
    tasks = "".join(
        f'[[task]]\nname = "t{i}"\ncwd = "{repo}"\nprompt = "p"\ngit_ref = "main"\nagent = "w"\n'
        f'  [[task.verify]]\n  run = "true"\n'
        for i in range(n)
    )
    (work / "tasks.toml").write_text(f'[agents.w]\ncommand = ["/bin/sh", "-c", {json.dumps(agent)}]\n' + tasks)
    t = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "fleetrun", str(work / "tasks.toml"), "-p", "fleetrun_slurm"],
        capture_output=True,
        text=True,
        env=env,
        cwd=work,
        timeout=600,
    )
    wall = time.monotonic() - t
    assert r.returncode == 0, r.stdout + r.stderr
    conn = sqlite3.connect(f"file:{home / 'state.db'}?mode=ro", uri=True)
    try:
        atts = conn.execute("SELECT id, task_id FROM attempts").fetchall()
        trans = conn.execute("SELECT task_id, to_state, time FROM transitions ORDER BY id").fetchall()
    finally:
        conn.close()
    starts, done, verifying, vstarts, vdone = [], [], [], [], []
    for aid, tid in atts:
        adir = shared / "attempts" / aid
        st = json.loads((adir / "status.json").read_text())
        job = json.loads((adir / "slurm_job.json").read_text())
        starts.append(st["agent_started"] - job["submitted"])
        at = {to: tm for task, to, tm in trans if task == tid}
        done.append(at["DONE"] - st["ended"])
        verifying.append(at["VERIFYING"] - st["ended"])
        # the run verifier, a job of its own: its submit -> start, and its end -> DONE
        vdir = adir / "verify-1"
        vjob = json.loads((vdir / "slurm_job.json").read_text())
        vstarts.append(float((vdir / "started").read_text()) - vjob["submitted"])
        vdone.append(at["DONE"] - float((vdir / "rc").read_text().split()[1]))
    return starts, done, verifying, wall, vstarts, vdone


def ms(xs: list[float]) -> str:
    xs = sorted(xs)
    return f"{statistics.median(xs) * 1000:7.0f} ms  ({xs[0] * 1000:.0f}-{xs[-1] * 1000:.0f})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=4)
    args = ap.parse_args()
    import shutil

    missing = [t for t in TOOLS if not shutil.which(t) and not os.path.exists(f"/usr/sbin/{t}")]
    if missing or os.geteuid() != 0:
        print(f"skipped: needs root and {', '.join(missing) or 'the Slurm tools'} (apt-get install slurm-wlm munge)")
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-slurm-") as tmp:
        c = Cluster(Path(tmp) / "cluster")
        t = time.monotonic()
        c.start()
        print(f"cluster up (munged, slurmctld, 3 slurmd idle) in {time.monotonic() - t:.2f} s")
        try:
            a_start: list[float] = []
            a_end: list[float] = []
            f_start: list[float] = []
            f_done: list[float] = []
            f_ver: list[float] = []
            v_start: list[float] = []
            v_done: list[float] = []
            walls = []
            for k in range(args.repeat):
                # interleaved, each first in turn: the cluster's own state (its scheduler's
                # last pass) is not charged to one side
                for side in ("alone", "fleet") if k % 2 == 0 else ("fleet", "alone"):
                    if side == "alone":
                        s, e = sbatch_alone(c, Path(tmp) / f"alone{k}", args.tasks)
                        a_start += s
                        a_end += e
                    else:
                        s, d, v, wall, vs, vd = with_fleetrun(c, Path(tmp) / f"fleet{k}", args.tasks)
                        v_start += vs
                        v_done += vd
                        f_start += s
                        f_done += d
                        f_ver += v
                        walls.append(wall)
            print(f"{args.tasks} tasks x {args.repeat} rounds (medians, min-max)")
            print(f"sbatch alone   submit -> running    {ms(a_start)}")
            print(f"fleetrun-slurm submit -> RUNNING    {ms(f_start)}   (agent started in its job)")
            print(f"sbatch alone   end -> gone          {ms(a_end)}   (out of squeue)")
            print(f"fleetrun-slurm end -> VERIFYING     {ms(f_ver)}")
            print(f'fleetrun-slurm end -> DONE          {ms(f_done)}   (collect, run = "true" as a job, handoff)')
            print(f"  verifier job   submit -> running    {ms(v_start)}")
            print(f"  verifier job   end -> DONE          {ms(v_done)}")
            print(f"fleetrun run wall time, {args.tasks} tasks: {statistics.median(walls):.2f} s (median)")
        finally:
            c.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

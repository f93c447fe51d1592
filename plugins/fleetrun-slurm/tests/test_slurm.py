"""fleetrun-slurm on a real Slurm cluster (``conftest.cluster``: munged, slurmctld and
three slurmd on loopback), through the real CLI (``python -m fleetrun`` as a
subprocess, the plugin loaded with ``-p fleetrun_slurm``), the fake ``claude`` as the
agent, real git, real shepherds running as the jobs' main processes."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest

PLUGIN = ("-p", "fleetrun_slurm")
FAIL_UNLESS_FINAL = "test \"$(cat FIX.txt)\" = final || { echo 'FIX.txt must contain exactly the word final'; exit 1; }"


def node_of(fleeter: Any, attempt_id: str) -> str:
    """The node the attempt's job ran on, as its job script said (``slurm.out``)."""
    out = (fleeter.shared / "attempts" / attempt_id / "slurm.out").read_text()
    m = re.search(r"fleetrun-slurm: job \d+ on (\S+)", out)
    assert m, out
    return m.group(1)


def attempts(fleeter: Any, name: str) -> list[Any]:
    return fleeter.ledger().attempts(fleeter.task(name).id)


def wait_for(cond: Callable[[], Any], what: str, timeout: float = 120.0) -> Any:
    """Poll ``cond`` until it holds (the deadline bounds a hang: not a timing)."""
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        assert time.monotonic() < deadline, f"waited {timeout:g} s for {what}"
        time.sleep(0.05)


def gated_task(fleeter: Any, name: str = "t1") -> tuple[Path, Path]:
    """One task whose agent (a command agent: a shell script), in its job, says it
    started (``started``: one line per run), waits for ``gate``, then writes a file;
    :return: (started, gate)."""
    started, gate = fleeter.root / "started", fleeter.root / "gate"
    agent = fleeter.root / "agent.sh"
    agent.write_text(
        f"echo run >> {started}\necho hello from the job\nwhile [ ! -e {gate} ]; do sleep 0.05; done\necho done > out.txt\n"
    )
    fleeter.make_repo()
    fleeter.write_tasks(f'''
        [agents.gated]
        command = ["/bin/sh", "{agent}"]

        [[task]]
        name = "{name}"
        cwd = "repo"
        prompt = "Wait for the gate."
        git_ref = "main"
        agent = "gated"
          [[task.verify]]
          run = "test -f out.txt"
    ''')
    return started, gate


def queue(fleeter: Any) -> str:
    return str(fleeter.cluster.client(["squeue", "-h", "-o", "%i %j %T"]).stdout)


def job_runs(fleeter: Any, attempt_id: str) -> int:
    """How many times the attempt's job script ran (each says so in ``slurm.out``)."""
    out = fleeter.shared / "attempts" / attempt_id / "slurm.out"
    return out.read_text().count("fleetrun-slurm: job ") if out.exists() else 0


class Run:
    """``fleetrun ARGS -p fleetrun_slurm`` as a subprocess, its output read as it comes
    (``text``), on a thread of its own."""

    def __init__(self, fleeter: Any, *args: str, env: dict[str, str] | None = None) -> None:
        self.proc = fleeter.popen(*args, *PLUGIN, env={"PYTHONUNBUFFERED": "1", **(env or {})})
        self.chunks: list[bytes] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.chunks.append(line)

    @property
    def text(self) -> str:
        return b"".join(self.chunks).decode(errors="replace")

    def finish(self, timeout: float = 120.0) -> tuple[int, str]:
        code = self.proc.wait(timeout=timeout)
        self.reader.join(timeout)
        err = self.proc.stderr.read() if self.proc.stderr is not None else b""
        return code, self.text + err.decode(errors="replace")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.reader.join(120)
        for f in (self.proc.stdout, self.proc.stderr):
            if f is not None:
                f.close()


def test_a_queue_is_spread_over_the_nodes_by_features_and_memory(slurm_fleeter: Any, fake_claude: Any) -> None:
    """Slurm places each job: ``requires = ["gpu"]`` on the GPU node (a GRES), a task
    asking 3000 MB on the only node that has it, a ``big`` feature by ``--constraint``;
    a retry gets its failure in the prompt and runs as a job too."""
    f = slurm_fleeter
    f.make_repo()
    f.write_tasks(f"""
        [[task]]
        name = "train"
        cwd = "repo"
        prompt = "Train it."
        git_ref = "main"
        requires = ["gpu"]

        [[task]]
        name = "bigmem"
        cwd = "repo"
        prompt = "Use memory."
        git_ref = "main"
        slurm_mem_mb = 3000

        [[task]]
        name = "fix-it"
        cwd = "repo"
        prompt = "Write FIX.txt."
        git_ref = "main"
        requires = ["big"]
          [[task.verify]]
          run = {json.dumps(FAIL_UNLESS_FINAL)}
    """)
    fake_claude.script(
        **{
            "train": [{"actions": [["write", "model.txt", "w"], ["commit", "train"]]}],
            "bigmem": [{"actions": [["write", "mem.txt", "m"], ["commit", "mem"]]}],
            "fix-it": [
                {"actions": [["write", "FIX.txt", "draft"], ["commit", "draft"]]},
                {"actions": [["write", "FIX.txt", "final"], ["commit", "final"]]},
            ],
        }
    )
    r = f.runsub("tasks.toml", *PLUGIN)
    assert r.ret == 0, r.stdout + r.stderr
    assert f.states() == {"train": "DONE", "bigmem": "DONE", "fix-it": "DONE"}, r.stdout
    r.fnmatch_lines(["*train RUNNING (attempt 1) on slurm*", "*fix-it RETRYING*verify_fail:*"])
    (train,) = attempts(f, "train")
    (bigmem,) = attempts(f, "bigmem")
    first, second = attempts(f, "fix-it")
    assert {a.host for a in (train, bigmem, first, second)} == {"slurm"}
    assert node_of(f, train.id) == "n3"
    assert node_of(f, bigmem.id) == "n2"
    assert node_of(f, first.id) == node_of(f, second.id) == "n2"
    one, two = fake_claude.calls("fix-it")
    assert "FIX.txt must contain exactly the word final" in two["prompt"]
    assert one["cwd"] == two["cwd"]
    # the agent ran inside its job (the shepherd is the job's main process)
    assert all(Path(f.shared / "attempts" / a.id / "status.json").exists() for a in (train, bigmem, first, second))


def test_the_worked_example_runs_on_the_cluster_with_the_installed_plugin(slurm_fleeter: Any) -> None:
    """``pip install ./plugins/fleetrun-slurm`` plus a ``[slurm]`` table: the seed's
    worked example (``examples/demo``) runs on the cluster, every task placed by Slurm,
    ``fix-it`` retried with its failure, ``user-api`` on ``user-schema``'s merge. The
    installed distribution is loaded through its entry point, as a user's run loads it."""
    import importlib.metadata

    if not any(ep.name == "slurm" for ep in importlib.metadata.entry_points(group="fleetrun")):
        why = "fleetrun-slurm is not installed (pip install ./plugins/fleetrun-slurm; .ci/run does)"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    f = slurm_fleeter
    f.enable_plugin_autoload()
    demo = Path(__file__).resolve().parents[3] / "examples" / "demo"
    for name in ("tasks.toml", "agent.py", "fleetconf.py"):
        (f.path / name).write_text((demo / name).read_text())
    r = f.runsub("tasks.toml", env={"PYTHONPATH": ""})  # the installed copy, not this checkout's
    assert r.ret == 0, r.stdout + r.stderr
    assert set(f.states().values()) == {"DONE"}, r.stdout
    hosts = {a.host for name in f.states() for a in attempts(f, name)}
    assert hosts == {"slurm"}, r.stdout
    assert len(attempts(f, "fix-it")) == 2
    r.fnmatch_lines(["*fix-it RETRYING*", "*fix-it DONE (attempt 2)*"])
    # every attempt and every run verifier ran as a job on a node Slurm chose
    for name in f.states():
        for a in attempts(f, name):
            assert node_of(f, a.id) in ("n1", "n2", "n3")
            said = (f.shared / "attempts" / a.id / "verify-1" / "slurm.out").read_text()
            assert re.search(r"fleetrun-slurm: verifier job \d+ on n[123]", said), said


def test_a_dependency_merged_with_base_dependencies_runs_on_the_cluster(slurm_fleeter: Any, fake_claude: Any) -> None:
    """``base = "dependencies"`` keeps a task off SSH peers (the branches it merges are
    here), not off a host whose worktrees are folders here: on the cluster's shared
    filesystem the dependent's worktree has its dependency merged, and its job runs."""
    f = slurm_fleeter
    repo = f.make_repo()
    f.write_tasks("""
        [[task]]
        name = "schema"
        cwd = "repo"
        prompt = "Add the schema."
        git_ref = "main"

        [[task]]
        name = "api"
        cwd = "repo"
        prompt = "Add the API on the schema."
        git_ref = "main"
        depends_on = ["schema"]
        base = "dependencies"
          [[task.verify]]
          run = "test -f schema.sql && test -f api.py"
    """)
    fake_claude.script(
        **{
            "schema": [{"actions": [["write", "schema.sql", "CREATE TABLE users;"], ["commit", "schema"]]}],
            "api": [{"actions": [["write", "api.py", "users"], ["commit", "api"]]}],
        }
    )
    r = f.runsub("tasks.toml", *PLUGIN)
    assert r.ret == 0, r.stdout + r.stderr
    assert f.states() == {"schema": "DONE", "api": "DONE"}, r.stdout
    (schema,), (api,) = attempts(f, "schema"), attempts(f, "api")
    assert schema.host == api.host == "slurm"
    assert node_of(f, api.id) in ("n1", "n2", "n3")
    api_task = f.task("api")
    merged = f.git(repo, "log", "--merges", "--format=%s", api_task.branch).strip()
    assert merged.startswith("fleetrun: merge schema"), merged


def test_a_supervisor_killed_mid_run_adopts_the_job_and_never_starts_it_twice(
    slurm_fleeter: Any, fake_claude: Any
) -> None:
    f = slurm_fleeter
    started, gate = gated_task(f)
    r = f.runsub("tasks.toml", *PLUGIN, env={"FLEETRUN_CRASH_AT": "after_transition:RUNNING"})
    assert r.ret == 86, r.stdout + r.stderr  # the supervisor died with its attempt running
    wait_for(started.exists, "the agent to start in its job")
    (att,) = attempts(f, "t1")
    assert "fleetrun-" + att.id in queue(f)
    again = Run(f, "work", "--until-idle")
    try:
        wait_for(lambda: "adopted 1 running attempt(s)" in again.text, "the new supervisor to adopt the job")
        gate.touch()
        code, out = again.finish()
    finally:
        gate.touch()
        again.kill()
    assert code == 0, out
    assert f.states() == {"t1": "DONE"}, out
    (att,) = attempts(f, "t1")
    assert att.host == "slurm" and att.shepherd_token == f"slurm:{att.shepherd_pid}"
    assert started.read_text() == "run\n"
    assert job_runs(f, att.id) == 1


def test_cancel_ends_the_job(slurm_fleeter: Any, fake_claude: Any) -> None:
    f = slurm_fleeter
    started, gate = gated_task(f)
    run = Run(f, "tasks.toml")
    try:
        wait_for(started.exists, "the agent to start in its job")
        (att,) = attempts(f, "t1")
        assert "fleetrun-" + att.id in queue(f)
        # its log is followed from the attempt folder while the job runs
        follow = Run(f, "logs", "t1", "-f", "--raw")
        try:
            wait_for(lambda: "hello from the job" in follow.text, "logs -f to show the job's output")
        finally:
            follow.kill()
        c = f.runsub("cancel", "t1", *PLUGIN)
        assert c.ret == 0, c.stdout + c.stderr
        wait_for(lambda: "fleetrun-" not in queue(f), "the job to leave the queue")
        code, out = run.finish()
    finally:
        gate.touch()
        run.kill()
    assert f.states() == {"t1": "CANCELLED"}, out
    st = json.loads((f.shared / "attempts" / att.id / "status.json").read_text())
    assert st["state"] == "ended" and st["reason"] in ("cancelled", "stopped"), st
    assert started.read_text() == "run\n"


def test_an_impossible_request_is_refused_with_slurms_reason(slurm_fleeter: Any, fake_claude: Any) -> None:
    """More memory than any node has: sbatch refuses it at submit, and that is a
    StartRefused with Slurm's words (the backoff applies; no agent runs)."""
    f = slurm_fleeter
    f.make_repo()
    f.write_tasks("""
        [[task]]
        name = "huge"
        cwd = "repo"
        prompt = "Use all the memory."
        git_ref = "main"
        slurm_mem_mb = 999999
    """)
    run = Run(f, "tasks.toml")
    try:
        reason = wait_for(
            lambda: "peer_refused" in (r := f.states() and f.task("huge").reason or "") and r, "the refusal"
        )
    finally:
        run.kill()
    assert "sbatch: " in reason and "Memory specification can not be satisfied" in reason, reason
    assert fake_claude.calls("huge") == [] and "fleetrun-" not in queue(f)


def test_a_controller_restart_mid_run_keeps_following_the_job(slurm_fleeter: Any, fake_claude: Any) -> None:
    """slurmctld stopped while the job runs: the attempt is unreachable, not dead; the
    controller back, the job is still followed to its end, its agent run once."""
    f = slurm_fleeter
    started, gate = gated_task(f)
    run = Run(f, "tasks.toml")
    try:
        wait_for(started.exists, "the agent to start in its job")
        f.cluster.kill("slurmctld", signal.SIGTERM)
        (att,) = attempts(f, "t1")
        assert f.cluster.client(["squeue", "-h"]).returncode != 0  # the loop's squeue fails as well
        f.cluster.start_ctld()
        gate.touch()
        code, out = run.finish()
    finally:
        gate.touch()
        run.kill()
    assert code == 0, out
    assert f.states() == {"t1": "DONE"}, out
    assert started.read_text() == "run\n" and job_runs(f, att.id) == 1


KILL_CTLD = """
import os
import signal

import fleetrun


@fleetrun.hookimpl
def fleetrun_attempt_started(task, attempt, host, config):
    # the controller SIGKILLed right after the submit was recorded, the first time only
    pid = int(os.environ["SLURMCTLD_PID"])
    mark = os.environ["KILLED_MARK"]
    if not os.path.exists(mark):
        open(mark, "w").close()
        os.kill(pid, signal.SIGKILL)
"""


@pytest.mark.slow  # ~20 s: sbatch --wait polls the controller every few seconds
def test_a_controller_killed_right_after_a_submit_never_runs_an_attempt_twice(slurm_fleeter: Any) -> None:
    """Measured with Slurm 22.05: a controller killed hard within seconds of a start
    lost the job or ran its script a second time, even with ``--no-requeue``. Either
    way no attempt's agent runs twice: a second run of the script finds the first's
    status and starts nothing (the shepherd's refusal), a lost job is a died session
    resumed as a new attempt."""
    f = slurm_fleeter
    started, gate = gated_task(f)
    gate.touch()  # the agent ends at once: the restart may run the script again
    f.write_fleetconf(KILL_CTLD)
    ctld = f.cluster.procs["slurmctld"]
    mark = f.root / "killed"
    run = Run(f, "tasks.toml", env={"SLURMCTLD_PID": str(ctld.pid), "KILLED_MARK": str(mark)})
    try:
        ctld.wait(timeout=120)  # killed by the hook
        f.cluster.procs.pop("slurmctld")
        f.cluster.start_ctld()
        code, out = run.finish()
    finally:
        run.kill()
    assert mark.exists()
    assert code == 0, out
    assert f.states() == {"t1": "DONE"}, out
    # a job the controller lost never ran (no status): its attempt died and the next one ran
    ran = [
        a
        for a in attempts(f, "t1")
        if (st := f.shared / "attempts" / a.id / "status.json").exists()
        and "agent_started" in json.loads(st.read_text())
    ]
    assert started.read_text().count("run") == len(ran) >= 1, out
    # and a second run of a job script, as the controller's restart may make, starts nothing
    adir = f.shared / "attempts" / ran[0].id
    before = (adir / "status.json").read_bytes()
    again = f.cluster.client(
        ["sbatch", "--wait", f"--output={adir / 'again.out'}", f"--chdir={adir}", "--mem=100M", str(adir / "job.sh")]
    )
    assert again.returncode == 0, again.stderr
    assert "it is not started twice" in (adir / "again.out").read_text()
    assert (adir / "status.json").read_bytes() == before
    assert started.read_text().count("run") == len(ran)


def test_a_task_whose_repository_the_nodes_cannot_see_stays_off_the_cluster(slurm_fleeter: Any) -> None:
    """A repository on another filesystem than ``shared_dir`` (here /dev/shm, a tmpfs):
    pinned to the cluster, ``validate`` refuses it; unpinned, placement keeps it off."""
    f = slurm_fleeter
    if os.stat("/dev/shm").st_dev == os.stat(f.shared).st_dev:
        pytest.skip("/dev/shm is on the shared folder's filesystem here")
    import shutil
    import tempfile

    elsewhere = Path(tempfile.mkdtemp(dir="/dev/shm", prefix="fleetrun-slurm-"))
    try:
        f.make_repo()
        shutil.move(str(f.path / "repo"), str(elsewhere / "repo"))
        f.write_tasks(f'''
            [[task]]
            name = "pinned"
            cwd = "{elsewhere / "repo"}"
            prompt = "p"
            git_ref = "main"
            peer = "slurm"
        ''')
        r = f.runsub("validate", "tasks.toml", *PLUGIN)
        assert r.ret == 4, r.stdout + r.stderr
        assert "pinned to slurm, but its repository" in r.stderr and "the nodes would not see it" in r.stderr
        f.write_tasks(f'''
            [[task]]
            name = "free"
            cwd = "{elsewhere / "repo"}"
            prompt = "p"
            git_ref = "main"
        ''')
        run = Run(f, "tasks.toml")
        try:
            wait_for(lambda: "the nodes would not see it" in f.runsub("status", *PLUGIN).stdout, "the reason")
        finally:
            run.kill()
        assert "fleetrun-" not in queue(f)
    finally:
        shutil.rmtree(elsewhere)


def test_per_node_each_node_is_a_host_pinned_with_nodelist(slurm_fleeter: Any, fake_claude: Any) -> None:
    """``per_node = true``: each node is a host (``slurm-n1``...), so ``peer =`` picks
    a node and the job runs there."""
    f = slurm_fleeter
    with open(f.home / "config.toml", "a", encoding="utf-8") as cfg:
        cfg.write("per_node = true\n")
    f.make_repo()
    f.write_tasks("""
        [[task]]
        name = "on-n1"
        cwd = "repo"
        prompt = "p"
        git_ref = "main"
        peer = "slurm-n1"
    """)
    fake_claude.script(**{"on-n1": [{"actions": [["write", "a.txt", "a"], ["commit", "a"]]}]})
    r = f.runsub("tasks.toml", *PLUGIN)
    assert r.ret == 0, r.stdout + r.stderr
    (att,) = attempts(f, "on-n1")
    assert att.host == "slurm-n1" and node_of(f, att.id) == "n1"


def test_one_squeue_per_loop_pass(slurm_fleeter: Any, fake_claude: Any) -> None:
    """Status in one call per pass: every running attempt's status and the cluster's
    candidate share one ``squeue`` answer until the pass ends (and a submit, which
    changes the queue)."""
    import fleetrun_slurm

    import fleetrun

    seen: list[dict[str, int]] = []

    class Count:
        @fleetrun.hookimpl(tryfirst=True)
        def fleetrun_loop_pass(self, config: Any, duration_s: float) -> None:
            seen.append(dict(config.stash[fleetrun_slurm.SLURM].calls))

    f = slurm_fleeter
    f.make_repo()
    f.write_tasks(
        "".join(
            f"""
        [[task]]
        name = "t{i}"
        cwd = "repo"
        prompt = "p"
        git_ref = "main"
    """
            for i in range(3)
        )
    )
    fake_claude.script(default=[{"actions": [["sleep", "1"], ["write", "a.txt", "a"], ["commit", "a"]]}])
    r = f.run("tasks.toml", plugins=[fleetrun_slurm, Count()])
    assert r.ret == 0, r.stdout + r.stderr
    assert seen[-1]["sbatch"] == 3
    # per pass: one squeue, and one more after each submit (the queue changed)
    for before, after in zip([{"squeue": 0, "sbatch": 0}, *seen], seen):
        asked, submitted = after["squeue"] - before["squeue"], after["sbatch"] - before["sbatch"]
        assert asked <= 1 + submitted, seen

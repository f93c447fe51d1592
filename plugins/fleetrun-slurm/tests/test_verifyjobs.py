"""``run`` verifiers of a task placed on the cluster run there, as jobs
(:mod:`fleetrun_slurm.verifyjob`), through the real CLI on the real test cluster: a
failure on the job's node goes back with its output, cancel ends the job, a
supervisor SIGKILLed mid-verifier is followed by one that adopts the job."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

from fleetrun_slurm.host import SlurmHost
from test_slurm import PLUGIN, Run, attempts, queue, wait_for

ON_NODE = 'echo "verified on $SLURMD_NODENAME in job $SLURM_JOB_ID"'


def verifier_node(fleeter: Any, attempt_id: str, step: str = "verify-1") -> str:
    """The node the step's job ran on, as its job script said."""
    out = (fleeter.shared / "attempts" / attempt_id / step / "slurm.out").read_text()
    m = re.search(r"fleetrun-slurm: verifier job \d+ on (\S+)", out)
    assert m, out
    return m.group(1)


def test_a_run_verifier_runs_as_a_job_on_the_tasks_node_and_its_failure_goes_back(
    slurm_fleeter: Any, fake_claude: Any
) -> None:
    """``per_node``: the task pinned to n2, its verifier a job on n2 too; the first
    attempt's failure, said on n2, is in the retry's prompt."""
    f = slurm_fleeter
    with open(f.home / "config.toml", "a", encoding="utf-8") as cfg:
        cfg.write("per_node = true\n")
    f.make_repo()
    check = f'{ON_NODE}; test "$(cat FIX.txt)" = final || {{ echo "FIX.txt must say final"; exit 1; }}'
    f.write_tasks(f"""
        [[task]]
        name = "fix-it"
        cwd = "repo"
        prompt = "Write FIX.txt."
        git_ref = "main"
        peer = "slurm-n2"
          [[task.verify]]
          run = {json.dumps(check)}
    """)
    fake_claude.script(
        **{
            "fix-it": [
                {"actions": [["write", "FIX.txt", "draft"], ["commit", "draft"]]},
                {"actions": [["write", "FIX.txt", "final"], ["commit", "final"]]},
            ]
        }
    )
    r = f.runsub("tasks.toml", *PLUGIN)
    assert r.ret == 0, r.stdout + r.stderr
    assert f.states() == {"fix-it": "DONE"}, r.stdout
    r.fnmatch_lines(["*fix-it RETRYING*verify_fail:*"])
    first, second = attempts(f, "fix-it")
    assert verifier_node(f, first.id) == verifier_node(f, second.id) == "n2"
    failed, passed = (f.ledger().verdicts(attempt_id=a.id)[0] for a in (first, second))
    assert not failed.passed and failed.reason == "exit code 1" and failed.host == "slurm-n2"
    assert re.search(r"verified on n2 in job \d+", failed.output) and "FIX.txt must say final" in failed.output
    assert passed.passed and "verified on n2" in passed.output
    _, again = fake_claude.calls("fix-it")
    assert "verified on n2 in job" in again["prompt"] and "FIX.txt must say final" in again["prompt"]


def gated_verifier(fleeter: Any, fake_claude: Any) -> tuple[Path, Path]:
    """One task whose agent commits a file and whose verifier, in its job, says it
    started (``vstarted``: one line per run), then waits for ``vgate``."""
    started, gate = fleeter.root / "vstarted", fleeter.root / "vgate"
    fleeter.make_repo()
    check = f"{ON_NODE}; echo run >> {started}; while [ ! -e {gate} ]; do sleep 0.05; done; test -f a.txt"
    fleeter.write_tasks(f"""
        [[task]]
        name = "t1"
        cwd = "repo"
        prompt = "Write a.txt."
        git_ref = "main"
          [[task.verify]]
          run = {json.dumps(check)}
    """)
    fake_claude.script(t1=[{"actions": [["write", "a.txt", "a"], ["commit", "a"]]}])
    return started, gate


def test_cancel_during_a_verifier_job_removes_the_job(slurm_fleeter: Any, fake_claude: Any) -> None:
    f = slurm_fleeter
    started, gate = gated_verifier(f, fake_claude)
    run = Run(f, "tasks.toml")
    try:
        wait_for(started.exists, "the verifier to start in its job")
        (att,) = attempts(f, "t1")
        assert f"fleetrun-{att.id}-verify-1" in queue(f)
        c = f.runsub("cancel", "t1", *PLUGIN)
        assert c.ret == 0, c.stdout + c.stderr
        wait_for(lambda: "fleetrun-" not in queue(f), "the verifier's job to leave the queue")
        code, out = run.finish()
    finally:
        gate.touch()
        run.kill()
    assert f.states() == {"t1": "CANCELLED"}, out
    assert f.ledger().verdicts(attempt_id=att.id) == []
    assert started.read_text() == "run\n"


OPEN_GATE_AFTER_A_PASS = """
import os

import fleetrun


@fleetrun.hookimpl
def fleetrun_loop_pass(config, duration_s):
    open(os.environ["OPEN_GATE"], "a").close()
"""


def test_a_supervisor_killed_during_a_verifier_job_adopts_it_and_verifies_once(
    slurm_fleeter: Any, fake_claude: Any
) -> None:
    """SIGKILL while the verifier's job runs: the job goes on; the next supervisor
    adopts it (by its recorded id and name), so the command runs once and its verdict is
    recorded once."""
    f = slurm_fleeter
    started, gate = gated_verifier(f, fake_claude)
    run = Run(f, "tasks.toml")
    try:
        wait_for(started.exists, "the verifier to start in its job")
        (att,) = attempts(f, "t1")
        jobs = queue(f)
        assert f"fleetrun-{att.id}-verify-1" in jobs
        run.proc.kill()  # SIGKILL: nothing of the supervisor's runs after this
        run.kill()
        job = json.loads((f.shared / "attempts" / att.id / "verify-1" / "slurm_job.json").read_text())["job_id"]
        assert f"{job} fleetrun-{att.id}-verify-1 RUNNING" in queue(f)  # it outlives the supervisor
        # the gate opens as the new supervisor's first pass ends: after it took the job up
        f.write_fleetconf(OPEN_GATE_AFTER_A_PASS)
        again = Run(f, "work", "--until-idle", env={"OPEN_GATE": str(gate)})
        try:
            code, out = again.finish()
        finally:
            again.kill()
    finally:
        gate.touch()
        run.kill()
    assert code == 0, out
    assert f.states() == {"t1": "DONE"}, out
    assert started.read_text() == "run\n"  # the command ran once
    (verdict,) = f.ledger().verdicts(attempt_id=att.id)
    assert verdict.passed and f"in job {job}" in verdict.output


def test_a_setup_command_runs_as_a_job_too(slurm_fleeter: Any, fake_claude: Any) -> None:
    f = slurm_fleeter
    f.make_repo()
    f.write_tasks(f"""
        [[task]]
        name = "t1"
        cwd = "repo"
        prompt = "p"
        git_ref = "main"
        setup = [{json.dumps('echo "setup on $SLURMD_NODENAME"')}]
    """)
    fake_claude.script(t1=[{"actions": [["write", "a.txt", "a"], ["commit", "a"]]}])
    r = f.runsub("tasks.toml", *PLUGIN)
    assert r.ret == 0, r.stdout + r.stderr
    (att,) = attempts(f, "t1")
    node = verifier_node(f, att.id, "setup-1")
    assert (f.shared / "attempts" / att.id / "setup-1" / "out").read_text() == f"setup on {node}\n"


def test_a_verifier_job_over_its_timeout_is_cancelled_and_fails(slurm_fleeter: Any, fake_claude: Any) -> None:
    """The timeout counts from the job's start; the handle cancels the job, and the
    verdict is a FAIL (``timed out``), as for a local verifier."""
    f = slurm_fleeter
    f.make_repo()
    f.write_tasks("""
        [[task]]
        name = "t1"
        cwd = "repo"
        prompt = "p"
        git_ref = "main"
        max_retries = 0
          [[task.verify]]
          run = "echo waiting; sleep 600"
          timeout_s = 2
    """)
    fake_claude.script(t1=[{"actions": [["write", "a.txt", "a"], ["commit", "a"]]}])
    r = f.runsub("tasks.toml", *PLUGIN)
    assert f.states() == {"t1": "NEEDS_HUMAN"}, r.stdout + r.stderr
    (att,) = attempts(f, "t1")
    (verdict,) = f.ledger().verdicts(attempt_id=att.id)
    assert not verdict.passed and verdict.reason == "timed out after 2s" and "waiting" in verdict.output
    assert verifier_node(f, att.id) in ("n1", "n2", "n3")
    wait_for(lambda: "fleetrun-" not in queue(f), "the verifier's job to leave the queue")


def test_a_verifier_job_cancelled_by_someone_else_could_not_judge_and_runs_again(
    slurm_fleeter: Any, fake_claude: Any
) -> None:
    """A job gone from the queue without a result (``scancel`` by hand, a lost node) is
    no verdict on the work: a transient ERROR, the verifier run again after the backoff."""
    f = slurm_fleeter
    with open(f.home / "config.toml", "a", encoding="utf-8") as cfg:
        cfg.write("\n[fleetrun]\nverifier_error_backoff_s = 0.5\n")
    started, gate = gated_verifier(f, fake_claude)
    run = Run(f, "tasks.toml")
    try:
        wait_for(started.exists, "the verifier to start in its job")
        (att,) = attempts(f, "t1")
        name = f"fleetrun-{att.id}-verify-1"
        assert name in queue(f)
        done = f.cluster.client(["scancel", f"--name={name}"])
        assert done.returncode == 0, done.stderr
        wait_for(lambda: started.read_text() == "run\nrun\n", "the verifier to run again")
        gate.touch()
        code, out = run.finish()
    finally:
        gate.touch()
        run.kill()
    assert code == 0, out
    assert f.states() == {"t1": "DONE"}, out
    (verdict,) = f.ledger().verdicts(attempt_id=att.id)
    assert verdict.passed
    assert "left the queue without a result" in out, out


def test_the_plugin_installed_but_not_configured_runs_no_verifier(fleeter: Any) -> None:
    """Without ``[slurm]`` the plugin implements no ``fleetrun_verify``: the relay starts
    a peer's first ``run`` verifier with its collect only when no third-party plugin
    could answer for it (``Relay.first_run_verifier``)."""
    import fleetrun_slurm

    import fleetrun

    seen: list[list[str]] = []

    class Probe:
        @fleetrun.hookimpl(trylast=True)
        def fleetrun_configure(self, config: Any) -> None:
            seen.append(
                [
                    str(getattr(i.plugin, "__module__", None) or i.plugin.__name__)
                    for i in config.hook.fleetrun_verify.get_hookimpls()
                ]
            )

    fleeter.make_repo()
    fleeter.write_tasks("""
        [[task]]
        name = "t1"
        cwd = "repo"
        prompt = "p"
    """)
    r = fleeter.run("validate", "tasks.toml", plugins=[fleetrun_slurm, Probe()])
    assert r.ret == 0, r.stdout + r.stderr
    assert seen and not any(m.startswith("fleetrun_slurm") for m in seen[-1]), seen
    shared = fleeter.root / "shared"
    shared.mkdir()
    fleeter.home.mkdir(exist_ok=True)
    (fleeter.home / "config.toml").write_text(f'[slurm]\nshared_dir = "{shared}"\n')
    r = fleeter.run("validate", "tasks.toml", plugins=[fleetrun_slurm, Probe()])
    assert r.ret == 0, r.stdout + r.stderr
    assert any(m.startswith("fleetrun_slurm") for m in seen[-1]), seen


def test_a_verifier_job_submitted_but_not_recorded_is_adopted_by_its_name(
    slurm_host: SlurmHost, tmp_path: Path
) -> None:
    """The supervisor killed between ``sbatch`` and the job's record: the next one finds
    the job by its name in the queue and follows it, and submits no second job."""
    from types import SimpleNamespace

    from fleetrun_slurm.verifyjob import VerifyJob, verify_job

    import fleetrun

    gate = tmp_path / "gate"
    step = fleetrun.VerifySpec(kind="run", text=f"while [ ! -e {gate} ]; do sleep 0.05; done; echo checked")
    task = SimpleNamespace(id="task_v1", name="v", spec=SimpleNamespace(verify=[step], extra={}, requires=[]))
    attempt = SimpleNamespace(id="task_v1_0_a1", number=1)
    workspace = fleetrun.Workspace(path=str(tmp_path))
    config = SimpleNamespace(setting=lambda table, key, default=None: default)
    first = verify_job(slurm_host, task, step, workspace, attempt, config)
    assert isinstance(first, VerifyJob)
    vdir = slurm_host.attempt_dir(attempt.id) / "verify-1"
    (vdir / "slurm_job.json").unlink()  # the record a crash cut off
    submitted = slurm_host.slurm.calls["sbatch"]
    slurm_host.slurm.forget()
    again = verify_job(slurm_host, task, step, workspace, attempt, config)
    assert isinstance(again, VerifyJob) and again.job_id == first.job_id
    assert slurm_host.slurm.calls["sbatch"] == submitted
    gate.touch()
    deadline = time.monotonic() + 120
    while (verdict := again.poll()) is None:
        assert time.monotonic() < deadline, "the adopted job never ended"
        time.sleep(0.05)
    assert verdict.passed and verdict.output == "checked\n" and verdict.host == "slurm"
    # its verdict taken, the step runs afresh the next time (a re-verify), never adopted again
    third = verify_job(slurm_host, task, step, workspace, attempt, config)
    assert isinstance(third, VerifyJob) and third.job_id != first.job_id
    third.cancel()


def test_cancel_with_no_supervisor_ends_the_verifiers_job(slurm_fleeter: Any, fake_claude: Any) -> None:
    """The supervisor gone (SIGKILL) while the verifier's job runs: ``fleetrun cancel``
    alone cancels that job too, as it stops a running attempt."""
    f = slurm_fleeter
    started, gate = gated_verifier(f, fake_claude)
    run = Run(f, "tasks.toml")
    try:
        wait_for(started.exists, "the verifier to start in its job")
        (att,) = attempts(f, "t1")
        run.proc.kill()
        run.kill()
        assert f"fleetrun-{att.id}-verify-1" in queue(f)
        c = f.runsub("cancel", "t1", *PLUGIN)
        assert c.ret == 0, c.stdout + c.stderr
        wait_for(lambda: "fleetrun-" not in queue(f), "the verifier's job to leave the queue")
    finally:
        gate.touch()
        run.kill()
    assert f.states() == {"t1": "CANCELLED"}
    assert (f.shared / "attempts" / att.id / "verify-1" / "taken").exists()

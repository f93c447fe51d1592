"""End to end: a task's ``setup`` commands, run in its worktree before the agent's
first attempt, with the real CLI, real git, real shepherds and (once) a real venv."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleetrun.crash import CRASH_EXIT

from .test_adoption import wait_for

FAIL_UNLESS_FINAL = "test \"$(cat FIX.txt)\" = final || { echo 'FIX.txt must say final'; exit 1; }"


def tasks(fleeter, setup: str, verify: str = 'run = "test -f out.txt"', top: str = "", extra: str = "") -> None:
    fleeter.make_repo()
    fleeter.write_tasks(f"""
        {top}
        [[task]]
        name = "t1"
        cwd = "repo"
        prompt = "Write out.txt."
        git_ref = "main"
        {setup}
        {extra}

          [[task.verify]]
          {verify}
    """)


def setup_log(fleeter) -> list[str]:
    p = fleeter.path / "setup.log"
    return p.read_text().splitlines() if p.exists() else []


def log_cmd(fleeter, what: str = "ran") -> str:
    """A setup command that appends ``what PWD TASK ATTEMPT`` to setup.log outside the worktree."""
    return f'echo "{what} $PWD $FLEETRUN_TASK_NAME $FLEETRUN_ATTEMPT" >> {fleeter.path / "setup.log"}'


def test_setup_runs_in_the_worktree_before_the_agent_and_not_again_on_retry(fleeter, fake_claude):
    setup = f"setup = [{json.dumps(log_cmd(fleeter))}, 'echo made > SETUP.txt']"
    tasks(fleeter, setup, verify=f"run = {json.dumps(FAIL_UNLESS_FINAL)}")
    fake_claude.script(
        t1=[
            {"actions": [["write", "FIX.txt", "draft"], ["commit", "draft"]]},
            {"actions": [["write", "FIX.txt", "final"], ["commit", "final"]]},
        ]
    )
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    r.fnmatch_lines(["*t1 RETRYING*verify_fail:*", "*t1 DONE (attempt 2)*"])
    task = fleeter.task("t1")
    first, second = fake_claude.calls("t1")
    # once, in the worktree the agent works in, with the FLEETRUN_* environment
    assert setup_log(fleeter) == [f"ran {first['cwd']} t1 1"]
    assert second["cwd"] == first["cwd"]
    # before the agent: its first commit (git add -A) holds what setup made
    files = fleeter.git(fleeter.path / "repo", "show", "--name-only", "--format=", f"{task.branch}~1").split()
    assert "SETUP.txt" in files
    atts = fleeter.ledger().attempts(task.id)
    assert atts[0].info["setup"] == "passed"
    assert "setup" not in atts[1].info
    out = fleeter.home / "attempts" / atts[0].id / "setup-1.out"
    assert out.exists()
    logs = fleeter.run("logs", "t1")
    logs.fnmatch_lines(["*PASS setup 1 (echo *) attempt 1: exit code 0*"])


def test_failed_setup_is_needs_human_with_its_output_and_no_retry(fleeter, fake_claude):
    tasks(
        fleeter,
        "setup = ['echo installing; echo boom-output >&2; exit 7', 'echo never > NEVER.txt']",
        extra="max_retries = 3",
    )
    fake_claude.script(t1=[{"actions": [["write", "out.txt", "x"]]}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 1, r.stdout + r.stderr
    task = fleeter.task("t1")
    assert task.state.value == "NEEDS_HUMAN"
    # its output's summary line quoted, as a failed verifier's (issue 22)
    assert task.reason == "setup_failed:echo installing; echo boom-output >&2; exit 7: boom-output (exit code 7)"
    assert task.retries == 0
    assert fake_claude.calls("t1") == []  # the agent never started
    r.fnmatch_lines(["*t1 NEEDS_HUMAN*setup_failed:echo installing*exit code 7*"])
    (att,) = fleeter.ledger().attempts(task.id)
    assert att.outcome == "setup_failed" and att.state == "abandoned"
    assert not (Path(task.worktree) / "NEVER.txt").exists()  # the second command never ran
    logs = fleeter.run("logs", "t1")
    logs.fnmatch_lines(
        [
            "*FAIL setup 1 (echo installing*) attempt 1: exit code 7*",
            "*| installing",
            "*| boom-output",
            "*note: setup command 1 failed (exit code 7); its output is in *setup-1.out*",
        ]
    )
    # a retry by the operator runs setup again from the start
    assert fleeter.run("retry", "t1").ret == 0
    r2 = fleeter.run("work", "--until-idle")
    assert fleeter.task("t1").reason.startswith("setup_failed:")
    assert len(fleeter.ledger().attempts(task.id)) == 2, r2.stdout + r2.stderr


def test_setup_timeout_is_needs_human(fleeter, fake_claude):
    tasks(fleeter, "setup = [{run = 'sleep 60', timeout_s = 0.5}]")
    fake_claude.script(t1=[{"actions": [["write", "out.txt", "x"]]}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 1, r.stdout + r.stderr
    assert fleeter.task("t1").reason == "setup_failed:sleep 60: timed out after 0.5s"
    assert fake_claude.calls("t1") == []


def test_file_default_and_task_override(fleeter, fake_claude):
    fleeter.make_repo()
    cmd = json.dumps(log_cmd(fleeter))
    fleeter.write_tasks(f"""
        setup = [{cmd}]

        [[task]]
        name = "a"
        cwd = "repo"
        prompt = "a"
        git_ref = "main"

        [[task]]
        name = "b"
        cwd = "repo"
        prompt = "b"
        git_ref = "main"
        setup = []

        [[task]]
        name = "c"
        cwd = "repo"
        prompt = "c"
        git_ref = "main"
        setup = [{json.dumps(log_cmd(fleeter, "own"))}]
    """)
    fake_claude.script(a=[{"actions": []}], b=[{"actions": []}], c=[{"actions": []}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    got = sorted((line.split()[0], line.split()[2]) for line in setup_log(fleeter))
    assert got == [("own", "c"), ("ran", "a")]


def test_a_resumed_attempt_does_not_set_up_again(fleeter, fake_claude):
    tasks(fleeter, f"setup = [{json.dumps(log_cmd(fleeter))}]")
    fake_claude.script(t1=[{"mode": "die"}, {"actions": [["write", "out.txt", "x"]]}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    r.fnmatch_lines(["*t1 RESUMING*", "*t1 DONE (attempt 2)*"])
    assert len(setup_log(fleeter)) == 1


def test_a_crash_mid_setup_runs_it_again(fleeter, fake_claude):
    pidfile, marker = fleeter.path / "sleeper.pid", fleeter.path / "slept"
    slow = f"echo $$ > {pidfile}; test -f {marker} && exit 0; touch {marker}; exec sleep 60"
    tasks(
        fleeter,
        f"setup = [{json.dumps(log_cmd(fleeter, 'first'))}, {json.dumps(slow)}, "
        f"{json.dumps(log_cmd(fleeter, 'last'))}]",
    )
    fake_claude.script(t1=[{"actions": [["write", "out.txt", "x"]]}])
    r = fleeter.runsub("tasks.toml", env={"FLEETRUN_CRASH_AT": "mid_setup@2"}, timeout=60)
    assert r.ret == CRASH_EXIT, r.stdout + r.stderr
    task = fleeter.task("t1")
    assert task.state.value == "ASSIGNED"
    (att,) = fleeter.ledger().attempts(task.id)
    assert att.state == "leased" and att.info["setup"] == "running"
    # the step starts under its wrapper (fleetrun.capped), which may not have run it yet
    sleeper = int(wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), what="the setup step"))
    r2 = fleeter.runsub("work", "--until-idle", timeout=60)
    assert r2.ret == 0, r2.stdout + r2.stderr
    assert fleeter.task("t1").state.value == "DONE"
    # the whole setup ran again, and the command the crash left running was ended
    assert [line.split()[0] for line in setup_log(fleeter)] == ["first", "first", "last"]
    assert not alive(sleeper)
    first, second = fleeter.ledger().attempts(task.id)
    assert first.state == "abandoned" and second.info["setup"] == "passed"


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


# ---------------------------------------------------------------------------------
# The real case: an editable install of the user's checkout


def make_venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    return path / "bin" / "python"


def pip_install_editable(python: str, project: Path) -> None:
    """``pip install -e`` offline, with the pip and setuptools running these tests."""
    import setuptools

    env = dict(os.environ, PYTHONPATH=str(Path(setuptools.__file__).parent.parent))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            python,
            "install",
            "-q",
            "--no-index",
            "--no-build-isolation",
            "--no-deps",
            "-e",
            str(project),
        ],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
    )


PYPROJECT = """\
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "tinypkg"
version = "0.1"
"""


@pytest.mark.slow
def test_per_worktree_environment_catches_the_regression_an_editable_install_hides(fleeter, fake_claude, tmp_path):
    repo = fleeter.make_repo(
        files={
            "pyproject.toml": PYPROJECT,
            "src/tinypkg/__init__.py": "VALUE = 1\n",
            ".gitignore": ".venv/\n*.egg-info/\n",
        }
    )
    user_python = make_venv(tmp_path / "uservenv")
    pip_install_editable(str(user_python), repo)
    check = "import tinypkg, sys; sys.exit(0 if tinypkg.VALUE == 1 else 'regression: VALUE is %r' % tinypkg.VALUE)"
    regress = [{"actions": [["write", "src/tinypkg/__init__.py", "VALUE = 2\n"], ["commit", "oops"]]}]

    # the trap: the user's venv imports tinypkg from the checkout, so the broken worktree passes
    fleeter.write_tasks(f"""
        [[task]]
        name = "trap"
        cwd = "repo"
        prompt = "p"
        git_ref = "main"
        max_retries = 0
          [[task.verify]]
          run = {json.dumps(f"{user_python} -c {json.dumps(check)}")}
    """)
    fake_claude.script(trap=regress)
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr  # DONE, broken: what the warning is for
    r.fnmatch_lines(
        [
            f"warning: tasks.toml:*: task 'trap': verify: {user_python} imports tinypkg from {repo} "
            "(an editable install of the main checkout), not from the worktree*"
        ]
    )

    # the fix: an environment of the worktree's own, made by setup
    pip = f"{sys.executable} -m pip --python .venv/bin/python install -q --no-index --no-build-isolation --no-deps -e ."
    import setuptools

    fleeter.write_tasks(f'''
        [[task]]
        name = "fixed"
        cwd = "repo"
        prompt = "p"
        git_ref = "main"
        max_retries = 0
        setup = ["{sys.executable} -m venv --without-pip .venv",
                 {json.dumps(f"PYTHONPATH={Path(setuptools.__file__).parent.parent} {pip}")}]
          [[task.verify]]
          run = {json.dumps(f".venv/bin/python -c {json.dumps(check)}")}
    ''')
    fake_claude.script(fixed=regress)
    r = fleeter.run("tasks.toml")
    assert r.ret == 1, r.stdout + r.stderr
    task = fleeter.task("fixed")
    assert task.reason.startswith("retries_exhausted:"), task.reason
    (v,) = fleeter.ledger().verdicts(task.id)
    assert "regression: VALUE is 2" in v.output


# ---------------------------------------------------------------------------------
# On a peer: setup runs there, in the peer's worktree, as its run verifiers do

pytest_plugins = ["sshd"]


@pytest.mark.slow
def test_setup_runs_on_the_peer_that_runs_the_attempt(fleeter, fake_claude, peer_lab):
    east = peer_lab.machine("east")
    east.write("config.toml", (fleeter.home / "config.toml").read_text())
    east.fake_headroom(9000)
    r = fleeter.run("relay", "add", "east", east.address, "--accept-new", "--command", east.command_line())
    assert r.ret == 0, r.stdout + r.stderr
    assert fleeter.run("drain").ret == 0  # this machine takes nothing: the task goes to east
    tasks(
        fleeter,
        f"setup = [{json.dumps(log_cmd(fleeter))}, 'echo made > SETUP.txt']",
        verify='run = "test -f SETUP.txt"',
    )
    fake_claude.script(t1=[{"actions": [["write", "out.txt", "x"]]}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    task = fleeter.task("t1")
    assert task.host == "east"
    (line,) = setup_log(fleeter)
    assert line.split()[1].startswith(str(east.home / "worktrees"))
    (att,) = fleeter.ledger().attempts(task.id)
    assert att.info["setup"] == "passed"
    assert [s["passed"] for s in att.info["setup_steps"]] == [True, True]


def test_a_failed_setup_quotes_its_summary_line_in_the_run_line_summary_and_junit(fleeter, fake_claude):
    """A setup command's own last line (the tool's error) is what the run line, the
    end summary and the JUnit report say, as a failing verifier's is; not only its exit
    code (issue 22)."""
    import xml.etree.ElementTree as ET

    command = "python -c 'import sys; sys.exit(\"no such option: --group\")'"
    tasks(fleeter, f"setup = [{json.dumps(command)}]")
    fake_claude.script(t1=[{"actions": [["write", "out.txt", "x"]]}])
    r = fleeter.run("tasks.toml", "--junitxml", "r.xml")
    assert r.ret == 1, r.stdout + r.stderr
    assert fake_claude.calls("t1") == []
    cause = f"setup_failed:{command}: no such option: --group (exit code 1)"  # the command is its label
    assert fleeter.task("t1").reason == cause
    r.fnmatch_lines(
        [
            f"*t1 NEEDS_HUMAN (attempt 1)  {cause}",
            "=== short task summary info ===",
            f"NEEDS_HUMAN t1: {cause}",
            f"    setup 1 `{command}` (attempt 1): exit code 1 | no such option: --group",
            "    branch * look: fleetrun logs t1",
        ]
    )
    (tc,) = ET.parse(fleeter.path / "r.xml").getroot().iter("testcase")
    failure = tc.find("failure")
    assert failure is not None and failure.get("message") == cause and failure.get("type") == "setup_failed"
    assert (failure.text or "").splitlines() == [
        f"attempt 1: setup `{command}` failed: exit code 1",
        "no such option: --group",
    ]


def test_a_setup_command_prints_that_it_started(fleeter, fake_claude):
    """A setup of minutes (a venv, a pip install) is not silence in the run: each
    command prints that it started, before the agent's RUNNING line (issue 22)."""
    gate = fleeter.path / "setup-may-end"
    # the second command waits until the test has seen the first two lines, so the
    # line is shown while setup runs, not only once it is over
    tasks(fleeter, f"setup = ['echo one', 'while [ ! -e {gate} ]; do sleep 0.05; done']")
    fake_claude.script(t1=[{"actions": [["write", "out.txt", "x"]]}])
    child = fleeter.spawn("tasks.toml", timeout=120)
    child.expect(rb"t1 setup 1 of 2 started: `echo one`")
    child.expect(rb"t1 setup 2 of 2 started: `while \[ ! -e ")
    gate.write_text("")
    child.expect(rb"t1 RUNNING \(attempt 1\)")
    child.expect(rb"=== 1 done in ")
    child.expect(__import__("pexpect").EOF)
    child.close()
    assert child.exitstatus == 0
    quiet = fleeter.run("tasks.toml", "-q", "--new-queue")
    assert "setup 1 of 2 started" not in quiet.stdout


def test_setup_is_a_step_of_its_own_not_a_verifier(fleeter, fake_claude):
    """A plugin that judges ``run`` verifiers its own way (a fleetconf.py) is never handed
    a setup command as if it were a verifier (issue 23: setup steps posed as verifiers
    numbered from 9000); a setup command goes to ``fleetrun_setup_step`` with its number."""
    setup = f"setup = [{json.dumps(log_cmd(fleeter))}, 'echo made > SETUP.txt']"
    tasks(fleeter, setup, verify='run = "test -f out.txt"')
    seen = fleeter.path / "seen.log"
    fleeter.write_fleetconf(f"""
import fleetrun

@fleetrun.hookimpl
def fleetrun_verify(task, verifier, workspace, attempt, host, config):
    with open({str(seen)!r}, "a") as f:
        f.write("verify " + verifier.text + "\\n")
    return fleetrun.Verdict(True, verifier.kind, verifier.label, reason="judged here")

@fleetrun.hookimpl(hookwrapper=True)
def fleetrun_setup_step(task, step, number, workspace, attempt, host, config):
    with open({str(seen)!r}, "a") as f:
        f.write(f"setup {{number}} {{step.text}}\\n")
    yield
""")
    fake_claude.script(t1=[{"actions": [["write", "out.txt", "x"]]}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    assert seen.read_text().splitlines() == [
        f"setup 1 {log_cmd(fleeter)}",
        "setup 2 echo made > SETUP.txt",
        "verify test -f out.txt",
    ]
    assert len(setup_log(fleeter)) == 1  # the built-in ran the commands all the same
    att = fleeter.ledger().latest_attempt(fleeter.task("t1").id)
    assert [s["n"] for s in att.info["setup_steps"]] == [1, 2]

"""Issue 22: a verifier that could not judge is not the agent's failure.

Through the real CLI, with real git, real processes, real SQLite, a real HTTP brain
server on 127.0.0.1 (tests/brainserver.py) and the fake ``claude``; every test counts
the agent sessions from the fake's log: a run whose verifier cannot run costs exactly
one (docs/verifiers.md, "When a verifier cannot judge").
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from brainserver import BrainServer, Status, closed_port

from fleetrun.testing import fake_claude as fake_claude_pkg

pytest_plugins = ["sshd"]

GREET = [{"actions": [["write", "hello.txt", "hello\n"], ["commit", "add hello"]]}]


def task_with(fleeter: Any, verify: str, head: str = "", extra: str = "") -> None:
    fleeter.make_repo()
    fleeter.write_tasks(f"""
        {head}

        [[task]]
        name = "greet"
        cwd = "repo"
        prompt = "Write hello.txt saying hello."
        git_ref = "main"
        {extra}

          [[task.verify]]
          {verify}
    """)


def add_config(fleeter: Any, text: str) -> None:
    cfg = fleeter.home / "config.toml"
    fleeter.write_config(cfg.read_text() + "\n" + text)


def test_a_run_verifier_whose_command_is_not_found_needs_a_human_after_one_session_and_retry_reverifies(
    fleeter: Any, fake_claude: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    task_with(fleeter, 'run = "pytset -q"')
    fake_claude.script(greet=GREET)
    report = fleeter.path / "report.xml"
    r = fleeter.run("tasks.toml", "--junitxml", str(report))
    assert r.ret == 1, r.stdout + r.stderr
    task = fleeter.task("greet")
    assert task.state.value == "NEEDS_HUMAN"
    assert task.reason == "verifier_error:pytset -q: command not found: pytset"
    assert len(fake_claude.calls("greet")) == 1  # one agent session, not one per retry
    r.fnmatch_lines(
        [
            "*greet verify run `pytset -q`: ERROR (command not found: pytset)*",
            "*greet NEEDS_HUMAN (attempt 1)*verifier_error:pytset -q: command not found: pytset",
        ]
    )
    assert fleeter.ledger().verdicts(task_id=task.id) == []  # no verdict on the work
    xml = report.read_text()
    assert '<error message="verifier_error:pytset -q: command not found: pytset" type="verifier_error">' in xml
    assert "<failure" not in xml
    assert "verify run `pytset -q`: ERROR (command not found: pytset)" in xml
    assert Path(task.worktree, "hello.txt").read_text() == "hello\n"  # the work is kept
    events = [json.loads(line) for line in (fleeter.home / "events.ndjson").read_text().splitlines()]
    (verdict,) = [e for e in events if e["type"] == "verdict"]
    assert (verdict["passed"], verdict["error"], verdict["reason"]) == (False, "permanent", "command not found: pytset")

    # the operator installs the command: retry judges the same work, no new session
    bindir = fleeter.path / "tools"
    bindir.mkdir()
    (bindir / "pytset").write_text("#!/bin/sh\ngrep -q hello hello.txt && echo '1 passed in 0.01s'\n")
    (bindir / "pytset").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    r = fleeter.run("retry", "greet")
    assert r.ret == 0, r.stdout + r.stderr
    r.fnmatch_lines(["greet * -> VERIFYING"])
    r = fleeter.run("work", "--until-idle")
    assert r.ret == 0, r.stdout + r.stderr
    task = fleeter.task("greet")
    assert task.state.value == "DONE" and task.reason == "verify_pass"
    assert len(fake_claude.calls("greet")) == 1 and task.attempts == 1
    (v,) = fleeter.ledger().verdicts(task_id=task.id)
    assert (v.passed, v.reason) == (True, "exit code 0")


def test_retry_elsewhere_of_a_verifier_error_starts_the_work_again(fleeter: Any, fake_claude: Any) -> None:
    """--elsewhere forgets the machine and its worktree: that is a new attempt, not a re-verify."""
    task_with(fleeter, 'run = "pytset -q"')
    fake_claude.script(greet=GREET * 2)
    assert fleeter.run("tasks.toml").ret == 1
    r = fleeter.run("retry", "--elsewhere", "greet")
    assert r.ret == 0, r.stdout + r.stderr
    task = fleeter.task("greet")
    assert (task.state.value, task.reason, task.worktree) == ("READY", "operator_retry", None)


def test_retry_of_a_verifier_error_whose_worktree_is_gone_starts_the_work_again(fleeter: Any, fake_claude: Any) -> None:
    task_with(fleeter, 'run = "pytset -q"')
    fake_claude.script(greet=GREET * 2)
    assert fleeter.run("tasks.toml").ret == 1
    task = fleeter.task("greet")
    fleeter.git(fleeter.path / "repo", "worktree", "remove", "--force", task.worktree)
    r = fleeter.run("retry", "greet")
    assert r.ret == 0, r.stdout + r.stderr
    assert fleeter.task("greet").state.value == "READY"  # not VERIFYING a folder that is gone


def test_a_script_of_the_project_that_is_missing_is_the_works_failure(fleeter: Any, fake_claude: Any) -> None:
    """./check.sh is the worktree's own (the agent may have deleted it): its 127 is a FAIL."""
    task_with(fleeter, 'run = "./check.sh"', extra="max_retries = 1")
    fake_claude.script(greet=GREET * 2)
    r = fleeter.run("tasks.toml")
    assert r.ret == 1
    task = fleeter.task("greet")
    assert task.reason.startswith("retries_exhausted:./check.sh")
    assert len(fake_claude.calls("greet")) == 2


def test_a_brain_that_refuses_connections_is_asked_again_then_needs_a_human_after_one_session(
    fleeter: Any, fake_claude: Any
) -> None:
    port = closed_port()
    task_with(
        fleeter, 'brain = "Does hello.txt say hello?"', head=f'[brain]\nurl = "http://127.0.0.1:{port}"\nmodel = "tiny"'
    )
    add_config(fleeter, "[fleetrun]\nverifier_error_tries = 3\nverifier_error_backoff_s = 0.05\n")
    fake_claude.script(greet=GREET)
    r = fleeter.run("tasks.toml")
    assert r.ret == 1, r.stdout + r.stderr
    task = fleeter.task("greet")
    why = f"brain unreachable at http://127.0.0.1:{port}: connection refused"
    assert task.reason == f"verifier_error:Does hello.txt say hello?: {why} (tried 3 times)"
    assert len(fake_claude.calls("greet")) == 1
    r.fnmatch_lines(
        [
            f"waiting: * (greet): verifier Does hello.txt say hello? could not judge: {why}; again in * s (try 2 of 3)",
            "waiting: * (greet): *(try 3 of 3)",
            "*greet NEEDS_HUMAN (attempt 1)*verifier_error:*",
        ]
    )
    transitions = [(t.to_state, t.cause.split(":")[0]) for t in fleeter.ledger().transitions(task.id)]
    assert ("RETRYING", "verify_fail") not in transitions


def test_a_brain_without_a_model_needs_a_human_at_once(fleeter: Any, fake_claude: Any) -> None:
    with BrainServer() as brain:
        task_with(fleeter, 'brain = "Does hello.txt say hello?"', head=f'[brain]\nurl = "{brain.url}"')
        fake_claude.script(greet=GREET)
        r = fleeter.run("tasks.toml")
        assert r.ret == 1, r.stdout + r.stderr
        assert brain.requests == []
    task = fleeter.task("greet")
    assert task.reason.startswith("verifier_error:Does hello.txt say hello?: no model for the brain: ")
    assert len(fake_claude.calls("greet")) == 1


def test_a_brain_that_answers_503_twice_then_passes_is_done_after_one_session(fleeter: Any, fake_claude: Any) -> None:
    with BrainServer() as brain:
        brain.script(Status(503, {"error": "loading model"}), Status(503, {"error": "loading model"}), "PASS")
        task_with(fleeter, 'brain = "Does hello.txt say hello?"', head=f'[brain]\nurl = "{brain.url}"\nmodel = "tiny"')
        add_config(fleeter, "[fleetrun]\nverifier_error_backoff_s = 0.05\n")
        fake_claude.script(greet=GREET)
        r = fleeter.run("tasks.toml")
        assert r.ret == 0, r.stdout + r.stderr
        assert len(brain.requests) == 3
    task = fleeter.task("greet")
    assert task.state.value == "DONE"
    assert len(fake_claude.calls("greet")) == 1 and task.attempts == 1
    r.fnmatch_lines(
        [
            "*verify brain *: ERROR (brain returned HTTP 503: loading model)*",
            "waiting: * (greet): *could not judge: brain returned HTTP 503: loading model; *(try 2 of 5)",
            "*greet DONE (attempt 1)*verify_pass",
        ]
    )


def refusing_claude(fleeter: Any, refuse: bool) -> Path:
    """A ``claude`` whose reviewer sessions get an option this CLI does not know (as an
    older CLI refuses a newer flag); the task agent's sessions are left alone."""
    path = fleeter.path / "claude-refusing"
    extra = '[ -n "$FLEETRUN_VERIFIER" ] && set -- "$@" --no-such-option\n' if refuse else ""
    path.write_text(f'#!/bin/sh\n{extra}exec {sys.executable} {Path(fake_claude_pkg.__file__).parent} "$@"\n')
    path.chmod(0o755)
    return path


def test_a_reviewer_whose_cli_refuses_its_arguments_needs_a_human_at_once_and_retry_reverifies(
    fleeter: Any, fake_claude: Any
) -> None:
    claude = refusing_claude(fleeter, refuse=True)
    fleeter.write_config(f'[claude]\nexecutable = "{claude}"\n')
    task_with(fleeter, 'agent = "Check that hello.txt says hello."')
    fake_claude.script(**{"greet": GREET, "greet:review": [{"result": "PASS"}]})
    r = fleeter.run("tasks.toml")
    assert r.ret == 1, r.stdout + r.stderr
    task = fleeter.task("greet")
    assert task.reason == (
        "verifier_error:Check that hello.txt says hello.: the reviewer's CLI refused its "
        "arguments: error: unknown option '--no-such-option'"
    )
    assert len(fake_claude.calls("greet")) == 1
    assert len(fake_claude.review_calls("greet")) == 1  # permanent: not asked again

    refusing_claude(fleeter, refuse=False)  # the operator fixes the CLI
    assert fleeter.run("retry", "greet").ret == 0
    r = fleeter.run("work", "--until-idle")
    assert r.ret == 0, r.stdout + r.stderr
    task = fleeter.task("greet")
    assert task.state.value == "DONE"
    assert len(fake_claude.calls("greet")) == 1 and task.attempts == 1
    assert len(fake_claude.review_calls("greet")) == 2


def _line_starting(stream: Any, prefix: str) -> str:
    """The first line of a supervisor's output that starts with ``prefix`` (the test's
    timeout bounds a hang)."""
    seen = []
    for raw in stream:
        line = raw.decode(errors="replace")
        seen.append(line)
        if line.startswith(prefix):
            return line
    raise AssertionError(f"no line starts with {prefix!r}: {''.join(seen)}")


def test_a_supervisor_killed_during_the_backoff_resumes_the_wait_not_the_agent(fleeter: Any, fake_claude: Any) -> None:
    clock = fleeter.path / "clock"
    clock.write_text("0")
    env = {"FLEETRUN_TEST_CLOCK": str(clock)}
    with BrainServer() as brain:
        brain.script(Status(503, {"error": "busy"}), "PASS")
        task_with(fleeter, 'brain = "Does hello.txt say hello?"', head=f'[brain]\nurl = "{brain.url}"\nmodel = "tiny"')
        add_config(fleeter, "[fleetrun]\nverifier_error_backoff_s = 1000\n")
        fake_claude.script(greet=GREET)
        first = fleeter.popen("tasks.toml", env=env)
        try:
            assert first.stdout is not None
            line = _line_starting(first.stdout, "waiting:")  # the backoff is recorded first
            assert "(try 2 of 5)" in line, line
        finally:
            first.send_signal(signal.SIGKILL)
            first.communicate()
        assert len(brain.requests) == 1
        last = fleeter.ledger().latest_attempt(fleeter.task("greet").id)
        assert last.info["verify_wait"]["tries"] == 1
        second = fleeter.popen("work", "--until-idle", env=env)
        try:
            assert second.stdout is not None
            line = _line_starting(second.stdout, "waiting:")  # the restart says why the task waits
            assert "could not judge: brain returned HTTP 503: busy; again in" in line, line
            assert "(try 2 of 5)" in line
            assert len(brain.requests) == 1  # the wait goes on: the verifier is not asked at once
            status = fleeter.run("status")
            status.fnmatch_lines(["*greet*VERIFYING*could not judge: brain returned HTTP 503: busy*(try 2 of 5)*"])
            clock.write_text("2000")  # the backoff is over
            out, err = second.communicate(timeout=120)
        finally:
            if second.poll() is None:
                second.kill()
                second.communicate()
        assert second.returncode == 0, out.decode() + err.decode()
        assert len(brain.requests) == 2
    task = fleeter.task("greet")
    assert task.state.value == "DONE"
    assert len(fake_claude.calls("greet")) == 1 and task.attempts == 1


def test_a_peers_run_verifier_whose_command_is_not_found_there_needs_a_human_after_one_session(
    fleeter: Any, fake_claude: Any, peer_lab: Any
) -> None:
    """The peer says its verifier could not run (a real sshd, the real `fleetrun host`)."""
    task_with(fleeter, 'run = "pytset -q"')
    mini = peer_lab.machine("mini")
    mini.write("config.toml", (fleeter.home / "config.toml").read_text())
    r = fleeter.run("relay", "add", "mini", mini.address, "--accept-new", "--command", shlex.join(mini.command()))
    assert r.ret == 0, r.stdout + r.stderr
    assert fleeter.run("drain").ret == 0  # the task runs on the peer
    fake_claude.script(greet=GREET)
    r = fleeter.run("tasks.toml")
    assert r.ret == 1, r.stdout + r.stderr
    task = fleeter.task("greet")
    assert task.host == "mini"
    assert task.reason == "verifier_error:pytset -q: command not found: pytset"
    assert len(fake_claude.calls("greet")) == 1


def test_a_task_cancelled_during_the_backoff_ends_the_run_and_waits_no_more(fleeter: Any, fake_claude: Any) -> None:
    with BrainServer() as brain:
        brain.script(Status(503, {"error": "busy"}))
        task_with(fleeter, 'brain = "Does hello.txt say hello?"', head=f'[brain]\nurl = "{brain.url}"\nmodel = "tiny"')
        add_config(fleeter, "[fleetrun]\nverifier_error_backoff_s = 1000\n")
        fake_claude.script(greet=GREET)
        run = fleeter.popen("tasks.toml")
        try:
            assert run.stdout is not None
            _line_starting(run.stdout, "waiting:")
            assert fleeter.run("cancel", "greet").ret == 0
            out, err = run.communicate(timeout=120)  # the run ends: nothing is left to wait for
        finally:
            if run.poll() is None:
                run.kill()
                run.communicate()
        assert run.returncode == 1, out.decode() + err.decode()
        assert len(brain.requests) == 1
    assert fleeter.task("greet").state.value == "CANCELLED"
    assert "could not judge" not in fleeter.run("status").stdout


def test_a_running_work_picks_up_the_retry_of_a_verifier_error_and_reverifies(
    fleeter: Any, fake_claude: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    bindir = fleeter.path / "tools"
    bindir.mkdir()
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    task_with(fleeter, 'run = "pytset -q"')
    fake_claude.script(greet=GREET)
    assert fleeter.run("tasks.toml").ret == 1
    assert fleeter.task("greet").reason.startswith("verifier_error:")
    work = fleeter.popen("work")  # serves until stopped
    try:
        deadline = time.monotonic() + 120  # bounds a hang only
        while not fleeter.run("status").stdout.startswith("supervisor: running"):
            assert time.monotonic() < deadline and work.poll() is None, "the loop never started"
            time.sleep(0.05)
        (bindir / "pytset").write_text("#!/bin/sh\necho '1 passed in 0.01s'\n")
        (bindir / "pytset").chmod(0o755)
        assert fleeter.run("retry", "greet").ret == 0
        while fleeter.task("greet").state.value != "DONE":
            assert time.monotonic() < deadline and work.poll() is None, fleeter.task("greet").reason
            time.sleep(0.05)
    finally:
        work.send_signal(signal.SIGTERM)
        work.communicate(timeout=120)
    assert work.returncode == 0
    assert len(fake_claude.calls("greet")) == 1 and fleeter.task("greet").attempts == 1

"""End to end: a wait that can clear keeps the run alive, one only an operator can clear
ends it; a usage-limit pause survives a restart; the summary and exit code are about
what this run worked on; transitions made from another shell are printed; Ctrl-C says
what it interrupted. Long waits use the fake clock (``FLEETRUN_TEST_CLOCK``)."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.test_placement_e2e import FLOOR, Live, passes

from .test_local_loop import one_task


@pytest.fixture
def live(fleeter: Any) -> Any:
    started: list[Live] = []

    def start(*args: str, env: dict[str, str] | None = None) -> Live:
        lv = Live(fleeter.popen(*args, env={"PYTHONUNBUFFERED": "1", **(env or {})}))
        started.append(lv)
        return lv

    yield start
    for lv in started:
        lv.stop()


@pytest.fixture
def clock(tmp_path: Path) -> Any:
    """The fake clock: seconds to add to the real time, in a file the loop reads."""

    class Clock:
        path = tmp_path / "clock"

        def set(self, offset: float) -> None:
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(str(offset))
            tmp.replace(self.path)

        @property
        def env(self) -> dict[str, str]:
            return {"FLEETRUN_TEST_CLOCK": str(self.path)}

    c = Clock()
    c.set(0)
    return c


def wait_exit(lv: Live, timeout: float = 30) -> int:
    try:
        code = lv.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the run did not end; {lv.dump()}") from None
    for t in lv.threads:
        t.join(timeout=5)
    return code


# -- a wait that will clear keeps the run alive ------------------------------------------


@pytest.mark.parametrize("how", ["file", "until-idle"])
def test_a_memory_floor_keeps_the_run_waiting_until_the_policy_is_lowered(fleeter, fake_claude, live, how):
    one_task(fleeter)
    fake_claude.script(t1=[{"actions": [["write", "out.txt", "x"], ["commit", "add out"]]}])
    fleeter.write_policy(f"[local]\nmin_free_mem_mb = {FLOOR}\n")
    if how == "file":
        run = live("tasks.toml")
    else:
        assert fleeter.run("queue", "tasks.toml").ret == 0
        run = live("work", "--until-idle")
    run.wait_for("waiting: task_* (t1): this machine has * MB free; a task needs * above the floor *")
    passes()
    assert run.proc.poll() is None, f"the run ended while the task waits for memory; {run.dump()}"
    assert fake_claude.calls() == []

    fleeter.write_policy("[local]\nmin_free_mem_mb = 0\n")  # a live edit, no restart
    assert wait_exit(run) == 0, run.dump()
    assert fleeter.states() == {"t1": "DONE"}
    assert run.matching("=== 1 done in * ===")


def test_a_long_wait_reminds_every_few_minutes(fleeter, fake_claude, live, clock):
    one_task(fleeter)
    fleeter.write_policy(f"[local]\nmin_free_mem_mb = {FLOOR}\n")
    run = live("tasks.toml", env=clock.env)
    run.wait_for("waiting: task_* (t1): this machine has * MB free*")
    passes()
    assert run.matching("still waiting after*") == []
    clock.set(10 * 60)
    line = run.wait_for("still waiting after 10 min: t1 [[]READY[]] this machine has * MB free; *")
    assert "floor of" in line
    passes()
    assert len(run.matching("still waiting after*")) == 1, run.dump()  # once per few minutes, not per pass
    clock.set(15 * 60)
    run.wait_for("still waiting after 15 min: t1 *")
    assert run.proc.poll() is None
    assert fake_claude.calls() == []


def test_a_pin_to_a_peer_that_is_not_paired_ends_the_run_with_its_reason(fleeter, fake_claude):
    one_task(fleeter, extra='peer = "mini"')
    r = fleeter.runsub("tasks.toml", timeout=60)
    assert r.ret == 1, r.stdout + r.stderr
    r.fnmatch_lines(
        [
            "cannot place: t1: pinned to peer 'mini', which is not paired (fleetrun relay add mini USER@HOST)",
            "=== 1 ready in * ===",
        ]
    )
    assert fake_claude.calls() == []


def test_a_requires_no_machine_has_ends_the_run(fleeter, fake_claude):
    one_task(fleeter, extra='requires = ["nosuchtag"]')
    # a floor that would clear by itself does not hide what can never be met
    fleeter.write_policy(f"[local]\nmin_free_mem_mb = {FLOOR}\n")
    r = fleeter.runsub("tasks.toml", timeout=60)
    assert r.ret == 1, r.stdout + r.stderr
    r.fnmatch_lines(["cannot place: t1: this machine lacks `nosuchtag`"])


def test_a_drained_machines_tasks_say_drained_and_their_dependents_say_what_they_wait_for(fleeter):
    """This machine drained (nothing else to run on): the run ends, its task says
    "draining" as the reason only a person can clear, and a task that depends on it
    says what it waits for and why that cannot start, not its cause `queued` (issue 22)."""
    from fleetrun.fleeter import ECHO_AGENT, echo_task

    fleeter.write_tasks(ECHO_AGENT + echo_task("a") + echo_task("b", depends_on=["a"]))
    assert fleeter.run("drain").ret == 0
    r = fleeter.run("tasks.toml")
    assert r.ret == 1, r.stdout + r.stderr
    r.fnmatch_lines(
        [
            "cannot place: a: this machine is draining",
            "still waiting: b [[]PENDING] for a, which cannot be placed: this machine is draining",
            "=== 1 ready, 1 pending in * ===",
        ]
    )
    (row,) = [line for line in fleeter.run("status").stdout.splitlines() if line.startswith("a ")]
    assert row.endswith("this machine is draining"), row


# -- a usage-limit pause survives a restart ----------------------------------------------


def test_a_usage_limit_pause_is_kept_across_a_restart(fleeter, fake_claude, live, clock):
    one_task(fleeter)
    reset_at = int(time.time()) + 3600
    fake_claude.script(
        t1=[
            {"mode": "usage_limit", "reset_at": reset_at, "limit_style": "legacy"},
            {"actions": [["write", "out.txt", "x"]]},
        ]
    )
    hhmm = time.strftime("%H:%M", time.localtime(reset_at))
    first = live("tasks.toml", env=clock.env)
    first.wait_for(f"*t1 RESUMING (attempt 1)*usage_limit:usage limit, resumes at {hhmm}")
    first.wait_for(f"waiting: * (t1): this machine is paused: usage limit, resumes at {hhmm}")
    assert first.stop() == 2

    second = live("tasks.toml", env=clock.env)
    second.wait_for(f"waiting: * (t1): this machine is paused: usage limit, resumes at {hhmm}")
    passes()
    task = fleeter.task("t1")
    assert task.state.value == "RESUMING"
    assert len(fleeter.ledger().attempts(task.id)) == 1, second.dump()  # nothing started before the reset
    assert len(fake_claude.calls()) == 1

    clock.set(reset_at - time.time() + 5)  # the reset time has come
    assert wait_exit(second) == 0, second.dump()
    first_att, second_att = fleeter.ledger().attempts(task.id)
    assert fleeter.task("t1").state.value == "DONE"
    assert fleeter.task("t1").retries == 0


# -- the summary is about this run -------------------------------------------------------


def test_work_until_idle_reports_and_exits_on_what_it_worked_on(fleeter, fake_claude):
    fleeter.make_repo()
    fleeter.write_tasks(
        """
        [[task]]
        name = "old"
        cwd = "repo"
        prompt = "fail"
        git_ref = "main"
        max_retries = 0
          [[task.verify]]
          run = "false"
    """,
        name="old.toml",
    )
    fleeter.write_tasks(
        """
        [[task]]
        name = "new"
        cwd = "repo"
        prompt = "Write out.txt."
        git_ref = "main"
    """,
        name="new.toml",
    )
    fake_claude.script(default=[{"actions": [["write", "out.txt", "x"], ["commit", "add out"]]}])
    assert fleeter.run("old.toml").ret == 1
    assert fleeter.states() == {"old": "NEEDS_HUMAN"}
    assert fleeter.run("queue", "new.toml").ret == 0
    r = fleeter.run("work", "--until-idle")
    assert r.ret == 0, r.stdout + r.stderr
    r.fnmatch_lines(["=== 1 done in * (this run; 1 older task not shown: fleetrun status --all) ==="])
    assert fleeter.states() == {"old": "NEEDS_HUMAN", "new": "DONE"}


# -- transitions made from another shell are printed -------------------------------------


def test_a_cancel_from_another_shell_is_printed(fleeter, fake_claude, live):
    one_task(fleeter)
    fake_claude.script(t1=[{"actions": [["sleep", 60]]}])
    run = live("tasks.toml")
    run.wait_for("*t1 RUNNING (attempt 1)*")
    assert fleeter.run("cancel", "t1").ret == 0
    assert wait_exit(run) == 1, run.dump()
    lines = run.lines["out"]
    cancelled = [i for i, x in enumerate(lines) if " t1 CANCELLED " in x and "operator_cancel" in x]
    summary = [i for i, x in enumerate(lines) if x.startswith("=== ")]
    assert len(cancelled) == 1 and summary and cancelled[0] < summary[0], run.dump()


def test_the_loops_own_transitions_are_printed_once(fleeter, fake_claude):
    one_task(fleeter)
    fake_claude.script(t1=[{"actions": [["write", "out.txt", "x"], ["commit", "add out"]]}])
    r = fleeter.runsub("tasks.toml", timeout=60)
    assert r.ret == 0, r.stdout + r.stderr
    for word in ("RUNNING", "VERIFYING", "DONE"):
        assert len([x for x in r.outlines if f" t1 {word} " in x]) == 1, r.stdout


# -- Ctrl-C says what it interrupted -----------------------------------------------------


def test_the_interrupted_line_counts_each_kind() -> None:
    from fleetrun.loop import Loop

    assert Loop.interrupted_note(0, 0) == "interrupted: nothing was running"
    assert (
        Loop.interrupted_note(0, 3)
        == "interrupted: 3 verifiers were stopped and will run again on the next `fleetrun work`"
    )
    assert (
        Loop.interrupted_note(2, 0)
        == "interrupted: 2 running attempts go on and will be adopted by the next `fleetrun work`"
    )


def test_ctrl_c_says_what_it_interrupted_and_what_happens_to_it(fleeter, fake_claude, live):
    fleeter.make_repo()
    fleeter.write_tasks("""
        [[task]]
        name = "slowcheck"
        cwd = "repo"
        prompt = "Write out.txt."
        git_ref = "main"
          [[task.verify]]
          run = "sleep 60"

        [[task]]
        name = "longrun"
        cwd = "repo"
        prompt = "Think long."
        git_ref = "main"
    """)
    fake_claude.script(
        slowcheck=[{"actions": [["write", "out.txt", "x"], ["commit", "add out"]]}],
        longrun=[{"actions": [["sleep", 60]]}],
    )
    run = live("tasks.toml")
    run.wait_for("*slowcheck VERIFYING*")
    run.wait_for("*longrun RUNNING*")
    passes(1)
    run.proc.send_signal(signal.SIGINT)
    assert wait_exit(run) == 2, run.dump()
    run.wait_for(
        "interrupted: 1 running attempt goes on and will be adopted by the next `fleetrun work`; "
        "1 verifier was stopped and will run again then"
    )
    assert not run.matching("*nothing was running*")
    assert fleeter.states() == {"slowcheck": "VERIFYING", "longrun": "RUNNING"}
    fleeter.run("cancel", "longrun")
    fleeter.run("cancel", "slowcheck")

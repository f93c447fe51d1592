"""Issue 10 item 4: one malformed line never stops the fleet.

A poisoned attempt (the agent's stream-json result carries a cost that is not a
number, a denial list that is not a list...) sits beside three healthy tasks: the
three are DONE, the poisoned one ends NEEDS_HUMAN with a reason, the run exits 1, and
the next ``fleetrun work --until-idle`` does not crash on what it finds in the home.
An exception injected into one task's handling (a fleetconf.py hook) is contained the
same way: that task is NEEDS_HUMAN ``internal_error:...``, the traceback is in
``internal-error.log``, the others are DONE.
"""

from __future__ import annotations

import json
import signal
from typing import Any

import pytest

from fleetrun.crash import CRASH_EXIT

HEALTHY = ("ok1", "ok2", "ok3")


def tasks(fleeter: Any, names: tuple[str, ...]) -> None:
    fleeter.make_repo()
    blocks = "".join(
        f'''
        [[task]]
        name = "{n}"
        cwd = "repo"
        prompt = "Write out.txt."
        git_ref = "main"

          [[task.verify]]
          run = "test -f out.txt"
    '''
        for n in names
    )
    fleeter.write_tasks(blocks)


def result_line(**fields: Any) -> str:
    """A result event as the real CLI prints it, with ``fields`` replaced."""
    ev: dict[str, Any] = {
        "type": "result",
        "subtype": "success",
        "is_error": False,
        "duration_ms": 10,
        "num_turns": 1,
        "result": "done",
        "session_id": "5b1c7a3e-0000-4000-8000-000000000001",
        "total_cost_usd": 0.01,
        "permission_denials": [],
        "uuid": "u",
    }
    ev.update(fields)
    return json.dumps(ev)  # NaN stays NaN: json.dumps writes it as the real CLI's JS would not


WRITE = {"actions": [["write", "out.txt", "x"]]}

POISONS = {
    "cost_abc": [result_line(total_cost_usd="abc")],
    "cost_nan": [result_line(total_cost_usd=float("nan"))],
    "cost_negative": [result_line(total_cost_usd=-1)],
    "denials_5": [result_line(permission_denials=5)],
    "rate_limit_info_x": [
        json.dumps({"type": "rate_limit_event", "session_id": "s", "rate_limit_info": "x"}),
        result_line(),
    ],
    "is_error_string": [result_line(is_error="no")],
}


@pytest.mark.parametrize("poison", list(POISONS))
def test_one_poisoned_attempt_beside_three_healthy_tasks(fleeter, fake_claude, poison):
    tasks(fleeter, (*HEALTHY, "poison"))
    fake_claude.script(
        **{n: [WRITE] for n in HEALTHY},
        poison=[{"mode": "raw", "actions": [["write", "out.txt", "x"]], "raw": POISONS[poison]}],
    )
    r = fleeter.run("tasks.toml")
    assert r.ret == 1, r.stdout + r.stderr
    assert "INTERNAL ERROR" not in r.stderr
    states = fleeter.states()
    assert {n: states[n] for n in HEALTHY} == dict.fromkeys(HEALTHY, "DONE")
    task = fleeter.task("poison")
    assert task.state.value == "NEEDS_HUMAN", (task.state, task.reason)
    assert "malformed_output:" in task.reason, task.reason
    assert task.cost_usd >= 0
    # the home is not stuck: the next loop finds nothing it cannot handle
    again = fleeter.run("work", "--until-idle")
    assert again.ret != 3, again.stdout + again.stderr
    assert "INTERNAL ERROR" not in again.stderr


def test_usage_limit_legacy_reset_far_ahead_does_not_pause_past_the_horizon(fleeter, fake_claude, monkeypatch):
    """``usage limit reached|99999999999`` would pause this machine until the year 5138:
    the reset time is not believed and the usual back-off applies."""
    monkeypatch.setattr("fleetrun.decide.USAGE_BACKOFF_S", 1.0)
    tasks(fleeter, ("t1",))
    fake_claude.script(t1=[{"mode": "usage_limit", "reset_at": 99999999999, "limit_style": "legacy"}, WRITE])
    # a guard, not a timing: on a paused machine the loop would wait for millennia;
    # the alarm interrupts it (exit 2) instead of hanging the suite
    old = signal.signal(signal.SIGALRM, _interrupt)
    signal.alarm(120)
    try:
        r = fleeter.run("tasks.toml")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert r.ret == 0, r.stdout + r.stderr
    r.fnmatch_lines(["*t1 RESUMING (attempt 1)*usage_limit:*", "*t1 DONE (attempt 2)*"])


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


# ---------------------------------------------------------------------------------
# an exception inside one task's handling


RAISING_FLEETCONF = """
import fleetrun

@fleetrun.hookimpl(tryfirst=True)
def fleetrun_{hook}(task, attempt, config{extra}):
    if task.name == "boom":
        raise RuntimeError("injected for " + task.name)
"""


@pytest.mark.parametrize("hook,extra", [("collect_work", ", workspace"), ("handoff", "")])
def test_an_exception_in_one_tasks_handling_is_contained(fleeter, fake_claude, hook, extra):
    tasks(fleeter, (*HEALTHY, "boom"))
    fleeter.write_fleetconf(RAISING_FLEETCONF.format(hook=hook, extra=extra))
    fake_claude.script(**{n: [WRITE] for n in (*HEALTHY, "boom")})
    r = fleeter.run("tasks.toml")
    assert r.ret == 1, r.stdout + r.stderr
    assert "INTERNAL ERROR" not in r.stderr
    states = fleeter.states()
    assert {n: states[n] for n in HEALTHY} == dict.fromkeys(HEALTHY, "DONE")
    task = fleeter.task("boom")
    assert task.state.value == "NEEDS_HUMAN"
    assert task.reason == "internal_error:RuntimeError: injected for boom"
    log = (fleeter.home / "internal-error.log").read_text()
    assert "Traceback (most recent call last)" in log and "RuntimeError: injected for boom" in log
    assert f"fleetrun_{hook}" in log
    again = fleeter.run("work", "--until-idle")
    # nothing left to work on: the older NEEDS_HUMAN task is not this run's (issue 11)
    assert again.ret == 0, again.stdout + again.stderr
    assert "INTERNAL ERROR" not in again.stderr


def test_an_exception_while_adopting_does_not_crash_loop(fleeter, fake_claude):
    """The supervisor dies after recording boom's end but before its transition; every
    restart decides again and calls the raising hook from adopt(): it must end in
    NEEDS_HUMAN once, not raise on every ``work``."""
    tasks(fleeter, ("boom",))
    fake_claude.script(boom=[WRITE])
    first = fleeter.runsub("tasks.toml", env={"FLEETRUN_CRASH_AT": "before_transition:VERIFYING"})
    assert first.ret == CRASH_EXIT, first.stdout + first.stderr
    assert fleeter.task("boom").state.value == "RUNNING"
    fleeter.write_fleetconf(RAISING_FLEETCONF.format(hook="collect_work", extra=", workspace"))
    for expected in (1, 0):  # the second finds only the first's NEEDS_HUMAN, an older task
        r = fleeter.runsub("work", "--until-idle")
        assert r.ret == expected, r.stdout + r.stderr
        assert "INTERNAL ERROR" not in r.stderr
    task = fleeter.task("boom")
    assert task.state.value == "NEEDS_HUMAN"
    assert task.reason == "internal_error:RuntimeError: injected for boom"
    assert "RuntimeError: injected for boom" in (fleeter.home / "internal-error.log").read_text()


@pytest.mark.parametrize("hook,extra", [("spawn", ", workspace, prompt"), ("build_prompt", ", context")])
def test_an_exception_after_setup_is_contained(fleeter, fake_claude, hook, extra):
    """A task with ``setup`` starts its agent from the setup stage's poll: a hook that
    raises there stops that task (NEEDS_HUMAN internal_error), not the run, and the
    task is not left ASSIGNED."""
    tasks(fleeter, (*HEALTHY, "boom"))
    text = (fleeter.path / "tasks.toml").read_text()
    fleeter.write_tasks('setup = ["true"]\n' + text)
    fleeter.write_fleetconf(RAISING_FLEETCONF.format(hook=hook, extra=extra))
    fake_claude.script(**{n: [WRITE] for n in (*HEALTHY, "boom")})
    r = fleeter.run("tasks.toml")
    assert r.ret == 1, r.stdout + r.stderr
    assert "INTERNAL ERROR" not in r.stderr
    states = fleeter.states()
    assert {n: states[n] for n in HEALTHY} == dict.fromkeys(HEALTHY, "DONE")
    task = fleeter.task("boom")
    assert task.state.value == "NEEDS_HUMAN"
    assert task.reason == "internal_error:RuntimeError: injected for boom"


def test_a_cleanup_hook_that_raises_leaves_done_done_and_says_so(fleeter, fake_claude):
    tasks(fleeter, ("boom",))
    fleeter.write_fleetconf("""
import fleetrun

@fleetrun.hookimpl(tryfirst=True)
def fleetrun_cleanup_workspace(task, config):
    raise RuntimeError("injected for " + task.name)
""")
    fake_claude.script(boom=[WRITE])
    r = fleeter.run("tasks.toml")
    assert "INTERNAL ERROR" not in r.stderr, r.stderr
    assert fleeter.task("boom").state.value == "DONE"
    assert "(RuntimeError: injected for boom); it stays DONE" in r.stderr, r.stderr
    assert "needs a human" not in r.stderr

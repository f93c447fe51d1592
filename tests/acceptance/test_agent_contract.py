"""The agent contract: an agent's exit code is not to be trusted. Completion, the
stall watchdog, the budget, usage limits and resumes, through the fake claude."""

from __future__ import annotations

import time

import pytest

from .test_local_loop import one_task


def test_stall_watchdog_ends_a_silent_attempt(fleeter, fake_claude):
    one_task(fleeter, extra="stall_timeout_min = 0.02")
    fake_claude.script(t1=[{"stall": 30, "actions": [["print", "thinking"]]},
                           {"actions": [["write", "out.txt", "x"]]}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    r.fnmatch_lines(["*t1 RESUMING (attempt 1)*stalled", "*t1 DONE (attempt 2)*"])
    att = fleeter.ledger().attempts(fleeter.task("t1").id)[0]
    assert att.outcome == "stalled"


def test_exit_zero_without_result_is_not_success(fleeter, fake_claude):
    one_task(fleeter, verify='run = "true"')
    fake_claude.script(t1=[{"mode": "no_result"}, {}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 0
    led = fleeter.ledger()
    first = led.attempts(fleeter.task("t1").id)[0]
    assert first.exit_code == 0 and first.outcome == "no_result"
    r.fnmatch_lines(["*RESUMING (attempt 1)*session_died:no_result*"])


def test_budget_caps_attempts_and_verifiers(fleeter, fake_claude):
    one_task(fleeter, extra="budget_usd = 0.5", verify='run = "false"')
    fake_claude.script(t1=[{"cost": 0.5}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 1
    task = fleeter.task("t1")
    assert task.state.value == "NEEDS_HUMAN"
    assert task.reason == "budget_exhausted:spent $0.50 of $0.50"
    (call,) = fake_claude.calls("t1")  # the retry was never started: pause and ask
    assert call["argv"][call["argv"].index("--max-budget-usd") + 1] == "0.5000"


def test_remaining_budget_is_passed_and_overspend_needs_a_human(fleeter, fake_claude):
    one_task(fleeter, extra="budget_usd = 0.5", verify='run = "test -f out.txt"')
    fake_claude.script(t1=[{"cost": 0.4}, {"cost": 0.3, "actions": [["write", "out.txt", "x"]]}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 1
    first, second = fake_claude.calls("t1")
    assert second["argv"][second["argv"].index("--max-budget-usd") + 1] == "0.1000"
    task = fleeter.task("t1")
    assert task.state.value == "NEEDS_HUMAN" and task.reason.startswith("budget_exhausted:")


def test_usage_limit_pauses_the_machine_and_resumes_without_using_a_retry(fleeter, fake_claude):
    one_task(fleeter)
    reset_at = int(time.time()) + 3
    fake_claude.script(t1=[{"mode": "usage_limit", "reset_at": reset_at, "limit_style": "legacy"},
                           {"actions": [["write", "out.txt", "x"]]}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    clock = time.strftime("%H:%M", time.localtime(reset_at))
    r.fnmatch_lines([f"*t1 RESUMING (attempt 1)*usage_limit:usage limit, resumes at {clock}",
                     f"waiting: * (t1): this machine is paused: usage limit, resumes at {clock}",
                     "*t1 DONE (attempt 2)*"])
    task = fleeter.task("t1")
    assert task.retries == 0 and task.resumes == 0
    led = fleeter.ledger()
    first, second = led.attempts(task.id)
    assert second.created >= reset_at - 0.5


def test_rate_limit_without_reset_time_backs_off(fleeter, fake_claude, monkeypatch):
    monkeypatch.setattr("fleetrun.loop.USAGE_BACKOFF_S", 1.0)
    one_task(fleeter)
    fake_claude.script(t1=[{"mode": "rate_limit"}, {"actions": [["write", "out.txt", "x"]]}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    r.fnmatch_lines(["*t1 RESUMING (attempt 1)*usage_limit:*", "*t1 DONE (attempt 2)*"])
    led = fleeter.ledger()
    first, second = led.attempts(fleeter.task("t1").id)
    assert second.created - first.ended >= 0.9


@pytest.mark.parametrize("resume_session", [False, True])
def test_resume_is_a_fresh_session_unless_config_asks(fleeter, fake_claude, resume_session):
    one_task(fleeter)
    cfg = (fleeter.home / "config.toml").read_text()
    if resume_session:
        (fleeter.home / "config.toml").write_text(cfg + "resume_session = true\n")
    fake_claude.script(t1=[{"mode": "die"}, {"actions": [["write", "out.txt", "x"]]}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    first, second = fake_claude.calls("t1")
    sid = first["argv"][first["argv"].index("--session-id") + 1]
    if resume_session:
        assert second["argv"][second["argv"].index("--resume") + 1] == sid
        assert "--session-id" not in second["argv"]
    else:
        assert "--resume" not in second["argv"]
        assert second["argv"][second["argv"].index("--session-id") + 1] != sid
    assert "assess the working directory" in second["prompt"]


def test_permission_denials_are_logged_with_the_attempt(fleeter, fake_claude):
    one_task(fleeter, verify='run = "true"')
    fake_claude.script(t1=[{"actions": [["bash", "curl http://example.invalid"]]}])
    assert fleeter.run("tasks.toml").ret == 0
    att = fleeter.ledger().attempts(fleeter.task("t1").id)[0]
    assert att.info["denials"] and att.info["denials"][0]["tool_name"] == "Bash"

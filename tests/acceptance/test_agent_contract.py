"""The agent contract: an agent's exit code is not to be trusted. Completion, the
stall watchdog, the budget, usage limits and resumes, through the fake claude."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from .test_local_loop import one_task


def test_stall_watchdog_ends_a_silent_attempt(fleeter, fake_claude):
    one_task(fleeter, extra="stall_timeout_min = 0.02")
    fake_claude.script(t1=[{"stall": 30, "actions": [["print", "thinking"]]}, {"actions": [["write", "out.txt", "x"]]}])
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
    fake_claude.script(
        t1=[
            {"mode": "usage_limit", "reset_at": reset_at, "limit_style": "legacy"},
            {"actions": [["write", "out.txt", "x"]]},
        ]
    )
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    clock = time.strftime("%H:%M", time.localtime(reset_at))
    r.fnmatch_lines(
        [
            f"*t1 RESUMING (attempt 1)*usage_limit:usage limit, resumes at {clock}",
            f"waiting: * (t1): this machine is paused: usage limit, resumes at {clock}",
            "*t1 DONE (attempt 2)*",
        ]
    )
    task = fleeter.task("t1")
    assert task.retries == 0 and task.resumes == 0
    led = fleeter.ledger()
    first, second = led.attempts(task.id)
    assert second.created >= reset_at - 0.5


@pytest.mark.parametrize("auth", ["api_key", "oauth"])
def test_rate_limit_without_reset_time_backs_off(fleeter, fake_claude, monkeypatch, auth):
    """A 429 that gives no reset time (an API key's limit, or no unified headers: "not
    your usage limit") backs the task off; it is no usage-limit pause of the machine."""
    monkeypatch.setattr("fleetrun.decide.USAGE_BACKOFF_S", 1.0)
    one_task(fleeter)
    fake_claude.script(t1=[{"mode": "rate_limit", "auth": auth}, {"actions": [["write", "out.txt", "x"]]}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    r.fnmatch_lines(
        [
            "*t1 RESUMING (attempt 1)*rate_limited:API Error: *",
            "waiting: * (t1): the API rate-limited the last attempt on this machine *backing off until *",
            "*t1 DONE (attempt 2)*",
        ]
    )
    r.no_fnmatch_line("*paused*")
    r.no_fnmatch_line("*usage_limit*")
    led = fleeter.ledger()
    first, second = led.attempts(fleeter.task("t1").id)
    assert second.created - first.ended >= 0.9
    assert fleeter.task("t1").resumes == 0


@pytest.mark.parametrize("status", [500, 529])
def test_a_server_error_is_resumed_not_a_usage_limit(fleeter, fake_claude, monkeypatch, status):
    """Measured: a 500 or 529 ends the CLI with subtype "success", is_error and
    api_error_status; it is transient: resumed at once, nothing is paused."""
    monkeypatch.setattr("fleetrun.decide.USAGE_BACKOFF_S", 0.2)  # keeps a failing run short
    one_task(fleeter)
    fake_claude.script(t1=[{"mode": "api_error", "status": status}, {"actions": [["write", "out.txt", "x"]]}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    r.fnmatch_lines([f"*t1 RESUMING (attempt 1)*api_error:{status}", "*t1 DONE (attempt 2)*"])
    r.no_fnmatch_line("*paused*")
    first, _ = fleeter.ledger().attempts(fleeter.task("t1").id)
    assert first.outcome == f"api_error:{status}"


@pytest.mark.parametrize("version", ["2.1.197", "2.1.332"])
def test_the_budget_crossing_turn_is_budget_exhausted_and_its_tmp_file_is_not_committed(
    fleeter, fake_claude, monkeypatch, version
):
    monkeypatch.setenv("FAKE_CLAUDE_VERSION", version)
    one_task(fleeter, extra="budget_usd = 0.5")
    fake_claude.script(t1=[{"cost": 0.9, "actions": [["write", "a.txt", "A"], ["write", "out.txt", "x"]]}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 1
    task = fleeter.task("t1")
    assert (task.state.value, task.reason) == ("NEEDS_HUMAN", "budget_exhausted:the agent reached its --max-budget-usd")
    assert task.cost_usd == pytest.approx(0.6)  # the crossing turn is paid for
    (att,) = fleeter.ledger().attempts(task.id)
    assert att.cost_usd == pytest.approx(0.6)
    # the cut-off Write left out.txt.tmp.PID.HEX in the worktree; nothing commits it
    assert [p.name for p in Path(task.worktree).glob("out.txt.tmp.*")]
    files = fleeter.git(fleeter.path / "repo", "ls-tree", "-r", "--name-only", task.branch).split()
    assert not [f for f in files if ".tmp." in f]


def test_less_than_the_smallest_budget_left_is_exhausted_before_starting(fleeter, fake_claude):
    """$0.00003 left would be --max-budget-usd 0.0000, which the CLI refuses."""
    one_task(fleeter, extra="budget_usd = 0.5")
    fake_claude.script(t1=[{"cost": 0.49997, "mode": "is_error"}, {"actions": [["write", "out.txt", "x"]]}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 1
    task = fleeter.task("t1")
    assert (task.state.value, task.reason) == ("NEEDS_HUMAN", "budget_exhausted:spent $0.50 of $0.50")
    (call,) = fake_claude.calls("t1")  # no session that the CLI would refuse to start


def test_a_killed_session_has_an_unknown_cost_not_zero(fleeter, fake_claude):
    one_task(fleeter)
    fake_claude.script(
        t1=[{"mode": "die", "actions": [["print", "working"]]}, {"actions": [["write", "out.txt", "x"]], "cost": 0.12}]
    )
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    r.fnmatch_lines(["=== 1 done in *, $0.12+ ==="])
    task = fleeter.task("t1")
    first, second = fleeter.ledger().attempts(task.id)
    assert (first.cost_usd, second.cost_usd) == (None, 0.12)
    logs = fleeter.run("logs", "t1")
    logs.fnmatch_lines(
        ["t1 * cost $0.12+", "*attempt 1 (fresh) ended: *, cost unknown*", "*attempt 2 * ended: ok, $0.12*"]
    )
    status = fleeter.run("status")
    status.fnmatch_lines(["t1 * $0.12+ *"])


def test_terminal_escapes_glued_to_a_json_line_do_not_hide_the_result():
    from fleetrun.plugins.claude import result_from_log

    line = json.dumps(
        {
            "type": "result",
            "subtype": "success",
            "is_error": False,
            "result": "done",
            "session_id": "s",
            "total_cost_usd": 0.25,
            "num_turns": 1,
        }
    )
    res = result_from_log("\x1b[?2004h" + line + "\x1b[<u\x1b[?1004l\x1b[?2004l\x1b[?25h", 0)
    assert (res.ok, res.cost_usd, res.result_text) == (True, 0.25, "done")


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

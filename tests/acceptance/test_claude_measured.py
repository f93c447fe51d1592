"""What the real Claude Code CLI does (measured with 2.1.197 and 2.1.332, docs/agents.md
"The fake claude and the real CLI"), through the real fleetrun CLI and the fake claude:
each case a failure that is not the agent's costs no agent run, or no more than one."""

from __future__ import annotations

import json
from typing import Any

import pytest

from .test_local_loop import one_task

VERSIONS = ["2.1.197", "2.1.332"]
ROOT_REFUSAL = "--dangerously-skip-permissions cannot be used with root/sudo privileges for security reasons"


@pytest.mark.parametrize("version", VERSIONS)
def test_bypass_permissions_as_root_is_rejected_arguments_after_one_invocation(
    fleeter: Any, fake_claude: Any, monkeypatch: Any, version: str
) -> None:
    """Measured: as root (outside IS_SANDBOX=1) both versions exit 1 at once with this
    line, no ``error:`` prefix, no stream-json; it used to be resumed three times."""
    monkeypatch.setenv("FAKE_CLAUDE_VERSION", version)
    monkeypatch.setenv("FAKE_CLAUDE_UID", "0")
    monkeypatch.delenv("IS_SANDBOX", raising=False)
    one_task(fleeter, extra='permission_mode = "bypassPermissions"')
    r = fleeter.run("tasks.toml")
    assert r.ret == 1, r.stdout + r.stderr
    task = fleeter.task("t1")
    assert (task.state.value, task.reason) == ("NEEDS_HUMAN", f"agent_rejected_arguments:{ROOT_REFUSAL}")
    (call,) = fake_claude.calls("t1")
    assert call["error"] == ROOT_REFUSAL


@pytest.mark.parametrize("version", VERSIONS)
def test_a_resume_the_cli_cannot_find_starts_a_fresh_session(
    fleeter: Any, fake_claude: Any, monkeypatch: Any, version: str
) -> None:
    """Killed before its first request (an OOM kill during start-up), a session leaves no
    conversation: measured, every ``--resume`` of it is error_during_execution "No
    conversation found with session ID" until resume_cap. One resume tries it; the next
    attempt is a fresh session, told why."""
    monkeypatch.setenv("FAKE_CLAUDE_VERSION", version)
    one_task(fleeter)
    cfg = fleeter.home / "config.toml"
    cfg.write_text(cfg.read_text() + "resume_session = true\n")
    fake_claude.script(t1=[{"mode": "die_at_start"}, {"actions": [["write", "out.txt", "x"]]}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    first, resumed, fresh = fake_claude.calls("t1")
    sid = first["argv"][first["argv"].index("--session-id") + 1]
    assert resumed["argv"][resumed["argv"].index("--resume") + 1] == sid
    assert resumed["error"] == f"No conversation found with session ID: {sid}"
    assert "--resume" not in fresh["argv"] and fresh["argv"][fresh["argv"].index("--session-id") + 1] != sid
    assert "could not be resumed" in fresh["prompt"] and "assess the working directory" in fresh["prompt"]
    r.fnmatch_lines(["*t1 RESUMING (attempt 2)*session_not_found*", "*t1 DONE (attempt 3)*"])


@pytest.mark.parametrize("version", VERSIONS)
def test_a_resumed_sessions_cumulative_cost_is_recorded_per_invocation(
    fleeter: Any, fake_claude: Any, monkeypatch: Any, version: str
) -> None:
    """Measured: after --resume 2.1.332 reports the whole session's total_cost_usd (the
    invocation's own is in model_usage_since_last_result); recording it as the attempt's
    counted the first invocation twice ($0.72 for $0.48 billed, the budget hit early).
    2.1.197 reports the invocation's: the same ledger on either version."""
    monkeypatch.setenv("FAKE_CLAUDE_VERSION", version)
    one_task(fleeter)
    cfg = fleeter.home / "config.toml"
    cfg.write_text(cfg.read_text() + "resume_session = true\n")
    fake_claude.script(
        t1=[{"mode": "api_error", "status": 500, "cost": 0.24}, {"actions": [["write", "out.txt", "x"]], "cost": 0.24}]
    )
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    first, resumed = fake_claude.calls("t1")
    assert "--resume" in resumed["argv"]
    task = fleeter.task("t1")
    costs = [a.cost_usd for a in fleeter.ledger().attempts(task.id)]
    assert costs == [0.24, 0.24]
    assert task.cost_usd == sum(costs)


def test_a_cost_is_read_from_the_invocations_own_usage_and_strictly() -> None:
    from fleetrun.plugins.claude import result_from_log

    def result(**extra: Any) -> str:
        return json.dumps(
            {
                "type": "result",
                "subtype": "success",
                "is_error": False,
                "result": "done",
                "session_id": "s",
                "total_cost_usd": 0.72,
                "num_turns": 1,
                **extra,
            }
        )

    assert result_from_log(result(), 0).cost_usd == 0.72  # 2.1.197: no per-invocation usage
    since = {"claude-opus-5-5": {"costUSD": 0.2}, "claude-haiku-4-5": {"costUSD": 0.04}}
    assert result_from_log(result(model_usage_since_last_result=since), 0).cost_usd == pytest.approx(0.24)
    for bad in ([], {"m": {"costUSD": "lots"}}, {"m": {"costUSD": -1}}, {"m": 3}):
        res = result_from_log(result(model_usage_since_last_result=bad), 0)
        assert (res.ok, res.reason.split(":", 1)[0]) == (False, "malformed_output"), bad


def allowed_tools(argv: list[str]) -> list[str]:
    i = argv.index("--allowedTools") + 1
    out = []
    while i < len(argv) and not argv[i].startswith("--"):
        out.append(argv[i])
        i += 1
    return out


@pytest.mark.parametrize("allow_verifiers", [None, False])
def test_the_agent_may_run_its_verifiers_commands(fleeter: Any, fake_claude: Any, allow_verifiers: Any) -> None:
    """Each ``run`` verifier's command is an exact allow rule (``Bash(<command>)``, each
    part of a compound one): the verifier runs the agent's code anyway. ``allow_verifiers
    = false`` turns it off; ``allowed_tools`` still widens what is allowed."""
    fleeter.make_repo()
    key = "" if allow_verifiers is None else "allow_verifiers = false"
    fleeter.write_tasks(f"""
        [[task]]
        name = "t1"
        cwd = "repo"
        prompt = "Write out.txt."
        git_ref = "main"
        allowed_tools = ["Read"]
        {key}
          [[task.verify]]
          run = "test -f out.txt"
          [[task.verify]]
          run = "grep -q x out.txt && git diff --quiet HEAD~1 -- README.md"
          [[task.verify]]
          run = "ls *.txt"
          [[task.verify]]
          agent = "Is out.txt there?"
    """)
    fake_claude.script(
        t1=[
            {
                "actions": [
                    ["write", "out.txt", "x"],
                    ["bash", "test -f out.txt"],
                    ["bash", "grep -q x out.txt && git diff --quiet HEAD~1 -- README.md"],
                    ["commit", "out"],
                ]
            }
        ],
        **{"t1:review": [{"structured": {"verdict": "PASS", "reason": "there"}, "result": "PASS"}]},
    )
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    (call,) = fake_claude.calls("t1")
    rules = ["Bash(test -f out.txt)", "Bash(grep -q x out.txt)", "Bash(git diff --quiet HEAD~1 -- README.md)"]
    denials = fleeter.ledger().attempts(fleeter.task("t1").id)[0].info.get("denials") or []
    denied = [d["tool_input"]["command"] for d in denials]
    if allow_verifiers is None:
        # a command with a * would be a wildcard rule: more than the verifier runs
        assert allowed_tools(call["argv"]) == ["Read", *rules]
        assert denied == ["git add -A && git commit -q -m out"]  # allowed_tools replaced the git rules
    else:
        assert allowed_tools(call["argv"]) == ["Read"]
        assert denied == [
            "test -f out.txt",
            "grep -q x out.txt && git diff --quiet HEAD~1 -- README.md",
            "git add -A && git commit -q -m out",
        ]
    (review,) = fake_claude.review_calls("t1")
    assert not any(r in review["argv"] for r in rules)


def test_a_session_resumed_after_an_api_error_is_told_the_first_line_of_it(fleeter: Any, fake_claude: Any) -> None:
    one_task(fleeter)
    fake_claude.script(t1=[{"mode": "api_error", "status": 500}, {"actions": [["write", "out.txt", "x"]]}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    _, resumed = fake_claude.calls("t1")
    assert resumed["prompt"].startswith(
        "Your previous session on this task was interrupted: the API answered with an error (HTTP 500): "
        "API Error: 500 Internal server error. This is a server-side issue, usually temporary"
    )


@pytest.mark.parametrize(
    ("as_root", "sandbox", "warned"), [(True, None, True), (True, "1", False), (False, None, False)]
)
def test_validate_warns_of_bypass_permissions_as_root(
    fleeter: Any, fake_claude: Any, monkeypatch: Any, as_root: bool, sandbox: Any, warned: bool
) -> None:
    """The combination is seen coming: fleetrun runs as root (its sessions will too),
    IS_SANDBOX is not 1 in its environment nor in the task's ``env``."""
    monkeypatch.setattr("fleetrun.plugins.claude.runs_as_root", lambda: as_root, raising=False)
    monkeypatch.delenv("IS_SANDBOX", raising=False)
    env = f'env = {{ IS_SANDBOX = "{sandbox}" }}' if sandbox else ""
    one_task(fleeter, extra=f'permission_mode = "bypassPermissions"\n{env}')
    r = fleeter.run("validate", "tasks.toml")
    assert (r.ret, r.outlines) == (0, ["tasks.toml: 1 task, valid"])
    assert r.errlines == (
        [
            "warning: tasks.toml:6: task 't1': permission_mode: bypassPermissions as root: Claude Code refuses it "
            '("--dangerously-skip-permissions cannot be used with root/sudo privileges") and the task would need a '
            'human at once; run fleetrun as another user, or, in a container meant for it, set IS_SANDBOX = "1" '
            "in the task's env"
        ]
        if warned
        else []
    )

"""The ``verify_agent`` plugin: a read-only Claude Code reviewer, acted out by the fake
claude (fleetrun/testing/fake_claude/), which enforces --permission-mode / --tools /
--disallowedTools as the real CLI does. Real git, real processes, the real CLI."""

from __future__ import annotations

import json
import os
import select
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from fleetrun.diffutil import NO_VERDICT
from fleetrun.plugins.verify_agent import (
    DENIED_TOOLS,
    AgentHandle,
    review_budget,
    reviewer_argv,
    verdict_from_stream,
)
from fleetrun.reports import Verdict
from fleetrun.taskspec import VerifySpec

FAKE = Path(__file__).parent / "fakes" / "claude"
REVIEW = "Check that hello.txt says hello."


def review_task(fleeter, verify: str = f'agent = "{REVIEW}"', extra: str = "") -> None:
    fleeter.make_repo()
    fleeter.write_tasks(f"""
        [[task]]
        name = "greet"
        cwd = "repo"
        prompt = "Write hello.txt saying hello."
        git_ref = "main"
        {extra}

          [[task.verify]]
          {verify}
    """)


def reviewer_calls(fake_claude) -> list[dict[str, Any]]:
    return fake_claude.review_calls()


def agent_calls(fake_claude) -> list[dict[str, Any]]:
    return [c for c in fake_claude.calls() if "FLEETRUN_VERIFIER" not in c["env"]]


def opt(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


# --------------------------------------------------------------------------- units


def test_reviewer_argv_is_read_only_and_leaves_the_prompt_to_stdin():
    config = SimpleNamespace(setting=lambda table, key, default=None: "/bin/claude-x")
    sid = str(uuid.uuid4())
    plain = reviewer_argv(config, VerifySpec("agent", REVIEW), sid)
    assert plain[:7] == ["/bin/claude-x", "-p", "--output-format", "stream-json", "--verbose", "--session-id", sid]
    assert opt(plain, "--permission-mode") == "dontAsk"  # not plan: it ignores a model alias
    assert opt(plain, "--tools") == "Read,Grep,Glob"
    # nothing from the branch under review configures the CLI
    assert opt(plain, "--setting-sources") == "user"
    assert "--strict-mcp-config" in plain and json.loads(opt(plain, "--mcp-config")) == {"mcpServers": {}}
    assert "--disable-slash-commands" in plain
    assert json.loads(opt(plain, "--json-schema"))["required"] == ["verdict", "reason"]
    assert plain[plain.index("--disallowedTools") + 1 :] == list(DENIED_TOOLS)  # last: variadic
    assert {"Bash", "Edit", "Write", "NotebookEdit"} <= set(DENIED_TOOLS)
    assert "--allowedTools" not in plain and "--model" not in plain and "--max-budget-usd" not in plain
    assert "--settings" not in plain and "--add-dir" not in plain
    assert REVIEW not in plain
    full = reviewer_argv(config, VerifySpec("agent", REVIEW, model="claude-haiku-4-5"), sid, budget=0.25)
    assert opt(full, "--model") == "claude-haiku-4-5"
    assert opt(full, "--max-budget-usd") == "0.2500"


@pytest.mark.parametrize(
    "task_budget, spent, verifier_budget, expect",
    [
        (None, 0.5, None, None),
        (None, 0.5, 0.3, 0.3),
        (1.0, 0.25, None, 0.75),
        (1.0, 0.25, 0.5, 0.5),
        (1.0, 0.75, 0.5, 0.25),
        (1.0, 1.5, 0.5, 0.0),
    ],
)
def test_review_budget_is_capped_by_what_is_left_of_the_task(task_budget, spent, verifier_budget, expect):
    task = SimpleNamespace(spec=SimpleNamespace(budget_usd=task_budget), cost_usd=spent)
    assert review_budget(task, VerifySpec("agent", REVIEW, budget_usd=verifier_budget)) == expect


def _stream(result: dict[str, Any] | None) -> str:
    lines = [json.dumps({"type": "system", "subtype": "init", "session_id": "s"}), "not json noise"]
    if result is not None:
        lines.append(json.dumps({"type": "result", "session_id": "s", **result}))
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    "result, code, expect",
    [
        ({"is_error": False, "result": "PASS\nfine", "total_cost_usd": 0.03}, 0, (True, "PASS", "PASS\nfine", 0.03)),
        (
            {"is_error": False, "result": "FAIL: no greeting\nsee hello.txt", "total_cost_usd": 0.02},
            0,
            (False, "no greeting", "FAIL: no greeting\nsee hello.txt", 0.02),
        ),
        ({"is_error": False, "result": "**PASS**", "total_cost_usd": 0.01}, 0, (True, "**PASS**", "**PASS**", 0.01)),
        (
            {"is_error": False, "result": "PASS: the change is fine", "total_cost_usd": 0.01},
            0,
            (True, "PASS: the change is fine", "PASS: the change is fine", 0.01),
        ),
        (
            {"is_error": False, "result": "Looks right", "total_cost_usd": 0.01},
            0,
            (False, NO_VERDICT, "Looks right", 0.01),
        ),
        # the structured verdict (--json-schema) wins over the text
        (
            {
                "is_error": False,
                "result": "PASS",
                "structured_output": {"verdict": "FAIL", "reason": "no greeting\nmore"},
                "total_cost_usd": 0.01,
            },
            0,
            (False, "no greeting", "PASS", 0.01),
        ),
        (
            {
                "is_error": False,
                "result": "",
                "structured_output": {"verdict": "PASS", "reason": "fine"},
                "total_cost_usd": 0.01,
            },
            0,
            (True, "PASS: fine", '{"verdict": "PASS", "reason": "fine"}', 0.01),
        ),
        (
            {
                "is_error": False,
                "result": "FAIL: x",
                "structured_output": {"verdict": "PASS", "reason": ""},
                "total_cost_usd": 0,
            },
            0,
            (True, "PASS", "FAIL: x", 0.0),
        ),
        (
            {
                "is_error": True,
                "subtype": "error_max_budget_usd",
                "errors": ["Reached maximum budget ($0.1)"],
                "total_cost_usd": 0.6,
            },
            1,
            (
                False,
                "the reviewer ended with an error (error_max_budget_usd): Reached maximum budget ($0.1)",
                "Reached maximum budget ($0.1)",
                0.6,
            ),
        ),
        (None, 0, (False, "no verdict: the reviewer ended without a result (exit code 0)", "", 0.0)),
        (None, -9, (False, "no verdict: the reviewer ended without a result (killed by signal 9)", "", 0.0)),
    ],
)
def test_verdict_from_stream(result, code, expect):
    assert verdict_from_stream(_stream(result), code) == expect


@pytest.mark.parametrize(
    "result, reason",
    [
        ({"result": "PASS", "total_cost_usd": "abc"}, "no verdict: malformed result event: result.total_cost_usd:"),
        ({"result": "PASS", "total_cost_usd": -1}, "no verdict: malformed result event: result.total_cost_usd:"),
        ({"result": "PASS", "is_error": "no"}, "no verdict: malformed result event: result.is_error:"),
        ({"result": ["PASS"]}, "no verdict: malformed result event: result.result:"),
        (
            {"result": "PASS", "structured_output": {"verdict": "pass"}},
            "no verdict: malformed result event: structured_output.verdict:",
        ),
        ({"result": "PASS", "structured_output": "PASS"}, "no verdict: malformed result event: structured_output:"),
        (
            {"result": "PASS", "structured_output": {"verdict": "PASS", "reason": 5}},
            "no verdict: malformed result event: structured_output.reason:",
        ),
    ],
)
def test_a_malformed_result_is_a_fail_not_an_exception(result, reason):
    passed, why, _, _ = verdict_from_stream(_stream(result), 0)
    assert not passed and why.startswith(reason)


# --------------------------------------------------------------------------- the handle


@pytest.fixture
def reviewer(tmp_path):
    """Run AgentHandle on the fake claude directly, with one scripted review step."""
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEETRUN_", "FAKE_CLAUDE_"))}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.update(
        FAKE_CLAUDE_SCENARIO=str(tmp_path / "scenario.json"),
        FAKE_CLAUDE_STATE=str(tmp_path / "state"),
        FAKE_CLAUDE_LOG=str(tmp_path / "calls.ndjson"),
        FLEETRUN_TASK_NAME="t",
        FLEETRUN_VERIFIER="agent",
    )
    config = SimpleNamespace(setting=lambda table, key, default=None: str(FAKE) if key == "executable" else default)

    def start(step: dict[str, Any], exe: str | None = None, **vkw: Any) -> AgentHandle:
        (tmp_path / "scenario.json").write_text(json.dumps({"t:review": [step]}))
        (tmp_path / "prompt").write_text("Review it. Answer with a first line of exactly PASS or FAIL: reason")
        v = VerifySpec("agent", REVIEW, **vkw)
        argv = reviewer_argv(config, v, str(uuid.uuid4()), v.budget_usd)
        if exe:
            argv[0] = exe
        return AgentHandle(v, argv, str(work), env, tmp_path / "prompt", tmp_path / "review-1.jsonl")

    start.path = tmp_path  # type: ignore[attr-defined]
    return start


def wait_verdict(h: AgentHandle, limit: float = 120) -> Verdict:
    end = time.monotonic() + limit
    while time.monotonic() < end:
        v = h.poll()
        if v is not None:
            return v
        fd = h.fileno()
        wait = max(0.005, min(0.5, h.next_deadline() - time.monotonic()))
        if fd >= 0:
            select.select([fd], [], [], wait)
        else:
            time.sleep(0.01)
    raise AssertionError("no verdict in time")


def test_handle_pass_with_cost(reviewer):
    h = reviewer({"result": "PASS\nLooks right.", "cost": 0.04})
    assert h.poll() is None or h.verdict is not None  # returns at once
    v = wait_verdict(h)
    assert (v.passed, v.kind, v.reason, v.output, v.cost_usd) == (True, "agent", "PASS", "PASS\nLooks right.", 0.04)
    assert h.fileno() == -1


@pytest.mark.parametrize(
    "step, vkw, reason, error",
    [
        ({"result": "FAIL: hello.txt is missing"}, {}, "hello.txt is missing", None),
        ({"result": "Pass: fine"}, {}, NO_VERDICT, "transient"),
        ({"mode": "no_result"}, {}, "no verdict: the reviewer ended without a result (exit code 0)", "transient"),
        ({"mode": "die"}, {}, "no verdict: the reviewer ended without a result (killed by signal 9)", "transient"),
        (
            {"mode": "is_error", "result": "tool crashed"},
            {},
            "the reviewer ended with an error (error_during_execution): tool crashed",
            "transient",
        ),
        (
            {"mode": "overspend"},
            {"budget_usd": 0.1},
            "the reviewer ended with an error (error_max_budget_usd): Reached maximum budget ($0.1)",
            "permanent",
        ),
    ],
)
def test_handle_failures(reviewer, step, vkw, reason, error):
    """Only a FAIL the reviewer gave is the work's; the rest could not judge (an ERROR)."""
    v = wait_verdict(reviewer(step, **vkw))
    assert (v.passed, v.reason, v.error) == (False, reason, error)
    if step.get("mode") == "overspend":
        assert v.cost_usd == pytest.approx(0.6)  # what it spent is still counted


def test_handle_timeout_kills_the_reviewer(reviewer):
    h = reviewer({"mode": "hang"}, timeout_s=1.0)  # it would hang for ever: only the timeout ends it
    v = wait_verdict(h)
    assert (v.passed, v.reason, v.error) == (False, "reviewer timed out after 1s", "transient")
    assert h.proc is not None and h.proc.poll() is not None


def test_handle_cannot_start(reviewer):
    v = wait_verdict(reviewer({"result": "PASS"}, exe="/nonexistent/claude"))
    assert not v.passed and v.reason.startswith("cannot start the reviewer: ") and v.error == "permanent"


def test_handle_cancel(reviewer):
    h = reviewer({"mode": "hang"})
    time.sleep(0.2)
    h.cancel()
    assert h.proc is not None and h.proc.poll() is not None and h.fileno() == -1


# --------------------------------------------------------------------------- the CLI


def test_cli_pass_is_done_and_the_review_cost_is_added(fleeter, fake_claude):
    review_task(fleeter, verify=f'agent = "{REVIEW}"\n          model = "claude-haiku-4-5"\n          budget_usd = 0.5')
    fake_claude.script(
        **{
            "greet": [{"actions": [["write", "hello.txt", "hello\n"], ["commit", "add hello"]], "cost": 0.05}],
            "greet:review": [
                {"actions": [["read", "hello.txt"]], "result": "PASS\nhello.txt says hello.", "cost": 0.02}
            ],
        }
    )
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    r.fnmatch_lines(["*greet DONE (attempt 1)*verify_pass", "=== 1 done in *, $0.07 ==="])
    task = fleeter.task("greet")
    assert task.cost_usd == pytest.approx(0.07)
    (v,) = fleeter.ledger().verdicts(task_id=task.id)
    assert (v.kind, v.passed, v.reason, v.cost_usd) == ("agent", True, "PASS", pytest.approx(0.02))
    status = json.loads(fleeter.run("status", "--json").stdout)
    assert status[0]["cost_usd"] == pytest.approx(0.07)
    # what the reviewer was given
    (agent,) = agent_calls(fake_claude)
    (call,) = reviewer_calls(fake_claude)
    assert call["key"] == "greet:review" and call["error"] is None
    assert call["cwd"] == agent["cwd"] == call["env"]["FLEETRUN_WORKTREE"]  # the task's worktree
    assert call["env"]["FLEETRUN_TASK_NAME"] == "greet" and call["env"]["FLEETRUN_TASK_ID"] == task.id
    argv = call["argv"]
    assert argv[:4] == ["-p", "--output-format", "stream-json", "--verbose"]
    assert str(uuid.UUID(opt(argv, "--session-id"))) == opt(argv, "--session-id")
    assert opt(argv, "--session-id") != opt(agent["argv"], "--session-id")
    assert opt(argv, "--permission-mode") == "dontAsk" and opt(argv, "--setting-sources") == "user"
    assert opt(argv, "--tools") == "Read,Grep,Glob"
    assert opt(argv, "--model") == "claude-haiku-4-5" and opt(argv, "--max-budget-usd") == "0.5000"
    assert {"Bash", "Edit", "Write"} <= set(argv[argv.index("--disallowedTools") + 1 :])
    prompt = call["prompt"]
    for part in (
        REVIEW,
        "Write hello.txt saying hello.",
        "hello.txt | 1 +",
        "+hello",
        "Answer with a first line of exactly `PASS` or `FAIL: reason`",
    ):
        assert part in prompt
    adir = fleeter.home / "attempts" / fleeter.ledger().attempts(task.id)[0].id
    assert events(adir / "review-1.jsonl")[-1]["result"] == "PASS\nhello.txt says hello."
    assert (adir / "review-1.prompt").read_text() == prompt
    logs = fleeter.run("logs", "greet")
    logs.fnmatch_lines([f"*PASS verifier 1 (agent: {REVIEW})*($0.02)*"])


def test_cli_fail_retries_with_the_review_in_the_prompt(fleeter, fake_claude):
    review_task(fleeter)
    fake_claude.script(
        **{
            "greet": [
                {"actions": [["write", "hello.txt", "hi\n"], ["commit", "add hi"]], "cost": 0.05},
                {"actions": [["write", "hello.txt", "hello\n"], ["commit", "say hello"]], "cost": 0.05},
            ],
            "greet:review": [
                {"result": "FAIL: hello.txt says hi\nUse the word hello, as the task asks.", "cost": 0.02},
                {"result": "PASS", "cost": 0.02},
            ],
        }
    )
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    r.fnmatch_lines(
        [f"*greet RETRYING (attempt 1)*verify_fail:{REVIEW}*", "*greet DONE (attempt 2)*", "=== 1 done in *, $0.14 ==="]
    )
    first, second = agent_calls(fake_claude)
    assert "hello.txt says hi" not in first["prompt"]
    assert "Verifier `Check that hello.txt says hello.` (agent) failed: hello.txt says hi." in second["prompt"]
    assert "Use the word hello, as the task asks." in second["prompt"]
    review1, review2 = reviewer_calls(fake_claude)
    assert "+hi" in review1["prompt"] and "+hello" in review2["prompt"]
    assert fleeter.task("greet").cost_usd == pytest.approx(0.14)


def test_cli_reviewer_cannot_write_or_run_commands(fleeter, fake_claude):
    """The read-only proof. The user's Claude settings here allow Bash, Write and Edit
    (a wrapper adds --settings, as a permissive ~/.claude/settings.json would): the task
    agent can run a command with them, the reviewer cannot, because of fleetrun's flags."""
    wrapper = fleeter.path / "claude-with-permissive-settings"
    settings = json.dumps({"permissions": {"allow": ["Bash", "Write", "Edit"]}})
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE} \"$@\" --settings '{settings}'\n")
    wrapper.chmod(0o755)
    fleeter.write_config(f'[claude]\nexecutable = "{wrapper}"\n')
    review_task(fleeter)
    fake_claude.script(
        **{
            "greet": [
                {
                    "actions": [
                        ["write", "hello.txt", "hello\n"],
                        ["bash", "touch by-agent.txt"],
                        ["commit", "add hello"],
                    ]
                }
            ],
            "greet:review": [
                {
                    "actions": [
                        ["write", "pwned.txt", "x"],
                        ["bash", "touch pwned2"],
                        ["append", "README.md", "pwned\n"],
                        ["read", "hello.txt"],
                    ],
                    "result": "PASS",
                }
            ],
        }
    )
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    task = fleeter.task("greet")
    assert task.state.value == "DONE"
    repo = fleeter.path / "repo"
    files = fleeter.git(repo, "ls-tree", "-r", "--name-only", task.branch).split()
    assert sorted(files) == ["README.md", "by-agent.txt", "hello.txt"]  # the agent's command ran
    assert fleeter.git(repo, "show", f"{task.branch}:README.md") == "hello\n"
    # the worktree was clean, so it was removed; nothing was written anywhere
    assert not Path(task.worktree).exists()
    assert not [p for root in (fleeter.home, fleeter.path) for p in root.rglob("pwned*")]
    # refused for lack of a tool, not for lack of a permission
    (call,) = reviewer_calls(fake_claude)
    assert opt(call["argv"], "--permission-mode") == "dontAsk"
    adir = fleeter.home / "attempts" / fleeter.ledger().attempts(task.id)[0].id
    evs = events(adir / "review-1.jsonl")
    assert evs[0]["permissionMode"] == "dontAsk" and sorted(evs[0]["tools"]) == ["Glob", "Grep", "Read"]
    results = [b for e in evs if e["type"] == "user" for b in e["message"]["content"]]
    assert [b["is_error"] for b in results] == [True, True, True, False]
    for b, tool in zip(results, ["Write", "Bash", "Edit"]):
        assert f"No such tool available: {tool}" in b["content"]
    assert evs[-1]["permission_denials"] == []  # as the real CLI: a missing tool is no denial


def test_cli_reviewer_without_a_verdict_is_asked_again_then_needs_a_human(fleeter, fake_claude):
    """No verdict is the reviewer's failure, not the work's: it is asked again (a
    transient ERROR), never the agent, then a human."""
    review_task(fleeter)
    fleeter.write_config(
        (fleeter.home / "config.toml").read_text()
        + "\n[fleetrun]\nverifier_error_tries = 2\nverifier_error_backoff_s = 0.05\n"
    )
    fake_claude.script(
        **{
            "greet": [{"actions": [["write", "hello.txt", "hello\n"]]}],
            "greet:review": [{"mode": "no_result"}, {"mode": "no_result"}],
        }
    )
    r = fleeter.run("tasks.toml")
    assert r.ret == 1
    task = fleeter.task("greet")
    assert task.state.value == "NEEDS_HUMAN"
    assert task.reason == (
        f"verifier_error:{REVIEW}: no verdict: the reviewer ended without a result (exit code 0) (tried 2 times)"
    )
    assert fleeter.ledger().verdicts(task_id=task.id) == []
    assert len(agent_calls(fake_claude)) == 1 and len(reviewer_calls(fake_claude)) == 2


def test_cli_task_budget_caps_the_reviewer(fleeter, fake_claude):
    review_task(fleeter, extra="budget_usd = 0.25", verify=f'agent = "{REVIEW}"\n          budget_usd = 1.0')
    fake_claude.script(
        **{
            "greet": [{"actions": [["write", "hello.txt", "hello\n"]], "cost": 0.05}],
            "greet:review": [{"result": "PASS", "cost": 0.02}],
        }
    )
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    (agent,) = agent_calls(fake_claude)
    (call,) = reviewer_calls(fake_claude)
    assert opt(agent["argv"], "--max-budget-usd") == "0.2500"
    assert opt(call["argv"], "--max-budget-usd") == "0.2000"  # 0.25 - 0.05, not the verifier's 1.0


def test_cli_no_review_when_the_task_budget_is_spent(fleeter, fake_claude):
    review_task(fleeter, extra="budget_usd = 0.05")
    fake_claude.script(
        **{
            "greet": [{"actions": [["write", "hello.txt", "hello\n"]], "cost": 0.05}],
            "greet:review": [{"result": "PASS", "cost": 0.02}],
        }
    )
    r = fleeter.run("tasks.toml")
    assert r.ret == 1
    assert reviewer_calls(fake_claude) == []  # nothing more was spent
    task = fleeter.task("greet")
    (v,) = fleeter.ledger().verdicts(task_id=task.id)
    assert v.reason == "no review: the task's budget is spent ($0.05 of $0.05)"
    assert task.state.value == "NEEDS_HUMAN" and task.reason.startswith("budget_exhausted:")
    assert task.cost_usd == pytest.approx(0.05)


def test_a_task_on_a_peer_is_not_reviewed_here():
    from fleetrun.plugins import verify_agent

    task = SimpleNamespace(spec=SimpleNamespace(verify=[], prompt="p", budget_usd=None), cost_usd=0.0)
    v = verify_agent.fleetrun_verify(
        task=task,
        verifier=VerifySpec("agent", REVIEW),
        workspace=SimpleNamespace(path="/on/the/peer"),
        attempt=SimpleNamespace(host="mini", id="a1"),
        config=None,
    )
    assert isinstance(v, Verdict) and not v.passed
    assert v.reason == "an agent verifier runs on this machine; the task's workspace is on mini"

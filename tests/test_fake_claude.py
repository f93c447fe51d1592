"""Tests for the fake claude, the stand-in for the Claude Code CLI: fleetrun/testing/fake_claude/,
run here through its wrapper tests/fakes/claude.

Every test runs the fake as a real subprocess in a tmp dir; the ones that commit run it
in a real git repository.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

FAKE = Path(__file__).parent / "fakes" / "claude"
SJ = ["-p", "--output-format", "stream-json", "--verbose"]


def _git(repo: Path, *args: str) -> str:
    proc = subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)
    return proc.stdout.decode()


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """A plain working directory, for tests that never touch git."""
    path = tmp_path / "repo"
    path.mkdir()
    return path


@pytest.fixture
def repo(work: Path) -> Path:
    """A real git repository with one commit."""
    path = work
    _git(path, "init", "-q")
    _git(path, "config", "user.email", "fake@example.invalid")
    _git(path, "config", "user.name", "Fake")
    _git(path, "config", "commit.gpgsign", "false")
    _git(path, "commit", "-q", "--allow-empty", "-m", "init")
    return path


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("FLEETRUN_", "FAKE_CLAUDE_"))}
    # Resolve `#!/usr/bin/env python3` to this interpreter, not to a slow shim (pyenv).
    bindir = os.path.dirname(sys.executable)
    if os.access(os.path.join(bindir, "python3"), os.X_OK):
        clean["PATH"] = bindir + os.pathsep + clean.get("PATH", os.defpath)
    clean["FAKE_CLAUDE_LOG"] = str(tmp_path / "calls.jsonl")
    clean["FAKE_CLAUDE_STATE"] = str(tmp_path / "state")
    # the user's own ~/.claude/settings.json (and its hooks) stays out of these tests
    clean["CLAUDE_CONFIG_DIR"] = str(tmp_path / "claude-config")
    clean["IS_SANDBOX"] = "1"  # root or not, bypassPermissions is allowed (a test of the refusal unsets it)
    return clean


def scenario(tmp_path: Path, env: dict[str, str], data: dict) -> None:
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps(data))
    env["FAKE_CLAUDE_SCENARIO"] = str(path)


def run(args, cwd, env, stdin: str = "", timeout: float = 10) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(FAKE), *args],
        cwd=cwd,
        env=env,
        input=stdin.encode(),
        capture_output=True,
        timeout=timeout,
    )


#: What the real CLI writes after its JSON lines when it exits (it resets the terminal).
TERMINAL_RESET = "\x1b[<u\x1b[?1004l\x1b[?2004l\x1b[?25h"


def events(proc: subprocess.CompletedProcess) -> list[dict]:
    text = proc.stdout.decode()
    text = text[: -len(TERMINAL_RESET)] if text.endswith(TERMINAL_RESET) else text
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def result_of(proc: subprocess.CompletedProcess) -> dict:
    found = [e for e in events(proc) if e["type"] == "result"]
    assert len(found) == 1, proc.stdout
    return found[0]


def tool_results(evs: list[dict]) -> list[dict]:
    return [
        block for e in evs if e["type"] == "user" for block in e["message"]["content"] if block["type"] == "tool_result"
    ]


def calls(env: dict[str, str]) -> list[dict]:
    path = Path(env["FAKE_CLAUDE_LOG"])
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def commits(repo: Path) -> int:
    return int(_git(repo, "rev-list", "--count", "HEAD").strip())


# --------------------------------------------------------------------------- the CLI contract


def test_is_an_executable_python_script():
    assert os.access(FAKE, os.X_OK)
    assert FAKE.read_text().startswith("#!/usr/bin/env python3\n")
    assert "fleetrun" not in [line.split()[1] for line in FAKE.read_text().splitlines() if line.startswith("import ")]


def test_version_and_help(work, env):
    proc = run(["--version"], work, env)
    assert (proc.returncode, proc.stdout.decode()) == (0, "2.1.332 (Claude Code)\n")
    assert run(["-v"], work, env).stdout == proc.stdout
    help_ = run(["--help"], work, env)
    assert help_.returncode == 0
    assert "--permission-mode <mode>" in help_.stdout.decode()


@pytest.mark.parametrize(
    "args, message",
    [
        (["-p", "--xyz", "hi"], "error: unknown option '--xyz'"),
        (["-p", "--xyz=1", "hi"], "error: unknown option '--xyz=1'"),
        (
            ["-p", "--session-id", "not-a-uuid", "hi"],
            "Error: Invalid session ID. Must be a valid UUID.",
        ),
        (
            ["-p", "--output-format", "stream-json", "hi"],
            "Error: When using --print, --output-format=stream-json requires --verbose",
        ),
        (
            ["-p", "--permission-mode", "yolo", "hi"],
            "error: option '--permission-mode <mode>' argument 'yolo' is invalid. Allowed choices "
            "are acceptEdits, auto, bypassPermissions, manual, dontAsk, plan.",  # measured, 2.1.332
        ),
        (["-p", "--output-format", "xml", "hi"], "argument 'xml' is invalid"),
        (["-p", "--model"], "error: option '--model <model>' argument missing"),
        (["-p", "--max-budget-usd", "lots", "hi"], "error: --max-budget-usd must be a positive number greater than 0"),
        (["-p", "--max-budget-usd", "0", "hi"], "error: --max-budget-usd must be a positive number greater than 0"),
        (
            ["-p", "--max-budget-usd", "0.0000", "hi"],
            "error: --max-budget-usd must be a positive number greater than 0",
        ),
        (["-p", "one", "two"], "error: too many arguments"),
        (["-p", "--resume"], "--resume requires a valid session ID"),
        (["-p", "--settings", "/nonexistent/settings.json", "hi"], "not found"),
        (
            ["-p", "--setting-sources", "user,repo", "hi"],
            "Error processing --setting-sources: Invalid setting source: repo. Valid options are: user, project, local",
        ),
        (["-p", "--setting-sources"], "error: option '--setting-sources <sources>' argument missing"),
        (["-p", "--json-schema", "{not json", "hi"], "Invalid JSON provided to --json-schema"),
        (["-p", "--json-schema", "[1]", "hi"], "--json-schema must be a JSON object"),
        (["-p", "--strict-mcp-config", "--mcp-config", "{}", "--", "hi"], "Invalid MCP configuration"),
    ],
)
def test_strict_option_errors_exit_1(work, env, args, message):
    proc = run(args, work, env)
    assert proc.returncode == 1
    assert message in proc.stderr.decode()
    assert proc.stdout == b""
    [call] = calls(env)
    assert call["error"] and call["n"] is None


def test_no_prompt_is_an_error(work, env):
    proc = run(["-p"], work, env)
    assert proc.returncode == 1
    assert "Input must be provided either through stdin or as a prompt argument" in proc.stderr.decode()


def test_variadic_allowed_tools_swallow_the_prompt_like_commander(work, env):
    # `--allowedTools Read "fix it"` makes "fix it" a tool rule, as the real CLI does.
    proc = run(["-p", "--allowedTools", "Read", "fix it"], work, env)
    assert proc.returncode == 1
    assert "Input must be provided" in proc.stderr.decode()
    ok = run(["-p", "--allowedTools", "Read", "--", "fix it"], work, env)
    assert (ok.returncode, ok.stdout) == (0, b"ok\n")


def test_equals_form_and_interactive_mode(work, env):
    sid = str(uuid.uuid4())
    proc = run(["-p", "--output-format=json", f"--session-id={sid}", "--model=opus", "hi"], work, env)
    assert proc.returncode == 0
    result = json.loads(proc.stdout)
    assert (result["session_id"], result["result"]) == (sid, "ok")
    assert list(result["modelUsage"]) == ["claude-opus-5-5"]  # the alias resolved, as measured
    assert run(["hi"], work, env).returncode == 1  # no -p: no TUI in the fake


def test_prompt_from_argument_and_stdin_is_logged(work, env):
    env["FLEETRUN_TASK_NAME"] = "t1"
    env["FLEETRUN_ATTEMPT"] = "2"
    assert run(["-p", "from argv"], work, env).returncode == 0
    assert run(["-p", "--output-format", "text"], work, env, stdin="from\nstdin\n").returncode == 0
    first, second = calls(env)
    assert first["argv"] == ["-p", "from argv"]
    assert first["prompt"] == "from argv"
    assert second["prompt"] == "from\nstdin\n"
    assert first["cwd"] == str(work)
    assert first["env"] == {"FLEETRUN_TASK_NAME": "t1", "FLEETRUN_ATTEMPT": "2"}
    assert first["key"] == "default"
    assert (first["n"], second["n"]) == (1, 2)
    assert first["pid"] != second["pid"]
    assert uuid.UUID(first["session_id"])


def test_without_scenario_replies_ok(work, env):
    proc = run(["-p", "--output-format", "json", "hi"], work, env)
    result = json.loads(proc.stdout)
    assert (proc.returncode, result["result"], result["total_cost_usd"]) == (0, "ok", 0.01)
    assert result["is_error"] is False and result["subtype"] == "success"


# --------------------------------------------------------------------------- stream-json


def test_stream_json_shapes_and_order(tmp_path, repo, env):
    scenario(
        tmp_path,
        env,
        {
            "default": [
                {
                    "actions": [["print", "working"], ["write", "a.txt", "A\n"], ["read", "a.txt"]],
                    "result": "all done",
                    "cost": 0.25,
                }
            ]
        },
    )
    sid = str(uuid.uuid4())
    proc = run(
        [*SJ, "--session-id", sid, "--permission-mode", "acceptEdits", "--model", "sonnet", "go"],
        repo,
        env,
    )
    assert proc.returncode == 0, proc.stderr
    evs = events(proc)
    assert [e["type"] for e in evs] == [
        "system",
        "assistant",
        "assistant",
        "user",
        "assistant",
        "user",
        "assistant",
        "result",
    ]
    init = evs[0]
    assert init["subtype"] == "init"
    assert (init["cwd"], init["session_id"], init["model"]) == (str(repo), sid, "claude-sonnet-5-5")
    assert init["permissionMode"] == "acceptEdits"
    assert {"Read", "Write", "Edit", "Bash"} <= set(init["tools"])
    assert all(e["session_id"] == sid for e in evs)
    assert evs[1]["message"]["content"] == [{"type": "text", "text": "working"}]
    use = evs[2]["message"]["content"][0]
    assert use["type"] == "tool_use" and use["name"] == "Write"
    assert use["input"] == {"file_path": str(repo / "a.txt"), "content": "A\n"}
    res = evs[3]["message"]["content"][0]
    assert res["tool_use_id"] == use["id"] and res["is_error"] is False
    assert evs[5]["message"]["content"][0]["content"] == "1\tA"  # measured: no arrow, no padding
    assert evs[6]["message"]["content"] == [{"type": "text", "text": "all done"}]
    result = evs[-1]
    assert result["subtype"] == "success" and result["is_error"] is False
    assert (result["result"], result["total_cost_usd"], result["num_turns"]) == (
        "all done",
        0.25,
        4,
    )
    assert result["permission_denials"] == []
    for field in ("duration_ms", "duration_api_ms", "usage"):
        assert field in result
    assert (repo / "a.txt").read_text() == "A\n"


def test_json_and_text_formats_print_only_the_result(tmp_path, work, env):
    scenario(tmp_path, env, {"default": [{"actions": [["print", "chatter"]], "result": "final"}]})
    js = run(["-p", "--output-format", "json", "go"], work, env)
    assert len(js.stdout.splitlines()) == 1
    assert json.loads(js.stdout)["result"] == "final"
    text = run(["-p", "go"], work, env)
    assert text.stdout == b"final\n"


# --------------------------------------------------------------------------- scenarios


def test_steps_follow_invocations_per_task(tmp_path, work, env):
    scenario(
        tmp_path,
        env,
        {
            "t1": [{"result": "one"}, {"result": "two"}],
            "default": [{"result": "d"}],
        },
    )

    def reply(task):
        e = dict(env)
        if task:
            e["FLEETRUN_TASK_NAME"] = task
        return run(["-p", "go"], work, e).stdout.decode().strip()

    assert [reply("t1"), reply("t1"), reply("t1")] == ["one", "two", "two"]
    assert [reply(None), reply("other"), reply(None)] == ["d", "d", "d"]
    assert [c["key"] for c in calls(env)] == ["t1"] * 3 + ["default"] * 3
    assert [c["n"] for c in calls(env)] == [1, 2, 3, 1, 2, 3]


def test_a_verifier_gets_the_review_key_when_the_scenario_has_one(tmp_path, work, env):
    scenario(
        tmp_path,
        env,
        {
            "t1": [{"result": "one"}, {"result": "two"}],
            "t1:review": [{"result": "PASS first review"}, {"result": "FAIL: second"}],
            "t2": [{"result": "t2 work"}],
        },
    )

    def reply(task, verifier=False):
        e = dict(env, FLEETRUN_TASK_NAME=task)
        if verifier:
            e["FLEETRUN_VERIFIER"] = "agent"
        return run(["-p", "go"], work, e).stdout.decode().strip()

    assert reply("t1") == "one"
    assert reply("t1", verifier=True) == "PASS first review"
    assert reply("t1") == "two"  # the reviewer did not use up a step of the task
    assert reply("t1", verifier=True) == "FAIL: second"
    # no "t2:review" key: a verifier falls back to the task's own steps and counter
    assert reply("t2", verifier=True) == "t2 work"
    assert [(c["key"], c["n"]) for c in calls(env)] == [
        ("t1", 1),
        ("t1:review", 1),
        ("t1", 2),
        ("t1:review", 2),
        ("t2", 1),
    ]
    assert calls(env)[1]["env"]["FLEETRUN_VERIFIER"] == "agent"


def test_counter_is_safe_under_concurrency(tmp_path, work, env):
    scenario(tmp_path, env, {"default": [{"result": "x"}]})
    procs = [
        subprocess.Popen(
            [str(FAKE), "-p", "go"],
            cwd=work,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(6)
    ]
    for p in procs:
        assert p.wait(timeout=10) == 0
    assert sorted(c["n"] for c in calls(env)) == [1, 2, 3, 4, 5, 6]


def test_is_error_mode(tmp_path, work, env):
    scenario(tmp_path, env, {"default": [{"mode": "is_error", "result": "it broke"}]})
    proc = run([*SJ, "go"], work, env)
    result = result_of(proc)
    assert proc.returncode == 1
    assert (result["subtype"], result["is_error"]) == ("error_during_execution", True)
    assert result["errors"] == ["it broke"]


def test_exit_code_mode_and_exit_override(tmp_path, work, env):
    scenario(tmp_path, env, {"default": [{"mode": "exit_code", "exit": 3}, {"exit": 7}]})
    first = run([*SJ, "go"], work, env)
    assert first.returncode == 3 and result_of(first)["is_error"] is False
    assert run([*SJ, "go"], work, env).returncode == 7


def test_no_result_exits_0_without_result_event(tmp_path, work, env):
    scenario(tmp_path, env, {"default": [{"mode": "no_result", "actions": [["print", "hm"]]}]})
    proc = run([*SJ, "go"], work, env)
    assert proc.returncode == 0
    assert [e["type"] for e in events(proc)] == ["system", "assistant"]
    assert run(["-p", "--output-format", "json", "go"], work, env).stdout == b""


def test_die_is_killed_by_sigkill_and_logged(tmp_path, repo, env):
    scenario(tmp_path, env, {"default": [{"mode": "die", "actions": [["write", "w.txt", "x"]]}]})
    proc = run([*SJ, "--dangerously-skip-permissions", "go"], repo, env)
    assert proc.returncode == -signal.SIGKILL
    assert "result" not in [e["type"] for e in events(proc)]
    assert (repo / "w.txt").exists()
    assert calls(env)[0]["n"] == 1


def test_hang_prints_nothing_more(tmp_path, work, env):
    scenario(tmp_path, env, {"default": [{"mode": "hang", "actions": [["print", "before"]]}]})
    proc = subprocess.Popen([str(FAKE), *SJ, "go"], cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            proc.communicate(timeout=0.6)
    finally:
        proc.kill()
        out, _ = proc.communicate()
    lines = [json.loads(line) for line in out.decode().splitlines()]
    assert [e["type"] for e in lines] == ["system", "assistant"]


def test_stall_delays_the_result(tmp_path, work, env):
    scenario(tmp_path, env, {"default": [{"stall": 0.3}]})
    proc = run([*SJ, "go"], work, env)
    assert result_of(proc)["duration_ms"] >= 300


def test_usage_limit_shape(tmp_path, work, env):
    reset = 1_900_000_000
    scenario(
        tmp_path,
        env,
        {
            "default": [
                {"mode": "usage_limit", "reset_at": reset},
                {"mode": "usage_limit", "reset_at": reset, "limit_style": "legacy"},
                {"mode": "usage_limit", "reset_at": reset},
            ]
        },
    )
    env["TZ"] = "UTC"
    proc = run([*SJ, "go"], work, env)
    assert proc.returncode == 1
    evs = events(proc)
    [limit] = [e for e in evs if e["type"] == "rate_limit_event"]
    assert limit["rate_limit_info"]["status"] == "rejected"
    assert limit["rate_limit_info"]["resetsAt"] == reset
    [synthetic] = [e for e in evs if e["type"] == "assistant"]
    assert (synthetic["message"]["model"], synthetic["error"]) == ("<synthetic>", "rate_limit")
    result = result_of(proc)
    assert (result["subtype"], result["is_error"], result["api_error_status"], result["errors"]) == (
        "success",
        True,
        429,
        None,
    )
    # 1_900_000_000 is 2030-03-17 17:46:40 UTC; 2.1.332 names the 5-hour limit
    assert result["result"] == "You've hit your 5-hour limit \u00b7 resets Mar 17, 5:46pm (UTC)"
    legacy = run(["-p", "--output-format", "json", "go"], work, env)
    assert legacy.returncode == 1
    assert json.loads(legacy.stdout)["result"] == f"Claude AI usage limit reached|{reset}"
    env["FAKE_CLAUDE_VERSION"] = "2.1.197"
    old = result_of(run([*SJ, "go"], work, env))
    assert old["result"] == "You've hit your session limit \u00b7 resets Mar 17, 5:46pm (UTC)"


def test_rate_limit_without_a_reset_time(tmp_path, work, env):
    scenario(tmp_path, env, {"default": [{"mode": "rate_limit"}, {"mode": "rate_limit", "auth": "oauth"}]})
    # with an API key: a 429, no rate_limit_event, no reset time
    proc = run([*SJ, "go"], work, env)
    result = result_of(proc)
    assert proc.returncode == 1
    assert (result["subtype"], result["is_error"], result["api_error_status"]) == ("success", True, 429)
    assert result["result"].startswith("API Error: Request rejected (429) \u00b7 ")
    assert "rate_limit_event" not in [e["type"] for e in events(proc)]
    # with a subscription but without the unified headers: an event without resetsAt
    proc = run([*SJ, "go"], work, env)
    result = result_of(proc)
    assert result["result"] == "API Error: Server is temporarily limiting requests (not your usage limit)"
    [limit] = [e for e in events(proc) if e["type"] == "rate_limit_event"]
    assert limit["rate_limit_info"]["status"] == "rejected" and "resetsAt" not in limit["rate_limit_info"]


@pytest.mark.parametrize("status", [500, 529])
def test_api_error_shape(tmp_path, work, env, status):
    scenario(tmp_path, env, {"default": [{"mode": "api_error", "status": status}]})
    proc = run([*SJ, "go"], work, env)
    assert proc.returncode == 1
    [synthetic] = [e for e in events(proc) if e["type"] == "assistant"]
    assert (synthetic["message"]["model"], synthetic["error"]) == ("<synthetic>", "server_error")
    result = result_of(proc)
    assert (result["subtype"], result["is_error"], result["api_error_status"], result["errors"]) == (
        "success",
        True,
        status,
        None,
    )
    assert result["result"].startswith(f"API Error: {status} ")
    assert "This is a server-side issue" in result["result"]
    assert "rate_limit_event" not in [e["type"] for e in events(proc)]
    # the CLI's retries before it gives up (from its code: a real 5xx cannot be had offline)
    retries = [e for e in events(proc) if e.get("subtype") == "api_retry"]
    assert [(e["attempt"], e["max_retries"], e["error_status"]) for e in retries] == [
        (n, 10, status) for n in range(1, 11)
    ]
    assert {e["error"] for e in retries} == {"overloaded" if status == 529 else "server_error"}


def test_overspend_stops_at_the_budget(tmp_path, work, env):
    scenario(tmp_path, env, {"default": [{"mode": "overspend"}]})
    proc = run([*SJ, "--max-budget-usd", "1", "go"], work, env)
    result = result_of(proc)
    assert proc.returncode == 1
    assert (result["subtype"], result["is_error"]) == ("error_max_budget_usd", True)
    assert result["total_cost_usd"] == 1.5
    assert result["errors"] == ["Reached maximum budget ($1)"]
    # Without a budget there is nothing to exceed.
    assert result_of(run([*SJ, "go"], work, env))["subtype"] == "success"


def test_any_cost_over_the_budget_trips_the_breaker(tmp_path, work, env):
    scenario(tmp_path, env, {"default": [{"cost": 0.75}]})
    assert result_of(run([*SJ, "--max-budget-usd", "0.5", "go"], work, env))["subtype"] == ("error_max_budget_usd")
    assert result_of(run([*SJ, "--max-budget-usd", "2", "go"], work, env))["subtype"] == "success"


@pytest.mark.parametrize("version", ["2.1.197", "2.1.332"])
def test_the_turn_that_crosses_the_budget_is_paid_and_cut_off(tmp_path, work, env, version):
    env["FAKE_CLAUDE_VERSION"] = version
    # three turns of $0.30: the second crosses $0.5, during its Write
    scenario(tmp_path, env, {"default": [{"cost": 0.9, "actions": [["write", "a.txt", "A"], ["write", "b.txt", "B"]]}]})
    proc = run([*SJ, "--dangerously-skip-permissions", "--max-budget-usd", "0.5", "go"], work, env)
    assert proc.returncode == 1
    result = result_of(proc)
    assert (result["subtype"], result["is_error"], result["stop_reason"]) == ("error_max_budget_usd", True, "tool_use")
    assert result["errors"] == ["Reached maximum budget ($0.5)"]
    assert result["total_cost_usd"] == pytest.approx(0.6)  # more than the cap
    assert result.get("terminal_reason") == (None if version == "2.1.197" else "budget_exhausted")
    assert (work / "a.txt").read_text() == "A"
    assert not (work / "b.txt").exists()
    [tmp] = [p.name for p in work.iterdir() if p.name.startswith("b.txt.tmp.")]
    pid, hexpart = tmp.split(".")[3:]  # FILE.tmp.PID.HEX
    assert pid.isdigit() and int(hexpart, 16) >= 0


def test_version_is_selectable(work, env):
    env["FAKE_CLAUDE_VERSION"] = "2.1.197"
    assert run(["--version"], work, env).stdout.decode() == "2.1.197 (Claude Code)\n"
    init = events(run([*SJ, "go"], work, env))[0]
    assert init["claude_code_version"] == "2.1.197"
    env["FAKE_CLAUDE_VERSION"] = "3.0"
    assert run(["--version"], work, env).returncode == 70  # a test that asks for neither


def test_tool_not_enabled_wording_in_2_1_197(tmp_path, work, env):
    env["FAKE_CLAUDE_VERSION"] = "2.1.197"
    scenario(tmp_path, env, {"default": [{"actions": [["write", "a.txt", "A"]]}]})
    proc = run([*SJ, "--tools", "Read", "--dangerously-skip-permissions", "--", "go"], work, env)
    [res] = tool_results(events(proc))
    assert res["content"] == (
        "<tool_use_error>Error: No such tool available: Write. Write exists but is "
        "not enabled in this context.</tool_use_error>"
    )
    assert denials(proc) == []


def test_2_1_197_wants_a_file_read_before_it_is_written(tmp_path, work, env):
    env["FAKE_CLAUDE_VERSION"] = "2.1.197"
    (work / "old.txt").write_text("old\n")
    (work / "log.txt").write_text("log\n")
    scenario(
        tmp_path,
        env,
        {
            "default": [
                {
                    "actions": [
                        ["write", "old.txt", "new"],
                        ["append", "log.txt", "more"],
                        ["read", "old.txt"],
                        ["write", "old.txt", "new"],
                        ["write", "fresh.txt", "f"],
                    ]
                }
            ]
        },
    )
    proc = run([*SJ, "--dangerously-skip-permissions", "go"], work, env)
    over, edit, read, again, fresh = tool_results(events(proc))
    refusal = "<tool_use_error>File has not been read yet. Read it first before writing to it.</tool_use_error>"
    assert (over["is_error"], over["content"]) == (True, refusal)
    assert (edit["is_error"], edit["content"]) == (True, refusal)
    assert read["content"] == "1\told"
    assert again["is_error"] is False and (work / "old.txt").read_text() == "new"
    assert (work / "log.txt").read_text() == "log\n"
    assert fresh["content"] == (
        f"File created successfully at: {work / 'fresh.txt'} (file state is current "
        "in your context \u2014 no need to Read it back)"
    )
    assert denials(proc) == []
    # 2.1.332 writes over it
    env["FAKE_CLAUDE_VERSION"] = "2.1.332"
    (work / "old.txt").write_text("old\n")
    scenario(tmp_path, env, {"default": [{"actions": [["write", "old.txt", "new"]]}]})
    run([*SJ, "--dangerously-skip-permissions", "go"], work, env)
    assert (work / "old.txt").read_text() == "new"


@pytest.mark.parametrize("command", ["touch t.txt", "mkdir -p d/e", "echo x > f.txt"])
def test_accept_edits_runs_simple_file_commands(tmp_path, work, env, command):
    scenario(tmp_path, env, {"default": [{"actions": [["bash", command]]}]})
    proc = run([*SJ, "--permission-mode", "acceptEdits", "go"], work, env)
    [res] = tool_results(events(proc))
    assert res["is_error"] is False and denials(proc) == []
    assert any(work.iterdir())
    # outside the working directory, or in default mode, it still asks
    scenario(tmp_path, env, {"default": [{"actions": [["bash", f"touch {tmp_path}/out.txt"]]}]})
    assert denials(run([*SJ, "--permission-mode", "acceptEdits", "go"], work, env))
    scenario(tmp_path, env, {"default": [{"actions": [["bash", command]]}]})
    assert denials(run([*SJ, "go"], work, env))


def test_2_1_197_warns_about_deny_rules_that_match_no_tool(work, env):
    args = [*SJ, "--disallowedTools", "MultiEdit", "SlashCommand", "Bash", "--", "go"]
    assert run(args, work, env).stderr == b""
    env["FAKE_CLAUDE_VERSION"] = "2.1.197"
    err = run(args, work, env).stderr.decode()
    assert err == (
        'Permission deny rule "MultiEdit" matches no known tool \u2014 check for typos.\n'
        'Permission deny rule "SlashCommand" matches no known tool \u2014 check for typos.\n'
    )


def test_terminal_escapes_follow_the_json_lines(work, env):
    out = run([*SJ, "go"], work, env).stdout.decode()
    assert out.endswith("}\n" + TERMINAL_RESET)


def test_default_model_is_an_opus_model(work, env):
    init = events(run([*SJ, "go"], work, env))[0]
    assert init["model"].startswith("claude-opus-")


def test_post_tool_use_hooks_run(tmp_path, work, env):
    seen = tmp_path / "post.jsonl"
    (work / ".claude").mkdir()
    (work / ".claude" / "settings.json").write_text(
        json.dumps(
            {
                "hooks": {
                    "PostToolUse": [
                        {
                            "matcher": "Write",
                            "hooks": [{"type": "command", "command": f"cat >> {seen}; echo >> {seen}"}],
                        }
                    ]
                }
            }
        )
    )
    scenario(tmp_path, env, {"default": [{"actions": [["write", "a.txt", "A"], ["read", "a.txt"]]}]})
    run([*SJ, "--dangerously-skip-permissions", "go"], work, env)
    [payload] = [json.loads(line) for line in seen.read_text().splitlines() if line.strip()]
    assert (payload["hook_event_name"], payload["tool_name"]) == ("PostToolUse", "Write")
    assert payload["tool_input"]["file_path"] == str(work / "a.txt")
    # the project's source left out: no hook
    seen.unlink()
    run([*SJ, "--dangerously-skip-permissions", "--setting-sources", "user", "go"], work, env)
    assert not seen.exists()


def test_max_turns(tmp_path, work, env):
    acts = [["write", f"f{i}.txt", "x"] for i in range(3)]
    scenario(tmp_path, env, {"default": [{"actions": acts}]})
    proc = run([*SJ, "--max-turns", "2", "--permission-mode", "acceptEdits", "go"], work, env)
    result = result_of(proc)
    assert proc.returncode == 1
    assert (result["subtype"], result["is_error"]) == ("error_max_turns", True)
    assert [p.name for p in sorted(work.glob("f*.txt"))] == ["f0.txt", "f1.txt"]


def test_bad_scenario_is_a_loud_test_error(tmp_path, work, env):
    scenario(tmp_path, env, {"default": [{"mode": "explode"}]})
    proc = run(["-p", "go"], work, env)
    assert proc.returncode == 70
    assert "unknown mode" in proc.stderr.decode()


# --------------------------------------------------------------------------- permissions


def denials(proc) -> list[dict]:
    return result_of(proc)["permission_denials"]


@pytest.fixture
def writes_a(tmp_path, env):
    scenario(tmp_path, env, {"default": [{"actions": [["write", "a.txt", "A"]]}]})


@pytest.mark.parametrize(
    "flags",
    [
        ["--permission-mode", "acceptEdits"],
        ["--permission-mode", "bypassPermissions"],
        ["--dangerously-skip-permissions"],
        ["--allowedTools", "Write"],
        ["--allowedTools", "Edit"],
        ["--permission-mode", "auto"],
    ],
)
def test_write_allowed(work, env, writes_a, flags):
    proc = run([*SJ, *flags, "--", "go"], work, env)
    assert (work / "a.txt").read_text() == "A"
    assert denials(proc) == []


@pytest.mark.parametrize(
    "flags, message",
    [
        ([], "Claude requested permissions to write to {path}, but you haven't granted it yet."),
        (["--permission-mode", "plan", "--allowedTools", "Write"], "Cannot write to {path} while in plan mode."),
        (["--permission-mode", "dontAsk"], "running in don't ask mode"),
        (
            ["--permission-mode", "acceptEdits", "--disallowedTools", "Write(a.txt)"],
            "Permission to use Write has been denied.",
        ),
    ],
)
def test_write_denied(work, env, writes_a, flags, message):
    proc = run([*SJ, *flags, "--", "go"], work, env)
    assert proc.returncode == 0
    assert not (work / "a.txt").exists()
    [denial] = denials(proc)
    assert denial["tool_name"] == "Write"
    assert denial["tool_input"]["file_path"] == str(work / "a.txt")
    [res] = tool_results(events(proc))
    assert res["is_error"] is True and res["tool_use_id"] == denial["tool_use_id"]
    assert message.format(path=work / "a.txt") in res["content"]


def test_accept_edits_stays_inside_the_working_directories(tmp_path, work, env):
    outside = tmp_path / "outside.txt"
    scenario(tmp_path, env, {"default": [{"actions": [["write", str(outside), "x"]]}]})
    proc = run([*SJ, "--permission-mode", "acceptEdits", "go"], work, env)
    assert not outside.exists() and len(denials(proc)) == 1
    run([*SJ, "--permission-mode", "acceptEdits", "--add-dir", str(tmp_path), "--", "go"], work, env)
    assert outside.exists()


@pytest.fixture
def commits_b(tmp_path, env):
    scenario(tmp_path, env, {"default": [{"actions": [["write", "b.txt", "B"], ["commit", "add b"]]}]})


@pytest.mark.parametrize(
    "flags",
    [
        ["--dangerously-skip-permissions"],
        [
            "--permission-mode",
            "acceptEdits",
            "--allowedTools",
            "Bash(git add:*)",
            "Bash(git commit:*)",
        ],
        [
            "--permission-mode",
            "acceptEdits",
            "--allowedTools",
            "Bash(git add:*),Bash(git commit:*)",
        ],
        ["--permission-mode", "acceptEdits", "--allowedTools", "Bash"],
        ["--allowedTools", "Write Bash(git *)"],
    ],
)
def test_commit_allowed(repo, env, commits_b, flags):
    proc = run([*SJ, *flags, "--", "go"], repo, env)
    assert denials(proc) == []
    assert commits(repo) == 2
    assert _git(repo, "log", "-1", "--format=%s").strip() == "add b"


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--permission-mode", "acceptEdits"],
            "Claude requested permissions to use Bash, but you haven't granted it yet.",
        ),
        (
            ["--permission-mode", "acceptEdits", "--allowedTools", "Bash(git commit:*)"],
            "The following parts require approval: git add -A",
        ),
        (
            ["--permission-mode", "acceptEdits", "--allowedTools", "Bash(git add:*)"],
            "The following parts require approval: git commit",
        ),
        (
            ["--permission-mode", "acceptEdits", "--allowedTools", "Bash(git commit)"],
            "haven't granted it yet",
        ),
        (
            ["--dangerously-skip-permissions", "--disallowedTools", "Bash(git commit:*)"],
            "Permission to use Bash with command git add -A && git commit",
        ),
    ],
)
def test_commit_denied(repo, env, commits_b, flags, message):
    proc = run([*SJ, *flags, "--", "go"], repo, env)
    [denial] = denials(proc)
    assert denial["tool_name"] == "Bash"
    assert denial["tool_input"]["command"].startswith("git add -A && git commit")
    assert message in tool_results(events(proc))[-1]["content"]
    assert commits(repo) == 1
    assert _git(repo, "diff", "--cached", "--name-only") == ""  # `git add` did not run either


def test_bash_runs_only_when_permitted(tmp_path, repo, env):
    scenario(tmp_path, env, {"default": [{"actions": [["bash", "echo hi > out.txt && echo said"]]}]})
    proc = run([*SJ, "go"], repo, env)
    assert not (repo / "out.txt").exists() and len(denials(proc)) == 1
    proc = run([*SJ, "--allowedTools", "Bash(echo:*)", "--", "go"], repo, env)
    assert (repo / "out.txt").read_text() == "hi\n"
    assert tool_results(events(proc))[0]["content"] == "said"


def test_failing_bash_command_is_an_error_result(tmp_path, repo, env):
    scenario(tmp_path, env, {"default": [{"actions": [["bash", "echo oops; exit 4"]]}]})
    proc = run([*SJ, "--dangerously-skip-permissions", "go"], repo, env)
    [res] = tool_results(events(proc))
    assert res["is_error"] is True and res["content"] == "Exit code 4\noops"
    assert denials(proc) == []


def test_disallowed_beats_allowed_and_modes(work, env, writes_a):
    proc = run(
        [
            *SJ,
            "--allowedTools",
            "Write",
            "--disallowedTools",
            "Write",
            "--permission-mode",
            "bypassPermissions",
            "--",
            "go",
        ],
        work,
        env,
    )
    assert "Write" not in events(proc)[0]["tools"]
    assert not (work / "a.txt").exists()
    # a bare deny rule removes the tool: calling it is no permission denial (measured)
    assert denials(proc) == []
    [res] = tool_results(events(proc))
    assert res["is_error"] and "No such tool available: Write" in res["content"]


def test_tools_restricts_what_exists(tmp_path, work, env):
    (work / "r.txt").write_text("R\n")
    scenario(tmp_path, env, {"default": [{"actions": [["read", "r.txt"], ["write", "a.txt", "A"]]}]})
    proc = run([*SJ, "--tools", "Read,Grep", "--dangerously-skip-permissions", "--", "go"], work, env)
    evs = events(proc)
    assert evs[0]["tools"] == ["Grep", "Read"]  # measured: sorted
    read, write = tool_results(evs)
    assert read["is_error"] is False and "R" in read["content"]
    assert write["is_error"] is True and write["content"] == (
        "<tool_use_error>Error: No such tool available: Write. Write exists but is disabled for "
        "this session, in subagents as well as here.</tool_use_error>"
    )
    assert not (work / "a.txt").exists()
    assert denials(proc) == []  # measured: a tool that is not there is not a denial
    assert events(run([*SJ, "--tools", "", "--", "go"], work, env))[0]["tools"] == []


def test_read_never_needs_permission(tmp_path, work, env):
    (work / "r.txt").write_text("R\n")
    scenario(tmp_path, env, {"default": [{"actions": [["read", "r.txt"]]}]})
    for mode in ("default", "plan", "dontAsk"):
        proc = run([*SJ, "--permission-mode", mode, "go"], work, env)
        assert denials(proc) == [] and tool_results(events(proc))[0]["is_error"] is False


def test_settings_permissions_count_as_rules(tmp_path, work, env, writes_a):
    settings = json.dumps({"permissions": {"allow": ["Write"]}})
    proc = run([*SJ, "--settings", settings, "go"], work, env)
    assert denials(proc) == [] and (work / "a.txt").exists()


# --------------------------------------------------------------------------- sessions


def test_resume_and_session_ids(work, env):
    sid = str(uuid.uuid4())
    assert run([*SJ, "--session-id", sid, "one"], work, env).returncode == 0
    again = run([*SJ, "--session-id", sid, "two"], work, env)
    assert again.returncode == 1 and f"Session ID {sid} is already in use" in again.stderr.decode()
    resumed = run([*SJ, "--resume", sid, "three"], work, env)
    assert result_of(resumed)["session_id"] == sid
    assert calls(env)[-1]["prompt"] == "three"
    assert calls(env)[-1]["conversation"] == ["one"]  # a resume sends the earlier conversation
    assert result_of(run([*SJ, "--continue", "four"], work, env))["session_id"] == sid
    gone = str(uuid.uuid4())
    unknown = run([*SJ, "-r", gone, "five"], work, env)
    assert unknown.returncode == 1
    # measured: a result event, not only a line on stderr
    res = result_of(unknown)
    assert (res["subtype"], res["is_error"]) == ("error_during_execution", True)
    assert res["errors"] == [f"No conversation found with session ID: {gone}"]
    both = run([*SJ, "--resume", sid, "--session-id", str(uuid.uuid4()), "six"], work, env)
    assert both.returncode == 1 and "--fork-session" in both.stderr.decode()
    forked_id = str(uuid.uuid4())
    forked = run([*SJ, "--resume", sid, "--fork-session", "--session-id", forked_id, "seven"], work, env)
    assert result_of(forked)["session_id"] == forked_id


def test_resume_swallows_a_following_prompt_like_commander(work, env):
    # `-r` takes an optional value: `claude -p -r "fix it"` asks for session "fix it".
    proc = run(["-p", "-r", "fix it"], work, env, stdin="the prompt")
    assert proc.returncode == 1
    assert "No conversation found with session ID: fix it" in proc.stderr.decode()


def test_stream_json_input(work, env):
    line = {
        "type": "user",
        "message": {"role": "user", "content": [{"type": "text", "text": "hi"}]},
    }
    args = ["-p", "--input-format", "stream-json", "--output-format", "stream-json", "--verbose"]
    proc = run(args, work, env, stdin=json.dumps(line) + "\n")
    assert result_of(proc)["result"] == "ok"
    assert calls(env)[-1]["prompt"] == "hi"
    bad = run(["-p", "--input-format", "stream-json"], work, env, stdin=json.dumps(line))
    assert bad.returncode == 1 and "requires output-format=stream-json" in bad.stderr.decode()


# --------------------------------------------------------------------------- settings, hooks, models


def hook_settings(marker_dir: Path, events_: tuple[str, ...] = ("SessionStart", "Stop"), tag: str = "project") -> str:
    """Settings whose hooks append "<event> <tag>" and their stdin to files in marker_dir."""
    hooks = {}
    for ev in events_:
        cmd = f"cat > {marker_dir}/{ev}-{tag}.json; echo {ev} {tag} >> {marker_dir}/ran"
        hooks[ev] = [{"matcher": "", "hooks": [{"type": "command", "command": cmd}]}]
    return json.dumps({"hooks": hooks})


def ran(marker_dir: Path) -> list[str]:
    path = marker_dir / "ran"
    return path.read_text().splitlines() if path.exists() else []


@pytest.fixture
def hooked(tmp_path, work, env):
    """A working directory whose project, local and user settings all have hooks."""
    marks = tmp_path / "marks"
    marks.mkdir()
    (work / ".claude").mkdir()
    (work / ".claude" / "settings.json").write_text(hook_settings(marks, tag="project"))
    (work / ".claude" / "settings.local.json").write_text(hook_settings(marks, tag="local"))
    user = Path(env["CLAUDE_CONFIG_DIR"])
    user.mkdir()
    (user / "settings.json").write_text(hook_settings(marks, tag="user"))
    return marks


def test_hooks_of_every_source_run_by_default(tmp_path, work, env, hooked):
    sid = str(uuid.uuid4())
    proc = run([*SJ, "--session-id", sid, "go"], work, env)
    assert proc.returncode == 0 and result_of(proc)["result"] == "ok"
    assert ran(hooked) == [
        "SessionStart user",
        "SessionStart project",
        "SessionStart local",
        "Stop user",
        "Stop project",
        "Stop local",
    ]
    start = json.loads((hooked / "SessionStart-project.json").read_text())
    assert start["session_id"] == sid and start["cwd"] == str(work)
    assert start["hook_event_name"] == "SessionStart" and start["source"] == "startup"
    assert start["transcript_path"].endswith(sid + ".jsonl")
    stop = json.loads((hooked / "Stop-local.json").read_text())
    assert (stop["hook_event_name"], stop["stop_hook_active"], stop["last_assistant_message"]) == ("Stop", False, "ok")
    (call,) = calls(env)
    assert call["setting_sources"] == ["user", "project", "local"]
    assert [h["event"] for h in call["hooks"]] == ["SessionStart"] * 3


def test_a_session_reads_the_project_and_local_settings_of_the_folder_it_started_in_only(work, env, hooked):
    """As the real CLI (issue 22): started in a folder below, a session runs none of the
    hooks of its parent folder's ``.claude/`` (the user's still run). fleetrun's check of
    whether a role's session can receive (``mailbox/receiving.py``) reads the same files."""
    below = work / "src"
    below.mkdir()
    proc = run([*SJ, "go"], below, env)
    assert proc.returncode == 0
    assert ran(hooked) == ["SessionStart user", "Stop user"]


@pytest.mark.parametrize(
    "sources, expect",
    [
        ("user", ["user"]),
        ("project", ["project"]),
        ("user,local", ["user", "local"]),
        ("", []),
    ],
)
def test_setting_sources_choose_whose_hooks_run(work, env, hooked, sources, expect):
    proc = run([*SJ, "--setting-sources", sources, "go"], work, env)
    assert proc.returncode == 0
    assert ran(hooked) == [f"SessionStart {t}" for t in expect] + [f"Stop {t}" for t in expect]


def test_project_settings_permissions_count_unless_the_source_is_off(work, env, writes_a):
    (work / ".claude").mkdir()
    (work / ".claude" / "settings.json").write_text(json.dumps({"permissions": {"allow": ["Write"]}}))
    off = run([*SJ, "--setting-sources", "user", "go"], work, env)
    assert [d["tool_name"] for d in denials(off)] == ["Write"] and not (work / "a.txt").exists()
    on = run([*SJ, "go"], work, env)
    assert denials(on) == [] and (work / "a.txt").exists()


REPORT = "mytool mailbox done task_abc --summary wrote"


@pytest.mark.parametrize(
    "where, allowed",
    [
        ("project", False),  # measured: a Bash rule in .claude/settings.json does not count in -p mode
        ("local", True),
        ("user", True),
        ("flag", True),
        (None, False),
    ],
)
def test_a_bash_allow_rule_counts_from_the_local_and_user_settings_only(tmp_path, work, env, where, allowed):
    """Issue 13, measured with the real CLI: under acceptEdits in -p mode, an allow rule
    ``Bash(fleetrun mailbox done:*)`` in the project's .claude/settings.json leaves the
    call refused; the same rule in .claude/settings.local.json, in the user's
    settings.json or as --allowedTools lets it run."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    tool = bindir / "mytool"
    tool.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/reported\n')
    tool.chmod(0o755)
    env["PATH"] = f"{bindir}{os.pathsep}{env['PATH']}"
    rule = {"permissions": {"allow": ["Bash(mytool mailbox done:*)"]}}
    flags = []
    if where == "flag":
        flags = ["--allowedTools", "Bash(mytool:*)"]
    elif where == "user":
        Path(env["CLAUDE_CONFIG_DIR"]).mkdir()
        (Path(env["CLAUDE_CONFIG_DIR"]) / "settings.json").write_text(json.dumps(rule))
    elif where is not None:
        (work / ".claude").mkdir()
        name = "settings.json" if where == "project" else "settings.local.json"
        (work / ".claude" / name).write_text(json.dumps(rule))
    scenario(tmp_path, env, {"default": [{"actions": [["bash", REPORT]]}]})
    proc = run([*SJ, "--permission-mode", "acceptEdits", *flags, "--", "go"], work, env)
    assert proc.returncode == 0
    reported = tmp_path / "reported"
    if allowed:
        assert denials(proc) == [] and reported.read_text() == "mailbox done task_abc --summary wrote\n"
    else:
        assert [d["tool_input"]["command"] for d in denials(proc)] == [REPORT] and not reported.exists()


def test_hooks_are_captured_at_start_up(tmp_path, work, env):
    """A settings file the session writes does not add hooks to that session."""
    marks = tmp_path / "marks"
    marks.mkdir()
    scenario(tmp_path, env, {"default": [{"actions": [["write", ".claude/settings.json", hook_settings(marks)]]}]})
    assert run([*SJ, "--permission-mode", "acceptEdits", "go"], work, env).returncode == 0
    assert (work / ".claude" / "settings.json").exists() and ran(marks) == []
    assert run([*SJ, "again"], work, env).returncode == 0
    assert ran(marks) == ["SessionStart project", "Stop project"]


def test_a_broken_settings_file_is_skipped(work, env):
    (work / ".claude").mkdir()
    (work / ".claude" / "settings.json").write_text("{not json")
    proc = run([*SJ, "go"], work, env)
    assert proc.returncode == 0 and "Settings error" in proc.stderr.decode()


def test_resume_runs_session_start_with_source_resume(tmp_path, work, env, hooked):
    sid = str(uuid.uuid4())
    run([*SJ, "--setting-sources", "project", "--session-id", sid, "one"], work, env)
    run([*SJ, "--setting-sources", "project", "--resume", sid, "two"], work, env)
    assert json.loads((hooked / "SessionStart-project.json").read_text())["source"] == "resume"


def test_session_start_matcher(tmp_path, work, env):
    marks = tmp_path / "marks"
    marks.mkdir()
    hook = {"type": "command", "command": f"echo $CLAUDE_PROJECT_DIR >> {marks}/ran"}
    (work / ".claude").mkdir()
    (work / ".claude" / "settings.json").write_text(
        json.dumps(
            {
                "hooks": {
                    "SessionStart": [
                        {"matcher": "resume", "hooks": [hook]},
                        {"matcher": "startup|clear", "hooks": [hook]},
                    ]
                }
            }
        )
    )
    run([*SJ, "go"], work, env)
    assert ran(marks) == [str(work)]  # identical commands run once


def test_a_stop_hook_that_blocks_continues_the_session(tmp_path, work, env):
    """{"decision": "block", "reason": R} makes the session go on with R as the next
    instruction (the key's next step); the hook is told stop_hook_active the second time."""
    marks = tmp_path / "marks"
    marks.mkdir()
    script = tmp_path / "stop-hook.py"
    script.write_text(
        "import json, sys\n"
        "data = json.load(sys.stdin)\n"
        f"open({str(marks / 'ran')!r}, 'a').write(json.dumps(data) + '\\n')\n"
        "if not data['stop_hook_active']:\n"
        "    print(json.dumps({'decision': 'block', 'reason': 'Now write b.txt.'}))\n"
    )
    (work / ".claude").mkdir()
    (work / ".claude" / "settings.json").write_text(
        json.dumps({"hooks": {"Stop": [{"hooks": [{"type": "command", "command": f"{sys.executable} {script}"}]}]}})
    )
    scenario(
        tmp_path,
        env,
        {
            "default": [
                {"actions": [["write", "a.txt", "A"]], "result": "wrote a", "cost": 0.01},
                {"actions": [["write", "b.txt", "B"]], "result": "wrote b", "cost": 0.02},
            ]
        },
    )
    proc = run([*SJ, "--permission-mode", "acceptEdits", "go"], work, env)
    assert proc.returncode == 0
    res = result_of(proc)
    assert res["result"] == "wrote b" and res["total_cost_usd"] == pytest.approx(0.03)
    assert (work / "a.txt").exists() and (work / "b.txt").exists()
    seen = [json.loads(line) for line in (marks / "ran").read_text().splitlines()]
    assert [(d["stop_hook_active"], d["last_assistant_message"]) for d in seen] == [
        (False, "wrote a"),
        (True, "wrote b"),
    ]
    first, cont = calls(env)
    assert cont["continuation"] == 1 and cont["prompt"] == "Now write b.txt."
    assert cont["session_id"] == first["session_id"] and (first["n"], cont["n"]) == (1, 2)


def test_a_stop_hook_exiting_2_blocks_with_its_stderr(tmp_path, work, env):
    (work / ".claude").mkdir()
    flag = tmp_path / "once"
    cmd = f"test -e {flag} && exit 0; touch {flag}; echo 'check again' >&2; exit 2"
    (work / ".claude" / "settings.json").write_text(
        json.dumps({"hooks": {"Stop": [{"hooks": [{"type": "command", "command": cmd}]}]}})
    )
    scenario(tmp_path, env, {"default": [{"result": "one"}, {"result": "two"}]})
    proc = run([*SJ, "go"], work, env)
    assert result_of(proc)["result"] == "two"
    assert calls(env)[-1]["prompt"] == "check again"


@pytest.mark.parametrize(
    "mode, model, effective",
    [
        ("plan", "haiku", "claude-opus-5-5"),
        ("plan", "claude-haiku-4-5", "claude-haiku-4-5"),
        ("dontAsk", "haiku", "claude-haiku-5-5"),
        ("default", "haiku", "claude-haiku-5-5"),
        ("plan", None, "claude-opus-5-5"),
    ],
)
def test_plan_mode_ignores_a_model_alias(work, env, mode, model, effective):
    """The requests (the usage, the log) of plan mode with an alias go as the default
    model; the init event names the alias resolved (measured offline, both versions)."""
    args = [*SJ, "--permission-mode", mode] + (["--model", model] if model else []) + ["go"]
    proc = run(args, work, env)
    evs = events(proc)
    shown = {"haiku": "claude-haiku-5-5", None: "claude-opus-5-5"}.get(model, model)
    assert evs[0]["model"] == shown and list(result_of(proc)["modelUsage"]) == [effective]
    assert calls(env)[-1]["model"] == effective


@pytest.mark.parametrize(
    ("version", "model", "shown", "tools"),
    [
        (
            "2.1.332",
            None,
            "claude-opus-5-5",
            [
                "Task",
                "Bash",
                "CronCreate",
                "CronDelete",
                "CronList",
                "DesignSync",
                "Edit",
                "EnterWorktree",
                "ExitWorktree",
                "ListAgents",
                "Monitor",
                "NotebookEdit",
                "Read",
                "ReportFindings",
                "ScheduleWakeup",
                "SendMessage",
                "Skill",
                "TaskStop",
                "ToolSearch",
                "WebFetch",
                "WebSearch",
                "Workflow",
                "Write",
            ],
        ),
        (
            "2.1.197",
            None,
            "claude-opus-4-8[1m]",
            [
                "Task",
                "Bash",
                "CronCreate",
                "CronDelete",
                "CronList",
                "DesignSync",
                "Edit",
                "EnterWorktree",
                "ExitWorktree",
                "NotebookEdit",
                "Read",
                "ReportFindings",
                "ScheduleWakeup",
                "SendMessage",
                "Skill",
                "TaskCreate",
                "TaskGet",
                "TaskList",
                "TaskOutput",
                "TaskStop",
                "TaskUpdate",
                "ToolSearch",
                "WebFetch",
                "WebSearch",
                "Workflow",
                "Write",
            ],
        ),
        ("2.1.332", "sonnet", "claude-sonnet-5-5", None),
        ("2.1.197", "haiku", "claude-haiku-4-5-20251001", None),
        ("2.1.332", "nosuchmodel", "nosuchmodel", None),
    ],
)
def test_default_tools_and_model_ids_are_the_measured_ones(work, env, version, model, shown, tools):
    env["FAKE_CLAUDE_VERSION"] = version
    init = events(run([*SJ, *(["--model", model] if model else []), "go"], work, env))[0]
    assert init["model"] == shown
    if tools is not None:
        assert init["tools"] == tools


@pytest.mark.parametrize(
    ("version", "tools"),
    [
        ("2.1.332", ["Task", "Glob", "Grep", "Read", "TaskStop"]),
        ("2.1.197", ["Task", "Glob", "Grep", "Read", "TaskOutput", "TaskStop"]),
    ],
)
def test_chosen_tools_are_listed_task_first_and_unknown_ones_dropped(work, env, version, tools):
    env["FAKE_CLAUDE_VERSION"] = version
    init = events(run([*SJ, "--tools", "Read,Grep,Glob,LS,MultiEdit,TodoWrite,Task", "--", "go"], work, env))[0]
    assert init["tools"] == tools


SCHEMA = json.dumps(
    {
        "type": "object",
        "properties": {"verdict": {"type": "string", "enum": ["PASS", "FAIL"]}, "reason": {"type": "string"}},
        "required": ["verdict", "reason"],
        "additionalProperties": False,
    }
)


def test_json_schema_gives_structured_output(tmp_path, work, env):
    scenario(tmp_path, env, {"default": [{"structured": {"verdict": "PASS", "reason": "fine"}, "result": "done"}]})
    proc = run([*SJ, "--json-schema", SCHEMA, "go"], work, env)
    res = result_of(proc)
    assert proc.returncode == 0 and res["structured_output"] == {"verdict": "PASS", "reason": "fine"}
    uses = [
        b for e in events(proc) if e["type"] == "assistant" for b in e["message"]["content"] if b["type"] == "tool_use"
    ]
    assert [u["name"] for u in uses] == ["StructuredOutput"]
    # without --json-schema there is no structured_output, whatever the step says
    assert "structured_output" not in result_of(run([*SJ, "go"], work, env))


def test_json_schema_refuses_output_that_does_not_fit(tmp_path, work, env):
    scenario(tmp_path, env, {"default": [{"structured": {"verdict": "MAYBE", "reason": "?"}}]})
    proc = run([*SJ, "--json-schema", SCHEMA, "go"], work, env)
    res = result_of(proc)
    assert proc.returncode == 1 and res["is_error"] and res["subtype"] == "error_max_structured_output_retries"
    assert "structured_output" not in res


def test_empty_mcp_config_with_strict_is_accepted(work, env):
    proc = run([*SJ, "--strict-mcp-config", "--mcp-config", '{"mcpServers":{}}', "--", "go"], work, env)
    assert proc.returncode == 0 and result_of(proc)["result"] == "ok"


def test_mcp_servers_the_user_s_unless_strict_and_what_a_session_was_given(tmp_path, work, env):
    """As the real CLI: each --mcp-config's servers, and the user's (.claude.json, its
    projects[cwd]) and the approved ones of the project's .mcp.json unless
    --strict-mcp-config; the init event lists them, the log records them with the other
    options a test asserts (and the variables FAKE_CLAUDE_LOG_ENV names)."""
    config_dir = Path(env["CLAUDE_CONFIG_DIR"])
    config_dir.mkdir()
    (config_dir / ".claude.json").write_text(
        json.dumps(
            {
                "mcpServers": {"user-db": {"command": "true"}},
                "projects": {str(work): {"mcpServers": {"local-one": {"command": "true"}}}},
            }
        )
    )
    (work / ".mcp.json").write_text(json.dumps({"mcpServers": {"approved": {}, "unapproved": {}}}))
    (work / ".claude").mkdir()
    (work / ".claude" / "settings.local.json").write_text(json.dumps({"enabledMcpjsonServers": ["approved"]}))
    mcp = json.dumps({"mcpServers": {"mine": {"command": "true"}}})
    env.update(FAKE_CLAUDE_LOG_ENV="MY_VAR,UNSET_VAR", MY_VAR="v")
    extra = ["--append-system-prompt", "Be brief.", "--fallback-model", "sonnet", "--max-turns", "7"]

    proc = run([*SJ, "--mcp-config", mcp, *extra, "go"], work, env)
    assert proc.returncode == 0, proc.stderr
    init = events(proc)[0]
    assert [s["name"] for s in init["mcp_servers"]] == ["mine", "user-db", "local-one", "approved"]
    strict = run([*SJ, "--mcp-config", mcp, "--strict-mcp-config", "go"], work, env)
    assert [s["name"] for s in events(strict)[0]["mcp_servers"]] == ["mine"]

    first, second = calls(env)
    assert first["mcp_servers"] == ["mine", "user-db", "local-one", "approved"]
    assert (first["append_system_prompt"], first["fallback_model"], first["max_turns"]) == ("Be brief.", "sonnet", 7)
    assert first["env_logged"] == {"MY_VAR": "v", "UNSET_VAR": None}
    assert second["mcp_servers"] == ["mine"] and second["max_turns"] is None


@pytest.mark.parametrize(
    "args",
    [
        ["--dangerously-skip-permissions"],
        ["--permission-mode", "bypassPermissions"],
        ["--allow-dangerously-skip-permissions"],
        ["--settings", '{"permissions": {"defaultMode": "bypassPermissions"}}'],
    ],
)
def test_bypass_permissions_as_root_is_refused_at_once(work: Path, env: dict[str, str], args: list[str]) -> None:
    """Measured (2.1.197 and 2.1.332, as root): this line on stderr, nothing on stdout,
    exit 1; ``IS_SANDBOX=1`` lets it run."""
    env["FAKE_CLAUDE_UID"] = "0"
    del env["IS_SANDBOX"]
    proc = run([*SJ, *args, "go"], work, env)
    assert (proc.returncode, proc.stdout, proc.stderr.decode()) == (
        1,
        b"",
        "--dangerously-skip-permissions cannot be used with root/sudo privileges for security reasons\n",
    )
    env["IS_SANDBOX"] = "1"
    assert run([*SJ, *args, "go"], work, env).returncode == 0


@pytest.mark.parametrize("version", ["2.1.197", "2.1.332"])
def test_cost_after_resume_is_the_sessions_on_2_1_332(
    tmp_path: Path, work: Path, env: dict[str, str], version: str
) -> None:
    """The issue's measurement: after --resume, 2.1.332's total_cost_usd is the whole
    session's, this invocation's is in model_usage_since_last_result; 2.1.197 gives the
    invocation's and has no model_usage_since_last_result."""
    env["FAKE_CLAUDE_VERSION"] = version
    scenario(tmp_path, env, {"default": [{"cost": 0.3}, {"cost": 0.2}]})
    sid = str(uuid.uuid4())
    first = result_of(run([*SJ, "--session-id", sid, "go"], work, env))
    again = result_of(run([*SJ, "--resume", sid, "go on"], work, env))
    if version == "2.1.197":
        assert (first["total_cost_usd"], again["total_cost_usd"]) == (0.3, 0.2)
        assert "model_usage_since_last_result" not in again
        return
    assert first["total_cost_usd"] == 0.3 and again["total_cost_usd"] == pytest.approx(0.5)
    (usage,) = again["model_usage_since_last_result"].values()
    assert usage["costUSD"] == 0.2


def test_an_unknown_resume_id_is_answered_as_measured(work: Path, env: dict[str, str]) -> None:
    """Measured (both versions, offline): no init event, one result event naming the id
    asked for, the message on stderr too, no terminal reset, exit 1."""
    sid = str(uuid.uuid4())
    proc = run([*SJ, "--resume", sid, "go"], work, env)
    assert proc.returncode == 1
    assert proc.stderr.decode() == f"No conversation found with session ID: {sid}\n"
    assert proc.stdout.count(b"\n") == 1 and b"\x1b" not in proc.stdout
    (res,) = events(proc)
    assert (res["type"], res["subtype"], res["session_id"], res["num_turns"], res["errors"]) == (
        "result",
        "error_during_execution",
        sid,
        0,
        [f"No conversation found with session ID: {sid}"],
    )


@pytest.mark.parametrize(
    ("version", "args", "code", "stderr"),
    [
        # each measured with the real CLI of that version, offline (docs/agents.md)
        ("2.1.332", ["--permission-mode", "manual"], 0, ""),
        ("2.1.332", ["--permission-mode", "default"], 0, ""),
        (
            "2.1.197",
            ["--permission-mode", "manual"],
            1,
            "error: option '--permission-mode <mode>' argument 'manual' is invalid. Allowed choices are acceptEdits, "
            "auto, bypassPermissions, default, dontAsk, plan.\n",
        ),
        ("2.1.332", ["--max-turns", "0"], 0, ""),
        ("2.1.197", ["--max-turns", "0"], 0, ""),
        ("2.1.332", ["--settings", "notjson"], 1, "Error: Settings file not found: {cwd}/notjson\n"),
        ("2.1.197", ["--settings", "notjson"], 1, "Error: Settings file not found: notjson\n"),
        (
            "2.1.332",
            ["--mcp-config", "notjson"],
            1,
            "Error: Invalid MCP configuration:\nMCP config file not found: {cwd}/notjson\n",
        ),
        (
            "2.1.197",
            ["--mcp-config", "notjson"],
            1,
            "Error: Invalid MCP configuration:\nMCP config file not found: {cwd}/notjson\n",
        ),
        ("2.1.332", ["--effort", "high", "--bare", "--name", "x", "--include-hook-events"], 0, ""),
        ("2.1.197", ["--effort", "high", "--bare", "--name", "x", "--include-hook-events"], 0, ""),
        ("2.1.332", ["--permission-prompts", "none", "--system-prompt-snapshot", "off", "--restricted"], 0, ""),
        ("2.1.197", ["--permission-prompts", "none"], 1, "error: unknown option '--permission-prompts'\n"),
        ("2.1.332", ["--mcp-debug"], 1, "error: unknown option '--mcp-debug'\n"),
        ("2.1.332", ["--model", "sonnet", "--fallback-model", "sonnet"], 0, ""),
        ("2.1.197", ["--model", "sonnet", "--fallback-model", "sonnet"], 0, ""),
        ("2.1.332", ["--name"], 1, "error: option '-n, --name <name>' argument missing\n"),
    ],
)
def test_the_command_line_is_taken_or_refused_as_the_real_cli_does(
    work: Path, env: dict[str, str], version: str, args: list[str], code: int, stderr: str
) -> None:
    env["FAKE_CLAUDE_VERSION"] = version
    proc = run([*SJ, *args] if args[-1] == "--name" else [*SJ, *args, "--", "go"], work, env)
    assert (proc.returncode, proc.stderr.decode()) == (code, stderr.format(cwd=work)), proc.stdout
    if code == 0 and "--permission-mode" in args:
        assert events(proc)[0]["permissionMode"] == "default"  # measured: manual is shown as default

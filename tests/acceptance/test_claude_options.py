"""Claude Code options per task and in ``[claude]``, through the real CLI and the fake
claude: the argv and environment each session gets, kept across a resume (with
``--resume``) and a retry; ``--max-turns`` reached is NEEDS_HUMAN; the MCP servers a
session has (the user's unless ``strict_mcp_config``); the reviewer gets none of them."""

from __future__ import annotations

import json
from typing import Any

#: the inline --mcp-config of task a, as written in the tasks file
INLINE_MCP = '{"mcpServers": {"inline": {"command": "true"}}}'


def flag_values(argv: list[str], flag: str) -> list[str]:
    """The words after ``flag`` up to the next option (a variadic option's values)."""
    i = argv.index(flag) + 1
    out = []
    while i < len(argv) and not argv[i].startswith("--"):
        out.append(argv[i])
        i += 1
    return out


def options_of(argv: list[str]) -> list[str]:
    """The argv after fleetrun's own flags: from ``--max-turns`` (the first option) on."""
    start = min(argv.index(f) for f in ("--max-turns", "--fallback-model", "--append-system-prompt") if f in argv)
    return argv[start:]


def test_every_option_reaches_the_session_and_stays_on_resume_and_retry(fleeter: Any, fake_claude: Any) -> None:
    fleeter.make_repo()
    fleeter.write("mcp/servers.json", json.dumps({"mcpServers": {"files": {"command": "true"}}}))
    fleeter.write("session-settings.json", json.dumps({"env": {"FROM_SETTINGS": "1"}}))
    # the user's own MCP server (user scope, ~/.claude.json): every session has it unless strict
    (fake_claude.dir / "claude-config" / ".claude.json").write_text(
        json.dumps({"mcpServers": {"user-db": {"command": "true"}}})
    )
    fleeter.write_config(f'''
        [claude]
        executable = "{fake_claude.executable}"
        resume_session = true
        append_system_prompt = "Say which task you work on."
        disallowed_tools = ["Bash(curl:*)"]
        env = {{ SHARED = "claude", OVER = "claude" }}
    ''')
    fleeter.write("fleetrun.toml", '[task]\nfallback_model = "sonnet"\n')  # a default of every task
    fleeter.write_tasks(f"""
        [[task]]
        name = "a"
        cwd = "repo"
        git_ref = "main"
        prompt = "Write out.txt."
        append_system_prompt = "Commit with the subject 'a'."
        mcp_config = ["mcp/servers.json", '{INLINE_MCP}']
        strict_mcp_config = true
        settings = "session-settings.json"
        disallowed_tools = ["WebFetch", "Bash(rm:*)"]
        max_turns = 30
        env = {{ TASK_VAR = "a", OVER = "task" }}
        extra_args = ["--add-dir", "../shared"]
          [[task.verify]]
          run = "test -f out.txt"

        [[task]]
        name = "b"
        cwd = "repo"
        git_ref = "main"
        prompt = "Write two files."
        max_turns = 1

        [[task]]
        name = "c"
        cwd = "repo"
        git_ref = "main"
        prompt = "Write c.txt."
          [[task.verify]]
          agent = "Is c.txt there?"
    """)
    fake_claude.script(
        a=[
            {"mode": "die"},  # resumed: --resume, same options
            {"actions": [["write", "other.txt", "x"]]},  # its verifier fails: retried
            {"actions": [["write", "out.txt", "x"]]},
        ],
        b=[{"actions": [["write", "b1.txt", "x"], ["write", "b2.txt", "x"]]}],
        c=[{"actions": [["write", "c.txt", "x"]]}],
        **{"c:review": [{"structured": {"verdict": "PASS", "reason": "c.txt is there"}, "result": "PASS"}]},
    )
    fleeter.monkeypatch.setenv("FAKE_CLAUDE_LOG_ENV", "TASK_VAR,SHARED,OVER")
    r = fleeter.run("tasks.toml")
    assert r.ret == 1, r.stdout + r.stderr
    assert fleeter.states() == {"a": "DONE", "b": "NEEDS_HUMAN", "c": "DONE"}

    first, resumed, retried = fake_claude.calls("a")
    expected = [
        "--max-turns",
        "30",
        "--fallback-model",
        "sonnet",
        "--append-system-prompt",
        "Commit with the subject 'a'.",
        "--settings",
        str(fleeter.path / "session-settings.json"),
        "--mcp-config",
        str(fleeter.path / "mcp" / "servers.json"),
        INLINE_MCP,
        "--strict-mcp-config",
        "--disallowedTools",
        "WebFetch",
        "Bash(rm:*)",
        "--add-dir",
        "../shared",
    ]
    for call in (first, resumed, retried):
        assert options_of(call["argv"]) == expected, call["argv"]
        assert call["env_logged"] == {"TASK_VAR": "a", "SHARED": "claude", "OVER": "task"}
        assert call["mcp_servers"] == ["files", "inline"]  # strict: not the user's user-db
        assert (call["max_turns"], call["fallback_model"]) == (30, "sonnet")
    sid = first["argv"][first["argv"].index("--session-id") + 1]
    assert resumed["argv"][resumed["argv"].index("--resume") + 1] == sid  # [claude] resume_session
    assert "--resume" not in retried["argv"]

    task_b = fleeter.task("b")
    assert task_b.reason == "max_turns:the agent reached its --max-turns"
    (call_b,) = fake_claude.calls("b")  # a cap the user set: not resumed
    assert flag_values(call_b["argv"], "--max-turns") == ["1"]
    r.fnmatch_lines(["*b NEEDS_HUMAN (attempt 1)*max_turns:the agent reached its --max-turns*"])

    (call_c,) = fake_claude.calls("c")  # [claude]'s options, the project's default, no strictness
    assert options_of(call_c["argv"]) == [
        "--fallback-model",
        "sonnet",
        "--append-system-prompt",
        "Say which task you work on.",
        "--disallowedTools",
        "Bash(curl:*)",
    ]
    assert call_c["env_logged"] == {"TASK_VAR": None, "SHARED": "claude", "OVER": "claude"}
    assert call_c["mcp_servers"] == ["user-db"]  # the user's MCP server, inherited
    (review,) = fake_claude.review_calls("c")  # the reviewer inherits none of them
    for flag in ("--append-system-prompt", "--fallback-model", "--max-turns", "--settings"):
        assert flag not in review["argv"]
    assert "Bash(curl:*)" not in review["argv"] and review["mcp_servers"] == []
    assert review["env_logged"] == {"TASK_VAR": None, "SHARED": None, "OVER": None}

"""The Claude Code options' checks (fleetrun/claudeopts.py): each bad value is an
``ERROR: file:line: key: ...`` of ``fleetrun validate`` (exit 4), in a task, as a
default of every task and in ``[claude]``; the flags ``extra_args`` may not pass; the
mapping onto Claude Code's flags; a task asking for them is never delivered to a mailbox."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fleetrun import claudeopts
from fleetrun.plugins.mailbox.delivery import spec_always_spawned
from fleetrun.taskspec import TaskSpec


def validate_errors(fleeter: Any, key_line: str) -> list[str]:
    fleeter.write_tasks(f'[[task]]\nname = "t"\nprompt = "p"\n{key_line}\n')
    r = fleeter.run("validate", "tasks.toml")
    assert r.ret == 4, r.stdout + r.stderr
    return r.errlines


@pytest.mark.parametrize(
    ("key_line", "message"),
    [
        ("max_turns = 0", "max_turns: must be greater than 0"),
        ("max_turns = 2.5", "max_turns: must be an integer, not the number 2.5"),
        ("max_turns = true", "max_turns: must be an integer, not true"),
        ('fallback_model = ""', "fallback_model: must not be empty"),
        ('append_system_prompt = "  "', "append_system_prompt: must not be empty"),
        ('strict_mcp_config = "yes"', "strict_mcp_config: must be true or false, not a string"),
        ('disallowed_tools = "Bash"', "disallowed_tools: must be a list, not a string"),
        ('disallowed_tools = ["Bash", 3]', "disallowed_tools: must be a list of strings"),
        ('mcp_config = "m.json"', "mcp_config: must be a list, not a string"),
        ('mcp_config = ["{ nope"]', "mcp_config: the inline JSON is not valid JSON"),
        ("mcp_config = ['{\"servers\": {}}']", 'mcp_config: the inline JSON has no "mcpServers" object'),
        ('mcp_config = ["missing.json"]', "mcp_config: 'missing.json' does not exist (it is relative to "),
        ('mcp_config = ["bad.json"]', "mcp_config: 'bad.json' has no \"mcpServers\" object"),
        ('settings = "[1]"', "settings: '[1]' does not exist"),
        ("settings = '{\"a\": '", "settings: the inline JSON is not valid JSON"),
        ('env = { "1X" = "a" }', "env: '1X' is not an environment variable name"),
        ('env = { FLEETRUN_TASK_ID = "x" }', "env: FLEETRUN_TASK_ID is fleetrun's"),
        ("env = { A = 1 }", "env: A must be a string"),
        ('extra_args = ["-p"]', "extra_args: '-p' is fleetrun's own (fleetrun runs every session in print mode)"),
        ('extra_args = ["--output-format=json"]', "extra_args: '--output-format=json' is fleetrun's own"),
        ('extra_args = ["--add-dir", "x", "--resume"]', "extra_args: '--resume' is fleetrun's own"),
        ('extra_args = ["-cp"]', "extra_args: '-cp' is fleetrun's own (-c:"),
        ('extra_args = ["--max-turns=3"]', "extra_args: '--max-turns=3' has a key of its own: use max_turns"),
        ('extra_args = ["x"]', "extra_args: 'x' is not an option"),
        ('extra_args = ["--add-dir", "--"]', "extra_args: '--' ends the options"),
    ],
)
def test_a_bad_value_in_a_task(fleeter: Any, key_line: str, message: str) -> None:
    fleeter.write("bad.json", json.dumps({"servers": {}}))
    (line,) = validate_errors(fleeter, key_line)
    assert line.startswith(f"ERROR: tasks.toml:4: task 't': {message}"), line


def test_a_default_of_every_task_and_the_agent_it_is_for(fleeter: Any) -> None:
    """A default is checked where it is written (a path relative to its own file); a
    task's own option on a command agent's task is a mistake, a default is not."""
    fleeter.write("conf/mcp.json", json.dumps({"mcpServers": {}}))
    fleeter.write("fleetrun.toml", '[task]\nmcp_config = ["conf/mcp.json"]\nsettings = "conf/none.json"\n')
    fleeter.write_tasks('[[task]]\nname = "t"\nprompt = "p"\n[[task]]\nname = "t2"\nprompt = "p"\n')
    r = fleeter.run("validate", "tasks.toml")  # relative to the project file; one error for two tasks
    assert (r.ret, r.errlines) == (
        4,
        [
            "ERROR: fleetrun.toml:3: task 't': settings: 'conf/none.json' does not "
            f"exist (it is relative to {fleeter.path})"
        ],
    )
    fleeter.write("fleetrun.toml", '[task]\nmcp_config = ["conf/mcp.json"]\nmax_turns = -1\n')
    fleeter.write_tasks("""
        fallback_model = "opus"
        [agents.echo]
        command = ["true"]

        [[task]]
        name = "t"
        prompt = "p"
        model = "opus"

        [[task]]
        name = "u"
        prompt = "p"
        agent = "echo"
        max_turns = 3
    """)
    r = fleeter.run("validate", "tasks.toml")
    assert (r.ret, r.errlines) == (4, ["ERROR: fleetrun.toml:3: task.max_turns: must be greater than 0"])
    fleeter.write("fleetrun.toml", '[task]\nmcp_config = ["conf/mcp.json"]\n')
    r = fleeter.run("validate", "tasks.toml")
    assert r.ret == 4
    # a fallback_model equal to the model is no error: measured, both CLI versions take it
    assert r.errlines == [
        "ERROR: tasks.toml:14: task 'u': max_turns: is a Claude Code option; this task's agent is 'echo'",
    ]


def test_bad_values_in_claude_of_config_toml(fleeter: Any, tmp_path: Path) -> None:
    ok = tmp_path / "ok.json"
    ok.write_text(json.dumps({"mcpServers": {"x": {"command": "true"}}}))
    fleeter.write_config(f'''
        [claude]
        mcp_config = ["{ok}", "rel.json"]
        settings = "{tmp_path / "nope.json"}"
        env = {{ FLEETRUN_HOME = "x" }}
        extra_args = ["--session-id", "u"]
        max_turns = 0
    ''')
    fleeter.write_tasks('[[task]]\nname = "t"\nprompt = "p"\n')
    r = fleeter.run("validate", "tasks.toml")
    where = f"ERROR: {fleeter.home / 'config.toml'}"
    assert r.ret == 4
    assert r.errlines == [
        f"{where}:2: claude.mcp_config: 'rel.json' is a relative path; in [claude] a path is absolute or "
        "starts with ~ (in a task it is relative to the file it is written in)",
        f"{where}:3: claude.settings: '{tmp_path / 'nope.json'}' does not exist",
        f"{where}:4: claude.env: FLEETRUN_HOME is fleetrun's: the FLEETRUN_* variables of a session "
        "(FLEETRUN_TASK_ID, FLEETRUN_WORKTREE, ...) are set by fleetrun and cannot be overridden",
        f"{where}:5: claude.extra_args: '--session-id' is fleetrun's own (fleetrun gives each attempt its "
        "own session id)",
        f"{where}:6: claude.max_turns: must be greater than 0",
    ]


@pytest.mark.parametrize(
    ("arg", "denied"),
    [
        ("-p", True),
        ("--print", True),
        ("-r", True),
        ("-rabc", True),
        ("-c", True),
        ("--continue", True),
        ("--session-id=x", True),
        ("--input-format", True),
        ("--verbose", True),
        ("--max-budget-usd=1", True),
        ("-h", True),
        ("--version", True),
        ("--fork-session", True),
        ("-pc", True),
        ("-cp", True),
        ("--model", True),
        ("--dangerously-skip-permissions", True),
        ("--allowed-tools", True),
        ("--add-dir", False),
        ("-d", False),
        ("-dapi,hooks", False),
        ("-dp", False),
        ("--system-prompt=x", False),
        ("--setting-sources", False),
        ("--tools", False),
        ("-nname", False),
        ("plain", False),
    ],
)
def test_denied_flags(arg: str, denied: bool) -> None:
    assert (claudeopts.denied_flag(arg) is not None) is denied


def test_argv_and_paths(tmp_path: Path) -> None:
    opts = claudeopts.Options(
        values={
            "max_turns": 5,
            "settings": "s.json",
            "mcp_config": ["/abs/m.json", '{"mcpServers": {}}'],
            "strict_mcp_config": False,
            "disallowed_tools": [],
            "env": {"A": "1"},
            "extra_args": ["--x"],
        },
        bases={"settings": tmp_path, "mcp_config": tmp_path},
    )
    assert opts.argv() == [
        "--max-turns",
        "5",
        "--settings",
        str(tmp_path / "s.json"),
        "--mcp-config",
        "/abs/m.json",
        '{"mcpServers": {}}',
        "--x",
    ]
    assert opts.env() == {"A": "1"}


def test_a_task_with_claude_options_is_never_delivered_to_a_mailbox() -> None:
    spec = TaskSpec(name="t", prompt="p", cwd="/", extra={"max_turns": 3, "env": {"A": "1"}})
    assert spec_always_spawned(spec) == "it asks for Claude Code options (max_turns, env)"
    assert spec_always_spawned(TaskSpec(name="t", prompt="p", cwd="/")) is None


@pytest.mark.parametrize(
    ("command", "rules"),
    [
        ("pytest -q", ["Bash(pytest -q)"]),
        ("cd sub && make test; ruff check .", ["Bash(cd sub)", "Bash(make test)", "Bash(ruff check .)"]),
        ("grep -q 'a && b' f | wc -l", ["Bash(grep -q 'a && b' f)", "Bash(wc -l)"]),
        ("ls *.py", []),  # a wildcard rule would allow more than the verifier runs
        ('test "$(cat v)" = 1', []),  # a parenthesis: not one rule
        ("make\nmake install", ["Bash(make)", "Bash(make install)"]),
    ],
)
def test_verifier_rules_are_each_part_of_each_run_command_exactly(command: str, rules: list[str]) -> None:
    from fleetrun.taskspec import VerifySpec

    spec = TaskSpec(
        name="t",
        prompt="p",
        cwd="/tmp",
        verify=[VerifySpec("run", command), VerifySpec("agent", "review it"), VerifySpec("run", command)],
    )
    assert claudeopts.verifier_rules(spec) == rules

"""``config.toml``: every table checked as strictly as policy.toml, through the real CLI.

Each table belongs to the plugin that reads it and is declared by that plugin through
``fleetrun_config_keys``; a third-party plugin declares its own the same way. Every
case asserts the exact ``ERROR: FILE:LINE: table.key: message`` lines and exit 4.
"""

from __future__ import annotations

from typing import Any, Optional

import pytest

import fleetrun

USAGE_ERROR = 4
TASK = '[agents.ok]\ncommand = ["true"]\n\n[[task]]\nname = "a"\nprompt = "x"\nagent = "ok"\n'


def errors_of(fleeter: Any, *args: str) -> list[str]:
    r = fleeter.run(*(args or ("validate", "tasks.toml")))
    assert "Traceback" not in r.stderr and "INTERNAL ERROR" not in r.stderr, r.stderr
    assert r.ret == USAGE_ERROR, (r.ret, r.stdout, r.stderr)
    return r.errlines


def cfg_error(fleeter: Any, config: str, *lines: str) -> None:
    """``config`` in config.toml is refused by validate, by a run and by work, with ``lines``."""
    fleeter.write_config(config)
    fleeter.write_tasks(TASK)
    where = str(fleeter.home / "config.toml")
    want = [f"ERROR: {where}:{line}" for line in lines]
    for args in (("validate", "tasks.toml"), ("tasks.toml",), ("work", "--until-idle")):
        assert errors_of(fleeter, *args) == want, args


def test_misspelt_claude_key(fleeter: Any) -> None:
    cfg_error(
        fleeter, '[claude]\nexecutabel = "claude"\n', "2: claude.executabel: unknown key (did you mean 'executable'?)"
    )


def test_permission_mode_is_one_of_claude_codes(fleeter: Any) -> None:
    cfg_error(
        fleeter,
        '# the agent\n[claude]\npermission_mode = "yolo"\n',
        "3: claude.permission_mode: 'yolo' is not one of acceptEdits, auto, bypassPermissions, default, "
        "dontAsk, manual, plan",
    )


@pytest.mark.parametrize("mode", ["default", "manual", "acceptEdits", "auto", "bypassPermissions", "dontAsk", "plan"])
def test_every_permission_mode_of_either_claude_code_is_accepted(fleeter: Any, mode: str) -> None:
    # 2.1.197 calls the ask-every-time mode `default`, 2.1.332 `manual`
    fleeter.monkeypatch.setenv("IS_SANDBOX", "1")  # run as root, bypassPermissions would draw a warning
    fleeter.write_config(f'[claude]\npermission_mode = "{mode}"\n')
    fleeter.write_tasks(f'[[task]]\nname = "a"\nprompt = "x"\npermission_mode = "{mode}"\n')
    r = fleeter.run("validate", "tasks.toml")
    assert (r.ret, r.outlines, r.errlines) == (0, ["tasks.toml: 1 task, valid"], [])


def test_types_of_claude_keys(fleeter: Any) -> None:
    cfg_error(
        fleeter,
        '[claude]\nexecutable = 3\nallowed_tools = "Read"\nresume_session = "yes"\n',
        "2: claude.executable: expected a string, got the number 3",
        "3: claude.allowed_tools: expected a list of strings, got a string",
        "4: claude.resume_session: expected true or false, got a string",
    )


def test_empty_executable(fleeter: Any) -> None:
    cfg_error(fleeter, '[claude]\nexecutable = ""\n', "2: claude.executable: must not be empty")


def test_unknown_table_with_did_you_mean(fleeter: Any) -> None:
    cfg_error(fleeter, '[claud]\nexecutable = "claude"\n', "1: claud: unknown table (did you mean 'claude'?)")


def test_a_table_that_is_not_a_table(fleeter: Any) -> None:
    cfg_error(fleeter, 'claude = "x"\n', "1: claude: must be a table")


@pytest.mark.parametrize(
    "value, message",
    [
        ("nan", "must be a finite number"),
        ("inf", "must be a finite number"),
        ("0", "must be greater than 0"),
        ("-1", "must be greater than 0"),
        ("true", "expected a number, got true/false"),
    ],
)
def test_relay_heartbeat_secs(fleeter: Any, value: str, message: str) -> None:
    cfg_error(fleeter, f"[relay]\nheartbeat_secs = {value}\n", f"2: relay.heartbeat_secs: {message}")


def test_relay_tools_and_misspelt_tags(fleeter: Any) -> None:
    cfg_error(
        fleeter,
        '[relay]\ntools = ["cargo", 1]\ntag = ["gpu"]\n',
        "2: relay.tools: expected a list of strings, got a list holding the number 1",
        "3: relay.tag: unknown key (did you mean 'tags'?)",
    )


def test_agents_tables(fleeter: Any) -> None:
    cfg_error(
        fleeter,
        '[agents.codex]\ncomand = ["codex"]\n\n[agents.aider]\ncommand = "aider"\nstdin = 1\nenv = { A = 1 }\n',
        "1: agents.codex: command is missing",
        "2: agents.codex.comand: unknown key (did you mean 'command'?)",
        "5: agents.aider.command: expected a list of strings, got a string",
        "6: agents.aider.stdin: expected true or false, got the number 1",
        "7: agents.aider.env: expected a table of strings, got a table holding the number 1",
    )


def test_agents_table_without_command(fleeter: Any) -> None:
    cfg_error(fleeter, "[agents.codex]\nstdin = true\n", "1: agents.codex: command is missing")


def test_agents_must_hold_tables(fleeter: Any) -> None:
    cfg_error(fleeter, '[agents]\ncodex = "codex exec"\n', "2: agents.codex: must be a table")


def test_brain_keys(fleeter: Any) -> None:
    cfg_error(
        fleeter,
        '[brain]\nmodel = "m"\ntimeout = 5\napi = "claude"\n',
        "3: brain.timeout: unknown key (did you mean 'timeout_s'?)",
        "4: brain.api: must be one of 'ollama', 'openai'",
    )


def test_worktree_commit_message(fleeter: Any) -> None:
    cfg_error(
        fleeter,
        '[worktree]\ncommit_message = 3\ncommit_msg = "x"\n',
        "2: worktree.commit_message: expected a string, got the number 3",
        "3: worktree.commit_msg: unknown key (did you mean 'commit_message'?)",
    )


def test_fleetrun_table_names_its_keys(fleeter: Any) -> None:
    cfg_error(
        fleeter,
        "[fleetrun]\nverbose = 1\n",
        "2: fleetrun.verbose: unknown key (known: verifier_error_backoff_s, verifier_error_tries)",
    )


def test_fleetrun_verifier_error_settings_are_checked(fleeter: Any) -> None:
    cfg_error(
        fleeter, "[fleetrun]\nverifier_error_tries = 0\n", "2: fleetrun.verifier_error_tries: must be more than 0"
    )


def test_a_good_config_validates(fleeter: Any) -> None:
    fleeter.write_config("""
        [claude]
        executable = "claude"
        permission_mode = "plan"
        allowed_tools = ["Read"]
        resume_session = true

        [relay]
        tags = ["gpu"]
        heartbeat_secs = 2.5
        tools = ["cargo"]

        [worktree]
        commit_message = "wip {task} {attempt}"

        [brain]
        model = "m"
        timeout_s = 30

        [agents.codex]
        command = ["codex", "exec", "-"]
        stdin = true
        env = { A = "1" }

        [fleetrun]
    """)
    fleeter.write_tasks(TASK)
    r = fleeter.run("validate", "tasks.toml")
    assert (r.ret, r.outlines, r.errlines) == (0, ["tasks.toml: 1 task, valid"], [])


def test_a_broken_config_leaves_the_operators_verbs_working(fleeter: Any) -> None:
    fleeter.write_config('[claude]\nexecutabel = "claude"\n')
    fleeter.write_tasks(TASK)
    assert errors_of(fleeter, "queue", "tasks.toml") == [
        f"ERROR: {fleeter.home / 'config.toml'}:2: claude.executabel: unknown key (did you mean 'executable'?)"
    ]
    assert errors_of(fleeter, "relay", "peers") == [
        f"ERROR: {fleeter.home / 'config.toml'}:2: claude.executabel: unknown key (did you mean 'executable'?)"
    ]
    # reading the ledger does not need config.toml: it stays possible while it is fixed
    r = fleeter.run("status")
    assert (r.ret, r.errlines) == (0, [])


# ---------------------------------------------------------------------------------
# plugin-declared tables


def _positive(v: Any) -> Optional[str]:
    return None if v > 0 else "must be greater than 0"


class Pager:
    """A third-party plugin that reads ``[pager]`` from config.toml."""

    @fleetrun.hookimpl
    def fleetrun_config_keys(self, config: Any) -> list[Any]:
        from fleetrun import ConfigKey

        return [
            ConfigKey("pager", "url", (str,), doc="where to post"),
            ConfigKey("pager", "level", (str,), choices=("all", "failures")),
            ConfigKey("pager", "retries", (int,), check=_positive),
        ]


def test_plugin_declared_table_is_checked(fleeter: Any) -> None:
    fleeter.write_config('[pager]\nurl = "https://x"\nlevle = "all"\nlevel = "some"\nretries = 0\n')
    fleeter.write_tasks(TASK)
    where = fleeter.home / "config.toml"
    r = fleeter.run("validate", "tasks.toml", plugins=[Pager()])
    assert (r.ret, r.errlines) == (
        USAGE_ERROR,
        [
            f"ERROR: {where}:3: pager.levle: unknown key (did you mean 'level'?)",
            f"ERROR: {where}:4: pager.level: 'some' is not one of all, failures",
            f"ERROR: {where}:5: pager.retries: must be greater than 0",
        ],
    )


def test_plugin_declared_table_valid(fleeter: Any) -> None:
    fleeter.write_config('[pager]\nurl = "https://x"\nlevel = "all"\nretries = 2\n')
    fleeter.write_tasks(TASK)
    r = fleeter.run("validate", "tasks.toml", plugins=[Pager()])
    assert (r.ret, r.errlines) == (0, [])
    # without the plugin nobody reads [pager]: a mistake, most likely a missing plugin
    r = fleeter.run("validate", "tasks.toml")
    assert (r.ret, r.errlines) == (
        USAGE_ERROR,
        [
            f"ERROR: {fleeter.home / 'config.toml'}:1: pager: unknown table (known: agents, brain, claude, events, fleetrun, "
            "notify, output, relay, worktree)"
        ],
    )


def test_plugin_declared_in_fleetconf(fleeter: Any) -> None:
    fleeter.write_fleetconf("""
        from fleetrun import ConfigKey

        def fleetrun_config_keys(config):
            return [ConfigKey("pager", "url", (str,))]
    """)
    fleeter.write_config("[pager]\nurl = 3\n")
    fleeter.write_tasks(TASK)
    assert errors_of(fleeter, "validate", "tasks.toml") == [
        f"ERROR: {fleeter.home / 'config.toml'}:2: pager.url: expected a string, got the number 3"
    ]


def test_blocked_plugins_table_is_not_an_error(fleeter: Any) -> None:
    # with -p no:relay nothing declares [relay]; it is that plugin's, not a mistake
    fleeter.write_config('[relay]\ntags = ["gpu"]\n')
    fleeter.write_tasks(TASK)
    r = fleeter.run("validate", "-p", "no:relay", "tasks.toml")
    assert (r.ret, r.errlines) == (0, [])


# ---------------------------------------------------------------------------------
# a UTF-8 byte-order mark (Windows editors write one)

BOM = "\ufeff"


def test_bom_in_tasks_policy_and_config(fleeter: Any) -> None:
    (fleeter.path / "tasks.toml").write_text(BOM + TASK, encoding="utf-8")
    fleeter.home.mkdir(parents=True, exist_ok=True)
    (fleeter.home / "config.toml").write_text(BOM + '[claude]\nexecutable = "claude"\n', encoding="utf-8")
    (fleeter.home / "policy.toml").write_text(BOM + "[local]\nmax_tasks = 2\n", encoding="utf-8")
    r = fleeter.run("validate", "tasks.toml")
    assert (r.ret, r.outlines, r.errlines) == (0, ["tasks.toml: 1 task, valid"], [])
    r = fleeter.run("status")
    assert r.ret == 0, r.stderr


def test_bom_keeps_line_numbers(fleeter: Any) -> None:
    fleeter.home.mkdir(parents=True, exist_ok=True)
    (fleeter.home / "config.toml").write_text(BOM + '[claude]\nexecutabel = "claude"\n', encoding="utf-8")
    fleeter.write_tasks(TASK)
    assert errors_of(fleeter) == [
        f"ERROR: {fleeter.home / 'config.toml'}:2: claude.executabel: unknown key (did you mean 'executable'?)"
    ]
    (fleeter.home / "config.toml").unlink()
    (fleeter.home / "policy.toml").write_text(BOM + "[local]\nmax_task = 2\n", encoding="utf-8")
    assert errors_of(fleeter, "work", "--until-idle") == [
        f"ERROR: {fleeter.home / 'policy.toml'}:2: local.max_task: unknown key (did you mean 'max_tasks'?)"
    ]


def test_machine_level_keys_are_refused_only_where_machine_ok_is_false() -> None:
    """``ConfigKey(machine=True)``, on a key or on the table's own declaration: fine in
    config.toml, an error in a project file (``check_config(machine_ok=False)``)."""
    from fleetrun.config import check_config
    from fleetrun.tomlfile import map_lines, tomllib

    decls = [
        fleetrun.ConfigKey("site", "", machine=True),
        fleetrun.ConfigKey("site", "name", (str,)),
        fleetrun.ConfigKey("tool", "path", (str,), machine=True),
        fleetrun.ConfigKey("tool", "mode", (str,)),
    ]
    text = '[site]\nname = "a"\n\n[tool]\npath = "/opt/x"\nmode = "fast"\n'
    data = tomllib.loads(text)
    assert check_config(data, map_lines(text), decls, "config.toml") == []
    got = [e.format() for e in check_config(data, map_lines(text), decls, "fleetrun.toml", machine_ok=False)]
    why = "is a setting of this machine: it belongs in $FLEETRUN_HOME/config.toml, not in the project file"
    assert got == [f"ERROR: fleetrun.toml:1: site: {why}", f"ERROR: fleetrun.toml:5: tool.path: {why}"]


def test_output_max_bytes_is_checked(fleeter: Any) -> None:
    """``[output] max_bytes`` (issue 21 item 5) is a whole number of bytes, at least 4096,
    strict like every table."""
    fleeter.write_config('[output]\nmax_bytes = "20MB"\n')
    fleeter.write_tasks(TASK)
    where = fleeter.home / "config.toml"
    r = fleeter.run("validate", "tasks.toml")
    assert (r.ret, r.errlines) == (
        USAGE_ERROR,
        [f"ERROR: {where}:2: output.max_bytes: expected a whole number, got a string"],
    )
    fleeter.write_config("[output]\nmax_bytes = 100\nmax_byte = 5000\n")
    r = fleeter.run("validate", "tasks.toml")
    assert (r.ret, r.errlines) == (
        USAGE_ERROR,
        [
            f"ERROR: {where}:2: output.max_bytes: must be at least 4096 (bytes), got 100",
            f"ERROR: {where}:3: output.max_byte: unknown key (did you mean 'max_bytes'?)",
        ],
    )
    fleeter.write_config("[output]\nmax_bytes = 1_000_000\n")
    assert fleeter.run("validate", "tasks.toml").ret == 0

"""fleetrun/plugins/mailbox/settings.py: fleetrun's Claude Code hooks and allow rules merged
into a role directory's .claude/settings.local.json (or the user's settings.json), and
taken out again (issue 13, ``fleetrun role install-hooks``).

The last tests run the real fake claude in a directory after ``install()``: the Stop
hook it runs is the installed one, and the allow rules let ``-p`` mode run the report
command the block reason gives, where without them the fake refuses it.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from fuzz_targets import JSON
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from fleetrun import UsageError
from fleetrun.plugins.mailbox import hookio, settings

FAKE = Path(__file__).parent / "fakes" / "claude"
CMD = "/opt/fleet/bin/fleetrun"
STOP = f"{CMD} mailbox stop-hook"
EDIT = f"{CMD} role note-edit"
RULES = [f"Bash({CMD} mailbox done:*)", f"Bash({CMD} mailbox fail:*)", f"Bash({CMD} mailbox read:*)"]


@pytest.fixture
def role(tmp_path: Path) -> Path:
    path = tmp_path / "role"
    path.mkdir()
    return path


def local(role: Path) -> Path:
    return role / ".claude" / "settings.local.json"


def read(path: Path) -> Any:
    return json.loads(path.read_text())


def commands(data: dict[str, Any], event: str) -> list[str]:
    return [h["command"] for g in data.get("hooks", {}).get(event, []) for h in g.get("hooks", [])]


# --------------------------------------------------------------------------- what is written


def test_install_writes_the_hooks_and_rules_to_settings_local_json(role: Path) -> None:
    change = settings.install(role, CMD)
    assert change.changed and change.path == local(role)
    data = read(local(role))
    assert data["hooks"]["Stop"] == [{"hooks": [{"type": "command", "command": STOP, "timeout": 10}]}]
    assert data["hooks"]["PostToolUse"] == [
        {"matcher": "Write|Edit|MultiEdit", "hooks": [{"type": "command", "command": EDIT, "timeout": 10}]}
    ]
    assert data["permissions"] == {"allow": RULES}
    assert not (role / ".claude" / "settings.json").exists()  # the project's file is not touched
    # private: a new file 0600, a new .claude/ 0700
    assert stat.S_IMODE(local(role).stat().st_mode) == 0o600
    assert stat.S_IMODE((role / ".claude").stat().st_mode) == 0o700
    assert "Stop hook" in change.describe() and str(local(role)) in change.describe()
    assert len(change.added) == 5 and change.removed == []


def test_modes_hold_whatever_the_umask(role: Path) -> None:
    old = os.umask(0)
    try:
        settings.install(role, CMD)
    finally:
        os.umask(old)
    assert stat.S_IMODE(local(role).stat().st_mode) == 0o600
    assert stat.S_IMODE((role / ".claude").stat().st_mode) == 0o700


def test_a_failed_write_leaves_the_file_as_it_was(role: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (role / ".claude").mkdir()
    local(role).write_text('{"model": "opus"}')

    def boom(*args: Any, **kwargs: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(settings.os, "replace", boom)
    with pytest.raises(OSError):
        settings.install(role, CMD)
    assert local(role).read_text() == '{"model": "opus"}'
    assert os.listdir(role / ".claude") == ["settings.local.json"]


def test_a_second_install_changes_nothing_and_says_so(role: Path) -> None:
    settings.install(role, CMD)
    before = local(role).read_bytes()
    mtime = local(role).stat().st_mtime_ns
    again = settings.install(role, CMD)
    assert not again.changed and again.added == [] and "already installed" in again.describe()
    assert local(role).read_bytes() == before and local(role).stat().st_mtime_ns == mtime


USERS = {
    "$schema": "https://json.schemastore.org/claude-code-settings.json",
    "model": "opus",
    "hooks": {
        "Stop": [{"hooks": [{"type": "command", "command": "notify-send done"}]}],
        "PostToolUse": [{"matcher": "Write", "hooks": [{"type": "command", "command": "ruff format"}]}],
        "PreToolUse": [{"matcher": "Bash", "hooks": [{"type": "command", "command": "guard.sh"}]}],
    },
    "permissions": {"allow": ["Bash(make test)"], "deny": ["Read(./.env)"], "defaultMode": "acceptEdits"},
    "env": {"X": "ü"},
}


def test_install_merges_and_never_clobbers_the_users_own(role: Path) -> None:
    (role / ".claude").mkdir()
    local(role).write_text(json.dumps(USERS, indent=4))
    local(role).chmod(0o640)
    settings.install(role, CMD)
    data = read(local(role))
    assert list(data) == list(USERS)  # their keys, in their order
    assert commands(data, "Stop") == ["notify-send done", STOP]
    assert commands(data, "PostToolUse") == ["ruff format", EDIT]
    assert data["hooks"]["PostToolUse"][0] == USERS["hooks"]["PostToolUse"][0]  # their matcher stays
    assert data["hooks"]["PreToolUse"] == USERS["hooks"]["PreToolUse"]
    assert data["permissions"]["allow"] == ["Bash(make test)", *RULES]
    assert data["permissions"]["deny"] == ["Read(./.env)"] and data["permissions"]["defaultMode"] == "acceptEdits"
    assert data["env"] == {"X": "ü"} and data["$schema"] == USERS["$schema"]
    assert stat.S_IMODE(local(role).stat().st_mode) == 0o640  # an existing file's mode is kept
    # and --remove gives back exactly what was there
    removed = settings.install(role, CMD, remove=True)
    assert removed.changed and len(removed.removed) == 5 and "removed" in removed.describe()
    assert read(local(role)) == USERS
    assert stat.S_IMODE(local(role).stat().st_mode) == 0o640


def test_install_adds_only_what_is_missing(role: Path) -> None:
    (role / ".claude").mkdir()
    # the Stop hook already there, in a group of the user's; one rule already there
    local(role).write_text(
        json.dumps(
            {
                "hooks": {
                    "Stop": [{"hooks": [{"type": "command", "command": "mine"}, {"type": "command", "command": STOP}]}]
                },
                "permissions": {"allow": [RULES[1]]},
            }
        )
    )
    change = settings.install(role, CMD)
    assert len(change.added) == 3  # the PostToolUse hook and two rules
    data = read(local(role))
    assert commands(data, "Stop") == ["mine", STOP]
    assert data["permissions"]["allow"] == [RULES[1], RULES[0], RULES[2]]
    settings.install(role, CMD, remove=True)
    assert read(local(role)) == {"hooks": {"Stop": [{"hooks": [{"type": "command", "command": "mine"}]}]}}


def test_remove_takes_out_only_fleetruns_and_leaves_no_empty_file(role: Path) -> None:
    settings.install(role, CMD)
    other = "/elsewhere/fleetrun"
    settings.install(role, other)  # another install (another home, another venv) is not ours to remove
    settings.install(role, CMD, remove=True)
    data = read(local(role))
    assert commands(data, "Stop") == [f"{other} mailbox stop-hook"]
    settings.install(role, other, remove=True)
    assert not local(role).exists()  # it held nothing but what fleetrun added
    again = settings.install(role, other, remove=True)
    assert not again.changed and "nothing to remove" in again.describe()


def test_remove_without_a_file_changes_nothing(role: Path) -> None:
    change = settings.install(role, CMD, remove=True)
    assert not change.changed and not (role / ".claude").exists()


# --------------------------------------------------------------------------- any file

OTHER = "/elsewhere/fleetrun"
HOOK_LINES = st.sampled_from(["notify-send done", "ruff format", STOP, EDIT, f"{OTHER} mailbox stop-hook", ""])
ENTRY = st.fixed_dictionaries(
    {"type": st.just("command"), "command": HOOK_LINES}, optional={"timeout": st.integers(1, 60)}
)
GROUP = st.fixed_dictionaries(
    {"hooks": st.lists(ENTRY, max_size=3)},
    optional={"matcher": st.sampled_from(["", "Write", "Write|Edit|MultiEdit", "*"])},
)
SETTINGS = st.fixed_dictionaries(
    {},
    optional={
        "model": st.text(max_size=5),
        "hooks": st.dictionaries(
            st.sampled_from(["Stop", "PostToolUse", "PreToolUse", "SessionStart"]),
            st.lists(GROUP, max_size=3),
            max_size=3,
        ),
        "permissions": st.fixed_dictionaries(
            {},
            optional={
                "allow": st.lists(st.sampled_from(["Bash(make test)", "Read", *RULES]), max_size=4),
                "deny": st.lists(st.just("Read(./.env)"), max_size=1),
            },
        ),
        "env": st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2),
    },
)


def without_ours(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` less fleetrun's entries (for CMD: the Stop hook under Stop, the edit hook
    under PostToolUse, the three rules) and the groups they alone filled, and less the
    empty hook lists, ``hooks``, ``allow`` and ``permissions`` (which mean nothing):
    what --remove promises to leave."""
    out = json.loads(json.dumps(data))
    hooks = out.get("hooks", {})
    for event, line in (("Stop", STOP), ("PostToolUse", EDIT)):
        groups = []
        for group in hooks.get(event, []):
            kept = [e for e in group["hooks"] if e["command"] != line]
            if kept or not group["hooks"]:
                groups.append({**group, "hooks": kept})
        if groups:
            hooks[event] = groups
        else:
            hooks.pop(event, None)
    if not hooks:
        out.pop("hooks", None)
    perms = out.get("permissions", {})
    perms["allow"] = [r for r in perms.get("allow", []) if r not in RULES]
    if not perms["allow"]:
        del perms["allow"]
    if not perms:
        out.pop("permissions", None)
    return out


@hsettings(max_examples=150, deadline=None)
@given(SETTINGS)
def test_install_then_remove_keeps_everything_of_the_users(data: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        role = Path(tmp)
        (role / ".claude").mkdir()
        local(role).write_text(json.dumps(data))
        settings.install(role, CMD)
        installed = read(local(role))
        for event, line in (("Stop", STOP), ("PostToolUse", EDIT)):
            assert line in commands(installed, event)
        assert all(r in installed["permissions"]["allow"] for r in RULES)
        assert without_ours(installed) == without_ours(data)  # nothing of the user's lost or moved
        assert not settings.install(role, CMD).changed
        settings.install(role, CMD, remove=True)
        left = read(local(role)) if local(role).exists() else {}
        assert without_ours(left) == left == without_ours(data)
        assert STOP not in commands(left, "Stop") and EDIT not in commands(left, "PostToolUse")


@hsettings(max_examples=150, deadline=None)
@given(JSON | st.fixed_dictionaries({}, optional={"hooks": JSON, "permissions": JSON}), st.booleans())
def test_any_json_is_merged_or_refused_and_left_untouched(value: Any, remove: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        role = Path(tmp)
        (role / ".claude").mkdir()
        text = json.dumps(value)
        local(role).write_text(text)
        try:
            settings.install(role, CMD, remove=remove)
        except UsageError as e:
            assert e.file == str(local(role)) and local(role).read_text() == text
        else:
            assert isinstance(value, dict)
        assert [n for n in os.listdir(role / ".claude") if n != "settings.local.json"] == []


# --------------------------------------------------------------------------- refused


@pytest.mark.parametrize(
    "text, why",
    [
        ("{not json", "is not JSON"),
        ("", "is not JSON"),
        ("[]", "is not a JSON object"),
        ('{"hooks": []}', "hooks is not an object"),
        ('{"hooks": {"Stop": {"hooks": []}}}', "hooks.Stop is not a list"),
        ('{"hooks": {"Stop": ["cmd"]}}', "hooks.Stop[0] is not an object"),
        ('{"hooks": {"PostToolUse": [{"matcher": "x", "hooks": "cmd"}]}}', "hooks.PostToolUse[0].hooks is not a list"),
        ('{"hooks": {"Stop": [{"hooks": ["cmd"]}]}}', "hooks.Stop[0].hooks[0] is not an object"),
        ('{"permissions": []}', "permissions is not an object"),
        ('{"permissions": {"allow": "Bash"}}', "permissions.allow is not a list of strings"),
        ('{"permissions": {"allow": [1]}}', "permissions.allow is not a list of strings"),
        ('{"a": 1, "a": 2}', "key 'a' appears twice"),
        ('{"a": NaN}', "is not JSON"),
        ('{"hooks": null}', "hooks is not an object"),
        ('{"hooks": {"Stop": null}}', "hooks.Stop is not a list"),
        ('{"hooks": {"Stop": [{"hooks": null}]}}', "hooks.Stop[0].hooks is not a list"),
        ('{"permissions": null}', "permissions is not an object"),
        ('{"permissions": {"allow": null}}', "permissions.allow is not a list of strings"),
    ],
)
@pytest.mark.parametrize("remove", [False, True])
def test_a_file_of_the_wrong_shape_is_refused_and_left_untouched(role: Path, text: str, why: str, remove: bool) -> None:
    (role / ".claude").mkdir()
    local(role).write_text(text)
    with pytest.raises(UsageError) as info:
        settings.install(role, CMD, remove=remove)
    assert why in info.value.message and info.value.file == str(local(role))
    assert local(role).read_text() == text
    assert os.listdir(role / ".claude") == ["settings.local.json"]  # no temp file left


def test_a_symlinked_settings_file_is_refused(role: Path, tmp_path: Path) -> None:
    """The agent can write the role's directory: a link there must not lead fleetrun
    to write the file it points to."""
    target = tmp_path / "victim.json"
    target.write_text("{}")
    (role / ".claude").mkdir()
    local(role).symlink_to(target)
    with pytest.raises(UsageError, match="is a symbolic link"):
        settings.install(role, CMD)
    assert target.read_text() == "{}" and local(role).is_symlink()


def test_a_symlinked_claude_folder_is_refused(role: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (role / ".claude").symlink_to(elsewhere)
    with pytest.raises(UsageError, match="is a symbolic link"):
        settings.install(role, CMD)
    assert os.listdir(elsewhere) == []


def test_a_settings_file_that_is_not_a_regular_file_is_refused(role: Path) -> None:
    (role / ".claude").mkdir()
    os.mkfifo(local(role))  # opening a FIFO for reading would hang
    with pytest.raises(UsageError, match="not a regular file"):
        settings.install(role, CMD)


def test_the_directory_must_exist_and_is_made_canonical(tmp_path: Path, role: Path) -> None:
    with pytest.raises(UsageError, match="not a directory"):
        settings.install(tmp_path / "missing", CMD)
    (tmp_path / "file").write_text("")
    with pytest.raises(UsageError, match="not a directory"):
        settings.install(tmp_path / "file", CMD)
    (tmp_path / "alias").symlink_to(role)
    change = settings.install(tmp_path / "alias" / ".", CMD)
    assert change.path == role.resolve() / ".claude" / "settings.local.json"
    assert not settings.install(role, CMD).changed  # one place, one install


def test_describe_shows_control_characters_in_a_path(tmp_path: Path) -> None:
    odd = tmp_path / "role\x1b[2J"
    odd.mkdir()
    text = settings.install(odd, CMD).describe()
    assert "\x1b" not in text and "role\\x1b[2J" in text


def test_a_command_with_shell_syntax_is_refused(role: Path) -> None:
    with pytest.raises(UsageError, match="command line"):
        settings.install(role, "fleetrun; rm -rf ~")
    assert not (role / ".claude").exists()


# --------------------------------------------------------------------------- --user


def test_user_writes_the_users_settings_json(tmp_path: Path, role: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "claude-config"
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(config))
    assert settings.user_settings_path() == config / "settings.json"
    change = settings.install(role, CMD, user=True)
    assert change.path == config / "settings.json"
    assert commands(read(config / "settings.json"), "Stop") == [STOP]
    assert stat.S_IMODE(config.stat().st_mode) == 0o700 and not (role / ".claude").exists()
    explicit = tmp_path / "home" / ".claude" / "settings.json"
    explicit.parent.parent.mkdir()
    settings.install(role, CMD, user=True, home_settings=explicit)
    assert read(explicit)["permissions"]["allow"] == RULES
    settings.install(role, CMD, user=True, home_settings=explicit, remove=True)
    assert not explicit.exists()
    monkeypatch.delenv("CLAUDE_CONFIG_DIR")
    assert settings.user_settings_path() == Path.home() / ".claude" / "settings.json"


def test_user_refuses_a_symlinked_settings_file(tmp_path: Path, role: Path) -> None:
    explicit = tmp_path / "claude" / "settings.json"
    explicit.parent.mkdir()
    (tmp_path / "dotfiles.json").write_text("{}")
    explicit.symlink_to(tmp_path / "dotfiles.json")
    with pytest.raises(UsageError, match="is a symbolic link"):
        settings.install(role, CMD, user=True, home_settings=explicit)


# --------------------------------------------------------------------------- the command


def test_default_command_names_this_install_and_a_home_that_is_not_the_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = Path(sys.executable).parent / "fleetrun"
    assert script.exists()  # the console script of the install running the tests
    assert settings.default_command() == str(script)
    assert settings.default_command(Path.home() / ".fleetrun") == str(script)
    home = tmp_path / "my home"
    home.mkdir()
    assert settings.default_command(home) == f"{script} --home '{home.resolve()}'"
    # with no console script next to the interpreter: the interpreter runs the package
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python3"))
    assert settings.default_command() == f"{tmp_path / 'python3'} -m fleetrun"


def test_the_default_command_runs_fleetrun(tmp_path: Path) -> None:
    proc = subprocess.run(
        f"{settings.default_command(tmp_path)} --version", shell=True, capture_output=True, text=True, cwd=tmp_path
    )
    assert proc.returncode == 0 and "fleetrun" in proc.stdout


# --------------------------------------------------------------------------- with the fake claude


def fake_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEETRUN_", "FAKE_CLAUDE_"))}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", os.defpath)
    env["FAKE_CLAUDE_LOG"] = str(tmp_path / "calls.jsonl")
    env["FAKE_CLAUDE_STATE"] = str(tmp_path / "state")
    env["CLAUDE_CONFIG_DIR"] = str(tmp_path / "claude-config")  # the user's own stay out
    return env


def recorder(tmp_path: Path, deliver: bool = True) -> str:
    """A stand-in for fleetrun: records each call's argv and stdin; as ``mailbox
    stop-hook`` it hands out task ``task_abc_1`` once (when ``deliver``), as fleetrun
    would."""
    script = tmp_path / "bin" / "fleetrun"
    script.parent.mkdir()
    log = tmp_path / "fleetrun-calls.jsonl"
    script.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        f"sys.path.insert(0, {str(Path(hookio.__file__).parent)!r})\n"
        "import hookio\n"
        "data = sys.stdin.read() if sys.argv[1:3] in (['mailbox', 'stop-hook'], ['role', 'note-edit']) else ''\n"
        f"with open({str(log)!r}, 'a') as f:\n"
        "    f.write(json.dumps({'argv': sys.argv[1:], 'stdin': data}) + '\\n')\n"
        f"if {deliver} and sys.argv[1:3] == ['mailbox', 'stop-hook'] and not hookio.parse_stop(data).stop_hook_active:\n"
        f"    print(hookio.block_decision(hookio.mail_reason('task_abc_1', 'greet', 'Write hello.txt.', {str(script)!r})))\n"
    )
    script.chmod(0o755)
    return str(script)


def recorded(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "fleetrun-calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def run_fake(tmp_path: Path, cwd: Path, steps: list[dict[str, Any]]) -> subprocess.CompletedProcess[bytes]:
    env = fake_env(tmp_path)
    (tmp_path / "scenario.json").write_text(json.dumps({"default": steps}))
    env["FAKE_CLAUDE_SCENARIO"] = str(tmp_path / "scenario.json")
    return subprocess.run(
        [str(FAKE), "-p", "--output-format", "stream-json", "--verbose", "--permission-mode", "acceptEdits", "go"],
        cwd=cwd,
        env=env,
        capture_output=True,
        timeout=30,
    )


def result(proc: subprocess.CompletedProcess[bytes]) -> dict[str, Any]:
    text = proc.stdout.decode()
    found = [json.loads(ln) for ln in text.splitlines() if ln.startswith('{"type":"result"')]
    assert len(found) == 1, text
    return found[0]


def test_a_whole_turn_with_the_fake_claude(tmp_path: Path, role: Path) -> None:
    """install() → a session in the directory runs the Stop hook command with the hook
    JSON → the block reason hands it the task → it does it → it runs the report command
    the reason gave, which the allow rule lets run in -p mode → it stops."""
    cmd = recorder(tmp_path)
    done, _ = hookio.report_commands("task_abc_1", cmd)
    done = done.replace("what you did, in one line", "wrote hello")
    steps = [
        {"actions": [["write", "a.txt", "a"]], "result": "first turn"},
        {"actions": [["write", "hello.txt", "hello"], ["bash", done]], "result": "reported"},
    ]
    settings.install(role, cmd)
    proc = run_fake(tmp_path, role, steps)
    assert proc.returncode == 0, proc.stderr
    res = result(proc)
    assert res["result"] == "reported" and res["permission_denials"] == []
    calls = recorded(tmp_path)
    assert [c["argv"] for c in calls] == [
        ["role", "note-edit"],
        ["mailbox", "stop-hook"],
        ["role", "note-edit"],
        ["mailbox", "done", "task_abc_1", "--summary", "wrote hello"],
        ["mailbox", "stop-hook"],
    ]
    edit = hookio.parse_post_tool_use(calls[0]["stdin"])
    assert edit.file_path == str(role / "a.txt") and edit.tool_name == "Write"
    first, second = hookio.parse_stop(calls[1]["stdin"]), hookio.parse_stop(calls[4]["stdin"])
    assert (first.cwd, first.stop_hook_active, first.last_assistant_message) == (str(role), False, "first turn")
    assert second.stop_hook_active and second.session_id == first.session_id
    # the session was told the task by the block reason
    prompts = [json.loads(ln)["prompt"] for ln in (tmp_path / "calls.jsonl").read_text().splitlines()]
    assert prompts[1] == hookio.mail_reason("task_abc_1", "greet", "Write hello.txt.", cmd)


@pytest.mark.parametrize("where", ["none", "project", "removed"])
def test_without_the_local_rules_the_report_is_refused(tmp_path: Path, role: Path, where: str) -> None:
    """The same report command, refused: with nothing installed, with the rules in the
    project's settings.json (measured: they do not count there), and after --remove."""
    cmd = recorder(tmp_path, deliver=False)
    done = hookio.report_commands("task_abc_1", cmd)[0]
    if where == "project":
        settings.install(role, cmd)
        local(role).rename(role / ".claude" / "settings.json")
    elif where == "removed":
        settings.install(role, cmd)
        settings.install(role, cmd, remove=True)
    proc = run_fake(tmp_path, role, [{"actions": [["bash", done]], "result": "tried"}])
    assert [d["tool_input"]["command"] for d in result(proc)["permission_denials"]] == [done]
    assert not [c for c in recorded(tmp_path) if c["argv"][:2] == ["mailbox", "done"]]


def test_user_settings_let_the_report_run_too(tmp_path: Path, role: Path) -> None:
    cmd = recorder(tmp_path, deliver=False)
    done = hookio.report_commands("task_abc_1", cmd)[0]
    settings.install(role, cmd, user=True, home_settings=tmp_path / "claude-config" / "settings.json")
    proc = run_fake(tmp_path, role, [{"actions": [["bash", done]], "result": "tried"}])
    assert result(proc)["permission_denials"] == []
    assert [c["argv"][:3] for c in recorded(tmp_path)].count(["mailbox", "done", "task_abc_1"]) == 1

"""fleetrun/plugins/mailbox/hookio.py: Claude Code's hook JSON read strictly, the block
decision, and the reason that hands a delivered task to a role's session (issue 13)."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fuzz_targets import JSON, NASTY_TEXT, shaped
from hypothesis import given, settings
from hypothesis import strategies as st

import fleetrun
from fleetrun.plugins.mailbox import hookio

MAILBOX_DIR = Path(fleetrun.__file__).resolve().parent / "plugins" / "mailbox"
HookInputError = hookio.HookInputError

SID = "4b0c2f5e-8f3a-4d59-9a63-2f6c6e1d8a10"


def stop_json(**over: Any) -> str:
    data = {
        "session_id": SID,
        "transcript_path": f"/home/u/.claude/projects/-w/{SID}.jsonl",
        "cwd": "/w/role",
        "permission_mode": "acceptEdits",
        "hook_event_name": "Stop",
        "stop_hook_active": False,
        "last_assistant_message": "done",
    }
    data.update(over)
    return json.dumps({k: v for k, v in data.items() if v is not DROP})


def edit_json(**over: Any) -> str:
    data = {
        "session_id": SID,
        "transcript_path": "/t.jsonl",
        "cwd": "/w/role",
        "hook_event_name": "PostToolUse",
        "tool_name": "Write",
        "tool_input": {"file_path": "/w/role/src/a.py", "content": "x"},
        "tool_use_id": "toolu_1",
        "tool_response": "ok",
    }
    data.update(over)
    return json.dumps({k: v for k, v in data.items() if v is not DROP})


DROP = object()


# --------------------------------------------------------------------------- stdlib only


def test_hookio_imports_the_standard_library_only() -> None:
    """It runs in the Stop hook of every turn: no fleetrun, no third-party module, lazy
    imports included."""
    tree = ast.parse((MAILBOX_DIR / "hookio.py").read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "a relative import"
            names.add((node.module or "").split(".")[0])
    assert names and names <= set(sys.stdlib_module_names), names - set(sys.stdlib_module_names)
    # and loading it pulls in nothing else either
    code = (
        "import sys, importlib.util as u; before = set(sys.modules); "
        f"s = u.spec_from_file_location('h', {str(MAILBOX_DIR / 'hookio.py')!r}); m = u.module_from_spec(s); "
        "sys.modules['h'] = m; s.loader.exec_module(m); "
        "print(sorted({n.split('.')[0] for n in set(sys.modules) - before} - {'h'}))"
    )
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, check=True)
    assert set(json.loads(out.stdout.replace("'", '"'))) <= set(sys.stdlib_module_names)


# --------------------------------------------------------------------------- Stop


def test_parse_stop_reads_what_claude_code_sends() -> None:
    got = hookio.parse_stop(stop_json())
    assert got == hookio.StopInput(
        session_id=SID,
        transcript_path=f"/home/u/.claude/projects/-w/{SID}.jsonl",
        cwd="/w/role",
        stop_hook_active=False,
        last_assistant_message="done",
    )
    assert got.hook_event_name == "Stop"
    assert hookio.parse_stop(stop_json(stop_hook_active=True).encode()).stop_hook_active is True
    # optional fields
    lean = hookio.parse_stop(stop_json(last_assistant_message=DROP, transcript_path=DROP, stop_hook_active=DROP))
    assert (lean.last_assistant_message, lean.transcript_path, lean.stop_hook_active) == (None, None, False)
    assert hookio.parse_stop(stop_json(last_assistant_message=None)).last_assistant_message is None
    long = hookio.parse_stop(stop_json(last_assistant_message="x" * (hookio.MESSAGE_LIMIT + 10)))
    assert len(long.last_assistant_message) == hookio.MESSAGE_LIMIT


@pytest.mark.parametrize(
    "text, why",
    [
        (b"", "not JSON"),
        (b"\xff\xfe{}", "not UTF-8"),
        ("[1, 2]", "not a JSON object"),
        ("[" * 100_000, "nested too deeply"),
        ('{"a": ' * 100_000, "nested too deeply"),
        (stop_json(hook_event_name="PostToolUse"), "hook_event_name is 'PostToolUse'"),
        (stop_json(hook_event_name=DROP), "hook_event_name is NoneType"),
        (stop_json(stop_hook_active="no"), "stop_hook_active is 'no', not a boolean"),
        (stop_json(stop_hook_active=0), "not a boolean"),
        (stop_json(session_id=DROP), "session_id is NoneType"),
        (stop_json(session_id="a b"), "session_id is not a valid value"),
        (stop_json(session_id="x" * 200), "longer than 128"),
        (stop_json(cwd="relative/dir"), "cwd is not an absolute path"),
        (stop_json(cwd="/w/\x1b[2J"), "cwd holds a control character"),
        (stop_json(cwd="/w/\ud800"), "control character"),
        (stop_json(cwd=["/w"]), "cwd is list"),
        (stop_json(cwd="/" + "a" * 5000), "longer than 4096"),
        (stop_json(last_assistant_message=7), "last_assistant_message is int"),
        (stop_json(transcript_path=False), "transcript_path is bool"),
        ('{"session_id": "a", "session_id": "b"}', "'session_id' given twice"),
        (stop_json(stop_hook_active=DROP)[:-1] + ', "x": NaN}', "NaN is not JSON"),
        ('{"n": ' + "9" * 5000 + "}", "not JSON"),
    ],
)
def test_parse_stop_refuses_with_a_reason(text: Any, why: str) -> None:
    with pytest.raises(HookInputError) as info:
        hookio.parse_stop(text)
    assert why in info.value.reason and str(info.value) == info.value.reason


def test_input_over_the_cap_is_refused_before_it_is_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hookio, "MAX_INPUT", 100)
    with pytest.raises(HookInputError, match="more than 100 bytes"):
        hookio.parse_stop(stop_json().encode())
    with pytest.raises(HookInputError, match="more than 100 characters"):
        hookio.parse_stop(stop_json())
    with pytest.raises(HookInputError, match="not text"):
        hookio.parse_stop(12)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- PostToolUse


@pytest.mark.parametrize(
    "tool, tool_input, path",
    [
        ("Write", {"file_path": "/w/role/src/a.py", "content": "x"}, "/w/role/src/a.py"),
        ("Edit", {"file_path": "/w/role/src/../b.py", "old_string": "a", "new_string": "b"}, "/w/role/b.py"),
        ("MultiEdit", {"file_path": "src/c.py", "edits": []}, "/w/role/src/c.py"),  # relative: from cwd
        ("NotebookEdit", {"notebook_path": "/w/role/n.ipynb", "new_source": ""}, "/w/role/n.ipynb"),
        ("NotebookEdit", {"file_path": "/w/role/m.ipynb"}, "/w/role/m.ipynb"),
        ("Bash", {"command": "ls"}, None),
        ("mcp__files__write", {"file_path": "/elsewhere"}, None),
    ],
)
def test_parse_post_tool_use(tool: str, tool_input: dict[str, Any], path: Any) -> None:
    got = hookio.parse_post_tool_use(edit_json(tool_name=tool, tool_input=tool_input))
    assert got == hookio.EditInput(session_id=SID, cwd="/w/role", tool_name=tool, file_path=path)


@pytest.mark.parametrize(
    "over, why",
    [
        ({"hook_event_name": "Stop"}, "not 'PostToolUse'"),
        ({"tool_name": DROP}, "tool_name is NoneType"),
        ({"tool_name": "Wr ite"}, "tool_name is not a valid value"),
        ({"tool_input": DROP}, "tool_input is NoneType, not an object"),
        ({"tool_input": "file_path=/x"}, "not an object"),
        ({"tool_input": {"content": "x"}}, "file_path is NoneType"),
        ({"tool_input": {"file_path": 3}}, "file_path is int"),
        ({"tool_input": {"file_path": "/w/a\nb"}}, "file_path holds a control character"),
        ({"tool_input": {"file_path": ""}}, "file_path is empty"),
        ({"cwd": "~/w"}, "not an absolute path"),
    ],
)
def test_parse_post_tool_use_refuses_with_a_reason(over: dict[str, Any], why: str) -> None:
    with pytest.raises(HookInputError) as info:
        hookio.parse_post_tool_use(edit_json(**over))
    assert why in info.value.reason


# --------------------------------------------------------------------------- fuzzed

STOP_KEYS: dict[str, Any] = {
    "session_id": st.uuids().map(str) | st.text(max_size=20),
    "transcript_path": st.just("/t/x.jsonl") | st.text(max_size=20),
    "cwd": st.just("/w") | st.text(max_size=20) | NASTY_TEXT,
    "hook_event_name": st.sampled_from(["Stop", "PostToolUse", "SessionStart"]),
    "stop_hook_active": st.booleans(),
    "last_assistant_message": st.text(max_size=30) | NASTY_TEXT,
}
EDIT_KEYS: dict[str, Any] = {
    "session_id": st.uuids().map(str),
    "cwd": st.just("/w") | NASTY_TEXT,
    "hook_event_name": st.sampled_from(["PostToolUse", "Stop"]),
    "tool_name": st.sampled_from(list(hookio.EDIT_TOOLS) + ["Bash", "Read", "a b", ""]),
    "tool_input": shaped(
        {"file_path": st.just("/w/a") | st.text(max_size=20) | NASTY_TEXT, "notebook_path": st.just("n.ipynb")}
    ),
}


def _value_or_reason(parse: Any, text: Any) -> None:
    try:
        got = parse(text)
    except HookInputError as e:
        assert isinstance(e.reason, str) and e.reason
        assert not re.search("[\x00-\x1f\x7f]", e.reason)  # a reason is safe to log as it is
        return
    assert isinstance(got.session_id, str) and got.cwd.startswith("/")
    if isinstance(got, hookio.EditInput):
        assert got.file_path is None or (got.file_path.startswith("/") and got.tool_name in hookio.EDIT_TOOLS)
    else:
        assert isinstance(got.stop_hook_active, bool)
        assert got.last_assistant_message is None or isinstance(got.last_assistant_message, str)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_give_a_value_or_the_one_error(data: bytes) -> None:
    _value_or_reason(hookio.parse_stop, data)
    _value_or_reason(hookio.parse_post_tool_use, data)


@settings(max_examples=300, deadline=None)
@given(shaped(STOP_KEYS) | JSON, st.booleans())
def test_any_json_gives_a_stop_input_or_the_one_error(value: Any, as_bytes: bool) -> None:
    text = json.dumps(value)
    _value_or_reason(hookio.parse_stop, text.encode("utf-8", "surrogatepass") if as_bytes else text)


@settings(max_examples=300, deadline=None)
@given(shaped(EDIT_KEYS) | JSON)
def test_any_json_gives_an_edit_input_or_the_one_error(value: Any) -> None:
    _value_or_reason(hookio.parse_post_tool_use, json.dumps(value))


# --------------------------------------------------------------------------- the decision


def test_block_decision_is_the_json_claude_code_reads() -> None:
    line = hookio.block_decision("Do it.\n\tThen report.")
    assert "\n" not in line and line.isascii()
    assert json.loads(line) == {"decision": "block", "reason": "Do it.\n\tThen report."}


def test_block_decision_strips_control_characters_and_caps_the_reason() -> None:
    got = json.loads(hookio.block_decision("a\x1b[2Jb\rc\x00d\u202ee\x9bf\ud800g"))["reason"]
    assert got == "a[2Jbcdefg"  # the ESC is gone, what it introduced is inert text
    long = json.loads(hookio.block_decision("x" * (hookio.REASON_LIMIT * 2)))["reason"]
    assert len(long) == hookio.REASON_LIMIT and long.endswith("\u2026")


# --------------------------------------------------------------------------- the mail reason

CMD = "/opt/fleet/bin/fleetrun --home /srv/fleet-home"
#: What Claude Code's Bash tool will not run as one plain command (issue 13, measured).
FORBIDDEN = ("$(", "`", "|", ";", "&&")
HOSTILE = st.sampled_from(
    [
        "$(rm -rf ~)",
        "`id`",
        "a | b",
        "x; y",
        "p && q",
        "\x1b]0;t\x07",
        "ok\ntask_zz",
        "'\"",
        "\\",
        "$HOME",
        "done task_other",
    ]
) | st.text(max_size=60)


def test_mail_reason_gives_the_literal_id_the_prompt_and_the_report_commands() -> None:
    reason = hookio.mail_reason("task_k3x9_1", "fix-login", "Fix the login form.\nKeep the tests green.", CMD)
    assert "task_k3x9_1" in reason and "fix-login" in reason
    assert "Fix the login form.\nKeep the tests green." in reason
    lines = reason.splitlines()
    assert f'{CMD} mailbox done task_k3x9_1 --summary "what you did, in one line"' in lines
    assert f'{CMD} mailbox fail task_k3x9_1 --reason "what stopped you, in one line"' in lines
    assert hookio.report_commands("task_k3x9_1", CMD) == tuple(ln for ln in lines if ln.startswith(CMD))


@settings(max_examples=300, deadline=None)
@given(name=HOSTILE, prompt=HOSTILE | st.text(min_size=1000, max_size=3000))
def test_no_shell_syntax_reaches_the_commands_whatever_the_name_and_prompt(name: str, prompt: str) -> None:
    reason = hookio.mail_reason("task_abc_2", name, prompt, CMD)
    body = hookio.clean(prompt, hookio.PROMPT_LIMIT)
    start = reason.index(" to you. Do this task now:\n\n") + len(" to you. Do this task now:\n\n")
    head, tail = reason[:start], reason[start + len(body) :]
    assert reason[start : start + len(body)] == body  # the user's prompt, as written (less control characters)
    for outside in (head, tail):  # everything fleetrun wrote around it, the label included
        assert not [f for f in FORBIDDEN if f in outside], outside
    commands = [ln for ln in tail.splitlines() if ln.startswith(CMD)]
    assert commands == list(hookio.report_commands("task_abc_2", CMD))
    assert len(reason) <= hookio.REASON_LIMIT
    assert json.loads(hookio.block_decision(reason))["reason"] == reason  # nothing cut, nothing stripped


def test_a_long_prompt_is_cut_so_the_commands_stay() -> None:
    reason = hookio.mail_reason("t1", "n", "p" * 100_000, "'/a b/fleetrun'")
    assert len(reason) <= hookio.REASON_LIMIT
    assert reason.splitlines()[-2] == "'/a b/fleetrun' mailbox fail t1 --reason \"what stopped you, in one line\""
    longest = hookio.mail_reason("t" * 64, "n" * 500, "p" * 100_000, "/" + "c" * (hookio.COMMAND_LIMIT - 1))
    assert len(longest) <= hookio.REASON_LIMIT


@pytest.mark.parametrize("task_id", ["Task_1", "task-1", "task 1", "", "t" * 65, "task_1;x", "task_1\n", "$(id)"])
def test_mail_reason_refuses_a_task_id_outside_a_z0_9_(task_id: str) -> None:
    with pytest.raises(ValueError, match="not a task id"):
        hookio.mail_reason(task_id, "n", "p", CMD)


@pytest.mark.parametrize(
    "cmd",
    [
        "fleetrun | tee x",
        "fleetrun; rm x",
        "fleetrun && x",
        "$(which fleetrun)",
        "`which fleetrun`",
        "'/a/$(x)/fleetrun'",
        "fleetrun\nx",
        "fleetrun  x",
        "",
        "FLEETRUN_HOME=$H fleetrun",
        "x" * 2000,
    ],
)
def test_a_command_with_shell_syntax_is_refused(cmd: str) -> None:
    with pytest.raises(ValueError, match="command line"):
        hookio.check_command(cmd)


@pytest.mark.parametrize("cmd", ["fleetrun", CMD, "'/a b/fleetrun' --home '/h o/me'", "/usr/bin/python3 -m fleetrun"])
def test_a_plain_command_is_accepted(cmd: str) -> None:
    assert hookio.check_command(cmd) == cmd

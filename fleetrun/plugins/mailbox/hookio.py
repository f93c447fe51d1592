"""Claude Code's hook input, read strictly, and the block decision a Stop hook prints.

``fleetrun mailbox stop-hook`` runs at the end of every turn of every session in a
role's directory, and ``fleetrun role note-edit`` after every edit, so this module is
on the path of every one of them: it imports the standard library only (a few
milliseconds; ``import fleetrun.textutil`` alone costs ~50 ms, because it runs
``fleetrun/__init__`` and the config behind it), and never touches the disk.

What Claude Code sends is untrusted (the session's ``cwd``, the tool's ``file_path``
come from what the agent did): every parser here returns a value whose fields have
the promised types and bounds, or raises :class:`HookInputError` with a reason,
never any other exception. The JSON shapes are the measured ones (issue 13): a
``Stop`` hook gets ``session_id``, ``transcript_path``, ``cwd``, ``hook_event_name``,
``stop_hook_active`` and ``last_assistant_message``; a ``PostToolUse`` hook gets
``tool_name`` and ``tool_input`` (``file_path`` for an edit).
"""

from __future__ import annotations

import json
import posixpath
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # typing and dataclasses would double the module's import time
    from typing import Any, Optional, Union

#: The most hook JSON read: a Write's ``tool_input`` holds the whole file it wrote, and
#: ``tool_response`` may repeat it.
MAX_INPUT = 16 * 1024 * 1024
#: Longest path accepted (Linux's PATH_MAX).
MAX_PATH = 4096
#: ``last_assistant_message`` is kept up to this many characters (fleetrun only logs it).
MESSAGE_LIMIT = 64 * 1024
#: The longest block reason printed; a task's prompt is cut first, so the report
#: commands at the end of a mail reason always fit.
REASON_LIMIT = 16_000
#: The longest prompt a mail reason carries.
PROMPT_LIMIT = 12_000
#: A task name shown in a mail reason is a label, cut here.
LABEL_LIMIT = 80
#: The longest command line that runs fleetrun (with the prompt cut to PROMPT_LIMIT,
#: a mail reason then stays under REASON_LIMIT).
COMMAND_LIMIT = 1024

#: The tools whose PostToolUse input names the file they edited.
EDIT_TOOLS = ("Write", "Edit", "MultiEdit", "NotebookEdit")

ELLIPSIS = "\u2026"

# A local copy of fleetrun.textutil's control set (C0, DEL, C1, the bidirectional
# overrides and isolates), plus lone surrogates, which cannot be encoded: importing
# fleetrun.textutil would import fleetrun itself (see the module docstring).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_CONTROL_BUT_LINES = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_SURROGATE = re.compile("[\ud800-\udfff]")
#: What Claude Code's Bash tool refuses to run without asking, or reads as more than
#: one command: ``$(...)`` and ``$VAR`` expansions, backticks, pipes, lists,
#: redirections, subshells. None of them may reach a command line the model is told
#: to run, nor a label it may copy into one.
_SHELL_ACTIVE = re.compile(r"[$`|;&<>()\\\"'!{}*?\[\]#~]")
_SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}\Z")
_TOOL_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,127}\Z")
_TASK_ID = re.compile(r"[a-z0-9_]{1,64}\Z")
#: A command that runs fleetrun, as :func:`fleetrun.plugins.mailbox.settings.default_command`
#: builds it: words of safe characters, or single-quoted words without a quote inside.
_COMMAND = re.compile(
    r"(?:[A-Za-z0-9_@%+=:,./-]+|'[^'\x00-\x1f\x7f]*')(?: (?:[A-Za-z0-9_@%+=:,./-]+|'[^'\x00-\x1f\x7f]*'))*\Z"
)


class HookInputError(ValueError):
    """Hook input that is not what Claude Code sends: the one failure of this module's
    parsers.

    :ivar reason: what was wrong, for a log line.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Record:
    """A small immutable record, compared by value (what a frozen dataclass gives,
    without importing dataclasses: ~13 ms on every hook call)."""

    __slots__: tuple[str, ...] = ()

    def _set(self, **values: object) -> None:
        for name, value in values.items():
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is read-only")

    def _values(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Record) and type(other) is type(self) and self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"{type(self).__name__}({fields})"


class StopInput(_Record):
    """What a ``Stop`` hook is told.

    :ivar session_id: the session's id.
    :ivar transcript_path: where its transcript is, or None when not sent.
    :ivar cwd: the session's working directory (absolute; not resolved, nor checked on
        disk).
    :ivar stop_hook_active: True when the session already goes on because a Stop hook
        blocked its previous stop.
    :ivar last_assistant_message: the session's last reply, cut to
        :data:`MESSAGE_LIMIT`, or None.
    :ivar hook_event_name: always ``"Stop"``.
    """

    __slots__ = ("session_id", "transcript_path", "cwd", "stop_hook_active", "last_assistant_message")
    hook_event_name = "Stop"
    session_id: str
    transcript_path: Optional[str]
    cwd: str
    stop_hook_active: bool
    last_assistant_message: Optional[str]

    def __init__(
        self,
        *,
        session_id: str,
        transcript_path: Optional[str],
        cwd: str,
        stop_hook_active: bool,
        last_assistant_message: Optional[str],
    ) -> None:
        self._set(
            session_id=session_id,
            transcript_path=transcript_path,
            cwd=cwd,
            stop_hook_active=stop_hook_active,
            last_assistant_message=last_assistant_message,
        )


class EditInput(_Record):
    """What a ``PostToolUse`` hook is told, as far as focus needs it.

    :ivar session_id: the session's id.
    :ivar cwd: the session's working directory (absolute).
    :ivar tool_name: the tool that ran (``Write``, ``Bash``, ``mcp__x__y``...).
    :ivar file_path: the file an edit tool (:data:`EDIT_TOOLS`) wrote, absolute and
        normalised (a relative one is taken from ``cwd``); None for any other tool.
    :ivar hook_event_name: always ``"PostToolUse"``.
    """

    __slots__ = ("session_id", "cwd", "tool_name", "file_path")
    hook_event_name = "PostToolUse"
    session_id: str
    cwd: str
    tool_name: str
    file_path: Optional[str]

    def __init__(self, *, session_id: str, cwd: str, tool_name: str, file_path: Optional[str]) -> None:
        self._set(session_id=session_id, cwd=cwd, tool_name=tool_name, file_path=file_path)


# --------------------------------------------------------------------------- parsing


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # two values for one key: which one a reader sees depends on the reader
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise HookInputError(f"key {key[:40]!r} given twice")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise HookInputError(f"{name} is not JSON")


def _object(text: Union[str, bytes, bytearray], event: str) -> dict[str, Any]:
    if isinstance(text, (bytes, bytearray)):
        if len(text) > MAX_INPUT:
            raise HookInputError(f"more than {MAX_INPUT} bytes")
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as e:
            raise HookInputError(f"not UTF-8 (byte {e.start})") from None
    elif not isinstance(text, str):
        raise HookInputError(f"not text: {type(text).__name__}")
    if len(text) > MAX_INPUT:
        raise HookInputError(f"more than {MAX_INPUT} characters")
    try:
        value = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except HookInputError:
        raise
    except RecursionError:
        raise HookInputError("nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, and an integer too long to convert
        raise HookInputError(f"not JSON: {str(e)[:100]}") from None
    if not isinstance(value, dict):
        raise HookInputError("not a JSON object")
    name = value.get("hook_event_name")
    if name != event:
        raise HookInputError(f"hook_event_name is {_show(name)}, not {event!r}")
    return value


def _show(value: object) -> str:
    """A value for an error message: short, and with no control characters."""
    text = repr(value) if isinstance(value, str) else type(value).__name__
    return _CONTROL.sub("?", text[:60])


def _text(
    data: dict[str, Any], key: str, limit: int, pattern: Optional[re.Pattern[str]] = None, required: bool = True
) -> Optional[str]:
    value = data.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str):
        raise HookInputError(f"{key} is {_show(value)}, not a string")
    if not value or len(value) > limit:
        raise HookInputError(f"{key} is empty or longer than {limit} characters")
    if _CONTROL.search(value):
        raise HookInputError(f"{key} holds a control character")
    if pattern is not None and not pattern.match(value):
        raise HookInputError(f"{key} is not a valid value: {_show(value)}")
    return value


def _absolute(data: dict[str, Any], key: str) -> str:
    value = _text(data, key, MAX_PATH)
    assert value is not None
    if not value.startswith("/"):
        raise HookInputError(f"{key} is not an absolute path: {_show(value)}")
    return value


def _common(data: dict[str, Any]) -> tuple[str, str]:
    session_id = _text(data, "session_id", 128, _SESSION_ID)
    assert session_id is not None
    return session_id, _absolute(data, "cwd")


def parse_stop(text: Union[str, bytes, bytearray]) -> StopInput:
    """A ``Stop`` hook's stdin, checked.

    :param text: what the hook read from stdin (at most :data:`MAX_INPUT`).
    :return: the fields fleetrun uses. ``stop_hook_active`` is False when absent, but
        must be a JSON boolean when given; ``last_assistant_message`` may be absent or
        null, else must be a string (cut to :data:`MESSAGE_LIMIT`).
    :raises HookInputError: the input is not a Stop hook's JSON, with why.
    """
    data = _object(text, "Stop")
    session_id, cwd = _common(data)
    transcript = _text(data, "transcript_path", MAX_PATH, required=False)
    active = data.get("stop_hook_active", False)
    if not isinstance(active, bool):  # "no" or 0 is not a boolean
        raise HookInputError(f"stop_hook_active is {_show(active)}, not a boolean")
    message = data.get("last_assistant_message")
    if message is not None:
        if not isinstance(message, str):
            raise HookInputError(f"last_assistant_message is {_show(message)}, not a string")
        message = _SURROGATE.sub("\ufffd", message[:MESSAGE_LIMIT])
    return StopInput(
        session_id=session_id,
        transcript_path=transcript,
        cwd=cwd,
        stop_hook_active=active,
        last_assistant_message=message,
    )


def parse_post_tool_use(text: Union[str, bytes, bytearray]) -> EditInput:
    """A ``PostToolUse`` hook's stdin, checked.

    :param text: what the hook read from stdin (at most :data:`MAX_INPUT`).
    :return: the session, its cwd, the tool, and for an edit tool the file it wrote
        (``tool_input.file_path``; ``notebook_path`` for ``NotebookEdit``, which names
        its file so); the rest of ``tool_input`` is not read.
    :raises HookInputError: the input is not a PostToolUse hook's JSON, or an edit
        tool's input names no file, with why.
    """
    data = _object(text, "PostToolUse")
    session_id, cwd = _common(data)
    tool = _text(data, "tool_name", 128, _TOOL_NAME)
    assert tool is not None
    tool_input = data.get("tool_input")
    if not isinstance(tool_input, dict):
        raise HookInputError(f"tool_input is {_show(tool_input)}, not an object")
    path: Optional[str] = None
    if tool in EDIT_TOOLS:
        key = "notebook_path" if tool == "NotebookEdit" and "notebook_path" in tool_input else "file_path"
        path = _text(tool_input, key, MAX_PATH)
        assert path is not None
        path = posixpath.normpath(posixpath.join(cwd, path))
    return EditInput(session_id=session_id, cwd=cwd, tool_name=tool, file_path=path)


# --------------------------------------------------------------------------- output


def _cap(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + ELLIPSIS


def clean(text: str, limit: int) -> str:
    """Agent-facing text: control characters other than newline and tab taken out
    (a ``\\r`` or an escape sequence would rewrite what a person reading the session
    sees), lone surrogates too, then cut to ``limit`` characters."""
    return _cap(_CONTROL_BUT_LINES.sub("", text), limit)


def block_decision(reason: str) -> str:
    """The line a Stop hook prints to keep the session going with ``reason`` as its
    next instruction (measured: Claude Code reads ``{"decision": "block", "reason":
    TEXT}`` from the hook's stdout).

    :param reason: the instruction; control characters are taken out and it is cut to
        :data:`REASON_LIMIT`.
    :return: one line of JSON, ASCII only (a hook's stdout may have no UTF-8 locale).
    """
    return json.dumps({"decision": "block", "reason": clean(str(reason), REASON_LIMIT)})


def check_command(command: str) -> str:
    """``command`` if it is a command line the Bash tool runs without asking once an
    allow rule names it: plain words, or single-quoted words, one space apart, at most
    :data:`COMMAND_LIMIT` characters.

    :raises ValueError: with why, for anything else (a ``$``, a pipe, a newline...).
    """
    if not isinstance(command, str) or len(command) > COMMAND_LIMIT or not _COMMAND.match(command):
        raise ValueError(
            f"not a plain command line: {_show(command)} (words of letters, digits "
            "and ./_-+=:,@%, or single-quoted words, one space apart)"
        )
    if "$(" in command or "`" in command or "|" in command or ";" in command or "&&" in command:
        # inside single quotes these are inert for a shell, but not for Claude Code's
        # check, which refuses what it cannot analyse statically
        raise ValueError(f"a command line with shell syntax in it: {_show(command)}")
    return command


def _label(name: str) -> str:
    # The model may copy a label into a command: none of the characters the Bash tool
    # refuses survive (each becomes "_"), nor control characters.
    return _SHELL_ACTIVE.sub("_", clean(str(name), LABEL_LIMIT).replace("\n", " ").replace("\t", " "))


def report_commands(task_id: str, fleetrun_cmd: str) -> tuple[str, str]:
    """The two command lines a session runs to report on a task: done, and failed.

    :raises ValueError: a task id that is not ``[a-z0-9_]``, or a command that
        :func:`check_command` refuses.
    """
    if not isinstance(task_id, str) or not _TASK_ID.match(task_id):
        raise ValueError(f"not a task id: {_show(task_id)}")
    cmd = check_command(fleetrun_cmd)
    return (
        f'{cmd} mailbox done {task_id} --summary "what you did, in one line"',
        f'{cmd} mailbox fail {task_id} --reason "what stopped you, in one line"',
    )


def mail_reason(task_id: str, name: str, prompt: str, fleetrun_cmd: str) -> str:
    """The block reason that hands a delivered task to a role's session.

    It gives the literal task id (Claude Code refuses a command with ``$(...)`` in it,
    whatever the rules, so the session is never asked to look the id up), the task's
    prompt, and the two commands to report with, exactly as the allow rules
    :func:`fleetrun.plugins.mailbox.settings.install` adds name them.

    :param task_id: the task's id (``[a-z0-9_]``), put into the commands as it is.
    :param name: the task's name, shown as a label: control characters taken out, the
        characters the Bash tool refuses shown as ``_``, cut to :data:`LABEL_LIMIT`.
    :param prompt: the task's prompt (the user's), control characters taken out, cut to
        :data:`PROMPT_LIMIT`.
    :param fleetrun_cmd: how this machine runs fleetrun (see :func:`check_command`).
    :return: the reason, at most :data:`REASON_LIMIT` characters.
    :raises ValueError: see :func:`report_commands`.
    """
    done, fail = report_commands(task_id, fleetrun_cmd)
    body = clean(str(prompt), PROMPT_LIMIT)
    return (
        f"fleetrun delivered task {task_id} ({_label(name)}) to you. Do this task now:\n"
        f"\n{body}\n\n"
        "When it is done, report it with this command, the summary as plain words inside "
        "the double quotes (no dollar signs, backticks or quotes):\n"
        f"{done}\n"
        "If you cannot do it, run this instead:\n"
        f"{fail}\n"
        f"The task id {task_id} is literal: type it as it is."
    )

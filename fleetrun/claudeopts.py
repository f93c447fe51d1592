"""Claude Code options of a task session (docs/agents.md, "Claude Code options"):
``append_system_prompt``, ``mcp_config``, ``strict_mcp_config``, ``settings``,
``disallowed_tools``, ``max_turns``, ``fallback_model``, ``env`` and ``extra_args``.

Each is a ``[[task]]`` key (so a default of every task too) and a ``[claude]`` key of
``config.toml`` or the project file; a task's value wins over ``[claude]``'s (``env``:
key by key). This module holds their declarations, the checks of their values (the
same for both places), the flags fleetrun owns that ``extra_args`` may not pass, and
the mapping of the values onto Claude Code's own flags. Pure but for reading the JSON
files the user names (trusted, as a tasks file is); the ``claude`` plugin uses it.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

from .exceptions import UsageError
from .taskspec import KeyDecl

if TYPE_CHECKING:
    from .config import Config, ConfigKey
    from .taskspec import TaskSpec

#: The options, in the order their flags go on the command line (``allow_verifiers``
#: has no flag of its own: it adds rules to ``--allowedTools``, :func:`verifier_rules`).
KEYS = (
    "max_turns",
    "fallback_model",
    "append_system_prompt",
    "settings",
    "mcp_config",
    "strict_mcp_config",
    "disallowed_tools",
    "env",
    "extra_args",
    "allow_verifiers",
)

#: The keys whose value names files: relative to the file a task key is written in.
PATH_KEYS = ("settings", "mcp_config")

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")

# -- value checks (a message, or None) ------------------------------------------------------


def _text(v: str) -> Optional[str]:
    if not v.strip():
        return "must not be empty"
    return "must not contain a NUL character" if "\x00" in v else None


def _word(v: str) -> Optional[str]:
    """A model name or a tool rule: one line, printable."""
    if not v.strip():
        return "must not be empty"
    return f"{v!r} holds control characters" if _CONTROL.search(v) else None


def _positive_int(v: Any) -> Optional[str]:
    return None if v > 0 else "must be greater than 0"


def _words(v: Any) -> Optional[str]:
    for item in v:
        if not isinstance(item, str):
            return "must be a list of strings"
        problem = _word(item)
        if problem:
            return f"{item!r}: {problem}" if not problem.startswith(repr(item)) else problem
    return None


def is_json(value: str) -> bool:
    """``value`` is written as JSON, not as a path: as Claude Code tells them apart."""
    return value.lstrip().startswith("{")


def _json_problem(text: str, what: str, needs_servers: bool) -> Optional[str]:
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as e:
        return f"{what} is not valid JSON ({e})"
    if not isinstance(data, dict):
        return f"{what} must be a JSON object"
    if needs_servers and not isinstance(data.get("mcpServers"), dict):
        return f'{what} has no "mcpServers" object (Claude Code\'s MCP configuration: {{"mcpServers": {{...}}}})'
    return None


def source_problem(value: str, needs_servers: bool, base: Optional[Path]) -> Optional[str]:
    """What is wrong with one ``mcp_config`` item or a ``settings`` value: inline JSON
    (checked), or a path, relative to ``base`` (a JSON file, checked; ``base`` None:
    the path must be absolute or start with ``~``)."""
    if not value.strip():
        return "must not be empty"
    if "\x00" in value:
        return "must not contain a NUL character"
    if is_json(value):
        return _json_problem(value, "the inline JSON", needs_servers)
    path = Path(os.path.expanduser(value))
    if not path.is_absolute():
        if base is None:
            return (
                f"{value!r} is a relative path; in [claude] a path is absolute or starts with ~ "
                "(in a task it is relative to the file it is written in)"
            )
        path = base / path
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return f"{value!r} does not exist" + (f" (it is relative to {base})" if base is not None else "")
    except (OSError, UnicodeDecodeError) as e:
        return f"{value!r} cannot be read ({getattr(e, 'strerror', None) or e})"
    return _json_problem(text, repr(value), needs_servers)


def _mcp_shape(v: Any) -> Optional[str]:
    for item in v:
        if not isinstance(item, str):
            return "must be a list of strings (paths, or JSON objects written as strings)"
        if not item.strip():
            return "must not hold an empty string"
        if is_json(item):
            problem = _json_problem(item, "the inline JSON", True)
            if problem:
                return problem
    return None


def _settings_shape(v: str) -> Optional[str]:
    if not v.strip():
        return "must not be empty"
    return _json_problem(v, "the inline JSON", False) if is_json(v) else None


def _env(v: Any) -> Optional[str]:
    for name, value in v.items():
        if not _ENV_NAME.match(name):
            return f"{name!r} is not an environment variable name (letters, digits, _; not a digit first)"
        if name.upper().startswith("FLEETRUN_"):
            return (
                f"{name} is fleetrun's: the FLEETRUN_* variables of a session (FLEETRUN_TASK_ID, "
                "FLEETRUN_WORKTREE, ...) are set by fleetrun and cannot be overridden"
            )
        if not isinstance(value, str):
            return f"{name} must be a string"
        if "\x00" in value:
            return f"{name} must not contain a NUL character"
    return None


#: Flags of Claude Code that fleetrun passes, or whose meaning it depends on: never in
#: ``extra_args``. Each with why.
OWNED_FLAGS: dict[str, str] = {
    "-p": "fleetrun runs every session in print mode",
    "--print": "fleetrun runs every session in print mode",
    "--output-format": "fleetrun reads the session's stream-json",
    "--input-format": "fleetrun writes the prompt on standard input, as text",
    "--verbose": "fleetrun passes it (stream-json needs it)",
    "--session-id": "fleetrun gives each attempt its own session id",
    "-r": "fleetrun resumes sessions itself ([claude] resume_session)",
    "--resume": "fleetrun resumes sessions itself ([claude] resume_session)",
    "-c": "fleetrun resumes sessions itself ([claude] resume_session)",
    "--continue": "fleetrun resumes sessions itself ([claude] resume_session)",
    "--fork-session": "fleetrun records the session id it gave, for a resume",
    "--no-session-persistence": "fleetrun may resume the session",
    "--max-budget-usd": "fleetrun passes what is left of the task's budget_usd",
    "-h": "the CLI would print its help and exit: no session would run",
    "--help": "the CLI would print its help and exit: no session would run",
    "-v": "the CLI would print its version and exit: no session would run",
    "--version": "the CLI would print its version and exit: no session would run",
}

#: Flags that have a key of their own: the key, checked, is the way to pass them.
KEYED_FLAGS: dict[str, str] = {
    "--model": "model",
    "--permission-mode": "permission_mode",
    "--dangerously-skip-permissions": 'permission_mode = "bypassPermissions"',
    "--allowedTools": "allowed_tools",
    "--allowed-tools": "allowed_tools",
    "--disallowedTools": "disallowed_tools",
    "--disallowed-tools": "disallowed_tools",
    "--mcp-config": "mcp_config",
    "--strict-mcp-config": "strict_mcp_config",
    "--settings": "settings",
    "--append-system-prompt": "append_system_prompt",
    "--max-turns": "max_turns",
    "--fallback-model": "fallback_model",
}

#: Claude Code's one-letter options that take a value: the rest of ``-rID`` is that value.
_SHORT_WITH_VALUE = set("drnw")


def denied_flag(arg: str) -> Optional[str]:
    """Why ``arg`` may not be in ``extra_args``, or None: a flag fleetrun owns or one with
    a key of its own, in any spelling the CLI takes (``--output-format=json``, ``-p``
    inside ``-yp``, ``-rID``), or ``--`` (what follows it would be the prompt)."""
    if arg == "--":
        return "'--' ends the options: what follows would be read as the prompt"
    if arg.startswith("--"):
        name = arg.split("=", 1)[0]
        if name in OWNED_FLAGS:
            return f"{arg!r} is fleetrun's own ({OWNED_FLAGS[name]})"
        if name in KEYED_FLAGS:
            return f"{arg!r} has a key of its own: use {KEYED_FLAGS[name]}"
        return None
    if arg in OWNED_FLAGS:
        return f"{arg!r} is fleetrun's own ({OWNED_FLAGS[arg]})"
    if arg.startswith("-") and len(arg) > 1:
        # a cluster, as commander reads one: -cp is -c -p, but -dp is --debug p
        for ch in arg[1:]:
            flag = "-" + ch
            if flag in OWNED_FLAGS:
                return f"{arg!r} is fleetrun's own ({flag}: {OWNED_FLAGS[flag]})"
            if ch in _SHORT_WITH_VALUE or not ch.isalpha():
                break  # the rest is that option's value
    return None


def _extra_args(v: Any) -> Optional[str]:
    if not all(isinstance(a, str) for a in v):
        return "must be a list of strings"
    if v and not v[0].startswith("-"):
        return (
            f"{v[0]!r} is not an option: extra_args start with one (a word before any would be "
            "read as the prompt or as a value of fleetrun's last flag)"
        )
    for arg in v:
        if "\x00" in arg:
            return "must not contain a NUL character"
        problem = denied_flag(arg)
        if problem:
            return problem
    return None


@dataclass(frozen=True)
class OptionDecl:
    """One option: its type, the check of a value of that type, what it means."""

    key: str
    types: tuple[type, ...]
    check: Callable[[Any], Optional[str]]
    doc: str
    items: Optional[type] = None


OPTIONS: tuple[OptionDecl, ...] = (
    OptionDecl("max_turns", (int,), _positive_int, "--max-turns: agentic turns a session may take"),
    OptionDecl("fallback_model", (str,), _word, "--fallback-model: the model when the default one is overloaded"),
    OptionDecl("append_system_prompt", (str,), _text, "--append-system-prompt: text after Claude Code's system prompt"),
    OptionDecl("settings", (str,), _settings_shape, "--settings: a settings JSON file, or JSON"),
    OptionDecl("mcp_config", (list,), _mcp_shape, "--mcp-config: MCP server configurations, files or JSON", str),
    OptionDecl(
        "strict_mcp_config",
        (bool,),
        lambda v: None,
        "--strict-mcp-config: only the MCP servers of mcp_config, none of the user's or the project's",
    ),
    OptionDecl("disallowed_tools", (list,), _words, "--disallowedTools: tools removed from the session", str),
    OptionDecl("env", (dict,), _env, "variables added to the session's environment", str),
    OptionDecl("extra_args", (list,), _extra_args, "more Claude Code flags, after fleetrun's own", str),
    OptionDecl(
        "allow_verifiers",
        (bool,),
        lambda v: None,
        "allow the session to run the task's run verifiers' commands (exact Bash rules; default true)",
    ),
)


def task_keys() -> list[KeyDecl]:
    """The ``[[task]]`` keys (``fleetrun_task_keys``); a default of every task too."""
    return [KeyDecl(o.key, o.types, doc=o.doc, check=o.check) for o in OPTIONS]


def _config_check(o: OptionDecl) -> Callable[[Any], Optional[str]]:
    if o.key == "settings":
        return lambda v: source_problem(v, False, None)
    if o.key == "mcp_config":
        return lambda v: next((p for p in (source_problem(x, True, None) for x in v) if p), None)
    return o.check


def config_keys() -> list[ConfigKey]:
    """The same options as ``[claude]`` keys (``fleetrun_config_keys``): a path there is
    absolute (or ``~``), and checked as the file is read."""
    from .config import ConfigKey

    return [ConfigKey("claude", o.key, o.types, items=o.items, check=_config_check(o), doc=o.doc) for o in OPTIONS]


# -- a task's options ------------------------------------------------------------------------


@dataclass
class Options:
    """The options of one task's sessions, each the task's or ``[claude]``'s."""

    values: dict[str, Any] = field(default_factory=dict)
    #: for each path key, the folder its relative paths are relative to (None: [claude]'s)
    bases: dict[str, Optional[Path]] = field(default_factory=dict)

    def path(self, key: str, value: str) -> str:
        """``value`` as Claude Code is given it: JSON as it is, a path made absolute."""
        if is_json(value):
            return value
        path = Path(os.path.expanduser(value))
        base = self.bases.get(key)
        return str(path if path.is_absolute() or base is None else (base / path).resolve())

    def argv(self) -> list[str]:
        """The flags, after fleetrun's own (``extra_args`` last)."""
        v = self.values
        out: list[str] = []
        if v.get("max_turns") is not None:
            out += ["--max-turns", str(v["max_turns"])]
        if v.get("fallback_model"):
            out += ["--fallback-model", v["fallback_model"]]
        if v.get("append_system_prompt"):
            out += ["--append-system-prompt", v["append_system_prompt"]]
        if v.get("settings"):
            out += ["--settings", self.path("settings", v["settings"])]
        if v.get("mcp_config"):
            out += ["--mcp-config", *(self.path("mcp_config", x) for x in v["mcp_config"])]
        if v.get("strict_mcp_config"):
            out.append("--strict-mcp-config")
        if v.get("disallowed_tools"):
            out += ["--disallowedTools", *v["disallowed_tools"]]
        out += list(v.get("extra_args") or ())
        return out

    def env(self) -> dict[str, str]:
        return dict(self.values.get("env") or {})


def command_parts(command: str) -> list[str]:
    """A shell command's simple commands, as Claude Code asks for them one by one: split
    on ``&&``, ``||``, ``;``, ``|``, ``&`` and newlines outside quotes."""
    parts: list[str] = []
    cur = ""
    quote: Optional[str] = None
    i = 0
    while i < len(command):
        ch = command[i]
        if quote:
            cur += ch
            if ch == "\\" and quote == '"' and i + 1 < len(command):
                cur += command[i + 1]
                i += 1
            elif ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
            cur += ch
        elif ch == "\\" and i + 1 < len(command):
            cur += ch + command[i + 1]
            i += 1
        elif ch in ";|&\n":
            if command[i : i + 2] in ("&&", "||"):
                i += 1
            if cur.strip():
                parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
        i += 1
    if cur.strip():
        parts.append(cur.strip())
    return parts


def verifier_rules(spec: TaskSpec) -> list[str]:
    """The allow rules that let a session run its task's ``run`` verifiers, each part of
    each command exactly (``Bash(pytest -q)``): no power the agent lacks, since the
    verifier runs its code anyway. A part that would not be an exact rule is left out:
    with ``*`` it would be a wildcard (more than the verifier runs), with a parenthesis
    or a control character it would not be read as one rule."""
    rules: list[str] = []
    for v in spec.verify:
        if v.kind != "run":
            continue
        for part in command_parts(v.text):
            if _CONTROL.search(part) or any(c in part for c in "*()"):
                continue
            rule = f"Bash({part})"
            if rule not in rules:
                rules.append(rule)
    return rules


def options_of(spec: TaskSpec, config: Config) -> Options:
    """The task's options: its own key (or a default of every task) over ``[claude]``'s;
    ``env`` merged key by key, the task's over ``[claude]``'s."""
    opts = Options()
    for key in KEYS:
        own = spec.extra.get(key) if isinstance(spec.extra, dict) else None
        general = config.setting("claude", key)
        if key == "env":
            merged = {**(general if isinstance(general, dict) else {}), **(own if isinstance(own, dict) else {})}
            opts.values[key] = merged
            continue
        if own is not None:
            opts.values[key] = own
            if key in PATH_KEYS:
                opts.bases[key] = Path(spec.file_of(key)).parent if spec.file_of(key) else Path(spec.cwd)
        elif general is not None:
            opts.values[key] = general
            opts.bases[key] = None
    return opts


def file_problems(spec: TaskSpec, config: Config, display: Callable[[str], str]) -> list[UsageError]:
    """The checks that need the file a task key is written in: each ``settings`` /
    ``mcp_config`` path (relative to that file's folder) is a readable JSON file of the
    right shape. (A ``fallback_model`` equal to ``model`` is no error: measured, both
    2.1.197 and 2.1.332 take it.) :param display: how an error names a file."""
    from .textutil import safe_name

    errors: list[UsageError] = []
    if not any(key in spec.extra for key in PATH_KEYS):
        return errors  # most tasks: no option of their own to read (100,000 tasks, one pass each)
    opts = options_of(spec, config)
    for key in PATH_KEYS:
        if key not in spec.extra:
            continue  # [claude]'s were checked with config.toml
        values = spec.extra[key] if key == "mcp_config" else [spec.extra[key]]
        for value in values:
            problem = source_problem(value, key == "mcp_config", opts.bases.get(key))
            if problem:
                errors.append(
                    UsageError(
                        problem,
                        file=display(spec.file_of(key)),
                        line=spec.key_lines.get(key, spec.line),
                        key=f"task '{safe_name(spec.name)}': {key}",
                    )
                )
                break
    return errors

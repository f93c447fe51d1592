#!/usr/bin/env python3
"""A stand-in for Anthropic's Claude Code CLI (``claude``), for fleetrun's tests.

It parses the command line as strictly as the real CLI (a commander.js program):
unknown options, bad choices and missing values are errors, variadic options
(``--allowedTools``, ``--tools``, ``--add-dir``...) swallow the words that follow
them, ``--resume`` takes an optional value. It prints the same stream-json events
and enforces Claude Code's permission rules in ``-p`` mode, then acts out a scripted
scenario instead of asking a model.

Environment:
  FAKE_CLAUDE_SCENARIO  JSON file: {"<task name>" | "default": [step, step, ...]}.
                        Unset: reply "ok" (success, cost 0.01).
  FLEETRUN_TASK_NAME    picks the key (falls back to "default").
  FLEETRUN_VERIFIER     set (fleetrun's agent verifier sets it to "agent"): the key is
                        "<task name>:review" when the scenario has that key, so a
                        reviewer has its own steps and invocation counter.
  FAKE_CLAUDE_STATE     directory for the per-key invocation counters and the
                        session store (default: the scenario file's directory).
  FAKE_CLAUDE_LOG       file; one JSON line per invocation is appended (argv, prompt, cwd,
                        FLEETRUN_* env, session_id, key, n, the effective "model", the
                        "setting_sources", the "hooks" that ran at start-up and, on a
                        --resume/--continue, the "conversation" sent again: the earlier
                        prompts of that session, as the real CLI sends the whole
                        earlier conversation), and one
                        more, with "continuation": N, each time a Stop hook keeps the
                        session going (its "prompt" is the hook's reason).
  CLAUDE_CONFIG_DIR     where the user's settings.json is (default ~/.claude).
  FAKE_CLAUDE_VERSION   the Claude Code version to act as: 2.1.332 (default) or 2.1.197
                        (the differences measured between them: tool-error wording, the
                        usage-limit text, read-before-write, deny-rule warnings,
                        terminal_reason).

Settings and hooks, as the real CLI: the sources of --setting-sources (default
user,project,local; any other name exits 1) are $CLAUDE_CONFIG_DIR/settings.json,
<cwd>/.claude/settings.json and <cwd>/.claude/settings.local.json; with --settings they
give permission rules and command hooks, captured at start-up. SessionStart hooks run
before the first event; Stop hooks run when a step ends normally, with session_id,
transcript_path, cwd, hook_event_name, stop_hook_active and last_assistant_message on
stdin. A Stop hook printing {"decision": "block", "reason": R} (or exiting 2 with R on
stderr) makes the session go on with R as its next instruction: the key's next step.
In --permission-mode plan a model alias (--model haiku) is replaced by the default
model, as measured with the real CLI; a full id (claude-haiku-4-5) is kept.
With --json-schema, a step's "structured" value is checked against the schema and
given as the result's structured_output (invalid: error_max_structured_output_retries).

A step: {"actions": [...], "result": "done", "cost": 0.01, "turns": N,
         "mode": "ok" | "is_error" | "no_result" | "die" | "hang" | "usage_limit" |
                 "rate_limit" | "api_error" | "exit_code" | "overspend" | "raw",
         "structured": {...},
         "exit": N, "stall": seconds, "reset_at": epoch,
         "limit_style": "session" | "weekly" | "legacy",
         "auth": "api_key" | "oauth",  (mode rate_limit)
         "status": 500 | 529,          (mode api_error)
         "raw": [line, ...]}   mode "raw": these lines, printed as they are, stand
                               in for the result event (malformed output on purpose)
API errors, as measured with the real CLI: an assistant event of model "<synthetic>"
with "error": "server_error" | "rate_limit", then a result of subtype "success" with
is_error, api_error_status and "errors": null, exit 1. usage_limit: a subscription
(OAuth) limit with the unified headers: a rate_limit_event with resetsAt and "You've hit
your session limit · resets 10:18am (UTC)" (2.1.332: "5-hour limit"). rate_limit: a 429
without a reset time: with an API key no rate_limit_event at all, with OAuth but no
unified headers a rate_limit_event without resetsAt. api_error: a 500 or 529.
Budget (--max-budget-usd), as measured: the cost is checked after each turn (a step's
cost is spread over its turns), so the turn that crosses the cap is paid for; the session
ends error_max_budget_usd, stop_reason "tool_use", exit 1, and a Write cut off by it
leaves its temporary FILE.tmp.PID.HEX behind.
Actions: ["write", path, content]  ["append", path, content]  ["bash", command]
         ["commit", message]  ["read", path]  ["sleep", seconds]  ["print", text]

Stdlib only, no fleetrun imports, Python >= 3.9.
"""

import json
import os
import sys
import time
import uuid

VERSIONS = ("2.1.197", "2.1.332")
VERSION = os.environ.get("FAKE_CLAUDE_VERSION") or "2.1.332"
OLD = VERSION == "2.1.197"  # the older of the two measured versions
#: Measured: with no --model both versions use an opus model.
DEFAULT_MODEL = "claude-opus-4-5-20251101"
SCENARIO_ERROR = 70  # a broken scenario file is a bug in the test, not in fleetrun

# The built-in tools a 2.1 session reports in its init event.
DEFAULT_TOOLS = [
    "Task", "Bash", "Glob", "Grep", "ExitPlanMode", "Read", "Edit", "Write",
    "NotebookEdit", "WebFetch", "TodoWrite", "WebSearch", "BashOutput", "KillShell",
    "Skill", "SlashCommand",
]
if OLD:  # 2.1.197 has neither; a deny rule naming them draws a warning on stderr
    DEFAULT_TOOLS = [t for t in DEFAULT_TOOLS if t != "SlashCommand"]
KNOWN_TOOLS = set(DEFAULT_TOOLS) | ({"LS"} if OLD else {"LS", "MultiEdit"})
READ_ONLY_TOOLS = {"Read", "Grep", "Glob", "LS"}
EDIT_TOOLS = {"Edit", "Write", "MultiEdit", "NotebookEdit"}
PERMISSION_MODES = ["acceptEdits", "auto", "bypassPermissions", "default", "dontAsk", "plan"]
MODES = ("ok", "is_error", "no_result", "die", "hang", "usage_limit", "rate_limit",
         "api_error", "exit_code", "overspend", "raw")
#: What both measured versions write to the terminal when they exit, after the JSON
#: lines (they reset the terminal modes they set: keyboard protocol, focus, paste, cursor).
TERMINAL_RESET = "\x1b[<u\x1b[?1004l\x1b[?2004l\x1b[?25h"


# --------------------------------------------------------------------------- options
class Opt:
    """One commander option. kind: flag | value | optional | variadic."""

    def __init__(self, flags, dest, kind, choices=None):
        self.flags = flags
        self.dest = dest
        self.kind = kind
        self.choices = choices
        self.names = [part.split(" ")[0] for part in flags.split(", ")]


OPTIONS = [
    Opt("-d, --debug [filter]", "debug", "optional"),
    Opt("--verbose", "verbose", "flag"),
    Opt("-p, --print", "print", "flag"),
    Opt("--output-format <format>", "output_format", "value", ["text", "json", "stream-json"]),
    Opt("--json-schema <schema>", "json_schema", "value"),
    Opt("--include-partial-messages", "include_partial_messages", "flag"),
    Opt("--input-format <format>", "input_format", "value", ["text", "stream-json"]),
    Opt("--mcp-debug", "mcp_debug", "flag"),
    Opt("--dangerously-skip-permissions", "dangerously_skip_permissions", "flag"),
    Opt("--allow-dangerously-skip-permissions", "allow_dangerously_skip_permissions", "flag"),
    Opt("--max-budget-usd <amount>", "max_budget_usd", "value"),
    Opt("--max-turns <turns>", "max_turns", "value"),
    Opt("--replay-user-messages", "replay_user_messages", "flag"),
    Opt("--allowedTools, --allowed-tools <tools...>", "allowed_tools", "variadic"),
    Opt("--tools <tools...>", "tools", "variadic"),
    Opt("--disallowedTools, --disallowed-tools <tools...>", "disallowed_tools", "variadic"),
    Opt("--mcp-config <configs...>", "mcp_config", "variadic"),
    Opt("--system-prompt <prompt>", "system_prompt", "value"),
    Opt("--append-system-prompt <prompt>", "append_system_prompt", "value"),
    Opt("--permission-mode <mode>", "permission_mode", "value", PERMISSION_MODES),
    Opt("-c, --continue", "continue_", "flag"),
    Opt("-r, --resume [value]", "resume", "optional"),
    Opt("--fork-session", "fork_session", "flag"),
    Opt("--no-session-persistence", "no_session_persistence", "flag"),
    Opt("--model <model>", "model", "value"),
    Opt("--agent <agent>", "agent", "value"),
    Opt("--agents <json>", "agents", "value"),
    Opt("--betas <betas...>", "betas", "variadic"),
    Opt("--fallback-model <model>", "fallback_model", "value"),
    Opt("--settings <file-or-json>", "settings", "value"),
    Opt("--add-dir <directories...>", "add_dir", "variadic"),
    Opt("--ide", "ide", "flag"),
    Opt("--strict-mcp-config", "strict_mcp_config", "flag"),
    Opt("--session-id <uuid>", "session_id", "value"),
    Opt("--setting-sources <sources>", "setting_sources", "value"),
    Opt("--plugin-dir <paths...>", "plugin_dir", "variadic"),
    Opt("--disable-slash-commands", "disable_slash_commands", "flag"),
    Opt("--permission-prompt-tool <tool>", "permission_prompt_tool", "value"),
    Opt("-v, --version", "version", "flag"),
    Opt("-h, --help", "help", "flag"),
]
BY_NAME = {name: opt for opt in OPTIONS for name in opt.names}

HELP = """Usage: claude [options] [command] [prompt]

Claude Code - starts an interactive session by default, use -p/--print for
non-interactive output

Arguments:
  prompt                                            Your prompt

Options:
{options}

This is a test fake of Claude Code (fleetrun tests/fakes/claude).
"""


class UsageError(Exception):
    """A command-line error: message for stderr, exit code 1."""


def maybe_option(arg):
    return len(arg) > 1 and arg[0] == "-"


def parse_args(argv):
    """Parse like commander.js; returns (values dict, operands, unknown list)."""
    values = {"help": False}
    operands = []
    unknown = []
    args = list(argv)
    variadic = None
    dest_unknown = False

    def set_value(opt, value):
        if opt.kind == "flag":
            values[opt.dest] = True
            if opt.dest == "version":
                sys.stdout.write("%s (Claude Code)\n" % VERSION)
                sys.stdout.flush()
                sys.exit(0)
            return
        if value is not None and opt.choices is not None and value not in opt.choices:
            raise UsageError(
                "error: option '%s' argument '%s' is invalid. Allowed choices are %s."
                % (opt.flags, value, ", ".join(opt.choices)))
        if opt.kind == "variadic":
            values.setdefault(opt.dest, []).append(value)
        else:
            values[opt.dest] = True if value is None else value

    while args:
        arg = args.pop(0)
        if arg == "--":
            if dest_unknown:
                unknown.append(arg)
            operands.extend(args)
            break
        if variadic is not None and not maybe_option(arg):
            set_value(variadic, arg)
            continue
        variadic = None
        if not dest_unknown and maybe_option(arg):
            opt = BY_NAME.get(arg)
            if opt is not None:
                if opt.kind in ("value", "variadic"):
                    if not args:
                        raise UsageError("error: option '%s' argument missing" % opt.flags)
                    set_value(opt, args.pop(0))
                elif opt.kind == "optional":
                    if args and not maybe_option(args[0]):
                        set_value(opt, args.pop(0))
                    else:
                        set_value(opt, None)
                else:
                    set_value(opt, None)
                variadic = opt if opt.kind == "variadic" else None
                continue
            if len(arg) > 2 and arg[0] == "-" and arg[1] != "-":
                short = BY_NAME.get(arg[:2])
                if short is not None:
                    if short.kind == "flag":
                        set_value(short, None)
                        args.insert(0, "-" + arg[2:])
                    else:
                        set_value(short, arg[2:])
                    continue
            if arg.startswith("--") and "=" in arg:
                name, _, value = arg.partition("=")
                long_opt = BY_NAME.get(name)
                if long_opt is not None and long_opt.kind != "flag":
                    set_value(long_opt, value)
                    continue
            dest_unknown = True
        if dest_unknown:
            unknown.append(arg)
        else:
            operands.append(arg)
    return values, operands, unknown


def help_text():
    return HELP.format(options="\n".join("  " + opt.flags for opt in OPTIONS))


def split_tool_list(values):
    """["Read,Edit", "Bash(git commit:*) Write"] -> ["Read", "Edit", "Bash(git commit:*)", "Write"]."""
    out = []
    for value in values or []:
        depth = 0
        cur = ""
        for ch in value:
            if ch == "(":
                depth += 1
            elif ch == ")":
                depth = max(0, depth - 1)
            if depth == 0 and (ch == "," or ch.isspace()):
                if cur:
                    out.append(cur)
                cur = ""
                continue
            cur += ch
        if cur:
            out.append(cur)
    return out


def parse_rule(rule):
    """'Bash(git commit:*)' -> ('Bash', 'git commit:*'); 'Read' -> ('Read', None)."""
    if rule.endswith(")") and "(" in rule:
        name, _, rest = rule.partition("(")
        return name, rest[:-1]
    return rule, None


def js_number(x):
    """Render a float the way JavaScript's String(x) does for ordinary values."""
    if x == int(x) and abs(x) < 1e15:
        return str(int(x))
    return repr(x)


# --------------------------------------------------------------------------- output
class Out:
    def __init__(self, fmt, session_id, model):
        self.fmt = fmt
        self.session_id = session_id
        self.model = model

    def event(self, obj):
        if self.fmt != "stream-json":
            return
        self.line(json.dumps(obj, separators=(",", ":"), ensure_ascii=False))

    def line(self, text):
        try:
            sys.stdout.buffer.write((text + "\n").encode("utf-8"))
            sys.stdout.buffer.flush()
        except BrokenPipeError:
            os._exit(1)

    def assistant(self, content, model=None, **extra):
        msg = {
            "id": "msg_" + uuid.uuid4().hex[:24],
            "type": "message",
            "role": "assistant",
            "model": model or self.model,
            "content": content,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 12, "cache_creation_input_tokens": 0,
                      "cache_read_input_tokens": 0, "output_tokens": 8,
                      "service_tier": "standard"},
        }
        ev = {"type": "assistant", "message": msg, "parent_tool_use_id": None,
              "session_id": self.session_id, "uuid": str(uuid.uuid4())}
        ev.update(extra)
        self.event(ev)

    def text(self, text, partial=False, **extra):
        if partial:
            self.event({"type": "stream_event", "session_id": self.session_id,
                        "parent_tool_use_id": None, "uuid": str(uuid.uuid4()),
                        "event": {"type": "content_block_delta", "index": 0,
                                  "delta": {"type": "text_delta", "text": text}}})
        self.assistant([{"type": "text", "text": text}], **extra)

    def tool_result(self, tool_use_id, content, is_error):
        self.event({
            "type": "user",
            "message": {"role": "user", "content": [{
                "tool_use_id": tool_use_id, "type": "tool_result",
                "content": content, "is_error": is_error}]},
            "parent_tool_use_id": None,
            "session_id": self.session_id,
            "uuid": str(uuid.uuid4()),
        })


# --------------------------------------------------------------------------- state
class State:
    """Counters and the session store, in a directory, under one flock."""

    def __init__(self, directory):
        self.dir = directory
        self.fd = None

    def __enter__(self):
        import fcntl

        os.makedirs(self.dir, exist_ok=True)
        self.fd = os.open(os.path.join(self.dir, ".fake-claude.lock"), os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        os.close(self.fd)  # releases the lock

    def _path(self, name):
        return os.path.join(self.dir, name)

    def next_count(self, key):
        path = self._path("fake-claude-counters.json")
        try:
            with open(path) as f:
                counters = json.load(f)
        except (OSError, ValueError):
            counters = {}
        counters[key] = counters.get(key, 0) + 1
        tmp = path + ".tmp.%d" % os.getpid()
        with open(tmp, "w") as f:
            json.dump(counters, f)
        os.replace(tmp, path)
        return counters[key]

    def sessions(self):
        out = []
        try:
            with open(self._path("fake-claude-sessions.jsonl")) as f:
                for line in f:
                    if line.strip():
                        out.append(json.loads(line))
        except OSError:
            pass
        return out

    def prompts(self, session_id):
        """The prompts sent so far in a session (what a resume sends again)."""
        try:
            with open(self._path("fake-claude-prompts.jsonl")) as f:
                rows = [json.loads(line) for line in f if line.strip()]
        except OSError:
            return []
        return [r["prompt"] for r in rows if r["session_id"] == session_id]

    def add_prompt(self, session_id, prompt):
        with open(self._path("fake-claude-prompts.jsonl"), "a") as f:
            f.write(json.dumps({"session_id": session_id, "prompt": prompt}) + "\n")

    def add_session(self, session_id, cwd):
        with open(self._path("fake-claude-sessions.jsonl"), "a") as f:
            f.write(json.dumps({"session_id": session_id, "cwd": cwd}) + "\n")


def fail(message, code=1):
    sys.stderr.write(message + "\n")
    sys.stderr.flush()
    sys.exit(code)


def scenario_fail(message):
    fail("fake claude: scenario error: " + message, SCENARIO_ERROR)


def append_log(record):
    path = os.environ.get("FAKE_CLAUDE_LOG")
    if not path:
        return
    data = (json.dumps(record) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, data)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- permissions
class Permissions:
    def __init__(self, mode, allow, deny, tools, cwd, dirs):
        self.mode = mode
        self.allow = [parse_rule(r) for r in allow]
        self.deny = [parse_rule(r) for r in deny]
        self.tools = tools
        self.cwd = cwd
        self.dirs = dirs

    def _rule_names(self, tool):
        # "Edit" rules cover every built-in tool that edits files.
        return {tool, "Edit"} if tool in EDIT_TOOLS else {tool}

    def _path_matches(self, pattern, path):
        import fnmatch

        rel = os.path.relpath(path, self.cwd)
        pattern = pattern[2:] if pattern.startswith("./") else pattern
        return fnmatch.fnmatchcase(path, pattern) or fnmatch.fnmatchcase(rel, pattern)

    def _file_rule(self, rules, tool, path):
        names = self._rule_names(tool)
        for name, content in rules:
            if name in names and (content is None or content in ("", "*")
                                  or self._path_matches(content, path)):
                return True
        return False

    def _in_working_dirs(self, path):
        for d in [self.cwd] + self.dirs:
            d = os.path.realpath(d)
            if path == d or path.startswith(d.rstrip(os.sep) + os.sep):
                return True
        return False

    def check(self, tool, tool_input):
        """None if allowed, else the tool_result error text."""
        if tool == "Bash":
            return self._check_bash(tool_input["command"])
        path = tool_input.get("file_path", "")
        if self._file_rule(self.deny, tool, path):
            return "Permission to use %s has been denied." % tool
        if tool in READ_ONLY_TOOLS:
            return None
        if self.mode == "bypassPermissions":
            return None
        if tool in EDIT_TOOLS:
            asking = "Claude requested permissions to write to %s, but you haven't granted it yet." % path
            if self.mode == "plan":
                return "Cannot write to %s while in plan mode." % path
            if self._file_rule(self.allow, tool, path):
                return None
            if self.mode in ("acceptEdits", "auto") and self._in_working_dirs(os.path.realpath(path)):
                return None
            if self.mode == "auto":
                return None
            if self.mode == "dontAsk":
                return self._dont_ask(tool)
            return asking
        if self._simple_rule(self.allow, tool) or self.mode == "auto":
            return None
        if self.mode == "dontAsk":
            return self._dont_ask(tool)
        return "Claude requested permissions to use %s, but you haven't granted it yet." % tool

    def _dont_ask(self, tool):
        return ("Permission to use %s has been denied because Claude Code is running in "
                "don't ask mode." % tool)

    def _simple_rule(self, rules, tool):
        return any(name == tool for name, _ in rules)

    @staticmethod
    def _bash_rule_matches(content, command):
        if content is None or content in ("", "*"):
            return True
        if content.endswith(":*"):
            prefix = content[:-2]
            return command == prefix or command.startswith(prefix + " ")
        if "*" in content:
            import fnmatch

            return fnmatch.fnmatchcase(command, content)
        return command == content

    def _check_bash(self, command):
        parts = split_commands(command)
        for name, content in self.deny:
            if name == "Bash" and any(self._bash_rule_matches(content, p) for p in parts):
                return "Permission to use Bash with command %s has been denied." % command
        if self.mode in ("bypassPermissions", "auto"):
            return None
        needing = [p for p in parts
                   if not any(name == "Bash" and self._bash_rule_matches(content, p)
                              for name, content in self.allow)
                   and not (self.mode == "acceptEdits" and self._edit_command(p))]
        if not needing:
            return None
        if self.mode == "dontAsk":
            return self._dont_ask("Bash")
        if len(needing) < len(parts):
            return ("This Bash command contains multiple operations. The following parts "
                    "require approval: %s" % ", ".join(needing))
        return "Claude requested permissions to use Bash, but you haven't granted it yet."


    def _edit_command(self, part):
        """Measured: under acceptEdits the real CLI runs simple file-system commands
        (``touch f``, ``mkdir d``, ``echo x > f``) on paths in the working directories
        without an allow rule."""
        import shlex

        try:
            words = shlex.split(part)
        except ValueError:
            return False
        if not words or any(ch in part for ch in "`$(<"):
            return False
        targets = words[1:]
        if words[0] == "echo":
            if ">" not in words and ">>" not in words:
                return False
            targets = words[-1:]
            if words[-2] not in (">", ">>"):
                return False
        elif words[0] not in FILE_COMMANDS or ">" in part:
            return False
        paths = [w for w in targets if not w.startswith("-")]
        return bool(paths) and all(
            self._in_working_dirs(os.path.realpath(os.path.join(self.cwd, w))) for w in paths)


#: What acceptEdits runs without an allow rule (on paths inside the working directories).
FILE_COMMANDS = {"touch", "mkdir", "rmdir", "rm", "mv", "cp"}


def not_enabled(tool):
    """The tool_result of a call to a tool --tools left out, in each measured version."""
    if tool not in KNOWN_TOOLS:
        return "<tool_use_error>Error: No such tool available: %s</tool_use_error>" % tool
    if OLD:
        why = "is not enabled in this context."
    else:
        why = "is disabled for this session, in subagents as well as here."
    return "<tool_use_error>Error: No such tool available: %s. %s exists but %s</tool_use_error>" % (
        tool, tool, why)


NOT_READ = "<tool_use_error>File has not been read yet. Read it first before writing to it.</tool_use_error>"


def split_commands(command):
    """Split a shell command on && || ; | & and newlines, outside of quotes."""
    parts = []
    cur = ""
    quote = None
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
            if command[i:i + 2] in ("&&", "||"):
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


# --------------------------------------------------------------------------- validation
def load_json_or_file(value, what):
    text = value.strip()
    if text.startswith("{"):
        try:
            return json.loads(text)
        except ValueError:
            raise UsageError("Error: Invalid JSON provided to %s" % what) from None
    if not os.path.isfile(value):
        raise UsageError("Error: %s file not found: %s" % (what, value))
    try:
        with open(value) as f:
            return json.load(f)
    except ValueError:
        raise UsageError("Error: Invalid JSON in %s file: %s" % (what, value)) from None


def valid_uuid(value):
    if len(value) != 36:
        return False
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


def read_prompt(values, operands):
    if operands:
        return operands[0]
    if sys.stdin is None or sys.stdin.isatty():
        return ""
    data = sys.stdin.read()
    if values.get("input_format") == "stream-json":
        texts = []
        for line in data.splitlines():
            if not line.strip():
                continue
            try:
                msg = json.loads(line)
            except ValueError:
                fail("Error parsing streaming input line: %s" % line)
            content = (msg.get("message") or {}).get("content")
            if isinstance(content, str):
                texts.append(content)
            elif isinstance(content, list):
                texts.extend(b.get("text", "") for b in content if b.get("type") == "text")
        return "\n".join(texts)
    return data


# --------------------------------------------------------------------------- scenario
def load_step(scenario_path, key_name, n):
    if not scenario_path:
        return {}, "default"
    try:
        with open(scenario_path) as f:
            scenario = json.load(f)
    except (OSError, ValueError) as exc:
        scenario_fail("cannot read %s: %s" % (scenario_path, exc))
    if not isinstance(scenario, dict):
        scenario_fail("the file must map keys to lists of steps")
    key = key_name if key_name and key_name in scenario else "default"
    steps = scenario.get(key)
    if steps is None:
        return {}, key
    if isinstance(steps, dict):
        steps = [steps]
    if not isinstance(steps, list) or not steps:
        scenario_fail("%r must be a non-empty list of steps" % key)
    return steps[min(n, len(steps)) - 1], key


def check_step(step):
    if not isinstance(step, dict):
        scenario_fail("a step must be an object: %r" % (step,))
    known = {"actions", "result", "cost", "turns", "mode", "exit", "stall", "reset_at",
             "limit_style", "structured", "raw", "auth", "status"}
    extra = set(step) - known
    if extra:
        scenario_fail("unknown step keys %s" % sorted(extra))
    if step.get("mode", "ok") not in MODES:
        scenario_fail("unknown mode %r (known: %s)" % (step.get("mode"), ", ".join(MODES)))
    arity = {"write": 3, "append": 3, "bash": 2, "commit": 2, "read": 2, "sleep": 2, "print": 2}
    for action in step.get("actions", []):
        if not isinstance(action, list) or not action or action[0] not in arity:
            scenario_fail("unknown action %r" % (action,))
        if len(action) != arity[action[0]]:
            scenario_fail("action %r takes %d arguments" % (action, arity[action[0]] - 1))


class Session:
    def __init__(self, out, perms, cwd, hooks=None):
        self.out = out
        self.perms = perms
        self.cwd = cwd
        self.hooks = hooks
        self.denials = []
        self.known = set()  # files this session read or wrote (its "file state")
        self.cut = False  # the budget ran out during this turn: the tool is cut off

    def tool(self, name, tool_input, run):
        tool_use_id = "toolu_" + uuid.uuid4().hex[:24]
        self.out.assistant([{"type": "tool_use", "id": tool_use_id, "name": name,
                             "input": tool_input}])
        if name not in self.perms.tools:
            # a tool --tools left out is not there at all: not a permission denial
            self.out.tool_result(tool_use_id, not_enabled(name), True)
            return
        path = tool_input.get("file_path")
        if OLD and name in ("Write", "Edit") and path and os.path.exists(path) \
                and path not in self.known:
            # 2.1.197 validates before it asks: an existing file must have been read
            self.out.tool_result(tool_use_id, NOT_READ, True)
            return
        refusal = self.perms.check(name, tool_input)
        if refusal is not None:
            self.denials.append({"tool_name": name, "tool_use_id": tool_use_id,
                                 "tool_input": tool_input})
            self.out.tool_result(tool_use_id, refusal, True)
            return
        if self.cut:
            if name == "Write":  # the write goes to a temporary file, renamed when done
                tmp = "%s.tmp.%d.%x" % (path, os.getpid(), int(time.time() * 1000))
                try:
                    with open(tmp, "w") as f:
                        f.write(tool_input.get("content", ""))
                except OSError:
                    pass
            return
        content, is_error = run()
        if path and not is_error:
            self.known.add(path)
        self.out.tool_result(tool_use_id, content, is_error)
        if self.hooks is not None and not is_error:
            self.hooks.post_tool_use(name, tool_use_id, tool_input, content)

    def path(self, p):
        return os.path.normpath(os.path.join(self.cwd, p))

    def act(self, action):
        kind = action[0]
        if kind == "print":
            self.out.text(str(action[1]))
        elif kind == "sleep":
            time.sleep(float(action[1]))
        elif kind == "write":
            path, content = self.path(action[1]), action[2]
            self.tool("Write", {"file_path": path, "content": content},
                      lambda: self._write(path, content, "w"))
        elif kind == "append":
            path, content = self.path(action[1]), action[2]
            self.tool("Edit", {"file_path": path, "old_string": "", "new_string": content},
                      lambda: self._write(path, content, "a"))
        elif kind == "read":
            path = self.path(action[1])
            self.tool("Read", {"file_path": path}, lambda: self._read(path))
        elif kind == "bash":
            command = action[1]
            self.tool("Bash", {"command": command, "description": "Run a command"},
                      lambda: self._sh(command))
        elif kind == "commit":
            import shlex

            command = "git add -A && git commit -q -m %s" % shlex.quote(action[1])
            self.tool("Bash", {"command": command, "description": "Commit the changes"},
                      lambda: self._sh(command))

    def _write(self, path, content, how):
        existed = os.path.exists(path)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, how) as f:
                f.write(content)
        except OSError as exc:
            return "<tool_use_error>%s</tool_use_error>" % exc, True
        if how == "w" and not existed:
            return ("File created successfully at: %s (file state is current in your context "
                    "\u2014 no need to Read it back)" % path), False
        return "The file %s has been updated." % path, False

    def _read(self, path):
        try:
            with open(path) as f:
                lines = f.read().splitlines()
        except OSError:
            return "<tool_use_error>File does not exist.</tool_use_error>", True
        return "\n".join("%d\t%s" % (i + 1, line) for i, line in enumerate(lines)), False

    def _sh(self, command):
        import subprocess

        proc = subprocess.run(["/bin/sh", "-c", command], cwd=self.cwd, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        text = proc.stdout.decode("utf-8", "replace").rstrip("\n")
        if proc.returncode != 0:
            return ("Exit code %d\n%s" % (proc.returncode, text)).rstrip("\n"), True
        return text, False


def limit_message(step, reset_at):
    style = step.get("limit_style", "session")
    if style == "legacy":
        return "Claude AI usage limit reached|%d" % reset_at
    lt = time.localtime(reset_at)
    hour = lt.tm_hour % 12 or 12
    clock = "%d%s" % (hour, "am" if lt.tm_hour < 12 else "pm")
    if lt.tm_min:
        clock = "%d:%02d%s" % (hour, lt.tm_min, clock[-2:])
    if reset_at - time.time() > 24 * 3600:
        clock = "%s %d, %s" % (time.strftime("%b", lt), lt.tm_mday, clock)
    tz = os.environ.get("TZ") or local_zone_name()
    kind = "weekly" if style == "weekly" else ("session" if OLD else "5-hour")
    return "You've hit your %s limit \u00b7 resets %s (%s)" % (kind, clock, tz)


def local_zone_name():
    try:
        target = os.readlink("/etc/localtime")
        if "zoneinfo/" in target:
            return target.split("zoneinfo/", 1)[1]
    except OSError:
        pass
    return "UTC"


# --------------------------------------------------------------------------- settings and hooks
SETTING_SOURCES = ("user", "project", "local")
#: A Stop hook may keep a session going; the fake stops obeying after this many.
MAX_STOP_CONTINUATIONS = 20


def parse_setting_sources(value):
    """``--setting-sources user,project`` -> ["user", "project"]. Unset: all three (the
    CLI's default). Any other name is an error, as in the real CLI; "" loads none."""
    if value is None:
        return list(SETTING_SOURCES)
    out = []
    for name in value.split(","):
        name = name.strip()
        if not name:
            continue
        if name not in SETTING_SOURCES:
            raise UsageError("Error processing --setting-sources: Invalid setting source: %s. "
                             "Valid options are: user, project, local" % name)
        out.append(name)
    return out


def config_dir():
    """Claude Code's user folder: $CLAUDE_CONFIG_DIR, else ~/.claude."""
    return os.environ.get("CLAUDE_CONFIG_DIR") or os.path.join(os.path.expanduser("~"), ".claude")


def settings_files(sources, cwd):
    """The settings files of the enabled sources, lowest precedence first."""
    paths = {"user": os.path.join(config_dir(), "settings.json"),
             "project": os.path.join(cwd, ".claude", "settings.json"),
             "local": os.path.join(cwd, ".claude", "settings.local.json")}
    return [paths[s] for s in SETTING_SOURCES if s in sources]


def load_settings_file(path):
    """A settings file's object, or None. Like the real CLI, a broken file is reported
    and skipped, not fatal."""
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        sys.stderr.write("Settings error: %s: %s (ignored)\n" % (path, exc))
        return None
    return data if isinstance(data, dict) else None


def matcher_matches(matcher, value):
    import re

    if value is None or matcher in (None, "", "*"):
        return True
    try:
        return re.fullmatch(str(matcher), value) is not None
    except re.error:
        return matcher == value


def transcript_path(cwd, session_id):
    import re

    return os.path.join(config_dir(), "projects", re.sub(r"[^A-Za-z0-9]", "-", cwd), session_id + ".jsonl")


class Hooks:
    """The command hooks of the loaded settings, captured once at start-up (the real CLI
    snapshots hooks when a session starts: a settings file written later does not count)."""

    def __init__(self, settings_list, cwd, session_id, permission_mode):
        self.settings_list = settings_list
        self.cwd = cwd
        self.session_id = session_id
        self.permission_mode = permission_mode
        self.ran = []  # [{"event", "command", "exit"}], for the call log

    def commands(self, event, value=None):
        out, seen = [], set()
        for settings in self.settings_list:
            hooks = settings.get("hooks")
            groups = hooks.get(event) if isinstance(hooks, dict) else None
            for group in groups if isinstance(groups, list) else []:
                if not isinstance(group, dict) or not matcher_matches(group.get("matcher"), value):
                    continue
                for hook in group.get("hooks") or []:
                    if (isinstance(hook, dict) and hook.get("type") == "command"
                            and isinstance(hook.get("command"), str) and hook["command"] not in seen):
                        seen.add(hook["command"])  # identical commands run once
                        out.append(hook)
        return out

    def run(self, event, extra, value=None):
        """Run the event's hooks; returns [(exit code or None, stdout, stderr)]."""
        import subprocess

        payload = {"session_id": self.session_id, "transcript_path": transcript_path(self.cwd, self.session_id),
                   "cwd": self.cwd, "permission_mode": self.permission_mode, "hook_event_name": event}
        payload.update(extra)
        results = []
        for hook in self.commands(event, value):
            try:
                timeout = float(hook.get("timeout", 60))
            except (TypeError, ValueError):
                timeout = 60.0
            try:
                proc = subprocess.run(["/bin/sh", "-c", hook["command"]], cwd=self.cwd,
                                      input=json.dumps(payload).encode(), stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, timeout=timeout,
                                      env=dict(os.environ, CLAUDE_PROJECT_DIR=self.cwd))
                code, out, err = proc.returncode, proc.stdout.decode("utf-8", "replace"), \
                    proc.stderr.decode("utf-8", "replace")
            except subprocess.TimeoutExpired:
                code, out, err = None, "", "hook timed out after %gs" % timeout
            except OSError as exc:
                code, out, err = None, "", str(exc)
            self.ran.append({"event": event, "command": hook["command"], "exit": code})
            results.append((code, out, err))
        return results

    def post_tool_use(self, tool, tool_use_id, tool_input, response):
        """After a tool ran (the real CLI runs PostToolUse hooks in -p mode too)."""
        self.run("PostToolUse", {"tool_name": tool, "tool_input": tool_input, "tool_use_id": tool_use_id,
                                 "tool_response": response}, value=tool)

    def session_start(self, source):
        self.run("SessionStart", {"source": source}, value=source)

    def stop(self, active, last_message):
        """Run the Stop hooks. A hook that prints {"decision": "block", "reason": R}, or
        exits 2 with R on stderr, keeps the session going: returns R (else None)."""
        reasons = []
        for code, out, err in self.run("Stop", {"stop_hook_active": active,
                                                 "last_assistant_message": last_message}):
            if code == 2:
                reasons.append(err.strip())
                continue
            if code != 0:
                continue
            try:
                decision = json.loads(out) if out.strip().startswith("{") else None
            except ValueError:
                decision = None
            if isinstance(decision, dict) and decision.get("decision") == "block":
                reasons.append(str(decision.get("reason") or ""))
        return "\n".join(reasons) if reasons else None


# --------------------------------------------------------------------------- structured output
def schema_errors(value, schema, where="$"):
    """A small JSON Schema check (type, enum, properties, required, additionalProperties,
    items): enough for the schemas tests pass. Returns a list of problems."""
    if not isinstance(schema, dict):
        return []
    kinds = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}
    want = schema.get("type")
    if want in kinds and not isinstance(value, kinds[want]):
        return ["%s: expected %s" % (where, want)]
    if want in ("number", "integer") and (isinstance(value, bool) or not isinstance(
            value, int if want == "integer" else (int, float))):
        return ["%s: expected %s" % (where, want)]
    if "enum" in schema and value not in schema["enum"]:
        return ["%s: not one of %s" % (where, schema["enum"])]
    errors = []
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        for name in schema.get("required") or []:
            if name not in value:
                errors.append("%s: %s is required" % (where, name))
        for name, item in value.items():
            if name in props:
                errors += schema_errors(item, props[name], "%s.%s" % (where, name))
            elif schema.get("additionalProperties") is False:
                errors.append("%s: unexpected property %s" % (where, name))
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            errors += schema_errors(item, schema["items"], "%s[%d]" % (where, i))
    return errors


# --------------------------------------------------------------------------- main
def main(argv):
    started = time.time()
    cwd = os.getcwd()
    log = {"argv": argv, "prompt": None, "cwd": cwd,
           "env": {k: v for k, v in os.environ.items() if k.startswith("FLEETRUN_")},
           "session_id": None, "key": None, "n": None, "pid": os.getpid(), "error": None}

    def usage_fail(message):
        log["error"] = message
        append_log(log)
        fail(message)

    if VERSION not in VERSIONS:
        scenario_fail("FAKE_CLAUDE_VERSION=%s: the fake acts as %s" % (VERSION, " or ".join(VERSIONS)))
    try:
        values, operands, unknown = parse_args(argv)
    except UsageError as exc:
        usage_fail(str(exc))
    if values.get("help"):
        sys.stdout.write(help_text())
        return 0
    if unknown:
        usage_fail("error: unknown option '%s'" % unknown[0])
    if len(operands) > 1:
        usage_fail("error: too many arguments. Expected 1 argument but got %d." % len(operands))
    if not values.get("print"):
        usage_fail("fake claude: interactive mode is not supported; pass -p/--print")

    fmt = values.get("output_format", "text")
    if values.get("input_format") == "stream-json" and fmt != "stream-json":
        usage_fail("Error: --input-format=stream-json requires output-format=stream-json.")
    if fmt == "stream-json" and not values.get("verbose"):
        usage_fail("Error: When using --print, --output-format=stream-json requires --verbose")
    budget = None
    if "max_budget_usd" in values:
        try:
            budget = float(values["max_budget_usd"])
        except ValueError:
            budget = -1.0
        if not budget > 0:  # measured: "0", "0.0000" and "lots" alike
            usage_fail("error: --max-budget-usd must be a positive number greater than 0")
    max_turns = None
    if "max_turns" in values:
        try:
            max_turns = int(values["max_turns"])
        except ValueError:
            usage_fail("error: option '--max-turns <turns>' argument '%s' is invalid. "
                       "Not a number." % values["max_turns"])
    if values.get("fallback_model") and values.get("fallback_model") == values.get("model"):
        usage_fail("Error: Fallback model cannot be the same as the main model. Please specify "
                   "a different model for --fallback-model.")
    resume = values.get("resume")
    if resume is True:
        usage_fail("Error: --resume requires a valid session ID when used with --print. "
                   "Usage: claude -p --resume <session-id>")
    session_id = values.get("session_id")
    if session_id is not None:
        if (values.get("continue_") or resume) and not values.get("fork_session"):
            usage_fail("Error: --session-id can only be used with --continue or --resume if "
                       "--fork-session is also specified.")
        if not valid_uuid(session_id):
            usage_fail("Error: Invalid session ID. Must be a valid UUID.")

    allow = split_tool_list(values.get("allowed_tools"))
    deny = split_tool_list(values.get("disallowed_tools"))
    settings_mode = None
    schema = None
    try:
        sources = parse_setting_sources(values.get("setting_sources"))
        # lowest precedence first: user, project, local, then --settings
        loaded = [d for d in (load_settings_file(p) for p in settings_files(sources, cwd)) if d is not None]
        if "settings" in values:
            flag_settings = load_json_or_file(values["settings"], "--settings")
            if not isinstance(flag_settings, dict):
                raise UsageError("Error: Invalid JSON provided to --settings")
            loaded.append(flag_settings)
        for settings in loaded:
            perms = settings.get("permissions")
            if not isinstance(perms, dict):
                continue
            allow += [r for r in perms.get("allow") or [] if isinstance(r, str)]
            deny += [r for r in perms.get("deny") or [] if isinstance(r, str)]
            if perms.get("defaultMode") in PERMISSION_MODES:  # another value is ignored
                settings_mode = perms["defaultMode"]
        for config in values.get("mcp_config") or []:
            mcp = load_json_or_file(config, "--mcp-config")
            if not isinstance(mcp, dict) or not isinstance(mcp.get("mcpServers"), dict):
                raise UsageError("Error: Invalid MCP configuration: mcpServers: expected an object")
        if "json_schema" in values:
            try:
                schema = json.loads(values["json_schema"])
            except ValueError:
                raise UsageError("Error: Invalid JSON provided to --json-schema") from None
            if not isinstance(schema, dict):
                raise UsageError("Error: --json-schema must be a JSON object")
    except UsageError as exc:
        usage_fail(str(exc))
    log["setting_sources"] = sources

    if "tools" in values:
        wanted = split_tool_list(values["tools"])
        # measured: the init event lists the chosen tools sorted, not as given
        tools = list(DEFAULT_TOOLS) if wanted == ["default"] else sorted(t for t in wanted if t in KNOWN_TOOLS)
    else:
        tools = list(DEFAULT_TOOLS)
    tools = [t for t in tools if (t, None) not in [parse_rule(r) for r in deny]]
    if OLD:  # 2.1.197 warns about a deny rule that names no tool it has
        for rule in deny:
            name, _ = parse_rule(rule)
            if name not in KNOWN_TOOLS and not name.startswith("mcp__"):
                sys.stderr.write("Warning: permission rule '%s' in disallowedTools does not match any "
                                 "known tool\n" % rule)

    if values.get("dangerously_skip_permissions"):
        mode = "bypassPermissions"
    else:
        mode = values.get("permission_mode") or settings_mode or "default"

    prompt = read_prompt(values, operands)
    log["prompt"] = prompt
    if not prompt.strip():
        usage_fail("Error: Input must be provided either through stdin or as a prompt argument "
                   "when using --print")

    scenario_path = os.environ.get("FAKE_CLAUDE_SCENARIO") or None
    state_dir = os.environ.get("FAKE_CLAUDE_STATE") or (
        os.path.dirname(os.path.abspath(scenario_path)) if scenario_path else None)
    task = os.environ.get("FLEETRUN_TASK_NAME")
    key = "default"
    if scenario_path:
        try:
            with open(scenario_path) as f:
                names = json.load(f)
            if task and os.environ.get("FLEETRUN_VERIFIER") and isinstance(names, dict) \
                    and task + ":review" in names:
                task = task + ":review"
            if task and isinstance(names, dict) and task in names:
                key = task
        except (OSError, ValueError) as exc:
            scenario_fail("cannot read %s: %s" % (scenario_path, exc))

    n = 1
    resumed = bool(resume or values.get("continue_"))
    if state_dir:
        with State(state_dir) as state:
            known = state.sessions()
            known_ids = {s["session_id"] for s in known}
            if resume and resume not in known_ids:
                return no_conversation(fmt, resume, started, log)
            if values.get("continue_"):
                mine = [s["session_id"] for s in known if s["cwd"] == cwd]
                if not mine:
                    usage_fail("No conversation found to continue")
                resume = mine[-1]
            if session_id is not None and session_id in known_ids and not (
                    values.get("fork_session") and (resume or values.get("continue_"))):
                usage_fail("Error: Session ID %s is already in use." % session_id)
            if session_id is None:
                session_id = resume if (resume and not values.get("fork_session")) else str(uuid.uuid4())
            if resume:
                log["conversation"] = state.prompts(resume)
            if not values.get("no_session_persistence") and session_id not in known_ids:
                state.add_session(session_id, cwd)
            if not values.get("no_session_persistence"):
                state.add_prompt(session_id, prompt)
            n = state.next_count(key)
    elif session_id is None:
        session_id = resume if (resume and not values.get("fork_session")) else str(uuid.uuid4())

    # Measured with the real CLI: in plan mode a model alias ("haiku") is not honoured and
    # the requests go out as the default model; a full model id is used as given.
    requested = values.get("model")
    model = requested or DEFAULT_MODEL
    if mode == "plan" and requested and not requested.startswith("claude-"):
        model = DEFAULT_MODEL
    hooks = Hooks(loaded, cwd, session_id, mode)
    hooks.session_start("resume" if resumed else "startup")
    log.update(session_id=session_id, key=key, n=n, model=model, hooks=hooks.ran)
    append_log(log)

    step, _ = load_step(scenario_path, task, n)
    check_step(step)
    out = Out(fmt, session_id, model)
    partial = bool(values.get("include_partial_messages"))
    out.event({
        "type": "system", "subtype": "init", "cwd": cwd, "session_id": session_id,
        "tools": tools, "mcp_servers": [], "model": model, "permissionMode": mode,
        "slash_commands": [], "apiKeySource": "none", "claude_code_version": VERSION,
        "output_style": "default", "agents": [], "skills": [], "plugins": [],
        "uuid": str(uuid.uuid4()),
    })

    dirs = [os.path.join(cwd, d) for d in values.get("add_dir") or []]
    session = Session(out, Permissions(mode, allow, deny, tools, cwd, dirs), cwd, hooks)
    spent = 0.0  # what turns a Stop hook continued from cost
    turns_before = 0
    continuations = 0
    cut_at = None  # the cost when the budget ran out in the middle of a step
    while True:
        actions = list(step.get("actions", []))
        stopped_at_max_turns = max_turns is not None and len(actions) + 1 > max_turns
        if stopped_at_max_turns:
            actions = actions[:max(max_turns, 0)]
        # the step's cost is spread over its turns; the CLI checks the budget after each
        per_turn = float(step.get("cost", 0.01)) / max(1, len(step.get("actions", [])) + 1)
        running = spent
        for i, action in enumerate(actions):
            running += per_turn
            if budget is not None and running > budget and step.get("mode", "ok") != "overspend":
                session.cut = True
                session.act(action)
                cut_at = (running, turns_before + i + 1)
                break
            session.act(action)
        step_mode = step.get("mode", "ok")
        text = str(step.get("result", "done" if scenario_path else "ok"))
        if cut_at is not None:
            break
        if step_mode == "die" and not stopped_at_max_turns:
            import signal

            os.kill(os.getpid(), signal.SIGKILL)
        if step_mode == "hang" and not stopped_at_max_turns:
            while True:
                time.sleep(3600)
        if step_mode == "no_result" and not stopped_at_max_turns:
            return int(step.get("exit", 0))
        if step.get("stall"):
            time.sleep(float(step["stall"]))
        text = str(step.get("result", "done" if scenario_path else "ok"))
        if step_mode not in ("ok", "exit_code") or stopped_at_max_turns \
                or continuations >= MAX_STOP_CONTINUATIONS:
            break
        reason = hooks.stop(continuations > 0, text)
        if reason is None:
            break
        # A Stop hook said "block": the session goes on with its reason as the next
        # instruction, acted out by the key's next step (logged as a continuation).
        out.text(text)
        spent += float(step.get("cost", 0.01))
        turns_before += int(step.get("turns", len(step.get("actions", [])) + 1))
        continuations += 1
        if state_dir:
            with State(state_dir) as state:
                n = state.next_count(key)
        else:
            n += 1
        append_log({"argv": argv, "prompt": reason, "cwd": cwd, "env": log["env"], "session_id": session_id,
                    "key": key, "n": n, "pid": os.getpid(), "error": None, "model": model,
                    "setting_sources": sources, "continuation": continuations, "hooks": []})
        step, _ = load_step(scenario_path, task, n)
        check_step(step)

    cost = spent + float(step.get("cost", 0.01))
    turns = turns_before + int(step.get("turns", len(step.get("actions", [])) + 1))
    if cut_at is not None:
        cost, turns = cut_at
    elapsed = int((time.time() - started) * 1000)
    result = {
        "type": "result", "subtype": "success", "is_error": False,
        "duration_ms": elapsed, "duration_api_ms": int(elapsed * 0.8),
        "num_turns": turns, "result": text, "stop_reason": "end_turn",
        "session_id": session_id, "total_cost_usd": cost,
        "usage": {"input_tokens": 12 * turns, "cache_creation_input_tokens": 0,
                  "cache_read_input_tokens": 0, "output_tokens": 8 * turns,
                  "server_tool_use": {"web_search_requests": 0, "web_fetch_requests": 0},
                  "service_tier": "standard"},
        "modelUsage": {model: {"inputTokens": 12 * turns, "outputTokens": 8 * turns,
                               "cacheReadInputTokens": 0, "cacheCreationInputTokens": 0,
                               "webSearchRequests": 0, "costUSD": cost,
                               "contextWindow": 200000}},
        "permission_denials": session.denials,
        "uuid": str(uuid.uuid4()),
    }
    code = 0

    def error_result(subtype, errors):
        result.pop("result", None)
        result.update(subtype=subtype, is_error=True, errors=errors, stop_reason=None)

    def over_budget(stop_reason):
        error_result("error_max_budget_usd", ["Reached maximum budget ($%s)" % js_number(budget)])
        result["stop_reason"] = stop_reason
        if not OLD:
            result["terminal_reason"] = "budget_exhausted"

    if cut_at is not None:
        over_budget("tool_use")  # measured: it stops right after the model asked for a tool
        code = 1
    elif stopped_at_max_turns:
        error_result("error_max_turns", ["Reached maximum number of turns (%d)" % max_turns])
        result["num_turns"] = max_turns + 1
        code = 1
    elif step_mode == "is_error":
        error_result("error_during_execution", [text])
        code = 1
    elif step_mode in ("usage_limit", "rate_limit", "api_error"):
        text, status, error = api_error(step, out, session_id)
        result["total_cost_usd"] = spent + float(step.get("cost", 0))
        result["modelUsage"][model]["costUSD"] = result["total_cost_usd"]
        # measured: the error comes as a message of its own, not from the model
        out.assistant([{"type": "text", "text": text}], model="<synthetic>", error=error)
        result.update(subtype="success", is_error=True, result=text, api_error_status=status,
                      errors=None, stop_reason="stop_sequence")
        code = 1
    else:
        if step_mode == "overspend" and budget is not None:
            cost = budget + 0.5
            result["total_cost_usd"] = cost
            result["modelUsage"][model]["costUSD"] = cost
        if schema is not None and "structured" in step:
            # the real CLI gives the model a StructuredOutput tool and puts what it was
            # called with, once valid, in the result's structured_output
            out.assistant([{"type": "tool_use", "id": "toolu_" + uuid.uuid4().hex[:24],
                            "name": "StructuredOutput", "input": step["structured"]}])
        out.text(text, partial=partial)
        if budget is not None and cost > budget:
            over_budget("end_turn")
            code = 1
        elif schema is not None and "structured" in step and schema_errors(step["structured"], schema):
            error_result("error_max_structured_output_retries",
                         ["Failed to provide valid structured output after 3 attempts"])
            code = 1
        elif step_mode == "exit_code":
            code = int(step.get("exit", 0))
        if schema is not None and "structured" in step and not result["is_error"]:
            result["structured_output"] = step["structured"]
    if "exit" in step:
        code = int(step["exit"])

    if step_mode == "raw":
        for raw_line in step.get("raw", []):
            out.line(str(raw_line))
    elif fmt == "stream-json":
        out.event(result)
    elif fmt == "json":
        out.line(json.dumps(result, separators=(",", ":"), ensure_ascii=False))
    elif "result" in result:
        out.line(result["result"])
    else:
        out.line("Error: " + "; ".join(result["errors"]))
    terminal_reset(fmt)
    return code


def terminal_reset(fmt):
    """Measured: both versions reset the terminal when they exit, after the JSON lines."""
    if fmt == "stream-json":
        try:
            sys.stdout.buffer.write(TERMINAL_RESET.encode())
            sys.stdout.buffer.flush()
        except BrokenPipeError:
            pass


def no_conversation(fmt, resume, started, log):
    """``--resume`` with an id the store does not have: measured, a result event."""
    message = "No conversation found with session ID: %s" % resume
    log["error"] = message
    append_log(log)
    result = {"type": "result", "subtype": "error_during_execution", "is_error": True,
              "duration_ms": int((time.time() - started) * 1000), "duration_api_ms": 0,
              "num_turns": 0, "stop_reason": None, "session_id": str(uuid.uuid4()),
              "total_cost_usd": 0, "usage": {"input_tokens": 0, "output_tokens": 0},
              "modelUsage": {}, "permission_denials": [], "errors": [message],
              "uuid": str(uuid.uuid4())}
    if fmt in ("stream-json", "json"):
        sys.stdout.write(json.dumps(result, separators=(",", ":")) + "\n")
        sys.stdout.flush()
        terminal_reset(fmt)
    else:
        sys.stderr.write(message + "\n")
    return 1


def api_error(step, out, session_id):
    """(text, api_error_status, the assistant event's error) of an API error step; a
    usage limit also emits its rate_limit_event, as the real CLI does."""
    mode = step.get("mode")
    if mode == "usage_limit":  # a subscription (OAuth), the API's unified headers present
        reset_at = int(step.get("reset_at", time.time() + 3600))
        limit_type = "seven_day" if step.get("limit_style") == "weekly" else "five_hour"
        out.event({"type": "rate_limit_event", "session_id": session_id, "uuid": str(uuid.uuid4()),
                   "rate_limit_info": {"status": "rejected", "resetsAt": reset_at,
                                       "rateLimitType": limit_type}})
        return limit_message(step, reset_at), 429, "rate_limit"
    if mode == "rate_limit":  # a 429 that gives no reset time
        auth = step.get("auth", "api_key")
        if auth not in ("api_key", "oauth"):
            scenario_fail("auth must be api_key or oauth, not %r" % (auth,))
        if auth == "api_key":  # no rate_limit_event at all
            return ("API Error: Request rejected (429) \u00b7 This request would exceed the rate limit "
                    "for your organization of 50 requests per minute."), 429, "rate_limit"
        out.event({"type": "rate_limit_event", "session_id": session_id, "uuid": str(uuid.uuid4()),
                   "rate_limit_info": {"status": "rejected"}})
        return "API Error: Server is temporarily limiting requests (not your usage limit)", 429, "rate_limit"
    status = step.get("status", 529)
    if status not in (500, 529):
        scenario_fail("status must be 500 or 529, not %r" % (status,))
    message = "Overloaded" if status == 529 else "Internal server error"
    return ("API Error: %d %s. This is a server-side issue, usually temporary \u2014 try again in a "
            "moment. If it persists, check status.claude.com." % (status, message)), status, "server_error"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The command line, parsed as strictly as the real CLI (a commander.js program) parses
it: options and their kinds, ``--help``, the checks it makes of the values, tool lists
and permission rules, the prompt from argv or stdin.
"""

import json
import os
import sys
import uuid

from .common import OLD, PERMISSION_MODES, VERSION, UsageError, fail


class Opt:
    """One commander option. kind: flag | value | optional | variadic | repeat (a value
    option given again adds to a list). ``accepted``: more values taken than the
    choices the error message lists (2.1.332 takes ``--permission-mode default``)."""

    def __init__(self, flags, dest, kind, choices=None, accepted=()):
        self.flags = flags
        self.dest = dest
        self.kind = kind
        self.choices = choices
        self.accepted = tuple(accepted)
        self.names = [part.split(" ")[0] for part in flags.split(", ")]


def _options():
    """The options of the version acted as, as its ``--help`` lists them (measured: the
    help of 2.1.197 and of 2.1.332), and the hidden ones it takes (``--max-turns``,
    ``--permission-prompt-tool``). ``--mcp-debug`` is in neither: unknown."""
    new = not OLD  # what only 2.1.332 has
    opts = [
        Opt("--add-dir <directories...>", "add_dir", "variadic"),
        Opt("--agent <agent>", "agent", "value"),
        Opt("--agents <json-or-file>" if new else "--agents <json>", "agents", "value"),
        Opt("--allow-dangerously-skip-permissions", "allow_dangerously_skip_permissions", "flag"),
        Opt("--allowedTools, --allowed-tools <tools...>", "allowed_tools", "variadic"),
        Opt("--append-system-prompt <prompt>", "append_system_prompt", "value"),
        new and Opt("--autocompact <auto|tokens>", "autocompact", "value"),
        Opt("--ax-screen-reader", "ax_screen_reader", "flag"),
        Opt("--bg, --background", "background", "flag"),
        Opt("--bare", "bare", "flag"),
        Opt("--betas <betas...>", "betas", "variadic"),
        Opt("--brief", "brief", "flag"),
        Opt("--chrome", "chrome", "flag"),
        new and Opt("--cloud [description|session_id|url]", "cloud", "optional"),
        Opt("-c, --continue", "continue_", "flag"),
        Opt("--dangerously-skip-permissions", "dangerously_skip_permissions", "flag"),
        Opt("-d, --debug [filter]", "debug", "optional"),
        Opt("--debug-file <path>", "debug_file", "value"),
        new and Opt("--desktop", "desktop", "flag"),
        Opt("--disable-slash-commands", "disable_slash_commands", "flag"),
        Opt("--disallowedTools, --disallowed-tools <tools...>", "disallowed_tools", "variadic"),
        Opt("--effort <level>", "effort", "value"),
        new and Opt("--environment <environment_id>", "environment", "value"),
        Opt("--exclude-dynamic-system-prompt-sections", "exclude_dynamic_system_prompt_sections", "flag"),
        Opt("--fallback-model <model>", "fallback_model", "value"),
        Opt("--file <specs...>", "file", "variadic"),
        Opt("--fork-session", "fork_session", "flag"),
        new and Opt("--forward-subagent-text", "forward_subagent_text", "flag"),
        Opt("--from-pr [value]", "from_pr", "optional"),
        Opt("-h, --help", "help", "flag"),
        Opt("--ide", "ide", "flag"),
        Opt("--include-hook-events", "include_hook_events", "flag"),
        Opt("--include-partial-messages", "include_partial_messages", "flag"),
        Opt("--input-format <format>", "input_format", "value", ["text", "stream-json"]),
        Opt("--json-schema <schema>", "json_schema", "value"),
        Opt("--max-budget-usd <amount>", "max_budget_usd", "value"),
        Opt("--max-turns <turns>", "max_turns", "value"),  # hidden from --help, taken
        Opt("--mcp-config <configs...>", "mcp_config", "variadic"),
        Opt("--model <model>", "model", "value"),
        Opt("-n, --name <name>", "name", "value"),
        Opt("--no-chrome", "no_chrome", "flag"),
        Opt("--no-session-persistence", "no_session_persistence", "flag"),
        Opt("--output-format <format>", "output_format", "value", ["text", "json", "stream-json"]),
        Opt("--permission-mode <mode>", "permission_mode", "value", PERMISSION_MODES,
            accepted=("default",) if new else ()),
        Opt("--permission-prompt-tool <tool>", "permission_prompt_tool", "value"),  # hidden, taken
        new and Opt("--permission-prompts <target>", "permission_prompts", "value", ["host", "none"]),
        Opt("--plugin-dir <path>", "plugin_dir", "repeat"),
        Opt("--plugin-url <url>", "plugin_url", "repeat"),
        Opt("-p, --print", "print", "flag"),
        Opt("--prompt-suggestions [value]", "prompt_suggestions", "optional",
            ["true", "false", "1", "0", "yes", "no", "on", "off"]),
        Opt("--remote-control [name]", "remote_control", "optional"),
        Opt("--remote-control-session-name-prefix <prefix>", "remote_control_session_name_prefix", "value"),
        Opt("--replay-user-messages", "replay_user_messages", "flag"),
        new and Opt("--restricted", "restricted", "flag"),
        Opt("-r, --resume [value]", "resume", "optional"),
        Opt("--safe-mode", "safe_mode", "flag"),
        Opt("--session-id <uuid>", "session_id", "value"),
        Opt("--setting-sources <sources>", "setting_sources", "value"),
        Opt("--settings <file-or-json>", "settings", "value"),
        Opt("--strict-mcp-config", "strict_mcp_config", "flag"),
        Opt("--system-prompt <prompt>", "system_prompt", "value"),
        new and Opt("--system-prompt-snapshot <on|off>", "system_prompt_snapshot", "value", ["on", "off"]),
        new and Opt("--teleport [session]", "teleport", "optional"),
        Opt("--tmux", "tmux", "flag"),
        Opt("--tools <tools...>", "tools", "variadic"),
        Opt("--verbose", "verbose", "flag"),
        Opt("-v, --version", "version", "flag"),
        Opt("-w, --worktree [name]", "worktree", "optional"),
    ]
    return [o for o in opts if o]


OPTIONS = _options()
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
        if value is not None and opt.choices is not None and value not in opt.choices \
                and value not in opt.accepted:
            raise UsageError(
                "error: option '%s' argument '%s' is invalid. Allowed choices are %s."
                % (opt.flags, value, ", ".join(opt.choices)))
        if opt.kind in ("variadic", "repeat"):
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
                if opt.kind in ("value", "variadic", "repeat"):
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


def load_json_or_file(value, what):
    text = value.strip()
    if text.startswith("{"):
        try:
            return json.loads(text)
        except ValueError:
            raise UsageError("Error: Invalid JSON provided to %s" % what) from None
    if not os.path.isfile(value):
        # measured: a value that is not JSON is a path (relative to the working directory)
        if what == "--mcp-config":
            raise UsageError("Error: Invalid MCP configuration:\nMCP config file not found: %s"
                             % os.path.abspath(value))
        raise UsageError("Error: Settings file not found: %s" % (value if OLD else os.path.abspath(value)))
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


def check_values(values, operands, unknown):
    """The checks the real CLI makes of its command line before anything else, in its
    order; returns (budget, max_turns), the numbers it takes.

    :raises UsageError: with the CLI's message, at the first that fails.
    """
    if unknown:
        raise UsageError("error: unknown option '%s'" % unknown[0])
    if len(operands) > 1:
        raise UsageError("error: too many arguments. Expected 1 argument but got %d." % len(operands))
    if not values.get("print"):
        raise UsageError("fake claude: interactive mode is not supported; pass -p/--print")

    fmt = values.get("output_format", "text")
    if values.get("input_format") == "stream-json" and fmt != "stream-json":
        raise UsageError("Error: --input-format=stream-json requires output-format=stream-json.")
    if fmt == "stream-json" and not values.get("verbose"):
        raise UsageError("Error: When using --print, --output-format=stream-json requires --verbose")
    budget = None
    if "max_budget_usd" in values:
        try:
            budget = float(values["max_budget_usd"])
        except ValueError:
            budget = -1.0
        if not budget > 0:  # measured: "0", "0.0000" and "lots" alike
            raise UsageError("error: --max-budget-usd must be a positive number greater than 0")
    max_turns = None
    if "max_turns" in values:
        try:
            max_turns = int(values["max_turns"])
        except ValueError:
            raise UsageError("error: option '--max-turns <turns>' argument '%s' is invalid. "
                             "Not a number." % values["max_turns"]) from None
    # measured: both versions take a --fallback-model equal to --model
    resume = values.get("resume")
    if resume is True:
        raise UsageError("Error: --resume requires a valid session ID when used with --print. "
                         "Usage: claude -p --resume <session-id>")
    session_id = values.get("session_id")
    if session_id is not None:
        if (values.get("continue_") or resume) and not values.get("fork_session"):
            raise UsageError("Error: --session-id can only be used with --continue or --resume if "
                             "--fork-session is also specified.")
        if not valid_uuid(session_id):
            raise UsageError("Error: Invalid session ID. Must be a valid UUID.")
    return budget, max_turns


def check_mcp_configs(values):
    """Each ``--mcp-config`` must be a JSON object with an ``mcpServers`` object."""
    for config in values.get("mcp_config") or []:
        mcp = load_json_or_file(config, "--mcp-config")
        if not isinstance(mcp, dict) or not isinstance(mcp.get("mcpServers"), dict):
            raise UsageError("Error: Invalid MCP configuration: mcpServers: expected an object")


def mcp_servers(values, cwd, settings):
    """The names of the MCP servers the session has, as the real CLI gathers them: those
    of each ``--mcp-config``; and, unless ``--strict-mcp-config``, the user's (the
    ``mcpServers`` of ``.claude.json`` in $CLAUDE_CONFIG_DIR, else the home folder, and
    of its ``projects[<cwd>]``) and the project's ``<cwd>/.mcp.json`` ones the settings
    approve (``enableAllProjectMcpServers``, ``enabledMcpjsonServers``). The fake starts
    none of them; the init event lists them as connected."""
    names = []

    def add(config):
        servers = config.get("mcpServers") if isinstance(config, dict) else None
        for name in servers if isinstance(servers, dict) else {}:
            if name not in names:
                names.append(name)

    for config in values.get("mcp_config") or []:
        add(load_json_or_file(config, "--mcp-config"))
    if values.get("strict_mcp_config"):
        return names

    def read(path):
        try:
            with open(path) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    user = read(os.path.join(os.environ.get("CLAUDE_CONFIG_DIR") or os.path.expanduser("~"), ".claude.json"))
    add(user)
    if isinstance(user, dict) and isinstance(user.get("projects"), dict):
        add(user["projects"].get(cwd))
    project = read(os.path.join(cwd, ".mcp.json"))
    approve_all = any(s.get("enableAllProjectMcpServers") is True for s in settings)
    approved = {n for s in settings for n in (s.get("enabledMcpjsonServers") or []) if isinstance(n, str)}
    if isinstance(project, dict) and isinstance(project.get("mcpServers"), dict):
        add({"mcpServers": {n: v for n, v in project["mcpServers"].items() if approve_all or n in approved}})
    return names


def json_schema(values):
    """The ``--json-schema`` object, or None without one."""
    schema = None
    if "json_schema" in values:
        try:
            schema = json.loads(values["json_schema"])
        except ValueError:
            raise UsageError("Error: Invalid JSON provided to --json-schema") from None
        if not isinstance(schema, dict):
            raise UsageError("Error: --json-schema must be a JSON object")
    return schema

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
                        earlier conversation), the "mcp_servers" it has, its "max_turns",
                        "fallback_model" and "append_system_prompt", and "env_logged":
                        the variables FAKE_CLAUDE_LOG_ENV names (comma-separated)), and one
                        more, with "continuation": N, each time a Stop hook keeps the
                        session going (its "prompt" is the hook's reason).
  FAKE_CLAUDE_LOG_ENV   names of variables whose values each log line records.
  FAKE_CLAUDE_COSTS     file; before a result event (stream-json or json) is printed, one
                        JSON line with its total_cost_usd, FLEETRUN_TASK_ID, FLEETRUN_ATTEMPT
                        and FLEETRUN_VERIFIER is appended (what the soak checks the
                        ledger's costs against).
  CLAUDE_CONFIG_DIR     where the user's settings.json and .claude.json are (default
                        ~/.claude and ~/.claude.json).
  FAKE_CLAUDE_VERSION   the Claude Code version to act as: 2.1.332 (default) or 2.1.197
                        (the differences measured between them: tool-error wording, the
                        usage-limit text, read-before-write, deny-rule warnings,
                        terminal_reason).

Settings and hooks, as the real CLI: the sources of --setting-sources (default
user,project,local; any other name exits 1) are $CLAUDE_CONFIG_DIR/settings.json,
<cwd>/.claude/settings.json and <cwd>/.claude/settings.local.json; with --settings they
give permission rules and command hooks, captured at start-up (a Bash allow rule in the
project's settings.json does not count, as measured in -p mode; in settings.local.json,
the user's settings.json, --settings or --allowedTools it does). SessionStart hooks run
before the first event; Stop hooks run when a step ends normally, with session_id,
transcript_path, cwd, hook_event_name, stop_hook_active and last_assistant_message on
stdin. A Stop hook printing {"decision": "block", "reason": R} (or exiting 2 with R on
stderr) makes the session go on with R as its next instruction: the key's next step.
In --permission-mode plan a model alias (--model haiku) is replaced by the default
model, as measured with the real CLI; a full id (claude-haiku-4-5) is kept.
MCP servers, as the real CLI gathers them: each --mcp-config's, and unless
--strict-mcp-config the user's (.claude.json's mcpServers, and its projects[<cwd>]) and
the approved ones of <cwd>/.mcp.json; listed in the init event, none started.
--max-turns N ends a step of more than N turns with error_max_turns (is_error, exit 1).
With --json-schema, a step's "structured" value is checked against the schema and
given as the result's structured_output (invalid: error_max_structured_output_retries).

A step: {"actions": [...], "result": "done", "cost": 0.01, "turns": N,
         "mode": "ok" | "is_error" | "no_result" | "die" | "die_at_start" | "hang" | "usage_limit" |
                 "rate_limit" | "api_error" | "exit_code" | "overspend" | "raw",
         "structured": {...},
         "exit": N, "stall": seconds, "reset_at": epoch,
         "limit_style": "session" | "weekly" | "legacy",
         "auth": "api_key" | "oauth",  (mode rate_limit)
         "status": 500 | 529,          (mode api_error)
         "raw": [line, ...]}   mode "raw": these lines, printed as they are, stand
                               in for the result event (malformed output on purpose)
die_at_start: killed before its first request (no conversation is kept: a --resume of
its id finds none, as the real CLI's). Run as root (FAKE_CLAUDE_UID=0, else the real
uid) without IS_SANDBOX=1, bypassPermissions is refused at once, as measured.
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

How it is run, and how its modules import each other (one scheme): the modules import
each other relatively only (``from .common import VERSION``), always as parts of a
package. Imported, that package is ``fleetrun.testing.fake_claude``; ``python -m
fleetrun.testing.fake_claude`` runs ``__main__`` inside it. Run by path, as
tests/fakes/claude and the ``fake_claude`` fixture's launcher do (``python <this
folder>``, or ``runpy.run_path(<this folder>)``), ``__main__`` has no package: it loads
this folder as a package of its own, named ``_fleetrun_fake_claude`` (from the files'
location, not from sys.path), and runs its ``main``. So the fake needs fleetrun
neither installed nor importable, and no module of it is ever imported under a bare
top-level name that another module (or the standard library) might own. Python puts
this folder first on sys.path when it runs it by path, so no module here is named as a
standard-library one is (tests/test_fake_claude_package.py checks both).

The parts: ``common`` (the version acted as, tool names, failing and logging),
``cliargs`` (argv parsed as commander.js does, the prompt), ``streamjson`` (events, API
errors, limit messages), ``permissions`` (modes and rules), ``hooks`` (settings files,
SessionStart / PostToolUse / Stop hooks), ``scenario`` (steps, the session store,
actions as tool calls, structured output), ``cli`` (``main``).
"""

from .cli import main
from .common import (
    DEFAULT_MODEL,
    DEFAULT_TOOLS,
    KNOWN_TOOLS,
    MODES,
    PERMISSION_MODES,
    SCENARIO_ERROR,
    TERMINAL_RESET,
    VERSION,
    VERSIONS,
)

__all__ = [
    "DEFAULT_MODEL",
    "DEFAULT_TOOLS",
    "KNOWN_TOOLS",
    "MODES",
    "PERMISSION_MODES",
    "SCENARIO_ERROR",
    "TERMINAL_RESET",
    "VERSION",
    "VERSIONS",
    "main",
]

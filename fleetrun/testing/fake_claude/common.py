"""What every part of the fake shares: the Claude Code version it acts as, the tool
names and modes, and how it fails and logs.
"""

import json
import os
import sys

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


class UsageError(Exception):
    """A command-line error: message for stderr, exit code 1."""


def fail(message, code=1):
    sys.stderr.write(message + "\n")
    sys.stderr.flush()
    sys.exit(code)


def scenario_fail(message):
    fail("fake claude: scenario error: " + message, SCENARIO_ERROR)


def append_log(record, var="FAKE_CLAUDE_LOG"):
    path = os.environ.get(var)
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


def report_cost(cost):
    """Append the cost this session is about to print in its result to
    $FAKE_CLAUDE_COSTS (a file outside the worktree), before printing it: a cost
    fleetrun recorded is then always in this file (the soak's cost check)."""
    env = os.environ
    append_log({"task_id": env.get("FLEETRUN_TASK_ID"), "attempt": env.get("FLEETRUN_ATTEMPT"),
                "verifier": env.get("FLEETRUN_VERIFIER"), "cost": cost}, var="FAKE_CLAUDE_COSTS")

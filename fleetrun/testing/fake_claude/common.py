"""What every part of the fake shares: the Claude Code version it acts as, the tool
names and modes, and how it fails and logs.
"""

import json
import os
import sys

VERSIONS = ("2.1.197", "2.1.332")
VERSION = os.environ.get("FAKE_CLAUDE_VERSION") or "2.1.332"
OLD = VERSION == "2.1.197"  # the older of the two measured versions
#: Measured (offline, no login): the model of the init event with no --model, and
#: what each alias resolves to there (a full id, or a name the CLI does not know, is kept).
DEFAULT_MODEL = "claude-opus-4-8[1m]" if OLD else "claude-opus-5-5"
MODEL_ALIASES = ({"haiku": "claude-haiku-4-5-20251001", "sonnet": "claude-sonnet-5", "opus": "claude-opus-4-8",
                  "fable": "claude-fable-5", "opus[1m]": "claude-opus-4-8[1m]"} if OLD else
                 {"haiku": "claude-haiku-5-5", "sonnet": "claude-sonnet-5-5", "opus": "claude-opus-5-5",
                  "fable": "claude-fable-5-2", "opus[1m]": "claude-opus-5-5"})
SCENARIO_ERROR = 70  # a broken scenario file is a bug in the test, not in fleetrun

# The built-in tools a session reports in its init event with no --tools (measured,
# offline): "Task" first, the rest sorted.
DEFAULT_TOOLS = [
    "Task", "Bash", "CronCreate", "CronDelete", "CronList", "DesignSync", "Edit", "EnterWorktree",
    "ExitWorktree", "ListAgents", "Monitor", "NotebookEdit", "Read", "ReportFindings", "ScheduleWakeup",
    "SendMessage", "Skill", "TaskStop", "ToolSearch", "WebFetch", "WebSearch", "Workflow", "Write",
]
#: The tools --tools may name beyond those (a name it does not know is dropped, silently)
MORE_TOOLS = ["Glob", "Grep", "TaskCreate", "TaskGet", "TaskList", "TaskUpdate"]
#: What naming Task in --tools brings with it
TASK_COMPANIONS = ["TaskStop"]
if OLD:  # 2.1.197 has no ListAgents or Monitor; its defaults hold the task list tools
    DEFAULT_TOOLS = sorted(set(DEFAULT_TOOLS) - {"ListAgents", "Monitor", "Task"}
                           | {"TaskCreate", "TaskGet", "TaskList", "TaskOutput", "TaskUpdate"})
    DEFAULT_TOOLS.insert(0, "Task")
    MORE_TOOLS = ["Glob", "Grep"]
    TASK_COMPANIONS = ["TaskOutput", "TaskStop"]
KNOWN_TOOLS = set(DEFAULT_TOOLS) | set(MORE_TOOLS)


def init_tools(names):
    """The init event's list of the chosen tools: as measured, "Task" first, the rest
    sorted, "Task" bringing its companions."""
    chosen = set(names)
    if "Task" in chosen:
        chosen |= set(TASK_COMPANIONS)
    return (["Task"] if "Task" in chosen else []) + sorted(chosen - {"Task"})


READ_ONLY_TOOLS = {"Read", "Grep", "Glob", "LS"}
EDIT_TOOLS = {"Edit", "Write", "MultiEdit", "NotebookEdit"}
#: The --permission-mode choices --help and the refusal list (measured: 2.1.332 lists
#: "manual" in place of "default", and still takes "default")
PERMISSION_MODES = (["acceptEdits", "auto", "bypassPermissions", "default", "dontAsk", "plan"] if OLD else
                    ["acceptEdits", "auto", "bypassPermissions", "manual", "dontAsk", "plan"])
MODES = ("ok", "is_error", "no_result", "die", "die_at_start", "hang", "usage_limit", "rate_limit",
         "api_error", "exit_code", "overspend", "raw")
#: What both measured versions write to the terminal when they exit, after the JSON
#: lines (they reset the terminal modes they set: keyboard protocol, focus, paste, cursor).
TERMINAL_RESET = "\x1b[<u\x1b[?1004l\x1b[?2004l\x1b[?25h"


ROOT_REFUSAL = "--dangerously-skip-permissions cannot be used with root/sudo privileges for security reasons"


def as_root():
    """The CLI runs as root: ``FAKE_CLAUDE_UID`` (a test's choice, so the refusal is
    tested whoever runs the tests), else the real effective uid."""
    uid = os.environ.get("FAKE_CLAUDE_UID")
    return (int(uid) if uid and uid.isdigit() else os.geteuid()) == 0


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

"""Built-in ``claude`` plugin: Claude Code, headless, as the default agent.

Runs ``claude -p`` with the prompt on standard input, ``--output-format stream-json
--verbose`` and a session id; reads the stream-json events for the session id, the
final ``result`` (``is_error``, ``result``, ``total_cost_usd``, ``num_turns``,
``permission_denials``). Exit 0 without a result event is not a success.

Claude Code in ``-p`` mode denies every tool that needs permission unless the
permission mode or an allow rule grants it, so task sessions default to
``--permission-mode acceptEdits`` plus allow rules for local git commands (never
``git push``). A task's ``permission_mode`` and ``allowed_tools`` replace these.
"""

from __future__ import annotations

import json
import re
import shutil
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional

from .. import untrusted
from ..hookimpl import hookimpl
from ..reports import AgentResult

DEFAULT_PERMISSION_MODE = "acceptEdits"
DEFAULT_ALLOWED_TOOLS = (
    "Bash(git status:*)",
    "Bash(git diff:*)",
    "Bash(git log:*)",
    "Bash(git show:*)",
    "Bash(git add:*)",
    "Bash(git commit:*)",
    "Bash(git rm:*)",
    "Bash(git mv:*)",
    "Bash(git restore:*)",
    "Bash(git checkout:*)",
    "Bash(git branch:*)",
    "Bash(git stash:*)",
)


def _nonempty(v: str) -> Optional[str]:
    return "must not be empty" if not v.strip() else None


@hookimpl(trylast=True)
def fleetrun_config_keys(config: Any) -> list[Any]:
    """``[claude]`` of config.toml (docs/agents.md)."""
    from ..config import ConfigKey
    from ..taskspec import PERMISSION_MODES

    return [
        ConfigKey("claude", "executable", (str,), check=_nonempty, doc="the program, looked up on PATH",
                  machine=True),
        ConfigKey("claude", "permission_mode", (str,), choices=PERMISSION_MODES, doc="default --permission-mode"),
        ConfigKey("claude", "allowed_tools", (list,), items=str, doc="default --allowedTools"),
        ConfigKey("claude", "resume_session", (bool,), doc="--resume an interrupted session"),
    ]


def executable(config: Any) -> str:
    exe = config.setting("claude", "executable", "claude")
    return shutil.which(exe) or exe


def base_argv(config: Any, session_id: str, model: Optional[str]) -> list[str]:
    argv = [executable(config), "-p", "--output-format", "stream-json", "--verbose", "--session-id", session_id]
    if model:
        argv += ["--model", model]
    return argv


@hookimpl(trylast=True)
def fleetrun_spawn(task: Any, attempt: Any, workspace: Any, prompt: str, config: Any) -> Optional[dict[str, Any]]:
    if task.spec.agent != "claude":
        return None
    session_id = str(uuid.uuid4())
    spec = task.spec
    prev = attempt.info.get("resume_session") if attempt.info else None
    resume = prev is not None and attempt.kind == "resume" and bool(config.setting("claude", "resume_session", False))
    argv = base_argv(config, session_id, spec.model)
    if resume and prev:
        # --resume continues the previous conversation (found only in the same folder:
        # retries and resumes reuse the worktree); a new --session-id would need --fork-session
        i = argv.index("--session-id")
        argv[i:i + 2] = ["--resume", prev]
        session_id = prev
    mode = spec.permission_mode or config.setting("claude", "permission_mode", DEFAULT_PERMISSION_MODE)
    argv += ["--permission-mode", mode]
    tools = spec.allowed_tools if spec.allowed_tools is not None else list(
        config.setting("claude", "allowed_tools", DEFAULT_ALLOWED_TOOLS))
    if tools:
        argv += ["--allowedTools", *tools]
    budget = attempt.info.get("budget_left_usd") if attempt.info else None
    if budget is None:
        budget = spec.budget_usd
    if budget is not None:
        argv += ["--max-budget-usd", f"{budget:.4f}"]
    return {"argv": argv, "stdin": "prompt", "parser": "claude", "session_id": session_id}


@hookimpl(trylast=True)
def fleetrun_collection_modifyitems(config: Any, items: list[Any]) -> None:
    """Warn about a task whose agent is claude when claude cannot be started here: a
    warning, not an error, since the task may be placed on a peer that has it."""
    from pathlib import Path

    from ..collect import display_path
    from ..hosts import executable_problem

    problem = executable_problem(executable(config))
    if problem is None:
        return
    warnings = config.stash.setdefault("warnings", [])
    for t in items:
        if t.agent != "claude":
            continue
        where = display_path(Path(t.file_of("agent")), config.invocation_dir) if t.source else "?"
        warnings.append(f"{where}:{t.key_lines.get('agent', t.line)}: task '{t.name}': agent: {problem} "
                        f"(set [claude] executable in config.toml)")


# Claude Code's usage-limit messages: "Claude AI usage limit reached|1735689600" (older),
# "You've hit your session limit · resets 5:46pm (UTC)" (2.1.197), "You've hit your 5-hour
# limit · resets 10:18am (UTC)" (2.1.332); a stream-json "rate_limit_event" with status
# "rejected" carries "resetsAt" when the API sent its unified rate-limit headers.
_LIMIT_EPOCH = re.compile(r"usage limit reached\|(\d{9,11})", re.I)
_LIMIT_TEXT = re.compile(r"(usage limit reached|limit reached|hit your .{0,20}limit)", re.I)
# What terminals are sent: CSI (ESC [ ... final byte) and OSC (ESC ] ... BEL or ESC \).
# Both measured versions reset the terminal when they exit, after the JSON lines.
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-_]")
_RESETS = re.compile(r"resets\s+(?:([A-Z][a-z]{2})\s+(\d{1,2}),\s+)?(\d{1,2})(?::(\d{2}))?\s*(am|pm)", re.I)


def parse_reset(text: str, now: Optional[float] = None) -> Optional[float]:
    """The reset time a usage-limit message gives, as an epoch, or None. A time that is
    not one (``usage limit reached|99999999999``, the year 5138) or lies further ahead
    than :data:`fleetrun.untrusted.MAX_RESET_HORIZON_S` is not believed: None, and the
    loop backs off instead of pausing the machine for ever."""
    now = time.time() if now is None else now
    m = _LIMIT_EPOCH.search(text)
    if m:
        return _believed(int(m.group(1)), now)
    m = _RESETS.search(text)
    if not m:
        return None
    import datetime

    month, day, hour, minute, ampm = m.groups()
    h = int(hour) % 12 + (12 if ampm.lower() == "pm" else 0)
    try:  # "resets 5:99pm" or "Feb 31": not a time
        base = datetime.datetime.fromtimestamp(now)
        when = base.replace(hour=h, minute=int(minute or 0), second=0, microsecond=0)
        if month and day:
            mon = datetime.datetime.strptime(month, "%b").month
            when = when.replace(month=mon, day=int(day))
            if when < base - datetime.timedelta(days=1):
                when = when.replace(year=when.year + 1)
        elif when <= base:
            when += datetime.timedelta(days=1)
    except (ValueError, OverflowError):
        return None
    return _believed(when.timestamp(), now)


def _believed(value: float, now: float) -> Optional[float]:
    try:
        return untrusted.reset_time(value, "reset time", now)
    except untrusted.Malformed:
        return None


@dataclass
class ResultEvent:
    """A stream-json ``result`` event, checked."""

    is_error: bool = False
    subtype: str = ""
    result: str = ""
    session_id: Optional[str] = None
    cost_usd: float = 0.0
    num_turns: Optional[int] = None
    permission_denials: list[dict[str, Any]] = field(default_factory=list)
    api_error_status: Optional[int] = None
    errors: list[str] = field(default_factory=list)
    #: ``--json-schema`` output, as the CLI gave it (its reader checks it: ``verify_agent``)
    structured_output: Any = None


MAX_DENIALS = 200
MAX_TOOL_INPUT = 4096  # bytes of a denied tool's input kept (``fleetrun logs`` shows 120)
MAX_LINE = 16 << 20  # a stream-json line longer than this is not one fleetrun reads
MAX_LOG_HEAD = 1 << 20  # of a log larger than head + tail, these are read (the session
MAX_LOG_TAIL = 32 << 20  # id comes first, the result last)


def _denial(value: Any, what: str) -> dict[str, Any]:
    d = untrusted.obj(value, what)
    out: dict[str, Any] = {}
    for key in ("tool_name", "tool_use_id"):
        v = untrusted.opt_clean_text(d, key, what, 200)
        if v is not None:
            out[key] = v
    tool_input = d.get("tool_input")
    if tool_input is not None:
        untrusted.obj(tool_input, f"{what}.tool_input")
        try:
            dumped = json.dumps(tool_input, ensure_ascii=True)
        except (ValueError, RecursionError):
            raise untrusted.Malformed(f"{what}.tool_input: cannot be written back as JSON") from None
        out["tool_input"] = tool_input if len(dumped) <= MAX_TOOL_INPUT else {"truncated": dumped[:MAX_TOOL_INPUT]}
    return out


def parse_result_event(ev: Any) -> ResultEvent:
    """A ``result`` event's fields, each of its type and range (a cost is finite and
    >= 0, ``is_error`` is a boolean, ``permission_denials`` a list of objects...).

    :raises fleetrun.untrusted.Malformed: with the reason.
    """
    d = untrusted.obj(ev, "result")
    denials = untrusted.opt_list(d, "permission_denials", "result", MAX_DENIALS)
    errors = untrusted.opt_list(d, "errors", "result", 100)
    return ResultEvent(
        is_error=untrusted.opt_boolean(d, "is_error", "result"),
        subtype=untrusted.opt_clean_text(d, "subtype", "result", 100, "") or "",
        result=untrusted.opt_clean_text(d, "result", "result", default="") or "",
        session_id=untrusted.opt_clean_text(d, "session_id", "result", 200),
        cost_usd=untrusted.cost(d.get("total_cost_usd"), "result.total_cost_usd"),
        num_turns=untrusted.opt_integer(d, "num_turns", "result", 0, 1 << 31),
        permission_denials=[_denial(x, f"result.permission_denials[{i}]")
                            for i, x in enumerate(denials)],
        api_error_status=untrusted.opt_integer(d, "api_error_status", "result", 0, 999),
        errors=[untrusted.clean_text(x, f"result.errors[{i}]", 4000) for i, x in enumerate(errors)],
        structured_output=d.get("structured_output"),
    )


def parse_rate_limit_event(ev: Any, now: Optional[float] = None) -> Optional[float]:
    """The reset time of a ``rate_limit_event`` that rejected the session, or None (not
    rejected, no time, or a time not believed). :raises Malformed: a wrong type."""
    d = untrusted.obj(ev, "rate_limit_event")
    info = untrusted.opt_obj(d, "rate_limit_info", "rate_limit_event")
    if info is None or untrusted.opt_clean_text(info, "status", "rate_limit_info", 100) != "rejected":
        return None
    v = info.get("resetsAt")
    if v is None:
        return None
    at = untrusted.number(v, "rate_limit_info.resetsAt")
    return _believed(at, time.time() if now is None else now)


def parse_line(line: str) -> Optional[dict[str, Any]]:
    """One stream-json line as an event object, or None for noise (what is not a JSON
    object: a warning on the terminal, a truncated line, binary). Never raises."""
    if "\x1b" in line:  # terminal escape sequences around a JSON line are not part of it
        line = _ESCAPES.sub("", line)
    line = line.strip()
    if not line.startswith("{") or len(line) > MAX_LINE:
        return None
    try:
        ev = json.loads(line)
    except (ValueError, RecursionError):  # RecursionError: "[[[[..." nested too deep
        return None
    return ev if isinstance(ev, dict) else None


def read_stream(text: str, now: Optional[float] = None) -> dict[str, Any]:
    """Read stream-json lines; noise (a line that is not a JSON object) is skipped, but
    an event fleetrun reads must have the right shape.

    :return: ``session_id``, ``result`` (a :class:`ResultEvent` or None), ``reset_at``,
        ``api_error`` (the ``error`` of the CLI's ``<synthetic>`` assistant message:
        ``server_error``, ``rate_limit``..., or None).
    :raises fleetrun.untrusted.Malformed: an event with a field of the wrong type or range.
    """
    session_id: Optional[str] = None
    result: Optional[ResultEvent] = None
    reset_at: Optional[float] = None
    api_error: Optional[str] = None
    for line in text.splitlines():
        ev = parse_line(line)
        if ev is None:
            continue
        kind = ev.get("type")
        what = kind[:40] if isinstance(kind, str) and kind else "event"
        sid = untrusted.opt_clean_text(ev, "session_id", what, 200)
        if sid:
            session_id = sid
        if kind == "result":
            result = parse_result_event(ev)
        elif kind == "rate_limit_event":
            reset_at = parse_rate_limit_event(ev, now) or reset_at
        elif kind == "assistant" and "error" in ev:
            api_error = untrusted.opt_clean_text(ev, "error", "assistant", 100) or api_error
    return {"session_id": session_id, "result": result, "reset_at": reset_at, "api_error": api_error}


def parse_stream(text: str) -> dict[str, Any]:
    """:func:`read_stream` with the ``result`` as a dict of checked values (the shape
    ``verify_agent`` reads); output that cannot be read is an error result,
    ``subtype`` ``malformed_output`` with the reason in ``errors``. Never raises."""
    try:
        parsed = read_stream(text)
    except untrusted.Malformed as e:
        return {"session_id": None, "reset_at": None, "api_error": None,
                "result": {"type": "result", "is_error": True, "subtype": "malformed_output",
                           "errors": [untrusted.reason_of(e)], "total_cost_usd": 0.0}}
    res = parsed["result"]
    if res is not None:
        parsed["result"] = {"type": "result", "is_error": res.is_error, "subtype": res.subtype,
                            "result": res.result, "session_id": res.session_id, "total_cost_usd": res.cost_usd,
                            "num_turns": res.num_turns, "permission_denials": res.permission_denials,
                            "api_error_status": res.api_error_status, "errors": res.errors}
        if res.structured_output is not None:
            parsed["result"]["structured_output"] = res.structured_output
    return parsed


def result_from_log(text: str, exit_code: Optional[int]) -> AgentResult:
    """What the session reported. Never raises: output fleetrun cannot read is a session
    that died, ``malformed_output:<why>`` (the loop resumes it, then asks a human)."""
    try:
        parsed = read_stream(text)
    except untrusted.Malformed as e:
        return AgentResult(ok=False, reason=f"malformed_output:{untrusted.reason_of(e)}", exit_code=exit_code,
                           result_text=_tail(text), cost_usd=None)
    res = parsed["result"]
    if res is None:  # killed, died, or cut off: the API may have answered (and billed) part of it
        rejected = rejected_arguments(text, exit_code)
        return AgentResult(ok=False, reason=f"rejected_arguments:{rejected}" if rejected else "no_result",
                           exit_code=exit_code, session_id=parsed["session_id"], result_text=_tail(text),
                           cost_usd=None)
    out = AgentResult(
        ok=not res.is_error and exit_code in (0, None),
        reason="" if not res.is_error else "is_error",
        exit_code=exit_code,
        session_id=res.session_id or parsed["session_id"],
        cost_usd=res.cost_usd,
        result_text=res.result,
        num_turns=res.num_turns,
        permission_denials=res.permission_denials,
    )
    if out.ok is False and not out.reason:
        out.reason = f"exit:{exit_code}"
    body = out.result_text or " ".join(res.errors)
    if not out.result_text:
        out.result_text = body
    if res.subtype == "error_max_budget_usd":
        out.reason = "budget"
    elif res.is_error:
        classify_api_error(out, res, parsed, body)
    return out


_CLI_ERROR = re.compile(r"^error:", re.I)


def rejected_arguments(text: str, exit_code: Optional[int]) -> Optional[str]:
    """The CLI's own first ``error:`` line when it refused its command line, or None.

    Claude Code checks its arguments before the session starts (commander.js:
    ``error: option '--permission-mode <mode>' argument 'yolo' is invalid...``) and
    exits 1 having written no stream-json event at all; a session that started and
    then died has written its ``system`` event first. Starting again with the same
    command line can only fail the same way.
    """
    if exit_code in (0, None):
        return None
    lines = text.splitlines()
    if any(parse_line(line) is not None for line in lines):
        return None
    for line in lines:
        line = _ESCAPES.sub("", line).strip()
        if _CLI_ERROR.match(line):
            line = "".join(c if c.isprintable() else "?" for c in line)
            return line if len(line) <= 500 else line[:500] + "..."
    return None


def classify_api_error(out: AgentResult, res: ResultEvent, parsed: dict[str, Any], body: str) -> None:
    """An API error, as the CLI reports it (a result of subtype ``success`` with
    ``is_error``, ``api_error_status`` and a ``<synthetic>`` assistant message):

    - a 429 with a reset time (a ``rate_limit_event``'s ``resetsAt``, or the time in
      "You've hit your session limit · resets 10:18am (UTC)"): ``usage_limit``, the
      machine pauses until then (a usage-limit text with a time not believed: the
      pause backs off instead);
    - a 429 without one (an API key's rate limit, or no unified headers: "Server is
      temporarily limiting requests (not your usage limit)"): ``rate_limited``, the task
      backs off; nothing says when the limit clears, so nothing is paused until a guess;
    - any other status (500, 529 overloaded): ``api_error:N``, transient, resumed.

    Older CLIs gave only the text ("Claude AI usage limit reached|EPOCH").
    """
    status = res.api_error_status
    synthetic = parsed.get("api_error")
    if status is None and synthetic is None:
        if _LIMIT_TEXT.search(body) and "not your usage limit" not in body:
            out.usage_limit = True
            out.reason = "usage_limit"
            out.usage_reset_at = parsed["reset_at"] or parse_reset(body)
        return
    if status == 429 or (status is None and synthetic == "rate_limit"):
        reset = parsed["reset_at"] or parse_reset(body)
        if reset is not None or (_LIMIT_TEXT.search(body) and "not your usage limit" not in body):
            # a usage limit, even one whose reset time is not believed (the machine then
            # pauses 1, 2, 4 ... minutes): every session there would hit it
            out.usage_limit = True
            out.reason = "usage_limit"
            out.usage_reset_at = reset
        else:
            out.reason = "rate_limited"
        return
    out.reason = f"api_error:{status if status is not None else synthetic}"


def _tail(text: str) -> str:
    tail = text[-2000:]
    return tail.encode("utf-8", "replace").decode("utf-8")


def read_log(log_path: str) -> str:
    """The log's text; of a huge one its head and its tail (a cut line is noise)."""
    try:
        with open(log_path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(0)
            if size <= MAX_LOG_HEAD + MAX_LOG_TAIL:
                raw = f.read()
            else:
                raw = f.read(MAX_LOG_HEAD) + b"\n"
                f.seek(size - MAX_LOG_TAIL)
                raw += f.read()
    except OSError:
        return ""
    return raw.decode("utf-8", "replace")


@hookimpl(trylast=True)
def fleetrun_agent_result(task: Any, attempt: Any, log_path: str, exit_code: Optional[int], config: Any) -> Optional[AgentResult]:
    if task.spec.agent != "claude":
        return None
    return result_from_log(read_log(log_path), exit_code)

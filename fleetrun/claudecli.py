"""Claude Code's command-line output as fleetrun reads it, strictly: the stream-json
events (``--output-format stream-json --verbose``), the ``result`` event, rate-limit
events and usage-limit messages, and where the ``claude`` executable is.

Core, not a plugin: the ``claude`` plugin (the agent) and the ``verify_agent`` plugin
(the read-only reviewer) both run Claude Code and read what it prints. Everything here
reads untrusted output and never raises on it but :class:`~fleetrun.untrusted.Malformed`.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from . import untrusted

if TYPE_CHECKING:
    from .config import Config


def executable(config: Config) -> str:
    """The ``claude`` to run: ``[claude] executable`` of config.toml (default
    ``claude``), found on ``PATH``."""
    exe = config.setting("claude", "executable", "claude")
    return shutil.which(exe) or exe


# Claude Code's usage-limit messages: "Claude AI usage limit reached|1735689600" (older),
# "You've hit your session limit · resets 5:46pm (UTC)" (2.1.197), "You've hit your 5-hour
# limit · resets 10:18am (UTC)" (2.1.332); a stream-json "rate_limit_event" with status
# "rejected" carries "resetsAt" when the API sent its unified rate-limit headers.
_LIMIT_EPOCH = re.compile(r"usage limit reached\|(\d{9,11})", re.I)
LIMIT_TEXT = re.compile(r"(usage limit reached|limit reached|hit your .{0,20}limit)", re.I)
# What terminals are sent: CSI (ESC [ ... final byte) and OSC (ESC ] ... BEL or ESC \).
# Both measured versions reset the terminal when they exit, after the JSON lines.
ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-_]")
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
    #: what this invocation cost (:func:`invocation_cost`), not the whole session
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


MAX_MODELS = 50  # models in a result's usage (the main one, a fallback, subagents' ...)


def invocation_cost(d: dict[str, Any]) -> float:
    """What this invocation of the CLI cost. 2.1.197 reports it in ``total_cost_usd``;
    2.1.332 reports there the whole session's after ``--resume`` (measured: $0.72 for
    $0.48 billed) and this invocation's in ``model_usage_since_last_result`` (per
    model, each ``costUSD``): that one, when it is there.

    :raises fleetrun.untrusted.Malformed: a usage or a cost of the wrong shape.
    """
    since = untrusted.opt_obj(d, "model_usage_since_last_result", "result")
    if since is None:
        return untrusted.cost(d.get("total_cost_usd"), "result.total_cost_usd")
    if len(since) > MAX_MODELS:
        raise untrusted.Malformed(f"result.model_usage_since_last_result: more than {MAX_MODELS} models")
    total = 0.0
    for name, usage in since.items():
        what = f"result.model_usage_since_last_result[{name[:100]!r}]"
        total += untrusted.cost(untrusted.obj(usage, what).get("costUSD"), f"{what}.costUSD")
    return untrusted.cost(total, "result.model_usage_since_last_result")


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
        cost_usd=invocation_cost(d),
        num_turns=untrusted.opt_integer(d, "num_turns", "result", 0, 1 << 31),
        permission_denials=[_denial(x, f"result.permission_denials[{i}]") for i, x in enumerate(denials)],
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
        line = ESCAPES.sub("", line)
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
        return {
            "session_id": None,
            "reset_at": None,
            "api_error": None,
            "result": {
                "type": "result",
                "is_error": True,
                "subtype": "malformed_output",
                "errors": [untrusted.reason_of(e)],
                "total_cost_usd": 0.0,
            },
        }
    res = parsed["result"]
    if res is not None:
        parsed["result"] = {
            "type": "result",
            "is_error": res.is_error,
            "subtype": res.subtype,
            "result": res.result,
            "session_id": res.session_id,
            "total_cost_usd": res.cost_usd,
            "num_turns": res.num_turns,
            "permission_denials": res.permission_denials,
            "api_error_status": res.api_error_status,
            "errors": res.errors,
        }
        if res.structured_output is not None:
            parsed["result"]["structured_output"] = res.structured_output
    return parsed


_CLI_ERROR = re.compile(r"^error:", re.I)
#: Refusals of the command line the CLI words without ``error:`` (measured, 2.1.197 and
#: 2.1.332): bypassPermissions (the flag, the mode, or a settings ``defaultMode``) as
#: root outside a deliberate sandbox (``IS_SANDBOX=1``).
_CLI_REFUSALS = (re.compile(r"^--dangerously-skip-permissions cannot be used with root/sudo privileges"),)


def rejected_arguments(text: str, exit_code: Optional[int]) -> Optional[str]:
    """The CLI's own first ``error:`` line when it refused its command line, or None.

    Claude Code checks its arguments before the session starts (commander.js:
    ``error: option '--permission-mode <mode>' argument 'yolo' is invalid...``; or, run
    as root, ``--dangerously-skip-permissions cannot be used with root/sudo
    privileges...``) and exits 1 having written no stream-json event at all; a session
    that started and then died has written its ``system`` event first. Starting again
    with the same command line can only fail the same way.
    """
    if exit_code in (0, None):
        return None
    lines = text.splitlines()
    if any(parse_line(line) is not None for line in lines):
        return None
    for line in lines:
        line = ESCAPES.sub("", line).strip()
        if _CLI_ERROR.match(line) or any(r.match(line) for r in _CLI_REFUSALS):
            line = "".join(c if c.isprintable() else "?" for c in line)
            return line if len(line) <= 500 else line[:500] + "..."
    return None

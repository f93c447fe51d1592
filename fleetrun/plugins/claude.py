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
from typing import Any, Optional

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
        ConfigKey("claude", "executable", (str,), check=_nonempty, doc="the program, looked up on PATH"),
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


# Claude Code's usage-limit messages: "Claude AI usage limit reached|1735689600" (older),
# "You've hit your session limit · resets 5:46pm (UTC)" and "5-hour limit reached ∙ resets
# 2pm"; a stream-json "rate_limit_event" with status "rejected" carries "resetsAt".
_LIMIT_EPOCH = re.compile(r"usage limit reached\|(\d{9,11})", re.I)
_LIMIT_TEXT = re.compile(r"(usage limit|limit reached|hit your .{0,20}limit|rate limit|rate_limit|overloaded)", re.I)
_RESETS = re.compile(r"resets\s+(?:([A-Z][a-z]{2})\s+(\d{1,2}),\s+)?(\d{1,2})(?::(\d{2}))?\s*(am|pm)", re.I)


def parse_reset(text: str, now: Optional[float] = None) -> Optional[float]:
    """The reset time a usage-limit message gives, as an epoch, or None."""
    m = _LIMIT_EPOCH.search(text)
    if m:
        return float(m.group(1))
    m = _RESETS.search(text)
    if not m:
        return None
    import datetime

    month, day, hour, minute, ampm = m.groups()
    h = int(hour) % 12 + (12 if ampm.lower() == "pm" else 0)
    base = datetime.datetime.fromtimestamp(now or time.time())
    when = base.replace(hour=h, minute=int(minute or 0), second=0, microsecond=0)
    if month and day:
        try:
            mon = datetime.datetime.strptime(month, "%b").month
            when = when.replace(month=mon, day=int(day))
        except ValueError:
            return None
        if when < base - datetime.timedelta(days=1):
            when = when.replace(year=when.year + 1)
    elif when <= base:
        when += datetime.timedelta(days=1)
    return when.timestamp()


def parse_stream(text: str) -> dict[str, Any]:
    """Read stream-json lines; tolerate noise (a line that is not JSON is skipped)."""
    session_id = None
    result: Optional[dict[str, Any]] = None
    reset_at: Optional[float] = None
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if not isinstance(ev, dict):
            continue
        if ev.get("session_id"):
            session_id = ev["session_id"]
        if ev.get("type") == "result":
            result = ev
        elif ev.get("type") == "rate_limit_event":
            info = ev.get("rate_limit_info") or {}
            if info.get("status") == "rejected" and isinstance(info.get("resetsAt"), (int, float)):
                reset_at = float(info["resetsAt"])
    return {"session_id": session_id, "result": result, "reset_at": reset_at}


def result_from_log(text: str, exit_code: Optional[int]) -> AgentResult:
    parsed = parse_stream(text)
    res = parsed["result"]
    if res is None:
        return AgentResult(ok=False, reason="no_result", exit_code=exit_code, session_id=parsed["session_id"],
                           result_text=text[-2000:])
    cost = float(res.get("total_cost_usd") or 0.0)
    out = AgentResult(
        ok=not res.get("is_error") and exit_code in (0, None),
        reason="" if not res.get("is_error") else "is_error",
        exit_code=exit_code,
        session_id=res.get("session_id") or parsed["session_id"],
        cost_usd=cost,
        result_text=str(res.get("result") or ""),
        num_turns=res.get("num_turns"),
        permission_denials=list(res.get("permission_denials") or []),
    )
    if out.ok is False and not out.reason:
        out.reason = f"exit:{exit_code}"
    status = res.get("api_error_status")
    body = out.result_text or " ".join(str(x) for x in res.get("errors") or [])
    if not out.result_text:
        out.result_text = body
    if res.get("is_error") and (status in (429, 529) or _LIMIT_TEXT.search(body)):
        out.usage_limit = True
        out.reason = "usage_limit"
        out.usage_reset_at = parsed["reset_at"] or parse_reset(body)
    if res.get("subtype") == "error_max_budget_usd":
        out.reason = "budget"
    return out


@hookimpl(trylast=True)
def fleetrun_agent_result(task: Any, attempt: Any, log_path: str, exit_code: Optional[int], config: Any) -> Optional[AgentResult]:
    if task.spec.agent != "claude":
        return None
    try:
        with open(log_path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        text = ""
    return result_from_log(text, exit_code)

"""Built-in ``claude`` plugin: Claude Code, headless, as the default agent.

Runs ``claude -p`` with the prompt on standard input, ``--output-format stream-json
--verbose`` and a session id; reads the stream-json events for the session id, the
final ``result`` (``is_error``, ``result``, ``total_cost_usd``, ``num_turns``,
``permission_denials``). Exit 0 without a result event is not a success.

Claude Code in ``-p`` mode denies every tool that needs permission unless the
permission mode or an allow rule grants it, so task sessions default to
``--permission-mode acceptEdits`` plus allow rules for local git commands (never
``git push``). A task's ``permission_mode`` and ``allowed_tools`` replace these.

The other Claude Code options of a task or of ``[claude]`` (``max_turns``,
``mcp_config``, ``env``, ``extra_args``...) are declared, checked and mapped onto the
CLI's flags by :mod:`fleetrun.claudeopts`.
"""

from __future__ import annotations

import os
import re
import uuid
from typing import TYPE_CHECKING, Any, Optional

from .. import claudeopts, untrusted
from ..claudecli import (  # the stream-json reader, shared with verify_agent
    LIMIT_TEXT,
    MAX_LOG_HEAD,
    MAX_LOG_TAIL,
    ResultEvent,
    executable,
    parse_reset,
    read_stream,
    rejected_arguments,
)
from ..hookimpl import hookimpl
from ..reports import SESSION_NOT_FOUND, AgentEnd, AgentResult, SpawnSpec

if TYPE_CHECKING:
    from ..config import Config

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
def fleetrun_config_keys(config: Config) -> list[Any]:
    """``[claude]`` of config.toml (docs/agents.md)."""
    from ..config import ConfigKey
    from ..taskspec import PERMISSION_MODES

    return [
        ConfigKey("claude", "executable", (str,), check=_nonempty, doc="the program, looked up on PATH", machine=True),
        ConfigKey("claude", "permission_mode", (str,), choices=PERMISSION_MODES, doc="default --permission-mode"),
        ConfigKey("claude", "allowed_tools", (list,), items=str, doc="default --allowedTools"),
        ConfigKey("claude", "resume_session", (bool,), doc="--resume an interrupted session"),
        *claudeopts.config_keys(),
    ]


@hookimpl(trylast=True)
def fleetrun_task_keys(config: Config) -> list[Any]:
    """The Claude Code options as ``[[task]]`` keys (docs/agents.md)."""
    return claudeopts.task_keys()


def base_argv(config: Config, session_id: str, model: Optional[str]) -> list[str]:
    argv = [executable(config), "-p", "--output-format", "stream-json", "--verbose", "--session-id", session_id]
    if model:
        argv += ["--model", model]
    return argv


@hookimpl(trylast=True)
def fleetrun_spawn(task: Any, attempt: Any, workspace: Any, prompt: str, config: Config) -> Optional[SpawnSpec]:
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
        argv[i : i + 2] = ["--resume", prev]
        session_id = prev
    mode = spec.permission_mode or config.setting("claude", "permission_mode", DEFAULT_PERMISSION_MODE)
    argv += ["--permission-mode", mode]
    tools = list(
        spec.allowed_tools
        if spec.allowed_tools is not None
        else config.setting("claude", "allowed_tools", DEFAULT_ALLOWED_TOOLS)
    )
    # read again for every attempt, fresh, retry or resume alike: each gets the same options
    opts = claudeopts.options_of(spec, config)
    if opts.values.get("allow_verifiers", True) is not False:
        # the agent may run what will judge it: a real coding agent that can run the
        # tests before it stops does far better work (allowed_tools widens, never narrows it)
        tools += [r for r in claudeopts.verifier_rules(spec) if r not in tools]
    if tools:
        argv += ["--allowedTools", *tools]
    budget = attempt.info.get("budget_left_usd") if attempt.info else None
    if budget is None:
        budget = spec.budget_usd
    if budget is not None:
        argv += ["--max-budget-usd", f"{budget:.4f}"]
    argv += opts.argv()
    return SpawnSpec(argv=argv, env=opts.env(), stdin="prompt", parser="claude", session_id=session_id)


@hookimpl(trylast=True)
def fleetrun_collection_modifyitems(config: Config, items: list[Any]) -> None:
    """Check the Claude Code options' files (:func:`claudeopts.file_problems`), and that a
    task's own option is on a task Claude Code runs; warn about a task whose agent is
    claude when claude cannot be started here: a warning, not an error, since the task
    may be placed on a peer that has it."""
    from pathlib import Path

    from ..collect import display_path
    from ..exceptions import UsageError, UsageErrors
    from ..hosts import executable_problem
    from ..queueing import warn_tasks
    from ..textutil import safe_name

    files: dict[str, str] = {}

    def shown(path: str) -> str:
        # once a file: a 100,000-task file is one file (the warning below names it for each)
        if path not in files:
            files[path] = display_path(Path(path), config.invocation_dir) if path else "?"
        return files[path]

    errors = []
    paths = claudeopts.PATH_KEYS
    for t in items:
        if t.agent == "claude":
            if t.extra and any(key in t.extra for key in paths):  # most of 100,000 tasks: no file to read
                errors += claudeopts.file_problems(t, config, shown)
            continue
        own = [k for k in claudeopts.KEYS if k in t.extra and k not in t.defaulted]
        if own:  # a default of every task is for the tasks Claude Code runs; a task's own is a mistake
            errors.append(
                UsageError(
                    f"is a Claude Code option; this task's agent is {t.agent!r}",
                    file=shown(t.file_of(own[0])),
                    line=t.key_lines.get(own[0], t.line),
                    key=f"task '{safe_name(t.name)}': {own[0]}",
                )
            )
    # a default of every task that is wrong is wrong once, at its own line
    first: dict[tuple[Any, ...], UsageError] = {}
    for e in errors:
        first.setdefault((e.file, e.line, e.message), e)
    errors = list(first.values())
    if errors:
        raise UsageErrors(errors) if len(errors) > 1 else errors[0]
    # each warning once per cause, with the count of tasks it applies to: a default of
    # every task (or no claude here) is one fact, not one line per task
    claude = [t for t in items if t.agent == "claude"]
    bypass: dict[tuple[str, int], list[Any]] = {}
    # the default mode read once, not a task at a time; the rest asked only of a task it concerns
    mode = config.setting("claude", "permission_mode", DEFAULT_PERMISSION_MODE)
    for t in claude if runs_as_root() else ():
        if (t.permission_mode or mode) == "bypassPermissions" and bypass_refused_as_root(t, config):
            bypass.setdefault((t.file_of("permission_mode"), t.key_lines.get("permission_mode", t.line)), []).append(t)
    for same in bypass.values():
        warn_tasks(
            config,
            same[0],
            len(same),
            "permission_mode",
            'bypassPermissions as root: Claude Code refuses it ("--dangerously-skip-permissions cannot be used '
            'with root/sudo privileges") and the task would need a human at once; run fleetrun as another user, '
            'or, in a container meant for it, set IS_SANDBOX = "1" in the task\'s env',
        )
    problem = executable_problem(executable(config))
    if problem is not None and claude:
        warn_tasks(config, claude[0], len(claude), "agent", f"{problem} (set [claude] executable in config.toml)")


def runs_as_root() -> bool:
    """fleetrun runs as root, so the sessions it starts here do too."""
    return hasattr(os, "geteuid") and os.geteuid() == 0


def bypass_refused_as_root(spec: Any, config: Config) -> bool:
    """The task's sessions would be refused at once (measured, 2.1.197 and 2.1.332): the
    bypassPermissions mode, run as root outside a deliberate sandbox (``IS_SANDBOX=1``
    in fleetrun's environment or the task's ``env``). Seen from here: a peer that runs
    the task as another user would not refuse it, so this is a warning."""
    mode = spec.permission_mode or config.setting("claude", "permission_mode", DEFAULT_PERMISSION_MODE)
    if mode != "bypassPermissions" or not runs_as_root():
        return False
    env = claudeopts.options_of(spec, config).env()
    return env.get("IS_SANDBOX", os.environ.get("IS_SANDBOX")) != "1"


def result_from_log(text: str, exit_code: Optional[int]) -> AgentResult:
    """What the session reported. Never raises: output fleetrun cannot read is a session
    that died, ``malformed_output:<why>`` (the loop resumes it, then asks a human)."""
    try:
        parsed = read_stream(text)
    except untrusted.Malformed as e:
        return AgentResult(
            ok=False,
            reason=f"malformed_output:{untrusted.reason_of(e)}",
            exit_code=exit_code,
            result_text=_tail(text),
            cost_usd=None,
        )
    res = parsed["result"]
    if res is None:  # killed, died, or cut off: the API may have answered (and billed) part of it
        rejected = rejected_arguments(text, exit_code)
        return AgentResult(
            ok=False,
            reason=f"rejected_arguments:{rejected}" if rejected else "no_result",
            exit_code=exit_code,
            session_id=parsed["session_id"],
            result_text=_tail(text),
            cost_usd=None,
        )
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
    if res.subtype == "error_during_execution" and res.num_turns == 0 and any(_NOT_FOUND.match(e) for e in res.errors):
        # measured: a --resume of a session killed before its first request was saved;
        # resuming it again can only fail the same way: the next attempt starts fresh
        out.reason = SESSION_NOT_FOUND
    elif res.subtype == "error_max_budget_usd":
        out.reason = "budget"
    elif res.subtype == "error_max_turns":  # the task's max_turns: a cap, as the budget is
        out.reason = "max_turns"
    elif res.is_error:
        classify_api_error(out, res, parsed, body)
    return out


_NOT_FOUND = re.compile(r"^No conversation found with session ID")


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
        if LIMIT_TEXT.search(body) and "not your usage limit" not in body:
            out.usage_limit = True
            out.reason = "usage_limit"
            out.usage_reset_at = parsed["reset_at"] or parse_reset(body)
        return
    if status == 429 or (status is None and synthetic == "rate_limit"):
        reset = parsed["reset_at"] or parse_reset(body)
        if reset is not None or (LIMIT_TEXT.search(body) and "not your usage limit" not in body):
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
def fleetrun_agent_result(
    task: Any, attempt: Any, log_path: str, exit_code: Optional[int], config: Config
) -> Optional[AgentResult]:
    if task.spec.agent != "claude":
        return None
    res = result_from_log(read_log(log_path), exit_code)
    res.end = end_of(res)
    return res


#: The cause words of Claude Code's ends (the core knows them only from here).
CAUSE_WORDS = frozenset(
    {
        "rate_limited",  # a 429 without a reset time: the task backs off that machine
        "api_error",  # a 500 or 529: the API's fault, transient; resumed
        "max_turns",  # a session stopped at the task's --max-turns: never resumed
        "agent_rejected_arguments",  # the CLI refused its command line: never retried
    }
)


def end_of(res: AgentResult) -> Optional[AgentEnd]:
    """What a Claude Code session's end means for the loop (:class:`~fleetrun.reports.AgentEnd`):
    a usage limit pauses the machine until its reset; a 429 without a reset time backs
    the task off; the budget or the turns it was given, or a command line the CLI
    refused, ask a human (a resumed session would only hit them again); a 500 or 529 is
    resumed. None: what its host said decides (verified, or resumed as a died session)."""
    reason = res.reason or ""
    if reason.startswith("rejected_arguments:"):
        # the agent refused its command line: the next attempt would get the same one
        return AgentEnd.give_up(f"agent_rejected_arguments:{reason.split(':', 1)[1]}", ran=False)
    if res.usage_limit:
        return AgentEnd.pause_host(res.usage_reset_at)
    if reason == "rate_limited":
        why = " ".join(res.result_text.split())[:200] or "HTTP 429"
        return AgentEnd.back_off(f"rate_limited:{why}")
    if reason == "budget":
        return AgentEnd.give_up("budget_exhausted:the agent reached its --max-budget-usd")
    if reason == "max_turns":
        # the task's max_turns: a cap the user set, as budget_usd is; a resumed session
        # would only take that many turns again
        return AgentEnd.give_up("max_turns:the agent reached its --max-turns")
    if reason.startswith("api_error:") and not res.ok:
        return AgentEnd.resume(reason)
    return None

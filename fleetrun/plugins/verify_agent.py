"""Built-in ``verify_agent`` plugin: ``agent = "review prompt"`` verifiers.

Runs a headless, read-only Claude Code reviewer in the attempt's workspace::

    claude -p --output-format stream-json --verbose --session-id <uuid>
           --setting-sources user --strict-mcp-config --mcp-config '{"mcpServers":{}}'
           --disable-slash-commands --json-schema <verdict schema>
           --permission-mode dontAsk --tools Read,Grep,Glob [--model M] [--max-budget-usd B]
           --disallowedTools Bash Edit Write MultiEdit NotebookEdit ...

The workspace is the branch under review, written by the agent being reviewed, so
nothing in it may configure the reviewer's CLI: ``--setting-sources user`` leaves out
the project and local settings (``.claude/settings.json``, ``.claude/settings.local.json``:
their hooks would run as the user during the review, their permission rules would
apply), ``--strict-mcp-config`` with an empty ``--mcp-config`` starts no MCP server
(``.mcp.json``), ``--disable-slash-commands`` loads no project command or skill. The
user's own settings stay (they are trusted).

``--tools`` leaves only the tools that read and search, so a write or a shell command
has no tool to run with; the deny rules close what is left, and ``dontAsk`` refuses
anything that would need a permission. (Not ``plan``: measured with the real CLI, plan
mode sends a ``--model haiku`` reviewer's requests as the default model.) The prompt
(the review prompt, the task, ``git diff --stat`` and the diff) goes on standard input:
the variadic ``--tools`` / ``--disallowedTools`` options would swallow a prompt argument.

The reviewer's stream-json goes to ``attempts/<id>/review-<n>.jsonl``. The verdict is the
``result`` event's ``structured_output`` (``{"verdict": "PASS"|"FAIL", "reason": ...}``,
asked for with ``--json-schema``), or, without one, its text read with the same rule as
the brain's reply (:func:`fleetrun.diffutil.parse_reply`). A reviewer that cannot judge
is an ERROR, never the agent's failure (:func:`error_of`): a CLI that cannot start or
refuses its command line (its own ``error:`` line, before any event), or one that ran
out of its own budget, is permanent (a human, at once); no result, a malformed result,
``is_error`` (an API error), a reply without a verdict or a timeout is transient (it is
asked again after a backoff). The reviewer's ``total_cost_usd`` is the
verdict's cost, which the ledger adds to the task's cost. ``--max-budget-usd`` is the
verifier's ``budget_usd``, capped by what is left of the task's ``budget_usd``; with
nothing left the reviewer does not start (a FAIL, and the next attempt stops at
``budget_exhausted``). The reviewer's environment has ``FLEETRUN_VERIFIER=agent``.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Union

from ..claudecli import (  # one reader of Claude Code's output, shared with `claude`
    executable,
    parse_stream,
    rejected_arguments,
)
from ..config import output_cap
from ..diffutil import local_workspace, parse_reply, review_prompt, task_diff
from ..hookimpl import hookimpl
from ..procutil import KEEP_BYTES, ProcessHandle, tail_text, task_env
from ..reports import MIN_BUDGET_USD, PERMANENT, TRANSIENT, Verdict
from ..untrusted import Malformed, cost, obj, one_of, opt_boolean, opt_text, text

if TYPE_CHECKING:
    from ..config import Config

MAX_DIFF_BYTES = 60000
#: Refuses whatever would need a permission, and keeps the model it is given (plan
#: mode does not: measured with the real CLI, it sends an alias like haiku as the default).
PERMISSION_MODE = "dontAsk"
#: Only the user's settings: the project's and local ones are on the branch under review.
SETTING_SOURCES = "user"
#: No MCP server at all (with --strict-mcp-config: not even the worktree's .mcp.json).
NO_MCP_SERVERS = json.dumps({"mcpServers": {}}, separators=(",", ":"))
#: What the reviewer is asked to answer with (--json-schema); the text rule is the fallback.
VERDICT_SCHEMA = json.dumps(
    {
        "type": "object",
        "properties": {
            "verdict": {"type": "string", "enum": ["PASS", "FAIL"]},
            "reason": {"type": "string", "description": "why, in one line"},
        },
        "required": ["verdict", "reason"],
        "additionalProperties": False,
    },
    separators=(",", ":"),
)
#: The only built-in tools the reviewer has.
TOOLS = "Read,Grep,Glob"
#: Denied even if a setting or a future default brought them back.
DENIED_TOOLS = (
    "Bash",
    "Edit",
    "Write",
    "MultiEdit",
    "NotebookEdit",
    "WebFetch",
    "WebSearch",
    "Task",
    "KillShell",
    "SlashCommand",
    "Skill",
)
INTRO = (
    "You are a read-only code reviewer. Another coding agent worked on the task below in this "
    "working directory; review its work. You can read and search files (Read, Grep, Glob); you "
    "cannot edit files or run commands, and you must not try."
)


def review_budget(task: Any, verifier: Any) -> Optional[float]:
    """The reviewer's spending cap: its own ``budget_usd``, and no more than what is left
    of the task's ``budget_usd`` (which covers attempts and verifiers alike)."""
    caps = [verifier.budget_usd]
    if task.spec.budget_usd is not None:
        caps.append(max(0.0, task.spec.budget_usd - task.cost_usd))
    known = [c for c in caps if c is not None]
    return min(known) if known else None


def reviewer_argv(config: Config, verifier: Any, session_id: str, budget: Optional[float] = None) -> list[str]:
    """The reviewer's command line (the prompt goes on standard input)."""
    argv = [
        executable(config),
        "-p",
        "--output-format",
        "stream-json",
        "--verbose",
        "--session-id",
        session_id,
        # nothing from the branch under review configures the CLI
        "--setting-sources",
        SETTING_SOURCES,
        "--strict-mcp-config",
        "--mcp-config",
        NO_MCP_SERVERS,
        "--disable-slash-commands",
        "--json-schema",
        VERDICT_SCHEMA,
        "--permission-mode",
        PERMISSION_MODE,
        "--tools",
        TOOLS,
    ]
    if verifier.model:
        argv += ["--model", verifier.model]
    if budget is not None:
        argv += ["--max-budget-usd", f"{budget:.4f}"]
    # last: a variadic option swallows the words after it
    argv += ["--disallowedTools", *DENIED_TOOLS]
    return argv


def reviewer_prompt(task: Any, verifier: Any, workspace: Any) -> str:
    diff = task_diff(workspace, getattr(workspace, "base_ref", None), MAX_DIFF_BYTES)
    return review_prompt(task.spec.prompt, diff, verifier.text, INTRO)


def structured_verdict(value: Any) -> tuple[bool, str]:
    """The verdict of a ``structured_output``: ``{"verdict": "PASS"|"FAIL", "reason": ...}``.
    :raises Malformed: for anything else."""
    data = obj(value, "structured_output")
    verdict = one_of(data.get("verdict"), "structured_output.verdict", ("PASS", "FAIL"))
    reason = (opt_text(data, "reason", "structured_output", limit=2000, default="") or "").strip()
    line = reason.splitlines()[0][:300] if reason else ""
    if verdict == "PASS":
        return True, f"PASS: {line}" if line else "PASS"
    return False, line or "FAIL (no reason given)"


def verdict_from_stream(text_: str, exit_code: Optional[int]) -> tuple[bool, str, str, float]:
    """Read a reviewer's stream-json. :return: (passed, reason, output, cost_usd).

    Every field of the result event is checked (it is the reviewer's output, untrusted):
    one that does not fit is a FAIL with its reason, never an exception."""
    res = parse_stream(text_)["result"]
    if res is None:
        where = (
            f"exit code {exit_code}"
            if exit_code is not None and exit_code >= 0
            else (f"killed by signal {-exit_code}" if exit_code is not None else "still running")
        )
        return False, f"no verdict: the reviewer ended without a result ({where})", "", 0.0
    if res.get("subtype") == "malformed_output":  # parse_stream could not read the result event
        return False, f"no verdict: malformed result event: {'; '.join(res.get('errors') or [])}", "", 0.0
    try:
        spent = cost(res.get("total_cost_usd"), "result.total_cost_usd")
    except Malformed as e:
        return False, f"no verdict: malformed result event: {e}", "", 0.0
    try:
        reply = opt_text(res, "result", "result", default="") or ""
        if opt_boolean(res, "is_error", "result"):
            sub = opt_text(res, "subtype", "result", limit=100, default="") or "error"
            errors = res.get("errors") or []
            detail = "; ".join(str(e) for e in errors) if isinstance(errors, list) and errors else reply
            reason = f"the reviewer ended with an error ({sub})" + (f": {detail}" if detail else "")
            return False, reason.splitlines()[0][:300], reply or detail, spent
        if res.get("structured_output") is not None:
            passed, reason = structured_verdict(res["structured_output"])
            return passed, reason, reply or json.dumps(res["structured_output"]), spent
    except Malformed as e:
        return False, f"no verdict: malformed result event: {e}", text(str(res), "result", 2000), spent
    passed, reason = parse_reply(reply)
    return passed, reason, reply, spent


def error_of(passed: bool, reason: str, refused: bool) -> Optional[str]:
    """Whether a reviewer's outcome is an ERROR (it could not judge), and which.

    :param reason: :func:`verdict_from_stream`'s reason.
    :param refused: the CLI refused its command line (it says so the same way again).
    :return: None for a verdict on the work (PASS, or a FAIL the reviewer gave),
        :data:`~fleetrun.reports.PERMANENT` or :data:`~fleetrun.reports.TRANSIENT`.
    """
    if passed:
        return None
    if refused:
        return PERMANENT
    if reason.startswith("the reviewer ended with an error"):
        # its own budget_usd spent: asking again spends the same, to the same cap
        return PERMANENT if "(error_max_budget_usd)" in reason else TRANSIENT
    if reason.startswith("no verdict") or reason == "empty reply":
        return TRANSIENT
    return None


class AgentHandle(ProcessHandle):
    """A running reviewer; ``poll()`` gives the Verdict once it has ended."""

    def __init__(
        self,
        verifier: Any,
        argv: list[str],
        cwd: str,
        env: dict[str, str],
        prompt_path: Path,
        out_path: Path,
        host: str = "local",
        max_bytes: Optional[int] = None,
    ) -> None:
        self.argv = argv
        super().__init__(verifier, argv, cwd, env, out_path, stdin_path=prompt_path, host=host, max_bytes=max_bytes)

    def _make(
        self, passed: bool, reason: str, output: str = "", cost: float = 0.0, error: Optional[str] = None
    ) -> Verdict:
        cut = self.output_cut()
        if cut:
            reason = f"{reason}; {cut}"
        return Verdict(
            passed=passed,
            kind="agent",
            label=self.verifier.label,
            reason=reason,
            output=output[-KEEP_BYTES:],
            cost_usd=cost,
            duration_s=time.monotonic() - self.started,
            host=self.host,
            error=error,
        )

    def _read(self) -> str:
        try:
            return self.out_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def cannot_start(self, error: str) -> Verdict:
        return self._make(False, f"cannot start the reviewer: {error}", error=PERMANENT)

    def timed_out(self) -> Verdict:
        _, _, _, cost = verdict_from_stream(self._read(), None)
        return self._make(
            False,
            f"reviewer timed out after {self.verifier.timeout_s:g}s",
            output=tail_text(self.out_path),
            cost=cost,
            error=TRANSIENT,
        )

    def ended(self, code: int) -> Verdict:
        text_ = self._read()
        passed, reason, output, cost = verdict_from_stream(text_, code)
        refused = None if passed else rejected_arguments(text_, code)
        if refused:
            reason = f"the reviewer's CLI refused its arguments: {refused}"
        error = error_of(passed, reason, refused is not None)
        return self._make(passed, reason, output=output or tail_text(self.out_path), cost=cost, error=error)


def reviewer_env(task: Any, attempt: Any, workspace: Any) -> dict[str, str]:
    return task_env(task, attempt, workspace.path, FLEETRUN_VERIFIER="agent")


@hookimpl
def fleetrun_task_keys(config: Config) -> list[Any]:
    """The verifier kind "agent" this plugin runs: here, on the supervising machine
    (a peer's attempt's work is fetched back first). Without this plugin
    (``-p no:verify_agent``) a tasks file that uses it does not validate."""
    from ..taskkeys import kind_text_check
    from ..taskspec import KeyDecl

    return [
        KeyDecl(
            "agent",
            (str,),
            where="verify_kind",
            doc="prompt for a read-only reviewer",
            check=kind_text_check,
            runs="here",
        )
    ]


@hookimpl(trylast=True)
def fleetrun_verify(
    task: Any, verifier: Any, workspace: Any, attempt: Any, config: Config
) -> Optional[Union[AgentHandle, Verdict]]:
    if verifier.kind != "agent":
        return None
    local = local_workspace(config, task, attempt, workspace, verifier)
    if isinstance(local, Verdict):
        return local
    workspace = local
    budget = review_budget(task, verifier)
    if budget is not None and budget < MIN_BUDGET_USD:
        # never silently spend more: the next attempt stops at budget_exhausted
        spent = f"${task.cost_usd:.2f} of ${task.spec.budget_usd:.2f}" if task.spec.budget_usd is not None else ""
        why = f"the task's budget is spent ({spent})" if spent else "the verifier's budget_usd is 0"
        return Verdict(passed=False, kind="agent", label=verifier.label, reason=f"no review: {why}")
    adir = config.home / "attempts" / attempt.id
    adir.mkdir(parents=True, exist_ok=True, mode=0o700)
    n = next((i for i, v in enumerate(task.spec.verify) if v is verifier), 0) + 1
    prompt_path = adir / f"review-{n}.prompt"
    fd = os.open(prompt_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(reviewer_prompt(task, verifier, workspace))
    argv = reviewer_argv(config, verifier, str(uuid.uuid4()), budget)
    return AgentHandle(
        verifier,
        argv,
        workspace.path,
        reviewer_env(task, attempt, workspace),
        prompt_path,
        adir / f"review-{n}.jsonl",
        max_bytes=output_cap(config),
    )

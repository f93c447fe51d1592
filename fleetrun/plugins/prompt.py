"""Built-in ``prompt`` plugin: the default prompt of each kind of attempt.

- fresh: the task's prompt, then what its dependencies handed off (and, with ``base =
  "dependencies"``, that their branches are merged into the worktree);
- retry: the same, then which verifier failed and its output, then an
  instruction to fix it;
- resume: why the previous session ended (its timeout, a stall, the signal that
  killed it, a killed shepherd, a restarted machine...) and to assess the worktree
  (git status, git log) before doing anything, then the task, then any earlier
  verifier failures.

A long verifier output is trimmed on line boundaries: its first and last lines, with
``… N lines omitted …`` between them, its whole size, and where the whole of it is.

An attempt that starts on a merge of its dependencies stopped on a conflict (``on_conflict
= "agent"``) is told that first, with the files and the branches not merged yet.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from ..depmerge import conflict_prompt
from ..hookimpl import hookimpl

if TYPE_CHECKING:
    from ..config import Config

#: The most of one verifier's output a prompt holds: the head (where the first
#: failure's traceback is) and the tail (where the summary is).
OUTPUT_LIMIT = 12000
HEAD_LIMIT = 4000
TAIL_LIMIT = OUTPUT_LIMIT - HEAD_LIMIT
#: How much of the output file is read for the head and for the tail.
CHUNK = 64 * 1024


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def duration(seconds: float) -> str:
    """``1 second``, ``20 minutes``, ``2 hours``: how long, in words."""
    if seconds < 90:
        return _plural(max(1, round(seconds)), "second")
    if seconds < 90 * 60:
        return _plural(round(seconds / 60), "minute")
    return _plural(round(seconds / 3600), "hour")


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return ""


def _one_line(text: str, limit: int = 200) -> str:
    line = " ".join((text or "").split())
    return line[:limit] + ("..." if len(line) > limit else "")


def _machine_restarted(prev: Any) -> bool:
    """The local machine booted after the attempt started: a reboot ended it."""
    if prev is None or prev.host not in (None, "local") or not prev.started:
        return False
    try:
        import psutil

        return float(psutil.boot_time()) > float(prev.started)
    except Exception:  # no boot time to be had: say what else is known
        return False


def resume_cause(cause: Optional[str], prev: Any, task: Any) -> str:
    """Why the previous session ended, in words the next session can act on, from the
    cause of the move to RESUMING and the attempt it names.

    :param cause: the transition's cause (``timeout``, ``stalled``, ``session_died:…``,
        ``usage_limit:…``, ``start_failed:…``…), or None when the ledger has none.
    :param prev: that attempt (outcome, exit code, signal, host), or None.
    """
    word, _, detail = (cause or "").partition(":")
    spec = task.spec
    host = (prev.host if prev is not None else None) or "local"
    if word == "timeout":
        return (
            f"it was stopped after running {duration(spec.timeout_min * 60)} "
            f"(timeout_min = {spec.timeout_min:g}); work in smaller steps and commit as you go"
        )
    if word == "stalled":
        return (
            f"it produced no output for {duration(spec.stall_timeout_min * 60)} and was stopped "
            f"(stall_timeout_min = {spec.stall_timeout_min:g}); a command that waits for input or "
            "runs long without printing is ended the same way"
        )
    if word == "session_died":
        info = (prev.info or {}) if prev is not None else {}
        sig = info.get("signal")
        code = prev.exit_code if prev is not None else None
        if detail == "died" or (prev is not None and prev.outcome == "died"):
            if _machine_restarted(prev):
                return f"the machine it ran on ({host}) was restarted"
            where = "" if host == "local" else f" on {host}"
            return (
                f"the fleetrun process that watched it (its shepherd){where} was killed, and the "
                "session was stopped with it"
            )
        if isinstance(sig, int) and sig > 0:
            name = _signal_name(sig)
            return f"its process died (killed by signal {sig}{', ' + name if name else ''})"
        if detail == "no_result":
            return "it ended without reporting a result" + (f" (exit code {code})" if code is not None else "")
        if detail == "is_error":
            text = _one_line(prev.result_text or "") if prev is not None else ""
            return "the agent reported an error" + (f": {text}" if text else "")
        if detail == "session_not_found":
            return (
                "the session could not be resumed (the agent found no saved conversation: it was "
                "stopped before its first request), so this is a new session"
            )
        if detail.startswith("exit:"):
            return f"its process exited with code {detail[5:]} before it finished"
        if detail in ("cancelled", "stopped"):
            return "it was stopped by fleetrun before it finished"
        return f"it ended without finishing ({detail or 'no reason was recorded'})"
    if word == "api_error":  # a 500 or 529 (the claude plugin's reading): the API's fault, not the agent's
        text = _one_line(prev.result_text or "") if prev is not None else ""
        return f"the API answered with an error (HTTP {detail or '?'})" + (f": {text}" if text else "")
    if word == "usage_limit":
        return f"it hit the account's usage limit ({detail}); fleetrun waited for the limit to reset"
    if word == "start_failed":
        return f"its agent could not be started ({detail})"
    if word == "peer_refused":
        return f"the machine it was sent to refused it ({detail})"
    if word == "mailbox_unclaimed":  # delivered to a role (the mailbox plugin), never taken
        return f"it waited in a role's mailbox and no session took it ({detail}), so it may not have been started"
    if word == "operator_retry":
        return f"the operator sent it to another machine ({detail})"
    return f"it ended ({cause})" if cause else "fleetrun recorded no reason"


# -- verifier output -------------------------------------------------------------------


def _output_file(v: Any, config: Optional[Config]) -> Optional[Path]:
    """The file a local ``run`` verifier wrote its whole output to, if it is still there
    (the verdict keeps only its last 64 KiB)."""
    if getattr(v, "kind", None) != "run" or getattr(v, "host", "local") not in (None, "local"):
        return None
    home = getattr(config, "home", None)
    attempt_id = getattr(v, "attempt_id", None)
    if home is None or not attempt_id:
        return None
    path = Path(home) / "attempts" / attempt_id / f"verify-{int(v.idx) + 1}.out"
    try:
        return path if path.is_file() and not path.is_symlink() else None
    except OSError:
        return None


def _read_file(path: Path) -> Optional[tuple[str, str, int, int]]:
    """(head chunk, tail chunk, size in bytes, number of lines) of an output file."""
    try:
        with open(path, "rb") as f:
            head = f.read(CHUNK)
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - CHUNK))
            tail = f.read()
            f.seek(0)
            lines = 0
            last = b"\n"
            while True:
                block = f.read(1 << 20)
                if not block:
                    break
                lines += block.count(b"\n")
                last = block[-1:]
    except OSError:
        return None
    if last != b"\n":
        lines += 1
    if size > CHUNK:  # whole lines only: the head's last and the tail's first may be cut
        head = head[: head.rfind(b"\n") + 1] if b"\n" in head else head
        tail = tail[tail.find(b"\n") + 1 :] if b"\n" in tail else tail
    return head.decode("utf-8", "replace"), tail.decode("utf-8", "replace"), size, lines


def _lines(text: str) -> list[str]:
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def trim_output(head_text: str, tail_text: str, total_lines: int) -> tuple[str, bool]:
    """The head and the tail of an output, cut on line boundaries, with ``… N lines
    omitted …`` between them. :return: (text, whether anything was left out)."""
    head_lines = _lines(head_text)
    if head_text == tail_text and len(head_text) <= OUTPUT_LIMIT:
        return head_text.rstrip("\n"), False
    head: list[str] = []
    used = 0
    for line in head_lines:
        if used + len(line) + 1 > HEAD_LIMIT:
            break
        head.append(line)
        used += len(line) + 1
    if not head and head_lines:  # one very long first line: its start
        head = [head_lines[0][:HEAD_LIMIT] + " …"]
        used = HEAD_LIMIT
    tail: list[str] = []
    used = 0
    tail_lines = _lines(tail_text)
    for line in reversed(tail_lines):
        if used + len(line) + 1 > TAIL_LIMIT or len(head) + len(tail) >= total_lines:
            break
        tail.append(line)
        used += len(line) + 1
    tail.reverse()
    if not tail and tail_lines:
        tail = ["… " + tail_lines[-1][-TAIL_LIMIT:]]
    omitted = max(0, total_lines - len(head) - len(tail))
    if not omitted:
        return "\n".join(head + tail), False
    return "\n".join(head + [f"… {omitted:,} lines omitted …"] + tail), True


def _render_output(v: Any, config: Optional[Config], task: Any) -> str:
    from ..junitreport import split_details

    # a per-test verdict (docs/verifiers.md) comes first and whole: the new failures,
    # however long the command's output after it, of which the file holds the rest
    details, out = split_details(v.output or "")
    if details:
        return "\nThe tests it failed for:\n```\n" + details + "\n```" + _render_command_output(v, out, config, task)
    return _render_command_output(v, out, config, task)


def _render_command_output(v: Any, out: str, config: Optional[Config], task: Any) -> str:
    path = _output_file(v, config)
    read = _read_file(path) if path is not None else None
    if read is not None and read[2] > len(out.encode("utf-8", "replace")):
        head, tail, size, lines = read
        where = f"the whole output is in {path}"
    else:
        head = tail = out
        size, lines = len(out.encode("utf-8", "replace")), len(_lines(out))
        where = (
            f"the whole output is in {path}"
            if path is not None
            else f"`fleetrun logs {task.name}` shows what was kept of it"
        )
    if size <= OUTPUT_LIMIT and head == tail:
        text = out.strip("\n")
        return ("\nIts output:\n```\n" + text + "\n```") if text.strip() else "\nIt printed nothing."
    text, cut = trim_output(head, tail, lines)
    if not cut:
        return "\nIts output:\n```\n" + text + "\n```"
    return (
        f"\nIts output ({size:,} bytes, {lines:,} lines; its first and last lines are shown below, "
        f"{where}):\n```\n" + text + "\n```"
    )


def _failures(failures: list[Any], config: Optional[Config] = None, task: Any = None) -> str:
    parts = []
    for v in failures:
        kind = v.kind
        specs = task.spec.verify if task is not None else []
        spec = specs[v.idx] if isinstance(v.idx, int) and 0 <= v.idx < len(specs) else None
        if spec is not None and spec.name and spec.kind == "run":  # a name alone does not say what to run
            kind = f"run: `{' '.join(spec.text.split())}`"
        head = (
            f"Verifier `{v.label}` ({kind}) failed: {v.reason}."
            if v.reason
            else f"Verifier `{v.label}` ({kind}) failed."
        )
        parts.append(head + _render_output(v, config, task))
    return "\n\n".join(parts)


def _handoffs(handoffs: list[Any], merged: bool = False) -> str:
    if not handoffs:
        return ""
    where = (
        "their work is on their branches, merged into this worktree" if merged else "their work is on their branches"
    )
    return f"\n\n## Work this task builds on\nThese tasks are DONE; {where}:\n" + "\n".join(
        h.render() for h in handoffs
    )


def _baseline_warnings(task: Any, config: Config) -> str:
    """``baseline = "warn"``: the verifiers that already fail on the base commit, each
    with its summary line, so the agent does not chase a failure it did not cause."""
    from ..baseline import warnings
    from ..ledger import open_ledger

    found = warnings(open_ledger(config), task) if task.spec.verify else []
    if not found:
        return ""
    lines = "\n".join(f"- `{label}`: {_one_line(summary)}" for label, summary in found)
    return (
        "\n\n## Verifiers that already fail on the base\nThese verifiers already fail on the base commit, "
        "before any change (the task was started anyway):\n" + lines
    )


@hookimpl(trylast=True)
def fleetrun_build_prompt(task: Any, attempt: Any, config: Config, context: dict[str, Any]) -> Optional[str]:
    kind = context.get("kind", "fresh")
    ws = (getattr(attempt, "workspace", None) or {}) if attempt is not None else {}
    conflict = ws.get("conflict") if isinstance(ws, dict) else None
    merged = bool(isinstance(ws, dict) and (ws.get("merged") or conflict))
    base = task.spec.prompt.rstrip() + _handoffs(context.get("handoffs", []), merged) + _baseline_warnings(task, config)
    text = _by_kind(kind, base, task, config, context)
    if isinstance(conflict, dict):  # the agent starts on a stopped merge: that comes first
        # a resume's text has its own "## The task" after why the session ended
        return (
            conflict_prompt(conflict, task.spec.git_ref) + ("\n\n" if kind == "resume" else "\n\n## The task\n") + text
        )
    return text


def _by_kind(kind: str, base: str, task: Any, config: Config, context: dict[str, Any]) -> str:
    failures = context.get("failures") or []
    if kind == "retry":
        return (
            base
            + "\n\n## A previous attempt did not pass verification\n"
            + _failures(failures, config, task)
            + "\n\nThe work so far is in this working directory. Fix the problem so that "
            "the verifier passes, then commit your changes."
        )
    if kind == "resume":
        why = resume_cause(context.get("resume_reason"), context.get("previous"), task)
        text = (
            "Your previous session on this task was interrupted: " + why + ". Before doing "
            "anything, assess the working directory: run `git status` and `git log` to see what is "
            "already done. Do not redo finished work; continue from where it stopped.\n\n## The task\n" + base
        )
        if failures:
            text += "\n\n## Earlier verifier failures\n" + _failures(failures, config, task)
        return text
    return base

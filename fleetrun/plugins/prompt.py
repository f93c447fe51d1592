"""Built-in ``prompt`` plugin: the default prompt of each kind of attempt.

- fresh: the task's prompt, then what its dependencies handed off;
- retry: the same, then which verifier failed and its output, then an
  instruction to fix it;
- resume: a note that the previous session was interrupted and to assess the
  worktree (git status, git log) before doing anything, then the task, then any
  earlier verifier failures.
"""

from __future__ import annotations

from typing import Any, Optional

from ..hookimpl import hookimpl

OUTPUT_LIMIT = 12000


def _failures(failures: list[Any]) -> str:
    parts = []
    for v in failures:
        out = (v.output or "").strip()
        if len(out) > OUTPUT_LIMIT:
            out = "[... earlier output cut ...]\n" + out[-OUTPUT_LIMIT:]
        head = f"Verifier `{v.label}` ({v.kind}) failed: {v.reason}." if v.reason else f"Verifier `{v.label}` ({v.kind}) failed."
        parts.append(head + ("\nIts output:\n```\n" + out + "\n```" if out else "\nIt printed nothing."))
    return "\n\n".join(parts)


def _handoffs(handoffs: list[Any]) -> str:
    if not handoffs:
        return ""
    return ("\n\n## Work this task builds on\nThese tasks are DONE; their work is on their branches:\n"
            + "\n".join(h.render() for h in handoffs))


@hookimpl(trylast=True)
def fleetrun_build_prompt(task: Any, attempt: Any, config: Any, context: dict[str, Any]) -> Optional[str]:
    kind = context.get("kind", "fresh")
    base = task.spec.prompt.rstrip() + _handoffs(context.get("handoffs", []))
    failures = context.get("failures") or []
    if kind == "retry":
        return (base + "\n\n## A previous attempt did not pass verification\n"
                + _failures(failures)
                + "\n\nThe work so far is in this working directory. Fix the problem so that "
                "the verifier passes, then commit your changes.")
    if kind == "resume":
        why = context.get("resume_reason") or "it stopped"
        text = ("Your previous session on this task was interrupted (" + why + "). Before doing anything, "
                "assess the working directory: run `git status` and `git log` to see what is already done. "
                "Do not redo finished work; continue from where it stopped.\n\n## The task\n" + base)
        if failures:
            text += "\n\n## Earlier verifier failures\n" + _failures(failures)
        return text
    return base

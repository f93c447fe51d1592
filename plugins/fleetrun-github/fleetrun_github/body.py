"""The pull request's title and body, from what the ledger holds of a DONE task: pure
functions of plain values (tested without a run).

The body is Markdown. What the agent wrote (the handoff's summary) and what a model
said (a verifier's reason) are shown inert: the summary in a fenced code block whose
fence is longer than any run of backticks inside it, a reason as a code span, so a
``Closes #1``, an ``@org/team``, an image or a heading imitating the body's own
sections is only text (GitHub links no reference and pings nobody inside code). What
the tasks file says (the prompt, names, the verifiers' labels) is the user's. Control
characters go everywhere, the summary is cut at :data:`SUMMARY_CHARS`, the body at
:data:`BODY_CHARS` (GitHub refuses a body over 65536 characters).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

TITLE_CHARS = 200
SUMMARY_CHARS = 20000
BODY_CHARS = 60000


@dataclass
class Verdict:
    """One verifier's verdict on one attempt, as the body lists it."""

    attempt: int
    kind: str
    label: str
    passed: bool
    reason: str


@dataclass
class Facts:
    """What the body says about a DONE task."""

    name: str
    task_id: str
    prompt: str
    cause: str
    branch: str
    base: Optional[str]
    attempts: int
    retries: int
    resumes: int
    cost_usd: float
    cost_known: bool = True
    summary: str = ""
    host: str = "local"
    verdicts: list[Verdict] = field(default_factory=list)


def clean(text: str) -> str:
    """``text`` without control characters but newlines and tabs."""
    return "".join(c for c in text if c in "\n\t" or c.isprintable())


def one_line(text: str) -> str:
    return " ".join(clean(text).split())


def first_line(prompt: str) -> str:
    for line in prompt.splitlines():
        if line.strip():
            return one_line(line)
    return ""


def title(name: str, prompt: str) -> str:
    """``NAME: the prompt's first line``, at most :data:`TITLE_CHARS` characters."""
    head = first_line(prompt)
    text = f"{one_line(name)}: {head}" if head else one_line(name)
    return text if len(text) <= TITLE_CHARS else text[: TITLE_CHARS - 3] + "..."


def _code(text: str) -> str:
    """``text`` as an inline code span, whatever backticks it holds."""
    text = one_line(text)
    ticks = "`"
    while ticks in text:
        ticks += "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def fenced(text: str) -> list[str]:
    """``text`` as the lines of a fenced code block (CommonMark): the fence is a run of
    backticks longer than any inside ``text`` (at least three), so no line of it can
    close the block early, and the info string is empty."""
    longest = run = 0
    for c in text:
        run = run + 1 if c == "`" else 0
        longest = max(longest, run)
    fence = "`" * max(3, longest + 1)
    return [fence, *text.split("\n"), fence]


def body(f: Facts, version: str) -> str:
    """The pull request's body."""
    tries = f"{f.attempts} attempt{'s' if f.attempts != 1 else ''}"
    extra = [f"{n} {w}{'s' if n != 1 else ''}" for n, w in ((f.retries, "retry"), (f.resumes, "resume")) if n]
    if extra:
        tries += f" ({', '.join(extra).replace('retrys', 'retries')})"
    cost = f"${f.cost_usd:.2f}" + ("" if f.cost_known else " (at least: an attempt's cost is unknown)")
    where = "" if f.host == "local" else f", on {one_line(f.host)}"
    lines = [
        f"fleetrun task {_code(f.name)} (`{f.task_id}`) is DONE ({one_line(f.cause)}) after {tries}{where}.",
        "",
        "## Task",
        "",
    ]
    prompt = clean(f.prompt).strip().splitlines()
    lines += [f"> {line}".rstrip() for line in prompt[:20]]
    if len(prompt) > 20:
        lines.append(f"> ... ({len(prompt) - 20} more lines)")
    lines += ["", "## Verifiers", ""]
    if f.verdicts:
        for v in f.verdicts:
            why = f": {_code(v.reason)}" if v.reason.strip() else ""  # a brain's or reviewer's words
            lines.append(
                f"- attempt {v.attempt}: **{'PASS' if v.passed else 'FAIL'}** {one_line(v.kind)} {_code(v.label)}{why}"
            )
    else:
        lines.append("- none: the task is DONE when its session ended well")
    lines += ["", "## Cost", "", f"{cost} over {tries}.", "", "## Summary", ""]
    summary = clean(f.summary).strip("\n").rstrip()
    cut = len(summary) > SUMMARY_CHARS
    if summary.strip():
        # the agent's words: shown, never rendered (no reference, mention, image or section)
        lines += fenced(summary[:SUMMARY_CHARS])
    else:
        lines.append("(the task handed on no summary)")
    if cut:
        lines.append("[... cut]")
    base = f" from {_code(f.base)}" if f.base else ""
    lines += [
        "",
        "---",
        f"Branch {_code(f.branch)}{base}. Opened by fleetrun-github {version}; "
        f"`fleetrun logs {f.task_id}` has the whole story.",
    ]
    text = "\n".join(lines) + "\n"
    return text if len(text) <= BODY_CHARS else text[:BODY_CHARS] + "\n\n[... cut]\n"

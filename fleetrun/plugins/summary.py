"""The end of a run, as the ``terminal`` plugin prints it (not a plugin of its own).

- :func:`failure_tail`: the last lines of a failing verifier's output, under its verdict
  line: a few, each cut to the width, without ``-v``; 20 whole ones with ``-v``.
- :func:`short_summary`: what pytest's ``-ra`` is to tests, for the run's NEEDS_HUMAN
  and CANCELLED tasks: the cause, the failed verifier (or setup command) and its summary line, the branch,
  and the command that shows the rest (``fleetrun logs NAME``).
- :func:`where_work_is`: where each task of the run ran and where its branch is, when
  any ran on a peer.
- :func:`durations`: ``--durations N``, the slowest tasks and verifiers of the run.

A task's duration is the time it was being worked on in this run: from the start of
its first attempt in this run (or the run's start, for an attempt it adopted) to its
last state change in this run. Retries, verifiers and the waits between attempts
count; the wait for its dependencies and for a place before it first started does not.
A verifier's duration is how long it ran.
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from ..states import State
from ..table import cut
from ..textutil import safe_name, safe_text
from ..verdicttext import summary_line
from ..whereis import ran_on_peer, where_text

if TYPE_CHECKING:  # the terminal plugin is loaded by `fleetrun --help`: no ledger then
    from ..ledger import Ledger, Task
    from ..records import VerdictRow

#: Lines of a failing verifier's output shown under its verdict, without and with ``-v``.
TAIL_LINES = 5
TAIL_LINES_VERBOSE = 20
#: How wide a shown output line may be when the output is not a terminal.
PLAIN_WIDTH = 160
#: What the tail lines start with.
TAIL_PREFIX = "           | "


def failure_tail(output: str, verbosity: int, width: Optional[int]) -> list[str]:
    """The lines to print under a failing verdict.

    :param output: what the verifier printed.
    :param verbosity: the run's (``-v`` is 1): 0 a few lines, cut; more, 20 whole ones.
    :param width: the terminal's width, or None when it is not one.
    :return: the lines, each with :data:`TAIL_PREFIX`; the trailing blank lines are left out.
    """
    lines = output.rstrip().splitlines()
    if verbosity > 0:
        return [TAIL_PREFIX + safe_text(line) for line in lines[-TAIL_LINES_VERBOSE:]]
    room = max(20, (width or PLAIN_WIDTH) - len(TAIL_PREFIX))
    return [TAIL_PREFIX + cut(safe_text(line.rstrip()), room) for line in lines[-TAIL_LINES:]]


def _look(led: Ledger, task: Task) -> str:
    """``fleetrun logs NAME``, or the id where the name now means a newer task, or
    where it could not be typed back as shown (it holds control characters)."""
    found = led.find(task.name)
    typable = safe_name(task.name) == task.name
    ref = task.name if typable and found is not None and found.id == task.id else task.id
    return f"fleetrun logs {shlex.quote(ref)}"


def _last_failure(verdicts: list[VerdictRow]) -> Optional[VerdictRow]:
    failed = [v for v in verdicts if not v.passed]
    return max(failed, key=lambda v: v.time) if failed else None


def failed_setup_step(led: Ledger, task: Task) -> Optional[tuple[int, dict[str, Any]]]:
    """The task's last failed setup command, as its attempt recorded it (``n``,
    ``command``, ``reason``, ``output``), with the attempt's number; or None."""
    for att in reversed(led.attempts(task.id)):
        steps = (att.info or {}).get("setup_steps") or []
        failed = [s for s in steps if isinstance(s, dict) and not s.get("passed")]
        if failed:
            return att.number, failed[-1]
    return None


def _setup_failure(led: Ledger, task: Task) -> list[str]:
    """``    setup 1 `CMD` (attempt 1): exit code 2 | SUMMARY``, as a failed verifier's line."""
    found = failed_setup_step(led, task)
    if found is None:
        return []
    num, step = found
    line = (
        f"    setup {safe_text(step.get('n'))} `{safe_text(step.get('command'), limit=60)}` (attempt {num}): "
        f"{safe_text(step.get('reason'))}"
    )
    said = summary_line(str(step.get("output") or ""))
    return [line + (f" | {safe_text(said)}" if said else "")]


def short_summary(led: Ledger, task_ids: list[str]) -> list[tuple[str, str]]:
    """The ``short task summary info`` section, or nothing when no task of the run
    needs a human or was cancelled.

    :param led: the run's ledger.
    :param task_ids: the run's tasks, in the order they were queued.
    :return: ``(line, state)`` pairs; the state colours the line (``""``: none).
    """
    out: list[tuple[str, str]] = []
    for task in led.listed_by_id(task_ids):  # narrow rows: a run of 100,000 parses no spec of each
        if task.state not in (State.NEEDS_HUMAN, State.CANCELLED):
            continue
        out.append((f"{task.state.value} {safe_name(task.name)}: {safe_text(task.reason)}", task.state.value))
        failed = _last_failure(led.verdicts(task.id))
        if failed is not None:
            num = next((a.number for a in led.attempts(task.id) if a.id == failed.attempt_id), "?")
            line = (
                f"    verify {safe_text(failed.kind)} `{safe_text(failed.label)}` (attempt {num}): "
                f"{safe_text(failed.reason)}"
            )
            said = summary_line(failed.output)
            if said:
                line += f" | {safe_text(said)}"
            out.append((line, ""))
        elif task.reason.startswith("setup_failed:"):
            out.extend((line, "") for line in _setup_failure(led, task))
        where = f"branch {safe_text(task.branch)}; " if task.branch else ""
        out.append((f"    {where}look: {_look(led, task)}", ""))
    if out:
        out.insert(0, ("=== short task summary info ===", ""))
    return out


def where_work_is(led: Ledger, task_ids: list[str]) -> list[str]:
    """The ``where the work is`` section: when any task of the run ran on a peer, each
    task of the run that ran, with where it ran and where its branch is
    (:func:`~fleetrun.whereis.where_text`); nothing when every one ran here."""
    tasks = [t for t in led.listed_by_id(task_ids) if t.host]  # narrow rows, as short_summary reads them
    if not any(ran_on_peer(t) for t in tasks):
        return []
    return ["=== where the work is ===", *(f"{safe_name(t.name)}: {where_text(t)}" for t in tasks)]


@dataclass(frozen=True)
class Duration:
    """One row of ``--durations``: a task or one of its verifiers."""

    seconds: float
    what: str  # "task" or "verify"
    text: str


def _fmt(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.2f}s"
    s = int(round(seconds))
    return f"{s // 60}m{s % 60:02d}s" if s < 3600 else f"{s // 3600}h{(s % 3600) // 60:02d}m"


def run_durations(led: Ledger, task_ids: list[str], started: float, now: float) -> list[Duration]:
    """Every task of the run that was worked on in it, and every verifier that ran in
    it, slowest first (see the module's docstring for what counts)."""
    rows: list[Duration] = []
    for task_id in task_ids:
        task = led.get(task_id)
        if task is None:
            continue
        attempts = [a for a in led.attempts(task_id) if a.ended is None or a.ended >= started]
        if not attempts:
            continue  # nothing of it ran in this run (done in an earlier one)
        begin = max(started, min(a.created for a in attempts))
        moves = [r.time for r in led.transitions(task_id) if r.time >= started]
        end = max(moves) if task.state.terminal and moves else now
        name = safe_name(task.name)
        rows.append(Duration(max(0.0, end - begin), "task", name))
        numbers = {a.id: a.number for a in attempts}
        for v in led.verdicts(task_id):
            if v.time >= started and v.attempt_id in numbers:
                rows.append(
                    Duration(v.duration_s, "verify", f"{name} `{safe_text(v.label)}` (attempt {numbers[v.attempt_id]})")
                )
    rows.sort(key=lambda d: d.seconds, reverse=True)
    return rows


#: As pytest's ``--durations-min`` default: shorter rows are hidden unless ``-vv``.
DURATIONS_MIN_S = 0.005


def durations(
    led: Ledger, task_ids: list[str], started: float, n: int, verbosity: int = 0, now: Optional[float] = None
) -> list[str]:
    """The ``--durations N`` section, as pytest's: the N slowest, all of them for 0; rows
    under :data:`DURATIONS_MIN_S` only with ``-vv``.

    :param started: when the run started (:attr:`fleetrun.session.Session.started`).
    """
    rows = run_durations(led, task_ids, started, time.time() if now is None else now)
    if n > 0:
        rows = rows[:n]
    hidden = 0
    if verbosity < 2:
        hidden = sum(1 for d in rows if d.seconds < DURATIONS_MIN_S)
        rows = [d for d in rows if d.seconds >= DURATIONS_MIN_S]
    head = f"=== slowest {n} durations ===" if n > 0 else "=== slowest durations ==="
    lines = [head, *(f"{_fmt(d.seconds):>8}  {d.what:<6}  {d.text}" for d in rows)]
    if hidden:
        lines.append(f"({hidden} duration{'s' if hidden != 1 else ''} < {DURATIONS_MIN_S}s hidden; -vv shows them)")
    return lines

"""What the ``notify`` plugin sends, as plain data: the events it keeps, the batch that
turns a cascade of them into one message, and each message's title and body.

Pure: no apprise, no clock, no I/O; the times are given (tested without a server).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional, Union

from ...textutil import safe_name, safe_text

#: The events ``[notify] events`` may choose, in the order the docs give them.
EVENTS = ("needs_human", "run_end", "paused")
#: Seconds a batch is held from its first event: one message per window at most.
DEFAULT_MIN_INTERVAL = 60.0
#: Tasks listed one by one in a message; the rest are counted (``fleetrun status``
#: lists them all), so a cascade of hundreds stays one readable message.
MAX_LISTED = 20
#: A cause quotes a verifier's output (the agent's work): cut, as the terminal cuts it.
MAX_CAUSE = 300

#: What an exit status means, as the run's end says it (pytest's meanings).
EXIT_WORDS = {
    0: "every task done",
    1: "some tasks need a human or were cancelled",
    2: "interrupted",
    3: "internal error",
    4: "usage error",
    5: "no tasks collected",
}


@dataclass(frozen=True)
class NeedsHuman:
    """A task went NEEDS_HUMAN.

    :ivar attempt: the number of the attempt it was about, or None.
    """

    task_id: str
    name: str
    cause: str
    attempt: Optional[int]


@dataclass(frozen=True)
class Paused:
    """A host was paused by a usage limit until ``until`` (seconds since the epoch)."""

    host: str
    until: float
    reason: str


Item = Union[NeedsHuman, Paused]


@dataclass(frozen=True)
class Message:
    """One notification.

    :ivar kind: apprise's notify type by name: ``info``, ``success``, ``warning``,
        ``failure`` (a service shows it as a colour or an icon).
    """

    title: str
    body: str
    kind: str


class Batch:
    """The events held for the next message. The window opens with the first event
    held and closes ``min_interval`` seconds later: everything that came meanwhile is one
    message, and two messages are never closer than the window."""

    def __init__(self, min_interval: float) -> None:
        self.min_interval = min_interval
        self.items: list[Item] = []
        self.due_at: Optional[float] = None

    def add(self, item: Item, now: float) -> None:
        if isinstance(item, Paused):  # paused again (several attempts hit one limit): the latest
            self.items = [i for i in self.items if not (isinstance(i, Paused) and i.host == item.host)]
        if self.due_at is None:
            self.due_at = now + self.min_interval
        self.items.append(item)

    def wait(self, now: float) -> Optional[float]:
        """Seconds until the batch is due; None when nothing is held."""
        return None if self.due_at is None else max(0.0, self.due_at - now)

    def take(self, now: float, force: bool = False) -> list[Item]:
        """The batch, when it is due (or ``force``: the run ends); else nothing."""
        if self.due_at is None or (not force and now < self.due_at):
            return []
        items, self.items, self.due_at = self.items, [], None
        return items


def _cause(cause: str) -> str:
    return safe_text(" ".join(cause.split()), limit=MAX_CAUSE)


def until_text(until: float) -> str:
    """``14:05 (2026-12-01, CET)``: the hour as the terminal's pause reason says it, then
    the day, for a message read later."""
    t = time.localtime(until)
    return f"{time.strftime('%H:%M', t)} ({time.strftime('%Y-%m-%d', t)}, {time.strftime('%Z', t)})"


def batch_message(items: list[Item], machine: str, home_opt: str) -> Message:
    """The message of a batch: each task that needs a human (its name, id, cause, attempt
    and the command to look) and each host paused (until when, why).

    :param machine: this machine's name, for the title (several machines may post to one
        channel).
    :param home_opt: `` --home PATH`` when the commands need it, else ``""``.
    """
    humans = [i for i in items if isinstance(i, NeedsHuman)]
    pauses = [i for i in items if isinstance(i, Paused)]
    parts = []
    if len(humans) == 1:
        parts.append(f"{safe_name(humans[0].name)} needs a human")
    elif humans:
        parts.append(f"{len(humans)} tasks need a human")
    if len(pauses) == 1:
        parts.append(
            f"{safe_name(pauses[0].host)} paused until {time.strftime('%H:%M', time.localtime(pauses[0].until))}"
        )
    elif pauses:
        parts.append(f"{len(pauses)} hosts paused")
    lines = []
    for h in humans[:MAX_LISTED]:
        after = f" after attempt {h.attempt}" if h.attempt else ""
        lines.append(f"- {safe_name(h.name)} ({safe_text(h.task_id)}) needs a human{after}: {_cause(h.cause)}")
        lines.append(f"  look: fleetrun logs {safe_text(h.task_id)}{home_opt}")
    if len(humans) > MAX_LISTED:
        lines.append(f"- and {len(humans) - MAX_LISTED} more")
    for p in pauses:
        lines.append(
            f"- {safe_name(p.host)} is paused until {until_text(p.until)}; nothing starts there "
            f"before then: {_cause(p.reason)}"
        )
    lines.append(f"Every task: fleetrun status{home_opt}")
    return Message(f"fleetrun on {machine}: {', '.join(parts)}", "\n".join(lines), "warning")


def duration_text(s: float) -> str:
    s = int(round(s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def run_end_message(
    counts: dict[str, int],
    exitstatus: int,
    duration_s: float,
    cost_usd: float,
    cost_unknown: bool,
    files: list[str],
    machine: str,
    home_opt: str,
) -> Message:
    """The message of a run's end: the summary line's counts, the exit status and what it
    means, the duration and the cost, the tasks files.

    :param counts: tasks by state name, as the session counts them.
    :param cost_unknown: a session never reported its cost (the cost is a floor).
    """
    summary = ", ".join(f"{n} {state.lower()}" for state, n in counts.items() if n) or "no tasks"
    lines = [
        f"Exit status: {exitstatus} ({EXIT_WORDS.get(exitstatus, 'unknown')})",
        f"Duration: {duration_text(duration_s)}",
        f"Cost: ${cost_usd:.2f}" + ("+ (a session did not report its cost)" if cost_unknown else ""),
    ]
    if files:
        lines.append(f"Tasks file{'s' if len(files) > 1 else ''}: {', '.join(safe_text(f) for f in files)}")
    lines.append(f"Every task: fleetrun status{home_opt}")
    kind = {0: "success", 1: "warning", 2: "warning", 5: "warning"}.get(exitstatus, "failure")
    return Message(f"fleetrun on {machine}: run ended: {safe_text(summary)}", "\n".join(lines), kind)

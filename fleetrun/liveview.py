"""The live view: one row per running or verifying task and a counter, redrawn in
place below the lines a run prints (``fleetrun FILE`` and ``fleetrun work`` on a
terminal, ``fleetrun status --watch`` anywhere).

Everything it shows comes from the ledger and the attempts' logs, so a loop running
in another process is watched exactly as the one in this process. Plain ANSI, no
library: the region is a few lines cut to the terminal's width, cleared and redrawn
in one write (no flicker); a line printed meanwhile goes above it (:class:`Region`).
The terminal plugin registers a :class:`LiveView`; the loop gives it a turn in each
of its waits (:data:`fleetrun.waiting.TICKERS_KEY`), never from another thread.
"""

from __future__ import annotations

import os
import shutil
import time
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, TextIO

from .hookimpl import hookimpl
from .ledger import Ledger, Task
from .states import State
from .taskview import TASKVIEW_KEY
from .textutil import ago, safe_name, safe_text
from .transcript import Activity
from .waiting import TICKERS_KEY

if TYPE_CHECKING:
    from .config import Config

MIN_INTERVAL_S = 0.25  # at most 4 redraws a second
REREAD_S = 1.0  # the ledger is read again after this long even with no transition seen

SHOWN = (State.ASSIGNED, State.RUNNING, State.VERIFYING)
_WAITING = (State.PENDING, State.READY, State.RETRYING, State.RESUMING)
_COLORS = {"RUNNING": "\x1b[36m", "VERIFYING": "\x1b[34m", "ASSIGNED": "\x1b[2m"}
_RESET = "\x1b[0m"


def color_wanted(config: Config, out: TextIO) -> bool:
    """``--color=yes|no|auto`` as pytest's: auto (the default) is colour on a terminal
    unless ``NO_COLOR`` is set."""
    choice = getattr(config.option, "color", None) or "auto"
    if choice == "yes":
        return True
    if choice == "no":
        return False
    return isatty(out) and not os.environ.get("NO_COLOR")


def isatty(out: Any) -> bool:
    try:
        return bool(out.isatty())
    except (AttributeError, ValueError):
        return False


def cells(text: str) -> int:
    """How many terminal cells ``text`` takes (wide East Asian characters take two,
    combining marks none)."""
    return sum(0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def fit(text: str, width: int) -> str:
    """``text`` cut to ``width`` cells, ending with ``…`` when cut."""
    if cells(text) <= width:
        return text
    out, used = [], 0
    for c in text:
        w = cells(c)
        if used + w > width - 1:
            break
        out.append(c)
        used += w
    return "".join(out) + "…"


def counter(tasks: list[Task]) -> str:
    """``[3/10 done, 1 needs_human, 2 running, 4 waiting]``."""
    n = {s: 0 for s in State}
    for t in tasks:
        n[t.state] += 1
    parts = [f"{n[State.DONE]}/{len(tasks)} done"]
    for state in (State.NEEDS_HUMAN, State.CANCELLED):
        if n[state]:
            parts.append(f"{n[state]} {state.value.lower()}")
    parts.append(f"{sum(n[s] for s in SHOWN)} running")
    parts.append(f"{sum(n[s] for s in _WAITING)} waiting")
    return "[" + ", ".join(parts) + "]"


@dataclass
class Row:
    """One running or verifying task, as shown."""

    name: str
    state: str
    where: str
    attempt: str
    elapsed: str
    cost: str
    doing: str


class Watcher:
    """Reads rows from a ledger and the attempts' logs. Each attempt's log is read on
    from where the last look stopped (:class:`~fleetrun.transcript.Activity`)."""

    def __init__(self, led: Ledger) -> None:
        self.led = led
        self.activity: dict[str, Activity] = {}

    def rows(self, tasks: list[Task], now: Optional[float] = None) -> list[Row]:
        now = time.time() if now is None else now
        rows = []
        live: set[str] = set()
        for t in tasks:
            if t.state not in SHOWN:
                continue
            atts = self.led.attempts(t.id)
            att = max(atts, key=lambda a: a.number) if atts else None
            cost = t.cost_usd
            doing = ""
            started = t.updated
            if att is not None:
                started = att.started or att.created
                act = self._activity(att.id, att.dir, att.host, t.worktree)
                if act is not None:
                    live.add(att.id)
                    act.poll()
                    if t.state is State.RUNNING:
                        doing = act.doing
                        cost += act.cost_usd or 0.0
            if t.state is State.VERIFYING and att is not None:
                doing = self._verifying(t, att.id, now)
            elif t.state is State.ASSIGNED:
                doing = "starting"
            rows.append(
                Row(
                    safe_name(t.name),
                    t.state.value,
                    safe_text(t.host or "-", limit=30),
                    str(att.number if att else t.attempts),
                    ago(started, now),
                    f"${cost:.2f}" if cost else "-",
                    doing,
                )
            )
        for gone in set(self.activity) - live:  # ended attempts: their readers go
            del self.activity[gone]
        return rows

    def _activity(
        self, attempt_id: str, folder: Optional[str], host: Optional[str], cwd: Optional[str]
    ) -> Optional[Activity]:
        if not folder or host not in (None, "local"):  # a peer's log is on the peer
            return None
        act = self.activity.get(attempt_id)
        if act is None:
            act = self.activity[attempt_id] = Activity(Path(folder) / "log", cwd)
        elif act.cwd is None and cwd:
            # first seen ASSIGNED, its worktree not recorded yet (it is made off the loop's
            # thread): paths inside it are shown relative to it from now on
            act.cwd = cwd
        return act

    def _verifying(self, t: Task, attempt_id: str, now: float) -> str:
        verdicts = self.led.verdicts(t.id, attempt_id)
        idx = len(verdicts)
        if idx >= len(t.spec.verify):
            return "finishing"
        spec = t.spec.verify[idx]
        since = max([t.updated] + [v.time for v in verdicts])
        return (
            f"verify {idx + 1}/{len(t.spec.verify)} {safe_text(spec.kind, limit=20)} "
            f"{safe_text(spec.label)} ({ago(since, now)})"
        )


def render(rows: list[Row], head: str, width: int, color: bool) -> list[str]:
    """The region's lines, none wider than ``width - 1`` cells (a line as wide as the
    terminal would wrap on some, and the region would no longer be where it is
    thought to be): the counter, then a row per task, what it does cut first."""
    width = max(width - 1, 10)
    lines = [fit(head, width)]
    if not rows:
        return lines
    name_w = min(max(cells(r.name) for r in rows), 30)
    state_w = max(len(r.state) for r in rows)
    where_w = min(max(cells(r.where) for r in rows), 16)
    att_w = max(len(r.attempt) for r in rows)
    el_w = max(len(r.elapsed) for r in rows)
    cost_w = max(len(r.cost) for r in rows)
    for r in rows:
        fixed = (
            f"  {fit(r.name, name_w):<{name_w}}  {r.state:<{state_w}}  {fit(r.where, where_w):<{where_w}}"
            f"  #{r.attempt:<{att_w}}  {r.elapsed:>{el_w}}  {r.cost:>{cost_w}}"
        )
        line = fit(f"{fixed}  {r.doing}".rstrip(), width)
        if color and r.state in _COLORS:
            line = f"{_COLORS[r.state]}{line}{_RESET}"
        lines.append(line)
    return lines


class Region:
    """Lines kept at the bottom of a terminal and redrawn in place.

    The cursor is left at the end of the region's last line; clearing goes back to
    the start of its first line and erases to the end of the screen. Clear, text and
    redraw go out in one write, so the terminal never shows the region half drawn.
    """

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.lines: list[str] = []  # what is on the screen
        self.staged: Optional[list[str]] = None  # what the next write draws instead
        self.closed = False

    def _clear(self) -> str:
        if not self.lines:
            return ""
        up = len(self.lines) - 1
        return "\r" + (f"\x1b[{up}A" if up else "") + "\x1b[J"

    def _draw(self) -> str:
        return "\n".join(self.lines)

    def _send(self, data: str) -> None:
        try:
            self.out.write(data)
            self.out.flush()
        except (BrokenPipeError, ValueError, OSError):
            self.closed = True

    def show(self, lines: list[str]) -> None:
        """Redraw the region as ``lines``, when they differ from what is shown."""
        self.staged = None
        if self.closed or lines == self.lines:
            return
        clear = self._clear() if self.lines else "\x1b[?25l"  # the cursor hides while it lasts
        self.lines = list(lines)
        self._send(clear + self._draw())

    def stage(self, lines: list[str]) -> None:
        """Draw ``lines`` with the next line printed above (a transition's line then
        comes with the rows as they are after it, not as they were), not before."""
        self.staged = list(lines)

    def above(self, text: str) -> None:
        """Print ``text`` (whole lines) above the region."""
        if self.closed:
            self._send(text)
            return
        clear = self._clear()
        if self.staged is not None:
            self.lines, self.staged = self.staged, None
        self._send(clear + text + self._draw())

    def close(self) -> None:
        """Erase the region and give the cursor back: nothing of it stays on screen."""
        if self.closed:
            return
        self._send(self._clear() + "\x1b[?25h")
        self.lines = []
        self.closed = True


class _Above:
    """A text stream whose whole lines go above the region (what the terminal plugin
    and the loop print while the live view is up); the rest is kept until its newline."""

    def __init__(self, region: Region, real: TextIO) -> None:
        self.region = region
        self.real = real
        self.buf = ""

    def write(self, s: str) -> int:
        self.buf += s
        if "\n" in self.buf:
            head, _, self.buf = self.buf.rpartition("\n")
            self.region.above(head + "\n")
        return len(s)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return isatty(self.real)

    def fileno(self) -> int:
        return int(self.real.fileno())

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


class LiveView:
    """The live region of a run on a terminal: registered by the terminal plugin as
    ``liveview``; from then on what is written to ``config.out`` (and ``config.err``
    when it is the same terminal) goes above the region."""

    def __init__(self, config: Config, out: TextIO) -> None:
        self.config = config
        self.real_out, self.real_err = out, config.err
        self.region = Region(out)
        self.color = color_wanted(config, out)
        config.out = _Above(self.region, out)
        if isatty(config.err):
            config.err = _Above(self.region, config.err)
        self.watcher: Optional[Watcher] = None
        self.ids: set[str] = set()  # `work`: what was live at its start
        self.queues: set[str] = set()  # the queues whose tasks moved
        self.dirty = True
        self.last_draw = 0.0
        self.last_read = 0.0
        self.tasks: list[Task] = []
        config.stash.setdefault(TICKERS_KEY, []).append(self)

    @hookimpl
    def fleetrun_sessionstart(self, session: Any) -> None:
        led = getattr(session, "ledger", None)
        if led is None:
            return
        self.watcher = Watcher(led)
        if not session.items:
            self.ids = {t.id for t in led.tasks() if not t.state.terminal}

    @hookimpl
    def fleetrun_transition(
        self, task: Any, from_state: str, to_state: str, cause: str, attempt: Any, config: Config
    ) -> None:
        self.queues.add(task.queue_id)
        self.dirty = True
        if self.watcher is None or self.region.closed:
            return
        # the terminal plugin prints this transition's line next (it runs trylast): the
        # rows it redraws under it are those after the change, without a write of their own
        self.tasks = [task if t.id == task.id else t for t in self.tasks]
        if all(t.id != task.id for t in self.tasks):
            self.tasks.append(task)
        width = shutil.get_terminal_size((80, 24)).columns
        self.region.stage(render(self.watcher.rows(self.tasks), counter(self.tasks), width, self.color))

    @hookimpl
    def fleetrun_verdict(self, task: Any, verdict: Any, attempt: Any, config: Config) -> None:
        self.dirty = True

    def tick(self) -> float:
        """The loop's turn: redraw when something changed, at most 4 times a second.
        :return: how soon the next turn is wanted, in seconds."""
        if self.watcher is None or self.region.closed:
            return 1.0
        now = time.monotonic()
        if now - self.last_draw < MIN_INTERVAL_S:
            return MIN_INTERVAL_S - (now - self.last_draw)
        if self.dirty or now - self.last_read >= REREAD_S:
            view = self.config.stash.get(TASKVIEW_KEY)  # the loop's tasks in memory: no query
            if view is not None:
                view.refresh()
            every = view.tasks() if view is not None else self.watcher.led.tasks()
            self.tasks = [t for t in every if t.queue_id in self.queues or t.id in self.ids]
            self.last_read = now
            self.dirty = False
        rows = self.watcher.rows(self.tasks)
        width = shutil.get_terminal_size((80, 24)).columns
        self.region.show(render(rows, counter(self.tasks), width, self.color))
        self.last_draw = now
        return MIN_INTERVAL_S if self.dirty else REREAD_S

    def stop(self) -> None:
        """Erase the region and write straight to the terminal again."""
        self.region.close()
        if isinstance(self.config.out, _Above):
            self.config.out = self.real_out
        if isinstance(self.config.err, _Above):
            self.config.err = self.real_err
        tickers = self.config.stash.get(TICKERS_KEY, [])
        if self in tickers:
            tickers.remove(self)

    @hookimpl(tryfirst=True)
    def fleetrun_sessionfinish(self, session: Any, exitstatus: int) -> None:
        self.stop()  # before the summary: it is all that stays on screen


def live_wanted(config: Config, out: TextIO) -> bool:
    """A live view for a run: on a terminal, not with ``-q``, not on a ``dumb`` one."""
    return isatty(out) and config.verbosity >= 0 and os.environ.get("TERM") != "dumb"

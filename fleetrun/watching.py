"""Watching a loop that runs elsewhere: ``fleetrun status --watch`` (the live view of
a run, for another shell) and ``fleetrun logs -f TASK`` (a task's transitions,
verdicts and agent transcript as they happen, for people; ``--raw``: the log's lines).

Both only read: the ledger and the attempts' logs, once a second (``logs -f`` twice),
so they work beside any loop on this home and stop with Ctrl-C (exit 0).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional, TextIO

from .exceptions import ExitCode
from .ledger import Attempt, Ledger, Task
from .liveview import Region, Watcher, color_wanted, counter, isatty, render
from .records import TransitionRow, VerdictRow
from .textutil import safe_name, safe_text
from .transcript import Activity, LogTail

if TYPE_CHECKING:
    from .config import Config

WATCH_S = 1.0
FOLLOW_S = 0.5


def transition_line(row: TransitionRow, name: str) -> str:
    """A transition as a run prints it: ``12:00:03 api RUNNING (attempt 1) on mini  started``."""
    stamp = time.strftime("%H:%M:%S", time.localtime(row.time))
    att = f" (attempt {row.attempt})" if row.attempt else ""
    where = f" on {row.host}" if row.to_state in ("ASSIGNED", "RUNNING") and row.host else ""
    return f"{stamp} {safe_name(name)} {row.to_state}{att}{safe_text(where)}  {safe_text(row.cause)}"


def verdict_line(v: VerdictRow, number: object) -> str:
    head = (
        f"{'PASS' if v.passed else 'FAIL'} verifier {v.idx + 1} ({safe_text(v.kind)}: {safe_text(v.label)}) "
        f"attempt {number}"
    )
    if v.reason:
        head += f": {safe_text(v.reason)}"
    if v.cost_usd:
        head += f" (${v.cost_usd:.2f})"
    if not v.passed:  # a failure's last lines say why; a pass's output is noise here
        head += "".join(f"\n    | {safe_text(ln)}" for ln in v.output.rstrip().splitlines()[-10:])
    return head


def _sleep_or_stop(seconds: float, sleep: Callable[[float], None]) -> bool:
    """Sleep; :return: False when Ctrl-C came."""
    try:
        sleep(seconds)
    except KeyboardInterrupt:
        return False
    return True


def watch_status(config: Config, led: Ledger, out: TextIO, sleep: Callable[[float], None] = time.sleep) -> int:
    """``fleetrun status --watch``: on a terminal the counter and a row per running or
    verifying task, redrawn in place, with each transition printed above as a run
    prints it; elsewhere the transitions and the counter when it changes. Ctrl-C
    ends it (exit 0)."""
    tty = isatty(out)
    region = Region(out) if tty else None
    watcher = Watcher(led)
    color = color_wanted(config, out)
    seen = led.last_transition_id()
    queues: set[str] = set()
    names: dict[str, str] = {}
    last_head = ""
    try:
        while True:
            queues.update(q for q, _files, _settings in led.live_queues())
            tasks = [t for t in led.tasks() if t.queue_id in queues]
            names.update((t.id, t.name) for t in tasks)
            rows = led.transitions_after(seen)
            if rows:
                seen = rows[-1].id
            lines = [transition_line(r, names.get(r.task_id, r.task_id)) + "\n" for r in rows if r.task_id in names]
            head = counter(tasks) if tasks else "[no queued work]"
            if region is not None:
                if lines:
                    region.above("".join(lines))
                width = shutil.get_terminal_size((80, 24)).columns
                region.show(render(watcher.rows(tasks), head, width, color))
            else:
                if head != last_head:
                    lines.append(head + "\n")
                out.write("".join(lines))
                out.flush()
            last_head = head
            if not _sleep_or_stop(WATCH_S, sleep):
                break
    except KeyboardInterrupt:
        pass
    finally:
        if region is not None:
            region.close()
    return ExitCode.OK


class _Follow:
    """What ``logs -f`` has shown of one task so far."""

    def __init__(
        self,
        led: Ledger,
        task: Task,
        raw: bool,
        here: Callable[[Optional[str]], bool] = lambda host: host in (None, "local"),
    ) -> None:
        self.led = led
        self.task = task
        self.raw = raw
        self.here = here  # whether a host's attempt folders are on this machine
        self.transitions = 0
        self.verdicts = 0
        self.attempts: dict[str, tuple[Attempt, Optional[Activity], Optional[LogTail]]] = {}

    def step(self) -> list[str]:
        """:return: the lines of what happened since the last step, in the order it
        happened (a transcript line counts as read now, or when its attempt ended)."""
        led, task_id = self.led, self.task.id
        now = time.time()
        events: list[tuple[float, int, str]] = []
        task = led.get(task_id) or self.task
        if not self.raw:
            rows = led.transitions(task_id)
            events += [(r.time, 1, transition_line(r, self.task.name)) for r in rows[self.transitions :]]
            self.transitions = len(rows)
        atts = led.attempts(task_id)
        by_id = {a.id: a for a in atts}
        for a in sorted(atts, key=lambda a: a.number):
            if a.id not in self.attempts:
                here = self.here(a.host)
                if here and not a.dir:
                    continue  # leased, its folder not recorded yet: read it once it is
                log = Path(a.dir) / "log" if a.dir and here else None
                if not self.raw:
                    where = f" on {safe_text(a.host)}" if a.host else ""
                    events.append(
                        (
                            a.started or a.created,
                            2,
                            f"--- attempt {a.number} ({safe_text(a.kind)}){where}"
                            + (f": {safe_text(log)}" if log else " (its log is on the peer)"),
                        )
                    )
                act = Activity(log, task.worktree) if log and not self.raw else None
                tail = LogTail(log) if log and self.raw else None
                self.attempts[a.id] = (a, act, tail)
            _, act, tail = self.attempts[a.id]
            when = min(now, a.ended) if a.ended else now
            lines = act.poll() if act is not None else []
            lines += [safe_text(ln.rstrip("\r")) for ln in tail.read()] if tail is not None else []
            events += [(when, 0, ln) for ln in lines]
        if not self.raw:
            verdicts = led.verdicts(task_id)
            for v in verdicts[self.verdicts :]:
                att = by_id.get(v.attempt_id)
                events.append((v.time, 0, verdict_line(v, att.number if att else "?")))
            self.verdicts = len(verdicts)
        return [text for _t, _o, text in sorted(events, key=lambda e: (e[0], e[1]))]


def follow_logs(
    config: Config, led: Ledger, task: Task, out: TextIO, sleep: Callable[[float], None] = time.sleep
) -> int:
    """``fleetrun logs -f TASK``: what happened so far, then what happens, until the
    task ends (DONE, NEEDS_HUMAN, CANCELLED) or Ctrl-C (exit 0 both)."""
    from .hostapi import workspace_here

    # a host whose attempt folders are here (a cluster on a shared filesystem) is read
    # as this machine is; the plugins are asked only for a host that is not `local`
    follow = _Follow(
        led, task, bool(getattr(config.option, "raw", False)), here=lambda host: workspace_here(config, host)
    )
    try:
        while True:
            now = led.get(task.id)
            lines = follow.step()
            if lines:
                out.write("".join(ln + "\n" for ln in lines))
                out.flush()
            if now is None or now.state.terminal:
                if not follow.raw and now is not None:
                    cost = f", ${now.cost_usd:.2f}" if now.cost_usd else ""
                    out.write(f"{safe_name(now.name)} is {now.state.value}{cost}\n")
                break
            if not _sleep_or_stop(FOLLOW_S, sleep):
                break
    except KeyboardInterrupt:
        pass
    return ExitCode.OK

"""What the loop waits for: tasks that cannot be placed yet and why, the reminders of
long waits, machines paused by a usage limit, backoffs, the ``select`` between passes,
and when a run has nothing left to wait for.
"""

from __future__ import annotations

import heapq
import json
import select
import time
from functools import partial
from typing import TYPE_CHECKING, Any, Optional, Protocol

from . import clock, effects
from .decide import PAUSE_MEMORY_S, pause_text
from .ledger import Task
from .placement import Backoff
from .reports import Candidate, HasDeadline, Selectable, Wait
from .stash import StashKey
from .states import ACTIVE, PLACEABLE, State
from .textutil import safe_name, safe_text

if TYPE_CHECKING:
    from .loop import Loop

#: Tasks backed off after failing to start: task id -> host -> until when (placement
#: skips that host meanwhile); kept for the run only.
BACKOFF_KEY = StashKey[dict[str, dict[str, Backoff]]]()
#: Machines paused by a usage limit: host -> (until, limits in a row), also kept in the
#: ledger so that a restarted loop waits for the same reset.
USAGE_PAUSE_KEY = StashKey[dict[str, tuple[float, int]]]()


class Ticker(Protocol):
    """What wants a turn in each of the loop's waits, on the loop's thread (the
    terminal's live view redraws from there, never from a thread of its own)."""

    def tick(self) -> float:
        """Do what is due now. :return: seconds until the next turn is wanted."""


#: The run's tickers, given a turn before each sleep of the loop (in registration order).
TICKERS_KEY = StashKey[list[Ticker]]()

REMIND_S = 5 * 60.0  # a task that waits this long is mentioned again, and again after as long


def interrupted_note(running: int, verifiers: int, setups: int = 0) -> str:
    """What Ctrl-C interrupted and what becomes of it: an agent runs on under its
    shepherd and is adopted; a verifier is ended with the loop and, its verdict not
    recorded, runs again from the start (docs/durability.md)."""
    parts = []
    if running:
        parts.append(
            f"{running} running attempt{' goes' if running == 1 else 's go'} on and will be "
            "adopted by the next `fleetrun work`"
        )
    if verifiers:
        parts.append(
            f"{verifiers} verifier{' was' if verifiers == 1 else 's were'} stopped and will "
            f"run again {'then' if running else 'on the next `fleetrun work`'}"
        )
    if setups:
        parts.append(f"{setups} setup{' was' if setups == 1 else 's were'} stopped and will run again from the start")
    return "interrupted: " + ("; ".join(parts) if parts else "nothing was running")


class Waits:
    """The loop's waits. ``loop`` gives the config, the ledger, the hooks and the stages
    whose handles the loop sleeps on."""

    def __init__(self, loop: Loop) -> None:
        self.loop = loop
        self.config = loop.config
        self.waits: dict[str, str] = {}  # task -> why it waits (what `fleetrun status` shows)
        self.wait_until: dict[str, float] = {}  # task or "pause:HOST" -> when to look again
        self.wait_operator: dict[str, str] = {}  # task -> what only a person can change for it
        self.wait_since: dict[str, float] = {}  # when a task began to wait (fake-clock time)
        self.remind_after: dict[str, float] = {}  # its next reminder, in seconds of waiting
        # (when, key) of every wake-up and reminder, soonest first: what is due is found
        # without a scan of the waiting tasks (an entry whose time was since changed is
        # stale and skipped)
        self._heap: list[tuple[float, str]] = []
        self._remind_at: dict[str, float] = {}  # task -> when its next reminder is due
        self.dirty = False

    # -- tasks that wait ---------------------------------------------------------------

    def until(self, key: str, when: float) -> None:
        """Look at ``key`` (a task id, or ``pause:HOST``) again at ``when``."""
        self.wait_until[key] = when
        heapq.heappush(self._heap, (when, key))

    def due(self, at: float) -> set[str]:
        """Forget the wake-ups that are past. :return: the tasks whose wake-up or
        reminder came (they are placed again though nothing else changed for them)."""
        out: set[str] = set()
        heap = self._heap
        while heap and heap[0][0] <= at:
            when, key = heapq.heappop(heap)
            if self.wait_until.get(key) == when:
                del self.wait_until[key]
                out.add(key)
            if self._remind_at.get(key) == when:
                del self._remind_at[key]
                out.add(key)
        return out

    def next_due(self, now: float) -> float:
        """Seconds until the next wake-up or reminder (a large number when none)."""
        heap = self._heap
        while heap and self.wait_until.get(heap[0][1]) != heap[0][0] and self._remind_at.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)  # stale
        return heap[0][0] - now if heap else 3600.0

    def prune(self, at: float, gone: set[str]) -> None:
        """Forget the wake-ups that are past and the waits of ``gone``: tasks that
        changed and are no longer placeable."""
        self.due(at)
        for task_id in gone:
            if task_id in self.wait_since or task_id in self.waits:
                self.forget(task_id)

    def still_ending(self, task: Task, number: int, at: float) -> None:
        """The task's previous attempt is still ending (a cancel's grace period)."""
        reason = f"attempt {number} is still ending"
        if self.waits.get(task.id) != reason:
            self.waits[task.id] = reason
            self.loop.report(
                task.id, partial(self.loop.hook.fleetrun_task_waiting, task=task, reason=reason, config=self.config)
            )
        self.wait_operator.pop(task.id, None)
        self.until(task.id, at + 1.0)

    def wait(self, task: Task, decision: Wait, at: float) -> None:
        """``fleetrun_place`` said the task waits: show why when that changes, and remind."""
        if self.waits.get(task.id) != decision.reason:
            self.waits[task.id] = decision.reason
            self.loop.report(
                task.id,
                partial(self.loop.hook.fleetrun_task_waiting, task=task, reason=decision.reason, config=self.config),
            )
            self.dirty = True
        if decision.operator:
            self.wait_operator[task.id] = decision.operator
        else:
            self.wait_operator.pop(task.id, None)
        if decision.until:
            self.until(task.id, decision.until)
        self.remind(task, decision.reason, at)

    def placed(self, task_id: str) -> None:
        if self.waits.pop(task_id, None) is not None:
            self.dirty = True
        self.forget(task_id)
        self.wait_until.pop(task_id, None)

    def remind(self, task: Task, reason: str, now: float) -> None:
        """Say again, every :data:`REMIND_S` of waiting, that a task still waits and why
        (its reason is shown when it changes; a wait of hours would be silent)."""
        since = self.wait_since.setdefault(task.id, now)
        waited = now - since
        if waited >= self.remind_after.get(task.id, REMIND_S):
            self.remind_after[task.id] = (waited // REMIND_S + 1) * REMIND_S
            self._say_still_waiting(task, reason, waited)
        at = since + self.remind_after.get(task.id, REMIND_S)
        if self._remind_at.get(task.id) != at:  # placement looks at it again then, to say so
            self._remind_at[task.id] = at
            heapq.heappush(self._heap, (at, task.id))

    def _say_still_waiting(self, task: Task, reason: str, waited: float) -> None:
        if self.config.verbosity >= 0:
            self.config.out.write(
                f"still waiting after {int(waited // 60)} min: {safe_name(task.name)} "
                f"[{task.state}] {safe_text(reason)}\n"
            )
            self.config.out.flush()

    def forget(self, task_id: str) -> None:
        self._remind_at.pop(task_id, None)
        self.wait_operator.pop(task_id, None)
        self.wait_since.pop(task_id, None)
        self.remind_after.pop(task_id, None)

    def save(self) -> None:
        """Write what `fleetrun status` shows, once a pass and only when it changed."""
        if self.dirty:
            self.loop.led.set_meta("waits", json.dumps(self.waits))
            self.dirty = False

    # -- machines paused, tasks backed off -----------------------------------------------

    def pause_host(self, host: str, pause: tuple[float, int]) -> None:
        """A usage limit: start nothing on ``host`` until ``pause[0]``. Kept in the
        ledger, so a restarted loop waits for the same reset."""
        pauses = self.config.stash.setdefault(USAGE_PAUSE_KEY, {})
        now = clock.now()
        pauses[host] = pause
        # one that ended over an hour ago no longer counts toward the next backoff
        self.loop.led.set_usage_pauses({h: p for h, p in pauses.items() if p[0] > now - PAUSE_MEMORY_S})

    def pause_of(self, host: str) -> Optional[tuple[float, int]]:
        pause: Optional[tuple[float, int]] = self.config.stash.get(USAGE_PAUSE_KEY, {}).get(host)
        return pause

    def pause_text(self, host: str) -> str:
        return pause_text(self.config.stash.get(USAGE_PAUSE_KEY, {}).get(host, (0, 0))[0])

    def mark_paused(self, candidates: list[Candidate], at: float) -> None:
        """A paused machine is no candidate until its pause ends; wake up then."""
        pauses = self.config.stash.get(USAGE_PAUSE_KEY, {})
        for c in candidates:
            until = pauses.get(c.name, (0, 0))[0]
            if until > at and not c.why_not:
                c.why_not = f"is paused: {self.pause_text(c.name)}"
                if self.wait_until.get(f"pause:{c.name}") != until:
                    self.until(f"pause:{c.name}", until)

    def backoff_of(self, task_id: str, host: str) -> Optional[Backoff]:
        bo: Optional[Backoff] = self.config.stash[BACKOFF_KEY].get(task_id, {}).get(host)
        return bo

    def clear_backoff(self, task_id: str, host: str) -> None:
        self.config.stash[BACKOFF_KEY].get(task_id, {}).pop(host, None)

    def back_off(self, task_id: str, host: str, bo: Backoff) -> None:
        """Try ``task_id`` on ``host`` again only after ``bo.until``; the loop is not idle
        meanwhile (it places the task again then)."""
        self.config.stash[BACKOFF_KEY].setdefault(task_id, {})[host] = bo
        self.until(task_id, bo.until)

    # -- between passes ------------------------------------------------------------------

    def sleep(self) -> None:
        """Sleep until a shepherd says an agent ended, a verifier or setup command has
        output or ends, a wait is over, or a second has passed."""
        loop = self.loop
        timeout = 1.0
        for ticker in list(self.config.stash.get(TICKERS_KEY) or ()):
            timeout = min(timeout, max(0.0, ticker.tick()))
        now = clock.now()
        sock = loop.sock
        assert sock is not None  # open while the loop runs
        fds: list[Any] = [sock]
        for h in loop.verify.handles() + loop.setup.handles():
            if isinstance(h, Selectable) and h.fileno() >= 0:
                fds.append(h)
            if isinstance(h, HasDeadline):
                timeout = min(timeout, max(0.0, h.next_deadline() - time.monotonic()))
        timeout = min(timeout, max(0.0, self.next_due(now)))
        ready, _, _ = select.select(fds, [], [], max(timeout, 0.005))
        if sock in ready:
            try:
                while sock.recv(1024):
                    pass
            except (BlockingIOError, OSError):
                pass

    def finished(self) -> bool:
        """Has the run nothing left to do or to wait for? Says why in the session's
        final notes when only a person can clear what is left."""
        loop = self.loop
        if loop.io_error is not None:
            return False  # wait for the disk, then finish the work
        if effects.pending(self.config):
            return False  # a worktree still being removed: its note is the run's too
        if loop.scope_in(ACTIVE):
            return False
        if loop.stopping:
            return True
        if loop.queue_id is None and not loop.until_idle:
            return False  # `fleetrun work`: serve until stopped
        live_states = {s for s in State if not s.terminal}
        if not loop.scope_count(live_states, at_most=1):  # asked of the ledger: PENDING ones are not in memory
            return True
        if loop.placed_last_pass:
            return False
        # a task that waits for what can change by itself (memory, load, disk, slots, a
        # stale peer, a backoff, a pause) or by a live policy edit keeps the run going
        if any(t.id not in self.wait_operator for t in loop.scope_in(PLACEABLE)):
            return False
        # only waits a person must clear (or dependents of those): end, and say why
        # (read once, as the run ends)
        live = loop.led.tasks(live_states, queue_id=loop.queue_id, listed=True)
        by_id = {t.id: t for t in live}
        for t in live:
            if t.id in self.wait_operator:
                loop.session.final_notes.append(f"cannot place: {t.name}: {self.wait_operator[t.id]}")
                continue
            held = self._held_by(t, by_id, set())
            if held is not None:  # the real reason, not its cause (`queued`)
                loop.session.final_notes.append(
                    f"still waiting: {t.name} [{t.state}] for {held.name}, which cannot be placed: "
                    f"{self.wait_operator[held.id]}"
                )
            else:
                loop.session.final_notes.append(f"still waiting: {t.name} [{t.state}] {t.reason}")
        return True

    def _held_by(self, task: Task, by_id: dict[str, Task], seen: set[str]) -> Optional[Task]:
        """The task ``task`` waits for, through its unfinished dependencies, that waits
        for what only a person can clear; or None."""
        for dep in task.deps:
            d = by_id.get(dep)
            if d is None or dep in seen:
                continue
            seen.add(dep)
            if dep in self.wait_operator:
                return d
            found = self._held_by(d, by_id, seen)
            if found is not None:
                return found
        return None

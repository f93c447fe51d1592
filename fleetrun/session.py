"""A work session: the :class:`Session` the session hooks get, the one-loop-per-home
lock, queueing or resuming a tasks file's queue, and :class:`fleetrun.loop.Loop` between
``fleetrun_sessionstart`` and ``fleetrun_sessionfinish``."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Optional, TextIO

from . import effects, heartbeats, rerun
from .exceptions import UsageError
from .ledger import Ledger, open_ledger
from .liveness import WorkLock
from .loop import Loop
from .policy import PolicyWatcher
from .queueing import (
    COLLECT_NOTES_KEY,
    DESELECTED_KEY,
    SELECTED_AS_DEPENDENCY_KEY,
    queue_items,
    queue_to_resume,
)
from .stash import StashKey
from .states import State

if TYPE_CHECKING:
    from .config import Config
    from .taskspec import TaskSpec

#: Lines the terminal prints as the session starts (a queue resumed, a task taken along
#: as a dependency).
SESSION_NOTES_KEY = StashKey[list[str]]()


class Session:
    """One invocation's working set: the config, the ledger, and what was collected.

    :ivar config: the run's :class:`~fleetrun.config.Config`.
    :ivar ledger: the open ledger (None for a verb that needs none).
    :ivar items: the collected tasks (empty for ``fleetrun work``).
    :ivar exitstatus: the exit code, once the loop has stopped.
    :ivar final_notes: lines the terminal prints at the end of the run.
    :ivar task_ids: the tasks the run reports on (those ``counts`` counts), in the order
        they were queued, once the loop has stopped.
    """

    def __init__(self, config: Config, ledger: Optional[Ledger] = None) -> None:
        self.config = config
        self.ledger = ledger
        self.items: list[Any] = []
        self.files: list[Any] = []
        self.exitstatus: int = 0
        self.started = time.time()
        self.shouldstop: Optional[str] = None
        self.final_notes: list[str] = []
        self.counts: dict[str, int] = {}
        self.task_ids: list[str] = []
        self.cost_usd = 0.0
        self.cost_unknown = False  # a task of the run whose agent never reported its cost
        self.interrupted = False
        self.stopped_by_sigterm = False
        self.older_tasks = 0  # tasks of earlier queues the loop also works, left out of counts


#: The summary's word for the tasks of a file run again that were kept DONE from its
#: last run (``=== 1 done, 2 unchanged (done earlier) in 3s ===``).
UNCHANGED = "unchanged (done earlier)"


def _count_kept(counts: dict[str, int], led: Ledger, queue_id: Optional[str]) -> dict[str, int]:
    """``counts`` with the tasks kept DONE from the last run counted apart from the DONE
    ones this run made, right after them."""
    n = sum(1 for t in led.tasks({State.DONE}, queue_id=queue_id) if t.reason.startswith("unchanged:"))
    out: dict[str, int] = {}
    for state, k in counts.items():
        if state == State.DONE.value:
            if k - n:
                out[state] = k - n
            out[UNCHANGED] = n
        else:
            out[state] = k
    return out


def run_session(config: Config, items: Optional[list[TaskSpec]], out: TextIO, err: TextIO) -> int:
    """``fleetrun [FILE...]`` (items given) or ``fleetrun work`` (items None)."""
    led = open_ledger(config)
    PolicyWatcher(config.home / "policy.toml").load_strict()  # a broken policy: refuse before queueing
    lock = WorkLock(config.home)
    holder = lock.acquire()
    if holder is not None:
        raise UsageError(
            f"another work loop runs on {config.home} (pid {holder.get('pid')}); it picks up "
            "tasks queued with `fleetrun queue FILE`",
            key="work",
        )
    try:
        session = Session(config, led)
        queue_id = None
        notes = config.stash.setdefault(SESSION_NOTES_KEY, [])
        kept: dict[str, Any] = {}
        if items is not None:
            session.items = items
            collected: list[str] = config.stash.get(COLLECT_NOTES_KEY, [])
            notes.extend(collected)
            # a --lf/--ff run chooses from the last run's outcomes: never a queue to resume
            rerun_choice = config.getoption("last_failed") or config.getoption("failed_first")
            queue_id = None if config.getoption("new_queue") or rerun_choice else queue_to_resume(config, led)
            if queue_id is not None:
                states: dict[str, int] = {}
                for t in led.tasks(queue_id=queue_id):
                    states[t.state.value] = states.get(t.state.value, 0) + 1
                summary = ", ".join(f"{n} {s.lower()}" for s, n in states.items())
                notes.append(
                    f"resuming queue {queue_id} from an unchanged file ({summary}); --new-queue queues it again"
                )
            gone = config.stash.get(DESELECTED_KEY, [])
            if gone:  # the header says what -k/-m/--lf left out, as pytest's "N deselected"
                how = [
                    f"{o} {v}"
                    for o, v in (("-k", config.getoption("keyword")), ("-m", config.getoption("markexpr")))
                    if v
                ]
                if config.getoption("last_failed"):
                    how.append("--lf")
                notes.append(f"{len(gone)} deselected ({' '.join(how)})")
            for name in config.stash.get(SELECTED_AS_DEPENDENCY_KEY, []):
                notes.append(f"also selected, as a dependency: {name}")
            if queue_id is None and not config.getoption("new_queue"):
                # a file run again: its unchanged DONE tasks are kept, not redone
                plan = rerun.plan(config, items)
                kept = plan.kept
                note = rerun.kept_note(plan)
                if note:
                    notes.append(note)
                notes.extend(rerun.unfinished_notes(plan))
        config.hook.fleetrun_sessionstart(session=session)
        if items is not None and queue_id is None:
            queue_id = queue_items(config, items, kept)[0].queue_id
        heartbeats.install(config)  # host threads' heartbeats reach their hook through the loop's waits
        effects.install(config)  # worktree add/remove off the loop's thread, their ends back as events
        loop = Loop(config, led, session, queue_id, until_idle=bool(config.getoption("until_idle")))
        try:
            code = loop.run()
        except BaseException:  # an internal error: let what runs end, report nothing more
            effects.uninstall(config, deliver=False)
            raise
        effects.uninstall(config)  # what still runs ends, and its notes are written
        if kept:
            session.counts = _count_kept(session.counts, led, queue_id)
        if loop.stopping:
            session.final_notes.append(loop.stopping)
        session.exitstatus = code
        config.hook.fleetrun_sessionfinish(session=session, exitstatus=code)
        return code
    finally:
        lock.release()

"""A work session: the :class:`Session` the session hooks get, the one-loop-per-home
lock, queueing or resuming a tasks file's queue, and :class:`fleetrun.loop.Loop` between
``fleetrun_sessionstart`` and ``fleetrun_sessionfinish``."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Optional, TextIO

from .exceptions import UsageError
from .ledger import Ledger, open_ledger
from .liveness import WorkLock
from .loop import Loop
from .policy import PolicyWatcher
from .queueing import SELECTED_AS_DEPENDENCY_KEY, queue_digest, queue_items
from .stash import StashKey

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
        self.interrupted = False
        self.stopped_by_sigterm = False
        self.older_tasks = 0  # tasks of earlier queues the loop also works, left out of counts


def run_session(config: Config, items: Optional[list[TaskSpec]], out: TextIO, err: TextIO) -> int:
    """``fleetrun [FILE...]`` (items given) or ``fleetrun work`` (items None)."""
    led = open_ledger(config)
    PolicyWatcher(config.home / "policy.toml").load_strict()  # a broken policy: refuse before queueing
    lock = WorkLock(config.home)
    holder = lock.acquire()
    if holder is not None:
        raise UsageError(
            f"another work loop runs on {config.home} (pid {holder.get('pid')}); it picks up "
            "tasks queued with `fleetrun queue FILE`", key="work")
    try:
        session = Session(config, led)
        queue_id = None
        notes = config.stash.setdefault(SESSION_NOTES_KEY, [])
        if items is not None:
            session.items = items
            queue_id = None if config.getoption("new_queue") else led.find_queue(queue_digest(config))
            if queue_id is not None:
                states: dict[str, int] = {}
                for t in led.tasks(queue_id=queue_id):
                    states[t.state.value] = states.get(t.state.value, 0) + 1
                summary = ", ".join(f"{n} {s.lower()}" for s, n in states.items())
                notes.append(f"resuming queue {queue_id} from an unchanged file ({summary}); "
                             "--new-queue queues it again")
            for name in config.stash.get(SELECTED_AS_DEPENDENCY_KEY, []):
                notes.append(f"also selected, as a dependency: {name}")
        config.hook.fleetrun_sessionstart(session=session)
        if items is not None and queue_id is None:
            queue_id = queue_items(config, items)[0].queue_id
        loop = Loop(config, led, session, queue_id, until_idle=bool(config.getoption("until_idle")))
        code = loop.run()
        if loop.stopping:
            session.final_notes.append(loop.stopping)
        session.exitstatus = code
        config.hook.fleetrun_sessionfinish(session=session, exitstatus=code)
        return code
    finally:
        lock.release()

"""A work session: the loop's wake-up socket, the one-loop-per-home lock, queueing or
resuming a tasks file's queue, and the session hooks around :class:`fleetrun.loop.Loop`."""

from __future__ import annotations

import errno
import os
import socket
import sqlite3
from typing import Any, Optional, TextIO

from .exceptions import UsageError
from .liveness import WorkLock
from .policy import PolicyWatcher

SOCK = "loop.sock"


def is_space_error(e: BaseException) -> bool:
    """Disk full, quota, or a read-only home: a condition to wait out, not a crash."""
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EROFS, errno.EDQUOT):
        return True
    text = str(e).lower()
    return isinstance(e, sqlite3.OperationalError) and any(
        w in text for w in ("disk is full", "readonly database", "read-only", "disk i/o error"))


def sock_path(home: Any) -> str:
    """The loop's wake-up socket; a unix socket path must stay under ~100 bytes."""
    path = str(home / SOCK)
    if len(path.encode()) < 100:
        return path
    import hashlib
    import tempfile

    digest = hashlib.sha1(str(home).encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), f"fleetrun-{os.getuid()}-{digest}.sock")


def wake_loop(home: Any) -> None:
    """Tell a running loop to look at the ledger now (``fleetrun queue`` does)."""
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            s.sendto(b"wake", sock_path(home))
        finally:
            s.close()
    except OSError:
        pass


def run_session(config: Any, items: Optional[list[Any]], out: TextIO, err: TextIO) -> int:
    """``fleetrun [FILE...]`` (items given) or ``fleetrun work`` (items None)."""
    from .cli import Session, source_hash
    from .commands import open_ledger, queue_items
    from .loop import Loop

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
        notes = config.stash.setdefault("session_notes", [])
        if items is not None:
            session.items = items
            digest = "|".join(source_hash(f) for f in config.option.files) + "|k=" + (config.getoption("keyword") or "")
            queue_id = None if config.getoption("new_queue") else led.find_queue(digest)
            if queue_id is not None:
                states: dict[str, int] = {}
                for t in led.tasks(queue_id=queue_id):
                    states[t.state.value] = states.get(t.state.value, 0) + 1
                summary = ", ".join(f"{n} {s.lower()}" for s, n in states.items())
                notes.append(f"resuming queue {queue_id} from an unchanged file ({summary}); "
                             "--new-queue queues it again")
            for name in config.stash.get("selected_as_dependency", []):
                notes.append(f"also selected, as a dependency: {name}")
        config.hook.fleetrun_sessionstart(session=session)
        if items is not None and queue_id is None:
            queue_id = queue_items(config, items, out)[0].queue_id
        loop = Loop(config, led, session, queue_id, until_idle=bool(config.getoption("until_idle")))
        code = loop.run()
        if loop.stopping:
            session.final_notes.append(loop.stopping)
        session.exitstatus = code
        config.hook.fleetrun_sessionfinish(session=session, exitstatus=code)
        return code
    finally:
        lock.release()

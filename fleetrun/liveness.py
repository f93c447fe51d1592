"""The work loop's liveness file, lock and wake-up socket: who runs the loop, is it
alive, and how another command tells it to look at the ledger now."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Optional

from .osutil import FileLock
from .shepherd import proc_token, read_json, write_json

LIVENESS = "supervisor.json"
LOCK = "work.lock"
SOCK = "loop.sock"
STUCK_AFTER_S = 60.0


class WorkLock:
    """One ``work`` loop per home: an exclusive flock held while the loop runs, never
    waited for (a second loop is refused, naming the holder the file records)."""

    def __init__(self, home: Path) -> None:
        self.path = home / LOCK
        self._lock = FileLock(self.path, blocking=False)

    @property
    def fd(self) -> Optional[int]:
        return self._lock.fd

    def acquire(self) -> Optional[dict[str, Any]]:
        """Take the lock. :return: None on success, else what the holder wrote."""
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not self._lock.acquire():
            try:
                with open(self.path, "rb") as f:
                    holder = json.loads(f.read(4096).decode() or "{}")
            except (OSError, ValueError):
                holder = {}
            return holder or {"pid": "?"}
        fd = self._lock.fd
        assert fd is not None
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "started": time.time()}).encode(), 0)
        return None

    def release(self) -> None:
        self._lock.release()


class Liveness:
    def __init__(self, home: Path) -> None:
        self.path = home / LIVENESS
        self.started = time.time()
        self.last = 0.0

    def beat(self, force: bool = False, strict: bool = False, **extra: Any) -> None:
        now = time.time()
        if not force and now - self.last < 1.0:
            return
        self.last = now
        try:
            write_json(
                str(self.path),
                {"pid": os.getpid(), "token": proc_token(os.getpid()), "started": self.started, "beat": now, **extra},
                sync=False,
            )
        except OSError:
            if strict:
                raise
            # disk full: status will show the loop as stuck, which is the truth

    def clear(self) -> None:
        try:
            data = read_json(str(self.path)) or {}
            if data.get("pid") == os.getpid():
                self.path.unlink()
        except OSError:
            pass


def describe(home: Path, now: Optional[float] = None) -> str:
    """``supervisor: running (pid 123, last beat 2s ago)``, ``not running`` or ``stuck``."""
    data = read_json(str(home / LIVENESS))
    if not data:
        return "supervisor: not running"
    pid = data.get("pid")
    token = proc_token(int(pid)) if pid else None
    if token is None or (data.get("token") and token != data.get("token")):
        return "supervisor: not running"
    age = (now or time.time()) - float(data.get("beat") or 0)
    if age > STUCK_AFTER_S:
        mins = int(age // 60)
        return f"supervisor: stuck (pid {pid}, last beat {mins} min ago)"
    return f"supervisor: running (pid {pid}, last beat {int(age)}s ago)"


def sock_path(home: Path) -> str:
    """The loop's wake-up socket; a unix socket path must stay under ~100 bytes."""
    path = str(home / SOCK)
    if len(path.encode()) < 100:
        return path
    import hashlib
    import tempfile

    digest = hashlib.sha1(str(home).encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), f"fleetrun-{os.getuid()}-{digest}.sock")


def wake_loop(home: Path) -> None:
    """Tell a running loop to look at the ledger now (``fleetrun queue`` does)."""
    import socket  # here: `status` reads the liveness file only

    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            s.sendto(b"wake", sock_path(home))
        finally:
            s.close()
    except OSError:
        pass

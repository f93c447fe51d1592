"""Operating-system helpers: an exclusive file lock, ending a process group, starting a
detached process, and the identity of a process that a reused pid does not share.

Standard library only and nothing of fleetrun, so that ``fleetrun status`` and the
peer's fast path (``fleetrun host status``) can use it without paying for more imports.
The peer's verifier runner (run by path) loads this file by path for :func:`end_group`.
The shepherd (``python -I -S shepherd.py``, run by path) cannot import the package:
it keeps its own copies of :func:`proc_token` and of the group signalling (its run
loop owns the grace, to keep copying the log while the agent ends), and
``tests/test_osutil.py`` checks that the two ``proc_token`` agree.
"""

from __future__ import annotations

import fcntl
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Optional, Union

StrPath = Union[str, "os.PathLike[str]"]

# pids above this are not pids (Linux's pid_max is at most 2**22): a recorded file
# that says otherwise is not to be believed
PID_LIMIT = 1 << 22


def proc_token(pid: int) -> Optional[str]:
    """An identity for a process that a reused pid does not share (its start time).

    :return: the token; None when there is no such process, or it has ended (a
        zombie counts as ended).
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        if sys.platform.startswith("linux"):
            return None
        try:
            import psutil

            return f"psutil:{psutil.Process(pid).create_time():.3f}"
        except Exception:
            return None
    fields = data[data.rindex(b")") + 2 :].split()
    if fields[0] in (b"Z", b"X"):  # a zombie has ended
        return None
    return "linux:" + fields[19].decode()


# ---------------------------------------------------------------------------------
# file locks


class LockHeld(BlockingIOError):
    """A non-blocking :class:`FileLock` is held by another process (or another open
    file description of this one)."""


class FileLock:
    """An exclusive ``flock(2)`` on ``path`` (created 0600 if missing; its folder must
    exist), across processes. The lock goes with the open file: closing it, or the
    holder's death, releases it, so a crash never leaves a stale lock.

    ``with FileLock(path):`` waits for the lock. ``FileLock(path, blocking=False)``
    does not wait: :meth:`acquire` returns False, and ``with`` raises
    :class:`LockHeld`, when another holder has it. A held lock's :attr:`fd` is open
    read-write, for a holder that records itself in the file.

    :param path: the lock file.
    :param blocking: wait for the lock (default) or fail at once.
    """

    def __init__(self, path: StrPath, blocking: bool = True) -> None:
        self.path = os.fspath(path)
        self.blocking = blocking
        self.fd: Optional[int] = None

    @property
    def held(self) -> bool:
        return self.fd is not None

    def acquire(self) -> bool:
        """Take the lock. :return: True; False only without ``blocking``, when another
        holder has it (nothing is left open then)."""
        if self.fd is not None:
            return True
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if self.blocking else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        return True

    def release(self) -> None:
        """Let the lock go (safe to repeat)."""
        if self.fd is not None:
            fd, self.fd = self.fd, None
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)

    def __enter__(self) -> FileLock:
        if not self.acquire():
            raise LockHeld(f"{self.path} is locked by another process")
        return self

    def __exit__(
        self, exc_type: Optional[type[BaseException]], exc: Optional[BaseException], tb: Optional[TracebackType]
    ) -> None:
        self.release()


# ---------------------------------------------------------------------------------
# process groups


def _leader_gone(pid: int, token: Optional[str], grace_s: float) -> bool:
    """Wait up to ``grace_s`` for the process ``pid`` with identity ``token`` to end
    (to be a zombie, reaped or replaced). :return: whether it did."""
    deadline = time.monotonic() + grace_s
    delay = 0.005
    while True:
        now = proc_token(pid)
        if now is None or now != token:
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(delay, left))
        delay = min(delay * 2, 0.05)  # as Popen.wait polls


def end_group(pid: object, token: Optional[str] = None, grace_s: float = 2.0) -> bool:
    """End the process group led by ``pid`` (a process started in a session or group
    of its own): SIGTERM, up to ``grace_s`` for its leader to end, SIGKILL, up to
    ``grace_s`` more, then SIGKILL for anything left in the group. With ``grace_s``
    0, one SIGKILL at once.

    A reused pid is told apart by ``token`` (:func:`proc_token` of the leader, taken
    when it was started): when it no longer matches, nothing is signalled. ``token``
    None means the caller vouches for ``pid``: its own child (a ``Popen``), whose
    group is signalled even if the leader has just ended; once the child is reaped,
    only leftovers of its group can still answer to its id (a group's id is not
    reused while a member lives). This does not reap: call ``Popen.poll()`` after.

    :param pid: the group's leader; anything but a plausible pid (a value read from
        a file) is refused.
    :param token: the leader's identity, or None for a child of the caller.
    :param grace_s: seconds the group gets to end after SIGTERM, and after SIGKILL.
    :return: whether the group was signalled.
    """
    if isinstance(pid, bool) or not isinstance(pid, int) or not 0 < pid < PID_LIMIT:
        return False
    if token is not None:
        if not isinstance(token, str) or not token or proc_token(pid) != token:
            return False
    else:
        token = proc_token(pid)
    signalled = False
    for sig in (signal.SIGTERM, signal.SIGKILL) if grace_s > 0 else (signal.SIGKILL,):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            return signalled
        signalled = True
        if grace_s <= 0 or _leader_gone(pid, token, grace_s):
            break
    if grace_s > 0:
        try:
            os.killpg(pid, signal.SIGKILL)  # leftovers of the group, the leader gone
        except (ProcessLookupError, PermissionError):
            pass
    return signalled


# ---------------------------------------------------------------------------------
# detached processes


def spawn_detached(argv: Sequence[str], env: Mapping[str, str], out_path: StrPath) -> int:
    """Start ``argv`` detached: in a session of its own (no terminal, no signal from
    ours), standard input from ``/dev/null``, standard output and error appended to
    ``out_path`` (created 0600).

    ``posix_spawn``, not ``Popen``: the child is meant to outlive us, and a ``Popen``
    object would complain when collected with its child still running. It stays our
    child until we exit: reap it (``os.waitpid(pid, os.WNOHANG)``) or let it be.

    :param argv: the command; ``argv[0]`` is the executable's path (no ``PATH``
        lookup).
    :param env: its whole environment.
    :param out_path: where its output goes.
    :return: its pid (also its process group and session id).
    :raises OSError: it could not be started.
    """
    return os.posix_spawn(
        argv[0],
        list(argv),
        dict(env),
        file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, os.fspath(out_path), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600),
            (os.POSIX_SPAWN_DUP2, 1, 2),
        ],
        setsid=True,
    )

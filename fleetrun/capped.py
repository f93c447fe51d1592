"""Output of an untrusted process, bounded: its file capped, its processes ended with it.

:class:`CappedWriter` writes a stream to a file under a cap: the first half of the cap
goes to the file as it comes (``logs -f`` follows it), the last half is kept in memory
(at most the cap's half) and written at the end after a marker line that says what was
dropped. The file never holds more than the cap plus the marker, whatever the stream,
so one task's flood fills no disk (issue 21 item 5).

Run as ``python -I -S capped.py MAX_BYTES OUT -- ARGV...``, it is the wrapper every
local verifier and setup step runs under (:class:`fleetrun.procutil.ProcessHandle`;
on a peer, the verifier runner starts it the same way). The supervisor's host forks it
instead, from its shepherd starter, which loads this file once
(:func:`fleetrun.shepherd._fork_capped`: :func:`run` in a fork, its exit code written
to a pipe rather than exited with). Either way it makes itself the child
subreaper (Linux ``prctl(PR_SET_CHILD_SUBREAPER)``), runs ARGV in its own process
group with the output copied through a :class:`CappedWriter` into OUT, and when ARGV
ends it ends every descendant still alive (SIGTERM, a grace, SIGKILL), so a
``setsid sleep 3000 &`` dies with the verifier that started it (item 6). It exits as
ARGV did (the same code, or killed by the same signal), and writes the number of bytes
cut to ``OUT.cut`` when there were any.

Standard library only and nothing of the package, since it is run by path. The
shepherd (also run by path) keeps its own small copy of the writer and the reaping;
``tests/test_capped.py`` checks that the two cut a stream the same way.
"""

from __future__ import annotations

import os
import select
import sys
import time

#: The default of ``[output] max_bytes``: what one file written from an untrusted stream
#: (an agent's log, a verifier's or setup step's output) may hold.
DEFAULT_MAX_BYTES = 20_000_000
#: A cap below this is refused in config.toml: the marker alone is ~80 bytes.
MIN_MAX_BYTES = 4096
#: Beside OUT: the number of bytes the wrapper cut (absent when none).
CUT_SUFFIX = ".cut"
#: After SIGTERM, the descendants left when the command ended get this long.
GRACE_S = 5.0
PR_SET_CHILD_SUBREAPER = 36


def size_text(n: int) -> str:
    """``n`` bytes for a person: ``"512 bytes"``, ``"20 MB"``, ``"1.0 GB"`` (powers of 1000)."""
    for unit, name in ((10**9, "GB"), (10**6, "MB"), (10**3, "kB")):
        if n >= unit:
            value = n / unit
            return f"{value:.1f} {name}" if value < 10 else f"{value:.0f} {name}"
    return f"{n} bytes"


def marker(cut: int, max_bytes: int) -> bytes:
    """The line between the head and the tail of a cut stream."""
    return f"\n[fleetrun: {cut:,} bytes cut: output over its {size_text(max_bytes)} cap]\n".encode()


def cut_note(cut: int, max_bytes: int) -> str:
    """What a verdict or an attempt says of its cut output."""
    return f"output cut: {size_text(cut)} over the {size_text(max_bytes)} cap"


class CappedWriter:
    """Writes a stream to ``fd`` (open for writing, at its start or end) under ``max_bytes``.

    :meth:`write` passes the first ``max_bytes // 2`` bytes straight to the file and keeps
    the last ``max_bytes - max_bytes // 2`` of the rest in memory; :meth:`close` writes the
    marker and that tail. :attr:`cut` is how many bytes were dropped (known for sure once
    closed). A failed write (a full disk) raises ``OSError`` from :meth:`write` or
    :meth:`close`; what did not fit is lost, the writer stays usable.
    """

    def __init__(self, fd: int, max_bytes: int) -> None:
        self.fd = fd
        self.max_bytes = max(int(max_bytes), 2)
        self.head_left = self.max_bytes // 2
        self.tail_max = self.max_bytes - self.max_bytes // 2
        self.tail = bytearray()
        self.seen = 0  # bytes past the head
        self.closed = False

    @property
    def cut(self) -> int:
        return max(0, self.seen - self.tail_max)

    def write(self, data: bytes) -> None:
        if self.head_left > 0:
            head = data[: self.head_left]
            data = data[len(head) :]
            self.head_left -= len(head)
            _write_all(self.fd, head)
        if data:
            self.seen += len(data)
            self.tail += data
            # trimmed in steps, not at every write: deleting a bytearray's front is cheap
            if len(self.tail) > self.tail_max + 1_048_576:
                del self.tail[: len(self.tail) - self.tail_max]

    def close(self) -> int:
        """Write what is kept of the end (once). :return: :attr:`cut`."""
        if self.closed:
            return self.cut
        self.closed = True
        tail = bytes(self.tail[-self.tail_max :]) if self.tail else b""
        self.tail = bytearray()
        if self.cut:
            tail = marker(self.cut, self.max_bytes) + tail
        _write_all(self.fd, tail)
        return self.cut


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:  # a short write (a nearly full disk) is not the whole of it
        view = view[os.write(fd, view) :]


# ---------------------------------------------------------------------------------
# reaping what a command leaves behind


def set_subreaper() -> bool:
    """Make this process the child subreaper: orphans of its descendants become its
    children (and :func:`descendants` finds them). :return: whether it is (Linux only)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes  # here: ~3 ms of imports, paid only where it is used

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def descendants(root: int) -> list[int]:
    """Every live process below ``root`` (by parent pid, from ``/proc``); [] without it."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    parent: dict[int, list[int]] = {}
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                data = f.read()
        except OSError:
            continue  # ended meanwhile
        fields = data[data.rindex(b")") + 2 :].split()
        if fields[0] in (b"Z", b"X"):
            continue  # ended: reaping it is all that is left
        parent.setdefault(int(fields[1]), []).append(int(name))
    found, todo = [], [root]
    while todo:
        for child in parent.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


def reap(keep: tuple[int, ...] = ()) -> dict[int, int]:
    """Collect every ended child (a subreaper's orphans included) without waiting.

    :return: {pid: wait status} of those in ``keep`` that were collected."""
    got: dict[int, int] = {}
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return got
        if pid == 0:
            return got
        if pid in keep:
            got[pid] = status


def has_children() -> bool:
    """Whether a child still runs, once the ended ones are reaped. A subreaper with none
    has no descendant either (a live one would be its child or below a live child), so
    the common end, nothing left behind, costs no ``/proc`` scan."""
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True


def end_descendants(grace_s: float = GRACE_S, keep: tuple[int, ...] = ()) -> dict[int, int]:
    """End every process below this one: SIGTERM, up to ``grace_s`` for them to go,
    SIGKILL for the rest, until none is left (each round reaps what ended).

    :return: {pid: wait status} of those in ``keep`` reaped on the way."""
    import signal  # here: the package imports this module for its constants alone

    got: dict[int, int] = {}
    if not has_children():
        return got
    me = os.getpid()
    left = descendants(me)
    for pid in left:
        _kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while left and time.monotonic() < deadline:
        time.sleep(0.02)
        got.update(reap(keep))
        left = descendants(me)
    for _round in range(1000):  # a fork bomb cannot keep it here for ever
        if not left:
            break
        for pid in left:
            _kill(pid, signal.SIGKILL)
        time.sleep(0.01)
        got.update(reap(keep))
        left = descendants(me)
    got.update(reap(keep))
    return got


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


# ---------------------------------------------------------------------------------
# the wrapper


def run(max_bytes: int, out: str, argv: list[str]) -> int:
    """Run ``argv`` with its output capped into ``out`` and its descendants ended with it.

    :return: its exit code, or minus the signal that ended it (127: it could not start)."""
    import signal

    set_subreaper()
    # a SIGTERM (the supervisor ending the verifier's group) reaches the command by its
    # group; this process only has to live on to end what the command detached
    stopped: list[int] = []
    wake_r, wake_w = os.pipe()  # a SIGTERM wakes the wait below at once
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGTERM, lambda signum, frame: stopped.append(signum) if not stopped else None)
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    writer = CappedWriter(fd, max_bytes)
    rfd, wfd = os.pipe()
    try:
        pid = os.posix_spawnp(
            argv[0],
            argv,
            dict(os.environ),
            file_actions=[(os.POSIX_SPAWN_DUP2, wfd, 1), (os.POSIX_SPAWN_DUP2, wfd, 2)],
            setsigdef=(signal.SIGPIPE, signal.SIGXFSZ, signal.SIGTERM),
        )
    except OSError as e:
        _safe_write(writer, f"cannot start {argv[0]}: {e.strerror or e}\n".encode())
        os.close(wfd)
        os.close(rfd)
        _finish(writer, fd, out)
        return 127
    os.close(wfd)
    try:
        pidfd = os.pidfd_open(pid)  # readable the moment it exits
    except (AttributeError, OSError):
        pidfd = -1
    status: int | None = None
    open_ = True
    while status is None:
        if stopped and stopped[0]:
            # told to stop (a timeout, a cancel): everything below ends now, the command
            # too, as it may be deaf to the SIGTERM its group got; the caller's SIGKILL of
            # the group, 2 s on, would take this process before it could end what left it
            stopped[0] = 0
            status = end_descendants(0.5, keep=(pid,)).get(pid)
            continue
        try:
            # a pipe at its end stays readable: not waited on then, or this would spin
            ready, _, _ = select.select(
                ([rfd] if open_ else []) + ([pidfd] if pidfd >= 0 else []) + [wake_r],
                [],
                [],
                1.0 if pidfd >= 0 else 0.05,
            )
        except InterruptedError:  # pragma: no cover
            ready = []
        if wake_r in ready:
            try:
                os.read(wake_r, 512)
            except OSError:
                pass
        if open_ and rfd in ready:
            open_ = _copy(rfd, writer)
        status = reap((pid,)).get(pid)
        if not open_ and status is None and pidfd < 0:
            time.sleep(0.02)
    if pidfd >= 0:
        os.close(pidfd)
    # the command has ended: what it left behind is ended too, then its output drained
    # (every writer is gone once they are). Stopped (the supervisor ends the group: a
    # timeout, a cancel), the grace is short: the supervisor's SIGKILL follows in 2 s
    end_descendants(0.5 if stopped else GRACE_S)
    os.set_blocking(rfd, False)
    while open_:
        try:
            open_ = _copy(rfd, writer)
        except BlockingIOError:
            break
    os.close(rfd)
    _finish(writer, fd, out)
    return os.waitstatus_to_exitcode(status)


def _copy(rfd: int, writer: CappedWriter) -> bool:
    """Copy one read of the pipe. :return: False at its end."""
    try:
        data = os.read(rfd, 65536)
    except BlockingIOError:
        raise
    except OSError:
        return False
    if not data:
        return False
    _safe_write(writer, data)
    return True


def _safe_write(writer: CappedWriter, data: bytes) -> None:
    try:
        writer.write(data)
    except OSError:  # a full disk: the output is lost, the verdict is not
        pass


def _finish(writer: CappedWriter, fd: int, out: str) -> None:
    try:
        writer.close()
    except OSError:
        pass
    os.close(fd)
    if writer.cut:
        try:
            tmp = f"{out}{CUT_SUFFIX}.{os.getpid()}.tmp"
            tfd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                _write_all(tfd, f"{writer.cut} {writer.max_bytes}\n".encode())
            finally:
                os.close(tfd)
            os.replace(tmp, out + CUT_SUFFIX)
        except OSError:
            pass


def read_cut(out: str) -> tuple[int, int] | None:
    """(bytes cut, the cap) that the wrapper recorded beside ``out``, or None."""
    try:
        with open(out + CUT_SUFFIX) as f:
            cut, cap = f.read().split()
        return int(cut), int(cap)
    except (OSError, ValueError):
        return None


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--" or not argv[0].isdigit():
        print("usage: python -I -S capped.py MAX_BYTES OUT -- ARGV...", file=sys.stderr)
        return 2
    code = run(int(argv[0]), argv[1], argv[3:])
    if code < 0:  # ended by a signal: end the same way, so the caller sees the same
        import signal

        try:
            signal.signal(-code, signal.SIG_DFL)
        except (OSError, ValueError):
            pass  # SIGKILL has no handler to reset
        os.kill(os.getpid(), -code)
        return 128 - code  # pragma: no cover - a signal that does not end a process
    return code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

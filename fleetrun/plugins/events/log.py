"""Where event lines go: the home's ``events.ndjson``, rotated by size, and the
``--events`` copy (a file, or standard output).

Several processes append to the home's file (the loop, ``fleetrun cancel`` in another
shell, a second home's peer verbs never do): each line, or each run of whole lines of
at most :data:`CHUNK_BYTES`, is one ``write`` on an ``O_APPEND`` descriptor, so lines
never interleave. (On Linux a ``write`` to a regular file of a local filesystem holds
the inode's lock for all of it: two never mix, whatever their size. POSIX promises no
more than that the end is found and written at once; ``PIPE_BUF`` is about pipes.
The limit bounds one ``write`` anyway: a short one, on a full disk, then ends a chunk,
not the stream.) A writer that finds the file full
rotates it under ``events.lock`` and checks again once it holds the lock (another may
have rotated it meanwhile). A line written by a process that opened the file just
before another rotated it lands at the end of ``events.ndjson.1``: late, never lost
or cut.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Sequence, TextIO

from ...osutil import FileLock

FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
#: ``[events] max_bytes`` and ``keep`` unless config.toml says otherwise.
DEFAULT_MAX_BYTES = 10 * 1024 * 1024
DEFAULT_KEEP = 3
#: At most this many bytes of whole lines in one ``write`` (a longer line goes alone).
CHUNK_BYTES = 64 * 1024


def chunks(lines: Sequence[bytes], start: int, size: int, max_bytes: int, limit: int = CHUNK_BYTES) -> int:
    """How far the next ``write`` goes: the end (exclusive) of the lines from ``start``
    that fit both in ``limit`` bytes and in a file of ``size`` bytes before it passes
    ``max_bytes``; ``start`` itself when the first does not fit (rotate first). An empty
    file takes one line of any length, as it always did.
    """
    end, total = start, 0
    for line in lines[start:]:
        n = len(line)
        if end > start and (total + n > limit or size + total + n > max_bytes):
            break
        if end == start and size > 0 and size + n > max_bytes:
            break
        end, total = end + 1, total + n
    return end


def write_all(fd: int, data: bytes) -> None:
    """``os.write`` until all of ``data`` is written (a regular file writes it all at
    once but on a full disk or a signal)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class HomeLog:
    """``events.ndjson`` in a home: rotated to ``events.ndjson.1`` (then ``.2``... up to
    ``keep``; the oldest is dropped) when a line would take it past ``max_bytes``.

    The file is opened for each line: a descriptor kept open would go on writing into
    a file another process rotated away. That costs ~10 us a line (bench/events.py),
    nothing next to the transaction each transition is.
    """

    def __init__(self, path: Path, max_bytes: int = DEFAULT_MAX_BYTES, keep: int = DEFAULT_KEEP) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.keep = keep
        self.lock = path.with_name(path.stem + ".lock")  # events.lock: not one of the log's files

    def write(self, line: bytes) -> None:
        """Append one line (``\\n``-terminated), rotating first when it would not fit."""
        self.write_lines([line])

    def write_lines(self, lines: Sequence[bytes]) -> None:
        """Append whole lines, as few ``write`` calls as :func:`chunks` allows (one for a
        pass's lines, most of the time), rotating between two lines when the next would
        not fit."""
        fd = os.open(self.path, FLAGS, 0o600)
        try:
            i = 0
            while i < len(lines):
                # the size again before each chunk: other processes append too
                end = chunks(lines, i, os.fstat(fd).st_size, self.max_bytes)
                if end == i:
                    os.close(fd)
                    fd = -1
                    fd = self._rotate(len(lines[i]))
                    continue
                write_all(fd, b"".join(lines[i:end]))
                i = end
        finally:
            if fd >= 0:
                os.close(fd)

    def _full(self, fd: int, n: int) -> bool:
        size = os.fstat(fd).st_size
        return size > 0 and size + n > self.max_bytes  # a line longer than the limit still goes in

    def _rotate(self, n: int) -> int:
        """Rotate under the lock unless another writer did; :return: an open descriptor of
        the file to write to."""
        with FileLock(self.lock):
            fd = os.open(self.path, FLAGS, 0o600)
            if not self._full(fd, n):  # rotated by another writer meanwhile
                return fd
            os.close(fd)
            for i in range(self.keep - 1, 0, -1):
                older = self.path.with_name(f"{self.path.name}.{i}")
                if older.exists():
                    os.replace(older, self.path.with_name(f"{self.path.name}.{i + 1}"))
            if self.keep > 0:
                os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
            else:
                os.unlink(self.path)
            return os.open(self.path, FLAGS, 0o600)


class Copy:
    """The ``--events`` copy of this process's events: a file (appended to, created
    0600, kept open for the run: only this process writes it) or a text stream
    (standard output for ``--events -``), flushed after each line."""

    def __init__(self, path: Optional[Path] = None, stream: Optional[TextIO] = None) -> None:
        self.stream = stream
        self.fd = os.open(path, FLAGS, 0o600) if path is not None else -1
        #: standard output is written line by line even in a loop: whoever reads it reads
        #: it live (a pipe), and what a pipe takes costs no ``open``
        self.live = stream is not None

    def write(self, data: bytes) -> None:
        """Write whole lines: one, or a pass's (the file)."""
        if self.fd >= 0:
            write_all(self.fd, data)
        elif self.stream is not None:
            self.stream.write(data.decode())
            self.stream.flush()

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

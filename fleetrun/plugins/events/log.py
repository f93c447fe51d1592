"""Where event lines go: the home's ``events.ndjson``, rotated by size, and the
``--events`` copy (a file, or standard output).

Several processes append to the home's file (the loop, ``fleetrun cancel`` in another
shell, a second home's peer verbs never do): each line is one ``write`` on an
``O_APPEND`` descriptor, so lines never interleave. A writer that finds the file full
rotates it under ``events.lock`` and checks again once it holds the lock (another may
have rotated it meanwhile). A line written by a process that opened the file just
before another rotated it lands at the end of ``events.ndjson.1``: late, never lost
or cut.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, TextIO

from ...osutil import FileLock

FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
#: ``[events] max_bytes`` and ``keep`` unless config.toml says otherwise.
DEFAULT_MAX_BYTES = 10 * 1024 * 1024
DEFAULT_KEEP = 3


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
        fd = os.open(self.path, FLAGS, 0o600)
        try:
            if self._full(fd, len(line)):
                os.close(fd)
                fd = -1
                fd = self._rotate(len(line))
            os.write(fd, line)
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

    def write(self, line: bytes) -> None:
        if self.fd >= 0:
            os.write(self.fd, line)
        elif self.stream is not None:
            self.stream.write(line.decode())
            self.stream.flush()

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

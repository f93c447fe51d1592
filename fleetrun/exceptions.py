"""The errors fleetrun reports to users, and which errors it waits out rather than reports."""

from __future__ import annotations

import enum
from typing import Optional


class ExitCode(enum.IntEnum):
    """Session exit codes; the same meanings as pytest's."""

    OK = 0
    TASKS_FAILED = 1
    INTERRUPTED = 2
    INTERNAL_ERROR = 3
    USAGE_ERROR = 4
    NO_TASKS_COLLECTED = 5


class UsageError(Exception):
    """A mistake of the user's: printed as ``ERROR: file:line: key: message``, exit 4.

    :param message: what is wrong, and what to do about it.
    :param file: the file the mistake is in, if any.
    :param line: the 1-based line in ``file``, if known.
    :param key: the key or subject the mistake is about (``task 'x': depends_on``).
    """

    def __init__(
        self,
        message: str,
        file: Optional[str] = None,
        line: Optional[int] = None,
        key: Optional[str] = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.file = file
        self.line = line
        self.key = key

    def format(self) -> str:
        where = ""
        if self.file:
            where = f"{self.file}:{self.line}: " if self.line else f"{self.file}: "
        key = f"{self.key}: " if self.key else ""
        return f"ERROR: {where}{key}{self.message}"

    def __str__(self) -> str:
        return self.format()


class UsageErrors(UsageError):
    """Several usage errors found at once (collection reports all of them)."""

    def __init__(self, errors: list[UsageError]) -> None:
        super().__init__(f"{len(errors)} errors")
        self.errors = errors

    def format(self) -> str:
        return "\n".join(e.format() for e in self.errors)


class StateConflict(Exception):
    """A compare-and-set on a task's state found another state than expected."""

    def __init__(self, task_id: str, expected: object, actual: object) -> None:
        super().__init__(f"task {task_id}: expected state {expected}, found {actual}")
        self.task_id = task_id
        self.expected = expected
        self.actual = actual


#: What a program prints when it could not write for want of room (lower case): a full
#: disk, a quota, a read-only filesystem. A condition to wait out.
SPACE_ERROR_TEXTS = ("no space left on device", "disk quota exceeded", "read-only file system")


def says_space_error(text: str) -> bool:
    """Whether a program's message says it could not write for want of room."""
    low = text.lower()
    return any(t in low for t in SPACE_ERROR_TEXTS)


def is_space_error(e: BaseException) -> bool:
    """Disk full, quota, or a read-only home: a condition to wait out, not a crash."""
    import errno
    import sqlite3

    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EROFS, errno.EDQUOT):
        return True
    text = str(e).lower()
    return isinstance(e, sqlite3.OperationalError) and any(
        w in text for w in ("disk is full", "readonly database", "read-only", "disk i/o error")
    )

"""Small process and output helpers shared by verifiers and the peer side."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

KEEP_BYTES = 64 * 1024


def tail_text(path: Path, limit: int = KEEP_BYTES) -> str:
    """The last ``limit`` bytes of a file, cut on a UTF-8 character boundary."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - limit))
            data = f.read()
    except OSError:
        return ""
    if size > limit:
        i = 0
        while i < len(data) and i < 4 and (data[i] & 0xC0) == 0x80:
            i += 1
        data = data[i:]
    return data.decode("utf-8", "replace")


def end_group(proc: subprocess.Popen[bytes], grace_s: float = 2.0) -> None:
    """End a child started with ``start_new_session=True`` and its whole process group:
    SIGTERM, then SIGKILL after ``grace_s``, then SIGKILL for anything left in the group."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=grace_s)
            break
        except subprocess.TimeoutExpired:
            continue
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # leftovers of the group
    except ProcessLookupError:
        pass

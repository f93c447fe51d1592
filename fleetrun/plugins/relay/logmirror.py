"""The local mirror of a peer attempt's log: chunks the peer sent (a status reply, a
``log`` reply or a worker's ``log`` event), appended in order, each only at the offset
the mirror has reached (a chunk sent twice, or one out of order, is not written)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from ...ledger import ensure_private_dir
from .protocol import LogChunk


def size(path: Path) -> int:
    """The mirror's length (0 before its first chunk)."""
    try:
        return path.stat().st_size
    except OSError:
        return 0


def append_chunk(log: Path, chunk: Optional[LogChunk]) -> bool:
    """Append ``chunk`` if it starts where the mirror ends. :return: whether it did.
    The caller holds the host's lock: the loop and the worker's reader both write."""
    if chunk is None or not chunk.data or chunk.offset != size(log):
        return False
    ensure_private_dir(log.parent)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, chunk.data)
    finally:
        os.close(fd)
    return True

"""The local mirror of a peer attempt's log: chunks the peer sent (a status reply, a
``log`` reply or a worker's ``log`` event), appended in order, each only at the offset
the mirror has reached (a chunk sent twice, or one out of order, is not written).

The mirror is ``attempts/<id>/peer.log`` (:data:`MIRROR_NAME`), never ``log``: a peer's
bytes are kept apart from any file a local attempt's shepherd writes, so no reader of
a local attempt (its cost, its usage pause, ``logs -f``) can ever read them. It keeps
the head of the log, as much as the supervisor's ``[output] max_bytes`` allows
(:func:`mirror_cap`), then a line saying the rest was cut, and takes nothing more."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from ...ledger import ensure_private_dir
from .protocol import LogChunk

#: The mirror's file name in the attempt's folder.
MIRROR_NAME = "peer.log"
#: What a mirror may hold beyond the supervisor's ``[output] max_bytes``: a peer's
#: shepherd cuts its log to the peer's cap plus a marker line, so an honest peer's cut
#: log fits whole under the same setting.
MARGIN = 4096


def mirror_cap(max_bytes: int) -> int:
    """The most of a peer attempt's log kept here (its head), for ``[output] max_bytes``."""
    return max_bytes + MARGIN


#: Written after the head once a chunk would take the mirror past the cap (so that
#: the mirror's size passes the cap: :func:`is_cut`).
CUT_NOTE = b"\n[fleetrun: cut here; the rest of this peer attempt's log was not kept (over %d bytes)]\n"


def size(path: Path) -> int:
    """The mirror's length (0 before its first chunk)."""
    try:
        return path.stat().st_size
    except OSError:
        return 0


def is_cut(path: Path, cap: int) -> bool:
    """Whether the mirror reached its cap (and takes no more)."""
    return size(path) > cap


def complete(path: Path, peer_size: int, cap: int) -> bool:
    """Whether the mirror holds all of a log of ``peer_size`` bytes it will ever hold."""
    return size(path) >= peer_size or is_cut(path, cap)


def append_chunk(log: Path, chunk: Optional[LogChunk], cap: int) -> bool:
    """Append ``chunk`` if it starts where the mirror ends, as far as ``cap`` (then the
    cut note). :return: whether it wrote.
    The caller holds the host's lock: the loop and the worker's reader both write."""
    at = size(log)
    if chunk is None or not chunk.data or chunk.offset != at or at > cap:
        return False
    data = chunk.data[: max(cap - at, 0)]
    if len(data) < len(chunk.data):
        data += CUT_NOTE % cap
    ensure_private_dir(log.parent)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    return True

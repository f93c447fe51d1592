"""The local mirror of a peer attempt's log: chunks the peer sent (a status reply, a
``log`` reply or a worker's ``log`` event), appended in order, each only at the offset
the mirror has reached (a chunk sent twice, or one out of order, is not written).

The mirror is ``attempts/<id>/peer.log`` (:data:`MIRROR_NAME`), never ``log``: a peer's
bytes are kept apart from any file a local attempt's shepherd writes, so no reader of
a local attempt (its cost, its usage pause, ``logs -f``) can ever read them. It keeps
the head of the log, :data:`MAX_MIRROR_BYTES` at most, then a line saying the rest
was cut, and takes nothing more."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from ...ledger import ensure_private_dir
from .protocol import LogChunk

#: The mirror's file name in the attempt's folder.
MIRROR_NAME = "peer.log"
#: The most of a peer attempt's log kept here (its head). To be the ``[output]
#: max_bytes`` setting once that is wired (issue 21: the general output cap).
MAX_MIRROR_BYTES = 20 << 20
#: Written after the head once a chunk would take the mirror past the cap (so that
#: the mirror's size passes the cap: :func:`is_cut`).
CUT_NOTE = b"\n[fleetrun: cut here; the rest of this peer attempt's log was not kept (over %d bytes)]\n"


def size(path: Path) -> int:
    """The mirror's length (0 before its first chunk)."""
    try:
        return path.stat().st_size
    except OSError:
        return 0


def is_cut(path: Path) -> bool:
    """Whether the mirror reached its cap (and takes no more)."""
    return size(path) > MAX_MIRROR_BYTES


def complete(path: Path, peer_size: int) -> bool:
    """Whether the mirror holds all of a log of ``peer_size`` bytes it will ever hold."""
    return size(path) >= peer_size or is_cut(path)


def append_chunk(log: Path, chunk: Optional[LogChunk]) -> bool:
    """Append ``chunk`` if it starts where the mirror ends, as far as the cap (then the
    cut note). :return: whether it wrote.
    The caller holds the host's lock: the loop and the worker's reader both write."""
    cap = MAX_MIRROR_BYTES  # read at each call: the [output] setting is to set it
    at = size(log)
    if chunk is None or not chunk.data or chunk.offset != at or at > cap:
        return False
    data = chunk.data[:max(cap - at, 0)]
    if len(data) < len(chunk.data):
        data += CUT_NOTE % cap
    ensure_private_dir(log.parent)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    return True

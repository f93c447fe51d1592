"""What a peer may speak of: the attempts (and their verifiers) this supervisor asked
that peer about, and the count of what the peer said of anything else.

A worker's events (``log``, ``ended``, ``verified``) and replies name an attempt or a
request; a peer is untrusted, so an event is kept only for an attempt this supervisor
placed on that peer (it sent it a ``start``, a ``status``, a ``log``...) and a reply
only for a request it sent. Anything else is dropped and counted, per kind: never a
file, never a cost, never a pause, and never kept in memory (issue 21, items 2 and 3).
An attempt this supervisor is done with leaves the table; a late event about it (the
honest worker pushes an end again after a status asked once more) is dropped without
being counted, as long as it is among the last :data:`FINISHED_KEPT` finished.

Thread-safe: the loop adds and removes, the worker's reader thread asks.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any, Optional, Union

from .protocol import VIOLATION_KINDS

#: How many finished attempts (and verifiers) are remembered, so that a late event about
#: one is not a violation. Bounded: a peer cannot grow it (the supervisor finishes them).
FINISHED_KEPT = 1024
#: The count of violations is written to ``peers-state.json`` at most this often.
FLUSH_EVERY_S = 5.0

Key = Union[str, tuple[str, int]]


def asked_about(verb: str, args: list[str], payload: Optional[dict[str, Any]]) -> Optional[Key]:
    """The attempt (or the attempt's verifier, ``(attempt id, step)``) a request asks
    about, whose events the worker will push; None for a request about no attempt."""
    p = payload or {}
    if verb in ("verify-start", "verify-status"):
        if verb == "verify-start":
            att, idx = p.get("attempt"), p.get("idx")
            aid = att.get("id") if isinstance(att, dict) else None
        else:
            aid, idx = _arg(args, "--attempt"), _arg(args, "--idx")
        try:
            return (str(aid), int(idx)) if aid and idx is not None else None
        except (TypeError, ValueError):
            return None
    if verb in ("start", "status", "log"):
        aid = p.get("attempt_id") if verb == "start" else _arg(args, "--attempt")
        return str(aid) if aid else None
    return None


def asked_about_all(verb: str, args: list[str], payload: Optional[dict[str, Any]]) -> list[Key]:
    """Every attempt a request asks about: those of a ``status-many`` request's
    payload, else :func:`asked_about`'s one (or none)."""
    if verb == "status-many":
        items = (payload or {}).get("attempts")
        return (
            [str(i["attempt"]) for i in items or () if isinstance(i, dict) and i.get("attempt")]
            if isinstance(items, list)
            else []
        )
    one = asked_about(verb, args, payload)
    return [one] if one is not None else []


def _arg(args: list[str], flag: str) -> Optional[str]:
    return args[args.index(flag) + 1] if flag in args[:-1] else None


class PeerAttempts:
    """One peer's table of what it may speak of, and its violations.

    :ivar counts: violations per kind since this supervisor started (the run's note).
    :ivar last: the newest violation, said plainly (what, of which attempt).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: set[Key] = set()
        self._finished: OrderedDict[Key, None] = OrderedDict()
        self.counts: dict[str, int] = {}
        self._unflushed: dict[str, int] = {}
        self.last: Optional[str] = None
        self.last_at: Optional[float] = None
        self._flushed_at = 0.0

    def place(self, key: Key) -> None:
        """``key`` is this supervisor's on that peer: its events are kept from now on."""
        with self._lock:
            self._live.add(key)
            self._finished.pop(key, None)

    def finish(self, key: Key) -> None:
        """This supervisor is done with ``key``: its events are no longer kept."""
        with self._lock:
            self._live.discard(key)
            self._finished[key] = None
            self._finished.move_to_end(key)
            while len(self._finished) > FINISHED_KEPT:
                self._finished.popitem(last=False)

    def admits(self, key: Key) -> Optional[bool]:
        """True: keep the event; False: a late one about a finished ``key`` (drop it);
        None: ``key`` was never this supervisor's there (drop and count it)."""
        with self._lock:
            if key in self._live:
                return True
            if key in self._finished or (isinstance(key, tuple) and key[0] in self._finished):
                return False
            return None

    def violation(self, kind: str, what: str) -> None:
        """Count one message dropped as a protocol violation (``kind``: one of
        :data:`~.protocol.VIOLATION_KINDS`), ``what`` saying what it claimed."""
        assert kind in VIOLATION_KINDS, kind
        with self._lock:
            self.counts[kind] = self.counts.get(kind, 0) + 1
            self._unflushed[kind] = self._unflushed.get(kind, 0) + 1
            self.last, self.last_at = what[:300], time.time()

    def take_unflushed(self, force: bool = False) -> Optional[tuple[dict[str, int], Optional[str], Optional[float]]]:
        """(the counts since the last call, the newest, its time) to add to the store, at
        most once every :data:`FLUSH_EVERY_S` (``force``: now), or None: nothing to write."""
        now = time.monotonic()
        with self._lock:
            if not self._unflushed or (not force and now - self._flushed_at < FLUSH_EVERY_S):
                return None
            counts, self._unflushed = self._unflushed, {}
            self._flushed_at = now
            return counts, self.last, self.last_at

    def size(self) -> int:
        """How many keys the table holds (bounded by what this supervisor asked)."""
        with self._lock:
            return len(self._live) + len(self._finished)


def describe(counts: dict[str, int]) -> str:
    """``44 dropped (ended 21, log 21, reply 1, verified 1)``."""
    total = sum(counts.values())
    return f"{total} dropped ({', '.join(f'{k} {n}' for k, n in sorted(counts.items()))})"

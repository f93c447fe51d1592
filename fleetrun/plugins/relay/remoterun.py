"""``RemoteRunHandle``: a ``run`` verifier running on a peer, as the loop's verify stage
polls it. With the peer's worker, its verdict is pushed (a ``verified`` event wakes
the loop) and ``poll()`` asks nothing; without, it asks, soon at first, then at most
once a second.
"""

from __future__ import annotations

import time
from typing import Any, Optional

from ...reports import Verdict
from ...untrusted import Malformed
from . import protocol
from .transport import PeerError, PeerUnreachable

#: With a worker watching the verifier, a look of our own this rarely (a lost event).
WORKER_POLL_S = 30.0


class RemoteRunHandle:
    """A ``run`` verifier running on a peer; ``poll()`` asks it, soon at first, then
    at most once a second.

    The peer enforces the verifier's timeout itself, so a dropped link cannot leave a
    verifier running forever; while the peer cannot be asked, ``poll()`` waits.
    """

    POLL_S = (0.2, 0.4, 0.7, 1.0)  # soon at first (a quick check), then once a second

    def __init__(self, host: Any, task: Any, attempt: Any, verifier: Any, idx: int, workspace: Any) -> None:
        self.host = host
        self.args = (task, attempt, verifier, idx, workspace)
        self.verifier = verifier
        self.attempt_id = attempt.id
        self.idx = idx
        self.started = False
        self.polls = 0
        self.next_poll = time.monotonic() + self.POLL_S[0]
        self.error: Optional[str] = None
        self.verdict: Optional[Verdict] = None
        self._try_start()

    def _try_start(self) -> None:
        try:
            self.host.verify_start(*self.args)
            self.started = True
            if self._watched() is not None:  # its verdict is pushed: a look of our own only rarely
                self.next_poll = time.monotonic() + WORKER_POLL_S
        except PeerUnreachable as e:
            self.error = str(e)
            self.started = e.delivered  # it may be running: ask before starting another
        except PeerError as e:
            self.verdict = Verdict(
                False, "run", self.verifier.label, reason=f"{self.host.name} could not run it: {e}", host=self.host.name)

    def next_deadline(self) -> float:
        return self.next_poll

    def poll(self) -> Optional[Verdict]:
        if self.verdict is not None:
            return self.verdict
        now = time.monotonic()
        pushed = self._watched()
        if pushed is not None:
            r = pushed.verified.get((self.attempt_id, self.idx))
            if r is not None:
                return self._verdict(r)
            if now < self.next_poll:
                return None
            self.next_poll = now + WORKER_POLL_S
        elif now < self.next_poll:
            return None
        self.polls += 1
        self.next_poll = now + self.POLL_S[min(self.polls, len(self.POLL_S)) - 1]
        if not self.started:
            self._try_start()
            return self.verdict
        try:
            r = self.host.verify_status(self.attempt_id, self.idx)
        except PeerUnreachable as e:
            self.error = str(e)
            return None
        except PeerError as e:
            if protocol.parse_error_reply(e.reply)[1]:
                self.started = False  # never got there (or was lost): start it now
                return None
            return Verdict(False, "run", self.verifier.label, reason=f"{self.host.name}: {e}", host=self.host.name)
        except Malformed as e:  # a verdict that cannot be read is no pass
            return Verdict(False, "run", self.verifier.label, host=self.host.name,
                           reason=f"{self.host.name} gave a malformed verifier status: {e}")
        if r.state != "ended":
            return None
        return self._verdict(r)

    def _watched(self) -> Any:
        """The peer's worker, if it watches this verifier (and so pushes its verdict)."""
        w = self.host.live_worker() if hasattr(self.host, "live_worker") else None
        return w if w is not None and (self.attempt_id, self.idx) in w.vwatching else None

    def _verdict(self, r: protocol.VerifyStatus) -> Verdict:
        return Verdict(passed=r.passed, kind="run", label=self.verifier.label, reason=r.reason, output=r.output,
                       duration_s=r.duration_s, host=self.host.name)

    def cancel(self) -> None:
        try:
            self.host.verify_stop(self.attempt_id, self.idx)
        except (PeerUnreachable, PeerError):
            pass


__all__ = ["RemoteRunHandle"]

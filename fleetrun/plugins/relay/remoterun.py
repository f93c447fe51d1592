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
from .transport import VERB_TIMEOUT_S, PeerError, PeerUnreachable

#: With a worker watching the verifier, a look of our own this rarely (a lost event).
WORKER_POLL_S = 30.0
#: A verify-start not waited for: its reply wakes the loop; a look this often regardless.
STATUS_WAIT_S = 1.0


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
        self.pending: Any = None  # a verify-start sent to the worker, its reply not read yet
        self._try_start()

    def _try_start(self) -> None:
        if self._prestarted():
            return
        try:
            # through a worker, not waited for: the loop goes on with other tasks, and
            # the reply wakes it (poll() reads it then)
            r = (
                self.host.verify_start(*self.args, wait=False)
                if self._worker() is not None
                else self.host.verify_start(*self.args)
            )
            if not isinstance(r, dict):
                self.pending = r
                self.next_poll = time.monotonic() + STATUS_WAIT_S
                return
            self._started()
        except PeerUnreachable as e:
            self._start_failed(e)
        except PeerError as e:
            self._refused(e)

    def _prestarted(self) -> bool:
        """Whether the peer was asked to start it already, right after the attempt's
        collect (one request for the two): then that request is this handle's
        verify-start not waited for, its reply read by :meth:`_pending_reply`."""
        take = getattr(self.host, "take_prestarted", None)
        pre = take(self.attempt_id, self.idx) if take is not None else None
        if pre is None:
            return False
        self.pending = pre
        self.next_poll = time.monotonic() + STATUS_WAIT_S
        return True

    def _started(self) -> None:
        self.started = True
        if self._watched() is not None:  # its verdict is pushed: a look of our own only rarely
            self.next_poll = time.monotonic() + WORKER_POLL_S

    def _start_failed(self, e: PeerUnreachable) -> None:
        self.error = str(e)
        self.started = e.delivered  # it may be running: ask before starting another

    def _refused(self, e: PeerError) -> None:
        self.verdict = Verdict(
            False, "run", self.verifier.label, reason=f"{self.host.name} could not run it: {e}", host=self.host.name
        )

    def _pending_reply(self) -> bool:
        """Read the reply of a verify-start not waited for. :return: whether it is still
        to come (then poll() has nothing to say yet)."""
        p = self.pending
        if p is None:
            return False
        if not p.done() and time.monotonic() - p.began < VERB_TIMEOUT_S:
            return True
        self.pending = None
        try:
            code, answer = p.wait(0)
            self.host.verify_started(self.attempt_id, self.idx, self.host._checked("verify-start", code, answer))
            self._started()
        except PeerUnreachable as e:
            self._start_failed(e)
            self.next_poll = time.monotonic()
        except PeerError as e:
            self._refused(e)
        return False

    def next_deadline(self) -> float:
        return self.next_poll

    def poll(self) -> Optional[Verdict]:
        if self._pending_reply() or self.verdict is not None:
            return self.verdict
        now = time.monotonic()
        pushed = self._watched()
        if pushed is not None:
            r = pushed.verified.pop((self.attempt_id, self.idx), None)
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
            return Verdict(
                False,
                "run",
                self.verifier.label,
                host=self.host.name,
                reason=f"{self.host.name} gave a malformed verifier status: {e}",
            )
        if r.state != "ended":
            return None
        return self._verdict(r)

    def _worker(self) -> Any:
        return self.host.live_worker() if hasattr(self.host, "live_worker") else None

    def _watched(self) -> Any:
        """The peer's worker, if it watches this verifier (and so pushes its verdict)."""
        w = self._worker()
        return w if w is not None and (self.attempt_id, self.idx) in w.vwatching else None

    def _verdict(self, r: protocol.VerifyStatus) -> Verdict:
        done = getattr(self.host, "attempts", None)
        if done is not None:  # its verdict is in: a late event about it is no longer kept
            done.finish((self.attempt_id, self.idx))
        w = self._worker()
        if w is not None:
            w.vwatching.discard((self.attempt_id, self.idx))
        return Verdict(
            passed=r.passed and r.error is None,
            kind="run",
            label=self.verifier.label,
            reason=r.reason,
            output=r.output,
            duration_s=r.duration_s,
            host=self.host.name,
            error=r.error,
        )

    def cancel(self) -> None:
        try:
            self.host.verify_stop(self.attempt_id, self.idx)
        except (PeerUnreachable, PeerError):
            pass


__all__ = ["RemoteRunHandle"]

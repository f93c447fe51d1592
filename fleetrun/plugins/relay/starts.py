"""The handles of an attempt's start on a peer, as the loop polls them: the ``prepare``
and ``start`` requests :class:`~.host.SSHHost` sends through the peer's worker without
waiting (inside a work loop). A hundred peers' attempts start in one pass, and a pass
never waits for one peer's reply: each reply wakes the loop, which reads it here, on
its own thread, as the waited-for reply would have been read.

A reply that does not come in time is the peer's, not the loop's: it raises what the
waited-for request raises then (:class:`~.transport.PeerUnreachable`, ``delivered``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable, Optional

from ...reports import Started, Workspace
from .transport import PeerUnreachable
from .workspace import check_workspace

if TYPE_CHECKING:
    from .host import SSHHost
    from .worker import Pending


def answer_of(p: Pending, timeout: float) -> tuple[int, dict[str, Any]]:
    """A request's (exit code, reply), once it came or ``timeout`` seconds (counted from
    its sending) have passed. :raises PeerUnreachable: no reply in time, or the worker
    went away (``delivered``: the peer may have acted)."""
    if not p.done():
        try:
            p.wait(0)  # given up on: the worker's reader forgets the request
        except PeerUnreachable:
            raise PeerUnreachable(f"no reply from the worker within {timeout:g}s", delivered=True) from None
    return p.wait(0)


def due(p: Pending, timeout: float) -> bool:
    """Whether the request's reply is in, or no longer waited for."""
    return p.done() or time.monotonic() - p.began >= timeout


class PeerPrepare:
    """The :class:`~fleetrun.reports.WorkspaceHandle` of a ``prepare`` request to a peer's
    worker: the workspace it made, checked (:func:`.workspace.check_workspace`).

    One peer makes one attempt's start at a time, as when each request was waited for
    (its prepare, then its start: :attr:`.host.SSHHost.launch`): the peer's own
    ``max_tasks`` counts the attempts it started, so a second prepare sent before the
    first attempt's start would be let through to make a worktree for nothing. A prepare
    to a peer busy so is sent by a later :meth:`poll`; the peers start in parallel."""

    def __init__(self, host: SSHHost, task: Any, attempt_id: str, send: Callable[[], Pending], timeout: float) -> None:
        self.host, self.task, self.attempt_id, self.timeout = host, task, attempt_id, timeout
        self._send = send
        self.sent: Optional[Pending] = None
        self.answer: Optional[Workspace] = None
        self.try_send()

    def try_send(self) -> bool:
        """Send the request if the peer makes no other attempt's start. :return: whether
        it is sent. :raises PeerUnreachable: as the request's sending may."""
        host = self.host
        if self.sent is not None:
            return True
        if host.launch.attempt not in (None, self.attempt_id):
            return False
        try:
            self.sent = self._send()
        except PeerUnreachable as e:
            raise PeerUnreachable(f"{host.name} could not be reached: {e}", e.delivered) from None
        host.launch.begin(self.attempt_id)
        return True

    def poll(self) -> Optional[Workspace]:
        if self.answer is not None:
            return self.answer
        if not self.try_send():
            return None
        p = self.sent
        assert p is not None
        if not due(p, self.timeout):
            return None
        host = self.host
        try:
            code, reply = answer_of(p, self.timeout)
            ws = host.prepared(host._checked("prepare", code, reply))
        except PeerUnreachable as e:
            host.launch.end(self.attempt_id)
            host.unreachable(p.worker, e)
            raise PeerUnreachable(f"{host.name} could not be reached: {e}", e.delivered) from None
        except BaseException:
            host.launch.end(self.attempt_id)
            raise
        host.launch.prepared(self.attempt_id)  # its start follows in this pass, or it ends with it
        self.answer = check_workspace(self.task, ws, host.name)
        return self.answer


class Launch:
    """The attempt whose start a peer is making (its prepare, then its start, sent and
    not answered yet; :class:`PeerPrepare`), or None."""

    def __init__(self) -> None:
        self.attempt: Optional[str] = None
        self.answered = False  # its prepare's reply was read: a start may follow

    def begin(self, attempt_id: str) -> None:
        if self.attempt is None:
            self.attempt, self.answered = attempt_id, False

    def prepared(self, attempt_id: str) -> None:
        if self.attempt == attempt_id:
            self.answered = True

    def end(self, attempt_id: str) -> None:
        if self.attempt == attempt_id:
            self.attempt, self.answered = None, False

    def pass_ended(self, starting: Any) -> None:
        """The loop's pass ends: an attempt prepared in it whose start was not sent (its
        setup runs first, it was cancelled, it failed before its start) holds the peer
        no longer."""
        if self.attempt is not None and self.answered and self.attempt not in starting:
            self.end(self.attempt)


class PeerStart:
    """The :class:`~fleetrun.reports.StartHandle` of a ``start`` request sent to a peer's
    worker: the Started its reply says (``finish`` reads it as :meth:`.host.SSHHost.start`
    reads a waited-for reply: a lost one is "started, pid unknown", never a second start)."""

    def __init__(
        self,
        host: SSHHost,
        attempt_id: str,
        sent: Pending,
        timeout: float,
        finish: Callable[[Callable[[], dict[str, Any]]], Started],
    ) -> None:
        self.host, self.attempt_id, self.sent, self.timeout = host, attempt_id, sent, timeout
        self.finish = finish
        self.answer: Optional[Started] = None

    def poll(self) -> Optional[Started]:
        if self.answer is not None:
            return self.answer
        if not due(self.sent, self.timeout):
            return None
        host = self.host
        host.starting.pop(self.attempt_id, None)
        host.launch.end(self.attempt_id)  # the peer may make the next attempt's start

        def reply() -> dict[str, Any]:
            try:
                code, answer = answer_of(self.sent, self.timeout)
            except PeerUnreachable as e:
                host.unreachable(self.sent.worker, e)
                raise
            return host._checked("start", code, answer)

        self.answer = self.finish(reply)
        return self.answer


__all__ = ["Launch", "PeerPrepare", "PeerStart"]

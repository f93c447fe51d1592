"""Collecting an attempt's work on a peer: the ``collect`` verb of
:class:`~.host.SSHHost` (a mixin, apart so that ``host.py`` stays one concern), sent
through the peer's worker without waiting inside a work loop, and the
:class:`PeerCollect` handle the relay's ``fleetrun_collect_work`` returns for it."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Optional

from ...gitutil import WorktreeTampered
from ...untrusted import Malformed
from . import protocol
from .hostverify import UNTAKEN_WAIT_S
from .protocol import task_payload
from .transport import PeerError, PeerUnreachable

if TYPE_CHECKING:
    from .worker import Pending, Worker

#: How long a collect request waits for its reply (as the one-shot verb may take).
COLLECT_TIMEOUT_S = 120.0


class CollectVerbs:
    """What ``SSHHost`` runs to collect an attempt's work on its peer."""

    if TYPE_CHECKING:  # SSHHost's
        _prestarted: dict[tuple[str, int], Pending]
        last_error: Optional[str]

        def call(self, verb: str, *args: str, payload: Optional[dict[str, Any]] = None, timeout: float = ...,
                 may_connect: bool = True, wait: bool = True) -> Any: ...

        def live_worker(self) -> Optional[Worker]: ...

        def drop(self) -> None: ...

        def _checked(self, verb: str, code: int, reply: dict[str, Any]) -> dict[str, Any]: ...

        def _tampered(self, e: PeerError) -> None: ...

        def _malformed(self, verb: str, e: Malformed) -> PeerError: ...

        def _verify_payload(self, task: Any, attempt: Any, verifier: Any, idx: int,
                            workspace: Any) -> dict[str, Any]: ...

    def collect(self, task: Any, attempt: Any, workspace: Any, verify: Optional[tuple[Any, int]] = None,
                wait: bool = True) -> Any:
        """Commit the attempt's uncommitted work there; the commit, or None.

        :param verify: (verifier, step) of a ``run`` verifier to start there right after,
            in the same request, when the worker can (``chain``): the request whose answer
            comes later is kept for :meth:`take_prestarted` (the verify stage's handle
            takes it as a verify-start it did not wait for).
        :param wait: False: through a live worker, return at once the
            :class:`~.worker.Pending` request (its reply wakes the loop), for
            :meth:`collected` to read; without a worker the collect is waited for.
        :raises WorktreeTampered: the peer found the worktree's ``.git`` rewritten.
        """
        from dataclasses import asdict

        payload = {"task": task_payload(task), "attempt": asdict(attempt), "workspace": asdict(workspace)}
        key = (attempt.id, verify[1]) if verify is not None else None
        w = self.live_worker() if verify is not None or not wait else None
        if w is None:
            try:
                reply = self.call("collect", payload=payload, timeout=120)
            except PeerError as e:
                self._tampered(e)
                raise
            return self._parsed_collect(reply)
        then: Optional[tuple[str, list[str], dict[str, Any]]] = None
        if verify is not None and w.chains:
            then = ("verify-start", [], self._verify_payload(task, attempt, verify[0], verify[1], workspace))
        try:
            p = w.submit("collect", [], payload, wake=not wait, then=then)
        except PeerUnreachable as e:
            self._unreachable(w, e)
            raise
        if not wait:
            return p
        return self.collected(p, key if then is not None else None, COLLECT_TIMEOUT_S)

    def collected(self, p: Pending, key: Optional[tuple[str, int]], timeout: float) -> Optional[str]:
        """The commit of a collect request sent to the worker (see :meth:`collect`),
        waiting at most ``timeout`` seconds for its reply; the verifier started with it
        is kept under ``key``.

        :raises WorktreeTampered: the peer found the worktree's ``.git`` rewritten.
        :raises PeerUnreachable, PeerError: as :meth:`call`.
        """
        try:
            code, answer = p.wait(timeout)
        except PeerUnreachable as e:
            self._unreachable(p.worker, e)
            raise
        if code == 0 and key is not None and p.follower is not None:  # the verifier's start runs there now
            self._prestarted[key] = p.follower
        try:
            reply = self._checked("collect", code, answer)
        except PeerError as e:
            self._tampered(e)
            raise
        return self._parsed_collect(reply)

    def _unreachable(self, w: Worker, e: PeerUnreachable) -> None:
        self.last_error = str(e)
        if not w.transport.is_active():
            self.drop()

    def _parsed_collect(self, reply: dict[str, Any]) -> Optional[str]:
        try:
            return protocol.parse_collect_reply(reply)
        except Malformed as e:
            raise self._malformed("collect", e) from None


class PeerCollect:
    """The :class:`~fleetrun.reports.CollectHandle` of a collect request sent to a peer's
    worker: polled by the loop on its thread, where the reply is checked and the branch
    fetched back (:meth:`.supervisor.Relay.collected`)."""

    def __init__(self, relay: Any, task: Any, attempt: Any, workspace: Any, host: CollectVerbs, sent: Pending,
                 verify: Optional[tuple[Any, int]]) -> None:
        self.relay, self.task, self.attempt, self.workspace, self.host = relay, task, attempt, workspace, host
        self.sent = sent
        self.key = (attempt.id, verify[1]) if verify is not None and sent.follower is not None else None
        self.answer: Optional[str] = None
        relay.collects.add(self)

    def poll(self) -> Optional[str]:
        if self.answer is not None:
            return self.answer
        p = self.sent
        if not p.done() and time.monotonic() - p.began < COLLECT_TIMEOUT_S:
            return None
        self.relay.collects.discard(self)
        try:  # raises WorktreeTampered as the inline collect does
            if not p.done():
                try:
                    p.wait(0)  # given up on: the worker's reader forgets the request
                except PeerUnreachable:
                    raise PeerUnreachable(f"no reply from the worker within {COLLECT_TIMEOUT_S:g}s",
                                          delivered=True) from None
            commit = self.host.collected(p, self.key, 0)
        except (PeerUnreachable, PeerError) as e:
            self.answer = self.relay._not_collected(self.task, self.host, e)
            return self.answer
        self.answer = self.relay.collected(self.task, self.attempt, self.workspace, self.host, commit)
        return self.answer

    def settle(self) -> None:
        """The run ends before the loop read this reply (its task moved meanwhile, so the
        run had nothing left to do): read it now, within ``UNTAKEN_WAIT_S``, so that a
        verifier started with it is known, and stopped as untaken."""
        self.relay.collects.discard(self)
        try:
            self.host.collected(self.sent, self.key, max(0.0, UNTAKEN_WAIT_S - (time.monotonic() - self.sent.began)))
        except (PeerUnreachable, PeerError, WorktreeTampered):
            pass

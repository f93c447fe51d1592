"""The :class:`PeerCollect` handle the relay's ``fleetrun_collect_work`` returns for a
collect request sent to a peer's worker (:meth:`.host.SSHHost.collect` with
``wait=False``): polled by the loop, its reply read on the loop's thread."""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Optional

from ...effects import effects_of
from ...gitutil import WorktreeTampered
from .bundle import FetchError, fetch_note
from .host import COLLECT_TIMEOUT_S, UNTAKEN_WAIT_S
from .transport import PeerError, PeerUnreachable

if TYPE_CHECKING:
    from .host import SSHHost
    from .worker import Pending


class PeerCollect:
    """The :class:`~fleetrun.reports.CollectHandle` of a collect request sent to a peer's
    worker: polled by the loop on its thread, where the reply is checked and the branch
    fetched back (:meth:`.supervisor.Relay.collected`)."""

    def __init__(
        self,
        relay: Any,
        task: Any,
        attempt: Any,
        workspace: Any,
        host: SSHHost,
        sent: Pending,
        verify: Optional[tuple[Any, int]],
        fetch: bool = False,
    ) -> None:
        """:param fetch: fetch the branch back once collected, on a worker
        (:meth:`.supervisor.Relay.fetches_after_collect`), before answering."""
        self.relay, self.task, self.attempt, self.workspace, self.host = relay, task, attempt, workspace, host
        self.sent = sent
        self.fetch = fetch
        self.key = (attempt.id, verify[1]) if verify is not None and sent.follower is not None else None
        self.answer: Optional[str] = None
        #: the commit, while the branch is fetched back on a worker of :mod:`fleetrun.effects`
        self.commit: Optional[str] = None
        self.fetching: Optional[Future[dict[str, Any]]] = None
        relay.collects.add(self)

    def poll(self) -> Optional[str]:
        if self.answer is not None:
            return self.answer
        if self.fetching is not None:
            return self._fetched()
        p = self.sent
        if not p.done() and time.monotonic() - p.began < COLLECT_TIMEOUT_S:
            return None
        self.relay.collects.discard(self)
        try:  # raises WorktreeTampered as the inline collect does
            if not p.done():
                try:
                    p.wait(0)  # given up on: the worker's reader forgets the request
                except PeerUnreachable:
                    raise PeerUnreachable(
                        f"no reply from the worker within {COLLECT_TIMEOUT_S:g}s", delivered=True
                    ) from None
            commit = self.host.collected(p, self.key, 0)
        except (PeerUnreachable, PeerError) as e:
            self.answer = self.relay._not_collected(self.task, self.host, e)
            return self.answer
        relay, task = self.relay, self.task
        effects = effects_of(relay.config) if self.fetch else None
        if effects is not None:
            # the branch comes here now (a verifier here, or dependents, need it): off the
            # loop's thread, as the handoff's fetch-back, so that no pass waits on a peer's
            # bundle; its end wakes the loop, which reads it here
            self.commit = commit or ""
            self.fetching = effects.submit(relay.fetch_back, task, self.attempt, self.workspace, False)
            return None
        self.answer = relay.collected(task, self.attempt, self.workspace, self.host, commit)
        return self.answer

    def _fetched(self) -> Optional[str]:
        """The fetch-back's end, noted (a failed one too, as :meth:`.supervisor.Relay.collected`
        notes it): then the commit."""
        fut = self.fetching
        assert fut is not None
        if not fut.done():
            return None
        try:
            rec = fut.result()
        except FetchError as e:
            branch = getattr(self.workspace, "branch", None) or self.task.branch
            self.relay._note(self.task.id, f"could not fetch branch {branch} from {self.host.name}: {e}")
        else:
            self.relay._note(self.task.id, fetch_note(rec))
        self.answer = self.commit or ""
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

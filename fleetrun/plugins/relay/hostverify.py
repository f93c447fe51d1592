"""The ``run`` verifier's verbs of :class:`~.host.SSHHost` (``verify-start``,
``verify-status``, ``verify-stop``), and the start that followed an attempt's collect
request (:meth:`VerifierVerbs.take_prestarted`), apart so that ``host.py`` stays one
concern: a mixin of ``SSHHost``, which holds the connection and the worker they use."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Optional

from ...untrusted import Malformed
from . import protocol
from .protocol import task_payload
from .transport import PeerError, PeerUnreachable

if TYPE_CHECKING:
    from .worker import Pending, Worker

STATUS_TIMEOUT_S = 8.0
#: How long an untaken verifier's start may take to answer before it is left to its
#: own timeout on the peer (counted from when the collect was sent).
UNTAKEN_WAIT_S = 30.0


class VerifierVerbs:
    """What ``SSHHost`` runs for a ``run`` verifier on its peer."""

    if TYPE_CHECKING:  # SSHHost's
        passive: bool
        _prestarted: dict[tuple[str, int], Pending]

        def call(self, verb: str, *args: str, payload: Optional[dict[str, Any]] = None, timeout: float = ...,
                 may_connect: bool = True, wait: bool = True) -> Any: ...

        def live_worker(self) -> Optional[Worker]: ...

        def _malformed(self, verb: str, e: Malformed) -> PeerError: ...

    def verify_start(self, task: Any, attempt: Any, verifier: Any, idx: int, workspace: Any,
                     wait: bool = True) -> Any:
        """:param wait: False: through a worker, the :class:`~.worker.Pending` request."""
        reply = self.call("verify-start", payload=self._verify_payload(task, attempt, verifier, idx, workspace),
                          wait=wait)
        if not isinstance(reply, dict):
            return reply
        return self.verify_started(attempt.id, idx, reply)

    @staticmethod
    def _verify_payload(task: Any, attempt: Any, verifier: Any, idx: int, workspace: Any) -> dict[str, Any]:
        from dataclasses import asdict

        return {"task": task_payload(task), "attempt": asdict(attempt), "verifier": asdict(verifier), "idx": idx,
                "workspace": asdict(workspace)}

    def take_prestarted(self, attempt_id: str, idx: int) -> Optional[Pending]:
        """The ``verify-start`` that followed the attempt's ``collect`` (a request not
        waited for: its reply wakes the loop), once; None if it was not sent that way."""
        return self._prestarted.pop((attempt_id, idx), None)

    def stop_untaken(self, wait: bool) -> None:
        """Stop on the peer each verifier started with its attempt's collect that no verify
        stage took: its task moved meanwhile (cancelled while its work was collected), so
        nothing would watch it and it would run there until its own timeout. The verify
        stage takes its start in the pass of the collect, so what is left at a pass's end
        is untaken; each is stopped once its start's reply is in (a stop sent before
        would find nothing to stop).

        :param wait: wait for the replies still to come (the run ends)."""
        for key, p in list(self._prestarted.items()):
            if not (wait or p.done()):
                continue
            del self._prestarted[key]
            try:
                code, _ = p.wait(max(0.0, UNTAKEN_WAIT_S - (time.monotonic() - p.began)))
                if code == 0:
                    self.verify_stop(*key)
            except (PeerError, PeerUnreachable):
                pass  # out of reach: its own timeout ends it there

    def verify_started(self, attempt_id: str, idx: int, reply: dict[str, Any]) -> dict[str, Any]:
        """A ``verify-start`` reply, checked; its verdict will be pushed."""
        try:
            state = protocol.parse_verify_start_reply(reply)
        except Malformed as e:
            raise self._malformed("verify-start", e) from None
        w = self.live_worker()
        if w is not None:
            w.vwatching.add((attempt_id, idx))  # it pushes the verdict
        return {"state": state}

    def verify_status(self, attempt_id: str, idx: int) -> protocol.VerifyStatus:
        """:raises Malformed: a reply that is not a verifier's status (a FAIL, to the caller)."""
        r = protocol.parse_verify_status_reply(
            self.call("verify-status", "--attempt", attempt_id, "--idx", str(idx), timeout=STATUS_TIMEOUT_S,
                      may_connect=not self.passive))
        w = self.live_worker()
        if w is not None and r.state == "running":
            w.vwatching.add((attempt_id, idx))
        return r

    def verify_stop(self, attempt_id: str, idx: int) -> bool:
        try:
            return protocol.parse_verify_stop_reply(self.call("verify-stop", "--attempt", attempt_id, "--idx", str(idx)))
        except Malformed as e:
            raise self._malformed("verify-stop", e) from None

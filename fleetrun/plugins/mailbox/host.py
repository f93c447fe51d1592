"""``MailboxHost``: where a delivered attempt "runs" — a role's mailbox.

The ``mailbox`` plugin offers it through ``fleetrun_hosts`` under the name ``mailbox``;
an attempt it delivered names it (``Started.host``), so the loop polls, stops and adopts
that attempt here, as any other. ``status`` is the message's state:

- pending or claimed: ``running``;
- done: ``ended`` / ``exited`` (the summary is the handoff);
- failed: ``ended`` / ``mailbox_failed`` with the session's reason;
- pending past ``claim_timeout_secs`` (policy.toml) while no running session answers
  to the role and no process bound to it runs: withdrawn, ``ended`` /
  ``mailbox_unclaimed`` (the task is spawned next);
- claimed and not reported by the task's ``timeout_min``: withdrawn, ``ended`` /
  ``mailbox_claimed_no_completion``.

``stop`` (``fleetrun cancel``) withdraws the message, so the role cannot pick it up
later. It starts no process and offers no placement candidate.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from ... import clock
from ...hostapi import StartRefused

if TYPE_CHECKING:
    from ...config import Config
    from ...reports import Candidate, Started
    from . import store
    from .liveness import ProcTable

#: The host's name, in the ledger (``attempt.host``).
MAILBOX_HOST = "mailbox"
#: A process scan is reused this long (the loop polls every attempt every pass).
_SCAN_REUSE_S = 2.0
#: Words a withdrawn message's reason starts with, for the end its status reports.
UNCLAIMED = "unclaimed"
CLAIMED_NO_COMPLETION = "claimed_no_completion"


class MailboxHost:
    """A :class:`~fleetrun.Host` whose attempts are messages in roles' mailboxes.

    :param config: the run's config (its ledger, its policy).
    """

    name = MAILBOX_HOST
    local = True  # a delivered task works in its own cwd, on this machine

    def __init__(self, config: Config) -> None:
        self.config = config
        self.home: Path = config.home
        self._scan: Optional[tuple[float, ProcTable]] = None

    # -- what every host has -------------------------------------------------------

    def attempt_dir(self, attempt_id: str) -> Path:
        return self.home / "attempts" / attempt_id

    def log_path(self, attempt_id: str) -> Path:
        return self.attempt_dir(attempt_id) / "log"

    def candidate(self, config: Config) -> Optional[Candidate]:
        return None  # tasks are placed on machines; a mailbox is chosen after placement

    def start(self, attempt_id: str, spec: dict[str, Any], prompt: Optional[str] = None) -> Started:
        raise StartRefused("a mailbox starts no process: the mailbox plugin delivers attempts to it")

    def give_up(self, attempt_id: str) -> dict[str, Any]:
        return {}  # a delivery is recorded with its attempt in one transaction: never half-started

    # -- the message ---------------------------------------------------------------

    def conn(self) -> Any:
        from ...ledger import open_ledger

        return open_ledger(self.config).conn

    def table(self) -> ProcTable:
        from .liveness import scan

        now = time.monotonic()
        if self._scan is None or now - self._scan[0] > _SCAN_REUSE_S:
            self._scan = (now, scan())
        return self._scan[1]

    def role_live(self, role: str) -> bool:
        """Whether a session answers to ``role`` or its bound process runs."""
        from . import store  # here: the operator's verbs load this host, not its messages
        from .liveness import live_roles

        return role.lower() in live_roles(self.table(), store.roles(self.conn()))

    def _claim_timeout(self) -> float:
        from ...policy import POLICY_KEY, Policy

        policy = self.config.stash.get(POLICY_KEY) or Policy()
        return float(policy.claim_timeout_secs)

    def _timeout_of(self, task_id: str) -> float:
        from ...ledger import open_ledger

        task = open_ledger(self.config).get(task_id)
        return task.spec.timeout_min * 60.0 if task is not None else float("inf")

    def status(self, attempt_id: str, pid: Optional[int], token: Optional[str]) -> dict[str, Any]:
        from . import store  # here: the operator's verbs load this host, not its messages

        conn = self.conn()
        msg = store.message_of_attempt(conn, attempt_id)
        if msg is None:
            return {"state": "died", "error": "no mailbox message for this attempt"}
        now = clock.now()
        if msg.state == "pending":
            timeout = self._claim_timeout()
            if now - msg.created >= timeout and not self.role_live(msg.role):
                why = f"{UNCLAIMED}: role {msg.role} did not claim it in {timeout:g}s and no session answers to it"
                store.finish(conn, msg.id, "withdrawn", now, reason=why, expect=("pending",))
            msg = store.message_of_attempt(conn, attempt_id) or msg
        elif msg.state == "claimed" and msg.claimed is not None:
            limit = self._timeout_of(msg.task_id)
            if now - msg.claimed >= limit:
                why = (f"{CLAIMED_NO_COMPLETION}: role {msg.role} claimed it and reported nothing in "
                       f"{limit / 60:g} min")
                store.finish(conn, msg.id, "withdrawn", now, reason=why, expect=("claimed",))
            msg = store.message_of_attempt(conn, attempt_id) or msg
        return status_of(msg)

    def stop(self, attempt_id: str, pid: Optional[int], token: Optional[str]) -> bool:
        """Withdraw the message (a cancel): the role can no longer claim or report it."""
        from . import store  # here: the operator's verbs load this host, not its messages

        conn = self.conn()
        msg = store.message_of_attempt(conn, attempt_id)
        if msg is None:
            return False
        return store.finish(conn, msg.id, "withdrawn", clock.now(), reason="cancelled by the operator")


def status_of(msg: store.Message) -> dict[str, Any]:
    """A message as an attempt's status (:meth:`~fleetrun.Host.status`'s shape)."""
    # here: the outcomes (and the placement they import) are the loop's, not `status`'s
    from ...outcomes import (
        MAILBOX_CLAIMED_NO_COMPLETION,
        MAILBOX_FAILED,
        MAILBOX_UNCLAIMED,
        MAILBOX_WITHDRAWN,
    )

    if msg.state in ("pending", "claimed"):
        return {"state": "running", "message": msg.state}
    ended = time.time()
    if msg.state == "done":
        return {"state": "ended", "reason": "exited", "exit_code": 0, "ended": ended}
    if msg.state == "failed":
        return {"state": "ended", "reason": MAILBOX_FAILED, "exit_code": None, "ended": ended,
                "error": " ".join((msg.reason or "").split())[:300] or None}
    reason = msg.reason or ""
    word = (MAILBOX_UNCLAIMED if reason.startswith(UNCLAIMED) else
            MAILBOX_CLAIMED_NO_COMPLETION if reason.startswith(CLAIMED_NO_COMPLETION) else MAILBOX_WITHDRAWN)
    detail = reason.split(": ", 1)[1] if word != MAILBOX_WITHDRAWN and ": " in reason else reason
    return {"state": "ended", "reason": word, "exit_code": None, "ended": ended, "error": detail or None}

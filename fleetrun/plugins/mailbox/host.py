"""``MailboxHost``: where a delivered attempt "runs" — a role's mailbox.

The ``mailbox`` plugin offers it through ``fleetrun_hosts`` under the name ``mailbox``;
an attempt it delivered names it (``Started.host``), so the loop polls, stops and adopts
that attempt here, as any other. ``status`` is the message's state:

- pending or claimed: ``running``;
- done: ``ended`` / ``exited`` (the summary is the handoff);
- failed: ``ended`` / ``mailbox_failed`` with the session's reason;
- pending past ``claim_timeout_secs`` (policy.toml) while no running session answers
  to the role and no process bound to it runs, or while the sessions home for it cannot
  receive (fleetrun's Stop hook is not in the settings they started with,
  :mod:`.receiving`): withdrawn, ``ended`` / ``mailbox_unclaimed`` (the task is spawned
  next);
- claimed and not reported by the task's ``timeout_min``: withdrawn, ``ended`` /
  ``mailbox_claimed_no_completion``.

``stop`` (``fleetrun cancel``) withdraws the message, so the role cannot pick it up
later. It starts no process and offers no placement candidate.

Where a message waits is told as it changes (:meth:`MailboxHost.waits_in`): while it is
pending, the loop's polls call ``fleetrun_task_waiting`` with it (the terminal's
``waiting:`` line: a session is home and takes it when its turn ends; the session cannot
receive, and why; nobody is home), and ``fleetrun status`` shows it, or that the role
works on it once claimed, as the task's reason (``fleetrun_status_reason``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from ... import clock
from ...hostapi import StartRefused

if TYPE_CHECKING:
    from ...config import Config
    from ...reports import AgentEnd, Candidate, Started
    from . import store
    from .liveness import ProcTable
    from .receiving import Reception

#: The host's name, in the ledger (``attempt.host``).
MAILBOX_HOST = "mailbox"
#: A process scan is reused this long (the loop polls every attempt every pass).
_SCAN_REUSE_S = 2.0
#: Where a pending message waits is worked out again at most this often (it scans the
#: processes and reads the sessions' settings; the loop polls every pass).
_TELL_EVERY_S = 10.0
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
        self._receptions: Optional[tuple[float, dict[str, Reception]]] = None
        self._said: dict[str, tuple[float, str]] = {}  # attempt -> (when, where it waits), as last told

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

    def reception(self, role: str) -> Reception:
        """Whether ``role`` is live, and whether a home of it can receive (a scan is
        reused as :meth:`table`'s)."""
        from . import store  # here: the operator's verbs load this host, not its messages
        from .receiving import Reception, receptions

        table = self.table()
        if self._receptions is None or self._receptions[0] != self._scan_time():
            self._receptions = (self._scan_time(), receptions(table, store.roles(self.conn()), self.home))
        return self._receptions[1].get(role.lower()) or Reception(live=False)

    def _scan_time(self) -> float:
        return self._scan[0] if self._scan is not None else 0.0

    def _claim_timeout(self) -> float:
        from ...policy import POLICY_KEY, Policy, load_policy

        policy = self.config.stash.get(POLICY_KEY)
        if policy is None:  # `fleetrun status`: no loop read it
            try:
                policy = self.config.stash[POLICY_KEY] = load_policy(self.home / "policy.toml")
            except Exception:  # a broken policy is the loop's to report; status shows the default
                policy = Policy()
        return float(policy.claim_timeout_secs)

    def waits_in(self, msg: store.Message) -> Optional[str]:
        """Where a pending or claimed message waits, in words (None for another)."""
        if msg.state == "claimed":
            by = f" (session {msg.claimed_by_pid})" if msg.claimed_by_pid else ""
            return f"role {msg.role} works on it{by}: it reports with fleetrun mailbox done or fail"
        if msg.state != "pending":
            return None
        rec = self.reception(msg.role)
        spawned = f"spawned if nobody claims it in {self._claim_timeout():g}s"
        if rec.receives and rec.sessions:
            return f"in role {msg.role}'s mailbox: session {rec.sessions[0]} is home and takes it when its turn ends"
        if rec.receives:
            return f"in role {msg.role}'s mailbox: its bound process is home ({rec.why_live})"
        if rec.live:
            who = f"session {rec.sessions[0]}" if len(rec.sessions) == 1 else "its sessions"
            return f"in role {msg.role}'s mailbox: {who} cannot receive: {rec.problem}; {spawned}"
        return f"in role {msg.role}'s mailbox: no session is home for it; {spawned}"

    def tell(self, msg: store.Message) -> None:
        """Say where a pending message waits when that changed (the loop's ``waiting:``
        line); once claimed, the task runs: the role works on it."""
        if msg.state != "pending":
            self._said.pop(msg.attempt_id, None)
            return
        now = time.monotonic()
        last = self._said.get(msg.attempt_id)
        if last is not None and now - last[0] < _TELL_EVERY_S:
            return
        said = self.waits_in(msg)
        self._said[msg.attempt_id] = (now, said or "")
        if said is None or (last is not None and last[1] == said):
            return
        from ...ledger import open_ledger

        task = open_ledger(self.config).get(msg.task_id)
        if task is not None:
            self.config.hook.fleetrun_task_waiting(task=task, reason=said, config=self.config)

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
            rec = self.reception(msg.role) if now - msg.created >= timeout else None
            if rec is not None and not rec.receives:
                # a live session that cannot receive never claims it either: as for nobody home
                whose = f"its session cannot receive ({rec.problem})" if rec.live else "no session answers to it"
                why = f"{UNCLAIMED}: role {msg.role} did not claim it in {timeout:g}s and {whose}"
                store.finish(conn, msg.id, "withdrawn", now, reason=why, expect=("pending",))
            msg = store.message_of_attempt(conn, attempt_id) or msg
        elif msg.state == "claimed" and msg.claimed is not None:
            limit = self._timeout_of(msg.task_id)
            if now - msg.claimed >= limit:
                why = f"{CLAIMED_NO_COMPLETION}: role {msg.role} claimed it and reported nothing in {limit / 60:g} min"
                store.finish(conn, msg.id, "withdrawn", now, reason=why, expect=("claimed",))
            msg = store.message_of_attempt(conn, attempt_id) or msg
        self.tell(msg)
        return status_of(msg)

    def stop(self, attempt_id: str, pid: Optional[int], token: Optional[str]) -> bool:
        """Withdraw the message (a cancel): the role can no longer claim or report it."""
        from . import store  # here: the operator's verbs load this host, not its messages

        conn = self.conn()
        msg = store.message_of_attempt(conn, attempt_id)
        if msg is None:
            return False
        return store.finish(conn, msg.id, "withdrawn", clock.now(), reason="cancelled by the operator")


#: How an attempt delivered to a role's mailbox ended, as the ``reason`` of its host's
#: status (and its attempt's outcome): the role reported a failure (``error`` is its
#: reason); nobody claimed it in time and no session answered to the role (withdrawn:
#: the task is spawned next, a resume that uses up no retry and no resume); claimed but
#: not reported by the task's ``timeout_min``; withdrawn otherwise. (Reported done, it
#: ends ``exited``, like an agent that exited.) They are the plugin's cause words too.
MAILBOX_FAILED = "mailbox_failed"
MAILBOX_UNCLAIMED = "mailbox_unclaimed"
MAILBOX_CLAIMED_NO_COMPLETION = "mailbox_claimed_no_completion"
MAILBOX_WITHDRAWN = "mailbox_withdrawn"


def end_of(status: dict[str, Any]) -> Optional[AgentEnd]:
    """What a delivered attempt's end (its status, :func:`status_of`) means for the loop
    (:class:`~fleetrun.reports.AgentEnd`); None for a role that reported done (verified
    as an agent that exited)."""
    from ...reports import AgentEnd

    reason, error = status.get("reason"), status.get("error")
    if reason == MAILBOX_FAILED:
        return AgentEnd.give_up(f"{MAILBOX_FAILED}:{error or 'the role reported a failure'}")
    if reason == MAILBOX_UNCLAIMED:
        # the role never saw it: spawn it (not a failed attempt; no retry or resume is used)
        return AgentEnd.resume(f"{MAILBOX_UNCLAIMED}:{error or 'nobody claimed it in time'}", counted=False, ran=False)
    if reason == MAILBOX_CLAIMED_NO_COMPLETION:
        return AgentEnd.give_up(MAILBOX_CLAIMED_NO_COMPLETION)
    if reason == MAILBOX_WITHDRAWN:
        return AgentEnd.give_up(f"{MAILBOX_WITHDRAWN}:{error or 'the message was withdrawn'}", ran=False)
    return AgentEnd.ok() if status.get("reason") == "exited" else None


def status_of(msg: store.Message) -> dict[str, Any]:
    """A message as an attempt's status (:meth:`~fleetrun.Host.status`'s shape)."""
    if msg.state in ("pending", "claimed"):
        return {"state": "running", "message": msg.state}
    ended = time.time()
    if msg.state == "done":
        return {"state": "ended", "reason": "exited", "exit_code": 0, "ended": ended}
    if msg.state == "failed":
        return {
            "state": "ended",
            "reason": MAILBOX_FAILED,
            "exit_code": None,
            "ended": ended,
            "error": " ".join((msg.reason or "").split())[:300] or None,
        }
    reason = msg.reason or ""
    word = (
        MAILBOX_UNCLAIMED
        if reason.startswith(UNCLAIMED)
        else MAILBOX_CLAIMED_NO_COMPLETION
        if reason.startswith(CLAIMED_NO_COMPLETION)
        else MAILBOX_WITHDRAWN
    )
    detail = reason.split(": ", 1)[1] if word != MAILBOX_WITHDRAWN and ": " in reason else reason
    return {"state": "ended", "reason": word, "exit_code": None, "ended": ended, "error": detail or None}

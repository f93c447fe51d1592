"""``SSHHost``: a peer, reached over SSH, offering the verbs ``LocalHost`` offers.

Every verb runs ``fleetrun host VERB --json`` on the peer over one persistent
paramiko transport per peer (:mod:`.transport`: the socket, the host key, the
authentication, the channel).

A peer that cannot be reached is never reported as ``died``: the attempt may still
be running there, and the task must not run twice. ``status`` says
``unreachable`` and the loop keeps waiting.

A peer's replies are untrusted: each verb's reply goes through its parser in
:mod:`.protocol`. A malformed status is treated like a peer that could not be
read (``unreachable``, with the reason: wait, never run the task twice), a malformed
verifier status is a FAIL verdict, anything else a :class:`~.transport.PeerError`
with the reason. A ``worktree_tampered: ...`` error reply raises
:class:`~fleetrun.gitutil.WorktreeTampered`, as a tampered local worktree does.

paramiko is imported inside the functions that connect, never at import time.
"""

from __future__ import annotations

import json
import os
import shlex
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence

from ...capped import DEFAULT_MAX_BYTES
from ...gitutil import WorktreeTampered
from ...hostapi import AttemptRef, StartRefused
from ...ledger import ensure_private_dir
from ...reports import Candidate, Started
from ...untrusted import Malformed
from . import protocol
from .logmirror import MIRROR_NAME, append_chunk, complete, mirror_cap
from .logmirror import size as _size
from .peers import HostKeyRefused, Peer, record_violations
from .placed import PeerAttempts
from .protocol import (
    REFUSED_EXIT,
    WORKER_VERBS,
    parse_reply,
    remote_command,
    task_payload,
)
from .starts import Launch
from .transport import (
    VERB_TIMEOUT_S,
    PeerError,
    PeerUnreachable,
    connect,
    run_command,
)
from .worker import Pending, Worker, WorkerUnavailable

if TYPE_CHECKING:
    from ...config import Config

WORKER_RETRY_S = 300.0  # after a peer could not run a worker, the one-shot verbs this long
WORKER_SHORT_LIVED_S = 10.0  # workers gone this soon, WORKER_MAX_DEATHS in a row: the one-shot verbs
WORKER_MAX_DEATHS = 3
RETRY_CONNECT_AFTER_S = 2.0  # after a failed connection, verbs fail fast this long
BUNDLE_TIMEOUT_S = 1800.0  # a whole branch of a large repository, on a slow link
STATUS_TIMEOUT_S = 8.0
#: How long a collect request waits for its reply (as the one-shot verb may take).
COLLECT_TIMEOUT_S = 120.0
#: How long a prepare request (a ``git worktree add`` there) waits for its reply.
PREPARE_TIMEOUT_S = 120.0
#: How long an untaken verifier's start may take to answer before it is left to its
#: own timeout on the peer (counted from when the collect was sent).
UNTAKEN_WAIT_S = 30.0


# ---------------------------------------------------------------------------------
# The host


class SSHHost:
    """A peer. The same verbs as :class:`~fleetrun.hosts.LocalHost`, plus ``probe``,
    ``prepare``, ``collect``, ``cleanup`` and the ``verify_*`` verbs.

    Thread-safe: the relay's heartbeat probes from its own thread while the loop
    calls the other verbs from the main thread, over the same transport.
    """

    #: its worktrees are on the peer, not here
    local = False

    def __init__(self, peer: Peer, home: Path, relay: Any = None, worker: Optional[bool] = None) -> None:
        """:param worker: whether to run the verbs through a worker (``host serve``) where
        the peer has one; by default when a supervisor's relay holds this host (a
        ``relay add`` or ``relay peers`` asks once, and a one-shot verb is cheaper)."""
        self.peer = peer
        self.name = peer.name
        self.home = home
        self.relay = relay  # the supervisor's Relay, which knows this peer's heartbeat
        self._lock = threading.Lock()
        self._transport: Any = None
        self._status_many: Optional[bool] = None  # whether the peer answers `host status-many` (None: not known yet)
        self._retry_at = 0.0
        self.last_error: Optional[str] = None
        self.connect_s: Optional[float] = None
        self.passive = False
        self.use_worker = relay is not None if worker is None else worker
        self._worker: Optional[Worker] = None
        self._worker_lock = threading.Lock()
        self._worker_started = 0.0
        self._worker_deaths = 0
        self._no_worker_until = 0.0
        self.worker_error: Optional[str] = None  # why the one-shot verbs are used
        self._log_lock = threading.RLock()  # the log mirror is written by the worker's reader too
        #: the most of an attempt's log mirrored here; the relay sets it from [output] max_bytes
        self.mirror_cap = mirror_cap(DEFAULT_MAX_BYTES)
        self._prestarted: dict[tuple[str, int], Pending] = {}  # see take_prestarted
        #: attempt id -> the collect request's payload, from its prepare until its start,
        #: which asks the worker to run it at the attempt's end (:meth:`start`)
        self._collect_at_end: dict[str, dict[str, Any]] = {}
        #: the attempts whose start request is sent and not answered (:class:`.starts.PeerStart`):
        #: polled as ``starting`` without asking the peer
        self.starting: dict[str, Pending] = {}
        #: the attempt whose start (prepare, then start) this peer makes now (:mod:`.starts`)
        self.launch = Launch()
        #: the attempts placed there, whose events are kept; the violations counted
        self.attempts = PeerAttempts()

    # -- the connection ------------------------------------------------------------

    def transport(self, may_connect: bool = True) -> Any:
        """The open transport, connecting if needed (not sooner than
        ``RETRY_CONNECT_AFTER_S`` after a failure).

        :param may_connect: whether this call may (re)connect. The verbs the loop
            polls on every pass (``status``, ``verify_status``) do not while the host
            is ``passive`` (a heartbeat thread reconnects): while the peer is away
            they fail at once instead of blocking the loop for a connection timeout.
        """
        t = self._transport
        if t is not None and t.is_active():
            return t
        if not may_connect:
            raise PeerUnreachable(self.last_error or f"not connected to {self.name} (reconnecting)")
        with self._lock:
            t = self._transport
            if t is not None and t.is_active():
                return t
            if t is not None:
                t.close()
                self._transport = None
            if time.monotonic() < self._retry_at:
                raise PeerUnreachable(self.last_error or f"{self.name} could not be reached")
            start = time.monotonic()
            try:
                t = connect(self.peer, self.home)
            except (PeerUnreachable, HostKeyRefused) as e:
                self.last_error = str(e)
                self._retry_at = time.monotonic() + RETRY_CONNECT_AFTER_S
                raise PeerUnreachable(str(e)) from None
            self.connect_s = time.monotonic() - start
            self._transport = t
            self.last_error = None
            return t

    def drop(self) -> None:
        self.flush_violations(force=True)
        w = self._worker
        if w is not None:
            w.close("the connection was closed")
        with self._lock:
            if self._transport is not None:
                self._transport.close()
                self._transport = None

    close = drop

    def call(
        self,
        verb: str,
        *args: str,
        payload: Optional[dict[str, Any]] = None,
        timeout: float = VERB_TIMEOUT_S,
        may_connect: bool = True,
        wait: bool = True,
        at_end: Optional[tuple[str, list[str], dict[str, Any]]] = None,
    ) -> Any:
        """Run ``fleetrun host VERB --json ARGS`` there; return its JSON reply.

        :param wait: False: through a worker, return the :class:`~.worker.Pending` request
            at once (its reply wakes the loop; :meth:`_checked` it then).
        :param at_end: a start's collect, for a worker that :attr:`~.worker.Worker.collects`
            to run at the attempt's end (:meth:`start`); not sent otherwise.
        :raises PeerUnreachable: the peer could not be reached or the link dropped.
        :raises PeerError: the peer answered with an error (or no fleetrun is there).
        """
        t = self.transport(may_connect)
        w = self.worker(t) if verb in WORKER_VERBS else None
        if w is not None and verb == "status-many" and not w.many:
            w = None  # an older worker drops a verb it does not know: ask its one-shot form
        if w is not None:
            try:
                if not wait:
                    return w.submit(
                        verb,
                        list(args),
                        payload,
                        wake=True,
                        at_end=at_end if w.collects else None,
                        hold=self.relay is not None and bool(self.relay.holds()),
                    )
                code, answer = w.request(verb, list(args), payload, timeout)
            except PeerUnreachable as e:
                self.last_error = str(e)
                if not t.is_active():
                    self.drop()
                raise
            return self._checked(verb, code, answer)
        data = json.dumps(payload).encode() if payload is not None else None
        try:
            code, out, err = run_command(t, remote_command(self.peer.command, verb, list(args)), data, timeout)
        except PeerUnreachable as e:
            self.drop()
            self.last_error = str(e)
            raise
        reply = parse_reply(out)
        if reply is None:
            detail = (err or out).decode("utf-8", "replace").strip().splitlines()
            tail = detail[-1] if detail else "no output"
            cmd = shlex.join(self.peer.command)
            if code == 127 or "not found" in tail or "No such file" in tail:
                raise PeerError(
                    f"has no fleetrun: `{cmd}` was not found there ({tail}); install it, or set "
                    f"command = [...] for this peer in peers.toml",
                    code,
                )
            raise PeerError(
                f"`{cmd} host {verb}` gave no JSON reply (exit {code}): {tail}; its fleetrun may "
                "be too old to be a peer",
                code,
            )
        return self._checked(verb, code, reply)

    def _checked(self, verb: str, code: int, reply: dict[str, Any]) -> dict[str, Any]:
        """A verb's reply, or its refusal or error raised."""
        if code == REFUSED_EXIT and isinstance(reply.get("refused"), str):
            raise StartRefused(f"{self.name} {reply['refused'][:2000]}")
        if code != 0:
            msg, _ = protocol.parse_error_reply(reply)
            raise PeerError(msg if "error" in reply else f"exit {code}", code, reply)
        return reply

    # -- the worker --------------------------------------------------------------------

    def worker(self, t: Any) -> Optional[Worker]:
        """The worker on transport ``t``, started if need be; None: use the one-shot verbs
        (not wanted, the peer has none, or it could not start one lately)."""
        if not self.use_worker:
            return None
        w = self._worker
        if w is not None and w.alive and w.transport is t:
            return w
        with self._worker_lock:
            w = self._worker
            if w is not None and w.alive and w.transport is t:
                return w
            now = time.monotonic()
            if w is not None:
                self._worker = None
                w.close("replaced")
                short = t.is_active() and now - self._worker_started < WORKER_SHORT_LIVED_S
                self._worker_deaths = self._worker_deaths + 1 if short else 0
                if self._worker_deaths >= WORKER_MAX_DEATHS:  # not one more process a call: the one-shot verbs
                    self.worker_error = f"its worker went away {self._worker_deaths} times at once: {w.error}"
                    self._no_worker_until = now + WORKER_RETRY_S
                    self._worker_deaths = 0
            if now < self._no_worker_until or not self._worker_offered():
                return None
            w = Worker(
                t, self.peer.command, self.home, self.name, self._log_event, self.attempts, self.flush_violations
            )
            self._worker_started = now
            try:
                w.start()
            except WorkerUnavailable as e:
                self.worker_error = str(e)
                self._no_worker_until = time.monotonic() + WORKER_RETRY_S
                return None
            self._worker = w
            self.worker_error = None
            return w

    def live_worker(self) -> Optional[Worker]:
        """The worker, if one runs now (no starting one)."""
        w = self._worker
        return w if w is not None and w.alive else None

    def _worker_offered(self) -> bool:
        """False when this peer's last probe says it runs no worker (no ``worker`` key: an
        older fleetrun). With no probe heard yet, ``host serve`` is tried (and refused
        by an older fleetrun with a usage error)."""
        entry = self.relay.entry(self.name) if self.relay is not None else None
        probe = entry.get("probe") if isinstance(entry, dict) else None
        if isinstance(probe, dict) and probe.get("fleetrun") and probe.get("worker") is None:
            self.worker_error = "its fleetrun runs no worker (an older version)"
            return False
        return True

    def _log_event(self, attempt_id: str, chunk: protocol.LogChunk) -> None:
        self._append_log(self.log_path(attempt_id), chunk)

    def flush_violations(self, force: bool = False) -> None:
        """Add the protocol violations counted since the last write to ``peers-state.json``
        (for ``relay peers``), at most once every few seconds unless ``force``."""
        taken = self.attempts.take_unflushed(force)
        if taken is not None:
            try:
                record_violations(self.home, self.name, *taken)
            except OSError:
                pass  # a full disk: the run's own note still says it

    def _finished(self, attempt_id: str) -> None:
        """The loop has the attempt's end: its events are no longer kept (nor its state)."""
        self.attempts.finish(attempt_id)
        w = self._worker
        if w is not None:
            w.ended.pop(attempt_id, None)
            w.watching.pop(attempt_id, None)

    def _malformed(self, verb: str, e: Malformed) -> PeerError:
        """A reply that does not parse: an error of the peer's, with what is wrong."""
        return PeerError(f"`host {verb}` gave a malformed reply: {e}", 0)

    @staticmethod
    def _tampered(e: PeerError) -> None:
        """The peer refused a worktree whose ``.git`` was rewritten: the same exception
        as a tampered local worktree, so the loop gives the task to a human."""
        if str(e).startswith(protocol.TAMPERED):
            raise WorktreeTampered(str(e)[len(protocol.TAMPERED) :]) from None

    # -- LocalHost's verbs ---------------------------------------------------------

    def attempt_dir(self, attempt_id: str) -> Path:
        """The local folder of a peer attempt: its prompt, ``peer.json``, the log's mirror."""
        return self.home / "attempts" / attempt_id

    def log_path(self, attempt_id: str) -> Path:
        """The mirror of its log (:mod:`.logmirror`), apart from a local attempt's ``log``."""
        return self.attempt_dir(attempt_id) / MIRROR_NAME

    def candidate(self, config: Config) -> Optional[Candidate]:
        """This peer as a placement candidate, from its last heartbeat (None for a host
        made without the relay, as in a test)."""
        return self.relay.candidate(self.name, config) if self.relay is not None else None

    def verifies_without_waiting(self, kind: str) -> bool:
        """Whether a verifier of ``kind`` starts here without the loop waiting for the
        peer (:func:`fleetrun.hostapi.verifies_without_waiting`)."""
        return self.relay is not None and bool(self.relay.verifies_without_waiting(self, kind))

    def hands_off_without_waiting(self) -> bool:
        """Whether a DONE task's handoff is made off the loop's thread here
        (:func:`fleetrun.hostapi.hands_off_without_waiting`)."""
        return self.relay is not None and bool(self.relay.hands_off_without_waiting())

    def give_up(self, attempt_id: str) -> dict[str, Any]:
        """The peer's shepherd decides for itself (its ``host start`` refuses a second
        start): nothing to do here."""
        return {}

    def in_loop(self) -> Optional[Worker]:
        """The live worker, when a work loop runs (its requests then need not be waited
        for: their replies wake it); None: wait for each reply."""
        if self.relay is None or not getattr(self.relay, "in_session", False):
            return None
        return self.live_worker()

    def start(self, attempt_id: str, spec: dict[str, Any], prompt: Optional[str] = None) -> Any:
        """Start a shepherd there: the :class:`~fleetrun.reports.Started`, or inside a work
        loop with a live worker a :class:`.starts.PeerStart` (the request sent, its reply
        not waited for: the loop polls it).

        :raises StartRefused: the peer would not (at its ``max_tasks``, draining, the
            task already running there...); the message is the peer's reason.
        :raises PeerUnreachable: the request never reached the peer.
        """
        adir = ensure_private_dir(self.attempt_dir(attempt_id))
        spec = {k: v for k, v in spec.items() if k != "notify"}  # the supervisor's socket is not there
        task_id = (spec.get("env") or {}).get("FLEETRUN_TASK_ID") or attempt_id.rsplit("_a", 1)[0]
        if prompt is not None:
            fd = os.open(adir / "prompt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(prompt)
        payload = {"attempt_id": attempt_id, "task_id": task_id, "spec": spec, "prompt": prompt}
        collect = self._collect_at_end.pop(attempt_id, None)
        w = self.in_loop()
        if w is not None:
            from .starts import PeerStart

            if collect is not None:
                # the collects pushed for the task's earlier attempts were not taken (their
                # ends were not verified): forgotten
                for aid in [a for a in w.collected if a.rsplit("_a", 1)[0] == task_id]:
                    w.collected.pop(aid, None)
            at_end: Optional[tuple[str, list[str], dict[str, Any]]] = (
                ("collect", [], collect) if collect is not None else None
            )
            try:
                sent = self.call("start", payload=payload, wait=False, at_end=at_end)
            except BaseException:
                self.launch.end(attempt_id)
                raise
            if not isinstance(sent, dict):  # sent through the worker: its reply wakes the loop
                self.starting[attempt_id] = sent
                self.launch.begin(attempt_id)
                return PeerStart(
                    self, attempt_id, sent, VERB_TIMEOUT_S, lambda reply: self._started(attempt_id, adir, reply)
                )
            self.launch.end(attempt_id)
            return self._started(attempt_id, adir, lambda: sent)
        self.launch.end(attempt_id)
        return self._started(attempt_id, adir, lambda: self.call("start", payload=payload))

    def _started(self, attempt_id: str, adir: Path, reply_of: Any) -> Started:
        """The Started a start request's reply says (``reply_of()`` gives it, or raises)."""
        try:
            reply = protocol.parse_start_reply(reply_of())
        except PeerUnreachable as e:
            if not e.delivered:
                raise
            # The peer may have started it and the reply was lost: say "started, pid
            # unknown" and let status find out, rather than let the task run twice.
            reply = {"pid": None, "token": None, "dir": None, "uncertain": str(e)}
        except Malformed as e:  # it answered, so it may have started it: as a lost reply
            reply = {"pid": None, "token": None, "dir": None, "uncertain": f"a malformed start reply: {e}"}
        except PeerError as e:
            raise StartRefused(f"{self.name} could not start the task: {e}") from None
        w = self.live_worker()
        if w is not None and reply.get("pid"):
            w.watching[attempt_id] = {"state": "starting", "shepherd_pid": reply["pid"]}  # it pushes the end
        self._write_note(adir, {"peer": self.name, "remote_dir": reply.get("dir"), "uncertain": reply.get("uncertain")})
        return Started(
            pid=reply.get("pid"), token=reply.get("token"), dir=str(adir), info={"remote_dir": reply.get("dir")}
        )

    @staticmethod
    def _write_note(adir: Path, data: dict[str, Any]) -> None:
        from ...shepherd import write_json

        # a note for a person (nothing reads it back; the ledger has the start): not
        # fsynced, which cost ~13 ms of the loop's thread a start here, a hundred in a pass
        write_json(str(adir / "peer.json"), data, sync=False)

    def status(self, attempt_id: str, pid: Optional[int], token: Optional[str]) -> dict[str, Any]:
        """The shepherd's status there, the log mirrored as it goes; ``unreachable``
        (never ``died``) when the peer cannot be asked."""
        pushed = self._pushed(attempt_id)
        if pushed is not None:
            return pushed
        args = ["--attempt", attempt_id, "--log-offset", str(_size(self.log_path(attempt_id)))]
        if pid:
            args += ["--pid", str(pid)]
        if token:
            args += ["--token", token]
        try:
            reply = protocol.parse_status_reply(
                self.call("status", *args, timeout=STATUS_TIMEOUT_S, may_connect=not self.passive)
            )
            return self._took(attempt_id, reply)
        except (PeerUnreachable, PeerError) as e:
            return {"state": "unreachable", "error": f"{self.name}: {e}"}
        except Malformed as e:
            # not "died": the attempt may well run on there; wait, and say why
            return {"state": "unreachable", "error": f"{self.name}: a malformed status reply: {e}"}

    def _pushed(self, attempt_id: str) -> Optional[dict[str, Any]]:
        """An attempt's status as the live worker pushed it (its end, once the log's
        mirror has all of it; its last status while it runs), or None: ask the peer."""
        w = self.live_worker()
        if w is None:
            return None
        ended = w.ended.get(attempt_id)
        if ended is not None and complete(self.log_path(attempt_id), ended[1], self.mirror_cap):
            self._finished(attempt_id)
            return dict(ended[0])
        if ended is None and attempt_id in w.watching:
            return dict(w.watching[attempt_id])
        return None

    def _took(self, attempt_id: str, reply: protocol.StatusReply) -> dict[str, Any]:
        """A status reply taken in: its log chunk mirrored (the rest of the log fetched
        first when the attempt has ended: the loop reads it as soon as it sees that), and
        the worker told to push its end. :raises: what ``host log`` may."""
        log = self.log_path(attempt_id)
        chunk = reply.chunk
        self._append_log(log, chunk)
        st = dict(reply.status)
        while (
            st.get("state") in ("ended", "died")
            and chunk is not None
            and not complete(log, chunk.size, self.mirror_cap)
        ):
            chunk = protocol.parse_log_reply(
                self.call(
                    "log",
                    "--attempt",
                    attempt_id,
                    "--offset",
                    str(_size(log)),
                    timeout=STATUS_TIMEOUT_S,
                    may_connect=not self.passive,
                )
            )
            if not self._append_log(log, chunk):
                break
        w = self.live_worker()
        if st.get("state") in ("ended", "died"):
            self._finished(attempt_id)
        elif w is not None:
            w.watching[attempt_id] = st  # that worker now pushes its end
        return st

    def poll(self, attempts: Sequence[AttemptRef]) -> dict[str, dict[str, Any]]:
        """Every attempt's status in one request to the peer (``host status-many``), as
        :meth:`status` would give it. With a live worker an ended attempt's status is
        pushed and a running one's is answered from what it last pushed: those are not
        asked. A peer too old for ``status-many`` (it answers with an error) is asked
        with one ``status`` per attempt from then on."""
        out: dict[str, dict[str, Any]] = {}
        ask: list[AttemptRef] = []
        for a in attempts:
            if a.attempt_id in self.starting:  # its start's reply is still to come: nothing to ask yet
                out[a.attempt_id] = {"state": "starting"}
                continue
            pushed = self._pushed(a.attempt_id)
            if pushed is not None:
                out[a.attempt_id] = pushed
            else:
                ask.append(a)
        w = self.live_worker()
        if self._status_many is False or (w is not None and not w.many):  # an older peer, or worker
            out.update({a.attempt_id: self.status(a.attempt_id, a.pid, a.token) for a in ask})
            return out
        for i in range(0, len(ask), protocol.MAX_POLL):
            out.update(self._poll_many(ask[i : i + protocol.MAX_POLL]))
        return out

    def _poll_many(self, batch: list[AttemptRef]) -> dict[str, dict[str, Any]]:
        """One ``host status-many`` request for ``batch``; each answer taken in."""
        ids = [a.attempt_id for a in batch]
        payload = {"attempts": [{"attempt": aid, "log_offset": _size(self.log_path(aid))} for aid in ids]}
        try:
            replies = protocol.parse_status_many_reply(
                self.call("status-many", payload=payload, timeout=STATUS_TIMEOUT_S, may_connect=not self.passive), ids
            )
        except PeerUnreachable as e:
            return {aid: {"state": "unreachable", "error": f"{self.name}: {e}"} for aid in ids}
        except PeerError as e:
            # a peer older than `status-many` answers with a usage error: one `status` per
            # attempt from now on; any other error, this time (each says its own)
            if "usage: fleetrun host" in str(e) or "no JSON reply" in str(e):
                self._status_many = False
            return {a.attempt_id: self.status(a.attempt_id, a.pid, a.token) for a in batch}
        except Malformed as e:
            return {
                aid: {"state": "unreachable", "error": f"{self.name}: a malformed status-many reply: {e}"}
                for aid in ids
            }
        self._status_many = True
        out: dict[str, dict[str, Any]] = {}
        for aid in ids:
            reply = replies.get(aid)
            if reply is None:
                out[aid] = {"state": "unreachable", "error": f"{self.name}: its status-many reply left {aid} out"}
                continue
            try:
                out[aid] = self._took(aid, reply)
            except (PeerUnreachable, PeerError) as e:
                out[aid] = {"state": "unreachable", "error": f"{self.name}: {e}"}
            except Malformed as e:
                out[aid] = {"state": "unreachable", "error": f"{self.name}: a malformed log reply: {e}"}
        return out

    def _append_log(self, log: Path, chunk: Optional[protocol.LogChunk]) -> bool:
        with self._log_lock:
            return append_chunk(log, chunk, self.mirror_cap)

    def stop(self, attempt_id: str, pid: Optional[int], token: Optional[str]) -> bool:
        args = ["--attempt", attempt_id]
        if pid:
            args += ["--pid", str(pid)]
        if token:
            args += ["--token", token]
        try:
            return protocol.parse_stop_reply(self.call("stop", *args))
        except (PeerUnreachable, PeerError, Malformed) as e:
            from .peers import add_pending_stop

            add_pending_stop(self.home, self.name, attempt_id, pid, token, str(e))
            return False

    # -- the peer-only verbs -------------------------------------------------------

    def probe(
        self, timeout: float = VERB_TIMEOUT_S, may_connect: bool = True, beat_secs: Optional[float] = None
    ) -> dict[str, Any]:
        """What the peer is and has (checked: :func:`fleetrun.plugins.relay.protocol.parse_probe_reply`).

        :param beat_secs: have its worker push a probe this often from now on.
        :raises PeerError: also for a malformed reply, saying what is wrong.
        """
        payload = {protocol.BEAT_KEY: beat_secs} if beat_secs else None
        try:
            return protocol.parse_probe_reply(
                self.call("probe", timeout=timeout, may_connect=may_connect, payload=payload)
            )
        except Malformed as e:
            raise self._malformed("probe", e) from None

    def prepare(self, task: Any, attempt: Any, wait: bool = True) -> Any:
        """The workspace the peer made (its fields type-checked; whether it is the one
        asked for is the relay's to check, which knows the task).

        :param wait: False: through a live worker, the :class:`~.worker.Pending` request
            at once (its reply wakes the loop), for :meth:`prepared` to read."""
        from dataclasses import asdict

        payload = {"task": task_payload(task), "attempt": asdict(attempt)}
        if not wait and self.relay is not None and self.relay.collects_at_end():
            # its start asks the worker to collect at the attempt's end: the collect's
            # payload is this one's (the peer reads the workspace from its own record)
            for aid in [a for a in self._collect_at_end if a.rsplit("_a", 1)[0] == task.id]:
                del self._collect_at_end[aid]  # an earlier attempt's, whose start never came
            self._collect_at_end[attempt.id] = {**payload, "workspace": {}}
        reply = self.call(
            "prepare",
            payload=payload,
            timeout=PREPARE_TIMEOUT_S,
            wait=wait,
        )
        if not isinstance(reply, dict):
            return reply
        return self.prepared(reply)

    def prepared(self, reply: dict[str, Any]) -> dict[str, Any]:
        """A prepare request's reply, checked."""
        try:
            return protocol.parse_prepare_reply(reply)
        except Malformed as e:
            raise self._malformed("prepare", e) from None

    def cleanup(self, task: Any) -> dict[str, Any]:
        try:
            return protocol.parse_cleanup_reply(self.call("cleanup", payload={"task": task_payload(task)}, timeout=120))
        except Malformed as e:
            raise self._malformed("cleanup", e) from None

    def fetch_bundle(
        self,
        repo: str,
        branch: str,
        git_ref: Optional[str],
        have: list[str],
        dest: Path,
        timeout: float = BUNDLE_TIMEOUT_S,
    ) -> dict[str, Any]:
        """Have the peer send ``branch`` of its ``repo`` as a git bundle, over the open
        transport (``fleetrun host bundle``, a one-shot verb even with a worker: its reply
        is a stream of bytes): see :func:`.bundle.fetch_bundle`."""
        from .bundle import fetch_bundle

        return fetch_bundle(self, repo, branch, git_ref, have, dest, timeout)

    # -- collect: commit the attempt's work there (through the worker, not waited for, in a loop)

    def collect(
        self, task: Any, attempt: Any, workspace: Any, verify: Optional[tuple[Any, int]] = None, wait: bool = True
    ) -> Any:
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
            self.unreachable(w, e)
            raise
        if not wait:
            return p
        return self.collected(p, key if then is not None else None, COLLECT_TIMEOUT_S)

    def pushed_collect(self, attempt_id: str) -> Optional[Pending]:
        """The collect the worker ran at the attempt's end (its start asked it to) as a
        request already answered, once; None: it did not (send one)."""
        w = self.live_worker()
        answer = w.collected.pop(attempt_id, None) if w is not None else None
        if w is None or answer is None:
            return None
        p = Pending(w, wake=False)
        p.answer = answer
        p.event.set()
        return p

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
            self.unreachable(p.worker, e)
            raise
        if code == 0 and key is not None and p.follower is not None:  # the verifier's start runs there now
            self._prestarted[key] = p.follower
        try:
            reply = self._checked("collect", code, answer)
        except PeerError as e:
            self._tampered(e)
            raise
        return self._parsed_collect(reply)

    def unreachable(self, w: Worker, e: PeerUnreachable) -> None:
        self.last_error = str(e)
        if not w.transport.is_active():
            self.drop()

    def _parsed_collect(self, reply: dict[str, Any]) -> Optional[str]:
        try:
            return protocol.parse_collect_reply(reply)
        except Malformed as e:
            raise self._malformed("collect", e) from None

    # -- the run verifier's verbs, and the start that followed an attempt's collect request

    def verify_start(self, task: Any, attempt: Any, verifier: Any, idx: int, workspace: Any, wait: bool = True) -> Any:
        """:param wait: False: through a worker, the :class:`~.worker.Pending` request."""
        reply = self.call(
            "verify-start", payload=self._verify_payload(task, attempt, verifier, idx, workspace), wait=wait
        )
        if not isinstance(reply, dict):
            return reply
        return self.verify_started(attempt.id, idx, reply)

    @staticmethod
    def _verify_payload(task: Any, attempt: Any, verifier: Any, idx: int, workspace: Any) -> dict[str, Any]:
        from dataclasses import asdict

        return {
            "task": task_payload(task),
            "attempt": asdict(attempt),
            "verifier": asdict(verifier),
            "idx": idx,
            "workspace": asdict(workspace),
        }

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
            self.call(
                "verify-status",
                "--attempt",
                attempt_id,
                "--idx",
                str(idx),
                timeout=STATUS_TIMEOUT_S,
                may_connect=not self.passive,
            )
        )
        w = self.live_worker()
        if w is not None and r.state == "running":
            w.vwatching.add((attempt_id, idx))
        return r

    def verify_stop(self, attempt_id: str, idx: int) -> bool:
        try:
            return protocol.parse_verify_stop_reply(
                self.call("verify-stop", "--attempt", attempt_id, "--idx", str(idx))
            )
        except Malformed as e:
            raise self._malformed("verify-stop", e) from None


from .remoterun import RemoteRunHandle  # noqa: E402 - its home was here; tests and plugins import it from here

__all__ = ["RemoteRunHandle", "SSHHost"]

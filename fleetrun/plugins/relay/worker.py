"""The supervisor's end of a peer's worker (``fleetrun host serve``, :mod:`.peer.serve`):
one SSH exec channel on the peer's open transport, requests out, replies and events in.

A reader thread reads every line the worker sends, each read strictly
(:func:`~.protocol.parse_worker_message`). A reply goes to the thread waiting for it;
an event about an attempt this supervisor placed on the peer (:mod:`.placed`) is kept
(``ended``, ``verified``), or written to the attempt's log mirror (``log``), and the
loop is woken through its own wake-up socket, the one a local shepherd writes to: the
loop learns of a peer attempt's end as of a local one's, without asking. An event
about any other attempt, or a reply to a request never sent, is dropped and counted
(never a file, never kept). A line that does not parse, or a worker that goes away,
ends the worker: the requests waiting fail as an unreachable peer would, with the reason, and
:class:`~.host.SSHHost` starts another on its next request (or falls back to the
one-shot verbs).

paramiko is imported by :mod:`.transport`, inside the functions that connect.
"""

from __future__ import annotations

import json
import os
import queue
import select
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

from ...untrusted import Malformed
from .placed import PeerAttempts, asked_about_all
from .protocol import (
    MAX_WORKER_LINE,
    WORKER_PROTOCOL,
    LogChunk,
    VerifyStatus,
    parse_worker_message,
    remote_command,
    worker_line,
)
from .transport import PeerUnreachable

START_TIMEOUT_S = 20.0  # the worker loads fleetrun's plugins once, then says hello
#: A file to append, as JSON lines, when each request went out and its reply or each
#: event came in (``bench/peers.py`` reads it with ``host serve``'s own, :mod:`.peer.serve`).
TIMING_ENV = "FLEETRUN_RELAY_TIMING"


def subject(args: list[str], payload: Optional[dict[str, Any]]) -> Optional[str]:
    """The attempt (or task) a request is about, for the timing file."""
    if "--attempt" in args[:-1]:
        return args[args.index("--attempt") + 1]
    p = payload or {}
    att, task = p.get("attempt"), p.get("task")
    found = (
        (att.get("id") if isinstance(att, dict) else None)
        or p.get("attempt_id")
        or (task.get("id") if isinstance(task, dict) else None)
    )
    return str(found) if found else None


def time_line(path: str, **fields: Any) -> None:
    """One line of a timing file (``TIMING_ENV``): what happened, when (``time.time()``)."""
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"t": time.time(), **fields}) + "\n")
    except OSError:
        pass


class WorkerUnavailable(Exception):
    """The peer does not run a worker (an older fleetrun, a ``host serve`` that refuses,
    another protocol): use the one-shot verbs. The message says why."""


class Pending:
    """A request sent to a worker; its reply once it came (:meth:`done`, :meth:`wait`)."""

    def __init__(self, worker: Worker, wake: bool) -> None:
        self.worker = worker
        self.wake = wake
        self.id = 0
        self.event = threading.Event()
        self.answer: Optional[tuple[int, dict[str, Any]]] = None
        self.follower: Optional[Pending] = None  # the request sent to run after this one (``then``)
        self.follows = False  # this is a follower: its slot is in the worker's _following
        self.unsent = False  # the sender could not send it: the peer never had it
        self.began = time.monotonic()

    def done(self) -> bool:
        """Whether the reply came, or the worker went away (:meth:`wait` says which)."""
        return self.event.is_set()

    def wait(self, timeout: float) -> tuple[int, dict[str, Any]]:
        """(the verb's exit code, its reply), waiting at most ``timeout`` seconds.

        :raises PeerUnreachable: the worker or the link went away, or no reply came in
            time (``delivered``: it may have acted).
        """
        w = self.worker
        w.release()  # held for the pass's end: waited for, it goes now (in order)
        if not self.event.wait(timeout):
            with w._lock:  # given up on: forgotten (a follower shares its leader's id)
                table = w._following if self.follows else w._waiting
                if table.get(self.id) is self:
                    del table[self.id]
            raise PeerUnreachable(f"no reply from the worker within {timeout:g}s", delivered=True)
        if self.answer is None:
            if self.unsent:
                raise PeerUnreachable(f"could not send to the worker: {w.error}")
            raise PeerUnreachable(f"the worker is gone: {w.error}", delivered=True)
        w.rtt = time.monotonic() - self.began
        return self.answer


class Worker:
    """One worker on one transport.

    :ivar attempts: the host's table of the attempts it placed there (:mod:`.placed`):
        only their events are kept, so every table below holds only those.
    :ivar ended: attempt id -> its final status and log size, from ``ended`` events.
    :ivar verified: (attempt id, step) -> the verifier's result, from ``verified`` events.
    :ivar collected: attempt id -> the answer (code, reply) of the collect its start asked
        the worker to run at its end (``at_end``), pushed with its ``ended`` event; until
        the loop takes it (:meth:`.host.SSHHost.pushed_collect`).
    :ivar watching: attempts the worker was asked about, so it pushes their end, with
        the last status heard of each.
    :ivar rtt: the last request's round trip, seconds (a pushed heartbeat's latency).
    :ivar pushed: the newest heartbeat it pushed (a probe reply) that
        :meth:`take_pushed` has not taken; ``kick`` is set as one comes.
    """

    def __init__(
        self,
        transport: Any,
        command: list[str],
        home: Path,
        name: str,
        on_log: Callable[[str, LogChunk], None],
        attempts: Optional[PeerAttempts] = None,
        on_violation: Optional[Callable[[], None]] = None,
    ) -> None:
        self.transport = transport
        self.attempts = attempts if attempts is not None else PeerAttempts()
        self.on_violation = on_violation
        self.command = command
        self.home = home
        self.name = name
        self.on_log = on_log
        self.rtt: Optional[float] = None
        self.pushed: Optional[dict[str, Any]] = None  # the newest pushed heartbeat not yet taken
        self.kick = threading.Event()  # set by each pushed heartbeat, and as the worker ends
        self.ended: dict[str, tuple[dict[str, Any], int]] = {}
        self.verified: dict[tuple[str, int], VerifyStatus] = {}
        self.collected: dict[str, tuple[int, dict[str, Any]]] = {}
        self.collect_asked: set[str] = set()  # the attempts whose start carried their collect
        self.watching: dict[str, dict[str, Any]] = {}
        self.vwatching: set[tuple[str, int]] = set()
        self.error: Optional[str] = None
        self.info: dict[str, Any] = {}
        self.requests = 0
        self._next_id = 0
        self._lock = threading.Lock()  # ids, the waiting table
        #: the requests to send, in order, by the sender thread (:meth:`_send`): the
        #: loop's thread does not pay paramiko's send, a few ms each under load, for every
        #: request of a pass (twenty peers' verifier starts, one after the other)
        self._outbox: queue.SimpleQueue[Optional[tuple[Pending, dict[str, Any]]]] = queue.SimpleQueue()
        #: requests the loop's pass made and did not wait for, put on the sender's queue as
        #: the pass ends (:meth:`release`): their sends (paramiko's, Python holding the GIL)
        #: do not run between the pass's ends, each taking the GIL from the loop's thread
        self._held: list[tuple[Pending, dict[str, Any]]] = []
        self._waiting: dict[int, Pending] = {}
        self._following: dict[int, Pending] = {}  # request id -> the one sent to follow it
        self._hello = threading.Event()
        self._err = bytearray()
        self._channel: Any = None
        self.timing = os.environ.get(TIMING_ENV)

    @property
    def beats(self) -> bool:
        """Whether it pushes heartbeats (its hello said so)."""
        return bool(self.info.get("beats"))

    @property
    def many(self) -> bool:
        """Whether it answers ``status-many`` (its hello said so)."""
        return bool(self.info.get("many"))

    @property
    def chains(self) -> bool:
        """Whether a request may carry the one to run after it (its hello said so)."""
        return bool(self.info.get("chain"))

    @property
    def collects(self) -> bool:
        """Whether a start request may carry its attempt's collect, run at its end (its
        hello said so)."""
        return bool(self.info.get("collects"))

    @property
    def alive(self) -> bool:
        return self.error is None and self._channel is not None and self.transport.is_active()

    def start(self, timeout: float = START_TIMEOUT_S) -> None:
        """Open the channel, run ``host serve``, wait for its hello.

        :raises PeerUnreachable: the link failed.
        :raises WorkerUnavailable: it ran, and is no worker.
        """
        import paramiko

        if self.timing:
            time_line(self.timing, what="start")
        try:
            ch = self.transport.open_session(timeout=timeout)
            ch.exec_command(remote_command(self.command, "serve", []))
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise PeerUnreachable(f"cannot open a channel for the worker: {e}") from None
        self._channel = ch
        threading.Thread(target=self._read, name=f"fleetrun-worker-{self.name}", daemon=True).start()
        threading.Thread(target=self._send, name=f"fleetrun-worker-send-{self.name}", daemon=True).start()
        if not self._hello.wait(timeout):
            self.close(f"no hello from `host serve` within {timeout:g}s")
        if self.error is not None:
            raise WorkerUnavailable(self.error)

    def take_pushed(self) -> Optional[dict[str, Any]]:
        """The newest pushed heartbeat since the last call, or None."""
        self.kick.clear()
        probe, self.pushed = self.pushed, None
        return probe

    def close(self, reason: str = "closed") -> None:
        """End the worker; the requests waiting fail with ``reason``."""
        with self._lock:
            was_alive = self.error is None and self._hello.is_set()
            if self.error is None:
                self.error = reason
            for slot, _ in self._held:  # never sent: the peer never had them
                slot.unsent = True
                if slot.follower is not None:
                    slot.follower.unsent = True
            self._held = []
            waiting, self._waiting = self._waiting, {}
            following, self._following = self._following, {}
        for slot in [*waiting.values(), *following.values()]:
            slot.event.set()
        if self._channel is not None:
            try:
                self._channel.close()
            except Exception:  # noqa: BLE001 - closing a broken channel
                pass
        self._hello.set()
        self._outbox.put(None)  # the sender ends
        self.kick.set()  # a heartbeat waiting for a push asks for itself now
        if was_alive:
            self.wake()  # the loop asks again, through another worker or the one-shot verbs

    def request(
        self, verb: str, args: list[str], payload: Optional[dict[str, Any]], timeout: float
    ) -> tuple[int, dict[str, Any]]:
        """Send one request and wait for its reply: (the verb's exit code, its reply).

        :raises PeerUnreachable: the worker or the link went away, or no reply came in
            time (``delivered``: it may have acted).
        """
        return self.submit(verb, args, payload).wait(timeout)

    def submit(
        self,
        verb: str,
        args: list[str],
        payload: Optional[dict[str, Any]],
        wake: bool = False,
        then: Optional[tuple[str, list[str], dict[str, Any]]] = None,
        at_end: Optional[tuple[str, list[str], dict[str, Any]]] = None,
        hold: bool = False,
    ) -> Pending:
        """Send one request; its reply comes to the :class:`Pending` returned.

        :param wake: wake the loop when the reply comes (one that does not wait for it).
        :param then: (verb, args, payload) of a request for the worker to run after this
            one if it succeeds (:data:`~.protocol.WORKER_CHAINS`; only if it :attr:`chains`):
            its answer comes to the Pending's ``follower``, which wakes the loop.
        :param at_end: (verb, args, payload) of the collect of the attempt a ``start``
            starts, for the worker to run when it ends (:data:`~.protocol.WORKER_AT_END`;
            only if it :attr:`collects`): its answer comes with the ``ended`` event.
        :param hold: keep it until :meth:`release` (the loop's pass ends, or a request
            after it is sent, or it is waited for): sent in order all the same.
        :raises PeerUnreachable: the worker is gone. The request is sent by the sender
            thread, in order; one it could not send fails as the Pending's (``delivered``
            False: the peer never had it).
        """
        msg: dict[str, Any] = {"verb": verb, "args": args}
        if payload is not None:
            msg["payload"] = payload
        if then is not None:
            msg["then"] = {"verb": then[0], "args": then[1], "payload": then[2]}
        if at_end is not None:
            msg["at_end"] = {"verb": at_end[0], "args": at_end[1], "payload": at_end[2]}
            aid = (payload or {}).get("attempt_id")  # the attempt this start starts
            if isinstance(aid, str):
                self.collect_asked.add(aid)
        slot = Pending(self, wake)
        # the attempts it names are this supervisor's there from now on: their events,
        # which may come before the reply, are kept
        for asked in (*asked_about_all(verb, args, payload), *(asked_about_all(*then) if then is not None else ())):
            self.attempts.place(asked)
        with self._lock:
            if self.error is not None:
                raise PeerUnreachable(f"the worker is gone: {self.error}")
            self._next_id += 1
            msg["id"] = slot.id = self._next_id
            self._waiting[slot.id] = slot
            if then is not None:
                slot.follower = Pending(self, wake=True)
                slot.follower.id = slot.id
                slot.follower.follows = True
                self._following[slot.id] = slot.follower
            self.requests += 1
        if self.timing:
            time_line(self.timing, what="sent", verb=verb, id=slot.id, of=subject(args, payload))
        with self._lock:  # held or not, the requests of one thread go in the order made
            if hold and self.error is None:
                self._held.append((slot, msg))
                return slot
            self._release()
            self._outbox.put((slot, msg))
        return slot

    def held(self) -> int:
        """How many requests are held for the pass's end."""
        return len(self._held)

    def release(self) -> None:
        """The requests held (:meth:`submit`'s ``hold``) to the sender, in order."""
        if self._held:
            with self._lock:
                self._release()

    def _release(self) -> None:  # under _lock
        for item in self._held:
            self._outbox.put(item)
        self._held = []

    # -- the sender thread --------------------------------------------------------------

    def _send(self) -> None:
        """Send the requests queued, in order, until the worker ends. Not under ``_lock``:
        a send that waits for the channel's window must not keep the reader from the
        replies (and the worker from its stdin). A send that fails ends the worker: the
        requests not sent fail as never sent, those sent as the worker gone."""
        while True:
            item = self._outbox.get()
            if item is None:
                return
            slot, msg = item
            try:
                self._channel.sendall(worker_line(msg))
            except Exception as e:  # noqa: BLE001 - paramiko raises several kinds
                slot.unsent = True
                while True:  # nor was any request queued after it
                    try:
                        later = self._outbox.get_nowait()
                    except queue.Empty:
                        break
                    if later is not None:
                        later[0].unsent = True
                        if later[0].follower is not None:
                            later[0].follower.unsent = True
                if slot.follower is not None:
                    slot.follower.unsent = True
                self.close(f"could not send to the worker: {e}")
                return

    # -- the reader thread --------------------------------------------------------------

    def _read(self) -> None:
        ch = self._channel
        buf = bytearray()
        try:
            while self.error is None:
                select.select([ch], [], [], 1.0)
                while ch.recv_stderr_ready():  # read, or a chatty worker would block on it
                    self._err = (self._err + ch.recv_stderr(65536))[-4000:]
                if ch.recv_ready():
                    data = ch.recv(1 << 20)
                else:
                    data = None
                    if not self.transport.is_active():
                        return self.close("the connection dropped")
                    if not (ch.closed or ch.eof_received):
                        continue
                    data = b""
                if not data:
                    tail = self._err.decode("utf-8", "replace").strip().splitlines()
                    why = f"`host serve` exited ({tail[-1][:300]})" if tail else "`host serve` exited"
                    if ch.exit_status_ready():
                        why += f" with status {ch.recv_exit_status()}"
                    return self.close(why)
                buf += data
                while self.error is None:
                    end = buf.find(b"\n")
                    if end < 0:
                        break
                    line = bytes(buf[:end])
                    del buf[: end + 1]
                    self._line(line)
                if len(buf) > MAX_WORKER_LINE:
                    return self.close(f"a garbled message from the worker: a line over {MAX_WORKER_LINE} bytes")
        except Exception as e:  # noqa: BLE001 - a reader never raises: it ends the worker, saying why
            self.close(f"the worker's channel failed: {type(e).__name__}: {e}")

    def _line(self, line: bytes) -> None:
        if not self._hello.is_set():
            # a login shell may print before the worker starts (a chatty .bashrc): skip
            # what is not JSON until the hello; an error reply means no worker there
            try:
                first = json.loads(line)
            except (ValueError, RecursionError):
                return
            if isinstance(first, dict) and first.get("event") != "hello":
                err = first.get("error")
                return self.close(
                    f"`host serve` answered {str(err)[:300] if err else 'with no hello'}; its fleetrun "
                    "may be too old to run a worker"
                )
        try:
            m = parse_worker_message(line)
        except Malformed as e:
            return self.close(f"a garbled message from the worker: {e}")
        if self.timing and m.kind != "probe":
            time_line(self.timing, what=m.kind, id=m.id, of=m.attempt)
        if m.kind == "hello":
            info = m.info or {}
            if info.get("protocol") != WORKER_PROTOCOL:
                return self.close(f"its worker speaks protocol {info.get('protocol')}, this fleetrun {WORKER_PROTOCOL}")
            self.info = info
            self._hello.set()
            return
        if not self._hello.is_set():
            return self.close("a garbled message from the worker: a message before its hello")
        if m.kind == "reply":
            with self._lock:
                slot = self._waiting.pop(m.id, None)
            if slot is not None:
                slot.answer = (m.code, m.reply or {})
                slot.event.set()
                if slot.wake:
                    self.wake()  # the loop did not wait for it: tell it it came
            elif m.id > self._next_id:  # a late reply, given up on, is no lie: one never asked for is
                self._violation("reply", f"a reply to request {m.id}, which was never sent")
            return
        if m.kind == "then":
            with self._lock:
                slot = self._following.pop(m.id, None)
            if slot is not None:
                slot.answer = (m.code, m.reply or {})
                slot.event.set()
                self.wake()  # the loop did not wait for it
            elif m.id > self._next_id:
                self._violation("then", f"the answer to a request following request {m.id}, which was never sent")
            return
        if m.kind == "probe" and m.probe is not None:
            self.pushed = m.probe  # a heartbeat: the heartbeat thread's, not the loop's
            self.kick.set()
            return
        if m.kind == "log" and m.chunk is not None:
            if self._admits("log", m.attempt):
                self.on_log(m.attempt, m.chunk)
            return
        if m.kind == "ended" and m.status is not None:
            if not self._admits("ended", m.attempt):
                return
            asked = m.attempt in self.collect_asked
            self.collect_asked.discard(m.attempt)
            if m.collect is not None:
                if asked:  # before the end: the loop that reads the end finds its collect
                    self.collected[m.attempt] = m.collect
                else:  # kept only as asked for: the end counts, the collect nobody asked for does not
                    self._violation("ended", f"a collect pushed with the end of attempt {m.attempt}, never asked for")
            self.ended[m.attempt] = (m.status, m.size)
        elif m.kind == "verified" and m.verify is not None:
            if not self._admits("verified", (m.attempt, m.idx)):
                return
            self.verified[(m.attempt, m.idx)] = m.verify
        self.wake()

    def _admits(self, kind: str, key: str | tuple[str, int]) -> bool:
        """Whether an event about ``key`` is kept: only for what this supervisor placed
        there; about anything else it is dropped, and counted unless it is a late one
        about an attempt this supervisor is done with."""
        ok = self.attempts.admits(key)
        if ok is None:
            what = f"attempt {key}" if isinstance(key, str) else f"step {key[1]} of attempt {key[0]}"
            self._violation(kind, f"a {kind} event for {what}, which this supervisor never placed there")
        return bool(ok)

    def _violation(self, kind: str, what: str) -> None:
        self.attempts.violation(kind, what)
        if self.on_violation is not None:
            self.on_violation()

    def wake(self) -> None:
        """Wake this machine's loop, as a local shepherd does when its agent ends."""
        wake_loop(self.home)


def wake_loop(home: Path) -> None:
    """Wake the loop of ``home`` (a datagram to its wake-up socket), never waiting."""
    from ...liveness import sock_path

    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            # never waited on: a full queue means the loop has wake-ups to read, and
            # a reader blocked here could not read the reply the busy loop waits for
            s.sendto(b"peer", socket.MSG_DONTWAIT, sock_path(home))
        finally:
            s.close()
    except OSError:
        pass  # no loop listening (a `relay peers`, a test), or it is woken already

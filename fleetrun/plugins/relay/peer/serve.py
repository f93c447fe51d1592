"""``fleetrun host serve``: the long-lived worker, one per supervisor and peer, on one
SSH channel (pytest-xdist's worker over execnet, in shape).

Both ways, one JSON object a line (:mod:`fleetrun.plugins.relay.protocol`): the
supervisor sends requests ``{"id", "verb", "args", "payload"}``, the same verbs and
arguments as the one-shot ``fleetrun host VERB`` with the JSON it would read on stdin;
the worker answers each with ``{"id", "code", "reply"}``, the one-shot verb's exit code
and reply, computed by the same functions (:func:`.verbs.answer`), so every check of an
untrusted id or path holds here as it does there. Requests run each in a thread of its
own: a long ``prepare`` does not hold up a ``status``. A request may carry a second one
(``then``, :data:`~..protocol.WORKER_CHAINS`: a ``collect`` its ``verify-start``), run
in the same thread once the first is answered, if it succeeded; its answer is pushed
(``{"event": "then", "id", "code", "reply"}``): one round trip for the two, and the
first's reply does not wait for the second (the hello says ``"chain": 1``). A ``start``
may carry its attempt's ``collect`` (``at_end``, :data:`~..protocol.WORKER_AT_END`), run
in a thread of its own as soon as the agent exits 0, its answer pushed with the
``ended`` event (the hello says ``"collects": 1``): the supervisor sends no collect.

And it pushes events: ``hello`` first (``"beats": 1``: it pushes heartbeats); then
``probe`` (its headroom, the reply a ``probe`` request gets) every ``beat_secs`` once a
``probe`` request asked for that, so the supervisor sends no request to hear that the
peer is there; and, for each attempt and verifier it was asked
about (``start``, ``status``, ``verify-start``, ``verify-status``), ``log`` chunks as the
log grows and ``ended``/``verified`` once it is over. It learns of an end as the local
loop does: a pidfd of the shepherd (or of the verifier's runner) is readable the moment
it exits, and a shepherd the worker started writes to the worker's own wake-up socket
as soon as its status says so (as a local one writes to the loop's); a once-a-second
look at the same files covers what has neither.

The shepherds do not depend on the worker: when the channel goes (the link dropped, the
supervisor restarted), stdin ends, the worker exits, and a new worker finds the
attempts from the same files.
"""

from __future__ import annotations

import argparse
import base64
import os
import select
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Optional

from fleetrun.untrusted import Malformed

from ..protocol import (
    MAX_WORKER_LINE,
    WORKER_PROTOCOL,
    beat_secs,
    parse_worker_request,
    worker_line,
)
from .request import NOTIFY, PAYLOAD, HasHome

TICK_S = 1.0  # log chunks and the look at attempts without a pidfd, this often
TRACE_ENV = "FLEETRUN_SERVE_TRACE"  # a file to append each request's verb to (tests, debugging)
#: A file to append each request's arrival and answer, and each end heard and pushed,
#: with its time, as JSON lines (``bench/peers.py``; the supervisor's side is ``worker.TIMING_ENV``).
TIMING_ENV = "FLEETRUN_SERVE_TIMING"


@dataclass
class Watch:
    """An attempt (``idx`` None) or a verifier the supervisor waits for."""

    attempt: str
    idx: Optional[int]
    sent: int = 0  # log bytes the supervisor has
    fd: Optional[int] = None  # a pidfd of the shepherd or runner
    fresh: bool = True
    #: the collect its start asked for at its end (``at_end``): run once its agent exits 0,
    #: its answer pushed with the ``ended`` event
    at_end: Any = None


def serve(config: HasHome) -> int:
    """Serve requests on stdin until it ends. :return: the exit code."""
    return Worker(config).run()


def _wake_socket(config: HasHome) -> tuple[Optional[socket.socket], Optional[str]]:
    """A datagram socket of this worker's own (0600), for its shepherds to write to."""
    path = str(config.home / f"serve-{os.getpid()}.sock")
    if len(path.encode()) >= 100:  # a unix socket's path must be short
        import hashlib
        import tempfile

        digest = hashlib.sha1(str(config.home).encode()).hexdigest()[:16]
        path = os.path.join(tempfile.gettempdir(), f"fleetrun-{os.getuid()}-{digest}-serve-{os.getpid()}.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        s.bind(path)
        os.chmod(path, 0o600)
    except OSError:
        s.close()
        return None, None  # the pidfds and the once-a-second look still hear of every end
    s.setblocking(False)
    return s, path


def _sent(reply: dict[str, Any], offset: int) -> int:
    """How much of an attempt's log a status reply has sent: where its chunk ends."""
    if isinstance(reply.get("log"), str):
        return int(reply.get("log_offset") or 0) + len(base64.b64decode(reply["log"]))
    return offset


def _at_end(req: Any, attempt: str) -> Any:
    """The collect a start request asks for at its attempt's end, when it is about that
    attempt (a collect of another is the supervisor's bug: not run, said on stderr)."""
    import json

    end = req.at_end
    if end is None:
        return None
    try:
        named = json.loads(end.payload or b"{}").get("attempt", {}).get("id")
    except (ValueError, AttributeError):
        named = None
    if named != attempt:
        print(f"fleetrun host serve: a start's at_end is not about attempt {attempt}; not run", file=sys.stderr)
        return None
    return end


def _pidfd(pid: Any, token: Any) -> Optional[int]:
    """A pidfd of ``pid`` if it is still the process with that start-time token."""
    from fleetrun.shepherd import proc_token

    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0 or not isinstance(token, str):
        return None
    if not hasattr(os, "pidfd_open") or proc_token(pid) != token:
        return None
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return None
    if proc_token(pid) != token:  # reused between the two looks: not ours
        os.close(fd)
        return None
    return fd


class Worker:
    def __init__(self, config: HasHome) -> None:
        self.config = config
        # the protocol owns stdout: whatever else prints (a hook, a plugin) goes to stderr
        self.out_fd = os.dup(1)
        os.dup2(2, 1)
        sys.stdout = sys.stderr
        self.inp = 0
        self.out_lock = threading.Lock()
        self.pending: list[Watch] = []
        self.pending_lock = threading.Lock()
        self.wake_r, self.wake_w = os.pipe()
        self.watches: dict[tuple[str, Optional[int]], Watch] = {}
        self.gone = False
        self.trace = os.environ.get(TRACE_ENV)
        self.timing = os.environ.get(TIMING_ENV)
        self.sock, self.sock_path = _wake_socket(config)
        self.beat_every: Optional[float] = None  # push a probe this often (a probe request asked)
        self.next_beat = 0.0
        self.beating = False  # a pushed probe is being measured
        self.parser: Optional[argparse.ArgumentParser] = None
        self.parser_lock = threading.Lock()

    def time(self, **fields: Any) -> None:
        if self.timing:
            import json

            try:
                with open(self.timing, "a", encoding="utf-8") as f:
                    f.write(json.dumps({"t": time.time(), **fields}) + "\n")
            except OSError:
                pass

    def send(self, message: dict[str, Any]) -> None:
        if self.timing and (message.get("event") in ("ended", "verified", "then") or "id" in message):
            self.time(what="push", event=message.get("event", "reply"), id=message.get("id"), of=message.get("attempt"))
        data = memoryview(worker_line(message))
        with self.out_lock:
            try:
                while data:
                    data = data[os.write(self.out_fd, data) :]
            except OSError:  # the channel is gone: so is the supervisor
                self.gone = True
                os.write(self.wake_w, b"x")

    def run(self) -> int:
        from fleetrun import __version__

        self.send(
            {
                "event": "hello",
                "protocol": WORKER_PROTOCOL,
                "fleetrun": __version__,
                "pid": os.getpid(),
                "beats": 1,
                "chain": 1,
                "many": 1,
                "collects": 1,
            }
        )
        try:
            return self.loop()
        finally:
            if self.sock is not None:
                self.sock.close()
                try:
                    os.unlink(str(self.sock_path))
                except OSError:
                    pass

    def loop(self) -> int:
        buf = bytearray()
        next_tick = time.monotonic() + TICK_S
        while not self.gone:
            fds = [self.inp, self.wake_r, *(w.fd for w in self.watches.values() if w.fd is not None)]
            if self.sock is not None:
                fds.append(self.sock.fileno())
            wake_at = min(next_tick, self.next_beat) if self.beat_every else next_tick
            ready, _, _ = select.select(fds, [], [], max(0.0, wake_at - time.monotonic()))
            if self.inp in ready:
                data = os.read(self.inp, 1 << 20)
                if not data:
                    return 0  # the channel closed; the shepherds go on without us
                buf += data
                while True:
                    end = buf.find(b"\n")
                    if end < 0:
                        break
                    line = bytes(buf[:end])
                    del buf[: end + 1]
                    if line.strip():
                        self.request(line)
                if len(buf) > MAX_WORKER_LINE:
                    print(
                        f"fleetrun host serve: a request line over {MAX_WORKER_LINE} bytes; giving up", file=sys.stderr
                    )
                    return 4
            if self.wake_r in ready:
                os.read(self.wake_r, 4096)
            if self.sock is not None and self.sock.fileno() in ready:
                self.heard()
            with self.pending_lock:
                new, self.pending = self.pending, []
            for w in new:
                old = self.watches.get((w.attempt, w.idx))
                if old is not None:
                    old.sent, old.fresh = w.sent, True
                    old.at_end = old.at_end or w.at_end
                else:
                    self.watches[(w.attempt, w.idx)] = w
            if self.beat_every and time.monotonic() >= self.next_beat and not self.beating:
                self.next_beat = time.monotonic() + self.beat_every
                self.beating = True  # measured in a thread: psutil and the tools' cache take a while
                threading.Thread(target=self.beat, name="serve-beat", daemon=True).start()
            tick = time.monotonic() >= next_tick
            if tick:
                next_tick = time.monotonic() + TICK_S
            for key, w in list(self.watches.items()):
                if tick or w.fresh or (w.fd is not None and w.fd in ready):
                    w.fresh = False
                    if self.check(w):
                        if w.fd is not None:
                            os.close(w.fd)
                        del self.watches[key]
        return 0

    def heard(self) -> None:
        """A shepherd said its agent ended: look at that attempt now."""
        assert self.sock is not None
        while True:
            try:
                name = self.sock.recv(256).decode("utf-8", "replace")
            except (BlockingIOError, OSError):
                return
            w = self.watches.get((name, None))
            self.time(what="heard", of=name)
            if w is not None:  # any other datagram is nobody's: ignored
                w.fresh = True

    def beat(self) -> None:
        """Push this peer's headroom: what a ``probe`` request would be answered."""
        from .verbs import answer

        try:
            ns = self.parse("probe", [])
            assert ns is not None
            reply, code = answer(self.config, ns)
        finally:
            self.beating = False
        if code == 0:
            self.send({"event": "probe", "probe": reply})

    # -- requests ----------------------------------------------------------------------

    def request(self, line: bytes) -> None:
        try:
            req = parse_worker_request(line)
        except Malformed as e:
            # no id to answer to is the supervisor's bug: say so where it can be read
            print(f"fleetrun host serve: a malformed request: {e}", file=sys.stderr)
            return
        if self.trace:  # one line a request; a chained one's verbs on its line
            with open(self.trace, "a", encoding="utf-8") as f:
                f.write(req.verb + (f" {req.then.verb}" if req.then is not None else "") + "\n")
        self.time(what="recv", verb=req.verb, id=req.id)
        threading.Thread(target=self.handle, args=(req,), name=f"serve-{req.id}", daemon=True).start()

    def parse(self, verb: str, args: list[str]) -> Optional[argparse.Namespace]:
        """A request's verb and arguments as the one-shot verb reads them (one parser for
        the worker's life: building it costs more than most requests); None: bad ones."""
        with self.parser_lock:
            if self.parser is None:
                from .verbs import _parser

                self.parser = _parser()
            try:
                return self.parser.parse_args([verb, *args])
            except SystemExit:
                return None

    def handle(self, req: Any) -> None:
        ns, reply, code = self.run_verb(req)
        self.send({"id": req.id, "code": code, "reply": reply})
        every = beat_secs(req.payload) if req.verb == "probe" else None
        if every is not None:  # from now on pushed, counted from this answer
            self.next_beat, self.beat_every = time.monotonic() + every, every
            os.write(self.wake_w, b"b")
        self.watch(req, ns, reply, code)
        if req.then is not None:  # its follower, once the first is answered: its answer pushed
            if code == 0:
                ns, reply, code = self.run_verb(req.then)
            else:
                ns, reply, code = None, {"error": f"not run: {req.verb} failed"}, 1
            self.send({"event": "then", "id": req.id, "code": code, "reply": reply})
            self.watch(req.then, ns, reply, code)

    def watch(self, req: Any, ns: Optional[argparse.Namespace], reply: dict[str, Any], code: int) -> None:
        if code != 0 or ns is None:
            return
        if req.verb == "status-many":  # each attempt polled, as a `status` of its own would be
            found = [
                Watch(aid, None, _sent(r, 0)) for aid, r in (reply.get("statuses") or {}).items() if isinstance(r, dict)
            ]
        else:
            one = self.watch_for(req, ns, reply)
            found = [one] if one is not None else []
        if found:
            with self.pending_lock:
                self.pending.extend(found)
            os.write(self.wake_w, b"w")

    def run_verb(self, req: Any) -> tuple[Optional[argparse.Namespace], dict[str, Any], int]:
        """(the parsed request, the verb's reply, its exit code)."""
        from .verbs import answer

        PAYLOAD.set(req.payload if req.payload is not None else b"{}")  # this thread's context only
        NOTIFY.set(self.sock_path)
        ns = self.parse(req.verb, req.args)
        if ns is None:
            return None, {"error": f"usage: bad arguments for {req.verb}"}, 4
        reply, code = answer(self.config, ns)
        return ns, reply, code

    def watch_for(self, req: Any, ns: argparse.Namespace, reply: dict[str, Any]) -> Optional[Watch]:
        """What the supervisor now waits for, from a request that succeeded (so its ids
        passed the verb's checks)."""
        import json

        if req.verb == "status":
            return Watch(ns.attempt, None, _sent(reply, ns.offset or 0))
        if req.verb == "start":
            attempt = str(json.loads(req.payload)["attempt_id"])
            return Watch(attempt, None, 0, at_end=_at_end(req, attempt))
        if req.verb == "verify-status" and reply.get("state") == "running":
            return Watch(ns.attempt, int(ns.idx))
        if req.verb == "verify-start":
            p = json.loads(req.payload)
            return Watch(str(p["attempt"]["id"]), int(p["idx"]))
        return None

    # -- events --------------------------------------------------------------------------

    def check(self, w: Watch) -> bool:
        """Push what is new of ``w``. :return: whether it is over (and pushed as such)."""
        if w.idx is not None:
            return self.check_verifier(w)
        from .verbs import _log_chunk, _shepherd, _status

        if w.fd is None:
            w.fd = _pidfd(*_shepherd(self.config, w.attempt))
        st = _status(self.config, w.attempt)
        log = self.config.home / "attempts" / w.attempt / "log"
        over = st.get("state") in ("ended", "died")
        while True:  # all of the log before "ended": the supervisor reads it then
            chunk = _log_chunk(log, w.sent)
            data = base64.b64decode(chunk["log"])
            if data:
                self.send({"event": "log", "attempt": w.attempt, **chunk})
                w.sent += len(data)
            if not over or not data or w.sent >= chunk["log_size"]:
                break
        if over:
            ended = {"event": "ended", "attempt": w.attempt, "status": st, "log_size": w.sent}
            if w.at_end is not None and st.get("state") == "ended" and st.get("exit_code") == 0:
                # its collect now, in a thread of its own (git takes a while), and the end
                # pushed with the collect's answer: the supervisor, which would send this
                # collect as it heard of the end, sends none (an agent that failed is not
                # collected: its task is retried or resumed, not verified)
                threading.Thread(
                    target=self.collect_at_end, args=(w.at_end, ended), name="serve-at-end", daemon=True
                ).start()
            else:
                self.send(ended)
        return over

    def collect_at_end(self, req: Any, ended: dict[str, Any]) -> None:
        """Run the collect an attempt's start asked for at its end; push its end with the
        collect's answer, as the collect's reply would have come."""
        self.time(what="at_end", verb=req.verb, of=ended["attempt"])
        _, reply, code = self.run_verb(req)
        self.send({**ended, "collect": {"code": code, "reply": reply}})

    def check_verifier(self, w: Watch) -> bool:
        from fleetrun.shepherd import read_json

        from .request import HostError
        from .runner import _verify_dir, cmd_verify_status

        ns = argparse.Namespace(attempt=w.attempt, idx=w.idx)
        if w.fd is None:
            r = read_json(str(_verify_dir(self.config, w.attempt, int(w.idx or 0)) / "runner.json")) or {}
            w.fd = _pidfd(r.get("pid"), r.get("token"))
        try:
            res = cmd_verify_status(self.config, ns)
        except HostError:
            return False  # not started yet: the next look
        if res.get("state") != "ended":
            return False
        self.send({"event": "verified", "attempt": w.attempt, "idx": w.idx, "result": res})
        return True

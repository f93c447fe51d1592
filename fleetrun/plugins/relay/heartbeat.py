"""The heartbeat thread of each peer: it hears from the peer every ``heartbeat_secs``
(the headroom its worker pushes, or a probe of its own) and records what it heard in
``peers-state.json``, where placement and ``relay peers`` read it."""

from __future__ import annotations

import threading
import time
from typing import Any, Optional

from .beatinfo import post_heartbeat
from .host import SSHHost
from .peers import checked_entry, clear_pending_stop, load_state, record_probe
from .transport import PeerError, PeerUnreachable
from .worker import wake_loop


def probe_error(e: Exception) -> str:
    """A failed probe, phrased to follow the peer's name."""
    if isinstance(e, PeerUnreachable):
        return f"could not be reached: {e}"
    text = str(e)
    if text.startswith(("has no fleetrun", "gave no JSON")):
        return text
    return f"answered its probe with an error: {text}"


class Heartbeat(threading.Thread):
    """Hears from one peer every ``interval`` seconds and records it
    (``peers-state.json``). A peer's worker pushes its headroom that often (asked for by
    the first probe through it), so a round only takes what was pushed; a round with
    nothing pushed, or no worker, probes over the open transport. A failed probe keeps
    the last reply, so the peer turns stale once that reply is older than
    ``stale_after_secs``."""

    def __init__(self, host: SSHHost, home: Any, interval: float) -> None:
        super().__init__(name=f"fleetrun-heartbeat-{host.name}", daemon=True)
        self.host = host
        self.home = home
        self.interval = interval
        self.entry: dict[str, Any] = checked_entry(load_state(home).get(host.name))[0]
        self.first_done = threading.Event()
        self.started_at = time.monotonic()  # placement waits for a first round only so long
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            began = time.monotonic()
            try:
                seconds = self.beat()
            except Exception as e:  # a heartbeat never takes the loop down
                self.entry = dict(self.entry, error=f"heartbeat failed: {type(e).__name__}: {e}", error_at=time.time())
                seconds = None
            if not self.first_done.is_set():
                self.first_done.set()
                wake_loop(self.home)  # the peer may take tasks now: place them at once
            post_heartbeat(self.host, self.entry, time.monotonic() - began if seconds is None else seconds)
            self.wait_next()

    def wait_next(self) -> None:
        """Until the next push, or (none due) the next round of our own. A push later
        than a round and a half is not waited for: the next round probes, which says
        whether the peer is still there."""
        w = self.host.live_worker()
        if w is None or not w.beats:
            self._halt.wait(self.interval)
        else:
            w.kick.wait(self.interval * 1.5)  # set by a push, and by the worker's end (a halt closes it)

    def beat(self) -> Optional[float]:
        """One round. :return: its latency when it was a pushed heartbeat (the last
        request's round trip), None when it was this call's probe."""
        w = self.host.live_worker()
        pushed = w.take_pushed() if w is not None else None
        if pushed is not None:
            self.entry = record_probe(self.home, self.host.name, pushed)
            latency = w.rtt if w is not None else None
        else:
            try:
                probe = self.host.probe(
                    timeout=max(5.0, min(15.0, 2 * self.interval)), may_connect=True, beat_secs=self.interval
                )
            except (PeerUnreachable, PeerError) as e:
                if not self._halt.is_set():
                    self.entry = record_probe(self.home, self.host.name, None, error=probe_error(e))
                return None
            self.entry = record_probe(self.home, self.host.name, probe)
            latency = None
        for attempt_id, s in (checked_entry(self.entry)[0].get("pending_stops") or {}).items():
            try:  # `cancel` could not reach it: stop the attempt now
                args = [
                    "--attempt",
                    attempt_id,
                    *(["--pid", str(s["pid"])] if s.get("pid") else []),
                    *(["--token", s["token"]] if s.get("token") else []),
                ]
                self.host.call("stop", *args, may_connect=True)
            except (PeerUnreachable, PeerError):
                break
            clear_pending_stop(self.home, self.host.name, attempt_id)
        return latency

    def halt(self) -> None:
        self._halt.set()
        w = self.host.live_worker()
        if w is not None:
            w.kick.set()

"""Built-in ``relay`` plugin: peers over SSH as places where attempts run.

``fleetrun_configure`` reads ``peers.toml`` and registers an
:class:`~fleetrun.sshhost.SSHHost` per peer in ``config.stash["hosts"]`` (so the loop,
``cancel`` and adoption find them by name) and a :class:`Relay` object under the
name ``relay-peers``, which implements the hooks:

- ``fleetrun_candidates``: every peer, with the headroom of its last heartbeat (a
  probe every ``[relay] heartbeat_secs``, 5 by default, from one thread per peer),
  ``live``/``stale``/``never`` by policy.toml's ``stale_after_secs``, and the
  ``[peers]``/``[peers.NAME]`` limits. A peer without a usable fleetrun, or one
  that did not answer its last probe, says why it takes nothing.
- ``fleetrun_place`` (a wrapper): while a peer's first heartbeat is on its way, a
  task that cannot be placed yet is not a reason for the run to call itself idle.
  (Tasks with a ``role`` or a ``brain``/``agent`` verifier stay on this machine: the
  ``placement`` plugin pins them there.)
- ``fleetrun_prepare_workspace``, ``fleetrun_collect_work``, ``fleetrun_verify``
  (``run``), ``fleetrun_cleanup_workspace`` for an attempt on a peer run there, over
  SSH (``tryfirst``, so the local ``worktree`` and ``verify_run`` never see it).
- ``fleetrun_handoff``: names the branch on the peer and how to fetch it.

Nothing here imports paramiko unless a peer is actually contacted.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any, Optional

from ..exceptions import UsageError
from ..hookimpl import hookimpl
from ..peers import (
    Peer,
    clear_pending_stop,
    load_peers,
    load_state,
    record_probe,
    status_of,
    unusable_reason,
)
from ..reports import Candidate, Handoff, Verdict, Wait, Workspace
from ..sshhost import PeerError, PeerUnreachable, RemoteRunHandle, SSHHost
from ..states import ACTIVE, State

HEARTBEAT_S = 5.0
SUMMARY_LIMIT = 2000


@hookimpl(trylast=True)
def fleetrun_configure(config: Any) -> None:
    try:
        peers = load_peers(config.home)
    except UsageError:
        if config.getoption("verb") in ("run", "work", "relay"):
            raise
        return  # `status`, `host`... still work with a broken peers.toml
    if not peers:
        return
    relay = Relay(config, peers)
    config.pluginmanager.register(relay, "relay-peers")
    config.stash.setdefault("hosts", {}).update(relay.hosts)


@hookimpl(trylast=True)
def fleetrun_unconfigure(config: Any) -> None:
    relay = config.pluginmanager.get_plugin("relay-peers")
    if relay is not None:
        relay.close()
        config.pluginmanager.unregister(relay)


def fetch_url(peer: Peer, repo: str) -> str:
    """``ssh://user@host:port/path``: what ``git fetch`` needs to reach the peer's repo."""
    return f"ssh://{peer.address}{repo if repo.startswith('/') else '/' + repo}"


def probe_error(e: Exception) -> str:
    """A failed probe, phrased to follow the peer's name."""
    if isinstance(e, PeerUnreachable):
        return f"could not be reached: {e}"
    text = str(e)
    if text.startswith(("has no fleetrun", "gave no JSON")):
        return text
    return f"answered its probe with an error: {text}"


class Heartbeat(threading.Thread):
    """Probes one peer every ``interval`` seconds over its open transport and records
    what it heard (``peers-state.json``). A failed probe keeps the last reply, so the
    peer turns stale once that reply is older than ``stale_after_secs``."""

    def __init__(self, host: SSHHost, home: Any, interval: float) -> None:
        super().__init__(name=f"fleetrun-heartbeat-{host.name}", daemon=True)
        self.host = host
        self.home = home
        self.interval = interval
        self.entry: dict[str, Any] = dict(load_state(home).get(host.name) or {})
        self.first_done = threading.Event()
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                self.beat()
            except Exception as e:  # a heartbeat never takes the loop down
                self.entry = dict(self.entry, error=f"heartbeat failed: {type(e).__name__}: {e}", error_at=time.time())
            self.first_done.set()
            self._halt.wait(self.interval)

    def beat(self) -> None:
        try:
            probe = self.host.probe(timeout=max(5.0, min(15.0, 2 * self.interval)), may_connect=True)
        except (PeerUnreachable, PeerError) as e:
            if not self._halt.is_set():
                self.entry = record_probe(self.home, self.host.name, None, error=probe_error(e))
            return
        self.entry = record_probe(self.home, self.host.name, probe)
        for attempt_id, s in (self.entry.get("pending_stops") or {}).items():
            try:  # `cancel` could not reach it: stop the attempt now
                args = ["--attempt", attempt_id, *(["--pid", str(s["pid"])] if s.get("pid") else []),
                        *(["--token", s["token"]] if s.get("token") else [])]
                self.host.call("stop", *args, may_connect=True)
            except (PeerUnreachable, PeerError):
                return
            clear_pending_stop(self.home, self.host.name, attempt_id)

    def halt(self) -> None:
        self._halt.set()


class Relay:
    """The peers of this run and their heartbeats."""

    def __init__(self, config: Any, peers: dict[str, Peer]) -> None:
        self.config = config
        self.peers = peers
        self.hosts = {name: SSHHost(p, config.home) for name, p in peers.items()}
        self.beats: dict[str, Heartbeat] = {}
        self.interval = float(config.setting("relay", "heartbeat_secs", HEARTBEAT_S))

    def close(self) -> None:
        for b in self.beats.values():
            b.halt()
        for h in self.hosts.values():
            h.close()
        for b in self.beats.values():
            b.join(timeout=10)
        for h in self.hosts.values():
            h.close()  # a probe may have connected again meanwhile
        self.beats.clear()

    def start_heartbeats(self) -> None:
        for name, host in self.hosts.items():
            if name not in self.beats:
                b = self.beats[name] = Heartbeat(host, self.config.home, self.interval)
                host.passive = True  # from now on the heartbeat reconnects, not the loop
                b.start()

    def entry(self, name: str) -> dict[str, Any]:
        b = self.beats.get(name)
        if b is not None:
            return b.entry
        return load_state(self.config.home).get(name) or {}

    def first_probe_pending(self) -> bool:
        return any(not b.first_done.is_set() for b in self.beats.values())

    def _note(self, task_id: str, text: str) -> None:
        led = self.config.stash.get("ledger")
        if led is not None:
            led.add_note(task_id, text)

    # -- placement -----------------------------------------------------------------

    @hookimpl(trylast=True)
    def fleetrun_candidates(self, config: Any) -> list[Candidate]:
        from ..policy import Policy

        self.start_heartbeats()
        policy = config.stash.get("policy") or Policy()
        led = config.stash.get("ledger")
        active: dict[str, int] = {}
        if led is not None:
            for t in led.tasks(set(ACTIVE)):
                active[t.host or "local"] = active.get(t.host or "local", 0) + 1
        now = time.time()
        out = []
        for name in self.hosts:
            entry = self.entry(name)
            probe = entry.get("probe") or {}
            pp = policy.for_peer(name)
            status = status_of(entry, policy.stale_after_secs, now)
            why = unusable_reason(probe) if probe else None
            if why is None and entry.get("error") and (entry.get("error_at") or 0) >= (entry.get("last_heard") or 0):
                why = str(entry["error"])
            reported = int(probe.get("running") or 0) if status == "live" else 0
            own_max = probe.get("max_tasks")
            if why is None and isinstance(own_max, int) and reported >= own_max:
                why = f"is running {reported} of {own_max} tasks (its own [local] max_tasks)"
            out.append(Candidate(
                name=name, kind="peer",
                free_mem_mb=probe.get("free_mem_mb"), load_per_core=probe.get("load_per_core"),
                free_disk_mb=probe.get("free_disk_mb"),
                running=max(active.get(name, 0), reported), max_tasks=int(pp.max_tasks),
                drain=bool(pp.drain or probe.get("drain")), status=status,
                tags=frozenset(probe.get("tags") or ()), tools=dict(probe.get("tools") or {}),
                auth=frozenset(probe.get("auth") or ()),
                mem_per_task_mb=float(pp.mem_per_task_mb if pp.mem_per_task_mb is not None
                                      else probe.get("mem_per_task_mb") or 1024.0),
                min_free_mem_mb=pp.min_free_mem_mb, max_load_per_core=pp.max_load_per_core,
                min_free_disk_mb=pp.min_free_disk_mb, why_not=why,
                info={"address": self.peers[name].address, "last_heard": entry.get("last_heard")},
            ))
        return out

    @hookimpl(wrapper=True)
    def fleetrun_place(self, task: Any, candidates: list[Candidate], policy: Any, config: Any) -> Any:
        result = yield
        if isinstance(result, Wait) and result.until is None and self.first_probe_pending():
            result.until = time.time() + 1.0  # a peer is about to report in: this is not idle yet
        return result

    # -- an attempt on a peer --------------------------------------------------------

    @hookimpl(tryfirst=True)
    def fleetrun_prepare_workspace(self, task: Any, attempt: Any, config: Any) -> Optional[Workspace]:
        host = self.hosts.get(attempt.host)
        if host is None:
            return None
        try:
            ws = host.prepare(task, attempt)
        except PeerUnreachable as e:
            raise PeerUnreachable(f"{host.name} could not be reached: {e}", e.delivered) from None
        return Workspace(**{k: v for k, v in ws.items() if k in {f.name for f in dataclasses.fields(Workspace)}})

    @hookimpl(tryfirst=True)
    def fleetrun_collect_work(self, task: Any, attempt: Any, workspace: Any, config: Any) -> Optional[str]:
        host = self.hosts.get(attempt.host)
        if host is None:
            return None
        try:
            return host.collect(task, attempt, workspace) or ""
        except (PeerUnreachable, PeerError) as e:
            self._note(task.id, f"could not commit the attempt's work on {host.name}: {e}")
            return ""  # not None: the local worktree plugin must not try it here

    @hookimpl(tryfirst=True)
    def fleetrun_verify(self, task: Any, verifier: Any, workspace: Any, attempt: Any, config: Any) -> Any:
        host = self.hosts.get(attempt.host)
        if host is None:
            return None
        if verifier.kind != "run":
            return Verdict(False, verifier.kind, verifier.label, host=host.name,
                           reason=f"{verifier.kind} verifiers run only on the supervising machine, and this "
                                  f"attempt ran on {host.name}")
        idx = task.spec.verify.index(verifier) if verifier in task.spec.verify else 0
        return RemoteRunHandle(host, task, attempt, verifier, idx, workspace)

    @hookimpl(tryfirst=True)
    def fleetrun_handoff(self, task: Any, attempt: Any, config: Any) -> Optional[Handoff]:
        peer = self.peers.get(task.host or "")
        if peer is None:
            return None
        summary = (attempt.result_text or "").strip() if attempt is not None else ""
        if len(summary) > SUMMARY_LIMIT:
            summary = summary[:SUMMARY_LIMIT] + " [...]"
        repo = ((attempt.workspace or {}).get("repo") if attempt is not None else None) or None
        hint = ""
        if task.branch and repo:
            hint = f"The branch is on {peer.name}; fetch it with `git fetch {fetch_url(peer, repo)} {task.branch}`."
        return Handoff(task_name=task.name, branch=task.branch, summary=summary, host=peer.name, fetch_hint=hint)

    @hookimpl
    def fleetrun_cleanup_workspace(self, task: Any, config: Any) -> None:
        host = self.hosts.get(task.host or "")
        if host is None or task.state is not State.DONE or not task.worktree:
            return
        try:
            r = host.cleanup(task)
        except (PeerUnreachable, PeerError) as e:
            self._note(task.id, f"could not clean up worktree {task.worktree} on {host.name}: {e}")
            return
        if r.get("removed"):
            self._note(task.id, f"removed clean worktree {task.worktree} on {host.name}; branch {task.branch} stays")
        else:
            self._note(task.id, f"kept worktree {task.worktree} on {host.name}")

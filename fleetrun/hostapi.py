"""Hosts, the public API: what a place an attempt runs in offers (:class:`Host`), and the
run's registry of them, filled by the ``fleetrun_hosts`` hook.

A host is the local machine (the built-in ``local`` plugin's
:class:`~fleetrun.hosts.LocalHost`), a peer over SSH (the ``relay`` plugin's
``SSHHost``), or whatever a plugin offers. The loop never asks which one it holds: it
asks ``host.local`` where that matters (a workspace that is a folder on this machine).

This module imports nothing of the loop or the plugins: ``status`` and ``cancel`` use
the registry too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Protocol, Sequence, runtime_checkable

from .builtin_plugins import LOCAL_HOST_PLUGIN, PEER_HOSTS_PLUGIN, plugin_unavailable
from .stash import StashKey

if TYPE_CHECKING:
    from .config import Config
    from .reports import Candidate, Started


class StartRefused(Exception):
    """A host would not start an attempt (a peer at its ``max_tasks``, draining, a
    host no loaded plugin provides); the message is the host's own reason. Raise it
    from :meth:`Host.start`: the loop matches it with ``isinstance``, records
    ``peer_refused:<message>`` and backs off from that host; a refusal does not use up
    a retry. Any other exception from ``start`` is ``start_failed:<message>``."""


class AgentNotFound(Exception):
    """The agent an attempt would start is not installed where it would run (its
    ``argv[0]`` is not on ``PATH``, does not exist, or is not executable); the message
    says which. Raised by the ``shepherd`` plugin's ``fleetrun_start_attempt`` before it
    starts a shepherd on this machine: the loop records ``agent_not_found:<message>`` and
    asks a human at once (no backoff: it would not be found the next time either). It is
    raised there, and not before the attempt is offered to every plugin, because an
    attempt a plugin runs its own way (a mailbox delivering it to a role's session)
    starts no agent here and needs none installed."""


@dataclass(frozen=True)
class AttemptRef:
    """One attempt a host is asked about by :meth:`Host.poll`: its id and, from the
    ledger, its shepherd's pid and identity token (None when not known yet)."""

    attempt_id: str
    pid: Optional[int] = None
    token: Optional[str] = None


@runtime_checkable
class Host(Protocol):
    """A place attempts run: what the loop, adoption, ``cancel`` and ``status`` use.

    :class:`~fleetrun.hosts.LocalHost` (this machine) and the relay's ``SSHHost`` (a
    peer) are the built-in ones; a plugin offers more from ``fleetrun_hosts``. Every
    method is called on the supervisor's main thread (a host may have threads of its
    own, as the relay's heartbeats are). Only ``start`` may raise; the others say
    what they could not do in their return value.

    :ivar name: the name placement, the ledger (``attempt.host``, ``task.host``) and
        ``peer =`` in a tasks file use; unique among the hosts of a run (the first
        host offered under a name wins).
    :ivar local: True when its workspaces are folders on this machine, so the
        ``worktree`` plugin makes them and the ``run`` verifier runs in them here
        (``LocalHost`` and a host like it); False for a host whose files are
        elsewhere (a peer): then the plugin that provides it answers the stage hooks
        for it (``fleetrun_prepare_workspace``, ``fleetrun_collect_work``,
        ``fleetrun_verify``, ``fleetrun_cleanup_workspace``, ``fleetrun_handoff``).
    """

    name: str
    local: bool

    def attempt_dir(self, attempt_id: str) -> Path:
        """The attempt's folder on this machine (its prompt, its log as read here, the
        outputs of its ``run`` verifiers on a local host); it need not exist yet.

        :param attempt_id: the ledger's attempt id (``<task-id>_a<N>``).
        """
        ...

    def start(self, attempt_id: str, spec: dict[str, Any], prompt: Optional[str] = None) -> Started:
        """Start the attempt's shepherd with the shepherd spec ``spec`` (``argv``,
        ``cwd``, ``env``, ``stdin``, ``timeout_s``, ``stall_s``, ``notify``: see
        :func:`fleetrun.starting.shepherd_spec`) and return at once.

        :param attempt_id: the attempt to start.
        :param spec: the shepherd spec.
        :param prompt: the prompt, written to the attempt folder (and fed on standard
            input when ``spec["stdin"] == "prompt"``).
        :return: a :class:`~fleetrun.Started` (the shepherd's pid and identity token,
            the attempt folder). A pid of None means "it may have started, ask
            ``status``" (a reply lost on the way back). A host whose reply comes later
            (a peer's, inside a work loop) may return a
            :class:`~fleetrun.reports.StartHandle` instead, whose ``poll()`` gives it;
            its ``status`` then says ``starting`` until then.
        :raises StartRefused: the host would not start it (a retry is not used).
        """
        ...

    def status(self, attempt_id: str, pid: Optional[int], token: Optional[str]) -> dict[str, Any]:
        """The attempt's status, as the shepherd's status file says it: ``state`` is
        ``starting``, ``running``, ``ended`` (with ``exit_code``, ``reason``...),
        ``died`` (the shepherd is gone without an end) or ``unreachable`` (it cannot
        be asked now, with ``error``: the loop waits, the task never runs twice).

        :param pid: the shepherd's pid from the ledger (None: read it from the folder).
        :param token: its identity token (a reused pid is not the shepherd).
        """
        ...

    def poll(self, attempts: Sequence[AttemptRef]) -> dict[str, dict[str, Any]]:
        """The status of each of ``attempts`` at once, as :meth:`status` would give it:
        the loop asks each host once per pass for all of its live attempts (the relay
        sends one request per peer). The contract is in docs/plugins.md ("The host
        status contract"); :mod:`fleetrun.testing.hostconformance` checks it.

        A host without ``poll`` still works: :func:`poll_statuses` then calls
        :meth:`status` once per attempt.

        :return: attempt id -> status; an attempt left out counts as ``unreachable``.
        """
        ...

    def log_path(self, attempt_id: str) -> Path:
        """The file on this machine holding the agent's output (what
        ``fleetrun_agent_result`` reads and ``fleetrun logs`` shows)."""
        ...

    def stop(self, attempt_id: str, pid: Optional[int], token: Optional[str]) -> bool:
        """Ask the shepherd to end the agent's process tree. Safe to repeat.

        :return: True when a running shepherd was signalled.
        :raises UnknownHost: only :class:`MissingHost` raises, so ``cancel`` can say
            what could not be stopped.
        """
        ...

    def give_up(self, attempt_id: str) -> dict[str, Any]:
        """Decide, after a crash, that an attempt leased or starting never started:
        make sure a shepherd that starts late runs nothing.

        :return: the status as it is now; with a ``shepherd_pid`` when the shepherd
            did start after all (the loop then adopts it). A host that cannot tell
            returns ``{}``.
        """
        ...

    def candidate(self, config: Config) -> Optional[Candidate]:
        """This host as a placement candidate, with fresh headroom, tools and limits;
        called on every pass of the loop that has a task to place (so it must be
        quick: measure, or read what a background probe last heard).

        :return: a :class:`~fleetrun.Candidate` whose ``name`` is this host's, or None
            to offer no candidate (the host still answers for its running attempts).
        """
        ...


class UnknownHost(KeyError):
    """A host the ledger names that no loaded plugin provides (a peer, with the relay
    plugin blocked or the peer gone from ``peers.toml``); the message says which and
    why. A ``KeyError``, as an unknown host always was."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown host"


class MissingHost:
    """Stands in for a host the ledger names that no loaded plugin provides, so that
    adoption, polling and containment leave what runs there alone instead of failing
    on a ``KeyError``: its status is ``unreachable`` with the reason (the loop waits,
    as for a peer that does not answer: the attempt may still run there, and a task
    never runs twice), it starts nothing, it cannot stop anything and it is no
    placement candidate. It satisfies :class:`Host`."""

    local = False

    def __init__(self, name: str, home: Path, reason: str) -> None:
        self.name = name
        self.home = home
        self.reason = reason

    def attempt_dir(self, attempt_id: str) -> Path:
        return self.home / "attempts" / attempt_id

    def log_path(self, attempt_id: str) -> Path:
        return self.attempt_dir(attempt_id) / "log"

    def start(self, attempt_id: str, spec: dict[str, Any], prompt: Optional[str] = None) -> Started:
        raise StartRefused(self.reason)

    def status(self, attempt_id: str, pid: Optional[int], token: Optional[str]) -> dict[str, Any]:
        return {"state": "unreachable", "error": self.reason}

    def poll(self, attempts: Sequence[AttemptRef]) -> dict[str, dict[str, Any]]:
        return {a.attempt_id: self.status(a.attempt_id, a.pid, a.token) for a in attempts}

    def stop(self, attempt_id: str, pid: Optional[int], token: Optional[str]) -> bool:
        raise UnknownHost(self.reason)

    def give_up(self, attempt_id: str) -> dict[str, Any]:
        return {}

    def candidate(self, config: Config) -> Optional[Candidate]:
        return None


#: ``config.stash[HOSTS]``: the run's :class:`HostRegistry`, made on first use.
HOSTS: StashKey[HostRegistry] = StashKey()


class HostRegistry:
    """The hosts of one run, as the ``fleetrun_hosts`` hook offers them.

    The hook is asked once, on first use (every plugin is configured by then), and
    again whenever a name is looked up that the last answer did not have (a plugin
    may offer a host late); never on every lookup. A name still not provided gets a
    :class:`MissingHost`, kept, and the reason is said once on stderr.
    """

    def __init__(self, config: Config) -> None:
        self.config = config
        self._hosts: dict[str, Host] = {}
        self._missing: dict[str, MissingHost] = {}
        self._asked: set[str] = set()  # names not offered, asked about once since
        self.refresh()

    def refresh(self) -> None:
        """Ask ``fleetrun_hosts`` again. The first host offered under a name wins (a
        ``tryfirst`` plugin's before the built-ins')."""
        found: dict[str, Host] = {}
        for hosts in self.config.hook.fleetrun_hosts(config=self.config):
            for h in hosts or ():
                found.setdefault(h.name, h)
        self._hosts = found

    def hosts(self) -> list[Host]:
        """The provided hosts, in the order the hook offered them."""
        return list(self._hosts.values())

    def provided(self, name: str) -> bool:
        """Whether a loaded plugin provides ``name`` (asking the hook again the first
        time a name is not in its last answer)."""
        if name not in self._hosts and name not in self._asked:
            self._asked.add(name)
            self.refresh()
        return name in self._hosts

    def get(self, name: Optional[str]) -> Host:
        """The host called ``name`` (None: ``local``), or a :class:`MissingHost`."""
        name = name or "local"
        if self.provided(name):
            return self._hosts[name]
        if name in self._missing:
            return self._missing[name]
        reason = missing_host_reason(self.config, name) or f"unknown host {name!r}"
        host = self._missing[name] = MissingHost(name, self.config.home, reason)
        err = getattr(self.config, "err", None)
        if err is not None:
            err.write(f"fleetrun: {reason}; what runs there is left alone, and its tasks wait\n")
        return host


def registry(config: Config) -> HostRegistry:
    """The run's :class:`HostRegistry` (made on first use)."""
    reg: Optional[HostRegistry] = config.stash.get(HOSTS)
    if reg is None:
        reg = config.stash[HOSTS] = HostRegistry(config)
    return reg


def candidates_of(config: Config) -> list[Candidate]:
    """This pass's placement candidates: those of ``fleetrun_candidates`` (plugins that
    add some), then each host's own (:meth:`~fleetrun.Host.candidate`)."""
    extra = [c for cs in config.hook.fleetrun_candidates(config=config) for c in (cs or [])]
    own = [c for c in (h.candidate(config) for h in registry(config).hosts()) if c is not None]
    return extra + own


def get_host(config: Config, name: Optional[str]) -> Host:
    """The host called ``name`` (None: this machine, ``local``). A name no loaded plugin
    provides gets a :class:`MissingHost`, and the reason is said once on stderr."""
    return registry(config).get(name)


def workspace_here(config: Config, name: Optional[str]) -> bool:
    """Whether the host ``name`` (from the ledger; None: ``local``) keeps its attempt
    folders and worktrees on this machine (``host.local``: this machine, or a cluster
    on a shared filesystem); ``local`` is, without asking the plugins. A name no loaded
    plugin provides is not (and is not warned about)."""
    if name in (None, "local"):
        return True
    reg = registry(config)
    return reg.provided(str(name)) and bool(reg.get(name).local)


def missing_host_reason(config: Config, name: Optional[str]) -> Optional[str]:
    """Why no loaded plugin provides the host ``name`` (from the ledger), or None when
    one does."""
    name = name or "local"
    reg: Optional[HostRegistry] = config.stash.get(HOSTS)
    if reg is None:
        reg = registry(config)
    if reg.provided(name):
        return None
    pm = getattr(config, "pluginmanager", None)
    plugin = LOCAL_HOST_PLUGIN if name == "local" else PEER_HOSTS_PLUGIN
    gone = plugin_unavailable(pm, plugin)
    if gone is not None:
        why = f"the {plugin} plugin is {gone}"
    elif name == "local":
        why = f"the {plugin} plugin offers no host 'local'"
    else:
        why = f"no peer named {name!r} in peers.toml"
    return f"host {name!r} is not provided by any loaded plugin: {why}"


def verifies_without_waiting(host: Any, kind: str) -> bool:
    """Whether starting a verifier of ``kind`` on ``host`` sends a request and returns,
    its reply waking the loop (a peer's ``run`` verifier through its worker): then the
    loop need not commit its pass before the start (:meth:`fleetrun.loop.Loop.before_host_io`),
    as it must before a request it waits for. Optional on a host
    (``verifies_without_waiting(kind)``); one without it is asked and waited for."""
    ask = getattr(host, "verifies_without_waiting", None)
    return bool(ask(kind)) if callable(ask) else False


def hands_off_without_waiting(host: Any) -> bool:
    """Whether the handoff of a task of ``host`` whose verifiers all passed is made off
    the loop's thread (a peer's branch fetched back on a worker): then the loop need
    not commit its pass first, as :func:`verifies_without_waiting`. Optional on a host
    (``hands_off_without_waiting()``)."""
    ask = getattr(host, "hands_off_without_waiting", None)
    return bool(ask()) if callable(ask) else False


def poll_statuses(host: Host, attempts: Sequence[AttemptRef]) -> dict[str, dict[str, Any]]:
    """Every one of ``attempts``' status from ``host`` in one call: its :meth:`Host.poll`,
    or, for a host written before ``poll`` (it has only ``status``), one ``status`` per
    attempt. What the host answers is checked, as a peer's reply is: an attempt it left
    out, or whose status is not a table with a string ``state``, is ``unreachable``
    with the reason (the loop waits; a task never runs twice).

    :return: attempt id -> status, for each of ``attempts``.
    """
    poll = getattr(host, "poll", None)
    if callable(poll):
        got = poll(list(attempts))
    else:
        got = {a.attempt_id: host.status(a.attempt_id, a.pid, a.token) for a in attempts}
    if not isinstance(got, dict):
        got = {}
    out: dict[str, dict[str, Any]] = {}
    for a in attempts:
        st = got.get(a.attempt_id)
        if not isinstance(st, dict):
            why = "no status for it" if st is None else f"a status that is not a table ({type(st).__name__})"
            st = {"state": "unreachable", "error": f"{host.name}: poll gave {why}"}
        elif not isinstance(st.get("state"), str):
            st = {"state": "unreachable", "error": f"{host.name}: poll gave a status without a state"}
        out[a.attempt_id] = st
    return out


def stop_attempt(config: Config, attempt: Any) -> bool:
    """Stop an attempt wherever it runs (used by ``fleetrun cancel``).

    :raises UnknownHost: no loaded plugin provides the attempt's host, so nothing
        could be asked to stop it (it may still run there).
    """
    reason = missing_host_reason(config, attempt.host)
    if reason is not None:
        raise UnknownHost(reason)
    host = get_host(config, attempt.host)
    return bool(host.stop(attempt.id, attempt.shepherd_pid, attempt.shepherd_token))


__all__ = [
    "HOSTS",
    "AttemptRef",
    "Host",
    "HostRegistry",
    "MissingHost",
    "StartRefused",
    "UnknownHost",
    "get_host",
    "missing_host_reason",
    "poll_statuses",
    "registry",
    "stop_attempt",
    "workspace_here",
]

"""Built-in ``relay`` plugin: peers over SSH as places where attempts run.

``fleetrun_configure`` reads ``peers.toml`` and registers a :class:`Relay` object under
the name ``relay-peers`` (:class:`~.supervisor.Relay`), which implements the hooks:

- ``fleetrun_hosts``: an :class:`~fleetrun.plugins.relay.host.SSHHost` per peer (so the
  loop, ``cancel`` and adoption find them by name). Each is a placement candidate
  (``SSHHost.candidate``) with the headroom of its last heartbeat (a probe every
  ``[relay] heartbeat_secs``, 5 by default, from one thread per peer),
  ``live``/``stale``/``never`` by policy.toml's ``stale_after_secs``, and the
  ``[peers]``/``[peers.NAME]`` limits. A peer without a usable fleetrun, or one
  that did not answer its last probe, says why it takes nothing.
- ``fleetrun_place`` (a wrapper): while a peer's first heartbeat is on its way, a
  task that cannot be placed yet is not a reason for the run to call itself idle.
  (Tasks with a ``role`` stay on this machine: the ``placement`` plugin pins them
  there.)
- ``fleetrun_prepare_workspace``, ``fleetrun_collect_work``, ``fleetrun_verify``
  (``run``), ``fleetrun_cleanup_workspace`` for an attempt on a peer run there, over
  SSH. They answer only when the ``host`` they are given is one of its peers, and are
  ``trylast`` like every built-in (the local ``worktree`` and ``verify_run`` answer
  only for a ``host.local`` host, which a peer is not), so a ``fleetconf.py``
  implementation wins for a peer's attempt as for any other.
  A peer's reply is not trusted: the workspace its ``prepare`` names must be the one
  asked for (:func:`check_workspace`: the branch this supervisor chose for the task,
  the task's ``git_ref``, a worktree holding the task's ``cwd``), or the attempt does
  not start; a worktree the peer found tampered with raises ``WorktreeTampered``.
- **Fetch-back**: once a peer attempt's work is committed there
  (``fleetrun_collect_work``), a task with a ``brain``/``agent`` verifier or with
  dependents has its branch brought into this machine's repository over the same SSH
  transport (``fleetrun host bundle``: a git bundle of what this repository lacks),
  under the same branch name (``<branch>-from-<peer>`` if the local one has diverged),
  and checked out, detached, in ``worktrees/<name>-<id>-fetched``.
  :meth:`~.supervisor.Relay.local_workspace` gives that worktree to the ``verify_brain`` and
  ``verify_agent`` plugins (they ask for it through the ``fleetrun_fetch_workspace`` hook),
  so those verifiers run here on the fetched branch; ``run`` verifiers still run on
  the peer. The worktree goes when the task ends; the branch stays.
- ``fleetrun_handoff``: names the branch (the fetched one, if it was fetched, and
  says so) and how to fetch it from the peer.

Nothing here imports paramiko unless a peer is actually contacted, and this module
imports nothing of the package at the top: ``fleetrun host status`` (the fast path of
:mod:`.peer.verbs`, which a supervisor polls over SSH) loads this package's
``__init__`` before its own module, and must stay fast.

The package, one concern a module (``-p no:relay`` removes all of it):

- :mod:`.supervisor`: the ``relay-peers`` object above, its heartbeats and
  stage hooks.
- :mod:`.host`: :class:`~.host.SSHHost` (a peer as a host) and
  :class:`~.host.RemoteRunHandle` (a ``run`` verifier on a peer).
- :mod:`.transport`: TCP tuning, connecting, host keys, authentication, one command
  on a channel.
- :mod:`.bundle`: fetch-back, the supervisor's side (the bundle stream, the
  branch and worktree it becomes here).
- :mod:`.peers`: ``peers.toml``, ``peers-state.json``, ``~/.ssh/config`` and
  ``known_hosts`` trust.
- :mod:`.protocol`: the wire both sides import (constants, codecs, strict replies).
- :mod:`.cli`: ``fleetrun relay add|peers|remove``.
- :mod:`.peer`: the peer side, ``fleetrun host VERB``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Optional

from ...hookimpl import hookimpl
from ...stash import StashKey

if TYPE_CHECKING:
    from ...config import Config


#: The peer state file as one ``status`` read it (read once, for every task on a peer).
_STATUS_STATE = StashKey[dict[str, Any]]()


def _positive(v: float) -> Optional[str]:
    return None if v > 0 else "must be greater than 0"


@hookimpl(trylast=True)
def fleetrun_config_keys(config: Config) -> list[Any]:
    """``[relay]`` of config.toml (docs/peers.md); a peer reads its own."""
    from ...config import ConfigKey

    return [
        # a string would be read as its letters (`"gpu"` -> g, p, u) by whatever iterates it
        # this machine's: never in a project file, which every machine's checkout shares
        ConfigKey("relay", "", machine=True, doc="this machine on the relay"),
        ConfigKey("relay", "tags", (list,), items=str, doc="this machine's tags, for requires"),
        ConfigKey("relay", "tools", (list,), items=str, doc="more tools to probe"),
        ConfigKey("relay", "heartbeat_secs", (int, float), check=_positive, doc="seconds between heartbeats"),
        ConfigKey(
            "relay",
            "fetch_back",
            (bool,),
            doc="fetch each DONE peer task's branch into this machine's repository (default true)",
        ),
    ]


@hookimpl(trylast=True)
def fleetrun_configure(config: Config) -> None:
    from ...exceptions import UsageError
    from .peers import load_peers

    try:
        peers = load_peers(config.home)
    except UsageError:
        if config.getoption("verb") in ("run", "work", "relay"):
            raise
        return  # `status`, `host`... still work with a broken peers.toml
    if not peers:
        return
    from .supervisor import Relay  # here: without peers, nothing of SSH is loaded

    relay = Relay(config, peers)
    config.pluginmanager.register(relay, "relay-peers")  # its fleetrun_hosts offers the peers


@hookimpl(trylast=True)
def fleetrun_unconfigure(config: Config) -> None:
    relay = config.pluginmanager.get_plugin("relay-peers")
    if relay is not None:
        relay.close()
        config.pluginmanager.unregister(relay)


def _rest_arguments(metavar: str, text: str) -> Any:
    def add(parser: Any) -> None:
        import argparse

        parser.add_argument("rest", nargs=argparse.REMAINDER, metavar=metavar, help=text)

    return add


def _run_relay(config: Config, out: Any, err: Any) -> int:
    from .cli import main as relay_main

    return relay_main(config, list(config.option.rest or []), out, err)


def _run_host(config: Config, out: Any, err: Any) -> int:
    if [a for a in config.option.rest or [] if a != "--json"] == ["serve"]:
        from .peer.serve import serve  # the long-lived worker: messages both ways until stdin ends

        return serve(config)
    from .peer.verbs import main as host_main

    return host_main(config, list(config.option.rest or []), out, err)


@hookimpl
def fleetrun_verbs(pluginmanager: Any) -> list[Any]:
    """``relay`` (pair with peers, see them) and ``host`` (the peer side, run over SSH):
    their modules parse their own sub-verbs. With ``-p no:relay`` neither exists."""
    from ...verbs import VerbDecl

    return [
        VerbDecl(
            name="relay",
            help="peers over SSH: relay add NAME user@host, relay peers, relay remove NAME",
            run=_run_relay,
            reads_config=True,
            add_arguments=_rest_arguments(
                "add|peers|remove ...", "'fleetrun relay help' lists them; 'fleetrun relay add --help' describes one"
            ),
        ),
        VerbDecl(
            name="host",
            help="the peer side of the relay: fleetrun host VERB --json (run by a supervisor over SSH)",
            run=_run_host,
            reads_config=False,
            add_arguments=_rest_arguments(
                "VERB --json ...",
                "probe, prepare, start, status, log, stop, "
                "collect, cleanup, verify-start, verify-status, verify-stop, "
                "bundle (docs/peers.md)",
            ),
        ),
    ]


@hookimpl(trylast=True)
def fleetrun_status_reason(task: Any, config: Config) -> Optional[str]:
    """A task on a peer that has not answered since its last error: say so (from the
    cached peer state, read once per ``status``; no SSH)."""
    from ...textutil import ago
    from .peers import load_state

    cached = config.stash.get(_STATUS_STATE)
    if cached is None:
        cached = config.stash[_STATUS_STATE] = load_state(config.home)
    e = cached.get(task.host or "")
    if isinstance(e, dict) and e.get("error") and (e.get("error_at") or 0) >= (e.get("last_heard") or 0):
        return (
            f"{task.host} has not answered for {ago(e.get('last_heard'), time.time())}; the attempt may "
            "still run there, so the task waits (fleetrun cancel to give up)"
        )
    return None

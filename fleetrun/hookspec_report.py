"""The reporting hooks about attempts and hosts: an attempt started, an attempt ended,
a host's heartbeat. Observers, like ``fleetrun_transition``: the event log and
exporters listen here. Imported by :mod:`fleetrun.hookspec` by name, so they are
its hooks like the rest (see there for what holds for every hook).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from .hookimpl import hookspec

if TYPE_CHECKING:
    from .config import Config
    from .hostapi import Host
    from .ledger import Attempt, Task
    from .reports import AgentResult


@hookspec
def fleetrun_attempt_started(task: Task, attempt: Attempt, host: Host, config: Config) -> None:
    """An attempt started (already recorded in the ledger as running).

    Called once per attempt, in the loop, right after the start is recorded and the
    task moved to RUNNING (also when a cancel came meanwhile: the attempt did start,
    and is being stopped). Not called for an attempt a restarted loop adopts: the
    process that started it reported it. Every attempt reported here is reported by
    :func:`fleetrun_attempt_ended` once it ends, if the same loop sees it end.

    :param task: the :class:`~fleetrun.ledger.Task`, as it is after the start.
    :param attempt: the :class:`~fleetrun.ledger.Attempt` as recorded: ``number``,
        ``kind`` (``fresh``, ``retry``, ``resume``), ``host`` (where it runs: a
        mailbox's delivery names the ``mailbox`` host), ``shepherd_pid``, ``session_id``,
        ``started``.
    :param host: the :class:`~fleetrun.Host` it was placed on.
    :param config: the run's :class:`~fleetrun.config.Config`.
    :return: nothing; return value ignored.

    May be implemented in a ``fleetconf.py``: yes.
    """


@hookspec
def fleetrun_attempt_ended(task: Task, attempt: Attempt, result: Optional[AgentResult], config: Config) -> None:
    """An attempt's agent ended (its end already recorded in the ledger), before the task
    moves on (to VERIFYING, RETRYING, RESUMING, NEEDS_HUMAN...).

    Called once per attempt, by the loop that recorded the end; not again when a
    restarted loop finds the end recorded but not acted on.

    :param task: the :class:`~fleetrun.ledger.Task` (its ``cost_usd`` includes this
        attempt's).
    :param attempt: the :class:`~fleetrun.ledger.Attempt` as recorded: ``exit_code``,
        ``outcome``, ``cost_usd`` (None: unknown), ``session_id``, ``started``, ``ended``.
    :param result: the :class:`~fleetrun.AgentResult` ``fleetrun_agent_result`` read
        from the agent's output, or None when no plugin read one.
    :param config: the run's :class:`~fleetrun.config.Config`.
    :return: nothing; return value ignored.

    May be implemented in a ``fleetconf.py``: yes.
    """


@hookspec
def fleetrun_host_heartbeat(host: Host, info: dict[str, Any], config: Config) -> None:
    """A host plugin heard from one of its hosts (or failed to): the ``relay``'s
    heartbeat of a peer, every ``[relay] heartbeat_secs``.

    Called on the loop's thread, between passes (a plugin whose probes run on a thread
    of their own posts them with :func:`fleetrun.heartbeats.post`); only while a work
    loop runs.

    :param host: the :class:`~fleetrun.Host` probed (``host.name``).
    :param info: what was heard, every key present (None: not known): ``reachable``
        (bool), ``running`` and ``max_tasks`` (the host's own count and limit),
        ``free_slots`` (``max_tasks - running``), ``free_mem_mb``, ``load_per_core``,
        ``free_disk_mb``, ``latency_ms`` (how long the round took), ``error`` (why it
        was not reachable, one line). Other keys may be added.
    :param config: the run's :class:`~fleetrun.config.Config`.
    :return: nothing; return value ignored.

    May be implemented in a ``fleetconf.py``: yes.
    """

"""The reporting hooks about attempts, hosts and the loop: an attempt started, an
attempt ended, a host's heartbeat, a host paused, a pass of the loop done. Observers, like ``fleetrun_transition``: the event log and
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


@hookspec
def fleetrun_loop_pass(config: Config, duration_s: float) -> None:
    """The work loop finished one pass: it looked at the ledger, the attempts and the
    verifiers, and placed what it could. Called once per pass, at its end, on the main
    thread, for ``fleetrun [run]`` and ``fleetrun work``; a pass that fails on an
    unwritable home is not reported. Passes follow each other as fast as there is news
    (an agent ended, a verifier finished) and at least once a second, so an
    implementation must be quick: record, do not work (a metrics plugin observes the
    duration and reads what the pass left).

    :param config: the run's :class:`~fleetrun.config.Config`.
    :param duration_s: how long the pass took, in seconds (``time.monotonic()``), not
        counting the wait before it.
    :return: nothing; return value ignored.

    May be implemented in a ``fleetconf.py``: yes.
    """


@hookspec
def fleetrun_host_paused(host: str, until: float, reason: str, config: Config) -> None:
    """A host is paused: nothing starts on it before ``until``, because an attempt there
    ended on a usage limit (the agent's subscription or API key is spent until its reset).

    Called by the loop as the pause takes effect (already in force, and kept in the ledger
    so that a restarted loop waits for the same reset), once per attempt that ended so:
    several attempts ended by one limit call it once each, with the same or a later
    ``until``. For observers (the ``notify`` plugin sends it on); the loop decides the
    pause itself, and a task whose attempt it was moves on through ``fleetrun_transition``
    (to RESUMING, cause ``usage_limit:...``). An exception raised here is that task's
    internal error: keep it short and safe.

    :param host: the name of the host (``local``, a peer's name).
    :param until: when the pause ends, in seconds since the epoch (the loop's clock,
        :func:`fleetrun.clock.now`).
    :param reason: the cause of the attempt's end (``usage_limit:usage limit, resumes at 14:05``).
    :param config: the run's :class:`~fleetrun.config.Config`.
    :return: nothing; return value ignored.

    May be implemented in a ``fleetconf.py``: yes.
    """

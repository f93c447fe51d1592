"""Every hook of fleetrun, grouped by stage.

Hook argument names are API forever: pluggy matches implementations by name, so an
argument may be added but never renamed. Every hook here may be implemented in a
``fleetconf.py``, in a ``-p`` module, or in an installed plugin (entry-point group
``fleetrun``), unless its docstring says otherwise. Built-in plugins implement their
hooks with ``trylast=True``, so your implementation runs first without ordering flags;
use ``tryfirst=True`` to be sure.

Hooks are always called on the supervisor's main thread. A hook that starts
something long (``fleetrun_start_attempt``, ``fleetrun_verify``) returns at once (a
handle, or what started) and the loop polls it.

This module declares the configuration and session, collection and reporting hooks;
the per-task hooks are declared in :mod:`fleetrun.hookspec_place` (candidates, place
and its filter and score) and :mod:`fleetrun.hookspec_task` (prepare, prompt, spawn,
start, verify, hand off, clean up), the reports about attempts and hosts (an attempt
started or ended, a host's heartbeat) in :mod:`fleetrun.hookspec_report`, and all
imported here by name, so
this module holds every hook: ``pm.add_hookspecs(fleetrun.hookspec)`` adds them all.
The ``hookspec`` marker itself lives in :mod:`fleetrun.hookimpl` (both modules import
it from there) and is exported as ``fleetrun.hookspec``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from .hookimpl import hookspec
from .hookspec_place import (
    fleetrun_candidates,
    fleetrun_place,
    fleetrun_place_filter,
    fleetrun_place_score,
)
from .hookspec_report import (
    fleetrun_attempt_ended,
    fleetrun_attempt_started,
    fleetrun_host_heartbeat,
    fleetrun_host_paused,
    fleetrun_loop_pass,
)
from .hookspec_task import (
    fleetrun_agent_result,
    fleetrun_build_prompt,
    fleetrun_cleanup_workspace,
    fleetrun_collect_work,
    fleetrun_fetch_workspace,
    fleetrun_handoff,
    fleetrun_prepare_workspace,
    fleetrun_spawn,
    fleetrun_start_attempt,
    fleetrun_verify,
)

if TYPE_CHECKING:
    from .collect import TaskFile
    from .config import Config, ConfigKey, Parser
    from .hostapi import Host
    from .ledger import Attempt, Task
    from .pluginmanager import FleetPluginManager
    from .reports import Verdict
    from .session import Session
    from .taskspec import KeyDecl, TaskSpec
    from .verbs import VerbDecl


# ---------------------------------------------------------------------------------
# Configuration and session


@hookspec(historic=True)
def fleetrun_addhooks(pluginmanager: FleetPluginManager) -> None:
    """Add the hook specifications of a plugin: ``pluginmanager.add_hookspecs(module)``.

    Called once for each plugin as it is registered (historic: a plugin registered after
    the manager was made gets the call too). Plugin-specific hooks live with their plugin,
    like pytest-xdist's ``newhooks.py``; name them ``fleetrun_<plugin>_<what>``.

    :param pluginmanager: the run's :class:`~fleetrun.pluginmanager.FleetPluginManager`.
    :return: nothing; return value ignored.

    May be implemented in a ``fleetconf.py``: yes (its hooks are added as it is imported,
    before the check that every ``fleetrun_*`` implementation names a declared hook).
    """


@hookspec
def fleetrun_addoption(parser: Parser, pluginmanager: FleetPluginManager) -> None:
    """Add command-line options with ``parser.addoption(...)`` or
    ``parser.getgroup(name, description).addoption(...)``.

    Called once, before the command line is parsed. The arguments are those of
    :meth:`argparse.ArgumentParser.add_argument`; read the values with
    ``config.getoption(dest)``. The options belong to ``fleetrun [run]``, ``fleetrun work``
    and the verbs declared with ``plugin_options=True``; other verbs do not accept them.

    :param parser: the :class:`~fleetrun.config.Parser` of the plugins' options.
    :param pluginmanager: the run's :class:`~fleetrun.pluginmanager.FleetPluginManager`.
    :return: nothing; return value ignored.

    May be implemented in a ``fleetconf.py``: no (a ``fleetconf.py`` is imported after the
    command line is parsed, so its options would never exist; one there is a usage error).
    Only plugins known at start-up add options: built-ins, ``FLEETRUN_PLUGINS``, entry
    points, ``-p``, the ``plugins`` of :func:`fleetrun.main`.
    """


@hookspec
def fleetrun_verbs(pluginmanager: FleetPluginManager) -> list[VerbDecl]:
    """Declare the verbs your plugin adds to the command line (``fleetrun NAME ...``), as
    a list of :class:`~fleetrun.VerbDecl` (name, help, its arguments, what runs it).

    Called once, before the command line is parsed: the verb chooses the parser. The
    core declares its own verbs (``run``, ``status``...) the same way. A verb name
    fleetrun or another plugin already has is a usage error: a plugin adds verbs, it
    cannot replace one.

    :param pluginmanager: the run's :class:`~fleetrun.pluginmanager.FleetPluginManager`.
    :return: a list of :class:`~fleetrun.VerbDecl`. Results are concatenated.

    May be implemented in a ``fleetconf.py``: no (a ``fleetconf.py`` is found from the
    tasks files a verb names, too late, and a verb must work outside any project; one
    there is a usage error). Only plugins known at start-up (built-ins, ``-p``, entry
    points, ``FLEETRUN_PLUGINS``, the ``plugins`` of :func:`fleetrun.main`) add verbs.
    """
    raise NotImplementedError


@hookspec(historic=True)
def fleetrun_configure(config: Config) -> None:
    """The command line is parsed and every plugin is loaded, ``fleetconf.py`` files
    included.

    Called once for every verb (not for ``--help`` or ``--version``), after
    ``config.toml`` is checked (by the verbs that read it). Stateful plugins build their object here and register it
    under a well-known name (``config.pluginmanager.register(obj, "name")``). Historic: a
    plugin registered later in the run still gets the call.

    :param config: the run's :class:`~fleetrun.config.Config`.
    :return: nothing; return value ignored.

    May be implemented in a ``fleetconf.py``: yes.
    """


@hookspec
def fleetrun_config_keys(config: Config) -> list[ConfigKey]:
    """Declare the keys of the ``config.toml`` tables your plugin reads, as a list of
    :class:`~fleetrun.ConfigKey` (table, key, types, allowed values, a check).

    Called once, when ``config.toml`` is first read (every verb but ``host`` reads it as
    it starts, after the ``fleetconf.py`` files are loaded). A table or key no loaded
    plugin declared is an error (``ERROR: config.toml:LINE: table.key: unknown key``),
    as is a value of the wrong type or outside ``choices``; values reach plugins
    through ``config.setting(table, key)`` unchanged.

    :param config: the run's :class:`~fleetrun.config.Config`.
    :return: a list of :class:`~fleetrun.ConfigKey`. Results are concatenated.

    May be implemented in a ``fleetconf.py``: yes (it is loaded before ``config.toml`` is
    read), but ``config.toml`` serves every project: a table only a ``fleetconf.py``
    declares is unknown, so an error, in runs that do not load it. Declare such tables
    in a plugin.
    """
    raise NotImplementedError


@hookspec
def fleetrun_unconfigure(config: Config) -> None:
    """The command is over: undo what ``fleetrun_configure`` did.

    Called once, however the command ended (a usage error, an internal error, an
    interrupt), if ``fleetrun_configure`` was called.

    :param config: the run's :class:`~fleetrun.config.Config`.
    :return: nothing; return value ignored.

    May be implemented in a ``fleetconf.py``: yes.
    """


@hookspec
def fleetrun_sessionstart(session: Session) -> None:
    """The ledger is open and the work loop is about to start.

    Called once by ``fleetrun [run]`` and ``fleetrun work``, after the tasks are
    collected and before they are queued (a resumed queue's are in the ledger already).

    :param session: the :class:`~fleetrun.session.Session`: ``config``, ``ledger``,
        ``items`` (the collected :class:`~fleetrun.TaskSpec` objects; empty for ``work``).
    :return: nothing; return value ignored.

    May be implemented in a ``fleetconf.py``: yes.
    """


@hookspec
def fleetrun_sessionfinish(session: Session, exitstatus: int) -> None:
    """The work loop has stopped.

    Called once by ``fleetrun [run]`` and ``fleetrun work`` when the loop returns (not
    after an internal error).

    :param session: the :class:`~fleetrun.session.Session`; ``counts`` (state name to
        number of tasks; a file run again counts the tasks kept DONE from its last run
        under ``"unchanged (done earlier)"``, not ``DONE``), ``cost_usd`` and ``final_notes`` (lines the terminal prints
        before its summary) are filled in.
    :param exitstatus: the exit code about to be returned (:class:`~fleetrun.ExitCode`).
    :return: nothing; return value ignored.

    May be implemented in a ``fleetconf.py``: yes.
    """


@hookspec
def fleetrun_report_header(config: Config) -> list[str]:
    """Lines to print below the header line of a run.

    Called once by the ``terminal`` plugin as the session starts; not with ``-q`` or
    ``-p no:terminal``. The lists are printed in registration order (the outermost ``fleetconf.py``
    first).

    :param config: the run's :class:`~fleetrun.config.Config`.
    :return: a list of lines (str). Results are concatenated.

    May be implemented in a ``fleetconf.py``: yes.
    """
    raise NotImplementedError


@hookspec
def fleetrun_terminal_summary(config: Config, exitstatus: int, counts: dict[str, int]) -> None:
    """Add to the end of a run's output.

    Called once by the ``terminal`` plugin as the session finishes, before its own
    sections (``--durations``, the ``short task summary info`` of what needs a human)
    and the ``=== 2 done, 1 needs_human in 3m12s ===`` line. Write with
    ``config.get_plugin("terminalreporter").write_line(text)``.

    :param config: the run's :class:`~fleetrun.config.Config`.
    :param exitstatus: the exit code about to be returned.
    :param counts: the number of the run's tasks in each state, by state name
        (``{"DONE": 2, "NEEDS_HUMAN": 1}``); the tasks of a file run again that were kept
        DONE from its last run are under ``"unchanged (done earlier)"``, not ``DONE``.
    :return: nothing; return value ignored.

    May be implemented in a ``fleetconf.py``: yes.
    """


# ---------------------------------------------------------------------------------
# Collection


@hookspec(firstresult=True)
def fleetrun_collect_file(file_path: str, config: Config, keys: Any) -> Optional[TaskFile]:
    """Collect the tasks of one file.

    Called for each tasks file of ``fleetrun [run]``, ``validate`` and ``queue``. Raise
    :class:`~fleetrun.UsageError` (or ``UsageErrors``) with ``file=`` and ``line=`` for
    problems. The built-in collector takes ``.toml`` files.

    :param file_path: absolute path of a file named on the command line.
    :param config: the run's :class:`~fleetrun.config.Config`.
    :param keys: the :class:`~fleetrun.collect.KeyTable` of every key any plugin
        declared; use it to reject unknown keys.
    :return: a :class:`~fleetrun.collect.TaskFile`, or None if the file is not yours.

    firstresult: stops at the first non-None result.

    May be implemented in a ``fleetconf.py``: yes (the ``fleetconf.py`` files of a named
    file are loaded before it is collected, so one can collect a format of its own).
    """


@hookspec
def fleetrun_task_keys(config: Config) -> list[KeyDecl]:
    """Declare extra keys a tasks file may use (``[[task]]``, ``[[task.verify]]``, or a
    new verifier kind), as :class:`~fleetrun.KeyDecl` objects. Anything no plugin declared
    stays an error.

    Called once per collection, before the first file is collected. Values of declared
    keys appear in ``TaskSpec.extra`` / ``VerifySpec.extra``; a new kind becomes
    ``VerifySpec.kind``, with its value in ``VerifySpec.text``.

    :param config: the run's :class:`~fleetrun.config.Config`.
    :return: a list of :class:`~fleetrun.KeyDecl`. Results are concatenated.

    May be implemented in a ``fleetconf.py``: yes.
    """
    raise NotImplementedError


@hookspec
def fleetrun_collection_modifyitems(config: Config, items: list[TaskSpec]) -> None:
    """Filter or reorder the collected tasks in place (``-k`` is done here).

    Called once, after every file is collected and before anything is queued. The
    built-in ``-k`` selection and the check that each ``agent =`` exists are ``trylast``:
    yours sees every task first. Raise :class:`~fleetrun.UsageError` to reject the
    collection.

    :param config: the run's :class:`~fleetrun.config.Config`.
    :param items: the collected :class:`~fleetrun.TaskSpec` objects; change the list
        itself (``items[:] = ...``).
    :return: nothing; return value ignored.

    May be implemented in a ``fleetconf.py``: yes.
    """


# ---------------------------------------------------------------------------------
# Hosts


@hookspec
def fleetrun_hosts(config: Config) -> list[Host]:
    """Offer the places attempts can run, as a list of :class:`~fleetrun.Host`.

    Called the first time a command needs a host (the loop, adoption, ``cancel``,
    ``approve``...; every plugin is configured by then), and again the first time a
    name is looked up that the last answer lacked (once per name); never on every
    pass. The built-ins are ``trylast``: the ``local`` plugin offers this machine
    (:class:`~fleetrun.hosts.LocalHost`, named ``local``), the ``relay`` plugin one
    ``SSHHost`` per peer of ``peers.toml``. Offer only your own hosts. The first host
    offered under a name wins, so a host of yours named ``local`` replaces this
    machine. A name the ledger holds that no plugin offers gets a stand-in that starts
    and stops nothing: its tasks wait, with the reason (``host 'mini' is not provided
    by any loaded plugin: ...``), and ``cancel`` says what it could not stop.

    :param config: the run's :class:`~fleetrun.config.Config`.
    :return: the hosts this plugin offers, a list of :class:`~fleetrun.Host` (empty,
        or None, for none). Results are concatenated. Do not raise: the hosts are the
        run's, not one task's, and an exception may end the command as an internal
        error (exit 3).

    May be implemented in a ``fleetconf.py``: yes.
    """
    raise NotImplementedError


# ---------------------------------------------------------------------------------
# Per task: place, prepare, prompt, spawn, verify, hand off, clean up
#
# In fleetrun.hookspec_place and fleetrun.hookspec_task (imported above).


# ---------------------------------------------------------------------------------
# Reporting


@hookspec
def fleetrun_transition(
    task: Task, from_state: str, to_state: str, cause: str, attempt: Optional[int], config: Config
) -> None:
    """A task changed state (already committed to the ledger).

    Called for every transition, in the process that made it: the loop, ``fleetrun
    queue`` (``from_state`` is ``""`` and ``cause`` ``queued``), ``cancel``, ``retry``,
    ``approve``. Terminal output, the event log and reporters listen here.

    :param task: the :class:`~fleetrun.ledger.Task`, as it is after the change.
    :param from_state: the state it left (a :class:`~fleetrun.states.State` value), or
        ``""`` when it was queued.
    :param to_state: the state it is in now.
    :param cause: why, in the ledger's cause vocabulary (``verify_fail:cargo test``).
    :param attempt: the number of the attempt the change is about (1, 2...), not an
        :class:`~fleetrun.ledger.Attempt`; None when the change is about no attempt
        (``queued``, for one).
    :param config: the run's :class:`~fleetrun.config.Config`.
    :return: nothing; return value ignored.

    May be implemented in a ``fleetconf.py``: yes.
    """


@hookspec
def fleetrun_task_waiting(task: Task, reason: str, config: Config) -> None:
    """A task cannot be placed, and ``reason`` is new (not called on every pass); or a
    task delivered to a role's mailbox waits there, and where it waits is new (the
    ``mailbox`` plugin: a session is home and takes it when its turn ends, the session
    cannot receive and why, nobody is home, the role works on it).

    :param task: the :class:`~fleetrun.ledger.Task` that waits.
    :param reason: why, in words (the ``reason`` of the :class:`~fleetrun.Wait`).
    :param config: the run's :class:`~fleetrun.config.Config`.
    :return: nothing; return value ignored.

    May be implemented in a ``fleetconf.py``: yes.
    """


@hookspec(firstresult=True)
def fleetrun_status_reason(task: Task, config: Config) -> Optional[str]:
    """Say why ``fleetrun status`` should show a placed, running or verifying task as
    stuck where it runs (a peer that stopped answering, say), instead of its reason in
    the ledger. Called by ``status`` for each such task with a ``host``; the ``relay``
    plugin answers for its peers from its cached peer state.

    ``status`` runs while a loop may run elsewhere and must stay fast: read what is
    cached (no SSH, no heavy imports).

    :param task: a :class:`~fleetrun.ledger.Task` in ASSIGNED, RUNNING or VERIFYING, with
        ``task.host`` set.
    :param config: the :class:`~fleetrun.config.Config` of the ``status`` command.
    :return: the reason to show, or None to show the task's own.

    firstresult: stops at the first non-None result.

    May be implemented in a ``fleetconf.py``: yes (of the tasks files ``status`` names;
    it names none, so in practice a plugin).
    """


@hookspec
def fleetrun_status_fields(tasks: list[Task], config: Config) -> Optional[dict[str, dict[str, Any]]]:
    r"""Add fields to the tasks ``fleetrun status --json`` prints: what a plugin knows of
    them that the ledger's task rows do not hold (the ``mailbox`` plugin: the ``role`` a
    task is for, and whether its ``message`` is ``pending`` or ``claimed``). Called once
    per ``status --json``, with every task it prints.

    ``status`` runs while a loop may run elsewhere and must stay fast: one read for all
    the tasks, no network, no heavy imports; a task's ``spec`` is read on first use, so
    read it for few tasks, if any.

    :param tasks: the :class:`~fleetrun.ledger.Task`\ s printed.
    :param config: the :class:`~fleetrun.config.Config` of the ``status`` command.
    :return: task id -> the fields to add, after the core's (names of their own: a field
        the core prints is never replaced), or None.

    Results are concatenated. ``status`` merges them, in the order the plugins are
    called (a field two plugins add is the first one's).

    May be implemented in a ``fleetconf.py``: yes (in practice a plugin, as
    :func:`fleetrun_status_reason`).
    """


@hookspec
def fleetrun_verdict(task: Task, verdict: Verdict, attempt: Attempt, config: Config) -> None:
    """A verifier reached a verdict (already recorded in the ledger).

    Called once per verifier of ``task.spec.verify`` that reached a verdict (a failing
    one when it raised, or no plugin took its kind); not for ``setup`` commands.

    :param task: the :class:`~fleetrun.ledger.Task`.
    :param verdict: the :class:`~fleetrun.Verdict`.
    :param attempt: the :class:`~fleetrun.ledger.Attempt` whose work was verified.
    :param config: the run's :class:`~fleetrun.config.Config`.
    :return: nothing; return value ignored.

    May be implemented in a ``fleetconf.py``: yes.
    """


# the per-task hooks are imported to be this module's own: public, and seen by
# ``add_hookspecs`` and ``vars(fleetrun.hookspec)`` with the rest
__all__ = [
    "fleetrun_addhooks",
    "fleetrun_addoption",
    "fleetrun_agent_result",
    "fleetrun_attempt_ended",
    "fleetrun_attempt_started",
    "fleetrun_build_prompt",
    "fleetrun_candidates",
    "fleetrun_cleanup_workspace",
    "fleetrun_collect_file",
    "fleetrun_collect_work",
    "fleetrun_collection_modifyitems",
    "fleetrun_config_keys",
    "fleetrun_configure",
    "fleetrun_fetch_workspace",
    "fleetrun_handoff",
    "fleetrun_host_heartbeat",
    "fleetrun_host_paused",
    "fleetrun_hosts",
    "fleetrun_loop_pass",
    "fleetrun_place",
    "fleetrun_place_filter",
    "fleetrun_place_score",
    "fleetrun_prepare_workspace",
    "fleetrun_report_header",
    "fleetrun_sessionfinish",
    "fleetrun_sessionstart",
    "fleetrun_spawn",
    "fleetrun_start_attempt",
    "fleetrun_task_keys",
    "fleetrun_status_fields",
    "fleetrun_task_waiting",
    "fleetrun_terminal_summary",
    "fleetrun_transition",
    "fleetrun_unconfigure",
    "fleetrun_verbs",
    "fleetrun_verdict",
    "fleetrun_verify",
    "hookspec",
]

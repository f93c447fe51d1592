"""Every hook of fleetrun, grouped by stage.

Hook argument names are API forever: pluggy matches implementations by name, so an
argument may be added but never renamed. Every hook here may be implemented in a
``fleetconf.py``, in a ``-p`` module, or in an installed plugin (entry-point group
``fleetrun``), unless its docstring says otherwise. Built-in plugins implement their
hooks with ``trylast=True``, so your implementation runs first without ordering flags;
use ``tryfirst=True`` to be sure.

Hooks are always called on the supervisor's main thread. A hook that starts
something long (``fleetrun_spawn``, ``fleetrun_verify``) returns a handle at once and
the loop polls it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Union

import pluggy

if TYPE_CHECKING:
    from .collect import TaskFile
    from .config import Config, ConfigKey, Parser
    from .hostapi import Host
    from .ledger import Attempt, Task
    from .pluginmanager import FleetPluginManager
    from .reports import (
        AgentResult,
        Candidate,
        Handoff,
        Placement,
        SpawnSpec,
        Started,
        Verdict,
        VerifyHandle,
        Wait,
        Workspace,
    )
    from .session import Session
    from .taskspec import KeyDecl, TaskSpec, VerifySpec
    from .verbs import VerbDecl

hookspec = pluggy.HookspecMarker("fleetrun")


# ---------------------------------------------------------------------------------
# Configuration and session


@hookspec(historic=True)
def fleetrun_addhooks(pluginmanager: FleetPluginManager) -> None:
    """Add hook specifications of a plugin (``pluginmanager.add_hookspecs(module)``).

    Called once per plugin as it is registered. Plugin-specific hooks live with
    their plugin, like pytest-xdist's ``newhooks.py``.
    """


@hookspec
def fleetrun_addoption(parser: Parser, pluginmanager: FleetPluginManager) -> None:
    """Add command-line options with ``parser.addoption(...)`` or a group.

    Called once, before the command line is parsed. Only plugins known at start-up
    (built-ins, ``-p``, entry points, ``FLEETRUN_PLUGINS``) can add options; a
    ``fleetconf.py`` is loaded after parsing and cannot.
    """


@hookspec
def fleetrun_verbs(pluginmanager: FleetPluginManager) -> list[VerbDecl]:
    """Declare the verbs your plugin adds to the command line (``fleetrun NAME ...``), as
    a list of :class:`~fleetrun.VerbDecl` (name, help, its arguments, what runs it).
    Results are concatenated.

    Called once, before the command line is parsed: the verb chooses the parser. The
    core declares its own verbs (``run``, ``status``...) the same way. Only plugins
    known at start-up (built-ins, ``-p``, entry points, ``FLEETRUN_PLUGINS``, the
    ``plugins`` of :func:`fleetrun.main`) can add verbs; a ``fleetconf.py`` is found
    from the tasks files a verb names, too late, and implementing this hook in one
    is a usage error. A verb name fleetrun or another plugin already has is a usage
    error too: a plugin adds verbs, it cannot replace one.
    """
    raise NotImplementedError


@hookspec(historic=True)
def fleetrun_configure(config: Config) -> None:
    """The command line is parsed and every plugin is loaded.

    Stateful plugins build their object here and register it under a well-known
    name (``config.pluginmanager.register(obj, "name")``). Historic: a plugin
    registered later still gets the call.
    """


@hookspec
def fleetrun_config_keys(config: Config) -> list[ConfigKey]:
    """Declare the keys of the ``config.toml`` tables your plugin reads, as a list of
    :class:`~fleetrun.ConfigKey` (table, key, types, allowed values, a check). Results
    are concatenated.

    Called once, when ``config.toml`` is first read (every verb but ``host`` reads it as
    it starts, after the ``fleetconf.py`` files are loaded). A table or key no loaded
    plugin declared is an error (``ERROR: config.toml:LINE: table.key: unknown key``),
    as is a value of the wrong type or outside ``choices``; values reach plugins
    through ``config.setting(table, key)`` unchanged.
    """
    raise NotImplementedError


@hookspec
def fleetrun_unconfigure(config: Config) -> None:
    """The run is over; undo what ``fleetrun_configure`` did."""


@hookspec
def fleetrun_sessionstart(session: Session) -> None:
    """The ledger is open and the loop (or a CLI verb that reads tasks) starts."""


@hookspec
def fleetrun_sessionfinish(session: Session, exitstatus: int) -> None:
    """The loop has stopped; ``exitstatus`` is the exit code about to be returned."""


@hookspec
def fleetrun_report_header(config: Config) -> list[str]:
    """Lines to print below the header line of a run. Results are concatenated."""
    raise NotImplementedError


@hookspec
def fleetrun_terminal_summary(config: Config, exitstatus: int, counts: dict[str, int]) -> None:
    """Add to the end of a run's output (``config.get_plugin("terminalreporter").write_line``)."""


# ---------------------------------------------------------------------------------
# Collection


@hookspec(firstresult=True)
def fleetrun_collect_file(file_path: str, config: Config, keys: Any) -> Optional[TaskFile]:
    """Collect the tasks of one file. Stops at the first non-None result.

    :param file_path: absolute path of a file named on the command line.
    :param keys: the :class:`~fleetrun.collect.KeyTable` of every key any plugin
        declared; use it to reject unknown keys.
    :return: a :class:`~fleetrun.collect.TaskFile`, or None if the file is not
        yours. Raise :class:`~fleetrun.UsageError` (or ``UsageErrors``) for problems.
        The built-in collector takes ``.toml`` files.
    """


@hookspec
def fleetrun_task_keys(config: Config) -> list[KeyDecl]:
    """Declare extra keys a tasks file may use (``[[task]]``, ``[[task.verify]]``, or a
    new verifier kind). Anything no plugin declared stays an error.

    Values of declared keys appear in ``TaskSpec.extra`` / ``VerifySpec.extra``.
    """
    raise NotImplementedError


@hookspec
def fleetrun_collection_modifyitems(config: Config, items: list[TaskSpec]) -> None:
    """Filter or reorder the collected tasks in place (``-k`` is done here).

    Raise :class:`~fleetrun.UsageError` to reject the collection.
    """


# ---------------------------------------------------------------------------------
# Per task: place, prepare, prompt, spawn, verify, hand off, clean up


@hookspec
def fleetrun_hosts(config: Config) -> list[Host]:
    """Offer the places attempts can run: a list of :class:`~fleetrun.Host`. Results
    are concatenated; the first host offered under a name wins (a ``tryfirst``
    implementation's before the built-ins').

    Called when the run first needs a host (after every plugin is configured), and
    again whenever a name is looked up that the last answer did not have; never on
    every pass. The ``local`` plugin offers this machine (``local``), the ``relay``
    plugin one host per paired peer. A host name the ledger holds that no plugin
    offers makes its task wait, with the reason (``host 'mini' is not provided by any
    loaded plugin: ...``). May be implemented in a ``fleetconf.py``.

    :param config: the run's configuration.
    :return: the hosts this plugin offers (a list, possibly empty).
    """
    raise NotImplementedError


@hookspec
def fleetrun_candidates(config: Config) -> list[Candidate]:
    """Return more placement candidates, beyond the hosts' own (each host's
    :meth:`~fleetrun.Host.candidate`). Results are concatenated.

    Called on every pass of the loop that has a task to place. No built-in plugin
    implements it any more (hosts give their candidates); a candidate whose name no
    host has can be chosen by ``fleetrun_place``, and the task then waits with
    ``host '...' is not provided by any loaded plugin``. May be implemented in a
    ``fleetconf.py``.

    :param config: the run's configuration.
    :return: a list of :class:`~fleetrun.Candidate`.
    """
    raise NotImplementedError


@hookspec(firstresult=True)
def fleetrun_place(
    task: Task, candidates: list[Candidate], policy: Any, config: Config
) -> Optional[Union[Placement, Wait]]:
    """Decide where the next attempt of ``task`` runs. Stops at the first non-None result.

    :return: a :class:`~fleetrun.Placement` (the loop writes a lease to the ledger
        before anything starts) or a :class:`~fleetrun.Wait` whose reason is shown.
    """


@hookspec(firstresult=True)
def fleetrun_prepare_workspace(task: Task, attempt: Attempt, host: Host, config: Config) -> Optional[Workspace]:
    """Make (or find again, on a retry or resume) the directory the attempt runs in.

    Stops at the first non-None result: return None for a host that is not yours.
    The ``worktree`` plugin answers for a ``host.local`` host (a git worktree for a
    task with ``git_ref``, else the task's ``cwd`` as is); the ``relay`` plugin for its
    peers. Both are ``trylast``, so an implementation in a ``fleetconf.py`` or a
    plugin runs first, with or without ``tryfirst``. Must be idempotent: it is called
    again after a crash.

    :param task: the task, leased (ASSIGNED).
    :param attempt: the attempt just leased (``attempt.host`` is ``host.name``).
    :param host: the :class:`~fleetrun.Host` the attempt runs on.
    :param config: the run's configuration.
    :return: a :class:`~fleetrun.Workspace`, or None. Raise to refuse (an exception
        with ``permanent = True`` asks a human at once, ``WorktreeTampered`` too;
        anything else backs off and tries again).
    """


@hookspec(firstresult=True)
def fleetrun_build_prompt(task: Task, attempt: Attempt, config: Config, context: dict[str, Any]) -> Optional[str]:
    """Return the prompt for this attempt. Stops at the first non-None result.

    ``context`` holds ``handoffs`` (list of :class:`~fleetrun.Handoff` of the
    dependencies), ``failures`` (verdicts of the previous attempt, on a retry),
    ``kind`` (``fresh``, ``retry`` or ``resume``), ``resume_reason`` (on a resume, the
    cause of the move to RESUMING) and ``previous`` (the attempt that cause is about,
    or the latest one). Wrap it (``hookwrapper``/
    ``wrapper=True``) to decorate the prompt others build.
    """


@hookspec(firstresult=True)
def fleetrun_spawn(
    task: Task, attempt: Attempt, workspace: Workspace, prompt: str, config: Config
) -> Optional[SpawnSpec]:
    """Describe how to start the agent for this attempt. Stops at the first non-None result.

    The ``claude`` plugin answers for ``agent = "claude"``, ``command_agent`` for the
    agents of ``[agents.NAME]``. May be implemented in a ``fleetconf.py``.

    :param task: the task.
    :param attempt: the attempt (``attempt.info["resume_session"]``,
        ``attempt.info["budget_left_usd"]`` when they apply).
    :param workspace: the prepared :class:`~fleetrun.Workspace`.
    :param prompt: the prompt ``fleetrun_build_prompt`` built.
    :param config: the run's configuration.
    :return: a :class:`~fleetrun.SpawnSpec` (``argv``, ``env``, ``stdin``,
        ``parser``, ``session_id``), or None if the task's agent is not yours. A dict
        with those keys is accepted too (what this hook returned before SpawnSpec); a
        dict with another key is an error (``start_failed:...``, naming it). Raise
        :class:`~fleetrun.UsageError` for an agent that cannot be started as
        configured. Nothing starts here: ``fleetrun_start_attempt`` does.
    """


@hookspec(firstresult=True)
def fleetrun_start_attempt(
    task: Task, attempt: Attempt, host: Host, spawn: SpawnSpec, prompt: str, config: Config
) -> Optional[Started]:
    """Start the attempt and return at once. Stops at the first non-None result.

    The built-in default (the ``shepherd`` plugin, ``trylast``) has ``host`` start a
    shepherd (``host.start``) running ``spawn`` in the workspace
    (``attempt.workspace``), with the task environment, the timeouts and the loop's
    wake-up socket. A plugin that runs an attempt its own way (a mailbox delivering it
    to a role, a cluster scheduler) returns its own :class:`~fleetrun.Started`; the
    loop then polls ``host.status`` for the attempt as for any other. May be
    implemented in a ``fleetconf.py``.

    :param task: the task (ASSIGNED).
    :param attempt: the attempt, ``starting``; ``attempt.workspace`` is the prepared
        workspace (a dict of :class:`~fleetrun.Workspace`'s fields).
    :param host: the :class:`~fleetrun.Host` it was placed on.
    :param spawn: the :class:`~fleetrun.SpawnSpec` ``fleetrun_spawn`` returned.
    :param prompt: the prompt.
    :param config: the run's configuration.
    :return: a :class:`~fleetrun.Started`, or None to leave it to the next
        implementation (none at all: the task needs a human, ``plugin_missing``).
        Raise :class:`~fleetrun.StartRefused` when the host will not start it (a retry
        is not used, the task backs off from that host); any other exception is
        ``start_failed:<message>`` (backed off too).
    """


@hookspec(firstresult=True)
def fleetrun_agent_result(task: Task, attempt: Attempt, log_path: str, exit_code: Optional[int], config: Config) -> Optional[AgentResult]:
    """Read an ended attempt's output and say whether the session completed.

    Stops at the first non-None result. An agent's exit code is not to be trusted:
    the ``claude`` plugin needs a ``result`` event without ``is_error``.
    """


@hookspec(firstresult=True)
def fleetrun_collect_work(task: Task, attempt: Attempt, workspace: Workspace, host: Host,
                          config: Config) -> Optional[str]:
    """An attempt's session ended well; gather its work before the verifiers run.

    Stops at the first non-None result: return None for a host that is not yours.
    The ``worktree`` plugin answers for a ``host.local`` worktree (it commits what the
    agent left uncommitted on the task's branch and returns the new commit); the
    ``relay`` plugin for its peers (it commits there, and fetches the branch back
    when a verifier or a dependent needs it here). May be implemented in a
    ``fleetconf.py``.

    :param task: the task (still RUNNING).
    :param attempt: the attempt that ended.
    :param workspace: the attempt's :class:`~fleetrun.Workspace`.
    :param host: the :class:`~fleetrun.Host` the attempt ran on.
    :param config: the run's configuration.
    :return: the commit made, ``""`` for "handled, nothing made", or None.
        ``WorktreeTampered`` sends the task to a human; a ``GitError`` is noted and
        the verifiers run all the same.
    """


@hookspec(firstresult=True)
def fleetrun_verify(
    task: Task, verifier: VerifySpec, workspace: Workspace, attempt: Attempt, host: Host, config: Config
) -> Optional[Union[Verdict, VerifyHandle]]:
    """Run one verifier. Stops at the first non-None result: return None for a
    ``verifier.kind`` (or a host) that is not yours.

    Also called for each of a task's ``setup`` commands, before its agent's first
    attempt in a workspace: then ``verifier`` is a ``run`` spec whose
    ``extra["setup"]`` is the command's 1-based number (it is not one of
    ``task.spec.verify``). A plugin that runs ``run`` commands elsewhere (on a peer,
    in a sandbox) so runs setup the same way; one that judges ``run`` verifiers
    differently should leave these to the default (return None). ``verify_run``
    answers ``run`` for a ``host.local`` host, the ``relay`` plugin for its peers.
    May be implemented in a ``fleetconf.py``.

    :param task: the task (VERIFYING, or ASSIGNED for a setup command).
    :param verifier: the :class:`~fleetrun.VerifySpec` (``kind``, ``text``,
        ``label``, ``timeout_s``, ``extra``).
    :param workspace: the attempt's :class:`~fleetrun.Workspace`.
    :param attempt: the attempt whose work is verified.
    :param host: the :class:`~fleetrun.Host` the attempt ran on.
    :param config: the run's configuration.
    :return: a :class:`~fleetrun.Verdict`, or a handle whose ``poll()`` returns one
        when ready (for anything that takes time). A verifier must be safe to run
        again: after a crash it is.
    """


@hookspec(firstresult=True)
def fleetrun_handoff(task: Task, attempt: Attempt, host: Host, config: Config) -> Optional[Handoff]:
    """Build what a DONE task hands to its dependents. Stops at the first non-None.

    The ``worktree`` plugin answers for a ``host.local`` host (the branch and the last
    session's summary), the ``relay`` plugin for its peers (and how to fetch the
    branch). May be implemented in a ``fleetconf.py``.

    :param task: the task (DONE, or NEEDS_HUMAN being approved).
    :param attempt: the attempt that ran (None if none did, for an approved task).
    :param host: the :class:`~fleetrun.Host` the task ran on.
    :param config: the run's configuration.
    :return: a :class:`~fleetrun.Handoff`, or None.
    """


@hookspec
def fleetrun_cleanup_workspace(task: Task, host: Host, config: Config) -> None:
    """A task reached a terminal state; remove what is no longer needed (a clean
    worktree after DONE; its branch stays). Every implementation is called: each
    acts only for a host of its own (``worktree``: ``host.local``; ``relay``: its
    peers). May be implemented in a ``fleetconf.py``.

    :param task: the task, in its terminal state.
    :param host: the :class:`~fleetrun.Host` of ``task.host``.
    :param config: the run's configuration.
    :return: nothing (results are ignored). A ``GitError`` or ``OSError`` is noted
        on the task.
    """


# ---------------------------------------------------------------------------------
# Reporting


@hookspec
def fleetrun_transition(
    task: Task, from_state: str, to_state: str, cause: str, attempt: Optional[int], config: Config
) -> None:
    """A task changed state (already committed to the ledger). Terminal output,
    the event log and reporters listen here. Called for every transition."""


@hookspec
def fleetrun_task_waiting(task: Task, reason: str, config: Config) -> None:
    """A task cannot be placed, and ``reason`` is new (not called on every pass)."""


@hookspec
def fleetrun_verdict(task: Task, verdict: Verdict, attempt: Attempt, config: Config) -> None:
    """A verifier reached a verdict (already recorded in the ledger)."""

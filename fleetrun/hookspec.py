"""Every hook of fleetrun, grouped by stage: configuration and session, collection,
hosts, placement, the per-task hooks in the order an attempt meets them (prepare,
prompt, spawn, start, agent result, collect, verify, hand off, clean up), and reporting.

Hook argument names are API forever: pluggy matches implementations by name, so an
argument may be added but never renamed. Every hook here may be implemented in a
``fleetconf.py``, in a ``-p`` module, or in an installed plugin (entry-point group
``fleetrun``), unless its docstring says otherwise. Built-in plugins implement their
hooks with ``trylast=True``, so your implementation runs first without ordering flags;
use ``tryfirst=True`` to be sure.

Hooks are always called on the supervisor's main thread. A hook that starts
something long (``fleetrun_start_attempt``, ``fleetrun_verify``) returns at once (a
handle, or what started) and the loop polls it.

``pm.add_hookspecs(fleetrun.hookspec)`` adds them all. The ``hookspec`` marker itself
lives in :mod:`fleetrun.hookimpl` (this module imports it from there) and is exported as
``fleetrun.hookspec``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Union

from .hookimpl import hookspec

if TYPE_CHECKING:
    from .collect import TaskFile
    from .config import Config, ConfigKey, Parser
    from .hostapi import Host
    from .ledger import Attempt, QueuedTasks, Task
    from .pluginmanager import FleetPluginManager
    from .policy import Policy
    from .reports import (
        AgentResult,
        Candidate,
        CollectHandle,
        Handoff,
        HandoffHandle,
        Placement,
        SpawnSpec,
        Started,
        StartHandle,
        Verdict,
        VerifyHandle,
        Wait,
        Workspace,
        WorkspaceHandle,
    )
    from .session import Session
    from .taskspec import KeyDecl, TaskSpec, VerifySpec
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

    Called once for every verb (not for ``--help`` or ``--version``, nor for a
    ``status`` that asks no plugin: docs/plugins.md), after
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
# Placement: the candidates of a pass, then fleetrun_place with its filter and score


@hookspec
def fleetrun_candidates(config: Config) -> list[Candidate]:
    """Add placement candidates to this pass's, beyond the hosts' own.

    Called once per pass of the loop that has a task to place (not once per task).
    The pass's candidates are these, then each host's own
    (:meth:`~fleetrun.Host.candidate`, measured afresh), and every ``fleetrun_place``
    of the pass gets that one list. No built-in plugin implements it: hosts give their
    candidates. A candidate is only a place to choose: when the one chosen is named
    after no host, nothing is leased and the task waits with ``host 'NAME' is not
    provided by any loaded plugin: ...`` (a wait only a person can clear). Offer a
    host through ``fleetrun_hosts`` for a place attempts really run.

    :param config: the run's :class:`~fleetrun.config.Config`.
    :return: a list of :class:`~fleetrun.Candidate` (empty, or None, for none). Results
        are concatenated. An exception ends the command as an internal error (exit 3):
        the candidates are the pass's, not one task's.

    May be implemented in a ``fleetconf.py``: yes.
    """
    raise NotImplementedError


@hookspec(firstresult=True)
def fleetrun_place(
    task: Task, candidates: list[Candidate], policy: Policy, config: Config
) -> Optional[Union[Placement, Wait]]:
    """Decide where the next attempt of ``task`` runs, or why it waits.

    Called on every pass of the loop for each task that can be placed (READY,
    RETRYING or RESUMING, its previous attempt over, some of its budget left); a task
    placed earlier in the pass is already counted in its candidate's ``running`` and
    free memory. The built-in decision is the ``placement`` plugin's (``trylast``: the
    pin, a retry's machine, ``requires``, the floors, backoff, then the
    ``fleetrun_place_filter`` and ``fleetrun_place_score`` hooks); the ``relay``
    plugin wraps the hook (``wrapper=True``) only to wake the loop up while a peer's
    first probe is pending. A result of yours replaces the built-in decision and every
    check in it (docs/plugins.md lists them): to add a rule and keep them, implement
    the two hooks instead, or call ``fleetrun.plugins.placement.builtin_place``.

    :param task: the :class:`~fleetrun.ledger.Task` to place (``spec`` with its
        ``requires`` and ``peer``, ``state``, ``host`` of its previous attempt).
    :param candidates: this pass's :class:`~fleetrun.Candidate` objects (those of
        ``fleetrun_candidates``, then the hosts' own), one list for every task of the
        pass.
    :param policy: the :class:`~fleetrun.policy.Policy` of ``policy.toml`` in force on
        this pass (its limits are in each candidate's fields already).
    :param config: the run's :class:`~fleetrun.config.Config`.
    :return: a :class:`~fleetrun.Placement` naming a candidate (the loop leases the
        attempt there in the ledger before anything starts), a :class:`~fleetrun.Wait`
        whose ``reason`` is shown (with ``operator`` when only a person can clear it),
        or None to leave the task to the next implementation. With none at all the
        task waits (``no plugin places tasks``, a wait only a person can clear); so it
        does, unleased, on a ``Placement`` on a host no loaded plugin provides (``host
        'NAME' is not provided by any loaded plugin: ...``). An exception is the
        task's internal error: nothing is leased, and it needs a human
        (``internal_error:<Type: message>``).

    firstresult: stops at the first non-None result.

    May be implemented in a ``fleetconf.py``: yes.
    """


@hookspec
def fleetrun_place_filter(task: Task, candidate: Candidate, config: Config) -> Optional[str]:
    """Keep ``task`` off ``candidate``, on top of the built-in checks. Every
    implementation is called; any non-empty string excludes the candidate for this
    task. Results are concatenated.

    Called by the built-in ``fleetrun_place`` (the ``placement`` plugin) inside its
    decision, only for a candidate that passed every built-in check (reachable, not
    draining, not backing off from this task, a free slot, the memory/load/disk
    floors, ``requires``, the pin, a retry's machine): a filter can exclude more, never
    let in what those exclude. Called at most once per (task, candidate) per pass of
    the loop: the answer is remembered until the next pass, so a filter that looks at
    something slow is not asked again for the same pair. Not called when a plugin's
    own ``fleetrun_place`` returns a result first.

    May be implemented in a ``fleetconf.py``: yes.

    :param task: the task being placed (a :class:`~fleetrun.ledger.Task`: ``name``,
        ``spec`` with its ``requires``, ``state``, ``host`` of the previous attempt).
    :param candidate: one place the attempt could run (a :class:`~fleetrun.Candidate`:
        ``name`` — ``local`` for this machine, else the peer's —, ``kind``, ``tags``,
        ``tools``, the measured headroom).
    :param config: the run's config.
    :return: None (or ``""``) to let the candidate take the task; else why not, as a
        phrase that follows the candidate's name, the way the built-in reasons read:
        ``"keeps GPU tasks off"`` is shown as ``this machine keeps GPU tasks off``
        (``mini keeps GPU tasks off`` for a peer) in the task's wait, in ``fleetrun
        status`` and in the ``waiting:`` line. With several filters saying no, the
        first one's reason is shown (yours run before the built-ins'). The loop
        cannot see a plugin's rule change, so when every candidate is held by such a
        reason (or one only a person can clear) the wait counts as one only you can
        clear: a run whose only tasks left wait like that ends (``cannot place:``).
    """


@hookspec
def fleetrun_place_score(task: Task, candidate: Candidate, config: Config) -> Optional[float]:
    """Prefer some candidates for ``task``. Results are concatenated. They are summed
    and the sum is added to the built-in score; the highest total wins.

    The built-in score is the candidate's **free memory after placing, in MB** (its
    free memory minus the memory the task is expected to take), so a score of ``1000``
    weighs as much as 1000 MB of free memory, and ``1e9`` wins over any difference of
    memory. Ties go to the candidate running fewer tasks, then to the first listed. A
    candidate whose free memory is unknown ranks below every candidate whose figure
    is known, whatever its score; among such candidates the score alone decides.

    Called by the built-in ``fleetrun_place`` only for candidates that passed every
    built-in check and every ``fleetrun_place_filter``: a score chooses among the
    candidates that can take the task, it never lets in one that cannot. Called at
    most once per (task, candidate) per pass of the loop.

    May be implemented in a ``fleetconf.py``: yes.

    :param task: the task being placed (a :class:`~fleetrun.ledger.Task`).
    :param candidate: one candidate that can take it (a :class:`~fleetrun.Candidate`).
    :param config: the run's config.
    :return: a number to add to the built-in score (negative to avoid the candidate),
        or None for no opinion.
    """


# ---------------------------------------------------------------------------------
# Per task, in the order an attempt meets them once placed: prepare, prompt, spawn,
# start, agent result, collect, verify, hand off, clean up


@hookspec(firstresult=True)
def fleetrun_prepare_workspace(
    task: Task, attempt: Attempt, host: Host, config: Config
) -> Union[Workspace, WorkspaceHandle, None]:
    """Make the directory the attempt runs in on ``host``, or find again the one an
    earlier attempt of the task made (a retry or a resume works in the same worktree).

    Called once per attempt, right after it is leased, before its ``setup`` commands
    and its prompt. The built-ins are ``trylast``, so yours runs first, with or without
    ``tryfirst``: the ``worktree`` plugin answers for a ``host.local`` host (for a task
    with ``git_ref``, a git worktree on the task's own branch, made from ``git_ref`` or
    reused, with ``base = "dependencies"`` its dependencies' branches merged into a new
    one; else the task's ``cwd`` as it is), the ``relay`` plugin for the peers it
    provides (the peer prepares it). Each returns None for any other host, and so
    should yours. It is asked again for the next attempt after a retry, a resume or a
    crash, so it must be idempotent: find what it made before, never make a second one.

    :param task: the :class:`~fleetrun.ledger.Task`, just leased (ASSIGNED).
    :param attempt: the :class:`~fleetrun.ledger.Attempt` just leased (``leased``;
        ``attempt.host`` is ``host.name``, ``attempt.kind`` is ``fresh``, ``retry`` or
        ``resume``).
    :param host: the :class:`~fleetrun.Host` it was placed on.
    :param config: the run's :class:`~fleetrun.config.Config`.
    :return: a :class:`~fleetrun.Workspace` (recorded as ``attempt.workspace``; its
        ``root``, or the ``path`` of a worktree, becomes ``task.worktree``, its
        ``branch`` ``task.branch``), or a :class:`~fleetrun.reports.WorkspaceHandle` whose
        ``poll()`` gives it later (the ``worktree`` plugin adds a new worktree on a worker
        of :mod:`fleetrun.effects`; the task stays ASSIGNED meanwhile), or None for a host
        that is not yours. With none at
        all the task needs a human at once (``plugin_missing:no plugin prepared a
        workspace ...``). Raise to refuse: an exception with ``permanent = True`` (a
        bad ``git_ref``, a branch checked out elsewhere) asks a human at once
        (``workspace_failed:<message>``, or its ``cause`` when it has one: the
        ``worktree`` plugin's ``merge_conflict:<files>``; its ``workspace``, when it
        has one, is recorded as a returned one is, for the human to find), as
        ``WorktreeTampered`` does (``worktree_tampered:...``); any other exception backs the task off from that
        host without using a retry (``start_failed:<message>``, or
        ``peer_refused:<message>`` for a :class:`~fleetrun.StartRefused`; after ten
        attempts in a row that did not start, it needs a human).

    firstresult: stops at the first non-None result.

    May be implemented in a ``fleetconf.py``: yes.
    """


@hookspec(firstresult=True)
def fleetrun_build_prompt(task: Task, attempt: Attempt, config: Config, context: dict[str, Any]) -> Optional[str]:
    """Return the prompt for this attempt.

    Called once per attempt, after its workspace is prepared (and set up) and before
    ``fleetrun_spawn``. Wrap it (``wrapper=True`` or ``hookwrapper=True``) to decorate the
    prompt others build; the ``prompt`` plugin builds the default one.

    :param task: the :class:`~fleetrun.ledger.Task`.
    :param attempt: the :class:`~fleetrun.ledger.Attempt` about to start.
    :param config: the run's :class:`~fleetrun.config.Config`.
    :param context: ``handoffs`` (list of :class:`~fleetrun.Handoff` of the
        dependencies), ``failures`` (verdicts of the previous attempt, on a retry),
        ``kind`` (``fresh``, ``retry`` or ``resume``), ``resume_reason`` (on a resume, the
        cause of the move to RESUMING) and ``previous`` (the attempt that cause is about,
        or the latest one).
    :return: the prompt (str), or None to leave it to the next implementation; with
        none at all, the task's own ``prompt`` is used.

    firstresult: stops at the first non-None result.

    May be implemented in a ``fleetconf.py``: yes.
    """


@hookspec(firstresult=True)
def fleetrun_spawn(
    task: Task, attempt: Attempt, workspace: Workspace, prompt: str, config: Config
) -> Optional[SpawnSpec]:
    """Describe how to start the attempt's agent: its command line and environment.
    Nothing starts here: ``fleetrun_start_attempt`` does.

    Called once per attempt, after ``fleetrun_build_prompt``, its workspace prepared
    (and set up). Answer for your own agents (``task.spec.agent``) and return None for
    the others: the built-ins (``trylast``) answer for theirs, the ``claude`` plugin
    for ``agent = "claude"``, ``command_agent`` for the agents of ``[agents.NAME]`` (in
    ``config.toml`` or the tasks file).

    :param task: the :class:`~fleetrun.ledger.Task` (ASSIGNED).
    :param attempt: the :class:`~fleetrun.ledger.Attempt` about to start;
        ``attempt.info["resume_session"]`` (the previous attempt's session id, to go
        on with; not set when that attempt's agent could not find the session it was
        to resume: its outcome :data:`~fleetrun.reports.SESSION_NOT_FOUND`) and ``attempt.info["budget_left_usd"]`` (what is left of the task's
        ``budget_usd``) are set when they apply.
    :param workspace: the prepared :class:`~fleetrun.Workspace`.
    :param prompt: the prompt (str) ``fleetrun_build_prompt`` built, or the task's own
        ``prompt`` when no implementation built one.
    :param config: the run's :class:`~fleetrun.config.Config`.
    :return: a :class:`~fleetrun.SpawnSpec` (``argv``, ``env``, ``stdin``,
        ``parser``, ``session_id``), or None for an agent that is not yours. A dict
        with those keys is accepted too (what this hook returned before SpawnSpec); a
        dict with another key, or anything else, is ``start_failed:<why>``. With none
        at all the task needs a human at once (``plugin_missing:no plugin spawns agent
        ...``), as it does when ``argv[0]`` is not found on a ``host.local`` host
        (``agent_not_found:...``). Raise :class:`~fleetrun.UsageError` for an agent
        that cannot be started as configured: ``start_failed:<message>``, backed off
        like any attempt that did not start (no retry is used). Any other exception
        is an internal error (``internal_error:<Type: message>``).

    firstresult: stops at the first non-None result.

    May be implemented in a ``fleetconf.py``: yes.
    """


@hookspec(firstresult=True)
def fleetrun_start_attempt(
    task: Task, attempt: Attempt, host: Host, spawn: SpawnSpec, prompt: str, config: Config
) -> Union[Started, StartHandle, None]:
    """Start the attempt and return at once; the loop watches it from then on.

    Called once per attempt, after ``fleetrun_spawn``. The built-in default is the
    ``shepherd`` plugin's (``trylast``): ``host.start`` runs a shepherd for ``spawn`` in
    the workspace, with the task environment, the timeouts and the loop's wake-up
    socket (:func:`fleetrun.starting.shepherd_spec`), whatever the host is (a detached
    process here, ``fleetrun host start`` on a peer). A plugin that runs attempts its
    own way (a mailbox delivering it to a role, a cluster scheduler) returns its own
    :class:`~fleetrun.Started` first, and None for the attempts it leaves to the
    default. The loop then asks ``host.status`` about the attempt as about any other,
    so such a plugin runs it on a host whose ``status`` knows it (one it offers through
    ``fleetrun_hosts``), named in the ``Started``'s ``host`` when it is not the placed
    one (the ``mailbox`` plugin's ``mailbox`` host).

    :param task: the :class:`~fleetrun.ledger.Task` (ASSIGNED).
    :param attempt: the :class:`~fleetrun.ledger.Attempt`, ``starting``;
        ``attempt.workspace`` is the prepared workspace (a dict of
        :class:`~fleetrun.Workspace`'s fields), ``attempt.info["argv"]`` the agent's
        command line.
    :param host: the :class:`~fleetrun.Host` it was placed on.
    :param spawn: the :class:`~fleetrun.SpawnSpec` ``fleetrun_spawn`` returned.
    :param prompt: the prompt (str), as ``fleetrun_spawn`` got it.
    :param config: the run's :class:`~fleetrun.config.Config`.
    :return: a :class:`~fleetrun.Started` (``pid``, ``token``, ``dir``; a ``pid`` of
        None: it may have started, ``host.status`` finds out; ``host``: the host it
        runs on, recorded on the attempt, while the task's ``host`` stays the placed
        one; ``cause``: the cause of the move to RUNNING, ``started`` when None),
        recorded with the attempt before the task moves to RUNNING (cancelled meanwhile, it is stopped
        with ``host.stop``); or a :class:`~fleetrun.reports.StartHandle` whose ``poll()``
        gives that Started once the host answered (a peer's ``start`` request, not waited
        for: the task stays ASSIGNED, the attempt ``starting``; what ``poll()`` raises is
        handled as what this hook raises); or None to leave it to the next implementation. With none
        at all the task needs a human at once (``plugin_missing:no plugin started the
        attempt ...``). Raise :class:`~fleetrun.StartRefused` when the host will not
        start it (``peer_refused:<message>``), :class:`fleetrun.hostapi.AgentNotFound`
        when the agent is not installed where it would run (``agent_not_found:<message>``,
        a human is asked at once: the default raises it for a ``host.local`` host whose
        ``PATH`` lacks ``argv[0]``, so an attempt another plugin takes first needs no
        agent here); any other exception is
        ``start_failed:<message>``. Both back the task off from that host without
        using a retry (after ten attempts in a row that did not start, it needs a
        human).

    firstresult: stops at the first non-None result.

    May be implemented in a ``fleetconf.py``: yes.
    """


@hookspec(firstresult=True)
def fleetrun_agent_result(
    task: Task, attempt: Attempt, log_path: str, exit_code: Optional[int], config: Config
) -> Optional[AgentResult]:
    """Read an ended attempt's output and say whether the session completed.

    Called once per attempt whose agent ended (or whose shepherd died), before the
    attempt is recorded. An agent's exit code is not to be trusted: the ``claude`` plugin
    needs a ``result`` event without ``is_error``. Classify the end in ``result.end``
    (:class:`~fleetrun.reports.AgentEnd`: ``ok``, ``resume``, ``give_up``,
    ``pause_host``, ``back_off``, ``not_started``): the core names no agent's reasons
    (a usage limit, a rate limit, a cap reached are the plugin's to say), and the cause
    words it uses are the plugin's ``CAUSE_WORDS`` (docs/plugins.md, "An agent's end").

    :param task: the :class:`~fleetrun.ledger.Task`.
    :param attempt: the ended :class:`~fleetrun.ledger.Attempt`.
    :param log_path: the attempt's output, on this machine (for a peer, the copy
        fetched as its status is polled).
    :param exit_code: the agent's exit code, or None when it is unknown (killed, or the
        shepherd died).
    :param config: the run's :class:`~fleetrun.config.Config`.
    :return: an :class:`~fleetrun.AgentResult`, or None if the output is not yours
        (with none at all, an agent that exited has the outcome ``unknown``, and its
        cost is unknown).

    firstresult: stops at the first non-None result.

    May be implemented in a ``fleetconf.py``: yes.
    """


@hookspec(firstresult=True)
def fleetrun_collect_work(
    task: Task, attempt: Attempt, workspace: Workspace, host: Host, config: Config
) -> Union[str, CollectHandle, None]:
    """An attempt's session ended well: gather its work before the verifiers run, so
    they, the handoff and the dependents see what the agent did.

    Called once per attempt whose session ended well, before its task moves to
    VERIFYING; again after a crash between the two, so it must be safe to repeat. The
    built-ins are ``trylast``: the ``worktree`` plugin answers for a worktree on a
    ``host.local`` host (it commits what the agent left uncommitted, onto the task's
    own branch only), the ``relay`` plugin for its peers (it commits there, and
    fetches the branch back when a ``brain`` or ``agent`` verifier or a dependent needs
    it here). Return None for a host that is not yours.

    :param task: the :class:`~fleetrun.ledger.Task` (still RUNNING).
    :param attempt: the :class:`~fleetrun.ledger.Attempt` that ended.
    :param workspace: the attempt's :class:`~fleetrun.Workspace` (the task's ``cwd``
        when none was recorded).
    :param host: the :class:`~fleetrun.Host` the attempt ran on.
    :param config: the run's :class:`~fleetrun.config.Config`.
    :return: the commit made (str), ``""`` for "handled, nothing made", or None to
        leave it to the next implementation (the ``worktree`` plugin returns None when
        there is nothing to commit, too); or a :class:`~fleetrun.reports.CollectHandle`
        whose ``poll()`` gives that answer later (None until then), for work that takes
        a while: the loop polls it each pass on its main thread, handling other tasks
        meanwhile, and the task stays RUNNING, its attempt ``ended``, until it answers
        (in a work loop the ``worktree`` plugin returns one, its git commands on a
        worker of :mod:`fleetrun.effects`; the ``relay`` plugin answers directly). A
        task cancelled while its handle runs goes no further: the handle's answer is
        dropped. A crash before the answer collects again after the restart. The loop
        does not read the result; it only ends the call (on a peer, ``fleetrun host
        collect`` sends it back). Raise (or have ``poll()`` raise)
        ``fleetrun.gitutil.WorktreeTampered`` to send the task to a human
        (``worktree_tampered:...; nothing was committed``); a ``GitError`` is noted on
        the task and the verifiers run all the same; any other exception is the task's
        internal error (it needs a human, ``internal_error:<Type: message>``).

    firstresult: stops at the first non-None result.

    May be implemented in a ``fleetconf.py``: yes.
    """


@hookspec(firstresult=True)
def fleetrun_verify(
    task: Task, verifier: VerifySpec, workspace: Workspace, attempt: Attempt, host: Host, config: Config
) -> Optional[Union[Verdict, VerifyHandle]]:
    """Run one verifier of an attempt's work.

    Called for each verifier of ``task.spec.verify`` in order, one at a time: each
    verdict is recorded (and ``fleetrun_verdict`` called) before the next starts, and
    the first failure ends the round (a retry, or a human); and for each verifier's
    baseline (kind ``baseline``, before the task's first attempt). A task's ``setup``
    commands are not verifiers: they go to :func:`fleetrun_setup_step`. After a crash,
    a verifier whose verdict was not recorded runs again from the start: each must be
    safe to run again.

    Answer for your own ``verifier.kind`` (and hosts) and return None for the rest.
    The built-ins are ``trylast``: ``verify_run`` runs ``run`` on a ``host.local``
    host; the ``relay`` plugin runs ``run`` (setup included) on its peers, and fails
    there any other kind that nothing answered; ``verify_brain`` and ``verify_agent``
    judge ``brain`` and ``agent`` on this machine, for any host (a peer's branch is
    fetched back first). A plugin that runs ``run`` commands elsewhere (a sandbox) so
    runs setup the same way; one that only judges ``run`` verifiers differently leaves
    the setup commands to the default (returns None for them).

    :param task: the :class:`~fleetrun.ledger.Task` (VERIFYING, or ASSIGNED for a
        baseline).
    :param verifier: the :class:`~fleetrun.VerifySpec` (``kind``, ``text``,
        ``label``, ``timeout_s``, ``extra``).
    :param workspace: the attempt's :class:`~fleetrun.Workspace`.
    :param attempt: the :class:`~fleetrun.ledger.Attempt` whose work is verified (for a
        baseline, the one about to start).
    :param host: the :class:`~fleetrun.Host` the attempt ran on (or is to run on).
    :param config: the run's :class:`~fleetrun.config.Config`.
    :return: a :class:`~fleetrun.Verdict` (with ``verifier.label`` as its ``label``);
        for anything that takes time, a :class:`~fleetrun.VerifyHandle` the loop polls
        on every pass until ``poll()`` returns one (``cancel()`` stops it; ``fileno()``
        and ``next_deadline()`` let the loop sleep until it has news); or None. A
        Verdict whose ``error`` is set says the verifier could not judge the work (an
        ERROR): it never sends the agent back to work; ``"permanent"`` asks a human at
        once, ``"transient"`` runs the verifier again after a backoff
        (docs/verifiers.md). With none at all the verifier could not judge (a permanent
        ERROR, ``no plugin runs 'KIND' verifiers``), as one that raises
        (``verifier error: <Type>: <message>``).

    firstresult: stops at the first non-None result.

    May be implemented in a ``fleetconf.py``: yes.
    """


@hookspec(firstresult=True)
def fleetrun_setup_step(
    task: Task, step: VerifySpec, number: int, workspace: Workspace, attempt: Attempt, host: Host, config: Config
) -> Optional[Union[Verdict, VerifyHandle]]:
    """Run setup command ``number`` of a task in its workspace, before its agent's first
    attempt there.

    Called for each of ``task.spec.setup`` in order, one at a time, while the task is
    ASSIGNED and its attempt ``leased``: a command that passes is recorded before the
    next starts; one that fails sends the task to a human (``setup_failed:CMD:
    SUMMARY``), without using a retry. Run it as a ``run`` verifier runs: ``/bin/sh -c``
    in the workspace, with the ``FLEETRUN_*`` environment, ``step.timeout_s``, its
    output in a file. After a crash setup runs again from the start: commands must be
    safe to repeat. The built-ins are ``trylast``: ``verify_run`` runs them on a
    ``host.local`` host (output in ``setup-N.out``), the ``relay`` plugin on its peers;
    a plugin that runs ``run`` commands elsewhere (a sandbox) answers for its hosts.

    :param task: the :class:`~fleetrun.ledger.Task` (ASSIGNED).
    :param step: the command, a :class:`~fleetrun.VerifySpec` of kind ``run``
        (``text``, ``label``, ``timeout_s``).
    :param number: its 1-based place in ``task.spec.setup``.
    :param workspace: the attempt's :class:`~fleetrun.Workspace`.
    :param attempt: the :class:`~fleetrun.ledger.Attempt` about to start.
    :param host: the :class:`~fleetrun.Host` it is to run on.
    :param config: the run's :class:`~fleetrun.config.Config`.
    :return: a :class:`~fleetrun.Verdict` (its ``reason`` says how it ended, ``exit code
        N``), a :class:`~fleetrun.VerifyHandle` the loop polls, or None for a host
        that is not yours. With none at all the command fails (``no plugin runs setup
        commands``), as one that raises (``cannot run: <Type>: <message>``).

    firstresult: stops at the first non-None result.

    May be implemented in a ``fleetconf.py``: yes.
    """


@hookspec(firstresult=True)
def fleetrun_fetch_workspace(task: Task, attempt: Attempt, workspace: Workspace, config: Config) -> Optional[Workspace]:
    """Bring the work of an attempt that ran on a host whose files are elsewhere (not
    ``host.local``) to a workspace on this machine, for a verifier that runs here.

    Called by a verifier whose kind runs on the supervising machine (``brain``,
    ``agent``: ``KeyDecl.runs == "here"``) when the attempt ran on such a host. The
    ``relay`` plugin answers for its peers (it fetches the task's branch back into a
    worktree here); answer for your own hosts (``attempt.host``) and return None for
    the rest. With no answer the verifier fails, saying the workspace is on that host;
    an exception fails it with the message.

    :param task: the :class:`~fleetrun.ledger.Task` being verified.
    :param attempt: the :class:`~fleetrun.ledger.Attempt` whose work is verified.
    :param workspace: the attempt's :class:`~fleetrun.Workspace` on its host.
    :param config: the run's :class:`~fleetrun.config.Config`.
    :return: a :class:`~fleetrun.Workspace` on this machine holding the work, or None.

    firstresult: stops at the first non-None result.

    May be implemented in a ``fleetconf.py``: yes.
    """


@hookspec(firstresult=True)
def fleetrun_handoff(
    task: Task, attempt: Optional[Attempt], host: Host, config: Config
) -> Union[Handoff, HandoffHandle, None]:
    """Build what a finished task hands to the tasks that depend on it: its branch, a
    summary, how to get its work.

    Called once when the task's last verifier passed, before it moves to DONE (for a
    task without verifiers, once its session ended well), and by ``fleetrun approve``
    for a NEEDS_HUMAN task it moves to DONE. The built-ins are ``trylast``: the
    ``worktree`` plugin answers for a ``host.local`` host (the task's branch and a
    summary of at most 2000 characters: what the agent wrote to
    ``$FLEETRUN_SUMMARY_FILE``, else its session's final message, else the subjects of
    its branch's commits; :mod:`fleetrun.summary`), the ``relay`` plugin for its
    peers (the branch as fetched back here, and how to fetch it from the peer). Return
    None for a host that is not yours.

    :param task: the :class:`~fleetrun.ledger.Task` (VERIFYING, every verifier passed;
        or NEEDS_HUMAN, being approved).
    :param attempt: the :class:`~fleetrun.ledger.Attempt` whose work is handed on (for
        ``approve``, the newest that ran), or None when the task has no attempt.
    :param host: the :class:`~fleetrun.Host` of ``task.host``, where the work is.
    :param config: the run's :class:`~fleetrun.config.Config`.
    :return: a :class:`~fleetrun.Handoff`, recorded with the task and given to each
        dependent's ``fleetrun_build_prompt`` (``context["handoffs"]``), or None (with
        none at all, the dependents get no handoff from this task); or a
        :class:`~fleetrun.reports.HandoffHandle` whose ``poll()`` gives the Handoff later
        (None until then), for one that takes a while: the loop polls it each pass on its
        main thread, handling other tasks meanwhile, and the task stays VERIFYING until
        it answers (in a work loop the ``worktree`` plugin's commit-subject summary, a
        ``git log``, is read on a worker of :mod:`fleetrun.effects`; ``approve`` waits
        for it). A task cancelled meanwhile goes no further; after a crash the hook is
        called again. An exception (from the hook or ``poll()``) is an internal error:
        in the loop the task needs a human instead of being DONE
        (``internal_error:<Type: message>``).

    firstresult: stops at the first non-None result.

    May be implemented in a ``fleetconf.py``: yes.
    """


@hookspec
def fleetrun_cleanup_workspace(task: Task, host: Host, config: Config) -> None:
    """A task reached a terminal state: remove what is no longer needed (a clean
    worktree after DONE; its branch stays).

    Called when the work loop moves a task to DONE or NEEDS_HUMAN, when ``fleetrun
    approve`` moves one to DONE, and when a restarted loop finds the worktree of a
    DONE task on a ``host.local`` host still there (a crash came before its cleanup),
    so it must be safe to call again; on a peer, ``fleetrun host cleanup`` calls it for
    the worktree the peer made, with the peer's own local host. Not called by
    ``fleetrun cancel``.

    Every implementation is called, so each acts only for a host of its own and
    returns at once for any other. The built-ins are ``trylast``: the ``worktree``
    plugin removes a DONE task's worktree on a ``host.local`` host when it is clean
    (else keeps it, and notes why); the ``relay`` plugin, for its peers, removes the
    worktree fetched back here in any terminal state and has the peer remove a DONE
    task's clean worktree there.

    :param task: the :class:`~fleetrun.ledger.Task`, in its terminal state
        (``task.worktree`` and ``task.branch`` say what it had).
    :param host: the :class:`~fleetrun.Host` of ``task.host`` (when no loaded plugin
        provides it, a stand-in that is no plugin's own: no built-in acts).
    :param config: the run's :class:`~fleetrun.config.Config`.
    :return: nothing; return value ignored. A ``GitError`` or ``OSError`` is noted on
        the task (``cleanup failed: ...``); any other exception is an internal error,
        and the task keeps its state.

    May be implemented in a ``fleetconf.py``: yes.
    """


# ---------------------------------------------------------------------------------
# Reporting


@hookspec
def fleetrun_transition(
    task: Task, from_state: str, to_state: str, cause: str, attempt: Optional[int], config: Config
) -> None:
    """A task changed state (already committed to the ledger).

    Called for every transition, in the process that made it: the loop, ``fleetrun
    queue`` (``from_state`` is ``""`` and ``cause`` ``queued``), ``cancel``, ``retry``,
    ``approve``. Terminal output, the event log and reporters listen here. A plugin
    that implements :func:`fleetrun_queued` is told of a queue's tasks there, not here.

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
def fleetrun_queued(tasks: QueuedTasks, config: Config) -> None:
    """Tasks entered the ledger as one queue (``fleetrun queue``, or a run queueing its
    files), already committed: the transitions from ``""`` of all of them at once.

    Called once a queue, in the process that queued it, before ``fleetrun_transition``
    is called for those tasks. A plugin that implements this hook is told of the
    queue's tasks here only: ``fleetrun_transition`` (``from_state=""``) is not called
    on it for them, while every other plugin is called once a task, as for any
    transition. A queue of 100,000 tasks is then one call instead of 100,000 (and no
    :class:`~fleetrun.ledger.Task` is made when no plugin takes the per-task calls).
    A loop that shows another process's transitions (a ``fleetrun queue`` from another
    shell) reports them through ``fleetrun_transition``, one a task, as any other.

    :param tasks: the queue's tasks, in queue order: a sequence of
        :class:`~fleetrun.ledger.Task`, each made as it is read (none kept: iterate
        once); ``tasks.queue_id``, and ``tasks.entered()``: each task's id, name,
        :class:`~fleetrun.states.State` and cause (``queued``, or ``unchanged:ID`` for
        one entered DONE for an unchanged task of the file's last run), without a
        ``Task`` of each.
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
    task is for, and whether its ``message`` is ``pending`` or ``claimed``). Called for
    each batch of the tasks ``status --json`` prints (it streams them: a few thousand at
    a time), with that batch's tasks.

    ``status`` runs while a loop may run elsewhere and must stay fast: one read for the
    batch's tasks (not the whole ledger each time), no network, no heavy imports; a task's ``spec`` is read on first use, so
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
    """A verifier reached a verdict (already recorded in the ledger), or could not judge.

    Called once per verifier of ``task.spec.verify`` that reached a verdict; not for
    ``setup`` commands. Also called each time a verifier could not judge the work
    (``verdict.error`` set: an ERROR, as when it raised or no plugin took its kind):
    such a verdict is not recorded in the ledger, and is reported again on each try.

    :param task: the :class:`~fleetrun.ledger.Task`.
    :param verdict: the :class:`~fleetrun.Verdict`.
    :param attempt: the :class:`~fleetrun.ledger.Attempt` whose work was verified.
    :param config: the run's :class:`~fleetrun.config.Config`.
    :return: nothing; return value ignored.

    May be implemented in a ``fleetconf.py``: yes.
    """


# ---------------------------------------------------------------------------------
# Reporting about attempts, hosts and the loop: observers, like fleetrun_transition


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

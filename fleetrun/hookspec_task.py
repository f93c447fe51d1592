"""The per-task hooks of fleetrun, in the order the work loop calls them for an
attempt once it is placed (:mod:`fleetrun.hookspec_place` holds the placement hooks
before them): prepare the workspace, build the prompt, spawn, start, read the agent's
result, collect the work, verify, hand off, clean up.

:mod:`fleetrun.hookspec` imports each of them by name, so
``pm.add_hookspecs(fleetrun.hookspec)`` declares them with the other hooks; what its
docstring says holds for every hook here (argument names are API forever, the
built-ins are ``trylast``, every call is on the supervisor's main thread).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Union

from .hookimpl import hookspec

if TYPE_CHECKING:
    from .config import Config
    from .hostapi import Host
    from .ledger import Attempt, Task
    from .reports import (
        AgentResult,
        CollectHandle,
        Handoff,
        HandoffHandle,
        SpawnSpec,
        Started,
        Verdict,
        VerifyHandle,
        Workspace,
        WorkspaceHandle,
    )
    from .taskspec import VerifySpec


@hookspec(firstresult=True)
def fleetrun_prepare_workspace(task: Task, attempt: Attempt, host: Host,
                               config: Config) -> Union[Workspace, WorkspaceHandle, None]:
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
) -> Optional[Started]:
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
        with ``host.stop``); or None to leave it to the next implementation. With none
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
def fleetrun_agent_result(task: Task, attempt: Attempt, log_path: str, exit_code: Optional[int], config: Config) -> Optional[AgentResult]:
    """Read an ended attempt's output and say whether the session completed.

    Called once per attempt whose agent ended (or whose shepherd died), before the
    attempt is recorded. An agent's exit code is not to be trusted: the ``claude`` plugin
    needs a ``result`` event without ``is_error``.

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
def fleetrun_collect_work(task: Task, attempt: Attempt, workspace: Workspace, host: Host,
                          config: Config) -> Union[str, CollectHandle, None]:
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
    """Run one verifier of an attempt's work, or one of the task's ``setup`` commands.

    Called for each verifier of ``task.spec.verify`` in order, one at a time: each
    verdict is recorded (and ``fleetrun_verdict`` called) before the next starts, and
    the first failure ends the round (a retry, or a human). Also called for each of a
    task's ``setup`` commands, before its agent's first attempt in a workspace: then
    ``verifier`` is a ``run`` spec whose ``extra["setup"]`` is the command's 1-based
    number (it is not one of ``task.spec.verify``), and a failure sends the task to a
    human (``setup_failed:...``). After a crash, a verifier whose verdict was not
    recorded runs again from the start: each must be safe to run again.

    Answer for your own ``verifier.kind`` (and hosts) and return None for the rest.
    The built-ins are ``trylast``: ``verify_run`` runs ``run`` on a ``host.local``
    host; the ``relay`` plugin runs ``run`` (setup included) on its peers, and fails
    there any other kind that nothing answered; ``verify_brain`` and ``verify_agent``
    judge ``brain`` and ``agent`` on this machine, for any host (a peer's branch is
    fetched back first). A plugin that runs ``run`` commands elsewhere (a sandbox) so
    runs setup the same way; one that only judges ``run`` verifiers differently leaves
    the setup commands to the default (returns None for them).

    :param task: the :class:`~fleetrun.ledger.Task` (VERIFYING, or ASSIGNED for a setup
        command).
    :param verifier: the :class:`~fleetrun.VerifySpec` (``kind``, ``text``,
        ``label``, ``timeout_s``, ``extra``).
    :param workspace: the attempt's :class:`~fleetrun.Workspace`.
    :param attempt: the :class:`~fleetrun.ledger.Attempt` whose work is verified (for a
        setup command, the one about to start).
    :param host: the :class:`~fleetrun.Host` the attempt ran on (or is to run on).
    :param config: the run's :class:`~fleetrun.config.Config`.
    :return: a :class:`~fleetrun.Verdict` (with ``verifier.label`` as its ``label``);
        for anything that takes time, a :class:`~fleetrun.VerifyHandle` the loop polls
        on every pass until ``poll()`` returns one (``cancel()`` stops it; ``fileno()``
        and ``next_deadline()`` let the loop sleep until it has news); or None. With
        none at all the verifier fails (``no plugin runs 'KIND' verifiers``), as one
        that raises does (``verifier error: <Type>: <message>``; ``cannot run: ...``
        for a setup command).

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
def fleetrun_handoff(task: Task, attempt: Optional[Attempt], host: Host,
                     config: Config) -> Union[Handoff, HandoffHandle, None]:
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

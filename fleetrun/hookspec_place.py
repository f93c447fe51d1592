"""The placement hooks of fleetrun, the first an attempt meets: the candidates of a
pass, then ``fleetrun_place`` with its filter and score (:mod:`fleetrun.hookspec_task`
holds the per-task hooks after them).

:mod:`fleetrun.hookspec` imports each of them by name, so
``pm.add_hookspecs(fleetrun.hookspec)`` declares them with the other hooks; what its
docstring says holds for every hook here (argument names are API forever, the
built-ins are ``trylast``, every call is on the supervisor's main thread).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Union

from .hookimpl import hookspec

if TYPE_CHECKING:
    from .config import Config
    from .ledger import Task
    from .policy import Policy
    from .reports import Candidate, Placement, Wait


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

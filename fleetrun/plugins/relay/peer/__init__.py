"""The peer side of the relay: ``fleetrun host VERB --json``.

A supervisor runs these over SSH; each prints one JSON object on stdout and exits 0,
or prints ``{"error": ...}`` and exits non-zero. A ``start`` the peer will not do
prints ``{"refused": reason}`` and exits 75. Verbs that take a task, an attempt or a
spec read it as JSON on stdin.

The peer keeps its own state in its own ``$FLEETRUN_HOME``: attempt folders (the
same shepherd as a local attempt), worktrees, ``hosted.json``, the attempts it
started for supervisors, and ``prepared.json``, the workspace it made for each task;
both read and written under ``host.lock``. Its own ``[local] max_tasks`` is enforced
under that lock.

What a supervisor sends is not trusted (``docs/security.md``): a peer stays inside its
own home even if the request is wrong. Every task and attempt id is checked against
the one pattern the ledger makes them by (:func:`fleetrun.untrusted.task_id`,
:func:`~fleetrun.untrusted.attempt_id`); ``collect``, ``cleanup``, ``verify-start``
and ``bundle`` act on the workspace this peer recorded for the task at ``prepare``,
never on a path in the request, and git runs in it pinned to the repository it was
made in (a rewritten ``.git`` is refused: ``worktree_tampered: ...``); ``stop``
signals only a shepherd this peer started, identified by the pid and start-time token
it recorded itself. Refusals are JSON errors, never tracebacks.

``bundle`` is the one verb whose reply is not only JSON: a header line
(``{"fleetrun_bundle": 1, "tip": ..., "fork": ..., "bundle": true}``) followed by a git
bundle of the branch (what the supervisor lacks of it), which the supervisor
unbundles into its own repository (fetch-back).

The verbs the supervisor polls (``status``, ``log``, ``stop``, ``verify-status``,
``verify-stop``) and ``bundle`` need nothing but the home: :func:`fast_main` answers
them without loading any plugin or reading any configuration (``fleetrun.cli.main``
hands them over before it builds a plugin manager). That is why these modules import
little at the top.

One concern a module: :mod:`.verbs` (the verb CLI, its dispatch and the fast path;
``status``, ``log``, ``stop``, ``collect``, ``cleanup``), :mod:`.request` (what a
request holds, checked; what this peer prepared), :mod:`.admission` (room, drain,
one attempt per task, the host lock; ``prepare``, ``start``), :mod:`.probe`
(``probe`` and its tool cache), :mod:`.bundles` (``bundle``), :mod:`.runner`
(``verify-*`` and the detached verifier runner). The wire constants and codecs
are the supervisor's too: :mod:`fleetrun.plugins.relay.protocol`.
"""

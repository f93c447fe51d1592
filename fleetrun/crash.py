"""Crash points, for testing that a crash anywhere loses nothing.

``FLEETRUN_CRASH_AT=<point>[@N][,<point>[@N]...]`` makes the supervisor ``os._exit(86)``
the Nth time (default the first) it reaches a named point. Read once, at import;
with the variable unset, :func:`point` is a dictionary lookup and nothing else.

Points (the loop names them): ``before_transition:<STATE>``,
``after_transition:<STATE>`` (once the move is committed: with its pass's commit in the
loop), ``uncommitted:<STATE>`` (a move written in the loop's pass, the pass's commit to
come), :mod:`fleetrun.ledger_schema`'s ``before_batch_commit``, ``after_lease``, ``after_worktree``,
``after_shepherd_start``, ``mid_verifier``, ``after_verdict`` (once it is committed), ``mid_setup``,
``after_setup``, ``before_collect``, ``before_handoff``, ``before_cleanup``,
``after_verifier_wait``, ``after_pause`` (one or more for each action of
:mod:`fleetrun.decide`: docs/durability.md, "Crash safety per action"); :mod:`fleetrun.depmerge`'s ``before_dependency_merge`` (before each
merge of a dependency into a task's worktree: the worktree made, that dependency not
merged); the ``worktree`` plugin's ``mid_collect`` (on the effects' worker:
an attempt's work staged, not committed); the ``mailbox`` plugin's ``after_delivery``
(a message delivered, the attempt recorded on the mailbox host, the task not yet
RUNNING); the ``verify_run`` plugin's ``mid_baseline`` (a verifier's base run started
in its worktree at the base commit).
"""

from __future__ import annotations

import os

CRASH_EXIT = 86

_POINTS: dict[str, int] = {}
for _item in filter(None, (os.environ.get("FLEETRUN_CRASH_AT") or "").split(",")):
    _name, _, _n = _item.strip().partition("@")
    _POINTS[_name] = int(_n) if _n.isdigit() else 1
_HITS: dict[str, int] = {}


def point(name: str) -> None:
    """Die here if the test asked for it."""
    if not _POINTS:
        return
    for key in (name, name.split(":", 1)[0] + ":*"):
        if key in _POINTS:
            _HITS[key] = _HITS.get(key, 0) + 1
            if _HITS[key] == _POINTS[key]:
                os._exit(CRASH_EXIT)

"""A test plugin (``-p secondhost``, with ``tests/plugins`` on ``sys.path``): a second
host, ``bay``, offered through ``fleetrun_hosts``.

``bay`` is a :class:`~fleetrun.hosts.LocalHost` of its own: named ``bay``, local (its
workspaces are folders here, so the ``worktree`` plugin and ``verify_run`` work on
them), with its attempt folders under ``$FLEETRUN_HOME/bay`` instead of
``attempts/``. Its candidate is this machine's, under its name, with its own slots.
"""

from __future__ import annotations

from typing import Any, Optional

import fleetrun
from fleetrun.hosts import LocalHost
from fleetrun.ledger import LEDGER_KEY

NAME = "bay"


def bay_root(config: Any) -> Any:
    return config.home / NAME


class Bay(LocalHost):
    """This machine again, under another name and attempt root."""

    def candidate(self, config: Any) -> Optional[fleetrun.Candidate]:
        led = config.stash.get(LEDGER_KEY)
        running = (
            sum(1 for t in led.tasks() if t.host == NAME and t.state.value in ("ASSIGNED", "RUNNING", "VERIFYING"))
            if led is not None
            else 0
        )
        return fleetrun.Candidate(
            name=NAME,
            kind="peer",
            status="live",
            running=running,
            max_tasks=2,
            free_mem_mb=100000.0,
            info={"offered_by": "secondhost"},
        )


@fleetrun.hookimpl
def fleetrun_hosts(config: Any) -> list[Any]:
    return [Bay(config.home, name=NAME, root=bay_root(config))]


@fleetrun.hookimpl
def fleetrun_status_reason(task: Any, config: Any) -> Optional[str]:
    """What ``status`` shows for a task on ``bay`` while ``bay/closed`` exists."""
    if task.host == NAME and (bay_root(config) / "closed").exists():
        return "bay is closed (secondhost)"
    return None

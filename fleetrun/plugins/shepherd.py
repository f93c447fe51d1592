"""Built-in ``shepherd`` plugin: the default way an attempt starts.

``fleetrun_start_attempt`` (``trylast``) turns the agent's :class:`~fleetrun.SpawnSpec`
into a shepherd spec (:func:`fleetrun.starting.shepherd_spec`: the workspace, the task
environment, the timeouts, the loop's wake-up socket) and has the attempt's host start
a shepherd with it (``host.start``: a detached process on this machine, ``fleetrun host
start`` on a peer). A plugin that runs attempts its own way (a mailbox, a cluster
scheduler) implements the hook and returns a :class:`~fleetrun.Started` first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from ..hookimpl import hookimpl
from ..reports import SpawnSpec, Started

if TYPE_CHECKING:
    from ..config import Config


@hookimpl(trylast=True)
def fleetrun_start_attempt(task: Any, attempt: Any, host: Any, spawn: SpawnSpec, prompt: str,
                           config: Config) -> Optional[Started]:
    # imported here: loading the plugin stays cheap for `fleetrun --help`
    from ..starting import shepherd_spec

    return host.start(attempt.id, shepherd_spec(task, attempt, spawn, config), prompt)

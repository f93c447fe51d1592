"""Built-in ``shepherd`` plugin: the default way an attempt starts.

``fleetrun_start_attempt`` (``trylast``) turns the agent's :class:`~fleetrun.SpawnSpec`
into a shepherd spec (:func:`fleetrun.starting.shepherd_spec`: the workspace, the task
environment, the timeouts, the loop's wake-up socket) and has the attempt's host start
a shepherd with it (``host.start``: a detached process on this machine, ``fleetrun host
start`` on a peer). A plugin that runs attempts its own way (a mailbox, a cluster
scheduler) implements the hook and returns a :class:`~fleetrun.Started` first.

Before it starts a shepherd on this machine it checks that the agent is installed here
(``argv[0]`` found on the spec's ``PATH``): not found, it raises
:class:`~fleetrun.hostapi.AgentNotFound` and the task needs a human at once. The check is
here, and not in the core before the hook, so that an attempt another plugin takes (a
role's mailbox) needs no agent on this machine's ``PATH``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from ..hookimpl import hookimpl
from ..reports import SpawnSpec, Started

if TYPE_CHECKING:
    from ..config import Config


@hookimpl(trylast=True)
def fleetrun_start_attempt(
    task: Any, attempt: Any, host: Any, spawn: SpawnSpec, prompt: str, config: Config
) -> Optional[Started]:
    # imported here: loading the plugin stays cheap for `fleetrun --help`
    import os

    from ..hostapi import AgentNotFound
    from ..hosts import executable_problem
    from ..starting import shepherd_spec

    if host.local and spawn.argv:  # a peer's shepherd reports it from its side
        missing = executable_problem(spawn.argv[0], (spawn.env or {}).get("PATH", os.environ.get("PATH")))
        if missing:
            raise AgentNotFound(missing)

    return host.start(attempt.id, shepherd_spec(task, attempt, spawn, config), prompt)

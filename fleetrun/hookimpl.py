"""The two markers of the pluggy project ``fleetrun``: ``@fleetrun.hookimpl`` for
implementations, ``@fleetrun.hookspec`` for specifications.

In a module that imports nothing of fleetrun, so that every module declaring hooks
(:mod:`fleetrun.hookspec`, a plugin's own hook specifications) and every plugin can
import them without an import cycle.
"""

from __future__ import annotations

import pluggy

hookimpl = pluggy.HookimplMarker("fleetrun")
hookspec = pluggy.HookspecMarker("fleetrun")

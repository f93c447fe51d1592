"""The marker for hook implementations: ``@fleetrun.hookimpl``."""

from __future__ import annotations

import pluggy

hookimpl = pluggy.HookimplMarker("fleetrun")

"""Where fleetrun keeps its state: ``$FLEETRUN_HOME``, or ``~/.fleetrun``.

Alone in a module of the standard library's ``os`` and ``pathlib`` only, so what must
start fast (a role session's Stop hook, the peer's fast path) finds the home without
importing the configuration machinery.
"""

from __future__ import annotations

import os
from pathlib import Path


def default_home() -> Path:
    """``$FLEETRUN_HOME`` (resolved), else ``~/.fleetrun``."""
    env = os.environ.get("FLEETRUN_HOME")
    if env:
        return Path(env).expanduser().resolve()
    return Path.home() / ".fleetrun"

"""Where fleetrun keeps its state: ``$FLEETRUN_HOME``, or ``~/.fleetrun``.

Alone in a module of the standard library's ``os`` and ``pathlib`` only, so what must
start fast (a role session's Stop hook, the peer's fast path) finds the home without
importing the configuration machinery.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional


def default_home() -> Path:
    """``$FLEETRUN_HOME`` (resolved), else ``~/.fleetrun``."""
    env = os.environ.get("FLEETRUN_HOME")
    if env:
        return Path(env).expanduser().resolve()
    return Path.home() / ".fleetrun"


def home_prefix(args: list[str], verb: str) -> Optional[tuple[Optional[str], int]]:
    """Read a fast path's command line, ``[--home DIR | --home=DIR]... VERB ...``.

    :return: (the last ``--home`` given, or None; the index of ``verb`` in ``args``),
        or None when anything else comes before ``verb`` (or it is not there): such a
        command line runs the usual way.
    """
    home: Optional[str] = None
    i = 0
    while i < len(args) and args[i] != verb:
        a = args[i]
        if a == "--home" and i + 1 < len(args):
            home = args[i + 1]
            i += 2
        elif a.startswith("--home="):
            home = a.split("=", 1)[1]
            i += 1
        else:
            return None
    return (home, i) if i < len(args) else None

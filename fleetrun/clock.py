"""The wall clock of the loop's waits, which a test can move forward.

``FLEETRUN_TEST_CLOCK=<file>`` makes :func:`now` the real time plus the number of
seconds the file holds (a test writes ``600`` to be ten minutes later), so a wait of
minutes or hours (a usage-limit pause, the "still waiting" reminder) is tested without
sleeping through it. Read once, at import; with the variable unset, :func:`now` is
:func:`time.time`.
"""

from __future__ import annotations

import os
import time

_PATH = os.environ.get("FLEETRUN_TEST_CLOCK") or None


def now() -> float:
    """Seconds since the epoch, as the loop's waits count them."""
    if _PATH is None:
        return time.time()
    try:
        with open(_PATH, encoding="ascii") as f:
            offset = float(f.read().strip() or 0)
    except (OSError, ValueError):
        offset = 0.0  # a test's clock file half written: the real time
    return time.time() + offset

"""Import the plugin from this checkout: its tests install nothing.

``fleeter`` comes from ``fleetrun.fleeter``, enabled in the repository's root
``conftest.py`` (a third party enables it in their own: ``pytest_plugins =
["fleetrun.fleeter"]``).
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = str(Path(__file__).resolve().parents[1])
if HERE not in sys.path:
    sys.path.insert(0, HERE)

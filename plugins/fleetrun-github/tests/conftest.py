"""Import the plugin from this checkout: its tests install nothing.

``fleeter`` comes from ``fleetrun.fleeter``, enabled in the repository's root
``conftest.py`` (a third party enables it in their own: ``pytest_plugins =
["fleetrun.fleeter"]``).

The plugin's folder goes on ``sys.path`` just after the repository's root (first when
the root is not there): this folder holds a ``tests/`` too, and ahead of the root it
would be the first part of the namespace package ``tests``, so fleetrun's own
``from tests.conftest import ...`` would import this file.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = str(Path(__file__).resolve().parents[1])
ROOT = str(Path(__file__).resolve().parents[3])
if HERE not in sys.path:
    sys.path.insert(sys.path.index(ROOT) + 1 if ROOT in sys.path else 0, HERE)

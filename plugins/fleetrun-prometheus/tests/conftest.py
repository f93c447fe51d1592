"""Import the plugin from this checkout: its tests install nothing.

The module is loaded from its file by name, without putting this folder on
``sys.path``: that would make this ``tests`` folder a portion of the ``tests``
namespace the repository's own tests import from (``tests.conftest``).

``fleeter`` comes from ``fleetrun.fleeter``, enabled in the repository's root
``conftest.py`` (a third party enables it in their own: ``pytest_plugins =
["fleetrun.fleeter"]``).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
if "fleetrun_prometheus" not in sys.modules:
    _spec = importlib.util.spec_from_file_location("fleetrun_prometheus", HERE / "fleetrun_prometheus.py")
    assert _spec is not None and _spec.loader is not None
    _module = importlib.util.module_from_spec(_spec)
    sys.modules["fleetrun_prometheus"] = _module
    _spec.loader.exec_module(_module)

"""Finding the events files a test's runs left, and checking them against
fleetrun/events.schema.json (the autouse check of ``conftest.py``, and its own tests in
``test_events.py``)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from fleetrun.plugins.events.schema import check_file

#: The event log and its rotated files (docs/events.md).
EVENT_FILE = re.compile(r"^events\.ndjson(\.[0-9]+)?$")
#: Never holds a home's events.ndjson, and may hold many files: not walked.
NOT_HOMES = frozenset({".git", "worktrees", "attempts", "node_modules", "__pycache__"})
MAX_DEPTH = 4  # tmp_path/h, tmp_path/peer-east/home...: homes sit near the top


def event_files(root: Path) -> list[Path]:
    """The events files under ``root`` (a test's tmp_path): every home a test made,
    the peers' and the subprocess runs' included, found without walking repositories,
    worktrees or attempt folders."""
    found = []
    top = len(root.parts)
    for dirpath, dirnames, filenames in os.walk(root):
        deep = len(Path(dirpath).parts) - top >= MAX_DEPTH
        dirnames[:] = [] if deep else [d for d in dirnames if d not in NOT_HOMES]
        found.extend(Path(dirpath, f) for f in filenames if EVENT_FILE.match(f))
    return sorted(found)


def event_problems(root: Path) -> list[str]:
    """Every line of every events file under ``root`` checked against
    fleetrun/events.schema.json: the problems, as ``FILE:LINE: what``."""
    return [p for f in event_files(root) for p in check_file(f)]

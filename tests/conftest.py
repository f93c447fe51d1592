"""Fixtures shared by fleetrun's own tests.

``fleeter`` and ``fake_claude`` come from :mod:`fleetrun.fleeter` (the root
``conftest.py`` enables it), as they do for a plugin's own tests.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

FAKES = Path(__file__).parent / "fakes"
FAKE_CLAUDE = FAKES / "claude"  # runs fleetrun/testing/fake_claude/ by path


@pytest.fixture(autouse=True)
def claude_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """`claude` is installed, as on a user's machine: the fake, first on PATH. Without
    it every `validate` here would warn that claude is not on PATH (a test of that
    warning sets PATH itself)."""
    monkeypatch.setenv("PATH", f"{FAKES}{os.pathsep}{os.environ.get('PATH', '')}")

"""Fixtures shared by fleetrun's own tests.

``fleeter`` and ``fake_claude`` come from :mod:`fleetrun.fleeter` (the root
``conftest.py`` enables it), as they do for a plugin's own tests.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from eventcheck import event_problems
from hypothesis import settings

# No per-example deadline for hypothesis (its default, 200 ms, is a timing: a loaded CI
# machine fails a pure property test with DeadlineExceeded); tests that set one keep it.
settings.register_profile("fleetrun", deadline=None)
settings.load_profile("fleetrun")

FAKES = Path(__file__).parent / "fakes"
FAKE_CLAUDE = FAKES / "claude"  # runs fleetrun/testing/fake_claude/ by path


@pytest.fixture(autouse=True)
def claude_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """`claude` is installed, as on a user's machine: the fake, first on PATH. Without
    it every `validate` here would warn that claude is not on PATH (a test of that
    warning sets PATH itself)."""
    monkeypatch.setenv("PATH", f"{FAKES}{os.pathsep}{os.environ.get('PATH', '')}")


@pytest.fixture(autouse=True)
def events_follow_the_schema(request: pytest.FixtureRequest) -> Any:
    """Every event a test's runs wrote (in its tmp_path homes) follows the schema: a
    line that does not fails the test, naming the file and the line."""
    # asked for before the test runs, so tmp_path is torn down after this check
    root = request.getfixturevalue("tmp_path") if "tmp_path" in request.fixturenames else None
    yield
    if root is None:
        return
    problems = event_problems(root)
    if problems:
        pytest.fail(
            "events that do not follow fleetrun/events.schema.json:\n" + "\n".join(problems[:20]), pytrace=False
        )

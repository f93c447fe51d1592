"""Fixtures shared by fleetrun's own tests."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

FAKES = Path(__file__).parent / "fakes"
FAKE_CLAUDE = FAKES / "claude"


class FakeClaude:
    """Points fleetrun at ``tests/fakes/claude`` and scripts what it does."""

    def __init__(self, fleeter: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        self.dir = fleeter.path.parent / "fake"
        self.dir.mkdir(exist_ok=True)
        self.scenario_path = self.dir / "scenario.json"
        self.log_path = self.dir / "calls.ndjson"
        self.scenario_path.write_text("{}")
        monkeypatch.setenv("FAKE_CLAUDE_SCENARIO", str(self.scenario_path))
        monkeypatch.setenv("FAKE_CLAUDE_STATE", str(self.dir))
        monkeypatch.setenv("FAKE_CLAUDE_LOG", str(self.log_path))
        # the fake reads user settings (and their hooks) like the real CLI: never the developer's own
        (self.dir / "claude-config").mkdir(exist_ok=True)
        monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(self.dir / "claude-config"))
        fleeter.write_config(f'[claude]\nexecutable = "{FAKE_CLAUDE}"\n')

    def script(self, **steps: list[dict[str, Any]]) -> None:
        """``script(**{"task-name": [step1, step2]})``: attempt n acts out step n."""
        data = json.loads(self.scenario_path.read_text())
        data.update(steps)
        self.scenario_path.write_text(json.dumps(data))

    def calls(self, key: str | None = None) -> list[dict[str, Any]]:
        if not self.log_path.exists():
            return []
        calls = [json.loads(line) for line in self.log_path.read_text().splitlines() if line.strip()]
        calls = [c for c in calls if "FLEETRUN_VERIFIER" not in c.get("env", {})]  # reviewers: review_calls()
        return [c for c in calls if key is None or c.get("env", {}).get("FLEETRUN_TASK_NAME") == key]

    def review_calls(self, key: str | None = None) -> list[dict[str, Any]]:
        if not self.log_path.exists():
            return []
        calls = [json.loads(line) for line in self.log_path.read_text().splitlines() if line.strip()]
        return [c for c in calls if "FLEETRUN_VERIFIER" in c.get("env", {})
                and (key is None or c["env"].get("FLEETRUN_TASK_NAME") == key)]


@pytest.fixture(autouse=True)
def claude_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """`claude` is installed, as on a user's machine: the fake, first on PATH. Without
    it every `validate` here would warn that claude is not on PATH (a test of that
    warning sets PATH itself)."""
    monkeypatch.setenv("PATH", f"{FAKES}{os.pathsep}{os.environ.get('PATH', '')}")


@pytest.fixture
def fake_claude(fleeter: Any, monkeypatch: pytest.MonkeyPatch) -> FakeClaude:
    assert os.access(FAKE_CLAUDE, os.X_OK), "tests/fakes/claude must be executable"
    return FakeClaude(fleeter, monkeypatch)

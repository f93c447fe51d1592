"""The run's summary sections (fleetrun/plugins/summary.py) at the end of a long run:
what they show is read for the tasks they show, not a parsed task for each of the
run's tasks (a run of 100,000 spent most of a minute on its exit summary)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from fleetrun import records
from fleetrun.ledger import Ledger
from fleetrun.plugins.summary import short_summary, where_work_is
from fleetrun.states import State
from fleetrun.taskspec import TaskSpec


@pytest.fixture
def parsed(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Counts the tasks built with their spec parsed, by name."""
    seen: Counter[str] = Counter()
    real = records.Task.from_row

    def from_row(row: Any, spec: Any, deps: Any) -> Any:
        seen[row["name"]] += 1
        return real(row, spec, deps)

    monkeypatch.setattr(records.Task, "from_row", staticmethod(from_row))
    return seen


def _run(tmp_path: Path, n: int) -> tuple[Ledger, list[str]]:
    """A run of ``n`` DONE tasks and one NEEDS_HUMAN, all ran here."""
    led = Ledger(tmp_path / "state.db")
    specs = [TaskSpec(name=f"t{i}", prompt="p", cwd=str(tmp_path)) for i in range(n)]
    specs.append(TaskSpec(name="stuck", prompt="p", cwd=str(tmp_path)))
    tasks = led.add_tasks(specs, source="tasks.toml", source_hash="h")
    with led.tx() as cur:
        for t in tasks:
            end = State.NEEDS_HUMAN.value if t.name == "stuck" else State.DONE.value
            cur.execute(
                "UPDATE tasks SET state=?, host='local', reason=? WHERE id=?",
                (end, "verify_failed" if t.name == "stuck" else "", t.id),
            )
    return led, [t.id for t in tasks]


def test_the_summary_parses_only_the_tasks_it_shows(tmp_path: Path, parsed: Counter[str]) -> None:
    led, ids = _run(tmp_path, 300)
    lines = [line for line, _ in short_summary(led, ids)]
    assert lines[0] == "=== short task summary info ==="
    assert lines[1] == "NEEDS_HUMAN stuck: verify_failed"
    assert where_work_is(led, ids) == []  # every one ran here
    assert set(parsed) <= {"stuck"}, f"parsed {len(parsed)} tasks for two sections that show one"

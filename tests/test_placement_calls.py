"""What placement costs per task over a run (issue 24, CPU per trivial task): counted,
not timed. Each READY task is asked where to go once in the first pass (every waiting
task has its reason for ``status``) and once more when a freed slot comes to its turn;
a pass where nothing freed and nothing new is READY asks nothing, and this machine is
probed at most once a pass."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from test_taskview import PassProbe, counted  # noqa: F401  (a fixture)

from fleetrun.fleeter import Fleeter
from fleetrun.plugins import placement as placement_plugin
from fleetrun.taskspec import TaskSpec


def trivial_tasks(fleeter: Fleeter, n: int) -> None:
    fleeter.make_repo()
    fleeter.write_tasks(
        "\n".join(f'[[task]]\nname = "t{i:02d}"\ncwd = "repo"\nprompt = "p"\ngit_ref = "main"\n' for i in range(n))
    )


@pytest.mark.parametrize("slots", [2, 4])
def test_each_task_is_asked_where_to_go_at_most_twice_over_a_run(
    fleeter: Fleeter,
    fake_claude: Any,
    counted: PassProbe,  # noqa: F811  (the fixture imported above)
    slots: int,
) -> None:
    """N trivial tasks on this machine, ``slots`` at a time: N asks in the first pass
    (``slots`` placed, the others told the machine is full) and one per freed slot (the
    next task placed), N + (N - slots) in all. Before, the generations of what a wait was
    decided on were forgotten after eight (the tasks holding slots made a new one every
    pass), so every few ends the whole queue was asked again: 12.9 asks a task at 100."""
    n = 24
    trivial_tasks(fleeter, n)
    fake_claude.script(default=[{"actions": [["write", "out.txt", "x"], ["commit", "add out"]]}])
    counted.passes = 1_000_000
    r = fleeter.run("tasks.toml", "--max-tasks", str(slots), plugins=[counted])
    r.assert_outcomes(done=n)
    asked = sum(counted.counts, Counter())
    per_task = Counter({k[len("placed:") :]: v for k, v in asked.items() if k.startswith("placed:")})
    assert asked["place"] <= n + (n - slots), (asked["place"], per_task)
    assert max(per_task.values()) <= 2, per_task
    # a pass where no slot freed and nothing new is READY asks nobody: the passes that
    # asked are the first and those a freed slot came in (one or more placed in each)
    asking = [c for c in counted.counts if c.get("place", 0)]
    assert len(asking) <= 1 + (n - slots) < len(counted.counts), (len(asking), len(counted.counts))


def test_the_machine_is_measured_only_when_it_has_room_and_no_spec_is_parsed_again(
    fleeter: Fleeter,
    fake_claude: Any,
    counted: PassProbe,  # noqa: F811  (the fixture imported above)
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """This machine's free memory, load and disk are measured at most once a pass, and
    only on a pass where it has a free slot (full or draining, placement's reason is
    that, whatever they are; most passes of a busy run); the running attempts' status
    files are read for the memory estimate only once an attempt could have run
    ``SETTLE_S``; and whether any placeable task ``requires`` a tool is known without
    parsing again the spec of every waiting task (placement forgets a waiting task's
    parsed spec)."""
    n = 12
    trivial_tasks(fleeter, n)
    fake_claude.script(default=[{"actions": [["write", "out.txt", "x"], ["commit", "add out"]]}])
    real_measure = placement_plugin.measure_local
    real_sample = placement_plugin.MemorySampler.sample
    parsed: Counter[str] = Counter()
    real_from_json = TaskSpec.from_json.__func__  # type: ignore[attr-defined]

    def measure(path: str) -> Any:
        counted.now["measure"] += 1
        return real_measure(path)

    real_wants = placement_plugin._wants_tools

    def wants_tools(config: Any) -> bool:
        counted.now["wants_tools"] += 1
        return real_wants(config)

    def sample(self: Any, attempts: list[Any], now: float) -> None:
        counted.now["sampled"] += len(attempts)
        counted.now["sample"] += 1
        real_sample(self, attempts, now)

    def from_json(cls: Any, data: Any) -> Any:
        parsed[str(data.get("name"))] += 1
        return real_from_json(cls, data)

    monkeypatch.setattr(placement_plugin, "measure_local", measure)
    monkeypatch.setattr(placement_plugin, "_wants_tools", wants_tools)
    monkeypatch.setattr(placement_plugin, "SETTLE_S", 3600.0)  # none runs an hour, however busy the machine
    monkeypatch.setattr(placement_plugin.MemorySampler, "sample", sample)
    monkeypatch.setattr(TaskSpec, "from_json", classmethod(from_json))
    counted.passes = 1_000_000
    r = fleeter.run("tasks.toml", "--max-tasks", "2", plugins=[counted])
    r.assert_outcomes(done=n)
    total = sum(counted.counts, Counter())
    assert all(c.get("measure", 0) <= 1 for c in counted.counts), counted.counts
    # measured on the passes that found a slot free (each placed a task), not on those
    # that found the machine full: the first pass, and one a freed slot
    assert total["measure"] <= 1 + (n - 2) < total["sample"], total
    assert total["wants_tools"] == total["measure"], total  # the tools too: asked only with a slot free
    assert total["sampled"] == 0, total  # every attempt ended within SETTLE_S
    # a task's spec: parsed for the first pass, again when it is placed (placement forgot
    # it while it waited), and by the stages that run it (its attempt, its verifier)
    assert max(parsed.values()) <= 4, parsed

"""The plugin's place filter lets the loop keep a waiting task's decision: installed (and
even unconfigured), it no longer makes every pass ask placement about every waiting task
again. No cluster needed: the tasks wait on a draining machine."""

from __future__ import annotations

from collections import Counter
from typing import Any

import fleetrun_slurm
import pytest

import fleetrun
from fleetrun.plugins import placement as placement_plugin
from fleetrun.waiting import TICKERS_KEY


class Passes:
    """Counts placement's decisions per pass of the loop; stops it after ``passes``."""

    def __init__(self, passes: int) -> None:
        self.passes = passes
        self.counts: list[int] = []
        self.now = 0

    @fleetrun.hookimpl
    def fleetrun_configure(self, config: Any) -> None:
        config.stash.setdefault(TICKERS_KEY, []).append(self)

    def tick(self) -> float:
        self.counts.append(self.now)
        self.now = 0
        if len(self.counts) >= self.passes:
            raise KeyboardInterrupt
        return 0.0


def test_waiting_tasks_are_asked_once_not_on_every_pass(fleeter: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    fleeter.make_repo()
    fleeter.write_policy("[local]\ndrain = true\n")
    fleeter.write_tasks(
        "".join(f'[[task]]\nname = "t{i}"\ncwd = "repo"\nprompt = "p"\ngit_ref = "main"\n\n' for i in range(8))
    )
    probe = Passes(6)
    real = placement_plugin.builtin_place

    def place(task: Any, *a: Any, **kw: Any) -> Any:
        probe.now += 1
        return real(task, *a, **kw)

    monkeypatch.setattr(placement_plugin, "builtin_place", place)
    r = fleeter.run("queue", "tasks.toml")
    assert r.ret == 0, r.stderr
    r = fleeter.run("work", plugins=[fleetrun_slurm, probe])
    assert r.ret == 2, r.stderr  # stopped by the probe, as by Ctrl-C
    assert probe.counts[0] == 8 and sum(probe.counts[1:]) == 0, Counter(probe.counts)

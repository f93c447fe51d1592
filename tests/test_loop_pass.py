"""``fleetrun_loop_pass``: called at the end of every pass of the work loop, with the
pass's duration; and ``fleetrun.ledger_counts``, the ledger counted on a read-only
connection of its own (what a metrics scrape reads from its server's thread)."""

from __future__ import annotations

import threading
from typing import Any

import fleetrun
from fleetrun.fleeter import ECHO_AGENT, echo_task

QUEUE = ECHO_AGENT + echo_task("ok", verify="true")


class PassCounter:
    """Records each pass: its duration, and the ledger counted from another thread."""

    def __init__(self) -> None:
        self.durations: list[float] = []
        self.seen: list[fleetrun.LedgerCounts] = []
        self.home: Any = None

    @fleetrun.hookimpl
    def fleetrun_configure(self, config: Any) -> None:
        self.home = config.home

    @fleetrun.hookimpl
    def fleetrun_loop_pass(self, config: Any, duration_s: float) -> None:
        self.durations.append(duration_s)
        box: list[Any] = []
        reader = threading.Thread(target=lambda: box.append(fleetrun.ledger_counts(config.home)))
        reader.start()
        reader.join()
        if box and box[0] is not None:
            self.seen.append(box[0])


def test_every_pass_is_reported_with_its_duration(fleeter: Any) -> None:
    fleeter.write_tasks(QUEUE)
    counter = PassCounter()
    result = fleeter.inline_run("tasks.toml", plugins=[counter])
    assert result.ret == 0, result.stdout + result.stderr
    result.assert_outcomes(done=1)

    calls = result.hooks.getcalls("fleetrun_loop_pass")
    assert len(calls) == len(counter.durations) >= 2  # one pass starts the task, a later one ends it
    assert all(isinstance(d, float) and d >= 0 for d in counter.durations)
    # the hook comes at the end of the pass: the first already saw the task started
    first = counter.seen[0]
    assert first.tasks["READY"] == 0 and first.tasks["PENDING"] == 0
    assert sum(first.active_by_host.values()) == 1 or first.tasks["DONE"] == 1
    last = counter.seen[-1]
    assert last.tasks["DONE"] == 1 and set(last.tasks) == {s.value for s in fleetrun.State}
    assert last.active_by_host == {"local": 0}


def test_ledger_counts(fleeter: Any) -> None:
    assert fleetrun.ledger_counts(fleeter.home) is None  # no ledger yet: nothing is made
    assert not (fleeter.home / "state.db").exists()
    fleeter.write_tasks(QUEUE)
    assert fleeter.run("tasks.toml").ret == 0
    counts = fleetrun.ledger_counts(fleeter.home)
    assert counts is not None
    assert counts.tasks["DONE"] == 1 and sum(counts.tasks.values()) == 1
    assert counts.active_by_host == {"local": 0}
    assert counts.cost_usd == 0.0

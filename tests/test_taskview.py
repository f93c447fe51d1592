"""The loop's tasks in memory (fleetrun/taskview.py): an idle pass reads nothing that
grows with the queue and asks placement about no task, and what another process
writes to the ledger is seen on the next pass (and only that task is placed again)."""

from __future__ import annotations

import gc
import json
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import pytest

import fleetrun
from fleetrun import ops, records
from fleetrun.fleeter import Fleeter
from fleetrun.ledger import LEDGER_KEY, Ledger
from fleetrun.plugins import placement as placement_plugin
from fleetrun.states import State
from fleetrun.taskspec import TaskSpec
from fleetrun.taskview import TASKVIEW_KEY, TaskView
from fleetrun.waiting import TICKERS_KEY


class PassProbe:
    """Counts, for each of the loop's passes (between two of its waits), the reads of
    the whole queue and the placement decisions; runs ``actions[n]`` after pass n and
    stops the loop after ``passes``."""

    def __init__(self, passes: int, actions: dict[int, Callable[[Any], None]]) -> None:
        self.passes = passes
        self.actions = actions
        self.now: Counter[str] = Counter()
        self.counts: list[Counter[str]] = []
        self.config: Any = None

    @fleetrun.hookimpl
    def fleetrun_configure(self, config: Any) -> None:
        self.config = config
        config.stash.setdefault(TICKERS_KEY, []).append(self)

    def tick(self) -> float:
        if not self.counts:  # the loop's connection, from its first wait on
            self.config.stash[LEDGER_KEY].conn.set_trace_callback(lambda sql: self.now.update(["sql"]))
        self.counts.append(self.now)
        self.now = Counter()
        n = len(self.counts)
        if n in self.actions:
            self.actions[n](self.config)
        if n >= self.passes:
            raise KeyboardInterrupt
        return 0.0


def queue(fleeter: Fleeter, n: int) -> list[str]:
    """``n`` READY tasks (held by a draining policy) and ``n`` PENDING behind the first."""
    repo = fleeter.make_repo(f"repo{n}")
    fleeter.write_policy("[local]\ndrain = true\n")
    specs = [TaskSpec(name=f"r{i}", prompt="p", cwd=str(repo), git_ref="main") for i in range(n)]
    specs += [TaskSpec(name=f"p{i}", prompt="p", cwd=str(repo), git_ref="main", depends_on=["r0"]) for i in range(n)]
    return [t.id for t in fleeter.ledger().add_tasks(specs, source="tasks.toml", source_hash="h")]


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> PassProbe:
    probe = PassProbe(0, {})
    real_tasks, real_row, real_place = Ledger.tasks, records.Task.from_row, placement_plugin.builtin_place
    real_listed = records.ListedTask.listed

    def tasks(self: Ledger, *a: Any, **kw: Any) -> Any:
        probe.now["tasks()"] += 1
        return real_tasks(self, *a, **kw)

    def from_row(row: Any, spec: Any, deps: Any) -> Any:
        probe.now["rows"] += 1
        probe.now["task:" + row["name"]] += 1
        return real_row(row, spec, deps)

    def listed(row: Any, deps: Any, read_spec: Any) -> Any:  # how the view reads a row
        probe.now["rows"] += 1
        probe.now["row:" + str(row[1])[:1]] += 1  # r... (READY) or p... (PENDING)
        return real_listed(row, deps, read_spec)

    def place(task: Any, *a: Any, **kw: Any) -> Any:
        probe.now["placed:" + task.name] += 1
        probe.now["place"] += 1
        return real_place(task, *a, **kw)

    monkeypatch.setattr(Ledger, "tasks", tasks)
    monkeypatch.setattr(records.Task, "from_row", staticmethod(from_row))
    monkeypatch.setattr(records.ListedTask, "listed", staticmethod(listed))
    monkeypatch.setattr(placement_plugin, "builtin_place", place)
    return probe


class RefusesNothing:
    """A plugin's placement filter that keeps no task off any machine, its decision
    depending only on what placement is given: with it, each task is decided afresh
    (as with fleetrun-slurm installed), not given the answer of a task of its shape."""

    PURE_PLACEMENT = True

    @fleetrun.hookimpl
    def fleetrun_place_filter(self, task: Any, candidate: Any, config: Any) -> None:
        return None


def run(
    fleeter: Fleeter,
    probe: PassProbe,
    passes: int,
    actions: dict[int, Callable[[Any], None]],
    plugins: tuple[object, ...] = (),
) -> PassProbe:
    probe.passes, probe.actions, probe.counts = passes, actions, []
    result = fleeter.run("work", plugins=[probe, *plugins])
    assert result.ret == 2, result.stderr  # stopped by the probe, as by Ctrl-C
    return probe


def _fresh_ledger(fleeter: Fleeter) -> None:
    fleeter.close()
    (fleeter.home / "state.db").unlink()
    for side in ("-wal", "-shm"):
        Path(str(fleeter.home / "state.db") + side).unlink(missing_ok=True)


def test_an_idle_pass_costs_the_same_for_10_or_120_tasks(fleeter: Fleeter, counted: PassProbe) -> None:
    queue(fleeter, 5)
    small = [dict(c) for c in run(fleeter, counted, 6, {}).counts[2:]]
    _fresh_ledger(fleeter)
    queue(fleeter, 60)
    big = [dict(c) for c in run(fleeter, counted, 6, {}).counts[2:]]
    # the first pass read the queue once and placed each READY task once; after it,
    # nothing is read again, nobody is asked where to go, and the SQL is the same
    for counts in small + big:
        assert counts.get("tasks()", 0) == 0 and counts.get("rows", 0) == 0 and counts.get("place", 0) == 0, counts
    assert [c.get("sql") for c in small] == [c.get("sql") for c in big]


def test_another_process_s_writes_are_seen_and_only_they_are_placed_again(fleeter: Fleeter, counted: PassProbe) -> None:
    ids = queue(fleeter, 20)
    home = fleeter.home
    seen: dict[str, Any] = {}

    def from_another_shell(config: Any) -> None:
        with Ledger(home / "state.db") as other:
            ops.cancel(other, other.get(ids[3]))  # `fleetrun cancel r3`
            other.update_task(ids[4], worktree="/gone")  # `fleetrun gc`: no transition
            other.add_tasks(
                [TaskSpec(name="late", prompt="p", cwd=str(fleeter.path / "repo20"), git_ref="main")],
                source="more.toml",
                source_hash="h2",
            )  # `fleetrun queue more.toml`

    def look(config: Any) -> None:
        view: TaskView = config.stash[TASKVIEW_KEY]
        seen["r3"] = view.get(ids[3])  # CANCELLED: no longer held
        seen["cancelled"] = view.count({State.CANCELLED})
        seen["r4"] = view.get(ids[4]).worktree  # type: ignore[union-attr]
        seen["late"] = [t.state for t in view.in_states({State.READY}) if t.name == "late"]
        seen["reads"] = view.full_reads

    probe = run(fleeter, counted, 7, {3: from_another_shell, 5: look})
    assert seen == {"r3": None, "cancelled": 1, "r4": "/gone", "late": [State.READY], "reads": 1}
    after = probe.counts[3]  # the pass that saw the other shell's writes
    assert after["place"] == 2 and after["placed:late"] == 1 and after["placed:r4"] == 1, after
    assert after.get("tasks()", 0) == 0, after  # r3, r4 and late read again, by id
    for counts in probe.counts[4:]:
        assert counts.get("place", 0) == 0 and counts.get("rows", 0) == 0, counts


def test_the_view_sees_its_own_connection_s_writes_whatever_the_sql(fleeter: Fleeter) -> None:
    ids = queue(fleeter, 2)
    led = fleeter.ledger()
    view = TaskView(led)
    assert [t.name for t in view.tasks()] == ["r0", "r1", "p0", "p1"]
    assert view.refresh() == set()
    with led.tx() as cur:  # a raw UPDATE, as ending.py adds an attempt's cost
        cur.execute("UPDATE tasks SET cost_usd = cost_usd + 1.5 WHERE id=?", (ids[1],))
    led.transition(ids[0], State.READY, State.CANCELLED, "operator_cancel")
    assert view.refresh() == {ids[0], ids[1]}
    assert view.get(ids[1]).cost_usd == 1.5  # type: ignore[union-attr]
    # the listing of every task (the live view's) is read again where it changed
    assert [(t.name, t.state, t.cost_usd) for t in view.tasks()][:2] == [
        ("r0", State.CANCELLED, 0.0),
        ("r1", State.READY, 1.5),
    ]
    assert [t.name for t in view.in_states({State.READY, State.CANCELLED})] == ["r0", "r1"]
    assert view.get(ids[0]) is None and view.get(ids[2]) is None  # CANCELLED, PENDING: not held
    assert view.count({State.PENDING, State.CANCELLED, State.READY}) == 4
    assert view.full_reads == 1


def test_a_freed_slot_asks_the_next_task_not_the_whole_queue(
    fleeter: Fleeter, fake_claude: Any, counted: PassProbe
) -> None:
    """One slot, six tasks: each ending frees the slot, the next task is placed, and the
    others, told again they wait on a full machine, are passed over (the whole queue
    was asked on every pass before)."""
    fleeter.make_repo()
    fleeter.write_policy("[local]\nmax_tasks = 1\n")
    fleeter.write_tasks(
        "\n".join(f'[[task]]\nname = "t{i}"\ncwd = "repo"\nprompt = "p"\ngit_ref = "main"\n' for i in range(6))
    )
    fake_claude.script(default=[{"actions": [["write", "out.txt", "x"], ["commit", "add out"]]}])
    probe = counted
    probe.passes = 1_000_000
    r = fleeter.run("tasks.toml", "--max-tasks", "1", plugins=[probe])
    r.assert_outcomes(done=6)
    asked = sum((c for c in probe.counts), Counter())
    passes = len(probe.counts)
    # each task: once in the first pass, once when its turn comes (placed), and once
    # more for those before it when a placement moved the candidates in a pass
    assert passes > 12 and asked["place"] <= 3 * 6, (passes, asked)


def test_a_freed_slot_goes_to_the_next_task_that_can_take_it_past_those_that_cannot(
    fleeter: Fleeter, fake_claude: Any, counted: PassProbe
) -> None:
    """One slot; the first tasks in the queue can never be placed (a tag no machine has),
    those after them can: each freed slot is offered in queue order until a task takes
    it (the pass stops asking once the slot is taken), and every one of them runs. The
    waits of the two that cannot are kept (``status`` shows why they wait)."""
    fleeter.make_repo()
    fleeter.write_policy("[local]\nmax_tasks = 1\n")
    never = 'requires = ["no-such-tag"]\n'
    fleeter.write_tasks(
        "\n".join(
            f'[[task]]\nname = "t{i}"\ncwd = "repo"\nprompt = "p"\ngit_ref = "main"\n' + (never if i < 2 else "")
            for i in range(6)
        )
    )
    fake_claude.script(default=[{"actions": [["write", "out.txt", "x"], ["commit", "add out"]]}])
    counted.passes = 1_000_000
    r = fleeter.run("tasks.toml", "--max-tasks", "1", plugins=[counted])
    r.assert_outcomes(done=4, ready=2)
    assert "cannot place: t0: this machine lacks `no-such-tag`" in r.stdout + r.stderr, r.stdout
    waits = json.loads(fleeter.ledger().get_meta("waits") or "{}")
    by_name = {t.name: t.id for t in fleeter.ledger().tasks()}
    assert waits.get(by_name["t1"]) == "this machine lacks `no-such-tag`", waits


def test_a_waiting_ready_task_is_held_as_two_objects(fleeter: Fleeter, counted: PassProbe) -> None:
    """A READY task told to wait costs the loop its task object and its list of
    dependencies, whatever placement said: no dict, no reader of its own, no Wait kept
    for it (at 30,000 READY tasks, five objects each were the garbage collector's full
    passes' work, and their memory). Counted as the objects the collector tracks after
    the first pass, with 10 and with 410 READY tasks, a plugin's filter installed (each
    task is then decided afresh)."""
    tracked: list[int] = []

    def count(config: Any) -> None:
        gc.collect()
        tracked.append(len(gc.get_objects()))

    queue(fleeter, 10)
    run(fleeter, counted, 3, {2: count}, (RefusesNothing(),))
    _fresh_ledger(fleeter)
    queue(fleeter, 410)
    run(fleeter, counted, 3, {2: count}, (RefusesNothing(),))
    per_task = (tracked[1] - tracked[0]) / 400  # and a second run's few objects of its own
    assert per_task <= 2.5, (tracked, per_task)


def test_a_pass_holds_the_parsed_spec_of_the_task_placement_asks_about_not_every_one(
    fleeter: Fleeter, counted: PassProbe, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before it places a task, a pass asks whether any placeable task requires a tag or
    a tool (to probe this machine's tools only then): that is read from the rows, so
    the specs parsed at any time are those of the tasks asked about so far and still
    to be told to wait (one), not every placeable one's (30,000 READY tasks had 30,000
    specs parsed at once, each several objects for the collector's full passes)."""
    queue(fleeter, 60)
    live: list[int] = []
    counted_place = placement_plugin.builtin_place

    def place(task: Any, *a: Any, **kw: Any) -> Any:
        live.append(sum(1 for o in gc.get_objects() if isinstance(o, TaskSpec)))
        return counted_place(task, *a, **kw)

    monkeypatch.setattr(placement_plugin, "builtin_place", place)
    run(fleeter, counted, 2, {})
    assert len(live) == 60 and max(live) <= 2, live


def test_whether_a_held_task_requires_a_tag_or_tool_is_read_from_its_row(fleeter: Fleeter) -> None:
    """What placement asks of every placeable task (whether to probe this machine's
    tools) is answered from the row, without parsing the spec; a copy made with
    ``dataclasses.replace`` answers from its spec."""
    import dataclasses

    repo = fleeter.make_repo()
    specs = [
        TaskSpec(name="tagged", prompt="p", cwd=str(repo), git_ref="main", requires=["gpu"]),
        TaskSpec(name="plain", prompt="p", cwd=str(repo), git_ref="main"),
    ]
    tagged, plain = (t.id for t in fleeter.ledger().add_tasks(specs, source="tasks.toml", source_hash="h"))
    view = TaskView(fleeter.ledger())
    a, b = view.get(tagged), view.get(plain)
    assert a is not None and b is not None
    assert a.has_requirements() and not b.has_requirements()
    assert dataclasses.replace(a, worktree="/w").has_requirements()
    assert not dataclasses.replace(b, worktree="/w").has_requirements()


def test_tasks_told_the_same_wait_share_its_words(fleeter: Fleeter, counted: PassProbe) -> None:
    """READY tasks told to wait for the same reason (a draining machine) hold one string
    of it, in placement's reasons and the loop's waits, however each was decided (with
    a plugin's filter, each is decided afresh: it worded each anew, two strings a task)."""
    queue(fleeter, 30)
    seen: dict[str, Any] = {}

    def look(config: Any) -> None:
        seen["reasons"] = dict(config.stash[placement_plugin.REASONS_KEY])

    run(fleeter, counted, 3, {2: look}, (RefusesNothing(),))
    reasons = seen["reasons"]
    assert len(reasons) == 30 and len({id(r) for r in reasons.values()}) == 1, reasons


def test_tasks_waiting_for_a_tag_on_a_machine_with_room_are_not_asked_again_each_pass(
    fleeter: Fleeter, counted: PassProbe
) -> None:
    """READY tasks that require a tag no machine has, this machine having free slots:
    each is asked once, not again on every pass because its free memory or load moved
    (their wait was kept only while the candidates stood still, which a measured one
    never does); the reason ``status`` shows stays."""
    repo = fleeter.make_repo()
    specs = [
        TaskSpec(name=f"t{i}", prompt="p", cwd=str(repo), git_ref="main", requires=["no-such-tag"]) for i in range(25)
    ]
    ids = [t.id for t in fleeter.ledger().add_tasks(specs, source="tasks.toml", source_hash="h")]
    seen: dict[str, Any] = {}

    def look(config: Any) -> None:
        seen["waits"] = json.loads(config.stash[LEDGER_KEY].get_meta("waits") or "{}")

    probe = run(fleeter, counted, 7, {6: look})
    assert probe.counts[0]["place"] == 25, probe.counts[0]
    assert [c.get("place", 0) for c in probe.counts[1:]] == [0] * 6, probe.counts
    assert {seen["waits"].get(i) for i in ids} == {"this machine lacks `no-such-tag`"}


def test_the_loop_parses_the_spec_of_no_task_it_does_not_use(
    fleeter: Fleeter, counted: PassProbe, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With tasks that wait behind a dependency, ``fleetrun work``'s passes parse no
    spec of theirs (most of an idle supervisor's memory at 100,000 tasks); the READY
    ones it places are read once each. (The summary at its end reads what it shows.)"""
    queue(fleeter, 30)
    parsed: Counter[str] = Counter()
    real = TaskSpec.from_json.__func__  # type: ignore[attr-defined]

    def from_json(cls: Any, data: Any) -> Any:
        parsed[str(data.get("name"))] += 1
        return real(cls, data)

    monkeypatch.setattr(TaskSpec, "from_json", classmethod(from_json))
    during: Counter[str] = Counter()
    run(fleeter, counted, 4, {4: lambda config: during.update(parsed)})
    assert during and not [n for n in during if n.startswith("p")], during
    assert all(n <= 1 for n in during.values()), during


def test_a_task_s_spec_is_read_from_another_thread_too(fleeter: Fleeter) -> None:
    """A task's spec read first off the loop's thread (a worker making its workspace)
    is read through a connection of that thread, not the loop's (which SQLite refuses)."""
    import threading

    ids = queue(fleeter, 2)
    view = TaskView(fleeter.ledger())
    got: list[Any] = []
    worker = threading.Thread(target=lambda: got.append(view.get(ids[1]).spec))  # type: ignore[union-attr]
    worker.start()
    worker.join(120)
    assert [s.name for s in got] == ["r1"]
    assert view.get(ids[0]).spec.name == "r0"  # type: ignore[union-attr]


def test_a_view_task_copied_with_replace_keeps_its_spec_and_dependencies(fleeter: Fleeter) -> None:
    """The loop copies a task it starts with ``dataclasses.replace`` (its new worktree):
    the copy of a task the view holds has its spec and its dependencies' names."""
    import dataclasses

    ids = queue(fleeter, 2)
    fleeter.ledger().transition(ids[2], State.PENDING, State.READY, "dependencies_done")  # held from here
    view = TaskView(fleeter.ledger())
    copy = dataclasses.replace(view.get(ids[2]), worktree="/w")  # type: ignore[type-var]
    assert copy.worktree == "/w" and copy.spec.name == "p0"
    assert copy.dependency_names() == ["r0"] and copy.to_json()["depends_on"] == ["r0"]


def _end(led: Ledger, task_id: str, to: State = State.DONE) -> None:
    """Move a READY task to ``to`` the way the loop's stages do, one transition at a time."""
    path = {
        State.DONE: [State.ASSIGNED, State.RUNNING, State.VERIFYING, State.DONE],
        State.NEEDS_HUMAN: [State.NEEDS_HUMAN],
    }[to]
    now = State.READY
    for nxt in path:
        led.transition(task_id, now, nxt, "placed" if nxt is State.ASSIGNED else "verified")
        now = nxt


def test_the_view_holds_what_can_move_not_the_tasks_that_wait_for_a_dependency(
    fleeter: Fleeter, counted: PassProbe
) -> None:
    """``fleetrun work`` over READY tasks and PENDING ones behind a task that cannot start
    builds no object of a PENDING task, not even in its first pass (100,000 of them were
    most of an idle supervisor's memory and its first pass's time); it counts them."""
    ids = queue(fleeter, 40)
    seen: dict[str, Any] = {}

    def look(config: Any) -> None:
        view: TaskView = config.stash[TASKVIEW_KEY]
        seen["held"] = sorted({t.state for t in view.in_states(set(State) - {State.PENDING})})
        seen["p0"] = view.get(ids[40])
        seen["pending"] = view.count({State.PENDING})

    probe = run(fleeter, counted, 4, {2: look})
    assert seen == {"held": [State.READY], "p0": None, "pending": 40}
    for counts in probe.counts:
        assert counts.get("row:p", 0) == 0, probe.counts
    assert probe.counts[0]["row:r"] == 40  # the READY ones, read once


@pytest.mark.parametrize("where", ["this loop", "another shell"])
def test_hundreds_of_pending_tasks_are_promoted_when_their_dependency_is_done(
    fleeter: Fleeter, counted: PassProbe, where: str
) -> None:
    """300 PENDING tasks behind r0 become READY in the pass after r0 is DONE, whether
    the loop's own connection recorded its end or another process did (found by query
    of the dependency's dependents: the loop holds none of them)."""
    ids = queue(fleeter, 300)
    home = fleeter.home
    seen: dict[str, Any] = {}

    def done(config: Any) -> None:
        if where == "this loop":
            _end(config.stash[LEDGER_KEY], ids[0])
        else:
            with Ledger(home / "state.db") as other:
                _end(other, ids[0])

    def look(config: Any) -> None:
        led: Ledger = config.stash[LEDGER_KEY]
        seen["states"] = Counter(t.state for t in led.tasks() if t.name.startswith("p"))
        seen["held"] = config.stash[TASKVIEW_KEY].count({State.READY})

    run(fleeter, counted, 5, {2: done, 4: look})
    assert seen == {"states": {State.READY: 300}, "held": 299 + 300}


def test_a_dependency_set_aside_by_another_shell_sends_its_pending_dependents_to_a_human(
    fleeter: Fleeter, counted: PassProbe
) -> None:
    """r0 moved to NEEDS_HUMAN by another process, its PENDING dependents follow it
    (``dependency_needs_human:r0``) on the loop's next pass."""
    ids = queue(fleeter, 120)
    home = fleeter.home
    seen: dict[str, Any] = {}

    def set_aside(config: Any) -> None:
        with Ledger(home / "state.db") as other:
            _end(other, ids[0], State.NEEDS_HUMAN)

    def look(config: Any) -> None:
        led: Ledger = config.stash[LEDGER_KEY]
        seen["p"] = Counter((t.state, t.reason) for t in led.tasks() if t.name.startswith("p"))

    run(fleeter, counted, 5, {2: set_aside, 4: look})
    assert seen == {"p": {(State.NEEDS_HUMAN, "dependency_needs_human:r0"): 120}}


def test_a_dag_with_fan_in_and_fan_out_completes(fleeter: Fleeter, fake_claude: Any) -> None:
    """Each task starts once all it depends on is DONE (the loop finds them by query now)."""
    fleeter.make_repo()
    deps = {"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"], "e": ["d"], "f": ["a", "d"]}
    fleeter.write_tasks(
        "\n".join(
            f'[[task]]\nname = "{n}"\ncwd = "repo"\nprompt = "p"\ngit_ref = "main"\ndepends_on = {d!r}\n'.replace(
                "'", '"'
            )
            for n, d in deps.items()
        )
    )
    fake_claude.script(default=[{"actions": [["write", "out.txt", "x"], ["commit", "add out"]]}])
    r = fleeter.run("tasks.toml")
    r.assert_outcomes(done=6)
    led = fleeter.ledger()
    started = {t.name: led.transitions(t.id) for t in led.tasks()}
    for name, on in deps.items():
        ready = next(x.time for x in started[name] if x.to_state == "ASSIGNED")
        for d in on:
            assert next(x.time for x in started[d] if x.to_state == "DONE") <= ready, (name, d)


def test_a_restart_reads_no_done_task_whose_worktree_is_gone(fleeter: Fleeter, counted: PassProbe) -> None:
    """Adoption cleans up the DONE tasks a crash left with their worktree; those whose
    worktree was removed (every DONE task of a long history) are not read at all."""
    ids = queue(fleeter, 12)
    led = fleeter.ledger()
    for i in range(1, 11):
        _end(led, ids[i])
    led.update_task(ids[11], worktree=str(fleeter.path / "gone-wt"))  # READY: not adoption's
    probe = run(fleeter, counted, 3, {})
    read = sorted(k for c in probe.counts for k in c if k.startswith("task:r") and k != "task:r0")
    assert read == [], read

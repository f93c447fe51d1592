"""The ledger, against real SQLite files and real concurrent processes."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import stat
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetrun.exceptions import StateConflict, UsageError
from fleetrun.ledger import SCHEMA_VERSION, Ledger
from fleetrun.reports import Verdict
from fleetrun.states import State
from fleetrun.taskspec import TaskSpec

ROOT = Path(__file__).resolve().parents[1]
TASK_ID = re.compile(r"^task_([0-9a-z]+)_(\d+)$")


def spec(name: str, *deps: str) -> TaskSpec:
    return TaskSpec(name=name, prompt=f"do {name}", cwd="/repo", depends_on=list(deps))


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "home" / "state.db"


@pytest.fixture
def led(db: Path) -> Iterator[Ledger]:
    with Ledger(db) as ledger:
        yield ledger


def raw(path: Path) -> sqlite3.Connection:
    """A second, plain connection to the same file (the caller closes it)."""
    return sqlite3.connect(str(path), timeout=10, isolation_level=None)


def count(path: Path, sql: str, *args: object) -> int:
    conn = raw(path)
    try:
        return conn.execute(sql, args).fetchone()[0]
    finally:
        conn.close()


def state_of(path: Path, task_id: str) -> str:
    conn = raw(path)
    try:
        return conn.execute("SELECT state FROM tasks WHERE id=?", (task_id,)).fetchone()[0]
    finally:
        conn.close()


WALK_TO_DONE = [
    (State.READY, State.ASSIGNED, "placed"),
    (State.ASSIGNED, State.RUNNING, "started"),
    (State.RUNNING, State.VERIFYING, "exited"),
    (State.VERIFYING, State.DONE, "verify_pass"),
]


def to_done(led: Ledger, task_id: str) -> None:
    for src, dst, cause in WALK_TO_DONE:
        led.transition(task_id, src, dst, cause)


# -- schema and files -------------------------------------------------------------------


def test_pragmas_and_schema_version(db: Path) -> None:
    with Ledger(db, timeout_s=7.5) as led:
        assert led.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert led.conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert led.conn.execute("PRAGMA busy_timeout").fetchone()[0] == 7500
        assert led.conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        assert led.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    with Ledger(db) as led:
        assert led.conn.execute("PRAGMA busy_timeout").fetchone()[0] == 30000
    # WAL is a property of the file, seen by any other connection
    conn = raw(db)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    finally:
        conn.close()
    assert {"tasks", "deps", "queues", "attempts", "verdicts", "transitions", "meta"} <= tables


def test_reopen_keeps_data(db: Path) -> None:
    with Ledger(db) as led:
        (t,) = led.add_tasks([spec("a")])
        led.set_meta("k", "v")
    with Ledger(db) as led:
        assert led.get(t.id) is not None
        assert led.get_meta("k") == "v"
        assert len(led.transitions(t.id)) == 1


def test_newer_schema_is_refused(db: Path) -> None:
    Ledger(db).close()
    conn = raw(db)
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(UsageError, match="upgrade fleetrun") as info:
        Ledger(db)
    assert info.value.file == str(db)
    assert f"schema version {SCHEMA_VERSION + 1}" in info.value.message
    # refused, not "migrated" down
    assert count(db, "PRAGMA user_version") == SCHEMA_VERSION + 1


def test_refused_open_closes_its_connection(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    Ledger(db).close()
    conn = raw(db)
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    conn.close()
    opened: list[sqlite3.Connection] = []
    real_connect = sqlite3.connect

    def connect(*args: object, **kwargs: object) -> sqlite3.Connection:
        c = real_connect(*args, **kwargs)  # type: ignore[arg-type]
        opened.append(c)
        return c

    monkeypatch.setattr(sqlite3, "connect", connect)
    with pytest.raises(UsageError):
        Ledger(db)
    monkeypatch.undo()
    (leaked,) = opened
    try:
        with pytest.raises(sqlite3.ProgrammingError, match="closed"):
            leaked.execute("SELECT 1")
    finally:
        leaked.close()


def test_files_are_private(tmp_path: Path) -> None:
    home = tmp_path / "a" / "home"
    old = os.umask(0)  # even with a permissive umask
    try:
        with Ledger(home / "state.db") as led:
            led.add_tasks([spec("a")])  # makes SQLite create -wal and -shm
            modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in home.iterdir()}
            dir_mode = stat.S_IMODE(home.stat().st_mode)
    finally:
        os.umask(old)
    assert dir_mode == 0o700
    assert modes["state.db"] == 0o600
    assert set(modes) == {"state.db", "state.db-wal", "state.db-shm"}
    assert set(modes.values()) == {0o600}


def test_existing_folder_is_tightened(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o755)
    os.chmod(home, 0o755)
    Ledger(home / "state.db").close()
    assert stat.S_IMODE(home.stat().st_mode) == 0o700


def test_first_open_waits_for_a_concurrent_writer(db: Path) -> None:
    """Two processes opening a fresh ledger at once: the second must wait, not fail."""
    db.parent.mkdir(mode=0o700)
    holding = threading.Event()
    release = threading.Event()
    errors: list[BaseException] = []

    def writer() -> None:
        # what another process's first open looks like while it converts the file
        conn = raw(db)
        try:
            conn.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            conn.execute("BEGIN IMMEDIATE")
            holding.set()
            release.wait(5)
            conn.execute("COMMIT")
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)
            holding.set()
        finally:
            conn.close()

    th = threading.Thread(target=writer)
    th.start()
    try:
        assert holding.wait(5)
        timer = threading.Timer(0.3, release.set)
        timer.start()
        with Ledger(db, timeout_s=5) as led:
            assert led.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        timer.cancel()
        release.set()
        th.join(10)
    assert not errors


# -- add_tasks / find ---------------------------------------------------------------------


def test_add_tasks(db: Path, led: Ledger) -> None:
    tasks = led.add_tasks(
        [spec("a"), spec("b", "a"), spec("c", "a", "b"), spec("d")], source="tasks.toml", source_hash="h1"
    )
    assert [t.name for t in tasks] == ["a", "b", "c", "d"]
    ids = [t.id for t in tasks]
    assert len(set(ids)) == 4
    matches = [TASK_ID.match(i) for i in ids]
    assert all(matches)
    assert len({m.group(1) for m in matches if m}) == 1  # one queue token per batch
    assert [int(m.group(2)) for m in matches if m] == [0, 1, 2, 3]
    a, b, c, d = tasks
    assert (a.state, b.state, c.state, d.state) == (State.READY, State.PENDING, State.PENDING, State.READY)
    assert b.deps == [a.id]
    assert sorted(c.deps) == sorted([a.id, b.id])
    assert a.deps == [] and d.deps == []
    assert sorted(led.dependents(a.id)) == sorted([b.id, c.id])
    assert all(t.queue_id == a.queue_id and t.source == "tasks.toml" for t in tasks)
    assert b.spec.depends_on == ["a"]  # the spec keeps names; deps are ids
    assert led.find_queue("h1") == a.queue_id

    for t in tasks:
        (row,) = led.transitions(t.id)
        assert (row.from_state, row.to_state, row.cause) == (None, t.state.value, "queued")
        assert row.attempt is None
    assert count(db, "SELECT COUNT(*) FROM transitions") == 4
    assert {t.id for t in led.tasks({State.PENDING})} == {b.id, c.id}
    assert [t.id for t in led.tasks()] == ids


def test_second_batch_gets_new_ids(led: Ledger) -> None:
    first = led.add_tasks([spec("a"), spec("b")])
    second = led.add_tasks([spec("a"), spec("b")])
    assert not {t.id for t in first} & {t.id for t in second}
    assert first[0].queue_id != second[0].queue_id
    assert [t.id for t in led.tasks(queue_id=second[0].queue_id)] == [t.id for t in second]


def test_find_by_id_and_by_name_newest_wins(led: Ledger) -> None:
    (old_a, old_b) = led.add_tasks([spec("a"), spec("b")])
    (new_a,) = led.add_tasks([spec("a")])
    found = led.find(old_a.id)
    assert found is not None and found.id == old_a.id
    found = led.find("a")
    assert found is not None and found.id == new_a.id
    found = led.find("b")
    assert found is not None and found.id == old_b.id
    assert led.find("nope") is None
    assert led.get("nope") is None


def test_unknown_dependency_writes_nothing(db: Path, led: Ledger) -> None:
    with pytest.raises(ValueError, match="not in this batch"):
        led.add_tasks([spec("a"), spec("b", "zzz")])
    for table in ("tasks", "queues", "deps", "transitions"):
        assert count(db, f"SELECT COUNT(*) FROM {table}") == 0


def test_find_queue_ignores_unknown_hash(led: Ledger) -> None:
    led.add_tasks([spec("a")], source_hash="h1")
    assert led.find_queue("h2") is None


def test_find_queue_keeps_finished_queues(led: Ledger) -> None:
    """Running an unchanged file again must not redo DONE work: a finished queue is found."""
    (a, b) = led.add_tasks([spec("a"), spec("b")], source_hash="h1")
    to_done(led, a.id)
    assert led.find_queue("h1") == a.queue_id
    to_done(led, b.id)
    assert led.find_queue("h1") == a.queue_id
    (c,) = led.add_tasks([spec("a")], source_hash="h1")
    assert led.find_queue("h1") == c.queue_id  # the newest wins


# -- compare-and-set --------------------------------------------------------------------


def snapshot(path: Path, task_id: str) -> tuple[object, ...]:
    conn = raw(path)
    try:
        row = conn.execute("SELECT state, updated, reason, host, attempts FROM tasks WHERE id=?", (task_id,)).fetchone()
        n = conn.execute("SELECT COUNT(*) FROM transitions").fetchone()[0]
        a = conn.execute("SELECT COUNT(*) FROM attempts").fetchone()[0]
    finally:
        conn.close()
    return (*row, n, a)


def test_transition_sets_state_logs_and_returns_previous(led: Ledger) -> None:
    (t,) = led.add_tasks([spec("a")])
    prev = led.transition(
        t.id, State.READY, State.ASSIGNED, "placed", attempt=3, host="mini", worktree="/wt/a", handoff={"k": [1]}
    )
    assert prev == State.READY
    got = led.get(t.id)
    assert got is not None
    assert (got.state, got.reason, got.worktree, got.handoff) == (State.ASSIGNED, "placed", "/wt/a", {"k": [1]})
    assert got.updated >= t.updated
    row = led.transitions(t.id)[-1]
    assert (row.from_state, row.to_state, row.cause, row.attempt, row.host) == (
        "READY",
        "ASSIGNED",
        "placed",
        3,
        "mini",
    )
    # a set of expected states
    assert led.transition(t.id, {State.READY, State.ASSIGNED}, State.CANCELLED, "operator_cancel") == State.ASSIGNED


def test_stale_expected_state_conflicts_and_writes_nothing(db: Path, led: Ledger) -> None:
    (t,) = led.add_tasks([spec("a")])
    before = snapshot(db, t.id)
    with pytest.raises(StateConflict) as info:
        led.transition(t.id, State.RUNNING, State.VERIFYING, "exited")
    assert info.value.task_id == t.id and info.value.actual == State.READY
    with pytest.raises(StateConflict):
        led.transition(t.id, {State.PENDING, State.RETRYING}, State.ASSIGNED, "placed")
    assert snapshot(db, t.id) == before


def test_two_ledgers_one_wins(db: Path, led: Ledger) -> None:
    (t,) = led.add_tasks([spec("a")])
    with Ledger(db) as other:
        stale = other.get(t.id)
        assert stale is not None and stale.state == State.READY
        led.transition(t.id, State.READY, State.ASSIGNED, "placed")
        before = snapshot(db, t.id)
        with pytest.raises(StateConflict):
            other.transition(t.id, stale.state, State.CANCELLED, "operator_cancel")
        assert snapshot(db, t.id) == before
        # the connection is usable afterwards: the failed transaction was rolled back
        assert not other.conn.in_transaction
        other.transition(t.id, State.ASSIGNED, State.CANCELLED, "operator_cancel")
    assert state_of(db, t.id) == "CANCELLED"


@pytest.mark.parametrize(
    ("walk", "src", "dst"),
    [
        (WALK_TO_DONE, State.DONE, State.RUNNING),
        ([], State.PENDING, State.RUNNING),
        ([], State.PENDING, State.DONE),
        (WALK_TO_DONE[:2], State.RUNNING, State.DONE),
        (WALK_TO_DONE[:1], State.ASSIGNED, State.ASSIGNED),
    ],
)
def test_forbidden_transition_writes_nothing(db: Path, led: Ledger, walk: list, src: State, dst: State) -> None:
    deps = ("x",) if src == State.PENDING else ()
    tasks = led.add_tasks([spec("x"), spec("a", *deps)])
    t = tasks[1]
    for s, d, c in walk:
        led.transition(t.id, s, d, c)
    before = snapshot(db, t.id)
    with pytest.raises(ValueError, match="not allowed"):
        led.transition(t.id, src, dst, "started")
    assert snapshot(db, t.id) == before
    assert not led.conn.in_transaction


@pytest.mark.parametrize("bad", ["", "Placed", "verify fail", "verify-fail", "9lives", "_x", ":detail", "a b:c"])
def test_bad_cause_is_rejected(db: Path, led: Ledger, bad: str) -> None:
    (t,) = led.add_tasks([spec("a")])
    before = snapshot(db, t.id)
    with pytest.raises(ValueError, match="snake_case"):
        led.transition(t.id, State.READY, State.ASSIGNED, bad)
    with pytest.raises(ValueError, match="snake_case"):
        led.lease(t.id, State.READY, "local", "fresh", cause=bad)
    assert snapshot(db, t.id) == before


def test_cause_detail_is_kept(led: Ledger) -> None:
    (t,) = led.add_tasks([spec("a")])
    led.transition(t.id, State.READY, State.NEEDS_HUMAN, "verify_fail:cargo test --all: 2 failed")
    assert led.transitions(t.id)[-1].cause == "verify_fail:cargo test --all: 2 failed"


def test_unknown_task(led: Ledger) -> None:
    with pytest.raises(KeyError):
        led.transition("task_nope_0", State.READY, State.ASSIGNED, "placed")
    assert not led.conn.in_transaction


def test_update_task_refuses_state(led: Ledger) -> None:
    (t,) = led.add_tasks([spec("a")])
    with pytest.raises(ValueError, match="transition"):
        led.update_task(t.id, state="DONE")
    led.update_task(t.id, branch="fleet/a", handoff={"summary": "x"})
    got = led.get(t.id)
    assert got is not None and got.state == State.READY
    assert (got.branch, got.handoff) == ("fleet/a", {"summary": "x"})


def test_transition_is_never_half_written(db: Path, led: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    (t,) = led.add_tasks([spec("a")])
    before = snapshot(db, t.id)
    seen_inside: list[str] = []

    def failing_log(cur: sqlite3.Cursor, task_id: str, *args: object, **kwargs: object) -> None:
        # the UPDATE has run in this transaction...
        seen_inside.append(cur.execute("SELECT state FROM tasks WHERE id=?", (task_id,)).fetchone()[0])
        raise sqlite3.OperationalError("disk I/O error (simulated)")

    monkeypatch.setattr(Ledger, "_log", staticmethod(failing_log))
    with pytest.raises(sqlite3.OperationalError, match="simulated"):
        led.transition(t.id, State.READY, State.ASSIGNED, "placed", worktree="/wt")
    with pytest.raises(sqlite3.OperationalError, match="simulated"):
        led.lease(t.id, State.READY, "local", "fresh")
    monkeypatch.undo()
    assert seen_inside == ["ASSIGNED", "ASSIGNED"]
    # ...and was rolled back with it: seen from this connection and from another one
    assert not led.conn.in_transaction
    got = led.get(t.id)
    assert got is not None and (got.state, got.worktree, got.reason) == (State.READY, None, "queued")
    assert snapshot(db, t.id) == before
    assert led.attempts(t.id) == []
    # and the ledger carries on
    led.transition(t.id, State.READY, State.ASSIGNED, "placed")
    assert state_of(db, t.id) == "ASSIGNED"


def test_lease_is_never_half_written(db: Path, led: Ledger) -> None:
    """The attempt row is the last statement of lease(): if it fails, nothing stays."""
    (t,) = led.add_tasks([spec("a")])
    before = snapshot(db, t.id)
    led.conn.execute(
        "CREATE TEMP TRIGGER no_attempts BEFORE INSERT ON main.attempts"
        " BEGIN SELECT RAISE(ABORT, 'attempt refused (simulated)'); END"
    )
    with pytest.raises(sqlite3.IntegrityError, match="simulated"):
        led.lease(t.id, State.READY, "mini", "fresh")
    led.conn.execute("DROP TRIGGER temp.no_attempts")
    assert snapshot(db, t.id) == before
    got = led.get(t.id)
    assert got is not None and (got.state, got.host, got.attempts) == (State.READY, None, 0)


# -- lease --------------------------------------------------------------------------------


def test_lease(db: Path, led: Ledger) -> None:
    (t,) = led.add_tasks([spec("a")])
    att = led.lease(t.id, State.READY, "mini", "fresh")
    assert (att.task_id, att.number, att.kind, att.host, att.state) == (t.id, 1, "fresh", "mini", "leased")
    assert att.id == f"{t.id}_a1"
    got = led.get(t.id)
    assert got is not None and (got.state, got.host, got.attempts, got.reason) == (State.ASSIGNED, "mini", 1, "placed")
    row = led.transitions(t.id)[-1]
    assert (row.from_state, row.to_state, row.attempt, row.host) == ("READY", "ASSIGNED", 1, "mini")

    led.transition(t.id, State.ASSIGNED, State.RUNNING, "started")
    led.transition(t.id, State.RUNNING, State.VERIFYING, "exited")
    led.transition(t.id, State.VERIFYING, State.RETRYING, "verify_fail:pytest")
    att2 = led.lease(t.id, {State.RETRYING, State.RESUMING}, "local", "retry", cause="placed:again")
    assert (att2.number, att2.kind, att2.host) == (2, "retry", "local")
    got = led.get(t.id)
    assert got is not None and (got.host, got.attempts) == ("local", 2)
    assert [a.number for a in led.attempts(t.id)] == [1, 2]
    latest = led.latest_attempt(t.id)
    assert latest is not None and latest.id == att2.id
    assert [r.attempt for r in led.transitions(t.id) if r.to_state == "ASSIGNED"] == [1, 2]

    # from the wrong state: StateConflict, no attempt row, nothing else written
    before = snapshot(db, t.id)
    with pytest.raises(StateConflict):
        led.lease(t.id, State.READY, "mini", "fresh")
    assert snapshot(db, t.id) == before
    assert len(led.attempts(t.id)) == 2


def test_update_attempt(led: Ledger) -> None:
    (t,) = led.add_tasks([spec("a")])
    att = led.lease(t.id, State.READY, "local", "fresh")
    led.update_attempt(att.id, state="running", shepherd_pid=123, info={"session": "s"}, workspace={"path": "/wt"})
    got = led.attempt(att.id)
    assert got is not None
    assert (got.state, got.shepherd_pid, got.info, got.workspace) == ("running", 123, {"session": "s"}, {"path": "/wt"})
    assert [a.id for a in led.attempts(states={"running"})] == [att.id]
    assert led.attempts(states={"leased"}) == []


# -- verdicts -----------------------------------------------------------------------------


def test_add_verdict_once(db: Path, led: Ledger) -> None:
    (t,) = led.add_tasks([spec("a")])
    att = led.lease(t.id, State.READY, "local", "fresh")
    v0 = Verdict(
        passed=False, kind="run", label="pytest", reason="exit code 1", output="1 failed", cost_usd=0.25, duration_s=1.5
    )
    v1 = Verdict(passed=True, kind="brain", label="is it good?", reason="yes", cost_usd=0.5)
    assert led.add_verdict(t.id, att.id, 0, v0) is True
    assert led.add_verdict(t.id, att.id, 1, v1) is True
    # the same (attempt, idx) again, e.g. after a crash between verdict and transition
    again = Verdict(passed=True, kind="run", label="pytest", reason="exit code 0", cost_usd=9.0)
    assert led.add_verdict(t.id, att.id, 0, again) is False
    got = led.get(t.id)
    assert got is not None and got.cost_usd == pytest.approx(0.75)
    rows = led.verdicts(attempt_id=att.id)
    assert [(r.idx, r.passed, r.reason, r.cost_usd) for r in rows] == [
        (0, False, "exit code 1", 0.25),
        (1, True, "yes", 0.5),
    ]
    assert rows[0].output == "1 failed" and rows[0].duration_s == 1.5 and rows[0].host == "local"
    assert len(led.verdicts(task_id=t.id)) == 2 == len(led.verdicts())
    assert count(db, "SELECT COUNT(*) FROM verdicts") == 2

    # the same idx on the next attempt is a new record
    led.transition(t.id, State.ASSIGNED, State.RETRYING, "verify_fail:pytest")
    att2 = led.lease(t.id, State.RETRYING, "local", "retry")
    assert led.add_verdict(t.id, att2.id, 0, v0) is True
    got = led.get(t.id)
    assert got is not None and got.cost_usd == pytest.approx(1.0)


def test_add_verdict_in_a_callers_transaction(led: Ledger) -> None:
    (t,) = led.add_tasks([spec("a")])
    att = led.lease(t.id, State.READY, "local", "fresh")
    led.transition(t.id, State.ASSIGNED, State.RUNNING, "started")
    led.transition(t.id, State.RUNNING, State.VERIFYING, "exited")
    v = Verdict(passed=True, kind="run", label="true", cost_usd=0.1)
    with pytest.raises(StateConflict), led.tx() as cur:
        assert led.add_verdict(t.id, att.id, 0, v, cur=cur)
        led.transition(t.id, State.RUNNING, State.DONE, "verify_pass", cur=cur)
    # the verdict went with the failed transition
    assert led.verdicts(attempt_id=att.id) == []
    got = led.get(t.id)
    assert got is not None and got.cost_usd == 0
    with led.tx() as cur:
        assert led.add_verdict(t.id, att.id, 0, v, cur=cur)
        led.transition(t.id, State.VERIFYING, State.DONE, "verify_pass", cur=cur)
    got = led.get(t.id)
    assert got is not None and got.state == State.DONE and got.cost_usd == pytest.approx(0.1)


# -- notes ----------------------------------------------------------------------------


def test_notes(db: Path, led: Ledger) -> None:
    (a, b) = led.add_tasks([spec("a"), spec("b")])
    led.add_note(a.id, "first")
    led.add_note(b.id, "other")
    led.add_note(a.id, "second")
    assert [text for _, text in led.notes(a.id)] == ["first", "second"]
    assert [text for _, text in led.notes(b.id)] == ["other"]
    times = [t for t, _ in led.notes(a.id)]
    assert times == sorted(times)
    with pytest.raises(sqlite3.IntegrityError):  # foreign keys are on
        led.add_note("task_nope_0", "x")
    assert count(db, "SELECT COUNT(*) FROM notes") == 3


# -- meta ---------------------------------------------------------------------------------


def test_meta(db: Path, led: Ledger) -> None:
    assert led.get_meta("k") is None
    assert led.get_meta("k", "dflt") == "dflt"
    led.set_meta("k", "1")
    led.set_meta("k", "2")
    assert led.get_meta("k") == "2"
    led.set_meta("other", "x")
    led.set_meta("k", None)
    assert led.get_meta("k") is None
    led.set_meta("k", None)  # deleting twice is fine
    with Ledger(db) as again:
        assert again.get_meta("other") == "x"
        assert again.get_meta("k", "gone") == "gone"


# -- concurrent processes ----------------------------------------------------------------

_LEASE_WORKER = r"""
import json, sys
from fleetrun.exceptions import StateConflict
from fleetrun.ledger import Ledger
from fleetrun.states import State

path, me, order = sys.argv[1], sys.argv[2], sys.argv[3]
won, lost, errors = [], 0, []
with Ledger(path) as led:
    ids = sorted(t.id for t in led.tasks())
    if order == "rev":
        ids.reverse()
    print("ready", flush=True)
    sys.stdin.readline()
    for tid in ids:
        try:
            att = led.lease(tid, State.READY, me, "fresh")
            won.append([tid, att.number, att.host])
        except StateConflict:
            lost += 1
        except Exception as e:
            errors.append(repr(e))
print(json.dumps({"won": won, "lost": lost, "errors": errors}), flush=True)
"""

_ADD_WORKER = r"""
import json, sys
from fleetrun.ledger import Ledger
from fleetrun.taskspec import TaskSpec

path, me, batches, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
ids, errors = [], []
with Ledger(path) as led:
    print("ready", flush=True)
    sys.stdin.readline()
    for b in range(batches):
        specs = [TaskSpec(name=f"{me}-{b}-{i}", prompt="p", cwd="/repo",
                          depends_on=[f"{me}-{b}-0"] if i else []) for i in range(size)]
        try:
            ids.extend(t.id for t in led.add_tasks(specs, source=me))
        except Exception as e:
            errors.append(repr(e))
print(json.dumps({"ids": ids, "errors": errors}), flush=True)
"""


def race(tmp_path: Path, script: str, argvs: list[list[object]]) -> list[dict]:
    """Start one python child per argv, let them all go at once, return their JSON."""
    worker = tmp_path / "worker.py"
    worker.write_text(script)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    procs = [
        subprocess.Popen(
            [sys.executable, str(worker), *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=env,
        )
        for argv in [[str(a) for a in argv] for argv in argvs]
    ]
    results = []
    try:
        for p in procs:  # wait until every child has opened its ledger
            assert p.stdout is not None
            line = p.stdout.readline()
            assert line == "ready\n", p.communicate(timeout=30)
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        for p in procs:
            out, err = p.communicate(timeout=60)
            assert p.returncode == 0, err
            results.append(json.loads(out))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return results


def test_concurrent_leases_have_one_winner(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    n_tasks, n_workers, rounds = 150, 4, 3
    with Ledger(db) as led:
        tasks = led.add_tasks([spec(f"t{i}") for i in range(n_tasks)])
    ids = {t.id for t in tasks}
    winners: dict[str, list[str]] = {tid: [] for tid in ids}
    for r in range(1, rounds + 1):
        results = race(tmp_path, _LEASE_WORKER, [[db, f"w{k}", "rev" if k % 2 else "fwd"] for k in range(n_workers)])
        assert [res["errors"] for res in results] == [[]] * n_workers  # no "database is locked"
        won = [w for res in results for w in res["won"]]
        # every task leased exactly once this round; everyone else lost the CAS
        assert sorted(w[0] for w in won) == sorted(ids)
        assert sum(res["lost"] for res in results) == n_tasks * (n_workers - 1)
        assert {w[1] for w in won} == {r}
        for tid, _, host in won:
            winners[tid].append(host)
        # hand every task back for the next round (ASSIGNED -> READY, as a refused start)
        with Ledger(db) as led:
            for tid in ids:
                led.transition(tid, State.ASSIGNED, State.READY, "never_started")
    # more than one process won something: they really raced
    assert len({h for hosts in winners.values() for h in hosts}) > 1

    with Ledger(db) as led:
        for tid in ids:
            atts = led.attempts(tid)
            assert [a.number for a in atts] == list(range(1, rounds + 1))
            assert [a.host for a in atts] == winners[tid]
            t = led.get(tid)
            assert t is not None and t.attempts == rounds and t.host == winners[tid][-1]
            rows = led.transitions(tid)
            assigned = [row for row in rows if row.to_state == "ASSIGNED"]
            assert [(row.from_state, row.attempt, row.host) for row in assigned] == [
                ("READY", n, host) for n, host in enumerate(winners[tid], 1)
            ]
            for prev, row in zip(rows, rows[1:]):
                assert row.from_state == prev.to_state
        pairs = led.conn.execute("SELECT task_id, number FROM attempts").fetchall()
        assert len(pairs) == len(set(map(tuple, pairs))) == n_tasks * rounds
        per_task = Counter(
            r[0]
            for r in led.conn.execute(
                "SELECT task_id FROM transitions WHERE from_state='READY' AND to_state='ASSIGNED'"
            )
        )
        assert per_task == dict.fromkeys(ids, rounds)


def test_concurrent_add_tasks_lose_nothing(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    Ledger(db).close()
    n_workers, batches, size = 4, 15, 5
    results = race(tmp_path, _ADD_WORKER, [[db, f"w{k}", batches, size] for k in range(n_workers)])
    assert [res["errors"] for res in results] == [[]] * n_workers
    returned = [i for res in results for i in res["ids"]]
    assert len(returned) == len(set(returned)) == n_workers * batches * size
    assert all(TASK_ID.match(i) for i in returned)
    with Ledger(db) as led:
        tasks = led.tasks()
        assert sorted(t.id for t in tasks) == sorted(returned)
        assert count(db, "SELECT COUNT(*) FROM queues") == n_workers * batches
        assert Counter(t.state for t in tasks) == {
            State.READY: n_workers * batches,
            State.PENDING: n_workers * batches * (size - 1),
        }
        by_name = {t.name: t for t in tasks}
        for t in tasks:
            assert t.queue_id == by_name[t.name.rsplit("-", 1)[0] + "-0"].queue_id
            if t.state == State.PENDING:
                assert t.deps == [by_name[t.name.rsplit("-", 1)[0] + "-0"].id]
        queued = Counter(r.task_id for r in led.transitions() if r.cause == "queued" and r.from_state is None)
        assert queued == dict.fromkeys(returned, 1)


# -- a damaged state.db (issue 10) ---------------------------------------------------------


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleetrun", *args],
        capture_output=True,
        text=True,
        env=dict(os.environ, FLEETRUN_HOME=str(home)),
        cwd=str(home.parent),
        timeout=120,
    )


def _filled(db: Path) -> bytes:
    with Ledger(db) as led:
        led.add_tasks([spec(f"t{i}") for i in range(30)])
    return db.read_bytes()


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_a_damaged_ledger_is_a_usage_error(db: Path, damage: str) -> None:
    data = _filled(db)
    for side in ("-wal", "-shm"):
        Path(str(db) + side).unlink(missing_ok=True)
    db.write_bytes(b"this is not sqlite\n" * 50 if damage == "garbage" else data[: len(data) // 2])
    before = db.read_bytes()
    with pytest.raises(UsageError) as e:
        Ledger(db)
    assert e.value.file == str(db)
    assert "move it aside to start a new one" in e.value.message
    for verb in ("status", "work"):
        r = _cli(db.parent, verb, *(["--until-idle"] if verb == "work" else []))
        assert r.returncode == 4, r.stderr
        assert "INTERNAL ERROR" not in r.stderr and "Traceback" not in r.stderr
        assert r.stderr.startswith(f"ERROR: {db}: not a fleetrun ledger ("), r.stderr
        assert r.stderr.rstrip().endswith("; move it aside to start a new one"), r.stderr
    assert db.read_bytes() == before  # nothing was written over it


def test_another_programs_database_is_not_taken_over(db: Path) -> None:
    db.parent.mkdir(parents=True)
    conn = raw(db)
    conn.execute("CREATE TABLE photos (id INTEGER PRIMARY KEY, path TEXT)")
    conn.close()
    with pytest.raises(UsageError, match="not a fleetrun ledger"):
        Ledger(db)


@pytest.mark.parametrize("sign", ["-wal", "attempts", "worktrees"])
def test_an_emptied_ledger_beside_earlier_work_is_a_usage_error(db: Path, sign: str) -> None:
    """A 0-byte state.db next to a WAL file, or in a home that holds attempts or
    worktrees, lost its tasks: say so rather than start afresh as if nothing ran."""
    _filled(db)
    db.write_bytes(b"")
    Path(str(db) + "-shm").unlink(missing_ok=True)
    if sign == "-wal":
        Path(str(db) + "-wal").write_bytes(b"\0" * 64)
    else:
        Path(str(db) + "-wal").unlink(missing_ok=True)
        (db.parent / sign / "task_x_0_a1").mkdir(parents=True)
    r = _cli(db.parent, "status")
    assert r.returncode == 4, r.stdout + r.stderr
    assert r.stderr.startswith(f"ERROR: {db}: the ledger is empty (0 bytes) but "), r.stderr
    assert "move it aside to start a new one" in r.stderr
    assert db.read_bytes() == b""


def test_an_empty_ledger_in_a_fresh_home_is_initialised(db: Path) -> None:
    """A 0-byte state.db with nothing around it (a first open that stopped before the
    schema was written): made into a ledger, as a missing one is."""
    db.parent.mkdir(parents=True)
    db.write_bytes(b"")
    r = _cli(db.parent, "status")
    assert (r.returncode, r.stdout.splitlines()[-1]) == (0, "no tasks in the ledger"), r.stderr
    assert count(db, "PRAGMA user_version") == SCHEMA_VERSION


def test_usage_pauses_are_kept_and_read_strictly(db: Path) -> None:
    """The usage-limit pause outlives the loop (issue 11), in the meta table: no new
    schema version, so a ledger of an older fleetrun opens as it is."""
    with Ledger(db) as led:
        assert led.usage_pauses() == {}
        led.set_usage_pauses({"local": (1_900_000_000.0, 2), "mini": (1_900_000_100.5, 1)})
    with Ledger(db) as led:
        assert led.usage_pauses() == {"local": (1_900_000_000.0, 2), "mini": (1_900_000_100.5, 1)}
        assert led.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        for bad in ("not json", "[1, 2]", '{"local": [true, 1]}', '{"local": [1.0]}', '{"local": ["x", 1]}'):
            led.set_meta("usage_pause", bad)
            assert led.usage_pauses() == {}, bad
        led.set_meta("usage_pause", '{"local": [5.0, 1], "bad": [1, "x"]}')
        assert led.usage_pauses() == {"local": (5.0, 1)}
        led.set_usage_pauses({})
        assert led.get_meta("usage_pause") is None


def test_transitions_after_a_row(led: Ledger) -> None:
    """What a running loop reads to show the transitions another shell made."""
    (t,) = led.add_tasks([spec("a")])
    start = led.last_transition_id()
    assert start > 0 and led.transitions_after(start) == []
    led.transition(t.id, t.state, State.CANCELLED, "operator_cancel")
    (row,) = led.transitions_after(start)
    assert (row.task_id, row.to_state, row.cause) == (t.id, "CANCELLED", "operator_cancel")
    assert led.last_transition_id() == row.id
    assert led.transitions_after(0) == led.transitions()


def test_an_attempts_cost_may_be_unknown_in_a_ledger_made_before(db: Path) -> None:
    """A ledger whose attempts.cost_usd is NOT NULL (every ledger before an unknown cost
    existed) is rebuilt once, keyed on the constraint and not on the schema version
    (which another migration may bump); its rows, index and references stay."""
    from fleetrun import ledger as ledger_mod

    with Ledger(db) as led:
        (t,) = led.add_tasks([spec("a")])
        att = led.lease(t.id, State.READY, "local", "fresh")
    conn = raw(db)
    old_sql = conn.execute("SELECT sql FROM sqlite_master WHERE name='attempts'").fetchone()[0]
    assert "cost_usd    REAL DEFAULT 0" in old_sql
    # make it the old table
    conn.execute("PRAGMA foreign_keys=OFF")
    conn.execute("BEGIN")
    conn.execute(
        old_sql.replace("CREATE TABLE attempts", "CREATE TABLE attempts_old", 1).replace(
            "cost_usd    REAL DEFAULT 0", "cost_usd    REAL NOT NULL DEFAULT 0"
        )
    )
    conn.execute("INSERT INTO attempts_old SELECT * FROM attempts")
    conn.execute("DROP TABLE attempts")
    conn.execute("ALTER TABLE attempts_old RENAME TO attempts")
    conn.execute("CREATE INDEX attempts_state ON attempts(state)")
    conn.execute("COMMIT")
    conn.close()
    assert count(db, "SELECT \"notnull\" FROM pragma_table_info('attempts') WHERE name='cost_usd'") == 1
    for _ in range(2):  # the second open finds nothing to do
        with Ledger(db) as led:
            led.update_attempt(att.id, state="ended", cost_usd=None)
            assert led.attempt(att.id).cost_usd is None
            assert led.unknown_cost() == {t.id}
    assert count(db, "SELECT \"notnull\" FROM pragma_table_info('attempts') WHERE name='cost_usd'") == 0
    assert count(db, "SELECT COUNT(*) FROM sqlite_master WHERE type='index' AND name='attempts_state'") == 1
    assert count(db, "PRAGMA user_version") == ledger_mod.SCHEMA_VERSION


def test_add_tasks_keeps_a_done_task_of_an_earlier_queue(led: Ledger) -> None:
    """A task kept from a file's last run enters the new queue DONE, with the branch,
    host and handoff of the task that did the work (fleetrun.rerun)."""
    a, b = led.add_tasks([spec("a"), spec("b", "a")], source="f.toml", source_hash="h1")
    handoff = {"task_name": "a", "branch": "fleetrun/a", "summary": "did a", "host": "local", "fetch_hint": ""}
    led.update_task(a.id, branch="fleetrun/a", host="local", handoff=handoff)
    for src, dst in (
        (State.READY, State.ASSIGNED),
        (State.ASSIGNED, State.RUNNING),
        (State.RUNNING, State.VERIFYING),
        (State.VERIFYING, State.DONE),
    ):
        led.transition(a.id, src, dst, "verify_pass")
    old_a = led.get(a.id)
    assert old_a is not None
    new_a, new_b = led.add_tasks([spec("a"), spec("b", "a")], source="f.toml", source_hash="h2", kept={"a": old_a})
    assert (new_a.state, new_a.reason, new_a.branch, new_a.host, new_a.handoff) == (
        State.DONE,
        f"unchanged:{a.id}",
        "fleetrun/a",
        "local",
        handoff,
    )
    assert (new_a.cost_usd, new_a.attempts, new_b.state, new_b.deps) == (0, 0, State.PENDING, [new_a.id])
    assert [(t.from_state, t.to_state, t.cause) for t in led.transitions(new_a.id)] == [
        (None, "DONE", f"unchanged:{a.id}")
    ]
    # kept again from the copy: still named after the task that did the work
    (third,) = led.add_tasks([spec("a")], source="f.toml", kept={"a": new_a})
    assert third.reason == f"unchanged:{a.id}"
    assert [t.name for t, _ in led.tasks_of_source("f.toml")] == ["a", "b", "a", "b", "a"]


def test_a_listing_reads_no_spec_until_one_is_used(led: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    """``tasks(listed=True)`` (what ``status`` reads): the same tasks and ``to_json``,
    without a spec read or parsed; a spec used is read then."""
    led.add_tasks([spec("a"), spec("b", "a"), spec("c", "a", "b")])
    full = led.tasks()
    parsed: list[str] = []
    real = TaskSpec.from_json
    monkeypatch.setattr(TaskSpec, "from_json", classmethod(lambda cls, d: parsed.append(d["name"]) or real(d)))
    sql: list[str] = []
    led.conn.set_trace_callback(sql.append)
    listed = led.tasks(listed=True)
    led.conn.set_trace_callback(None)
    assert [t.to_json() for t in listed] == [t.to_json() for t in full]
    assert [t.deps for t in listed] == [t.deps for t in full]
    assert parsed == [] and not any("SELECT *" in s or " spec," in s for s in sql), sql
    assert listed[2].spec.depends_on == ["a", "b"] and parsed == ["c"]


# -- one transaction a pass (Ledger.batch) ------------------------------------------------


def test_a_batch_commits_its_writes_once_and_another_connection_sees_them_then(led: Ledger, db: Path) -> None:
    (t,) = led.add_tasks([spec("a")])
    before = led.commits
    with led.batch():
        led.transition(t.id, State.READY, State.ASSIGNED, "placed")
        led.add_note(t.id, "one")
        led.update_task(t.id, no_start=1)
        assert led.get(t.id).state is State.ASSIGNED  # this connection reads its own writes
        assert state_of(db, t.id) == "READY"  # another reads the last commit (WAL: not blocked)
    assert led.commits - before == 1
    assert state_of(db, t.id) == "ASSIGNED"
    assert count(db, "SELECT COUNT(*) FROM notes WHERE task_id=?", t.id) == 1


def test_a_failed_write_in_a_batch_rolls_back_alone(led: Ledger, db: Path) -> None:
    (t,) = led.add_tasks([spec("a")])
    with led.batch():
        led.add_note(t.id, "kept")
        with pytest.raises(StateConflict):
            led.transition(t.id, State.RUNNING, State.VERIFYING, "exited")
        with pytest.raises(RuntimeError), led.tx() as cur:
            cur.execute("INSERT INTO notes (task_id, time, text) VALUES (?, 0, 'dropped')", (t.id,))
            raise RuntimeError("a write that fails half way")
        led.transition(t.id, State.READY, State.ASSIGNED, "placed")
    conn = raw(db)
    try:
        notes = [r[0] for r in conn.execute("SELECT text FROM notes WHERE task_id=?", (t.id,))]
    finally:
        conn.close()
    assert notes == ["kept"]
    assert state_of(db, t.id) == "ASSIGNED"


def test_an_exception_ending_a_batch_still_commits_what_was_written(led: Ledger, db: Path) -> None:
    """As when each write was its own commit: a Ctrl-C mid-pass keeps what came before it."""
    (t,) = led.add_tasks([spec("a")])
    with pytest.raises(KeyboardInterrupt), led.batch():
        led.transition(t.id, State.READY, State.ASSIGNED, "placed")
        raise KeyboardInterrupt
    assert state_of(db, t.id) == "ASSIGNED"


def test_durable_commits_now_and_the_batch_goes_on(led: Ledger, db: Path) -> None:
    (t,) = led.add_tasks([spec("a")])
    before = led.commits
    with led.batch():
        led.durable()  # nothing pending: nothing committed
        assert led.commits == before
        led.transition(t.id, State.READY, State.ASSIGNED, "placed")
        led.durable()
        assert state_of(db, t.id) == "ASSIGNED"
        other = raw(db)  # the lock is free: another process writes between the two
        try:
            other.execute("INSERT INTO notes (task_id, time, text) VALUES (?, 0, 'from a cancel')", (t.id,))
        finally:
            other.close()
        led.transition(t.id, State.ASSIGNED, State.RUNNING, "started")
        with pytest.raises(RuntimeError), led.tx():
            led.durable()  # inside a write: a programming error, not a half commit
    assert led.commits - before == 2
    assert state_of(db, t.id) == "RUNNING"


def test_after_commit_tells_in_order_once_committed(led: Ledger, db: Path) -> None:
    (t,) = led.add_tasks([spec("a")])
    told: list[tuple[str, str]] = []
    led.after_commit(lambda: told.append(("outside", state_of(db, t.id))))  # nothing pending: at once
    assert told == [("outside", "READY")]
    with led.batch():
        led.after_commit(lambda: told.append(("nothing written yet", state_of(db, t.id))))
        led.transition(t.id, State.READY, State.ASSIGNED, "placed")
        led.after_commit(lambda: told.append(("assigned", state_of(db, t.id))))
        led.transition(t.id, State.ASSIGNED, State.RUNNING, "started")
        led.after_commit(lambda: told.append(("running", state_of(db, t.id))))
        assert len(told) == 2
        led.durable()
        assert told[2:] == [("assigned", "RUNNING"), ("running", "RUNNING")]
        led.transition(t.id, State.RUNNING, State.VERIFYING, "exited")
        led.after_commit(lambda: told.append(("verifying", state_of(db, t.id))))
        assert len(told) == 4
    assert told == [
        ("outside", "READY"),
        ("nothing written yet", "READY"),
        ("assigned", "RUNNING"),
        ("running", "RUNNING"),
        ("verifying", "VERIFYING"),
    ]


def test_a_failed_commit_tells_nothing(led: Ledger, db: Path) -> None:
    """A commit SQLite refuses (a full disk; here a deferred foreign key) writes nothing
    of the batch, and no hook hears of it."""
    (t,) = led.add_tasks([spec("a")])
    told: list[str] = []
    with pytest.raises(sqlite3.IntegrityError), led.batch():
        led.transition(t.id, State.READY, State.ASSIGNED, "placed")
        led.after_commit(lambda: told.append("assigned"))
        led.conn.execute("PRAGMA defer_foreign_keys=ON")  # checked at the commit, which fails
        led.add_note("task_that_is_not", "x")
    assert told == []
    assert state_of(db, t.id) == "READY"
    assert not led.conn.in_transaction
    led.transition(t.id, State.READY, State.ASSIGNED, "placed")  # the ledger writes on
    assert state_of(db, t.id) == "ASSIGNED"


def test_a_batch_holding_the_lock_past_its_bound_commits_at_its_next_write(
    led: Ledger, db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another shell's `cancel` waits at most about BATCH_HOLD_S behind a pass."""
    (t,) = led.add_tasks([spec("a")])
    monkeypatch.setattr(led, "BATCH_HOLD_S", 0.0)
    with led.batch():
        led.transition(t.id, State.READY, State.ASSIGNED, "placed")
        assert state_of(db, t.id) == "ASSIGNED"  # committed: held longer than 0 s
        monkeypatch.setattr(led, "BATCH_HOLD_S", 1e9)
        led.transition(t.id, State.ASSIGNED, State.RUNNING, "started")
        assert state_of(db, t.id) == "ASSIGNED"
        led.bound()  # the loop between its stages: not held long enough
        assert state_of(db, t.id) == "ASSIGNED"
    assert state_of(db, t.id) == "RUNNING"

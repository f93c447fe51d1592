"""The mailbox's tables (store.py) and who is live (liveness.py), with real processes
standing in for role sessions: bound ``sleep`` processes, and a long-running fake
``claude`` whose cwd is the role's folder."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest

from fleetrun.plugins.mailbox import store
from fleetrun.plugins.mailbox.liveness import (
    answers_to,
    is_session_cmd,
    lineage,
    live_roles,
    scan,
    start_time,
)

FAKE = Path(__file__).parent / "fakes" / "claude"


@pytest.fixture
def conn(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    c = store.connect(str(tmp_path / "state.db"))
    yield c
    c.close()


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        p.kill()
        p.wait()


def session(
    fake_claude: Any, cwd: Path, procs: list[subprocess.Popen[bytes]], env: Optional[dict[str, str]] = None
) -> subprocess.Popen[bytes]:
    """A Claude Code session that stays up (the fake, run as ``python3 .../claude``)."""
    fake_claude.script(default=[{"actions": [["sleep", 60]]}])
    p = subprocess.Popen(
        [str(FAKE), "-p", "wait"],
        cwd=str(cwd),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )
    procs.append(p)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # until it is the fake (not the interpreter starting)
        if any(s.pid == p.pid for s in scan().sessions()):
            return p
        time.sleep(0.05)
    raise AssertionError("the fake claude session did not show up")


def sleeper(procs: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    p = subprocess.Popen(["sleep", "60"])
    procs.append(p)
    return p


# -- roles ----------------------------------------------------------------------------


def test_bind_is_canonical_case_insensitive_and_refuses_reserved_names(
    conn: sqlite3.Connection, tmp_path: Path
) -> None:
    real = tmp_path / "repo"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    role = store.bind(conn, "Relay", str(tmp_path / "link"))
    assert role.dir == os.path.realpath(real)
    store.bind(conn, "relay", str(real))  # the same role, bound again
    assert [(r.name, r.dir) for r in store.roles(conn)] == [("relay", os.path.realpath(real))]
    for bad in ("supervisor", "Operator", "a b", "x\x1b[2J", "", "-x"):
        with pytest.raises(store.StoreError):
            store.bind(conn, bad, str(real))
    with pytest.raises(store.StoreError, match="control characters"):
        store.bind(conn, "ok", str(real) + "\x07")
    with pytest.raises(store.StoreError, match="not a folder"):
        store.bind(conn, "ok", str(tmp_path / "missing"))
    assert store.unbind(conn, "RELAY") and not store.unbind(conn, "relay")


def test_messages_claim_once_and_end_once(conn: sqlite3.Connection) -> None:
    assert not store.any_pending(conn)  # no table yet: no mail
    with store.tx(conn) as cur:
        mid = store.deliver(cur, "relay", "task_1", "task_1_a1", "do it\x1b[2J\x00 now", "role = relay", 100.0)
    with pytest.raises(sqlite3.IntegrityError), store.tx(conn) as cur:  # one message per attempt
        store.deliver(cur, "relay", "task_1", "task_1_a1", "again", "", 101.0)
    msg = store.message_of_attempt(conn, "task_1_a1")
    assert msg is not None and msg.body == "do it[2J now" and msg.state == "pending"
    assert [m.id for m in store.pending(conn, "RELAY")] == [mid]
    assert store.claim(conn, mid, 123, 105.0)
    assert not store.claim(conn, mid, 456, 106.0)  # the second session does not get it
    assert store.finish(conn, mid, "done", 110.0, summary="wrote it")
    assert not store.finish(conn, mid, "failed", 111.0, reason="late")
    msg = store.message_of_task(conn, "task_1")
    assert msg is not None and (msg.state, msg.summary, msg.claimed_by_pid) == ("done", "wrote it", 123)


def test_edits_keep_the_last_fifty(conn: sqlite3.Connection) -> None:
    for i in range(60):
        store.note_edit(conn, "relay", 1, f"/w/f{i}")
    kept = store.edits(conn)["relay"]
    assert len(kept) == store.EDITS_KEPT and kept[-1] == "/w/f59"


# -- liveness -------------------------------------------------------------------------


def test_what_is_a_claude_code_session() -> None:
    assert is_session_cmd("claude", [])
    assert is_session_cmd("node", ["node", "/usr/lib/node_modules/.bin/claude", "-p"])
    assert is_session_cmd("python3", ["python3", "/x/tests/fakes/claude"])
    assert not is_session_cmd("python3", ["python3", "-m", "claude"])
    assert not is_session_cmd("bash", ["bash", "-c", "claude"])


def test_a_bound_process_keeps_its_role_live_until_it_exits(
    conn: sqlite3.Connection, tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    p = sleeper(procs)
    store.bind(conn, "relay", str(tmp_path), p.pid, start_time(p.pid))
    store.bind(conn, "stale", str(tmp_path), p.pid, (start_time(p.pid) or 0) - 100)  # a reused pid
    assert live_roles(scan(), store.roles(conn)) == {"relay": f"pid {p.pid} runs"}
    p.kill()
    p.wait()
    assert live_roles(scan(), store.roles(conn)) == {}


def test_a_session_answers_to_the_one_role_over_its_cwd(
    conn: sqlite3.Connection, tmp_path: Path, fake_claude: Any, procs: list[subprocess.Popen[bytes]]
) -> None:
    root = tmp_path / "repo"
    nested = root / "src" / "relay"
    nested.mkdir(parents=True)
    store.bind(conn, "relay", str(nested))
    s = session(fake_claude, nested, procs)
    assert set(live_roles(scan(), store.roles(conn))) == {"relay"}
    # under a root role and a nested one, neither pid-bound: it answers to neither
    store.bind(conn, "repo", str(root))
    table = scan()
    role, why = answers_to(table, s.pid, str(nested.resolve()), store.roles(conn))
    assert role is None and "2 roles" in why
    assert live_roles(table, store.roles(conn)) == {}
    # bound to its pid, it answers to that one; the other is the one left over the folder
    store.bind(conn, "relay", str(nested), s.pid, start_time(s.pid))
    role, why = answers_to(scan(), s.pid, str(nested.resolve()), store.roles(conn))
    assert role is not None and role.name == "relay" and "bound to this session" in why
    # once the session exits nothing keeps either alive
    s.kill()
    s.wait()
    assert live_roles(scan(), store.roles(conn)) == {}


def test_a_session_fleetrun_started_answers_to_no_role_and_keeps_none_live(
    conn: sqlite3.Connection, tmp_path: Path, fake_claude: Any, procs: list[subprocess.Popen[bytes]]
) -> None:
    """What fleetrun puts in the environment of the sessions it spawns (procutil.task_env)
    marks them: under a role's folder, or even bound to one by pid, they answer to none."""
    store.bind(conn, "relay", str(tmp_path))
    s = session(fake_claude, tmp_path, procs, env={"FLEETRUN_TASK_ID": "task_x_0"})
    table = scan()
    role, why = answers_to(table, s.pid, str(tmp_path.resolve()), store.roles(conn))
    assert role is None and why == "fleetrun started it for task task_x_0, and its own sessions answer to no role"
    assert live_roles(table, store.roles(conn)) == {}
    store.bind(conn, "relay", str(tmp_path), s.pid, start_time(s.pid))
    role, _ = answers_to(lineage(s.pid), s.pid, str(tmp_path.resolve()), store.roles(conn))
    assert role is None

"""The loop's liveness file: `fleetrun status` says whether a supervisor runs, is
gone, or is hung (alive but not beating)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from fleetrun import liveness
from fleetrun.shepherd import proc_token

RUNNING = re.compile(r"supervisor: running \(pid (\d+), last beat (\d+)s ago\)")


def first_line(fleeter) -> str:
    return fleeter.run("status").outlines[0]


def wait_for(cond, timeout: float = 120.0, what: str = "it"):
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() >= deadline:
            raise AssertionError(f"waited {timeout:g}s for {what}")
        time.sleep(0.05)


@pytest.fixture
def loop(fleeter):
    """A `fleetrun work` loop with nothing to do (it waits for work until stopped)."""
    proc = fleeter.popen("work")
    yield proc
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
    proc.communicate(timeout=10)


def write_liveness(fleeter, **data) -> None:
    fleeter.home.mkdir(parents=True, exist_ok=True)
    (fleeter.home / liveness.LIVENESS).write_text(json.dumps(data))


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_running_while_the_loop_runs_then_not_running_after_it_exits(fleeter, loop):
    line = wait_for(lambda: RUNNING.fullmatch(first_line(fleeter)), what="the loop's first beat")
    assert int(line.group(1)) == loop.pid
    # fresh: the loop beats about every second, far inside STUCK_AFTER_S (a loaded
    # machine can hold a pass or this `status` back by seconds; that is not stuck)
    assert int(line.group(2)) < liveness.STUCK_AFTER_S / 2
    path = fleeter.home / liveness.LIVENESS
    data = json.loads(path.read_text())
    assert data["pid"] == loop.pid and data["token"] == proc_token(loop.pid)
    assert data["started"] <= data["beat"] <= time.time()
    assert (path.stat().st_mode & 0o777) == 0o600
    # it keeps beating
    first = data["beat"]
    wait_for(lambda: json.loads(path.read_text())["beat"] > first, what="a second beat")
    loop.send_signal(signal.SIGINT)
    loop.communicate(timeout=20)
    assert first_line(fleeter) == "supervisor: not running"
    assert not path.exists()  # a clean exit removes it


def test_not_running_after_a_sigkill(fleeter, loop):
    wait_for(lambda: RUNNING.fullmatch(first_line(fleeter)), what="the loop's first beat")
    loop.kill()
    loop.communicate(timeout=10)
    assert (fleeter.home / liveness.LIVENESS).exists()  # nobody removed it ...
    assert first_line(fleeter) == "supervisor: not running"  # ... but its pid is dead


def test_no_file_is_not_running(fleeter):
    assert first_line(fleeter) == "supervisor: not running"


def test_stale_file_with_a_dead_pid_is_not_running(fleeter):
    pid = dead_pid()
    write_liveness(fleeter, pid=pid, token="linux:12345", started=time.time() - 60, beat=time.time())
    assert first_line(fleeter) == "supervisor: not running"


def test_reused_pid_is_not_running(fleeter):
    """The pid is alive, but it is another process (another start time)."""
    write_liveness(fleeter, pid=os.getpid(), token="linux:1", started=time.time(), beat=time.time())
    assert first_line(fleeter) == "supervisor: not running"


def test_unreadable_file_is_not_running(fleeter):
    fleeter.home.mkdir(parents=True, exist_ok=True)
    (fleeter.home / liveness.LIVENESS).write_text('{"pid": 12')
    assert first_line(fleeter) == "supervisor: not running"


def test_live_pid_with_an_old_beat_is_stuck(fleeter):
    me = os.getpid()
    write_liveness(fleeter, pid=me, token=proc_token(me), started=time.time() - 3600, beat=time.time() - 600)
    assert first_line(fleeter) == f"supervisor: stuck (pid {me}, last beat 10 min ago)"


def test_live_pid_with_a_fresh_beat_is_running(fleeter):
    me = os.getpid()
    write_liveness(fleeter, pid=me, token=proc_token(me), started=time.time() - 3600, beat=time.time() - 2)
    assert first_line(fleeter) == f"supervisor: running (pid {me}, last beat 2s ago)"


def test_a_hung_loop_shows_as_stuck(fleeter, loop, monkeypatch):
    """SIGSTOP the real loop: it stays alive and stops beating."""
    wait_for(lambda: RUNNING.fullmatch(first_line(fleeter)), what="the loop's first beat")
    path = fleeter.home / liveness.LIVENESS
    stuck_after = liveness.STUCK_AFTER_S
    monkeypatch.setattr(liveness, "STUCK_AFTER_S", 1.0)
    os.kill(loop.pid, signal.SIGSTOP)
    try:
        last = json.loads(path.read_text())["beat"]  # stopped: no beat after this one
        line = wait_for(
            lambda: (ln := first_line(fleeter)).startswith("supervisor: stuck") and ln, what="status to say stuck"
        )
        assert line == f"supervisor: stuck (pid {loop.pid}, last beat 0 min ago)"
    finally:
        os.kill(loop.pid, signal.SIGCONT)
    # it beats again (the beat itself: a `running` under a 1 s threshold would need a
    # status to land within a second of a beat, which a loaded machine does not promise)
    wait_for(lambda: json.loads(path.read_text())["beat"] > last, what="the loop to beat again")
    monkeypatch.setattr(liveness, "STUCK_AFTER_S", stuck_after)
    assert RUNNING.fullmatch(first_line(fleeter))


LOCK_HOLDER = """
import sys, pathlib
from fleetrun.liveness import WorkLock
lock = WorkLock(pathlib.Path(sys.argv[1]))
assert lock.acquire() is None
print("held", flush=True)
sys.stdin.read()
"""


def test_one_work_lock_per_home_names_its_holder(tmp_path) -> None:
    """A second loop is refused at once, with the pid the first one wrote; the lock is
    free again when the holder lets go (or dies)."""
    home = tmp_path / "home"
    holder = subprocess.Popen(
        [sys.executable, "-c", LOCK_HOLDER, str(home)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline() == "held\n"
        assert (home / liveness.LOCK).stat().st_mode & 0o777 == 0o600
        t0 = time.monotonic()
        got = liveness.WorkLock(home).acquire()
        assert time.monotonic() - t0 < 1.0  # not waited for
        assert got is not None and got["pid"] == holder.pid
    finally:
        holder.kill()
        holder.wait()
        holder.stdin.close()
        holder.stdout.close()
    mine = liveness.WorkLock(home)
    assert mine.acquire() is None
    assert json.loads((home / liveness.LOCK).read_text())["pid"] == os.getpid()
    mine.release()
    mine.release()

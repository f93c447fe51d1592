"""Disk full: FLEETRUN_HOME on a real 2 MB tmpfs, filled while `fleetrun work` runs.
The loop says it cannot write and starts nothing new, the ledger stays consistent,
and when space returns it carries on and finishes. (Needs root and mount: skipped
with the reason otherwise.)"""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from .test_adoption import wait_for
from .test_crash_points import _no_strays, check_invariants, kill_leftovers  # noqa: F401


@pytest.fixture
def small_home(fleeter, tmp_path, monkeypatch):
    """A 2 MB tmpfs as FLEETRUN_HOME."""
    yield from mount_home(fleeter, tmp_path, monkeypatch, "2m")


def mount_home(fleeter, tmp_path, monkeypatch, size: str):
    """A tmpfs of ``size`` (``mount``'s spelling: ``2m``) as FLEETRUN_HOME, for a fixture."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    try:
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(mnt)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError) as e:
        pytest.skip(f"cannot mount a tmpfs for the disk-full test: {e}")
    if r.returncode != 0:
        pytest.skip(
            "cannot mount a tmpfs for the disk-full test (needs root and mount permission): "
            + (r.stderr.strip() or f"exit {r.returncode}")
        )
    home = mnt / "h"
    monkeypatch.setenv("FLEETRUN_HOME", str(home))
    fleeter.home = home
    try:
        yield mnt
    finally:
        kill_leftovers(tmp_path)  # nothing may hold the mount
        subprocess.run(["umount", str(mnt)], capture_output=True)
        if os.path.ismount(mnt):
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def fill(path: Path) -> int:
    """Write ``path`` until the file system is full; :return: bytes written."""
    n = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for size in (65536, 4096, 512):
            chunk = b"\0" * size
            while True:
                try:
                    n += os.write(fd, chunk)
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
                    break
    finally:
        os.close(fd)
    return n


def integrity(db: Path) -> str:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        return conn.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        conn.close()


def write_queue(fleeter, fake_claude, t1_actions: list, t1_verify: str = "test -f t1.txt") -> None:
    fleeter.make_repo()
    fleeter.write_policy("[local]\nmax_tasks = 1\n")
    fleeter.write_tasks(
        "\n".join(
            f"""
        [[task]]
        name = "t{i}"
        cwd = "repo"
        prompt = "Write t{i}.txt."
        git_ref = "main"
          [[task.verify]]
          run = {json.dumps(t1_verify if i == 1 else f"test -f t{i}.txt")}
    """
            for i in (1, 2, 3)
        )
    )
    fake_claude.script(
        t1=[{"actions": t1_actions}],
        t2=[{"actions": [["write", "t2.txt", "x"]]}],
        t3=[{"actions": [["write", "t3.txt", "x"]]}],
    )
    assert fleeter.run("queue", "tasks.toml").ret == 0


def finish(proc, fleeter, fake_claude, tmp_path, filler: Path) -> str:
    """Free the space; the loop must carry on and finish everything, each agent once."""
    filler.unlink()
    out, err = proc.communicate(timeout=90)
    text = out.decode(errors="replace") + err.decode(errors="replace")
    assert proc.returncode == 0, text
    assert integrity(fleeter.home / "state.db") == "ok"
    expected = {"t1": "DONE", "t2": "DONE", "t3": "DONE"}
    bad = check_invariants(fleeter, fake_claude, expected, {"t1": 1, "t2": 1, "t3": 1}, root=tmp_path)
    assert not bad, "\n".join(bad) + "\n" + text
    return text


@pytest.fixture
def loop_proc(fleeter):
    procs = []

    def start():
        p = fleeter.popen("work", "--until-idle")
        procs.append(p)
        return p

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.communicate(timeout=10)


BUG_RECOVERY = (
    "BUG: the loop declares 'writable again' after any pass that happened not to write, so "
    "on a disk that stays full it flip-flops: reruns the verifiers every other second and "
    "prints the message again and again (and, with nothing running at that moment, "
    "`--until-idle` exits as idle before placing anything)"
)


@pytest.mark.slow
def test_disk_full_while_verifying_stops_new_starts_and_recovers(fleeter, small_home, fake_claude, tmp_path, loop_proc):
    """A verdict cannot be recorded: the loop says so, starts nothing, keeps the ledger
    whole, and when space returns runs the verifier again and goes on."""
    started = tmp_path / "verifier-started"
    write_queue(
        fleeter, fake_claude, [["write", "t1.txt", "x"]], t1_verify=f"echo run >> {started}; sleep 2; test -f t1.txt"
    )
    proc = loop_proc()
    wait_for(started.exists, what="t1's verifier")
    filler = small_home / "filler"
    assert fill(filler) > 0
    time.sleep(8.0)  # the verdict comes while the disk is full, and it stays full a while
    assert proc.poll() is None, "the loop died on a full disk"
    assert fake_claude.calls("t2") == [] and fake_claude.calls("t3") == [], "started work on a full disk"
    assert integrity(fleeter.home / "state.db") == "ok"
    assert fleeter.states()["t1"] == "VERIFYING"
    text = finish(proc, fleeter, fake_claude, tmp_path, filler)
    assert text.count("fleetrun: cannot write to ") == 1, text
    assert "starting nothing new until it clears" in text, text
    assert text.count("writable again") == 1, text
    # run again once there is room (verifiers must be safe to repeat), not while it is full
    assert started.read_text().count("run") == 2
    assert len(fleeter.ledger().verdicts(fleeter.task("t1").id)) == 1


BUG_SHEPHERD_ENOSPC = (
    "BUG: the shepherd dies on ENOSPC (unguarded os.write to the log, write_json of status.json): "
    "its end is never recorded, the attempt counts as died and the task is resumed (work redone)"
)


@pytest.mark.slow
def test_disk_full_while_an_agent_runs_loses_nothing(fleeter, small_home, fake_claude, tmp_path, loop_proc):
    """The agent ends while its log and status cannot be written: its shepherd holds on
    and records the end when space returns; the attempt is verified, not redone."""
    write_queue(fleeter, fake_claude, [["write", "t1.txt", "x"], ["sleep", 2.0], ["print", "finishing"]])
    proc = loop_proc()
    wait_for(lambda: fake_claude.calls("t1"), what="t1's agent")
    time.sleep(0.5)
    filler = small_home / "filler"
    assert fill(filler) > 0
    time.sleep(4.0)  # the agent ends while the disk is full
    assert proc.poll() is None, "the loop died on a full disk"
    assert fake_claude.calls("t2") == [] and fake_claude.calls("t3") == [], "started work on a full disk"
    assert integrity(fleeter.home / "state.db") == "ok"
    finish(proc, fleeter, fake_claude, tmp_path, filler)


BUG_OPEN_FULL = (
    "BUG: on a home that is already full, opening the ledger (PRAGMA journal_mode=WAL must "
    "create -wal/-shm) raises sqlite3 'disk I/O error': INTERNAL ERROR with a traceback, "
    "not a clear message"
)


@pytest.mark.slow
def test_disk_full_before_the_loop_starts(fleeter, small_home, fake_claude, tmp_path, loop_proc):
    """`fleetrun work` on a home that is already full starts nothing and either waits
    for room (then finishes) or stops at once with a clear message (no traceback)."""
    write_queue(fleeter, fake_claude, [["write", "t1.txt", "x"]])
    filler = small_home / "filler"
    assert fill(filler) > 0
    proc = loop_proc()
    try:
        proc.wait(timeout=3.0)
    except subprocess.TimeoutExpired:  # it waits for room
        assert fake_claude.calls() == [], "started work on a full disk"
        text = finish(proc, fleeter, fake_claude, tmp_path, filler)
        assert "fleetrun: cannot write to " in text, text
        return
    text = b"".join(proc.communicate()).decode(errors="replace")
    assert "INTERNAL ERROR" not in text and "Traceback" not in text, text
    assert str(fleeter.home) in text and ("full" in text or "read-only" in text), text
    assert fake_claude.calls() == []
    filler.unlink()
    r = fleeter.runsub("work", "--until-idle", timeout=90)
    assert r.ret == 0, r.stdout + r.stderr
    assert fleeter.states() == {"t1": "DONE", "t2": "DONE", "t3": "DONE"}

"""`fleetrun host VERB --json`, the peer side, run as a subprocess the way sshd runs it."""

from __future__ import annotations

import base64
import json
import os
import platform
import sys
import time
from pathlib import Path

import pytest


@pytest.fixture
def peer(tmp_path, monkeypatch):
    """A peer's home, and a way to run `fleetrun host` there."""
    home = tmp_path / "peerhome"
    home.mkdir(mode=0o700)

    class Peer:
        def __init__(self) -> None:
            self.home = home
            self.env = {"FLEETRUN_HOME": str(home), "FLEETRUN_DISABLE_PLUGIN_AUTOLOAD": "1"}

        def host(self, *args: str, stdin=None) -> tuple[int, dict]:
            import subprocess

            proc = subprocess.run(
                [sys.executable, "-m", "fleetrun", "host", *args, "--json"],
                input=json.dumps(stdin).encode() if stdin is not None else b"",
                capture_output=True,
                env=dict(os.environ, **self.env),
                timeout=60,
            )
            lines = proc.stdout.decode().strip().splitlines()
            assert len(lines) == 1, proc.stdout.decode() + proc.stderr.decode()
            return proc.returncode, json.loads(lines[0])

        def start(self, attempt: str, task: str, argv: list[str], cwd: str = "/"):
            spec = {"argv": argv, "cwd": cwd, "env": {}, "timeout_s": 60, "stall_s": 60}
            return self.host("start", stdin={"attempt_id": attempt, "task_id": task, "spec": spec, "prompt": "p"})

        def wait_ended(self, attempt: str, timeout: float = 120) -> dict:
            deadline = time.time() + timeout
            while time.time() < deadline:
                code, r = self.host("status", "--attempt", attempt)
                assert code == 0
                if r["status"].get("state") in ("ended", "died"):
                    return r["status"]
                time.sleep(0.1)
            raise AssertionError(f"{attempt} did not end")

    p = Peer()
    yield p
    from sshd import kill_leftovers

    kill_leftovers(home)


def test_probe_reports_version_features_headroom_and_tools(peer, tmp_path):
    (peer.home / "policy.toml").write_text("[local]\nmax_tasks = 3\nmem_per_task_mb = 700\n")
    (peer.home / "config.toml").write_text('[relay]\ntags = ["gpu"]\n')
    code, r = peer.host("probe")
    assert code == 0, r
    from fleetrun import __version__

    assert r["fleetrun"] == __version__ and r["features"] == ["supervised-tasks-1"]
    assert r["os"] == platform.system().lower() and r["arch"] == platform.machine()
    assert r["max_tasks"] == 3 and r["mem_per_task_mb"] == 700 and r["running"] == 0 and r["drain"] is False
    assert r["tags"] == ["gpu"] and "git" in r["tools"] and r["free_mem_mb"] > 0
    assert (peer.home / "probe-tools.json").exists()  # tool versions are cached
    # the test hook: fed headroom instead of measured
    fake = tmp_path / "headroom.json"
    fake.write_text(json.dumps({"free_mem_mb": 1234, "load_per_core": 0.5, "free_disk_mb": 99}))
    peer.env["FLEETRUN_FAKE_HEADROOM"] = str(fake)
    code, r = peer.host("probe")
    assert (r["free_mem_mb"], r["load_per_core"], r["free_disk_mb"]) == (1234, 0.5, 99)


def test_start_status_log_by_offset(peer):
    code, r = peer.start("task_t1_1_a1", "task_t1_1", ["sh", "-c", "echo hello; echo world"])
    assert code == 0, r
    assert r["pid"] and r["token"] and r["dir"] == str(peer.home / "attempts" / "task_t1_1_a1")
    st = peer.wait_ended("task_t1_1_a1")
    assert st["exit_code"] == 0 and st["reason"] == "exited"
    code, r = peer.host("status", "--attempt", "task_t1_1_a1", "--log-offset", "0")
    assert base64.b64decode(r["log"]) == b"hello\nworld\n" and r["log_size"] == 12 and r["log_offset"] == 0
    code, r = peer.host("log", "--attempt", "task_t1_1_a1", "--offset", "6")
    assert base64.b64decode(r["log"]) == b"world\n" and r["log_offset"] == 6
    code, r = peer.host("log", "--attempt", "task_t1_1_a1", "--offset", "12")
    assert r["log"] == ""
    # an attempt this peer never heard of has no shepherd: died, never "running"
    code, r = peer.host("status", "--attempt", "task_nope_1_a1")
    assert code == 0 and r["status"]["state"] == "died"


def test_start_refuses_past_max_tasks_and_a_second_attempt_of_a_task(peer):
    (peer.home / "policy.toml").write_text("[local]\nmax_tasks = 1\n")
    code, r = peer.start("task_a_1_a1", "task_a_1", ["sleep", "30"])
    assert code == 0, r
    # the same attempt again (a reply that got lost): the same shepherd, not a second one
    code, again = peer.start("task_a_1_a1", "task_a_1", ["sleep", "30"])
    assert code == 0 and again["pid"] == r["pid"] and again["again"]
    code, r2 = peer.start("task_a_1_a2", "task_a_1", ["sleep", "30"])
    assert code == 75 and r2 == {
        "refused": "is still running attempt task_a_1_a1 of this task (a task never runs twice at once)"
    }
    code, r3 = peer.start("task_b_1_a1", "task_b_1", ["sleep", "30"])
    assert code == 75 and r3 == {"refused": "is running 1 of 1 tasks (its own [local] max_tasks)"}
    code, probe = peer.host("probe")
    assert probe["running"] == 1
    code, s = peer.host("stop", "--attempt", "task_a_1_a1")
    assert code == 0 and s["signalled"]
    assert peer.wait_ended("task_a_1_a1")["reason"] in ("stopped", "cancelled")
    code, r4 = peer.start("task_b_1_a1", "task_b_1", ["true"])
    assert code == 0, r4
    (peer.home / "policy.toml").write_text("[local]\ndrain = true\n")
    code, r5 = peer.start("task_c_1_a1", "task_c_1", ["true"])
    assert code == 75 and r5 == {"refused": "is draining"}


def test_prepare_refuses_a_cwd_missing_here(peer, tmp_path):
    task = {
        "id": "task_t1_1",
        "name": "t",
        "state": "ASSIGNED",
        "source": "",
        "queue_id": "q",
        "created": 0,
        "updated": 0,
        "spec": {"name": "t", "prompt": "p", "cwd": str(tmp_path / "not-here"), "git_ref": "main"},
    }
    att = {
        "id": "task_t1_1_a1",
        "task_id": "task_t1_1",
        "number": 1,
        "kind": "fresh",
        "host": "mini",
        "state": "leased",
        "created": 0,
    }
    code, r = peer.host("prepare", stdin={"task": task, "attempt": att})
    assert code == 1 and r == {"error": "working directory does not exist on this host"}


def test_run_verifier_detached_with_its_own_timeout(peer, tmp_path):
    ws = {"path": str(tmp_path), "is_worktree": False}
    task = {
        "id": "task_t1_1",
        "name": "t",
        "state": "VERIFYING",
        "source": "",
        "queue_id": "q",
        "created": 0,
        "updated": 0,
        "spec": {"name": "t", "prompt": "p", "cwd": str(tmp_path)},
    }
    att = {
        "id": "task_t1_1_a1",
        "task_id": "task_t1_1",
        "number": 1,
        "kind": "fresh",
        "host": "mini",
        "state": "ended",
        "created": 0,
    }

    def verify(idx: int, text: str, timeout_s: float = 60) -> dict:
        v = {"kind": "run", "text": text, "timeout_s": timeout_s}
        code, r = peer.host(
            "verify-start", stdin={"task": task, "attempt": att, "verifier": v, "idx": idx, "workspace": ws}
        )
        assert code == 0 and r["state"] == "running", r
        deadline = time.time() + 120
        while time.time() < deadline:
            code, r = peer.host("verify-status", "--attempt", "task_t1_1_a1", "--idx", str(idx))
            assert code == 0, r
            if r["state"] == "ended":
                return r
            time.sleep(0.1)
        raise AssertionError("verifier did not end")

    r = verify(0, 'echo "in $PWD as $FLEETRUN_TASK_NAME"; exit 3')
    assert (r["passed"], r["reason"]) == (False, "exit code 3")
    assert r["output"] == f"in {tmp_path} as t\n"
    r = verify(1, "sleep 30", timeout_s=0.5)
    assert (r["passed"], r["reason"]) == (False, "timed out after 0.5s")
    assert r["duration_s"] < 25  # ended by its timeout, not by `sleep 30` (a loaded machine may add seconds)
    r = verify(2, "true")
    assert r["passed"] and r["reason"] == "exit code 0"
    code, r = peer.host("verify-status", "--attempt", "task_t1_1_a1", "--idx", "7")
    assert code == 1 and r["unknown"]


def test_errors_are_json_with_a_nonzero_exit(peer):
    code, r = peer.host("frobnicate")
    assert code == 4 and "usage: fleetrun host" in r["error"]
    code, r = peer.host("start")  # no payload: a bad request, not an internal error
    assert code == 1 and "bad task id" in r["error"]
    code, r = peer.host("verify-status", "--attempt", "../x", "--idx", "0")
    assert code == 1 and "bad attempt id" in r["error"]


def test_hosted_registry_forgets_ended_attempts(peer):
    code, r = peer.start("task_x_1_a1", "task_x_1", ["true"])
    assert code == 0
    peer.wait_ended("task_x_1_a1")
    code, probe = peer.host("probe")
    assert probe["running"] == 0
    assert json.loads(Path(peer.home / "hosted.json").read_text()) == {}


def test_an_agents_log_on_a_peer_is_cut_to_the_peers_cap_and_its_status_says_so(peer):
    """Issue 21 item 5 on a peer: the agent's log is written on the peer's disk, so the
    peer's own ``[output] max_bytes`` caps it (a supervisor's spec may only lower it); the
    status the supervisor reads says what was cut."""
    (peer.home / "config.toml").write_text("[output]\nmax_bytes = 1_000_000\n")
    flood = "echo FIRST; head -c 30000000 /dev/zero >&2; echo; echo LAST"
    code, r = peer.host(
        "start",
        stdin={
            "attempt_id": "task_t1_1_a1",
            "task_id": "task_t1_1",
            "prompt": "p",
            "spec": {"argv": ["sh", "-c", flood], "cwd": "/", "env": {}, "timeout_s": 60, "max_output": 50_000_000},
        },
    )
    assert code == 0, r
    st = peer.wait_ended("task_t1_1_a1")
    assert st["exit_code"] == 0 and st["log_cut"] == 30_000_012 - 1_000_000 and st["log_cap"] == 1_000_000, st
    log = (peer.home / "attempts" / "task_t1_1_a1" / "log").read_bytes()
    assert len(log) <= 1_000_100 and log.startswith(b"FIRST\n") and log.endswith(b"LAST\n")

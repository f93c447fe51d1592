"""A peer's ``run`` verifier runs under a detached runner: ``host verify-start`` runs it
by path from its source (``python -I -S``, as the shepherd), standard library only and
nothing of the package; its verdicts stay what they were (``test_relay_hostcli.py`` has
the exit code, the output and the timeout)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fleetrun.plugins.relay.peer import verify_runner

#: What the runner does without: it runs by path (the package is not its to import) and
#: starts the command with ``posix_spawn``.
EXPENSIVE = {"fleetrun", "subprocess"}
TASK = {
    "id": "task_t1_1",
    "name": "t",
    "state": "VERIFYING",
    "source": "",
    "queue_id": "q",
    "created": 0,
    "updated": 0,
}
ATT = {
    "id": "task_t1_1_a1",
    "task_id": "task_t1_1",
    "number": 1,
    "kind": "fresh",
    "host": "mini",
    "state": "ended",
    "created": 0,
}


@pytest.fixture
def host(tmp_path):
    home = tmp_path / "peerhome"
    home.mkdir(mode=0o700)
    env = dict(
        os.environ,
        FLEETRUN_HOME=str(home),
        FLEETRUN_DISABLE_PLUGIN_AUTOLOAD="1",
        **{verify_runner.DEBUG_ENV: "1"},
    )

    def run(*args: str, stdin=None) -> tuple[int, dict]:
        proc = subprocess.run(
            [sys.executable, "-m", "fleetrun", "host", *args, "--json"],
            env=env,
            timeout=60,
            input=json.dumps(stdin).encode() if stdin is not None else b"",
            capture_output=True,
        )
        return proc.returncode, json.loads(proc.stdout.decode().strip().splitlines()[-1])

    run.home = home  # type: ignore[attr-defined]
    yield run
    from sshd import kill_leftovers

    kill_leftovers(home)


def start(host, tmp_path: Path, idx: int, text: str, cwd: Path, timeout_s: float = 60) -> None:
    task = dict(TASK, spec={"name": "t", "prompt": "p", "cwd": str(tmp_path)})
    code, r = host(
        "verify-start",
        stdin={
            "task": task,
            "attempt": ATT,
            "idx": idx,
            "verifier": {"kind": "run", "text": text, "timeout_s": timeout_s},
            "workspace": {"path": str(cwd), "is_worktree": False},
        },
    )
    assert code == 0 and r["state"] == "running", r


def ended(host, idx: int) -> dict:
    deadline = time.time() + 30
    while time.time() < deadline:
        code, r = host("verify-status", "--attempt", ATT["id"], "--idx", str(idx))
        assert code == 0, r
        if r["state"] == "ended":
            return r
        time.sleep(0.05)
    raise AssertionError("the verifier did not end")


def test_a_verifier_runner_starts_by_path_with_the_standard_library_only(host, tmp_path):
    start(host, tmp_path, 0, 'echo "é in $PWD"; exit 0', tmp_path)
    r = ended(host, 0)
    assert (r["passed"], r["reason"], r["output"]) == (True, "exit code 0", f"é in {tmp_path}\n")
    vdir = host.home / "attempts" / ATT["id"] / "verify-1"
    ran, *modules = (vdir / verify_runner.MODULES).read_text().splitlines()
    assert ran == str(Path(verify_runner.__file__)), ran
    assert "json" in modules and "signal" in modules  # the check below means something
    assert not {m.split(".")[0] for m in modules} & EXPENSIVE, sorted(set(modules) & EXPENSIVE)
    # what verify-status reads is JSON as json writes it
    assert json.loads((vdir / "result.json").read_text())["passed"] is True


def test_a_verifier_stopped_or_in_a_missing_folder_has_its_reason(host, tmp_path):
    start(host, tmp_path, 0, "sleep 30", tmp_path)
    deadline = time.time() + 20
    while not (host.home / "attempts" / ATT["id"] / "verify-1" / "out").exists():
        assert time.time() < deadline
        time.sleep(0.05)
    time.sleep(0.2)
    code, r = host("verify-stop", "--attempt", ATT["id"], "--idx", "0")
    assert code == 0 and r["signalled"], r
    r = ended(host, 0)
    assert (r["passed"], r["reason"]) == (False, "stopped by the supervisor") and r["duration_s"] < 10
    start(host, tmp_path, 1, "true", tmp_path / "gone")
    r = ended(host, 1)
    assert not r["passed"] and r["reason"].startswith("cannot start: "), r


def test_a_peer_verifiers_flood_is_cut_and_what_it_detached_ends_with_it(host, tmp_path):
    """Issue 21 items 5 and 6 on a peer: the runner's command writes 50 MB and detaches a
    ``setsid sleep 3000``; the output is cut to the peer's ``[output] max_bytes`` (head and
    tail kept, the verdict says so) and the sleep is ended with the verifier."""
    (host.home / "config.toml").write_text("[output]\nmax_bytes = 1_000_000\n")
    pidfile = tmp_path / "pids"
    detach = (
        f"setsid sh -c 'echo $$ > {pidfile}; exec sleep 3000' >/dev/null 2>&1 </dev/null & "
        f"while [ ! -s {pidfile} ]; do sleep 0.05; done"
    )
    start(host, tmp_path, 0, f"echo FIRST; head -c 50000000 /dev/zero; echo; echo LAST; {detach}; exit 1", tmp_path)
    try:
        r = ended(host, 0)
        pid = int(pidfile.read_text())
        assert (r["passed"], r["reason"]) == (False, "exit code 1; output cut: 49 MB over the 1.0 MB cap"), r
        assert r["output"].endswith("LAST\n")
        out = (host.home / "attempts" / ATT["id"] / "verify-1" / "out").read_bytes()
        assert len(out) <= 1_000_100 and out.startswith(b"FIRST\n") and out.endswith(b"LAST\n")
        assert b"\n[fleetrun: 49,000,012 bytes cut: output over its 1.0 MB cap]\n" in out
        from fleetrun.osutil import proc_token

        assert proc_token(pid) is None, "the verifier's detached sleep outlived it"
    finally:
        if pidfile.exists():
            try:
                os.kill(int(pidfile.read_text()), 9)
            except ProcessLookupError:
                pass


def test_a_peer_verifier_deaf_to_sigterm_that_times_out_leaves_nothing_it_detached(host, tmp_path):
    """The runner ends a timed-out verifier's group (SIGTERM, 2 s, SIGKILL); a command
    deaf to SIGTERM would have its reaping wrapper SIGKILLed with it, so the wrapper, on
    its own SIGTERM, ends everything below it at once (SIGTERM, 0.5 s, SIGKILL)."""
    pidfile = tmp_path / "pid"
    cmd = (
        f"trap '' TERM; setsid sh -c 'echo $$ > {pidfile}; exec sleep 3000' >/dev/null 2>&1 </dev/null & "
        f"while [ ! -s {pidfile} ]; do sleep 0.05; done; sleep 3000"
    )
    start(host, tmp_path, 0, cmd, tmp_path, timeout_s=2)
    try:
        r = ended(host, 0)
        pid = int(pidfile.read_text())
        assert (r["passed"], r["reason"]) == (False, "timed out after 2s"), r
        from fleetrun.osutil import proc_token

        assert proc_token(pid) is None, "what the timed-out verifier detached outlived it"
    finally:
        if pidfile.exists():
            try:
                os.kill(int(pidfile.read_text()), 9)
            except ProcessLookupError:
                pass

"""The `run` verifier: exit code is the verdict; output kept; timeouts and failures to start."""

from __future__ import annotations

import os
import time

import pytest
from test_procutil import start  # noqa: F401 (the fixture: the wrapper by path, or forked)

from fleetrun.osutil import proc_token
from fleetrun.plugins.verify_run import RunHandle
from fleetrun.procutil import KEEP_BYTES, tail_text
from fleetrun.taskspec import VerifySpec


def wait(handle: RunHandle, limit: float = 60.0):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        v = handle.poll()
        if v is not None:
            return v
        time.sleep(0.02)
    raise AssertionError("verifier did not finish")


def test_pass_and_fail(tmp_path):
    ok = wait(RunHandle(VerifySpec("run", "echo hi"), str(tmp_path), tmp_path / "o1", dict(os.environ)))
    assert ok.passed and ok.reason == "exit code 0" and ok.output == "hi\n"
    bad = wait(RunHandle(VerifySpec("run", "echo oops >&2; exit 3"), str(tmp_path), tmp_path / "o2", dict(os.environ)))
    assert not bad.passed and bad.reason == "exit code 3" and "oops" in bad.output


def test_large_output_never_deadlocks_and_keeps_the_tail(tmp_path):
    # 5 MB of multi-byte characters, then a last line
    cmd = "python3 -c \"import sys; sys.stdout.write('é' * 2500000 + '\\nTHE END\\n')\""
    v = wait(RunHandle(VerifySpec("run", cmd), str(tmp_path), tmp_path / "o", dict(os.environ)))
    assert v.passed
    assert v.output.endswith("THE END\n")
    assert len(v.output.encode()) <= KEEP_BYTES
    assert "\ufffd" not in v.output  # cut on a character boundary


def test_tail_text_cuts_on_a_character_boundary(tmp_path):
    p = tmp_path / "f"
    p.write_bytes(("x" + "€" * 40).encode())  # 3-byte characters
    for limit in range(1, 30):
        text = tail_text(p, limit)
        assert "\ufffd" not in text
        assert len(text.encode()) <= limit


def test_timeout_is_a_fail_and_kills_the_group(tmp_path):
    v = wait(
        RunHandle(
            VerifySpec("run", "sleep 30 & sleep 30", timeout_s=0.5), str(tmp_path), tmp_path / "o", dict(os.environ)
        )
    )
    assert not v.passed and v.reason == "timed out after 0.5s"


def test_timeout_is_the_works_fail_not_an_error(tmp_path):
    v = wait(RunHandle(VerifySpec("run", "sleep 30", timeout_s=0.5), str(tmp_path), tmp_path / "o", dict(os.environ)))
    assert v.error is None  # most often the code under test hangs: docs/verifiers.md


def test_cannot_start_is_a_permanent_error(tmp_path):
    v = wait(RunHandle(VerifySpec("run", "true"), str(tmp_path / "missing"), tmp_path / "o", dict(os.environ)))
    assert not v.passed and v.reason.startswith("cannot start:") and v.error == "permanent"


@pytest.mark.parametrize(
    "command, reason, error",
    [
        ("pytset -q", "command not found: pytset", "permanent"),
        ("FOO=1 pytset -q", "command not found: pytset", "permanent"),
        ("/nonexistent/bin/pytest -q", "command not found: /nonexistent/bin/pytest", "permanent"),
        ("{outside}/not-exec", "command not executable: {outside}/not-exec", "permanent"),
        # the worktree's own script: the agent may have deleted it or made it non-executable
        ("./run-tests.sh", "exit code 127", None),
        ("{work}/not-exec", "exit code 126", None),
        ("PATH=/nowhere pytset", "exit code 127", None),
        ("true && pytset", "exit code 127", None),  # the first word was found
        ("exit 127", "exit code 127", None),
    ],
)
def test_127_and_126_are_an_error_only_for_what_the_agent_cannot_touch(tmp_path, command, reason, error):
    work, outside = tmp_path / "work", tmp_path / "outside"
    work.mkdir()
    outside.mkdir()
    for d in (work, outside):
        (d / "not-exec").write_text("echo hi\n")
    command = command.format(work=work, outside=outside)
    v = wait(RunHandle(VerifySpec("run", command), str(work), tmp_path / "o", dict(os.environ), root=str(work)))
    assert (v.passed, v.reason.format(), v.error) == (False, reason.format(work=work, outside=outside), error)


def test_pidfd_is_readable_when_done(tmp_path):
    import select

    h = RunHandle(VerifySpec("run", "sleep 0.2"), str(tmp_path), tmp_path / "o", dict(os.environ))
    if h.fileno() < 0:
        return  # no pidfd on this kernel: the loop falls back to its 1 s tick
    r, _, _ = select.select([h], [], [], 10)
    assert r == [h]
    assert wait(h).passed


def test_a_verifier_deaf_to_sigterm_that_times_out_leaves_nothing_it_detached(tmp_path, start):  # noqa: F811 (the fixture)
    """Issue 21 item 6: the command ignores SIGTERM, so its group (its reaping wrapper
    included) is SIGKILLed at the timeout; what it detached (``setsid``, deaf to SIGTERM
    too) is found by the marker in its environment and ended all the same. Both ways the
    wrapper starts (a forked one is the starter's child, ended by its identity)."""
    pidfile = tmp_path / "pid"
    cmd = (
        f"trap '' TERM; setsid sh -c 'echo $$ > {pidfile}; exec sleep 3000' >/dev/null 2>&1 </dev/null & "
        f"while [ ! -s {pidfile} ]; do sleep 0.05; done; sleep 3000"
    )
    v = wait(
        RunHandle(VerifySpec("run", cmd, timeout_s=2), str(tmp_path), tmp_path / "o", dict(os.environ), start=start)
    )
    pid = int(pidfile.read_text())
    try:
        assert not v.passed and v.reason == "timed out after 2s"
        assert proc_token(pid) is None, "what the timed-out verifier detached outlived it"
    finally:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass

"""SSHHost against a real sshd: the socket it connects with, timeouts, the log mirror,
refusals, a peer that goes away (unreachable, never died), run verifiers there."""

from __future__ import annotations

import socket
import time

import pytest

from fleetrun.hosts import StartRefused
from fleetrun.plugins.relay.host import RemoteRunHandle, SSHHost
from fleetrun.plugins.relay.peers import load_peers
from fleetrun.plugins.relay.protocol import parse_reply
from fleetrun.plugins.relay.transport import PeerUnreachable, run_command
from fleetrun.reports import Verdict

pytest_plugins = ["sshd"]


@pytest.fixture
def mini(fleeter, peer_lab):
    m = peer_lab.machine("mini")
    r = fleeter.run("relay", "add", "mini", m.address, "--accept-new", "--command", m.command_line())
    assert r.ret == 0, r.stdout + r.stderr
    host = SSHHost(load_peers(fleeter.home)["mini"], fleeter.home)
    m.host = host
    yield m
    host.close()


def spec(argv, cwd="/"):
    return {"argv": argv, "cwd": cwd, "env": {"FLEETRUN_TASK_ID": "task_t1_1"}, "timeout_s": 60, "stall_s": 60,
            "notify": "/nonexistent/loop.sock"}


def wait_ended(host, attempt, timeout=120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = host.status(attempt, None, None)
        if st.get("state") in ("ended", "died"):
            return st
        time.sleep(0.1)
    raise AssertionError(f"{attempt} did not end: {st}")


def test_the_socket_has_nodelay_user_timeout_and_keepalive(mini):
    t = mini.host.transport()
    s = t.sock
    assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    assert s.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
    if hasattr(socket, "TCP_USER_TIMEOUT"):
        assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 6000
    assert t.packetizer._Packetizer__keepalive_interval == 5
    # one transport for every verb
    mini.host.probe()
    mini.host.probe()
    assert mini.host.transport() is t


def test_every_exec_has_a_timeout(mini):
    t = mini.host.transport()
    with pytest.raises(PeerUnreachable) as e:  # a command that would outlive the test: only the timeout ends it
        run_command(t, "sleep 100000", timeout=0.5)
    assert e.value.delivered
    code, out, err = run_command(t, "echo ok; echo err >&2; exit 3", timeout=10)
    assert code == 3 and out.endswith(b"ok\n") and err.endswith(b"err\n")


def test_reply_parsing_ignores_what_a_login_shell_prints():
    assert parse_reply(b'{"a": 1}\n') == {"a": 1}
    assert parse_reply(b'hello from .bashrc\n{"a": 1}\n') == {"a": 1}
    assert parse_reply(b'{"not": "this"}\nnoise\n{"a": 2}') == {"a": 2}
    assert parse_reply(b"no json at all") is None
    assert parse_reply(b"[1, 2]") is None


def test_status_mirrors_the_log_and_start_refusals_carry_the_reason(mini, tmp_path):
    (mini.home / "policy.toml").write_text("[local]\nmax_tasks = 1\n")
    gate = tmp_path / "gate"  # t1 runs until the second start was refused, however slow the machine
    script = f"for i in 1 2 3; do echo line$i; sleep 0.3; done; while [ ! -e {gate} ]; do sleep 0.05; done"
    info = mini.host.start("task_t1_1_a1", spec(["sh", "-c", script]), "hi")
    assert info["pid"] and info["dir"] == str(mini.host.attempt_dir("task_t1_1_a1"))
    assert info["remote_dir"] == str(mini.home / "attempts" / "task_t1_1_a1")
    with pytest.raises(StartRefused) as e:
        mini.host.start("task_t2_1_a1", dict(spec(["true"]), env={"FLEETRUN_TASK_ID": "task_t2_1"}))
    assert str(e.value) == "mini is running 1 of 1 tasks (its own [local] max_tasks)"
    gate.touch()
    st = wait_ended(mini.host, "task_t1_1_a1")
    assert st["state"] == "ended" and st["exit_code"] == 0
    local_log = mini.host.log_path("task_t1_1_a1")
    assert local_log.read_text() == "line1\nline2\nline3\n"
    assert local_log.read_text() == (mini.home / "attempts" / "task_t1_1_a1" / "log").read_text()
    assert mini.host.attempt_dir("task_t1_1_a1").joinpath("prompt").read_text() == "hi"


def test_an_unreachable_peer_is_unreachable_never_died(mini, tmp_path):
    # the attempt runs until the test lets it end (a fixed `sleep` could end before the
    # first status on a loaded machine, and "running" would then be "ended")
    gate = tmp_path / "gate"
    info = mini.host.start("task_t1_1_a1", spec(["sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done"]))
    assert mini.host.status("task_t1_1_a1", info["pid"], info["token"])["state"] == "running"
    mini.sshd.stop()
    mini.host.drop()
    st = mini.host.status("task_t1_1_a1", info["pid"], info["token"])
    assert st["state"] == "unreachable" and "mini" in st["error"]
    time.sleep(2.1)  # past the reconnect pause
    mini.sshd.start()
    gate.touch()
    st = wait_ended(mini.host, "task_t1_1_a1")
    assert st["state"] == "ended" and st["exit_code"] == 0
    # a stop that cannot reach the peer is remembered, for the heartbeat to deliver
    mini.sshd.stop()
    mini.host.drop()
    assert mini.host.stop("task_t1_1_a1", None, None) is False
    import json

    state = json.loads((mini.host.home / "peers-state.json").read_text())
    assert "task_t1_1_a1" in state["mini"]["pending_stops"]


def test_run_verifier_on_the_peer(mini, tmp_path):
    from fleetrun.ledger import Attempt, Task
    from fleetrun.reports import Workspace
    from fleetrun.states import State
    from fleetrun.taskspec import TaskSpec, VerifySpec

    v = VerifySpec(kind="run", text="echo checked in $PWD; exit 1")
    task = Task(id="task_t1_1", name="t", state=State.VERIFYING, spec=TaskSpec(name="t", prompt="p", cwd=str(tmp_path),
                                                                        verify=[v]),
                source="", queue_id="q", created=0, updated=0, host="mini")
    att = Attempt(id="task_t1_1_a1", task_id="task_t1_1", number=1, kind="fresh", host="mini", state="ended", created=0)
    handle = RemoteRunHandle(mini.host, task, att, v, 0, Workspace(path=str(tmp_path)))
    deadline = time.monotonic() + 120
    verdict = None
    while verdict is None and time.monotonic() < deadline:
        time.sleep(max(0.0, handle.next_deadline() - time.monotonic()))
        verdict = handle.poll()
    assert isinstance(verdict, Verdict)
    assert (verdict.passed, verdict.reason, verdict.host) == (False, "exit code 1", "mini")
    assert verdict.output == f"checked in {tmp_path}\n"

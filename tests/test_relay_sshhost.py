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
    return {
        "argv": argv,
        "cwd": cwd,
        "env": {"FLEETRUN_TASK_ID": "task_t1_1"},
        "timeout_s": 60,
        "stall_s": 60,
        "notify": "/nonexistent/loop.sock",
    }


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
    task = Task(
        id="task_t1_1",
        name="t",
        state=State.VERIFYING,
        spec=TaskSpec(name="t", prompt="p", cwd=str(tmp_path), verify=[v]),
        source="",
        queue_id="q",
        created=0,
        updated=0,
        host="mini",
    )
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


def _counting(host):
    """Record each verb ``host`` sends (the requests still go to the real peer)."""
    sent = []
    call = host.call

    def counted(verb, *args, **kw):
        sent.append(verb)
        return call(verb, *args, **kw)

    host.call = counted
    return sent


def test_poll_asks_the_peer_once_for_all_its_attempts(mini, tmp_path):
    """Issue 23: one ``host status-many`` request answers a poll of several attempts
    (status and log chunk each), not one ``host status`` per attempt."""
    from fleetrun.hostapi import AttemptRef

    gate = tmp_path / "gate"
    refs = []
    for n in (1, 2, 3):
        aid = f"task_t{n}_1_a1"
        script = f"echo out{n}; while [ ! -e {gate} ]; do sleep 0.05; done; exit {n}"
        info = mini.host.start(aid, dict(spec(["sh", "-c", script]), env={"FLEETRUN_TASK_ID": f"task_t{n}_1"}))
        refs.append(AttemptRef(aid, info.pid, info.token))
    sent = _counting(mini.host)
    got = mini.host.poll(refs)
    assert sent == ["status-many"] and {st["state"] for st in got.values()} <= {"starting", "running"}, (sent, got)
    gate.touch()
    deadline = time.monotonic() + 120
    while not all(st["state"] == "ended" for st in got.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
        got = mini.host.poll(refs)
    assert [got[r.attempt_id]["exit_code"] for r in refs] == [1, 2, 3]
    assert set(sent) == {"status-many"}, sent
    assert [mini.host.log_path(r.attempt_id).read_text() for r in refs] == ["out1\n", "out2\n", "out3\n"]


def test_a_peer_without_status_many_is_polled_one_attempt_at_a_time(fleeter, peer_lab, tmp_path):
    """A peer older than ``host status-many`` answers it with a usage error: the poll
    asks it ``host status`` per attempt, then and from then on."""
    from fleetrun.hostapi import AttemptRef

    m = peer_lab.machine("old")
    older = tmp_path / "older-peer"
    older.write_text(
        "#!/bin/sh\n# a fleetrun peer from before `host status-many`\n"
        'for a in "$@"; do if [ "$a" = status-many ]; then\n'
        '  echo \'{"error": "usage: fleetrun host {probe,status,log} --json ..."}\'; exit 4; fi; done\n'
        'exec "$@"\n'
    )
    older.chmod(0o755)
    r = fleeter.run("relay", "add", "old", m.address, "--accept-new", "--command", f"{older} {m.command_line()}")
    assert r.ret == 0, r.stdout + r.stderr
    host = SSHHost(load_peers(fleeter.home)["old"], fleeter.home)
    try:
        refs = []
        for n in (1, 2):
            info = host.start(
                f"task_t{n}_1_a1", dict(spec(["sh", "-c", f"exit {n}"]), env={"FLEETRUN_TASK_ID": f"task_t{n}_1"})
            )
            refs.append(AttemptRef(f"task_t{n}_1_a1", info.pid, info.token))
        sent = _counting(host)
        deadline = time.monotonic() + 120
        got = host.poll(refs)
        while not all(st["state"] == "ended" for st in got.values()) and time.monotonic() < deadline:
            time.sleep(0.1)
            got = host.poll(refs)
        assert [got[r.attempt_id]["exit_code"] for r in refs] == [1, 2]
        # asked status-many until it answered (a loaded peer may not, once), then status per
        # attempt from then on
        last = max(i for i, verb in enumerate(sent) if verb == "status-many")
        assert sent[last + 1 :] and set(sent[last + 1 :]) == {"status"} and host._status_many is False, sent
    finally:
        host.close()


def test_a_status_many_reply_speaks_only_of_the_attempts_asked_about():
    from fleetrun.plugins.relay.protocol import parse_status_many_reply
    from fleetrun.untrusted import Malformed

    ok = {"status": {"state": "running"}}
    got = parse_status_many_reply({"statuses": {"task_a_1_a1": ok}}, ["task_a_1_a1", "task_b_1_a1"])
    assert list(got) == ["task_a_1_a1"] and got["task_a_1_a1"].status == {"state": "running"}
    for bad in (
        [],
        {"statuses": []},
        {"statuses": {"task_c_1_a1": ok}},
        {"statuses": {"task_a_1_a1": {"status": {"state": "exploded"}}}},
    ):
        with pytest.raises(Malformed):
            parse_status_many_reply(bad, ["task_a_1_a1"])


def test_an_older_worker_is_never_sent_status_many(fleeter, peer_lab, tmp_path):
    """An older peer's worker drops a request whose verb it does not know, unanswered
    (the poll would wait out its timeout, and every attempt there would look
    unreachable): a worker whose hello does not say ``"many": 1`` is not sent
    ``status-many``; its one-shot form gets the older peer's usage error, and the
    attempts are asked one at a time."""
    from fleetrun.hostapi import AttemptRef

    m = peer_lab.machine("old")
    older = tmp_path / "older-peer"
    older.write_text(
        "#!/bin/sh\n# a fleetrun peer from before `host status-many`\n"
        'for a in "$@"; do if [ "$a" = status-many ]; then\n'
        '  echo \'{"error": "usage: fleetrun host {probe,status,log} --json ..."}\'; exit 4; fi; done\n'
        'for a in "$@"; do if [ "$a" = serve ]; then\n'
        # its worker: no "many" in its hello, and a status-many request dropped
        '  sed -u \'/"status-many"/d\' | "$@" | sed -u \'s/, *"many": *1//\'; exit; fi; done\n'
        'exec "$@"\n'
    )
    older.chmod(0o755)
    r = fleeter.run("relay", "add", "old", m.address, "--accept-new", "--command", f"{older} {m.command_line()}")
    assert r.ret == 0, r.stdout + r.stderr
    host = SSHHost(load_peers(fleeter.home)["old"], fleeter.home, worker=True)
    try:
        host.probe()  # through the worker: it is up, and said no "many"
        assert host.live_worker() is not None and not host.live_worker().many
        gate = tmp_path / "gate"
        refs = []
        for n in (1, 2):
            script = f"while [ ! -e {gate} ]; do sleep 0.05; done; exit {n}"
            info = host.start(
                f"task_t{n}_1_a1", dict(spec(["sh", "-c", script]), env={"FLEETRUN_TASK_ID": f"task_t{n}_1"})
            )
            refs.append(AttemptRef(f"task_t{n}_1_a1", info.pid, info.token))
        host.live_worker().watching.clear()  # as after a restart: not watched, so asked
        got = host.poll(refs)
        assert {st["state"] for st in got.values()} <= {"starting", "running"}, got
        gate.touch()
        deadline = time.monotonic() + 120
        while not all(st["state"] == "ended" for st in got.values()) and time.monotonic() < deadline:
            assert "unreachable" not in {st["state"] for st in got.values()}, got
            time.sleep(0.1)
            got = host.poll(refs)
        assert [got[r.attempt_id]["exit_code"] for r in refs] == [1, 2]
    finally:
        host.close()

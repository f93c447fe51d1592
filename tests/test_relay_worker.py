"""The worker's messages both ways, read strictly (fuzzed: a value or ``Malformed``,
never anything else), and a hostile worker behind a real sshd: the peer is unreachable
with the reason, never an exception out of ``SSHHost``."""

from __future__ import annotations

import json
import shlex
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetrun.plugins.relay.host import SSHHost
from fleetrun.plugins.relay.peers import load_peers
from fleetrun.plugins.relay.protocol import (
    WorkerMessage,
    beat_secs,
    parse_worker_message,
    parse_worker_request,
    worker_line,
)
from fleetrun.plugins.relay.transport import PeerUnreachable
from fleetrun.untrusted import Malformed

pytest_plugins = ["sshd"]

AID = "task_q_1_a1"
GOOD = [
    {"event": "hello", "protocol": 1, "fleetrun": "0.1.0", "pid": 9},
    {"id": 1, "code": 0, "reply": {"status": {"state": "running"}}},
    {"event": "log", "attempt": AID, "log": "aGVsbG8K", "log_offset": 0, "log_size": 6},
    {"event": "ended", "attempt": AID, "status": {"state": "ended", "exit_code": 0}, "log_size": 6},
    {"event": "verified", "attempt": AID, "idx": 0, "result": {"state": "ended", "passed": True}},
    {"event": "probe", "probe": {"fleetrun": "0.1.0", "running": 1, "free_mem_mb": 900}},
]
HOSTILE = [
    (b"not json", "not JSON"),
    (b"[1, 2]", "expected an object"),
    (b'{"id": "1", "code": 0, "reply": {}}', "worker reply.id"),
    (b'{"id": 1, "code": 0, "reply": "yes"}', "worker reply.reply"),
    (b'{"event": "shell", "cmd": "rm -rf /"}', "worker message.event"),
    (b'{"event": "ended", "attempt": "../../etc", "status": {"state": "ended"}, "log_size": 0}', "attempt"),
    (b'{"event": "ended", "attempt": "task_q_1_a1", "status": {"state": "running"}, "log_size": 0}', "not ended"),
    (b'{"event": "log", "attempt": "task_q_1_a1", "log": "%%%", "log_offset": 0, "log_size": 3}', "not base64"),
    (
        b'{"event": "verified", "attempt": "task_q_1_a1", "idx": 0, "result": {"state": "ended", "passed": "yes"}}',
        "passed",
    ),
    (b'{"event": "probe", "probe": {"fleetrun": "0.1.0", "running": "lots"}}', "probe reply.running"),
    (b'{"event": "probe", "probe": "0.1.0"}', "probe reply"),
    (b"[" * 100000 + b"]" * 100000, "not JSON"),
]


def test_good_messages_parse_and_hostile_ones_say_what_is_wrong():
    kinds = [parse_worker_message(worker_line(m).strip()).kind for m in GOOD]
    assert kinds == ["hello", "reply", "log", "ended", "verified", "probe"]
    assert parse_worker_message(worker_line(GOOD[-1])).probe["running"] == 1  # a pushed heartbeat: a probe reply
    m = parse_worker_message(worker_line(GOOD[2]))
    assert isinstance(m, WorkerMessage) and m.chunk is not None and m.chunk.data == b"hello\n"
    for line, why in HOSTILE:
        with pytest.raises(Malformed) as e:
            parse_worker_message(line)
        assert why in str(e.value), (line[:80], str(e.value))


def test_a_request_is_read_as_strictly_on_the_peer():
    r = parse_worker_request(b'{"id": 3, "verb": "status", "args": ["--attempt", "task_q_1_a1"]}')
    assert (r.id, r.verb, r.args, r.payload) == (3, "status", ["--attempt", "task_q_1_a1"], None)
    assert json.loads(parse_worker_request(b'{"id": 4, "verb": "start", "payload": {"a": 1}}').payload or b"") == {
        "a": 1
    }
    for bad in (
        b'{"id": 0, "verb": "status"}',
        b'{"id": 1, "verb": "bundle"}',
        b'{"id": 1, "verb": "sh"}',
        b'{"id": 1, "verb": "status", "args": "--attempt x"}',
        b'{"id": 1, "verb": "start", "payload": [1]}',
        b'{"id": 1, "verb": "status", "args": [1]}',
        b"{",
    ):
        with pytest.raises(Malformed):
            parse_worker_request(bad)
    # a probe's beat_secs (how often its worker pushes one) is the supervisor's: read strictly
    good = parse_worker_request(b'{"id": 5, "verb": "probe", "payload": {"beat_secs": 2.5}}')
    assert beat_secs(good.payload) == 2.5 and beat_secs(None) is None
    for bad in (
        b'{"beat_secs": 0}',
        b'{"beat_secs": true}',
        b'{"beat_secs": "5"}',
        b'{"beat_secs": 1e9}',
        b'{"beat_secs": NaN}',
        b"[5]",
        b"{",
    ):
        assert beat_secs(bad) is None, bad


json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(),
        st.text(max_size=20),
        st.sampled_from([AID, "ended", "hello", "log", "verified", "aGVsbG8=", "../x"]),
    ),
    lambda kids: st.one_of(st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=10), kids, max_size=5)),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(base=st.sampled_from(GOOD), key=st.text(max_size=10), value=json_values, drop=st.booleans())
def test_damaged_messages_only_ever_raise_malformed(base, key, value, drop):
    d = dict(base)
    if drop and d:
        d.pop(sorted(d)[len(key) % len(d)])
    else:
        d[key if key else "event"] = value
    for parse in (parse_worker_message, parse_worker_request):
        try:
            parse(json.dumps(d).encode())
        except Malformed:
            pass


# -- a hostile worker behind a real sshd -------------------------------------------

HOSTILE_WORKER = """
import json, sys
print(json.dumps({"event": "hello", "protocol": 1, "pid": 1}), flush=True)
for line in sys.stdin:
    print('{"id": "not a number", "code": 0, "reply": {"status": {"state": "died"}}}', flush=True)
"""


def fake_worker(fleeter, peer_lab, source: str) -> SSHHost:
    """Peer ``mini`` paired, its worker (``host serve``) the Python program ``source``
    and every other verb the real one: a host that talks to it through a worker."""
    m = peer_lab.machine("mini")
    fake = m.home.parent / "fake_worker.py"
    fake.write_text(source)
    script = m.home.parent / "wrapper"
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$2" = serve ]; then exec {shlex.quote(sys.executable)} {shlex.quote(str(fake))}; fi\n'
        f'exec {m.command_line()} "$@"\n'
    )
    script.chmod(0o755)
    r = fleeter.run("relay", "add", "mini", m.address, "--accept-new", "--command", str(script))
    assert r.ret == 0, r.stdout + r.stderr
    return SSHHost(load_peers(fleeter.home)["mini"], fleeter.home, worker=True)


@pytest.fixture
def hostile(fleeter, peer_lab):
    host = fake_worker(fleeter, peer_lab, HOSTILE_WORKER)
    yield host
    host.close()


def test_a_garbled_worker_makes_the_peer_unreachable_with_the_reason(hostile):
    st = hostile.status(AID, None, None)
    assert st["state"] == "unreachable"  # never "died": the attempt may run on there
    assert "a garbled message from the worker: worker reply.id" in st["error"], st
    with pytest.raises(PeerUnreachable, match="garbled message from the worker"):
        hostile.probe()


def test_waking_a_busy_loop_never_blocks_the_reader(tmp_path):
    """The loop's wake-up socket is full while the loop is busy (20 peers' ends, the loop
    inside one peer's request): a wake from a worker's reader is dropped, never waited
    on, or that reader could not read the reply the loop waits for (a deadlock)."""
    import socket
    import threading

    from fleetrun.liveness import sock_path
    from fleetrun.plugins.relay.worker import Worker

    loop_sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    loop_sock.bind(sock_path(tmp_path))  # bound, and never read: a loop busy elsewhere
    w = Worker(None, [], tmp_path, "mini", lambda *a: None)
    woke = threading.Thread(target=lambda: [w.wake() for _ in range(5000)], daemon=True)
    woke.start()
    woke.join(30)
    try:
        assert not woke.is_alive(), "a wake blocked on the loop's full socket"
        assert loop_sock.recv(16) == b"peer"  # the first ones were queued: the loop wakes
    finally:
        loop_sock.close()


#: a worker that offers to collect at an attempt's end, answers a ``status`` request with
#: a running status, then pushes ends with a collect's answer nobody asked for: of the
#: attempt asked about (placed there, its start never asked for a collect) and of one
#: never placed there
UNASKED_COLLECT_WORKER = """
import json, sys
print(json.dumps({"event": "hello", "protocol": 1, "pid": 1, "collects": 1}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    print(json.dumps({"id": req["id"], "code": 0, "reply": {"status": {"state": "running"}}}), flush=True)
    for aid in ("task_zz_1_a1", "AID"):
        print(json.dumps({"event": "ended", "attempt": aid, "status": {"state": "ended", "exit_code": 0},
                          "log_size": 0, "collect": {"code": 0, "reply": {"commit": "0" * 40}}}), flush=True)
""".replace("AID", AID)


def test_a_collect_pushed_that_no_start_asked_for_is_a_violation_and_not_taken(fleeter, peer_lab):
    import time

    host = fake_worker(fleeter, peer_lab, UNASKED_COLLECT_WORKER)
    try:
        assert host.status(AID, None, None)["state"] == "running"  # AID is placed there now
        deadline = time.monotonic() + 120
        while sum(host.attempts.counts.values()) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        w = host.live_worker()
        assert w is not None and w.collects
        # its end is kept (a peer says when its attempts end); the collect nobody asked for is not
        assert AID in w.ended and w.collected == {}
        assert host.pushed_collect(AID) is None  # the loop would send a collect request of its own
        assert host.attempts.counts == {"ended": 2}, host.attempts.counts
        assert "never asked for" in str(host.attempts.last)
    finally:
        host.close()


#: a worker that says hello, then never reads what it is sent: the channel's window
#: fills, and a send to it waits for ever
DEAF_WORKER = """
import json, os, sys, time
print(json.dumps({"event": "hello", "protocol": 1, "pid": 1}), flush=True)
parent = os.getppid()
while os.getppid() == parent:  # until its session is gone (the test's end)
    time.sleep(0.1)
"""


def test_requests_to_a_worker_that_reads_nothing_never_hold_the_caller(fleeter, peer_lab):
    """The loop sends a pass's requests without waiting for them (the sender thread sends
    them, in order): a peer whose worker reads nothing (wedged, or hostile) holds no pass,
    however much is sent to it; before, the loop's thread waited in paramiko's send once
    the channel's window was full."""
    import threading

    host = fake_worker(fleeter, peer_lab, DEAF_WORKER)
    sent: list = []
    try:
        w = host.worker(host.transport())
        assert w is not None
        big = {"pad": "x" * (1 << 20)}  # 1 MB a request: the window (2 MB) is full after two
        caller = threading.Thread(
            target=lambda: sent.extend(w.submit("probe", [], big, wake=True) for _ in range(8)), daemon=True
        )
        caller.start()
        caller.join(120)  # bounds a hang only: the sends are the sender thread's
        assert not caller.is_alive(), "submitting to a worker that reads nothing held the caller"
        assert len(sent) == 8 and not any(p.done() for p in sent)
    finally:
        host.close()
    for p in sent:  # given up with the worker: each fails, none hangs
        with pytest.raises(PeerUnreachable):
            p.wait(120)

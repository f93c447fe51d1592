"""The mirror of a peer attempt's log (``attempts/<id>/peer.log``, :mod:`fleetrun.plugins.relay.logmirror`)
against a real sshd: apart from the ``log`` a local attempt's shepherd writes, and
bounded (issue 21, items 2 and 3): the head is kept, then a line says it was cut, and
the attempt still ends as it did there."""

from __future__ import annotations

import time

import pytest

from fleetrun.plugins.relay import logmirror
from fleetrun.plugins.relay.host import SSHHost
from fleetrun.plugins.relay.peers import load_peers

pytest_plugins = ["sshd"]

AID = "task_t1_1_a1"
CAP = 3000


@pytest.fixture(params=["one-shot", "worker"])
def mini(request, fleeter, peer_lab):
    m = peer_lab.machine("mini")
    r = fleeter.run("relay", "add", "mini", m.address, "--accept-new", "--command", m.command_line())
    assert r.ret == 0, r.stdout + r.stderr
    host = SSHHost(load_peers(fleeter.home)["mini"], fleeter.home, worker=request.param == "worker")
    m.host = host
    yield m
    host.close()


def wait_ended(host, attempt):
    deadline = time.monotonic() + 120
    st: dict = {}
    while time.monotonic() < deadline:
        st = host.status(attempt, None, None)
        if st.get("state") in ("ended", "died"):
            return st
        time.sleep(0.1)
    raise AssertionError(f"{attempt} did not end: {st}")


def test_a_peer_attempt_s_mirror_keeps_the_head_of_its_log_then_says_it_was_cut(mini, monkeypatch):
    monkeypatch.setattr(logmirror, "MAX_MIRROR_BYTES", CAP)
    script = "i=0; while [ $i -lt 400 ]; do echo line-$i-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx; i=$((i+1)); done"
    spec = {"argv": ["sh", "-c", script], "cwd": "/", "env": {"FLEETRUN_TASK_ID": "task_t1_1"}, "timeout_s": 60,
            "stall_s": 60}
    mini.host.start(AID, spec)
    st = wait_ended(mini.host, AID)
    assert st["state"] == "ended"
    there = (mini.home / "attempts" / AID / "log").read_bytes()
    assert len(there) > 2 * CAP
    mirror = mini.host.log_path(AID)
    assert mirror.name == "peer.log" and not (mirror.parent / "log").exists()
    data = mirror.read_bytes()
    assert data.startswith(there[:CAP]) and data[:CAP] == there[:CAP]
    assert data[CAP:] == logmirror.CUT_NOTE % CAP
    # asked again, it takes nothing more
    assert mini.host.status(AID, None, None)["state"] == "ended"
    assert mirror.read_bytes() == data

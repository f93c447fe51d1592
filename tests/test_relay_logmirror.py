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


def test_a_peer_attempt_s_mirror_keeps_the_head_of_its_log_then_says_it_was_cut(mini):
    mini.host.mirror_cap = CAP  # the relay sets it from [output] max_bytes
    script = "i=0; while [ $i -lt 400 ]; do echo line-$i-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx; i=$((i+1)); done"
    spec = {
        "argv": ["sh", "-c", script],
        "cwd": "/",
        "env": {"FLEETRUN_TASK_ID": "task_t1_1"},
        "timeout_s": 60,
        "stall_s": 60,
    }
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


def test_the_mirror_keeps_what_this_supervisors_output_max_bytes_allows(fleeter, fake_claude, peer_lab):
    """The mirror's cap is this supervisor's own ``[output] max_bytes`` (its disk): an
    honest peer cuts the agent's log to it, so the mirror holds that log whole; a log
    that grows past it there (here the test appends to it, as a peer that ignores the
    cap would) is mirrored head first, then the cut line: the agent's result past the
    cut is not believed unread (the session counts as died and is resumed), and the
    task still ends DONE."""
    fleeter.make_repo()
    mini = peer_lab.machine("mini")
    mini.write("config.toml", (fleeter.home / "config.toml").read_text())  # the peer's own cap: the default
    fleeter.write_config((fleeter.home / "config.toml").read_text() + "\n[output]\nmax_bytes = 8192\n")
    r = fleeter.run("relay", "add", "mini", mini.address, "--accept-new", "--command", mini.command_line())
    assert r.ret == 0, r.stdout + r.stderr
    assert fleeter.run("drain").ret == 0  # this machine takes nothing: both tasks go to mini
    fleeter.write_tasks("""
        [[task]]
        name = "honest"
        cwd = "repo"
        prompt = "Write out.txt."
        git_ref = "main"

        [[task]]
        name = "grows"
        cwd = "repo"
        prompt = "Write out.txt."
        git_ref = "main"
        depends_on = ["honest"]
        allowed_tools = ["Bash"]
    """)
    gate = mini.home.parent / "grown"
    fake_claude.script(
        honest=[{"actions": [["print", "x" * 60000], ["write", "out.txt", "x"], ["commit", "x"]]}],
        grows=[
            {
                "actions": [
                    ["bash", f"while [ ! -e {gate} ]; do sleep 0.05; done"],
                    ["write", "out.txt", "x"],
                    ["commit", "x"],
                ]
            }
        ],
    )
    proc = fleeter.popen("tasks.toml")
    try:
        led = fleeter.ledger()
        deadline = time.monotonic() + 120
        while True:
            grows = next((t for t in led.tasks() if t.name == "grows"), None)
            atts = led.attempts(grows.id) if grows is not None else []
            if atts and (mini.home / "attempts" / atts[0].id / "log").exists():
                break
            assert time.monotonic() < deadline and proc.poll() is None, "grows never ran on mini"
            time.sleep(0.1)
        with open(mini.home / "attempts" / atts[0].id / "log", "ab") as f:
            f.write(b"y" * 60000 + b"\n")
        gate.touch()
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, out + err
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    cap = logmirror.mirror_cap(8192)
    for task in led.tasks():
        assert task.state.value == "DONE", task
        att = led.attempts(task.id)[0]
        causes = [t.cause for t in led.transitions(task.id)]
        there = (mini.home / "attempts" / att.id / "log").read_bytes()
        data = (fleeter.home / "attempts" / att.id / "peer.log").read_bytes()
        if task.name == "honest":
            assert len(there) <= cap and data == there  # cut there to 8192 and a marker: whole here
            assert "session_died:no_result" not in causes
        else:
            assert len(there) > cap
            assert data[:cap] == there[:cap] and data[cap:] == logmirror.CUT_NOTE % cap
            # its result was past the cut: not believed unread, the session counts as died and is resumed
            assert "session_died:no_result" in causes and causes[-1] == "exited"

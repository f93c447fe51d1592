"""The long-lived peer worker (``fleetrun host serve``) through the real CLI and a real
sshd: a task runs on the peer with every verb a request to one worker, its end and its
verdict pushed (the supervisor never asks for a status); a peer whose ``host serve``
refuses gets the one-shot verbs; a worker killed mid-run is replaced and the running
attempt is still adopted, never run twice."""

from __future__ import annotations

import os
import shlex
import signal
import time

import pytest

pytest_plugins = ["sshd"]


def wrapper(machine, mode):
    """The peer's command: logs each one-shot verb (``calls``) and each pid of a worker
    (``serve-pids``), traces the worker's requests (``trace``); ``refuses``: a
    ``host serve`` that answers as an older fleetrun does."""
    d = machine.home.parent
    refuse = (
        ('if [ "$2" = serve ]; then echo \'{"error": "usage: fleetrun host {probe,...} --json ..."}\'; exit 4; fi\n')
        if mode == "refuses"
        else ""
    )
    script = d / "fleetrun-wrapper"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$2" >> {shlex.quote(str(d / "calls"))}\n'
        f"{refuse}"
        f'if [ "$2" = serve ]; then echo $$ >> {shlex.quote(str(d / "serve-pids"))}; fi\n'
        f'exec {machine.command_line(FLEETRUN_SERVE_TRACE=str(d / "trace"))} "$@"\n'
    )
    script.chmod(0o755)
    return script


def lines(path):
    return path.read_text().split() if path.exists() else []


def wait_for(cond, timeout, what):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"never {what}"
        time.sleep(0.1)


@pytest.mark.parametrize("mode", ["serves", "refuses", "dies"])
def test_the_peer_worker(fleeter, fake_claude, peer_lab, mode):
    fleeter.make_repo()
    mini = peer_lab.machine("mini")
    mini.write("config.toml", (fleeter.home / "config.toml").read_text())
    cmd = wrapper(mini, mode)
    r = fleeter.run("relay", "add", "mini", mini.address, "--accept-new", "--command", str(cmd))
    assert r.ret == 0, r.stdout + r.stderr
    assert fleeter.run("drain").ret == 0
    fleeter.write_tasks("""
        [[task]]
        name = "t1"
        cwd = "repo"
        prompt = "Write out.txt."
        git_ref = "main"
        allowed_tools = ["Bash"]

          [[task.verify]]
          run = "test -f out.txt"
    """)
    d = mini.home.parent
    # "dies": the agent runs until the test has killed the worker (a fixed sleep could end
    # first on a loaded machine, and then nothing would be left to adopt); it may run Bash
    gate = d / "agent-may-end"
    hold = ["bash", f"while [ ! -e {shlex.quote(str(gate))} ]; do sleep 0.05; done"] if mode == "dies" else ["sleep", 1]
    fake_claude.script(t1=[{"actions": [hold, ["write", "out.txt", "x"], ["commit", "x"]]}])
    if mode == "dies":
        proc = fleeter.popen("tasks.toml")
        try:
            led = fleeter.ledger()
            wait_for(lambda: any(t.state.value == "RUNNING" for t in led.tasks()), 120, "RUNNING")
            (pid,) = map(int, lines(d / "serve-pids"))
            os.kill(pid, signal.SIGKILL)  # the worker dies; the shepherd it watched goes on
            gate.touch()
            out, err = proc.communicate(timeout=120)
        finally:
            gate.touch()
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert proc.returncode == 0, out.decode() + err.decode()
    else:
        r = fleeter.run("tasks.toml")
        assert r.ret == 0, r.stdout + r.stderr
    t = fleeter.task("t1")
    assert t.state.value == "DONE" and t.host == "mini"
    (att,) = fleeter.ledger().attempts(t.id)  # never run twice
    assert len(fake_claude.calls("t1")) == 1
    # the agent's log reached this machine's mirror whole (pushed as log events, or polled)
    assert (
        (fleeter.home / "attempts" / att.id / "peer.log").read_bytes()
        == (mini.home / "attempts" / att.id / "log").read_bytes()
        != b""
    )
    # an honest peer's events were all about its own attempts: not one counted against it
    import json

    assert "violations" not in json.loads((fleeter.home / "peers-state.json").read_text())["mini"]
    one_shot = [v for v in lines(d / "calls") if v != "serve"]
    requests = lines(d / "trace")
    assert one_shot[0] == "probe"  # relay add asks once, without a worker
    if mode == "refuses":
        assert lines(d / "calls").count("serve") == 1  # asked once, then the one-shot verbs
        assert requests == []
        # the loop polls the peer's attempts in one request (host status-many)
        assert {"prepare", "start", "status-many", "collect", "verify-start", "verify-status"} <= set(one_shot)
        return
    # every other verb went to the worker, but `bundle` (a byte stream, always one-shot):
    # the DONE task's branch is fetched home
    assert one_shot == ["probe", "bundle"], one_shot
    assert {"probe", "prepare", "start", "verify-start", "cleanup"} <= set(requests), requests
    assert "verify-status" not in requests  # the verdict was pushed
    if mode == "serves":
        assert len(lines(d / "serve-pids")) == 1
        assert "collect" not in requests  # its start asked the worker to collect at the end
        assert not {"status", "status-many"} & set(requests), requests  # the end was pushed: never asked
    else:
        assert len(lines(d / "serve-pids")) == 2  # a new worker on the same transport
        assert "collect" in requests  # the new worker was not asked to collect at the end: asked now
        # it was asked about the attempt once (the loop's poll: one status-many), then told
        assert requests.count("status-many") == 1 and "status" not in requests, requests


def test_a_work_loop_starts_its_peers_workers_and_hears_them_pushed(fleeter, peer_lab):
    """``fleetrun work`` starts the peer's worker as the loop starts, with no task queued
    (not on a first task's path), and then hears the peer from the heartbeats the worker
    pushes: one probe request asks for them, and the rounds after it take what was pushed."""
    import json

    mini = peer_lab.machine("mini")
    cmd = wrapper(mini, "serves")
    r = fleeter.run("relay", "add", "mini", mini.address, "--accept-new", "--command", str(cmd))
    assert r.ret == 0, r.stdout + r.stderr
    with open(fleeter.home / "config.toml", "a") as f:
        f.write("\n[relay]\nheartbeat_secs = 0.2\n")
    d = mini.home.parent
    events = fleeter.home / "events.ndjson"

    def beats():
        text = events.read_text() if events.exists() else ""
        # whole lines only: the loop may be half-way through appending
        rows = [json.loads(x) for x in text[: text.rfind("\n") + 1].splitlines()]
        return [e for e in rows if e["type"] == "peer_heartbeat" and e["peer"] == "mini" and e["reachable"]]

    proc = fleeter.popen("work")
    try:
        wait_for(lambda: lines(d / "serve-pids"), 120, "a worker started with no task queued")
        wait_for(lambda: len(beats()) >= 6, 120, "six heartbeat rounds")
        heard = json.loads((fleeter.home / "peers-state.json").read_text())["mini"]["last_heard"]
        wait_for(
            lambda: json.loads((fleeter.home / "peers-state.json").read_text())["mini"]["last_heard"] > heard,
            120,
            "a later heartbeat recorded",
        )
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 2, out.decode() + err.decode()  # interrupted
    # the first round's probe asks for the pushes; the rounds after it take what was
    # pushed. A push later than a round and a half is not waited for and that round
    # probes (by design): on a loaded machine, with 0.2 s rounds, one may be. Most are not.
    trace = lines(d / "trace")
    assert trace[0] == "probe" and set(trace) == {"probe"}, trace
    assert 3 * len(trace) <= len(beats()), (trace, len(beats()))
    assert len(lines(d / "serve-pids")) == 1
    assert all(isinstance(b["free_mem_mb"], float) for b in beats())  # each with its headroom

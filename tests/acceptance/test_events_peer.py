"""The event stream of a run on a peer over real SSH: the relay's heartbeats become
``peer_heartbeat`` events (through ``fleetrun_host_heartbeat``, on the loop's thread),
and the attempt's events name the peer."""

from __future__ import annotations

import json
import threading

pytest_plugins = ["sshd"]


def test_a_peers_heartbeats_and_its_attempt_are_in_the_event_stream(fleeter, fake_claude, peer_lab):
    fleeter.write_config("[relay]\nheartbeat_secs = 0.3\n")
    east = peer_lab.machine("east")
    east.write("config.toml", (fleeter.home / "config.toml").read_text())
    east.write("policy.toml", "[local]\nmax_tasks = 3\n")
    east.fake_headroom(9000)
    r = fleeter.run("relay", "add", "east", east.address, "--accept-new", "--command", east.command_line())
    assert r.ret == 0, r.stdout + r.stderr
    assert fleeter.run("drain").ret == 0  # this machine takes nothing: the task goes to east
    fleeter.make_repo()
    fleeter.write_tasks("""
        [[task]]
        name = "t1"
        cwd = "repo"
        prompt = "Write t1.txt."
        git_ref = "main"
    """)
    fake_claude.script(t1=[{"actions": [["sleep", 1.5], ["write", "t1.txt", "1"], ["commit", "t1"]]}])
    threads = []

    class Spy:  # which thread the hook is called on
        def fleetrun_host_heartbeat(self, host, info, config):
            threads.append(threading.current_thread() is threading.main_thread())

    import fleetrun

    Spy.fleetrun_host_heartbeat = fleetrun.hookimpl(Spy.fleetrun_host_heartbeat)
    r = fleeter.run("tasks.toml", plugins=[Spy()])
    assert r.ret == 0, r.stdout + r.stderr
    events = [json.loads(line) for line in (fleeter.home / "events.ndjson").read_text().splitlines()]
    beats = [e for e in events if e["type"] == "peer_heartbeat"]
    assert len(beats) >= 2 and threads and all(threads)
    assert {e["peer"] for e in beats} == {"east"}
    assert all(e["reachable"] and e["error"] is None for e in beats)
    assert all(e["max_tasks"] == 3 and e["free_slots"] == 3 - e["running"] for e in beats)
    assert any(e["running"] == 1 for e in beats)  # a heartbeat while t1 ran there
    assert all(e["free_mem_mb"] == 9000 and e["latency_ms"] > 0 for e in beats)
    [started] = [e for e in events if e["type"] == "attempt_started"]
    [ended] = [e for e in events if e["type"] == "attempt_ended"]
    assert started["host"] == ended["host"] == "east" and ended["exit_code"] == 0
    print(json.dumps(beats[-1]))  # a real line, for docs/events.md

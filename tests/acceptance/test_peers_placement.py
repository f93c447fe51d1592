"""Placement across peers over real SSH: the roomier peer wins, a peer at its own
max_tasks refuses and the task goes elsewhere or waits with the peer's reason, tasks
that must stay local (a role) stay local."""

from __future__ import annotations

import pytest

pytest_plugins = ["sshd"]


def add_peer(fleeter, machine):
    r = fleeter.run("relay", "add", machine.name, machine.address, "--accept-new", "--command", machine.command_line())
    assert r.ret == 0, r.stdout + r.stderr


def peers(fleeter, peer_lab, **headroom):
    out = {}
    config = (fleeter.home / "config.toml").read_text()
    for name, mem in headroom.items():
        m = peer_lab.machine(name)
        m.write("config.toml", config)
        m.fake_headroom(mem)
        add_peer(fleeter, m)
        out[name] = m
    assert fleeter.run("drain").ret == 0
    return out


def tasks(fleeter, *names, extra=""):
    fleeter.make_repo()
    fleeter.write_tasks(
        "\n".join(
            f'''
        [[task]]
        name = "{n}"
        cwd = "repo"
        prompt = "Write {n}.txt."
        git_ref = "main"
        {extra}
    '''
            for n in names
        )
    )


@pytest.mark.parametrize("roomy", ["east", "west"])
def test_the_peer_with_more_free_memory_gets_the_task(fleeter, fake_claude, peer_lab, roomy):
    peers(fleeter, peer_lab, east=9000 if roomy == "east" else 3000, west=9000 if roomy == "west" else 3000)
    tasks(fleeter, "t1")
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    assert fleeter.task("t1").host == roomy
    r.fnmatch_lines([f"*t1 RUNNING (attempt 1) on {roomy}*", "*t1 DONE (attempt 1)*"])


def test_a_peer_at_its_own_max_tasks_refuses_and_the_task_goes_elsewhere(fleeter, fake_claude, peer_lab):
    ps = peers(fleeter, peer_lab, big=9000, small=3000)
    ps["big"].write("policy.toml", "[local]\nmax_tasks = 1\n")  # the peer's own limit
    fleeter.write_policy("[peers]\nmax_tasks = 4\n")  # the supervisor would send it more
    tasks(fleeter, "t1", "t2")
    fake_claude.script(t1=[{"actions": [["sleep", 2], ["write", "t1.txt", "1"]]}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    t1, t2 = fleeter.task("t1"), fleeter.task("t2")
    assert t1.host == "big" and t2.host == "small"
    causes = [t.cause for t in fleeter.ledger().transitions(t2.id)]
    # refused before anything was made there (the word is peer_refused once the loop
    # treats a refusal at prepare like one at start)
    assert any(
        c.split(":", 1)[0] in ("peer_refused", "start_failed")
        and c.split(":", 1)[1] == "big is running 1 of 1 tasks (its own [local] max_tasks)"
        for c in causes
    )
    assert not (ps["big"].home / "worktrees" / f"t2-{t2.id}").exists()
    assert [a.host for a in fleeter.ledger().attempts(t2.id)] == ["big", "small"]
    assert fleeter.task("t2").retries == 0  # a refusal does not use up a retry
    assert len(fake_claude.calls("t2")) == 1


def test_a_refused_task_waits_with_the_peers_reason(fleeter, fake_claude, peer_lab):
    ps = peers(fleeter, peer_lab, only=9000)
    ps["only"].write("policy.toml", "[local]\nmax_tasks = 1\n")
    fleeter.write_policy("[peers]\nmax_tasks = 4\n")
    tasks(fleeter, "t1", "t2")
    fake_claude.script(t1=[{"actions": [["sleep", 2], ["write", "t1.txt", "1"]]}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    r.fnmatch_lines(
        [
            "*t2 READY (attempt 1)  *:only is running 1 of 1 tasks (its own [[]local[]] max_tasks)",
            "waiting: * (t2): this machine is draining; only didn't start the last 1 attempt(s) (*); backing off 5s",
            "*t2 DONE (attempt 2)*",
        ]
    )
    assert fleeter.task("t2").host == "only"


def test_tasks_with_a_role_stay_on_this_machine(fleeter, fake_claude, peer_lab):
    # (a brain or agent verifier no longer keeps a task here: test_peers_fetchback.py)
    peers(fleeter, peer_lab, mini=9000)
    tasks(fleeter, "reviewed", extra='role = "backend"')
    r = fleeter.run("tasks.toml")
    assert r.ret == 1
    r.fnmatch_lines(
        [
            "cannot place: reviewed: this machine is draining; a task with a role runs on this machine "
            "(its role's session is on this machine), not on the live peer mini"
        ]
    )
    assert fake_claude.calls() == []


def test_a_peer_that_never_answers_holds_placement_back_only_briefly(fleeter, fake_claude, peer_lab):
    """As the loop starts no task is placed while a peer's first heartbeat runs (that
    peer may have the most room), but only for a bounded time: a peer whose port takes
    the connection and never speaks SSH keeps its first round going until the handshake
    times out (8 s), and the task runs here before that round ends."""
    import json
    import socket
    import threading

    ps = peers(fleeter, peer_lab, mute=9000)
    assert fleeter.run("undrain").ret == 0
    m = ps["mute"]
    m.sshd.stop()
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", m.sshd.port))
    listener.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:  # takes every connection, says nothing
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        tasks(fleeter, "t1")
        r = fleeter.run("tasks.toml")
    finally:
        stop.set()
        thread.join(5)
        for s in [*held, listener]:
            s.close()
    assert r.ret == 0, r.stdout + r.stderr
    assert fleeter.task("t1").host == "local"
    events = [json.loads(line) for line in (fleeter.home / "events.ndjson").read_text().splitlines()]
    waited = [e for e in events if e["type"] == "waiting" and "first heartbeat of mute" in e["reason"]]
    assert waited, "placement did not wait for the peer's first round at all"
    running = next(e["at"] for e in events if e["type"] == "transition" and e["to"] == "RUNNING")
    beats = [e["at"] for e in events if e["type"] == "peer_heartbeat"]
    assert not beats or running < beats[0], (running, beats)  # placed before the first round ended


def test_a_task_that_must_run_on_a_drained_machine_says_so_and_what_keeps_it_off_the_peers(
    fleeter, fake_claude, peer_lab
):
    """This machine drained, a live peer: a task with ``base = "dependencies"`` can only
    wait for a person, and its wait says the real reason, both halves of it: this
    machine is draining, and its base keeps it off the live peer (issue 22)."""
    peers(fleeter, peer_lab, mini=8000)  # drains this machine
    fleeter.make_repo()
    fleeter.write_tasks("""
        [[task]]
        name = "a"
        cwd = "repo"
        prompt = "Write a.txt."
        git_ref = "main"

        [[task]]
        name = "b"
        cwd = "repo"
        prompt = "Build on a."
        git_ref = "main"
        base = "dependencies"
        depends_on = ["a"]
    """)
    fake_claude.script(default=[{"actions": [["write", "out.txt", "x"], ["commit", "work"]]}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 1, r.stdout + r.stderr
    assert (fleeter.task("a").state.value, fleeter.task("a").host) == ("DONE", "mini")
    why = (
        "this machine is draining; mini is a peer, and a task with "
        'base = "dependencies" runs where its files are: on this machine (the dependencies\' branches are '
        "merged here)"
    )
    r.fnmatch_lines([f"cannot place: b: {why}"])
    (row,) = [line for line in fleeter.run("status").stdout.splitlines() if line.startswith("b ")]
    assert row.endswith(why), row

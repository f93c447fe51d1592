"""The seed's worked example, across a drained supervisor and one peer over real SSH."""

from __future__ import annotations

import json

pytest_plugins = ["sshd"]

FAIL_UNLESS_FINAL = "test \"$(cat FIX.txt)\" = final || { echo 'FIX.txt must contain exactly the word final'; exit 1; }"


def add_peer(fleeter, machine, *extra):
    r = fleeter.run(
        "relay", "add", machine.name, machine.address, "--accept-new", "--command", machine.command_line(), *extra
    )
    assert r.ret == 0, r.stdout + r.stderr
    return r


def test_worked_example(fleeter, fake_claude, peer_lab):
    repo = fleeter.make_repo()
    mini = peer_lab.machine("mini")
    mini.write("config.toml", (fleeter.home / "config.toml").read_text())
    add_peer(fleeter, mini)
    assert fleeter.run("drain").ret == 0
    fleeter.write_tasks(f"""
        [[task]]
        name = "cluster-auto"
        cwd = "repo"
        prompt = "Write MINI.txt."
        git_ref = "main"

          [[task.verify]]
          run = "test -f MINI.txt"

        [[task]]
        name = "fix-it"
        cwd = "repo"
        prompt = "Write FIX.txt."
        git_ref = "main"
        peer = "mini"

          [[task.verify]]
          run = {json.dumps(FAIL_UNLESS_FINAL)}
    """)
    fake_claude.script(
        **{
            "cluster-auto": [{"actions": [["write", "MINI.txt", "hi"], ["commit", "mini"]], "cost": 0.32}],
            "fix-it": [
                {"actions": [["write", "FIX.txt", "draft"], ["commit", "draft"]], "cost": 0.33},
                {"actions": [["write", "FIX.txt", "final"], ["commit", "final"]], "cost": 0.35},
            ],
        }
    )
    r = fleeter.run("tasks.toml")
    print(r.stdout, r.stderr)
    assert r.ret == 0, r.stdout + r.stderr
    auto, fix = fleeter.task("cluster-auto"), fleeter.task("fix-it")
    assert auto.host == "mini" and fix.host == "mini"
    led = fleeter.ledger()
    atts = led.attempts(fix.id)
    assert [a.host for a in atts] == ["mini", "mini"]
    first, second = fake_claude.calls("fix-it")
    assert "FIX.txt must contain exactly the word final" in second["prompt"]
    assert second["cwd"] == first["cwd"]
    assert first["cwd"].startswith(str(mini.home / "worktrees"))
    vs = led.verdicts(task_id=fix.id)
    assert [v.passed for v in vs] == [False, True]
    assert all(v.host == "mini" for v in vs)
    assert "FIX.txt must contain exactly the word final" in vs[0].output
    # the checkout is untouched; both branches hold their commits
    assert not (repo / "MINI.txt").exists() and not (repo / "FIX.txt").exists()
    assert fleeter.git(repo, "status", "--porcelain").strip() == ""
    log = fleeter.git(repo, "log", "--format=%s", fix.branch).split("\n")
    assert log[:2] == ["final", "draft"]
    assert "MINI.txt" in fleeter.git(repo, "ls-tree", "-r", "--name-only", auto.branch)
    assert fix.handoff and f"git fetch ssh://{mini.address}{repo} {fix.branch}" in fix.handoff["fetch_hint"]
    # the agent's output came back to this machine (the claude plugin read it here)
    assert '"type":"result"' in (fleeter.home / "attempts" / atts[1].id / "peer.log").read_text()
    assert atts[1].cost_usd == 0.35
    # the clean worktrees on the peer are gone after DONE; the branches stay
    assert list((mini.home / "worktrees").iterdir()) == []
    notes = [n for _, n in led.notes(fix.id)]
    assert any(f"on mini; branch {fix.branch} stays" in n for n in notes), notes


def test_a_restarted_supervisor_adopts_the_attempt_on_the_peer(fleeter, fake_claude, peer_lab):
    import signal
    import time

    fleeter.make_repo()
    mini = peer_lab.machine("mini")
    mini.write("config.toml", (fleeter.home / "config.toml").read_text())
    add_peer(fleeter, mini)
    assert fleeter.run("drain").ret == 0
    fleeter.write_tasks("""
        [[task]]
        name = "long"
        cwd = "repo"
        prompt = "Take a while."
        git_ref = "main"

          [[task.verify]]
          run = "test -f out.txt"
    """)
    fake_claude.script(long=[{"actions": [["sleep", 3], ["write", "out.txt", "x"], ["commit", "x"]]}])
    assert fleeter.run("queue", "tasks.toml").ret == 0
    proc = fleeter.popen("work")
    led = fleeter.ledger()
    deadline = time.monotonic() + 120
    while not any(t.state.value == "RUNNING" for t in led.tasks()):
        assert time.monotonic() < deadline, "never RUNNING"
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)  # the supervisor dies; the attempt on the peer goes on
    proc.communicate()
    r = fleeter.run("work", "--until-idle")
    assert r.ret == 0, r.stdout + r.stderr
    r.fnmatch_lines(["adopted 1 running attempt(s)", "*long DONE (attempt 1)*"])
    t = fleeter.task("long")
    assert [a.host for a in fleeter.ledger().attempts(t.id)] == ["mini"]
    assert len(fake_claude.calls("long")) == 1


def test_cancel_stops_the_attempt_on_the_peer(fleeter, fake_claude, peer_lab):
    import json
    import signal
    import time

    fleeter.make_repo()
    mini = peer_lab.machine("mini")
    mini.write("config.toml", (fleeter.home / "config.toml").read_text())
    add_peer(fleeter, mini)
    assert fleeter.run("drain").ret == 0
    fleeter.write_tasks("""
        [[task]]
        name = "forever"
        cwd = "repo"
        prompt = "Never finish."
        git_ref = "main"
    """)
    fake_claude.script(forever=[{"actions": [["sleep", 60]]}])
    assert fleeter.run("queue", "tasks.toml").ret == 0
    proc = fleeter.popen("work", "--until-idle")
    try:
        led = fleeter.ledger()
        deadline = time.monotonic() + 120
        while not any(t.state.value == "RUNNING" for t in led.tasks()):
            assert time.monotonic() < deadline, "never RUNNING"
            time.sleep(0.1)
        (att,) = led.attempts(fleeter.task("forever").id)
        r = fleeter.run("cancel", "forever")
        assert r.ret == 0, r.stdout + r.stderr
        status = mini.home / "attempts" / att.id / "status.json"
        deadline = time.monotonic() + 120
        while json.loads(status.read_text()).get("state") != "ended":
            assert time.monotonic() < deadline, "the attempt on the peer was not stopped"
            time.sleep(0.1)
        assert json.loads(status.read_text())["reason"] in ("stopped", "cancelled")
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 1, out.decode() + err.decode()
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.communicate()
    assert fleeter.task("forever").state.value == "CANCELLED"

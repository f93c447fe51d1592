"""Peers as separate hosts: each in a network namespace of its own (a veth link, an
address in a private test subnet) and a private mount namespace in which the
repository's path holds a different clone, as on two machines. Then the link is
dropped mid-attempt, for less and for more than stale_after_secs.

Skipped, with the reason, where this machine cannot make network namespaces.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

pytest_plugins = ["sshd"]


def add_peer(fleeter, m):
    r = fleeter.run("relay", "add", m.name, m.address, "--accept-new", "--command", m.command_line())
    assert r.ret == 0, r.stdout + r.stderr


def one_task(fleeter, name="t1", cwd="repo", verify='run = "test -f out.txt"'):
    fleeter.write_tasks(f'''
        [[task]]
        name = "{name}"
        cwd = "{cwd}"
        prompt = "Write out.txt."
        git_ref = "main"

          [[task.verify]]
          {verify}
    ''')


@pytest.fixture
def far(fleeter, fake_claude, peer_lab):
    """A peer in a namespace of its own, with its own clone at the repo's path."""
    peer_lab.netlab()
    repo = fleeter.make_repo()
    m = peer_lab.machine("far", netns=True, repo=repo)
    m.write("config.toml", (fleeter.home / "config.toml").read_text())
    add_peer(fleeter, m)
    assert fleeter.run("drain").ret == 0
    m.repo = repo
    m.clone = peer_lab.root / "far" / "repo"
    return m


def wait_for(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_work_runs_on_the_peers_own_clone_and_is_fetched_by_the_hint(fleeter, fake_claude, far, tmp_path):
    # the branch stays on the peer (by default a DONE peer task's is fetched home)
    fleeter.write_config((fleeter.home / "config.toml").read_text() + "\n[relay]\nfetch_back = false\n")
    one_task(fleeter)
    fake_claude.script(t1=[{"actions": [["write", "out.txt", "far away"], ["commit", "far"]], "result": "Wrote it"}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    t = fleeter.task("t1")
    assert t.host == "far"
    (call,) = fake_claude.calls("t1")
    assert call["cwd"].startswith(str(far.home / "worktrees"))
    # the branch is in the peer's clone only; both checkouts are untouched
    assert fleeter.git(far.repo, "branch", "--list", t.branch).strip() == ""
    assert "out.txt" in fleeter.git(far.clone, "ls-tree", "-r", "--name-only", t.branch)
    for checkout in (far.repo, far.clone):
        assert not (checkout / "out.txt").exists()
        assert fleeter.git(checkout, "status", "--porcelain").strip() == ""
    # the handoff says how to fetch it, and that works over ssh
    hint = t.handoff["fetch_hint"]
    url = f"ssh://{far.address}{far.repo}"
    assert f"git fetch {url} {t.branch}" in hint
    ssh = (
        f"ssh -i {far.sshd.dir.parent.parent.parent / 'client' / '.ssh' / 'id_ed25519'} "
        f"-o UserKnownHostsFile={fleeter.home / 'known_hosts'} -o StrictHostKeyChecking=yes -o BatchMode=yes"
    )
    env = dict(os.environ, GIT_SSH_COMMAND=ssh)
    subprocess.run(
        ["git", "-C", str(far.repo), "fetch", "-q", url, f"{t.branch}:{t.branch}"],
        env=env,
        check=True,
        capture_output=True,
        timeout=60,
    )
    assert fleeter.git(far.repo, "log", "--format=%s", "-1", t.branch).strip() == "far"
    # the clean worktree on the peer is gone after DONE; the branch stays
    assert not (far.home / "worktrees" / f"t1-{t.id}").exists()
    notes = [n for _, n in fleeter.ledger().notes(t.id)]
    assert any(f"on far; branch {t.branch} stays" in n for n in notes), notes


def test_a_cwd_missing_on_the_peer_fails_that_attempt(fleeter, fake_claude, peer_lab):
    peer_lab.netlab()
    fleeter.make_repo("only-here/repo")
    m = peer_lab.machine("far", netns=True, hide=(fleeter.path / "only-here",))
    m.write("config.toml", (fleeter.home / "config.toml").read_text())
    add_peer(fleeter, m)
    assert fleeter.run("drain").ret == 0
    one_task(fleeter, cwd="only-here/repo")
    proc = fleeter.popen("tasks.toml")
    try:
        led = fleeter.ledger()
        cause = wait_for(
            lambda: next(
                (tr.cause for t in led.tasks() for tr in led.transitions(t.id) if "does not exist" in tr.cause), None
            ),
            30,
            "the failed start",
        )
        assert cause == "start_failed:working directory does not exist on this host"
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
    assert fake_claude.calls() == []


@pytest.mark.parametrize("down_s", [2.0, 9.0], ids=["shorter-than-stale", "longer-than-stale"])
def test_a_dropped_link_never_runs_the_attempt_twice(fleeter, fake_claude, peer_lab, far, down_s):
    stale = 5.0
    fleeter.write_policy(f"stale_after_secs = {stale}\n")
    with open(fleeter.home / "config.toml", "a") as f:
        f.write("\n[relay]\nheartbeat_secs = 1\n")
    one_task(fleeter)
    fake_claude.script(t1=[{"actions": [["sleep", 4], ["write", "out.txt", "x"], ["commit", "done"]]}])
    net = peer_lab.net
    proc = fleeter.popen("tasks.toml")
    try:
        led = fleeter.ledger()
        wait_for(lambda: any(t.state.value == "RUNNING" for t in led.tasks()), 120, "RUNNING")
        time.sleep(0.5)
        net.link(far.netns, up=False)
        down_at = time.monotonic()
        states = set()
        peer_status = set()
        while time.monotonic() - down_at < down_s:
            states |= {t.state.value for t in led.tasks()}
            r = fleeter.run("relay", "peers", "--cached", "--json")
            peer_status |= {row["status"] for row in json.loads(r.stdout)}
            time.sleep(0.5)
        net.link(far.netns, up=True)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out.decode() + err.decode()
    assert states <= {"RUNNING", "VERIFYING", "DONE"}, states  # never sent anywhere else
    if down_s > stale + 2:
        assert "stale" in peer_status, peer_status
    t = fleeter.task("t1")
    assert t.state.value == "DONE" and t.host == "far"
    assert [a.host for a in fleeter.ledger().attempts(t.id)] == ["far"]
    assert len(fake_claude.calls("t1")) == 1
    transitions = [(tr.from_state, tr.to_state) for tr in fleeter.ledger().transitions(t.id)]
    assert transitions.count(("ASSIGNED", "RUNNING")) == 1

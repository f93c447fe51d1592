"""A peer attempt's collect run by its worker as the agent exits, its answer pushed with
the end (issue 24: one round trip less from an end to VERIFYING), through the real CLI
and a real sshd: the supervisor sends no collect request for it, and still refuses a
worktree whose ``.git`` the agent rewrote (the peer's collect finds it, its answer
comes with the end); an agent that fails is not collected there."""

from __future__ import annotations

import json
from typing import Any

from .test_peers_roundtrips import traced_peer

pytest_plugins = ["sshd"]


def evil_tasks(fleeter: Any, script: str) -> None:
    fleeter.write_tasks(f"""
        [agents.evil]
        command = ["sh", "-c", {json.dumps(script)}, "evil"]

        [[task]]
        name = "t1"
        cwd = "repo"
        agent = "evil"
        git_ref = "main"
        prompt = "Do something."
        max_retries = 2
          [[task.verify]]
          run = "true"
    """)


def test_a_worktree_tampered_before_the_end_a_peer_collected_goes_to_a_human(fleeter, peer_lab):
    fleeter.make_repo(files={"README.md": "hello\n"})
    other = fleeter.make_repo("other", files={"DATA.md": "precious\n"})
    before = fleeter.git(other, "rev-parse", "HEAD")
    trace = traced_peer(fleeter, peer_lab)
    # the agent points its worktree's .git at another repository and leaves a file for
    # the collect to commit there; it exits 0, so its worker collects at once
    evil_tasks(fleeter, f"echo 'gitdir: {other}/.git' > .git && echo evil > EVIL.txt")
    r = fleeter.run("tasks.toml")
    assert r.ret == 1, r.stdout + r.stderr
    t = fleeter.task("t1")
    assert t.state.value == "NEEDS_HUMAN" and t.host == "mini", (t.state, t.reason, r.stdout + r.stderr)
    assert t.reason.startswith("worktree_tampered:"), t.reason
    assert t.retries == 0 and len(fleeter.ledger().attempts(t.id)) == 1
    assert fleeter.git(other, "rev-parse", "HEAD") == before  # nothing committed there
    verbs = [line.split()[0] for line in trace.read_text().splitlines()]
    assert verbs == ["probe", "prepare", "start"], verbs  # its end came with the collect's answer


def test_a_peer_agent_that_fails_is_not_collected_at_its_end(fleeter, peer_lab):
    fleeter.make_repo(files={"README.md": "hello\n"})
    trace = traced_peer(fleeter, peer_lab)
    fleeter.write_tasks("""
        [agents.failing]
        command = ["sh", "-c", "echo half > half.txt; exit 3"]

        [[task]]
        name = "t1"
        cwd = "repo"
        agent = "failing"
        git_ref = "main"
        prompt = "Do something."
        max_retries = 0
    """)
    r = fleeter.run("tasks.toml")
    t = fleeter.task("t1")
    assert t.state.value == "NEEDS_HUMAN" and t.host == "mini", (t.state, t.reason, r.stdout + r.stderr)
    # nothing was committed on the task's branch: its work is left as the agent left it
    assert fleeter.git(fleeter.path / "repo", "rev-parse", t.branch) == fleeter.git(
        fleeter.path / "repo", "rev-parse", "main"
    )
    assert "collect" not in trace.read_text().split()

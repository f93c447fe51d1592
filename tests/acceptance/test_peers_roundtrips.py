"""How many requests a peer task costs, counted through the real CLI and a real sshd: a
trivial task with a ``run`` verifier makes at most five to the peer's worker (its
first heartbeat's probe, prepare, start, which carries the attempt's collect that the
worker runs as the agent exits and pushes with its end, the verifier's start,
cleanup); a worker whose hello does not offer that (the fleetrun before) is sent the
collect with its verifier's start in one request, and one older still the two apart:
the task is done the same."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest

pytest_plugins = ["sshd"]

#: what each worker's hello leaves out
WITHOUT = {"collects": (), "chains": ("collects",), "older": ("collects", "chain")}


def traced_peer(fleeter: Any, peer_lab: Any, without: tuple[str, ...] = ()) -> Path:
    """A peer ``mini`` (this home's config.toml copied there) whose worker writes a line
    a request to the returned trace file, its hello without the features ``without``
    names; this machine drained, so every task goes there."""
    mini = peer_lab.machine("mini")
    if (fleeter.home / "config.toml").exists():
        mini.write("config.toml", (fleeter.home / "config.toml").read_text())
    trace = mini.home.parent / "trace"
    command = (
        shlex.join(mini.older_command(without, FLEETRUN_SERVE_TRACE=str(trace)))
        if without
        else mini.command_line(FLEETRUN_SERVE_TRACE=str(trace))
    )
    r = fleeter.run("relay", "add", "mini", mini.address, "--accept-new", "--command", command)
    assert r.ret == 0, r.stdout + r.stderr
    assert fleeter.run("drain").ret == 0
    return trace


@pytest.mark.parametrize("worker", ["collects", "chains", "older"])
def test_a_peer_task_with_a_run_verifier_makes_five_requests(fleeter, fake_claude, peer_lab, worker):
    fleeter.make_repo()
    trace = traced_peer(fleeter, peer_lab, WITHOUT[worker])
    fleeter.write_tasks("""
        [[task]]
        name = "t1"
        cwd = "repo"
        prompt = "Write out.txt."
        git_ref = "main"

          [[task.verify]]
          run = "test -f out.txt"
    """)
    # the agent leaves its work uncommitted: the collect commits it, on the peer
    fake_claude.script(t1=[{"actions": [["write", "out.txt", "x"]]}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    t = fleeter.task("t1")
    assert t.state.value == "DONE" and t.host == "mini"
    (v,) = fleeter.ledger().verdicts(task_id=t.id)
    assert v.passed and v.host == "mini"  # it ran there
    assert fleeter.git(fleeter.path / "repo", "show", f"{t.branch}:out.txt") == "x"
    requests = trace.read_text().splitlines()  # one line a request
    if worker == "collects":  # its end came collected: no collect request
        assert requests == ["probe", "prepare", "start", "verify-start", "cleanup"], requests
    elif worker == "chains":
        assert requests == ["probe", "prepare", "start", "collect verify-start", "cleanup"], requests
    else:
        assert requests == ["probe", "prepare", "start", "collect", "verify-start", "cleanup"], requests


def test_a_done_tasks_cleanup_goes_after_the_next_tasks_prepare(fleeter, fake_claude, peer_lab):
    """A DONE task's cleanup (``git worktree remove`` on the peer, under the repository's
    lock) is sent at the end of the loop's pass, after the prepare and start of the task
    placed in that pass: the next task's ``git worktree add`` does not wait for it."""
    fleeter.make_repo()
    trace = traced_peer(fleeter, peer_lab)
    fleeter.write_policy("[peers]\nmax_tasks = 1\n")
    fleeter.write_tasks("""
        [[task]]
        name = "t1"
        cwd = "repo"
        prompt = "Write one.txt."
        git_ref = "main"

        [[task]]
        name = "t2"
        cwd = "repo"
        prompt = "Write two.txt."
        git_ref = "main"
    """)
    fake_claude.script(
        t1=[{"actions": [["write", "one.txt", "x"], ["commit", "x"]]}],
        t2=[{"actions": [["write", "two.txt", "x"], ["commit", "x"]]}],
    )
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    assert {fleeter.task(n).state.value for n in ("t1", "t2")} == {"DONE"}
    verbs = [line.split()[0] for line in trace.read_text().splitlines()]
    # each attempt's collect comes with its end (its start asked for it): no request
    assert verbs == ["probe", "prepare", "start", "prepare", "start", "cleanup", "cleanup"], verbs
    assert "removed clean worktree" in " ".join(text for _, text in fleeter.ledger().notes(fleeter.task("t1").id))

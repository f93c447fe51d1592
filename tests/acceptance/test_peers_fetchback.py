"""Fetch-back over real SSH: a task that ran on a peer has its branch brought into this
machine's repository over the same paramiko transport (``fleetrun host bundle``), its
``brain`` and ``agent`` verifiers run here on that branch, and a local dependent is
handed the fetched branch.

The peer is an sshd on 127.0.0.1 started in a private mount namespace in which the
repository's path holds a clone of it (and root's ``.bashrc`` prints on stdout, as a
chatty one does): the branch really exists only on the peer until it is fetched.
That needs root and ``unshare``; without them these tests skip, saying so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from brainserver import BrainServer

pytest_plugins = ["sshd"]


@pytest.fixture
def brain_server():
    with BrainServer() as server:
        yield server


def notes(fleeter, task) -> list[str]:
    return [n for _, n in fleeter.ledger().notes(task.id)]


def test_brain_and_agent_verifiers_run_here_on_the_fetched_branch(fleeter, fake_claude, peer_lab, brain_server):
    repo = fleeter.make_repo()
    fleeter.write_config(
        (fleeter.home / "config.toml").read_text() + f'\n[brain]\nurl = "{brain_server.url}"\nmodel = "tiny"\n'
    )
    mini = peer_lab.private_machine("mini", repo)
    mini.pair(fleeter)
    fleeter.write_tasks("""
        [[task]]
        name = "api"
        cwd = "repo"
        prompt = "Write API.txt."
        git_ref = "main"
        peer = "mini"

          [[task.verify]]
          run = "test -f API.txt"

          [[task.verify]]
          brain = "Does API.txt describe the API?"

          [[task.verify]]
          agent = "Review API.txt."

        [[task]]
        name = "client"
        cwd = "repo"
        prompt = "Use the API."
        git_ref = "main"
        peer = "local"
        depends_on = ["api"]

          [[task.verify]]
          run = "grep -qx 'add api' seen.txt"
    """)
    fake_claude.script(
        **{
            "api": [{"actions": [["write", "API.txt", "GET /things\n"], ["commit", "add api"]], "result": "Wrote it"}],
            "api:review": [{"actions": [["read", "API.txt"]], "result": "PASS\nAPI.txt lists the endpoint."}],
            "client": [
                {
                    "actions": [
                        [
                            "bash",
                            "git log -1 --format=%s \"$(git for-each-ref --format='%(refname)' 'refs/heads/fleetrun/api-*')\""
                            " > seen.txt",
                        ],
                        ["commit", "saw api"],
                    ]
                }
            ],
        }
    )
    brain_server.script("PASS")
    r = fleeter.run("tasks.toml")
    print(r.stdout, r.stderr)
    assert r.ret == 0, r.stdout + r.stderr
    api, client = fleeter.task("api"), fleeter.task("client")
    assert (api.state.value, api.host, client.state.value, client.host) == ("DONE", "mini", "DONE", "local")

    # the agent worked on the peer, in its worktree, on its clone
    (work,) = fake_claude.calls("api")
    assert work["cwd"].startswith(str(mini.home / "worktrees"))
    assert "add api" in fleeter.git(mini.clone, "log", "--format=%s", "-1", api.branch)
    # ... and the branch was fetched back into this repository, under its own name
    assert fleeter.git(repo, "log", "--format=%s", "-1", api.branch).strip() == "add api"
    assert fleeter.git(repo, "rev-parse", api.branch) == fleeter.git(mini.clone, "rev-parse", api.branch)
    assert fleeter.git(repo, "status", "--porcelain").strip() == "" and not (repo / "API.txt").exists()
    fetched = fleeter.home / "worktrees" / f"api-{api.id}-fetched"
    assert any(n.startswith(f"fetched branch {api.branch} from mini into {repo}: commit ") for n in notes(fleeter, api))

    # `run` ran on the peer; brain and agent ran here, on the fetched branch
    vs = fleeter.ledger().verdicts(task_id=api.id)
    assert [(v.kind, v.passed, v.host) for v in vs] == [
        ("run", True, "mini"),
        ("brain", True, "local"),
        ("agent", True, "local"),
    ]
    (req,) = brain_server.requests
    assert "+GET /things" in req.prompt and "API.txt" in req.prompt and "git diff " in req.prompt
    (review,) = fake_claude.review_calls("api")
    assert review["cwd"] == str(fetched) == review["env"]["FLEETRUN_WORKTREE"]
    assert review["error"] is None

    # the handoff names the local branch and says it was fetched; the dependent saw the commit
    assert api.handoff["branch"] == api.branch
    hint = api.handoff["fetch_hint"]
    assert f"fetched from mini into this machine's repository {repo}" in hint
    assert f"git fetch ssh://{mini.address}{repo} {api.branch}" in hint
    (dep,) = fake_claude.calls("client")
    assert f"api is DONE on branch {api.branch}. It ran on mini, and its branch was fetched from mini" in dep["prompt"]
    assert dep["cwd"].startswith(str(fleeter.home / "worktrees"))
    assert fleeter.git(repo, "show", f"{client.branch}:seen.txt").strip() == "add api"

    # the fetched worktree is gone after DONE; the branch stays; the peer cleaned up too
    assert not fetched.exists()
    assert f"fetched-{api.id}" not in fleeter.git(repo, "worktree", "list")
    assert list((mini.home / "worktrees").iterdir()) == []
    assert any(n == f"removed the fetched worktree {fetched}" for n in notes(fleeter, api))


def test_a_diverged_local_branch_is_left_alone_and_a_retry_is_fetched_again(
    fleeter, fake_claude, peer_lab, brain_server
):
    repo = fleeter.make_repo()
    fleeter.write_config(
        (fleeter.home / "config.toml").read_text() + f'\n[brain]\nurl = "{brain_server.url}"\nmodel = "tiny"\n'
    )
    mini = peer_lab.private_machine("mini", repo)
    mini.pair(fleeter)
    fleeter.write_tasks("""
        [[task]]
        name = "fix"
        cwd = "repo"
        prompt = "Write FIX.txt."
        git_ref = "main"
        peer = "mini"

          [[task.verify]]
          brain = "Is FIX.txt final?"
    """)
    fake_claude.script(
        fix=[
            {"actions": [["write", "FIX.txt", "draft\n"], ["commit", "draft"]]},
            {"actions": [["write", "FIX.txt", "final\n"], ["commit", "final"]]},
        ]
    )
    brain_server.script("FAIL: it says draft", "PASS")
    assert fleeter.run("queue", "tasks.toml").ret == 0
    fix = fleeter.task("fix")
    branch = f"fleetrun/fix-{fix.id}"
    # someone made this machine's branch of that name, with other work on it
    fleeter.git(repo, "branch", branch, "main")
    wt = fleeter.path / "mine"
    fleeter.git(repo, "worktree", "add", "-q", str(wt), branch)
    (wt / "MINE.txt").write_text("mine\n")
    fleeter.git(wt, "add", "MINE.txt")
    fleeter.git(wt, "commit", "-q", "-m", "mine")
    mine = fleeter.git(repo, "rev-parse", branch)

    r = fleeter.run("work", "--until-idle")
    assert r.ret == 0, r.stdout + r.stderr
    fix = fleeter.task("fix")
    assert fix.state.value == "DONE" and fix.host == "mini"
    ours = f"{branch}-from-mini"
    assert fleeter.git(repo, "rev-parse", branch) == mine  # left alone
    assert fleeter.git(repo, "log", "--format=%s", ours).split() == ["final", "draft", "initial"]
    # the brain saw each attempt's own work, as a diff against where the branch left main
    first, second = brain_server.requests
    assert "+draft" in first.prompt and "+final" in second.prompt and "MINE.txt" not in second.prompt
    fetches = [n for n in notes(fleeter, fix) if n.startswith("fetched branch")]
    assert len(fetches) == 2
    assert all(f"as {ours}: commit" in n and f"this machine's {branch} has diverged from mini's" in n for n in fetches)
    assert fix.handoff["branch"] == ours
    assert f"On mini the branch is {branch} (this machine's {branch} has diverged" in fix.handoff["fetch_hint"]


def test_an_unfetchable_branch_fails_the_verifier_with_the_reason(fleeter, fake_claude, peer_lab):
    """On a 127.0.0.1 peer that shares this repository, the branch is already here: the
    fetch moves nothing and says so. When the peer's branch is gone, the agent verifier
    fails and says why (it is never run on the peer's files)."""
    repo = fleeter.make_repo()
    mini = peer_lab.machine("mini")
    mini.pair(fleeter)
    fleeter.write_tasks("""
        [[task]]
        name = "same"
        cwd = "repo"
        prompt = "Write SAME.txt."
        git_ref = "main"
        peer = "mini"

          [[task.verify]]
          agent = "Review SAME.txt."

        [[task]]
        name = "gone"
        cwd = "repo"
        prompt = "Write GONE.txt, then delete your branch."
        git_ref = "main"
        peer = "mini"
        max_retries = 0

          [[task.verify]]
          agent = "Review GONE.txt."
    """)
    fake_claude.script(
        **{
            "same": [{"actions": [["write", "SAME.txt", "x\n"], ["commit", "same"]]}],
            "same:review": [{"result": "PASS"}],
            "gone": [
                {
                    "actions": [
                        ["write", "GONE.txt", "x\n"],
                        ["commit", "gone"],
                        [
                            "bash",
                            'git checkout -q --detach && git branch -D -q "$(git for-each-ref '
                            "--format='%(refname:short)' 'refs/heads/fleetrun/gone-*')\"",
                        ],
                    ]
                }
            ],
        }
    )
    r = fleeter.run("tasks.toml")
    assert r.ret == 1, r.stdout + r.stderr
    same, gone = fleeter.task("same"), fleeter.task("gone")
    assert same.state.value == "DONE"
    assert any(
        n.startswith(f"branch {same.branch} of mini (commit ") and n.endswith("; nothing to fetch")
        for n in notes(fleeter, same)
    ), notes(fleeter, same)
    (review,) = fake_claude.review_calls("same")
    assert review["cwd"] == str(fleeter.home / "worktrees" / f"same-{same.id}-fetched")
    assert gone.state.value == "NEEDS_HUMAN"
    (v,) = fleeter.ledger().verdicts(task_id=gone.id)
    assert (v.kind, v.passed, v.host) == ("agent", False, "mini")
    assert v.reason.startswith(
        "an agent verifier runs on this machine, and the task's branch could not be "
        f"fetched from mini: there is no branch {gone.branch} in {repo} on this host"
    )
    assert fake_claude.review_calls("gone") == []


def test_host_status_and_friends_answer_without_loading_plugins(tmp_path):
    """The fast path of the verbs a supervisor polls: no plugin module is imported but
    the peer side itself (and the packages that hold it, and the wire protocol)."""
    peer_side = ("fleetrun.plugins", "fleetrun.plugins.relay", "fleetrun.plugins.relay.protocol")
    code = (
        "import sys, json\n"
        "from fleetrun.plugins.relay.peer.verbs import fast_main\n"
        "r = fast_main(sys.argv[1:], sys.stdout, sys.stderr)\n"
        "print(json.dumps({'ret': r, 'plugins': sorted(m for m in sys.modules if m.startswith('fleetrun.plugins.')"
        f" and m not in {peer_side!r} and not m.startswith('fleetrun.plugins.relay.peer')),"
        " 'ledger': 'fleetrun.pluginmanager' in sys.modules}))\n"
    )
    env = dict(os.environ, FLEETRUN_HOME=str(tmp_path / "home"))

    def run(*args: str) -> tuple[list[str], dict]:
        p = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=60)
        lines = p.stdout.strip().splitlines()
        return lines[:-1], json.loads(lines[-1])

    out, facts = run("host", "status", "--json", "--attempt", "task_t_1_a1")
    assert facts == {"ret": 0, "plugins": [], "ledger": False}
    assert json.loads(out[0]) == {"status": {"state": "died"}}
    out, facts = run(
        "--home", str(tmp_path / "other"), "host", "log", "--json", "--attempt", "task_t_1_a1", "--offset", "0"
    )
    assert facts["ret"] == 0 and json.loads(out[0])["log_size"] == 0
    out, facts = run("host", "verify-status", "--json", "--attempt", "task_t_1_a1", "--idx", "0")
    assert facts["ret"] == 1 and json.loads(out[0]) == {"error": "no such verifier run here", "unknown": True}
    for other in (["host", "probe", "--json"], ["-p", "x", "host", "status", "--attempt", "a"], ["status"]):
        assert run(*other)[1]["ret"] is None  # not a fast verb: the full CLI answers it


def test_only_a_role_or_an_unfetchable_reviewed_task_stays_here():
    from fleetrun.plugins.placement import stays_local
    from fleetrun.taskspec import TaskSpec, VerifySpec

    def spec(*kinds: str, **kw: object) -> TaskSpec:
        return TaskSpec(name="t", prompt="p", cwd="/", verify=[VerifySpec(kind=k, text="x") for k in kinds], **kw)  # type: ignore[arg-type]

    assert stays_local(spec("brain", "agent", git_ref="main")) is None  # fetched back: may go to a peer
    assert stays_local(spec("run", git_ref="main")) is None
    assert stays_local(spec("run")) is None
    assert stays_local(spec("run", "brain")) == "a brain verifier and no git_ref"
    assert stays_local(spec("agent")) == "an agent verifier and no git_ref"
    assert stays_local(spec("brain", git_ref="main", role="backend")) == "a role"


def where_tasks(fleeter) -> None:
    fleeter.write_tasks("""
        [[task]]
        name = "api"
        cwd = "repo"
        prompt = "Write API.txt."
        git_ref = "main"
        peer = "mini"

          [[task.verify]]
          run = "test -f API.txt"
    """)


def test_a_done_peer_tasks_branch_is_fetched_home_and_the_run_says_where(fleeter, fake_claude, peer_lab):
    """A DONE task on a peer, with neither a dependent nor a verifier that runs here,
    has its branch fetched into this machine's repository by default; the end summary,
    ``logs`` and the JUnit report say where it ran and where its branch is (issue 22)."""
    import xml.etree.ElementTree as ET

    repo = fleeter.make_repo()
    mini = peer_lab.private_machine("mini", repo)
    mini.pair(fleeter)
    where_tasks(fleeter)
    fake_claude.script(api=[{"actions": [["write", "API.txt", "GET /things\n"], ["commit", "add api"]]}])
    r = fleeter.run("tasks.toml", "--junitxml", "r.xml")
    assert r.ret == 0, r.stdout + r.stderr
    api = fleeter.task("api")
    assert (api.state.value, api.host) == ("DONE", "mini")
    # the branch is here, at the peer's commit (`git branch` in this machine's repository)
    assert api.branch in fleeter.git(repo, "branch", "--list", "fleetrun/*")
    assert fleeter.git(repo, "rev-parse", api.branch) == fleeter.git(mini.clone, "rev-parse", api.branch)
    # ... and no fetched worktree is left behind: only the branch
    assert not (fleeter.home / "worktrees" / f"api-{api.id}-fetched").exists()
    where = f"ran on mini; branch {api.branch} fetched into {repo}"
    r.fnmatch_lines(["=== where the work is ===", f"api: {where}", "=== 1 done in * ==="])
    fleeter.run("logs", "api").fnmatch_lines([f"where: {where}"])
    (tc,) = ET.parse(fleeter.path / "r.xml").getroot().iter("testcase")
    assert f"where: {where}" in (tc.findtext("system-out") or "").splitlines()
    # its clean worktree on the peer was removed after DONE: shown as removed, not as a path on mini
    (wt,) = [a.workspace["path"] for a in fleeter.ledger().attempts(api.id)]
    assert not os.path.exists(wt) or not wt.startswith(str(mini.home))
    assert list((mini.home / "worktrees").iterdir()) == []
    fleeter.run("logs", "api").fnmatch_lines([f"worktree: removed (was {wt} on mini)"])
    (row,) = [line for line in fleeter.run("status").stdout.splitlines() if line.startswith("api ")]
    assert "(on mini)" not in row and row.split()[8] == "-", row  # WORKTREE
    assert json.loads(fleeter.run("status", "--json").stdout)[0]["worktree"] is None


def test_fetch_back_false_leaves_a_peer_tasks_branch_on_the_peer_and_says_so(fleeter, fake_claude, peer_lab):
    import xml.etree.ElementTree as ET

    repo = fleeter.make_repo()
    mini = peer_lab.private_machine("mini", repo)
    mini.pair(fleeter)
    fleeter.write_config((fleeter.home / "config.toml").read_text() + "\n[relay]\nfetch_back = false\n")
    where_tasks(fleeter)
    fake_claude.script(api=[{"actions": [["write", "API.txt", "GET /things\n"], ["commit", "add api"]]}])
    r = fleeter.run("tasks.toml", "--junitxml", "r.xml")
    assert r.ret == 0, r.stdout + r.stderr
    api = fleeter.task("api")
    assert api.branch not in fleeter.git(repo, "branch", "--list", "fleetrun/*")
    assert "add api" in fleeter.git(mini.clone, "log", "--format=%s", "-1", api.branch)
    where = f"ran on mini; branch {api.branch} is on mini (not fetched here)"
    r.fnmatch_lines(["=== where the work is ===", f"api: {where}"])
    fleeter.run("logs", "api").fnmatch_lines([f"where: {where}"])
    (tc,) = ET.parse(fleeter.path / "r.xml").getroot().iter("testcase")
    assert f"where: {where}" in (tc.findtext("system-out") or "").splitlines()


# `git bundle unbundle` here fails as git does on a full disk while the flag file is there
FULL_DISK_UNBUNDLE = """#!/bin/sh
case "$*" in
  *" bundle unbundle "*)
    if [ -e "{flags}/full" ]; then
      echo x >> "{flags}/refused"
      echo "fatal: unable to write loose object file: No space left on device" >&2
      exit 128
    fi ;;
esac
exec "{git}" "$@"
"""


def test_a_fetch_back_the_full_disk_refused_is_waited_out_before_done(fleeter, fake_claude, peer_lab, monkeypatch):
    """Found by the soak: the fetch of a DONE peer task's branch failed on a full disk,
    twice (after the attempt, and again at the handoff), and the task went DONE with its
    branch only on the peer: its dependent with ``base = "dependencies"`` then went
    NEEDS_HUMAN ("not in the repository"). A fetch a full disk refused clears by itself:
    the task waits in VERIFYING, says why, tries again, and is DONE once its branch is
    here; the dependent merges it."""

    repo = fleeter.make_repo()
    mini = peer_lab.private_machine("mini", repo)
    mini.pair(fleeter)
    flags = fleeter.git_first_on_path(FULL_DISK_UNBUNDLE)
    (flags / "full").touch()
    fleeter.write_tasks("""
        [[task]]
        name = "api"
        cwd = "repo"
        prompt = "Write API.txt."
        git_ref = "main"
        peer = "mini"

        [[task]]
        name = "client"
        cwd = "repo"
        prompt = "Use the API."
        git_ref = "main"
        depends_on = ["api"]
        base = "dependencies"
    """)
    fake_claude.script(
        **{
            "api": [{"actions": [["write", "API.txt", "GET /things\\n"], ["commit", "add api"]]}],
            "client": [{"actions": [["write", "client.txt", "x"], ["commit", "client"]]}],
        }
    )
    proc = fleeter.popen("tasks.toml")
    try:
        deadline = time.monotonic() + 120
        while not (flags / "refused").exists() or len((flags / "refused").read_text().split()) < 2:
            assert time.monotonic() < deadline and proc.poll() is None, "the fetch was never refused twice"
            time.sleep(0.1)
        # refused after the attempt and again at the handoff: the task has not gone DONE
        assert fleeter.task("api").state.value == "VERIFYING"
        (flags / "full").unlink()  # the disk has room again
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, out.decode() + err.decode()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    api, client = fleeter.task("api"), fleeter.task("client")
    assert (api.state.value, client.state.value) == ("DONE", "DONE")
    assert fleeter.git(repo, "rev-parse", api.branch) == fleeter.git(mini.clone, "rev-parse", api.branch)
    assert (
        subprocess.run(["git", "-C", str(repo), "merge-base", "--is-ancestor", api.branch, client.branch]).returncode
        == 0
    )
    assert any("No space left on device" in n and "again in" in n for n in notes(fleeter, api)), notes(fleeter, api)

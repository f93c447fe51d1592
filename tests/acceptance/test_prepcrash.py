"""A supervisor killed inside a workspace's preparation (issue 21 item 4): the
``worktree`` plugin makes a dependent's worktree and branch, then merges its
dependencies (``base = "dependencies"``); a ``kill -9`` between the two, or between two
merges, must never give a DONE without the dependencies' work. The restart finds the
worktree, checks each step of its preparation, and completes what is missing.

The kill is made deterministic by a ``git`` wrapper first on PATH: the Nth merge
fleetrun runs (``merge --no-ff``) SIGKILLs the ``fleetrun`` process up its parent
chain, once, then every later git runs as the real one.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from fleetrun.crash import CRASH_EXIT
from tests.test_security_peer import Peer, attempt, git, make_repo, task

from .test_crash_points import _no_strays  # noqa: F401 (nothing a test starts outlives it)
from .test_depbase import chain, two_writers

#: A shell function for a git wrapper: SIGKILL the first process up the parent chain
#: whose command line names fleetrun (the supervisor), then exit 1 as a git the kill cut
#: short; ``{flags}/killed`` says it was done (test_diskmerge's wrapper uses it too).
KILL_FLEETRUN = """kill_fleetrun() {{
  touch "{flags}/killed"
  pid=$PPID
  while [ "$pid" -gt 1 ]; do
    if tr '\\0' ' ' < /proc/$pid/cmdline | grep -q fleetrun; then
      kill -KILL "$pid"
      sleep 5
      exit 1
    fi
    pid=$(awk '{{print $4}}' /proc/$pid/stat)
  done
  echo "no fleetrun process above $$" >> "{flags}/log"
}}
"""

# At the merge numbered $(cat kill-at) (1 = the first) of fleetrun's own (`merge --no-ff`),
# kill the supervisor, once: the flag `killed` makes every later git the real one.
WRAPPER = (
    "#!/bin/sh\n"
    + KILL_FLEETRUN
    + """case "$*" in
  *" merge --no-ff "*)
    if [ ! -e "{flags}/killed" ]; then
      echo x >> "{flags}/merges"
      if [ "$(wc -l < "{flags}/merges")" -ge "$(cat "{flags}/kill-at")" ]; then
        kill_fleetrun
      fi
    fi ;;
esac
exec "{git}" "$@"
"""
)


def kill_at_merge(fleeter: Any, monkeypatch: Any, n: int = 1) -> Path:
    """Put the wrapper first on PATH, set to kill the supervisor at fleetrun's ``n``th
    merge; :return: its flags folder."""
    flags = fleeter.git_first_on_path(WRAPPER)
    (flags / "kill-at").write_text(f"{n}\n")
    return flags


def killed_then_finished(fleeter: Any, flags: Path) -> Any:
    """The run killed at the merge, then ``fleetrun work --until-idle`` to the end."""
    r = fleeter.runsub("tasks.toml", timeout=120)
    assert r.ret == -signal.SIGKILL, (
        f"the supervisor was not killed at the merge (exit {r.ret}):\n{r.stdout}\n{r.stderr}"
    )
    assert (flags / "killed").exists()
    assert not (flags / "log").exists(), (flags / "log").read_text()
    return fleeter.runsub("work", "--until-idle", timeout=120)


def is_ancestor(fleeter: Any, repo: Path, older: str, newer: str) -> bool:
    try:
        fleeter.git(repo, "merge-base", "--is-ancestor", older, newer)
        return True
    except AssertionError:
        return False


def merge_subjects(fleeter: Any, repo: Path, branch: str) -> list[str]:
    return fleeter.git(repo, "log", "--merges", "--format=%s", branch).strip().splitlines()


def test_a_supervisor_killed_before_the_merge_still_merges_the_dependency(fleeter, fake_claude, monkeypatch):
    repo = chain(fleeter, verify="test -f api.py")  # a verifier that does not look for the dependency's work
    flags = kill_at_merge(fleeter, monkeypatch)
    fake_claude.script(
        **{
            "user-schema": [{"actions": [["write", "schema.sql", "CREATE TABLE users"]]}],
            "user-api": [
                {
                    "actions": [
                        ["bash", "git show HEAD:schema.sql > saw-schema.txt"],
                        ["write", "api.py", "# api"],
                        ["commit", "api"],
                    ]
                }
            ],
        }
    )
    r = killed_then_finished(fleeter, flags)
    assert r.ret == 0, r.stdout + r.stderr
    assert fleeter.states() == {"user-schema": "DONE", "user-api": "DONE"}
    schema, api = fleeter.task("user-schema"), fleeter.task("user-api")
    # the dependent's branch holds the dependency's head, merged once, and its agent saw it
    assert is_ancestor(fleeter, repo, schema.branch, api.branch)
    assert merge_subjects(fleeter, repo, api.branch) == [f"fleetrun: merge user-schema ({schema.branch}) into user-api"]
    assert fleeter.git(repo, "show", f"{api.branch}:saw-schema.txt").strip() == "CREATE TABLE users"
    (call,) = fake_claude.calls("user-api")
    assert "merged into this worktree" in call["prompt"]


def three_deps(fleeter: Any) -> Path:
    repo = fleeter.make_repo()
    fleeter.write_tasks("""
        [[task]]
        name = "one"
        cwd = "repo"
        prompt = "Write one."
        git_ref = "main"

        [[task]]
        name = "two"
        cwd = "repo"
        prompt = "Write two."
        git_ref = "main"

        [[task]]
        name = "three"
        cwd = "repo"
        prompt = "Write three."
        git_ref = "main"

        [[task]]
        name = "all"
        cwd = "repo"
        prompt = "Use them all."
        git_ref = "main"
        depends_on = ["one", "two", "three"]
        base = "dependencies"

          [[task.verify]]
          run = "test -f all.txt"
    """)
    return repo


def test_a_supervisor_killed_between_two_merges_merges_the_rest_once(fleeter, fake_claude, monkeypatch):
    repo = three_deps(fleeter)
    flags = kill_at_merge(fleeter, monkeypatch, 2)  # "one" is merged, "two" and "three" are not
    fake_claude.script(
        **{
            "one": [{"actions": [["write", "1.txt", "1"], ["commit", "one"]]}],
            "two": [{"actions": [["write", "2.txt", "2"], ["commit", "two"]]}],
            "three": [{"actions": [["write", "3.txt", "3"], ["commit", "three"]]}],
            "all": [{"actions": [["write", "all.txt", "all"], ["commit", "all"]]}],
        }
    )
    r = killed_then_finished(fleeter, flags)
    assert r.ret == 0, r.stdout + r.stderr
    assert fleeter.states() == {"one": "DONE", "two": "DONE", "three": "DONE", "all": "DONE"}
    every = fleeter.task("all")
    deps = {n: fleeter.task(n).branch for n in ("one", "two", "three")}
    for name, branch in deps.items():
        assert is_ancestor(fleeter, repo, branch, every.branch), name
    # each dependency merged exactly once, in depends_on order
    assert merge_subjects(fleeter, repo, every.branch)[::-1] == [
        f"fleetrun: merge {n} ({b}) into all" for n, b in deps.items()
    ]
    assert len(fake_claude.calls("all")) == 1


@pytest.mark.parametrize("on_conflict", ["human", "agent"])
def test_a_conflict_after_the_crash_has_the_outcome_on_conflict_says(fleeter, fake_claude, monkeypatch, on_conflict):
    # killed at the first merge (left's); the restart merges left, then right conflicts
    # with it: the same outcome as a prepare that never crashed
    extra = 'on_conflict = "agent"' if on_conflict == "agent" else ""
    repo, steps = two_writers(fleeter, extra=extra)
    flags = kill_at_merge(fleeter, monkeypatch)
    fake_claude.script(
        **steps, both=[{"actions": [["write", "shared.txt", "merged\n"], ["commit", "resolve the merge"]]}]
    )
    r = killed_then_finished(fleeter, flags)
    both, left, right = fleeter.task("both"), fleeter.task("left"), fleeter.task("right")
    if on_conflict == "human":
        assert r.ret == 1, r.stdout + r.stderr
        assert (both.state.value, both.reason) == ("NEEDS_HUMAN", "merge_conflict:shared.txt")
        assert fake_claude.calls("both") == []
        wt = Path(both.worktree)
        assert "<<<<<<<" in (wt / "shared.txt").read_text()
        assert (wt / "L.txt").exists()
        notes = [n for _, n in fleeter.ledger().notes(both.id)]
        assert any(f"merging right (branch {right.branch})" in n and "shared.txt" in n for n in notes), notes
    else:
        assert r.ret == 0, r.stdout + r.stderr
        assert both.state.value == "DONE"
        (call,) = fake_claude.calls("both")
        assert call["prompt"].startswith("## A merge conflict to resolve first")
        assert f"right (branch {right.branch})" in call["prompt"]
        for dep in (left, right):
            assert is_ancestor(fleeter, repo, dep.branch, both.branch), dep.name


def test_a_reused_worktree_whose_head_left_the_task_branch_is_not_worked_in(fleeter, fake_claude):
    # step 2 of a preparation, checked on reuse: the agent moved its worktree onto
    # another branch and committed everything there (so no collect saw it); its retry
    # must not start on that branch, whose work would never reach the task's
    repo = fleeter.make_repo()
    fleeter.write_tasks("""
        [[task]]
        name = "t"
        cwd = "repo"
        prompt = "Write t.txt."
        git_ref = "main"
        max_retries = 1

          [[task.verify]]
          run = "test -f t.txt"
    """)
    fake_claude.script(
        t=[
            {"actions": [["bash", "git checkout -q -b elsewhere"], ["write", "x.txt", "x"], ["commit", "elsewhere"]]},
            {"actions": [["write", "t.txt", "t"], ["commit", "t"]]},
        ]
    )
    r = fleeter.run("tasks.toml")
    assert r.ret == 1, r.stdout + r.stderr
    t = fleeter.task("t")
    assert t.state.value == "NEEDS_HUMAN"
    assert t.reason.startswith("worktree_tampered:its HEAD is refs/heads/elsewhere, not the task's branch"), t.reason
    assert len(fake_claude.calls("t")) == 1
    assert fleeter.git(repo, "rev-parse", t.branch).strip() == fleeter.git(repo, "rev-parse", "main").strip()


def test_a_conflict_left_to_the_agent_and_a_crash_before_it_was_recorded_still_names_what_is_pending(
    fleeter, fake_claude
):
    # on_conflict = "agent": right's merge stops on a conflict with left's, third is not
    # merged yet; the supervisor dies before the attempt records that (after_worktree,
    # the dependent's is the 4th). The restart reads the stopped merge from the worktree:
    # the agent is told which merge stopped and that third is still to merge (on main it
    # was told of "a merge", nothing pending, and third was never merged)
    repo, steps = two_writers(fleeter, extra='on_conflict = "agent"')
    tasks = (fleeter.path / "tasks.toml").read_text()
    tasks = tasks.replace('depends_on = ["left", "right"]', 'depends_on = ["left", "right", "third"]')
    tasks = tasks.replace(
        'run = "test \\"$(cat shared.txt)\\" = merged && test -f L.txt && test -f R.txt"', 'run = "test -f T.txt"'
    )
    fleeter.write_tasks(
        tasks
        + """
        [[task]]
        name = "third"
        cwd = "repo"
        prompt = "Write T."
        git_ref = "main"
    """
    )
    # the agent concludes the stopped merge and leaves third unmerged; its verifier fails,
    # and the retry's preparation merges third before its agent starts
    fake_claude.script(
        **steps,
        third=[{"actions": [["write", "T.txt", "t"], ["commit", "third"]]}],
        both=[
            {"actions": [["write", "shared.txt", "merged\n"], ["commit", "resolve the merge"]]},
            {"actions": [["bash", "test -f T.txt"]]},
        ],
    )
    r = fleeter.runsub("tasks.toml", env={"FLEETRUN_CRASH_AT": "after_worktree@4"}, timeout=120)
    assert r.ret == CRASH_EXIT, r.stdout + r.stderr
    both, right, third = fleeter.task("both"), fleeter.task("right"), fleeter.task("third")
    assert both.state.value == "ASSIGNED" and fake_claude.calls("both") == []
    r = fleeter.runsub("work", "--until-idle", timeout=120)
    assert r.ret == 0, r.stdout + r.stderr
    first, second = fake_claude.calls("both")
    prompt = first["prompt"]
    assert prompt.startswith("## A merge conflict to resolve first")
    assert f"Merging right (branch {right.branch}) stopped on a conflict in: shared.txt." in prompt
    assert f"`git merge --no-ff {third.branch}` (third)" in prompt
    assert "conflict" not in second["prompt"].lower()
    both = fleeter.task("both")
    assert both.state.value == "DONE"
    assert merge_subjects(fleeter, repo, both.branch)[0] == f"fleetrun: merge third ({third.branch}) into both"
    for name in ("left", "right", "third"):
        assert is_ancestor(fleeter, repo, fleeter.task(name).branch, both.branch), name


# -- the peer side: ``fleetrun host prepare`` runs the same preparation --------------


@pytest.fixture
def peer(tmp_path: Path) -> Any:
    """A peer's home, its verbs run as sshd runs them (tests/test_security_peer.py)."""
    from sshd import kill_leftovers

    home = tmp_path / "peerhome"
    home.mkdir(mode=0o700)
    yield Peer(home)
    kill_leftovers(home)


def test_a_peer_does_not_prepare_a_task_that_merges_its_dependencies(peer, tmp_path):
    # placement keeps such a task on the supervising machine, where the dependencies'
    # branches are; a request for one is refused by name (on main: a KeyError's text)
    repo = make_repo(tmp_path / "repo")
    t = task(repo, deps=["task_m0abc123def_9"])
    t["spec"].update(depends_on=["schema"], base="dependencies")
    code, r = peer.host("prepare", stdin={"task": t, "attempt": attempt()})
    assert code == 1, r
    assert r["error"].startswith('a task with base = "dependencies" is prepared on the supervising machine'), r
    assert git(repo, "worktree", "list").count("\n") == 1  # nothing was made


def test_a_peer_does_not_reuse_a_worktree_whose_head_left_the_task_branch(peer, tmp_path):
    # the peer's worktree kept for a retry (or found again after a crash mid-prepare):
    # its agent moved it onto another branch, so the next prepare refuses it
    repo = make_repo(tmp_path / "repo")
    code, r = peer.host("prepare", stdin={"task": task(repo), "attempt": attempt()})
    assert code == 0, r
    root = Path(r["workspace"]["root"])
    git(root, "checkout", "-q", "-b", "elsewhere")
    code, r = peer.host("prepare", stdin={"task": task(repo), "attempt": attempt(n=2)})
    assert code == 1, r
    assert "its HEAD is refs/heads/elsewhere, not the task's branch" in r["error"], r
    # put back on its branch, it is reused
    git(
        root,
        "checkout",
        "-q",
        r_branch := git(repo, "for-each-ref", "--format=%(refname:short)", "refs/heads/fleetrun/").split()[0],
    )
    code, r = peer.host("prepare", stdin={"task": task(repo), "attempt": attempt(n=3)})
    assert code == 0 and r["workspace"]["branch"] == r_branch, r


# The first merge of fleetrun's own fails as git does when the disk is full, once (git
# names the file it could not write, not the full disk: seen in the soak).
FULL_DISK_WRAPPER = """#!/bin/sh
case "$*" in
  *" merge --no-ff "*)
    if [ ! -e "{flags}/failed" ]; then
      touch "{flags}/failed"
      echo "error: unable to write file schema.sql" >&2
      exit 128
    fi ;;
esac
exec "{git}" "$@"
"""


def test_a_merge_the_full_disk_refused_is_waited_out_not_sent_to_a_human(fleeter, fake_claude, monkeypatch):
    """Found by the soak: a dependency merge git could not write (a full disk) is a
    condition that clears by itself: the dependent backs off and merges again, it does
    not go NEEDS_HUMAN (nor its own dependents with it)."""
    repo = chain(fleeter, verify="test -f api.py")
    flags = fleeter.git_first_on_path(FULL_DISK_WRAPPER)
    fake_claude.script(
        **{
            "user-schema": [{"actions": [["write", "schema.sql", "CREATE TABLE users"]]}],
            "user-api": [{"actions": [["write", "api.py", "# api"], ["commit", "api"]]}],
        }
    )
    r = fleeter.runsub("tasks.toml", timeout=120)
    assert (flags / "failed").exists()
    assert r.ret == 0, r.stdout + r.stderr
    assert fleeter.states() == {"user-schema": "DONE", "user-api": "DONE"}
    schema, api = fleeter.task("user-schema"), fleeter.task("user-api")
    assert is_ancestor(fleeter, repo, schema.branch, api.branch)
    causes = [t.cause for t in fleeter.ledger().transitions(api.id)]
    assert any("unable to write file schema.sql" in c for c in causes), causes
    assert [t.to_state for t in fleeter.ledger().transitions(api.id)].count("NEEDS_HUMAN") == 0

"""`fleetrun gc` and ended tasks (issue 14, "Finding and cleaning up what is left"):
the worktrees of DONE, NEEDS_HUMAN and CANCELLED tasks are collected with the checks
orphans get (dirty or holding commits found on no other branch: kept unless
--force); a task that has not ended keeps its worktree; `gc --branches` lists, and
with --yes deletes, the branches fleetrun created for ended tasks that are merged
into their git_ref or were never DONE, and never a branch of the user's."""

from __future__ import annotations

from pathlib import Path

import pytest

TASKS = """
[[task]]
name = "{name}"
cwd = "repo"
prompt = "p"
git_ref = "main"
max_retries = 0
  [[task.verify]]
  run = "{verify}"
"""


def run_task(fleeter, fake_claude, name: str, actions: list, verify: str = "true") -> object:
    fleeter.write_tasks(TASKS.format(name=name, verify=verify), name=f"{name}.toml")
    fake_claude.script(**{name: [{"actions": actions}]})
    fleeter.run(f"{name}.toml")
    return fleeter.task(name)


def branches(fleeter, repo: Path) -> set[str]:
    return set(fleeter.git(repo, "for-each-ref", "--format=%(refname:short)", "refs/heads").split())


@pytest.fixture
def repo(fleeter):
    return fleeter.make_repo()


def test_gc_collects_the_worktree_of_a_needs_human_task(fleeter, fake_claude, repo):
    """The issue: a NEEDS_HUMAN task's worktree was never collected, and after cancel
    gc said `nothing to collect`."""
    empty = run_task(fleeter, fake_claude, "empty", [], verify="false")
    work = run_task(fleeter, fake_claude, "work", [["write", "w.txt", "x"]], verify="false")
    assert empty.state.value == work.state.value == "NEEDS_HUMAN"
    r = fleeter.run("gc")
    assert r.ret == 0, r.stdout + r.stderr
    r.fnmatch_lines(
        [
            f"worktree of needs_human task empty {empty.id}: {empty.worktree} (clean)",
            f"worktree of needs_human task work {work.id}: {work.worktree} (1 commit(s) on {work.branch} found on no "
            "other branch): --yes keeps it, --force removes it",
        ]
    )
    assert Path(empty.worktree).exists()
    r = fleeter.run("gc", "--yes")
    r.fnmatch_lines(
        [
            f"removed worktree {empty.worktree} (branch {empty.branch} stays)",
            f"kept {work.worktree}: 1 commit(s) on {work.branch} found on no other branch*",
        ]
    )
    assert not Path(empty.worktree).exists() and Path(work.worktree).exists()
    assert fleeter.task("empty").worktree is None and fleeter.task("empty").branch == empty.branch
    # cancelling it changes nothing about what gc says of it
    assert fleeter.run("cancel", "work").ret == 0
    fleeter.run("gc").fnmatch_lines([f"worktree of cancelled task work {work.id}: {work.worktree} (1 commit(s)*"])
    r = fleeter.run("gc", "--yes", "--force")
    r.fnmatch_lines([f"removed worktree {work.worktree} (branch {work.branch} stays)"])
    assert {empty.branch, work.branch} <= branches(fleeter, repo)


def test_gc_collects_a_done_tasks_kept_worktree_only_with_force_when_dirty(fleeter, fake_claude, repo):
    done = run_task(fleeter, fake_claude, "built", [["write", "w.txt", "x"]], verify="touch build.out")
    assert done.state.value == "DONE" and Path(done.worktree).exists()  # dirty after DONE: kept
    fleeter.run("gc", "--yes").fnmatch_lines([f"kept {done.worktree}: uncommitted changes*"])
    assert (Path(done.worktree) / "build.out").exists()
    fleeter.run("gc", "--yes", "--force").fnmatch_lines([f"removed worktree {done.worktree}*"])
    assert not Path(done.worktree).exists() and fleeter.task("built").worktree is None


def test_gc_never_touches_the_worktree_of_a_task_that_has_not_ended(fleeter, fake_claude, repo):
    t = run_task(fleeter, fake_claude, "again", [], verify="false")
    # sent back to the queue: its next attempt reuses the worktree
    assert fleeter.run("retry", "again").ret == 0
    assert not fleeter.task("again").state.terminal
    r = fleeter.run("gc", "--yes", "--force", "--branches")
    assert r.ret == 0, r.stdout + r.stderr
    r.no_fnmatch_line(f"*{t.worktree}*")
    r.no_fnmatch_line(f"*{t.branch}*")
    assert Path(t.worktree).exists() and t.branch in branches(fleeter, repo)


def test_gc_branches_lists_then_deletes_only_fleetruns_branches_of_ended_tasks(fleeter, fake_claude, repo):
    merged = run_task(fleeter, fake_claude, "merged", [["write", "m.txt", "x"]])
    unmerged = run_task(fleeter, fake_claude, "unmerged", [["write", "u.txt", "x"]])
    failed = run_task(fleeter, fake_claude, "failed", [["write", "f.txt", "x"]], verify="false")
    assert [t.state.value for t in (merged, unmerged, failed)] == ["DONE", "DONE", "NEEDS_HUMAN"]
    fleeter.git(repo, "merge", "-q", "--no-edit", merged.branch)
    fleeter.git(repo, "branch", "feature")  # the user's own: never touched
    fleeter.git(repo, "branch", "fleetrun/not-from-a-task")  # fleetrun's prefix, but no task's
    before = branches(fleeter, repo)

    r = fleeter.run("gc", "--branches")
    assert r.ret == 0, r.stdout + r.stderr
    r.fnmatch_lines(
        [
            f"branch {merged.branch} of done task merged {merged.id}: merged into main",
            f"branch {unmerged.branch} of done task unmerged {unmerged.id}: kept, DONE with 1 commit(s) not in main "
            "(merge it, or delete it by hand)",
            f"branch {failed.branch} of needs_human task failed {failed.id}: never DONE, 1 commit(s) not in main, "
            f"checked out in its worktree {failed.worktree}: --yes keeps it (the worktree stays), --force removes both",
            "3 branches of ended tasks: `fleetrun gc --branches --yes` deletes 1 and keeps 2*",
        ]
    )
    for b in ("feature", "fleetrun/not-from-a-task", "main"):
        r.no_fnmatch_line(f"branch {b} *")
    assert branches(fleeter, repo) == before  # listing deletes nothing

    r = fleeter.run("gc", "--branches", "--yes", "--force")
    assert r.ret == 0, r.stdout + r.stderr
    r.fnmatch_lines([f"removed worktree {failed.worktree}*"])
    r.fnmatch_lines(
        [
            f"deleted branch {merged.branch} (was *; `git branch {merged.branch} *` brings it back while git keeps the commit)"
        ]
    )
    r.fnmatch_lines([f"deleted branch {failed.branch} (was *"])
    assert branches(fleeter, repo) == before - {merged.branch, failed.branch}
    assert fleeter.task("merged").branch is None and fleeter.task("failed").branch is None
    assert fleeter.task("unmerged").branch == unmerged.branch
    logs = fleeter.run("logs", "failed")
    logs.fnmatch_lines([f"*note: gc deleted branch {failed.branch} (was *"])
    # what is left: the DONE task's work, to merge
    assert fleeter.run("gc", "--branches").outlines == [
        "nothing to collect: every worktree and attempt folder belongs to a task",
        f"branch {unmerged.branch} of done task unmerged {unmerged.id}: kept, DONE with 1 commit(s) not in main "
        "(merge it, or delete it by hand)",
        "1 branch of an ended task: `fleetrun gc --branches --yes` deletes 0 and keeps 1",
    ]


def test_gc_branches_keeps_a_branch_a_live_dependent_builds_on(fleeter, fake_claude, repo):
    fleeter.write_tasks("""
        [[task]]
        name = "base"
        cwd = "repo"
        prompt = "p"
        git_ref = "main"
          [[task.verify]]
          run = "true"

        [[task]]
        name = "next"
        cwd = "repo"
        prompt = "p"
        git_ref = "main"
        depends_on = ["base"]
        requires = ["fleetrun-test-no-such-tool"]
    """)
    fake_claude.script(base=[{"actions": [["write", "b.txt", "x"]]}])
    fleeter.run("tasks.toml")  # base is DONE; next waits for a tool no machine has
    base = fleeter.task("base")
    assert base.state.value == "DONE" and not fleeter.task("next").state.terminal
    fleeter.git(repo, "merge", "-q", "--no-edit", base.branch)
    r = fleeter.run("gc", "--branches", "--yes")
    r.fnmatch_lines(
        [f"kept branch {base.branch} of done task base {base.id}: task next depends on it and has not ended"]
    )
    assert base.branch in branches(fleeter, repo)


def test_gc_without_branches_says_how_many_it_could_delete(fleeter, fake_claude, repo):
    failed = run_task(fleeter, fake_claude, "failed", [], verify="false")
    fleeter.run("gc", "--yes")
    assert not Path(failed.worktree).exists()
    r = fleeter.run("gc")
    assert r.outlines == [
        "nothing to collect: every worktree and attempt folder belongs to a task",
        "1 branch of an ended task can go: `fleetrun gc --branches` lists it",
    ]


def test_an_ended_tasks_tampered_worktree_is_kept_and_force_runs_no_git_in_it(fleeter, fake_claude, repo):
    """The agent rewrote its worktree's .git to name the user's repository itself: gc
    keeps it; --force removes only the folder, runs no git there, and --branches keeps
    the branch while the repository still lists the worktree."""
    t = run_task(fleeter, fake_claude, "evil", [["write", "w.txt", "x"]], verify="false")
    wt = Path(t.worktree)
    (wt / ".git").write_text(f"gitdir: {repo / '.git'}\n")
    (repo / "mine.txt").write_text("the user's uncommitted file")
    r = fleeter.run("gc", "--yes", "--branches")
    r.fnmatch_lines([f"kept {wt}: not a git worktree fleetrun can read*"])
    assert wt.exists()
    r = fleeter.run("gc", "--yes", "--force", "--branches")
    assert r.ret == 0, r.stdout + r.stderr
    r.fnmatch_lines([f"removed folder {wt} (no git was run for it)"])
    assert not wt.exists()
    assert (repo / "mine.txt").read_text() == "the user's uncommitted file"
    assert "mine.txt" in fleeter.git(repo, "status", "--porcelain")
    assert t.branch in branches(fleeter, repo)
    # the repository still lists the worktree: gc says how to forget it, and runs no prune
    r.fnmatch_lines(
        [
            f"kept branch {t.branch} of needs_human task evil {t.id}: checked out in {wt}, a worktree "
            f"that is gone but still listed (`git -C {repo} worktree prune` forgets it)"
        ]
    )


def test_gc_branches_never_takes_a_users_branch_the_ledger_names(fleeter, fake_claude, repo):
    """A task whose recorded branch is not the one fleetrun names for it (a plugin's
    workspace put it on the user's `feature`): not fleetrun's, never listed."""
    t = run_task(fleeter, fake_claude, "odd", [], verify="false")
    fleeter.run("gc", "--yes")
    fleeter.git(repo, "branch", "feature")
    with fleeter.ledger().tx() as cur:
        cur.execute("UPDATE tasks SET branch='feature' WHERE id=?", (t.id,))
    r = fleeter.run("gc", "--branches", "--yes", "--force")
    assert r.ret == 0, r.stdout + r.stderr
    r.no_fnmatch_line("*feature*")
    assert "feature" in branches(fleeter, repo)


def test_gc_branches_says_a_peer_tasks_branch_is_on_the_peer(fleeter, fake_claude, repo):
    t = run_task(fleeter, fake_claude, "far", [], verify="false")
    fleeter.run("gc", "--yes")
    with fleeter.ledger().tx() as cur:  # as if it had run on the peer "mini"
        cur.execute("UPDATE tasks SET host='mini' WHERE id=?", (t.id,))
    r = fleeter.run("gc", "--branches", "--yes")
    r.fnmatch_lines([f"branch {t.branch} of needs_human task far {t.id}: on mini, not touched here"])
    assert t.branch in branches(fleeter, repo)

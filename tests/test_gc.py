"""`fleetrun gc`: worktrees and attempt folders no task owns are listed, and with
--yes removed; a dirty one, or one holding commits found on no other branch, is kept
unless --force; what a task owns is never touched; branches always stay."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture
def setup(fleeter, fake_claude):
    """A real run leaves an owned worktree (of a task sent back to the queue, so not
    ended: its next attempt reuses it) and owned attempt folders; then orphans are made
    by hand next to them. (gc collects the worktrees of ended tasks: test_gc_branches.py.)"""
    repo = fleeter.make_repo()
    fleeter.write_tasks("""
        [[task]]
        name = "owned"
        cwd = "repo"
        prompt = "p"
        git_ref = "main"
        max_retries = 0
          [[task.verify]]
          run = "touch build.out; false"
    """)
    fake_claude.script(owned=[{"actions": [["write", "out.txt", "x"]]}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 1, r.stdout + r.stderr
    assert fleeter.run("retry", "owned").ret == 0
    task = fleeter.task("owned")
    assert not task.state.terminal
    owned_wt = Path(task.worktree)
    assert owned_wt.exists()
    owned_atts = sorted((fleeter.home / "attempts").iterdir())
    assert owned_atts

    wroot = fleeter.home / "worktrees"

    def worktree(name: str, *args: str) -> Path:
        path = wroot / name
        fleeter.git(repo, "worktree", "add", "-q", *args, str(path), "main")
        return path

    clean = worktree("orphan-clean", "-b", "orphan-clean")
    dirty = worktree("orphan-dirty", "-b", "orphan-dirty")
    (dirty / "wip.txt").write_text("work in progress")
    unique = worktree("orphan-unique", "-b", "orphan-unique")
    (unique / "new.txt").write_text("committed work")
    fleeter.git(unique, "add", "new.txt")
    fleeter.git(unique, "commit", "-q", "-m", "only here")
    orphan_att = fleeter.home / "attempts" / "task_gone_0_a1"
    orphan_att.mkdir()
    (orphan_att / "log").write_text("old log\n")
    return {
        "repo": repo,
        "owned_wt": owned_wt,
        "owned_atts": owned_atts,
        "clean": clean,
        "dirty": dirty,
        "unique": unique,
        "orphan_att": orphan_att,
        "wroot": wroot,
    }


def branches(fleeter, repo: Path) -> set[str]:
    return set(fleeter.git(repo, "for-each-ref", "--format=%(refname:short)", "refs/heads").split())


def registered_worktrees(fleeter, repo: Path) -> set[str]:
    out = fleeter.git(repo, "worktree", "list", "--porcelain")
    return {line.split(" ", 1)[1] for line in out.splitlines() if line.startswith("worktree ")}


def test_gc_lists_and_removes_nothing(fleeter, setup):
    s = setup
    r = fleeter.run("gc")
    assert r.ret == 0, r.stdout + r.stderr
    r.fnmatch_lines(
        [
            f"orphan worktree {s['clean']} (clean)",
            f"orphan worktree {s['dirty']} (uncommitted changes): --yes keeps it, --force removes it",
            f"orphan worktree {s['unique']} (*): --yes keeps it, --force removes it",
            f"orphan attempt folder {s['orphan_att']}",
            "4 to collect: `fleetrun gc --yes` removes 2 and keeps 2 (uncommitted changes or commits on no other "
            "branch; `fleetrun gc --yes --force` removes those too; branches always stay)",
        ]
    )
    r.no_fnmatch_line(f"*{s['owned_wt']}*")
    for p in s["owned_atts"]:
        r.no_fnmatch_line(f"*{p}*")
    for key in ("clean", "dirty", "unique", "orphan_att", "owned_wt"):
        assert s[key].exists(), key


def test_gc_yes_removes_clean_orphans_and_keeps_dirty_and_unique(fleeter, setup):
    s = setup
    before = branches(fleeter, s["repo"])
    r = fleeter.run("gc", "--yes")
    assert r.ret == 0, r.stdout + r.stderr
    r.fnmatch_lines(
        [
            f"removed worktree {s['clean']} (branch orphan-clean stays)",
            f"kept {s['dirty']}: uncommitted changes (--force removes the worktree; the branch stays)",
            f"removed attempt folder {s['orphan_att']}",
        ]
    )
    assert not s["clean"].exists() and not s["orphan_att"].exists()
    assert str(s["clean"]) not in registered_worktrees(fleeter, s["repo"])  # pruned, not just deleted
    assert (s["dirty"] / "wip.txt").read_text() == "work in progress"
    # what a task owns is never touched
    assert s["owned_wt"].exists() and (s["owned_wt"] / "build.out").exists()
    assert all(p.exists() for p in s["owned_atts"])
    assert branches(fleeter, s["repo"]) == before  # branches stay
    # a second pass finds what it kept
    fleeter.run("gc").fnmatch_lines(["orphan worktree *orphan-dirty* (uncommitted changes): --yes keeps it*"])


def test_gc_keeps_a_worktree_whose_branch_has_unique_commits(fleeter, setup):
    s = setup
    fleeter.run("gc").fnmatch_lines(
        [
            f"orphan worktree {s['unique']} (1 commit(s) on orphan-unique found on no other branch): --yes keeps it, "
            "--force removes it"
        ]
    )
    r = fleeter.run("gc", "--yes")
    r.fnmatch_lines([f"kept {s['unique']}: 1 commit(s) on orphan-unique found on no other branch (--force*"])
    assert (s["unique"] / "new.txt").exists()


def test_gc_force_removes_them_all_and_the_branches_stay(fleeter, setup):
    s = setup
    before = branches(fleeter, s["repo"])
    r = fleeter.run("gc", "--yes", "--force")
    assert r.ret == 0, r.stdout + r.stderr
    r.fnmatch_lines(
        [
            f"removed worktree {s['dirty']} (branch orphan-dirty stays)",
            f"removed worktree {s['unique']} (branch orphan-unique stays)",
        ]
    )
    assert not s["clean"].exists() and not s["dirty"].exists() and not s["unique"].exists()
    assert branches(fleeter, s["repo"]) == before
    # the unique commit is still on its branch
    assert fleeter.git(s["repo"], "log", "-1", "--format=%s", "orphan-unique").strip() == "only here"
    assert s["owned_wt"].exists() and all(p.exists() for p in s["owned_atts"])
    assert fleeter.run("gc").outlines == ["nothing to collect: every worktree and attempt folder belongs to a task"]


def test_gc_with_nothing_to_collect(fleeter, fake_claude):
    fleeter.make_repo()
    fleeter.write_tasks("""
        [[task]]
        name = "t"
        cwd = "repo"
        prompt = "p"
        git_ref = "main"
    """)
    fake_claude.script(t=[{"actions": [["write", "out.txt", "x"]]}])
    assert fleeter.run("tasks.toml").ret == 0
    r = fleeter.run("gc", "--yes")
    assert r.outlines == ["nothing to collect: every worktree and attempt folder belongs to a task"]
    assert fleeter.run("gc").ret == 0


def test_gc_keeps_a_detached_worktree_with_commits_on_no_branch(fleeter, setup):
    s = setup
    path = s["wroot"] / "orphan-detached"
    fleeter.git(s["repo"], "worktree", "add", "-q", "--detach", str(path), "main")
    (path / "lost.txt").write_text("would be lost")
    fleeter.git(path, "add", "lost.txt")
    fleeter.git(path, "commit", "-q", "-m", "on no branch")
    r = fleeter.run("gc", "--yes")
    assert path.exists(), r.stdout
    r.fnmatch_lines([f"kept {path}: *commit*"])


def test_gc_keeps_a_folder_git_cannot_read(fleeter, setup):
    s = setup
    path = s["wroot"] / "not-a-worktree"
    path.mkdir()
    (path / "notes.txt").write_text("mine")
    r = fleeter.run("gc", "--yes")
    assert (path / "notes.txt").exists(), r.stdout


# -- hostile entries (issue 10): links, plain files, a .git that points elsewhere ---------------


def _user_worktree(fleeter, repo: Path, name: str) -> Path:
    """A clean linked worktree of the user's repository, outside the home, with an
    ignored .env (what `git worktree remove --force` would take with it)."""
    (repo / ".gitignore").write_text(".env\n")
    fleeter.git(repo, "add", ".gitignore")
    fleeter.git(repo, "commit", "-q", "-m", "ignore .env")
    path = fleeter.path / name
    fleeter.git(repo, "worktree", "add", "-q", "-b", name, str(path), "main")
    (path / ".env").write_text("SECRET=1\n")
    return path


def test_gc_does_not_follow_a_link_to_a_users_worktree(fleeter, setup):
    s = setup
    theirs = _user_worktree(fleeter, s["repo"], "users-wt")
    link = s["wroot"] / "evil-link"
    link.symlink_to(theirs)
    fleeter.run("gc").fnmatch_lines([f"orphan link {link} -> {theirs}"])
    r = fleeter.run("gc", "--yes")
    assert r.ret == 0, r.stdout + r.stderr
    r.fnmatch_lines([f"removed link {link} (what it points at is not touched)"])
    assert not os.path.lexists(link)
    assert (theirs / ".env").read_text() == "SECRET=1\n" and (theirs / "README.md").exists()
    assert str(theirs) in registered_worktrees(fleeter, s["repo"])


@pytest.mark.parametrize("where", ["worktrees", "attempts"])
@pytest.mark.parametrize("kind", ["file", "link-to-dir", "dangling-link"])
def test_gc_force_removes_stray_files_and_links_without_crashing(fleeter, setup, where, kind):
    outside = fleeter.path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine")
    entry = fleeter.home / where / f"stray-{kind}"
    if kind == "file":
        entry.write_text("stray")
    elif kind == "link-to-dir":
        entry.symlink_to(outside)
    else:
        entry.symlink_to(fleeter.path / "nowhere")
    r = fleeter.run("gc", "--yes", "--force")
    assert r.ret == 0, r.stdout + r.stderr
    assert "INTERNAL ERROR" not in r.stderr
    word = "file" if kind == "file" else "link"
    r.fnmatch_lines([f"removed {word} {entry}*"])
    assert not os.path.lexists(entry)
    assert (outside / "keep.txt").read_text() == "mine"


def test_gc_does_not_scan_a_linked_worktrees_folder(fleeter, tmp_path):
    """$FLEETRUN_HOME/worktrees itself a link to a folder of the user's: not followed."""
    fleeter.home.mkdir(parents=True, exist_ok=True)
    theirs = tmp_path / "projects"
    (theirs / "app").mkdir(parents=True)
    (theirs / "app" / "main.py").write_text("print(1)\n")
    (fleeter.home / "worktrees").symlink_to(theirs)
    r = fleeter.run("gc", "--yes", "--force")
    assert r.ret == 0, r.stdout + r.stderr
    r.fnmatch_lines([f"*{fleeter.home / 'worktrees'} is a link to {theirs}*not followed*"])
    assert (theirs / "app" / "main.py").exists()


def test_gc_keeps_a_worktree_whose_git_file_points_elsewhere_and_force_runs_no_git_there(fleeter, setup):
    """A folder in worktrees/ whose .git names the user's repository itself (not one of
    its worktrees/ entries): unreadable, kept; --force removes only the folder in the
    home, and runs no git in the user's repository (no prune of its worktree entries)."""
    s = setup
    # a worktree of the user's on a drive that is not mounted now: `git worktree prune`
    # in their repository would forget it
    away = _user_worktree(fleeter, s["repo"], "on-usb")
    import shutil

    shutil.rmtree(away)
    admin_before = sorted(p.name for p in (s["repo"] / ".git" / "worktrees").iterdir())
    assert "on-usb" in admin_before
    bad = s["wroot"] / "redirected"
    bad.mkdir()
    (bad / ".git").write_text(f"gitdir: {s['repo'] / '.git'}\n")
    (bad / "file.txt").write_text("x")
    r = fleeter.run("gc", "--yes")
    r.fnmatch_lines([f"kept {bad}: not a git worktree fleetrun can read*"])
    assert (bad / "file.txt").exists()
    r = fleeter.run("gc", "--yes", "--force")
    assert r.ret == 0, r.stdout + r.stderr
    r.fnmatch_lines([f"removed folder {bad}*"])
    assert not bad.exists()
    assert "on-usb" in sorted(p.name for p in (s["repo"] / ".git" / "worktrees").iterdir())

"""End to end: an agent that tampers with its worktree's ``.git`` cannot make fleetrun
commit anywhere (issue 10, item 1).

A command agent runs in its worktree as an attacker would: it rewrites the ``.git``
file to point at another repository (or at the user's own), replaces it by a symlink,
deletes it, or makes a ``.git`` folder of its own; then it leaves a new file for
``fleetrun_collect_work`` (``git add -A; git commit``) to pick up. fleetrun must commit
nothing anywhere, and the task must stop at NEEDS_HUMAN with ``worktree_tampered:`` and
the reason, without using a retry (a retry would only repeat the attack).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from brainserver import BrainServer

from fleetrun.fleeter import GIT_ENV


def git_state(fleeter: Any, repo: Path, skip_prefix: str = "refs/heads/fleetrun/") -> dict[str, Any]:
    """Every ref (the tip of every branch, tags, stash) and the status of a checkout:
    what must be exactly the same after the run. The task's own branch is left out."""
    refs = {}
    for line in fleeter.git(repo, "for-each-ref", "--format=%(refname) %(objectname)").splitlines():
        name, sha = line.split()
        if not name.startswith(skip_prefix):
            refs[name] = sha
    return {
        "refs": refs,
        "head": fleeter.git(repo, "rev-parse", "HEAD").strip(),
        "symbolic_head": fleeter.git(repo, "symbolic-ref", "-q", "HEAD").strip(),
        "status": fleeter.git(repo, "status", "--porcelain", "--untracked-files=all"),
        # commits reachable from the checkout and its branches and tags (the task's own
        # branch and worktree left out: the clean case commits there)
        "commits": fleeter.git(
            repo, "rev-list", "--count", "--exclude=fleetrun/*", "--branches", "--tags", "HEAD"
        ).strip(),
    }


def has_commit(path: Path) -> bool:
    proc = subprocess.run(
        ["git", "-C", str(path), "rev-parse", "--verify", "-q", "HEAD"],
        capture_output=True,
        env=dict(os.environ, **GIT_ENV),
    )
    return proc.returncode == 0


def setup(fleeter: Any, script: str) -> tuple[Path, Path]:
    """The user's repo, an unrelated repo beside it, and one task whose agent runs
    ``script`` (``sh -c``) in its worktree. Its verifier would pass, and it has
    retries to spare: only the tamper check can stop it."""
    repo = fleeter.make_repo(files={"README.md": "hello\n", "keep.txt": "tracked\n"})
    other = fleeter.make_repo("other", files={"DATA.md": "precious\n"})
    fleeter.write_tasks(f"""
        [agents.evil]
        command = ["sh", "-c", {json.dumps(script)}, "evil", "{{attempt}}"]

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
    return repo, other


def assert_contained(
    fleeter: Any, r: Any, repo: Path, before: dict[Path, dict[str, Any]], why: str, attempts: int = 1
) -> Any:
    assert r.ret == 1, r.stdout + r.stderr
    task = fleeter.task("t1")
    assert task.state.value == "NEEDS_HUMAN", (task.reason, r.stdout + r.stderr)
    assert task.reason.startswith("worktree_tampered:"), task.reason
    # the reason says what happened (read without the test's folder names)
    assert why in task.reason.replace(str(fleeter.path.parent), "<tmp>"), task.reason
    # no retry was used, and no second attempt ran
    assert task.retries == 0
    assert len(fleeter.ledger().attempts(task.id)) == attempts
    assert "VERIFYING" not in fleeter.run("logs", "t1").stdout
    # every repository has exactly what it had
    for path, state in before.items():
        assert git_state(fleeter, path) == state, path
    # and the task's own branch got nothing either (it is still at main)
    main = fleeter.git(repo, "rev-parse", "main").strip()
    assert fleeter.git(repo, "rev-parse", task.branch).strip() == main
    # the worktree is kept for a human to look at, who is told how to start over
    assert task.worktree and Path(task.worktree).exists()
    notes = [text for _, text in fleeter.ledger().notes(task.id)]
    assert any(n.startswith(f"kept worktree {task.worktree} as the agent left it") for n in notes), notes
    return task


def test_git_file_pointing_at_another_repo_commits_nothing(fleeter):
    other = fleeter.path / "other"
    repo, other = setup(fleeter, f"echo 'gitdir: {other}/.git' > .git; echo evil > EVIL.txt")
    before = {repo: git_state(fleeter, repo), other: git_state(fleeter, other)}
    r = fleeter.run("tasks.toml")
    assert_contained(fleeter, r, repo, before, ".git was rewritten to point at <tmp>/w/other/.git")
    assert "EVIL.txt" not in fleeter.git(other, "ls-tree", "-r", "--name-only", "main")
    assert (other / "DATA.md").read_text() == "precious\n"


def test_git_file_pointing_at_the_users_repo_commits_nothing(fleeter):
    repo_path = fleeter.path / "repo"
    repo, other = setup(fleeter, f"echo 'gitdir: {repo_path}/.git' > .git; echo evil > EVIL.txt")
    before = {repo: git_state(fleeter, repo), other: git_state(fleeter, other)}
    r = fleeter.run("tasks.toml")
    assert_contained(fleeter, r, repo, before, ".git was rewritten to point at <tmp>/w/repo/.git")
    assert "EVIL.txt" not in fleeter.git(repo, "ls-tree", "-r", "--name-only", "main")


def test_git_replaced_by_a_symlink_commits_nothing(fleeter):
    other = fleeter.path / "other"
    repo, other = setup(fleeter, f"rm .git && ln -s {other}/.git .git; echo evil > EVIL.txt")
    before = {repo: git_state(fleeter, repo), other: git_state(fleeter, other)}
    r = fleeter.run("tasks.toml")
    assert_contained(fleeter, r, repo, before, ".git is a symlink")


def test_git_deleted_commits_nothing(fleeter):
    # without its .git, git looks further up: here the fleetrun home is itself in a
    # repository (a dotfiles repo, say), which must not get the agent's work either
    fleeter.home.mkdir(parents=True, exist_ok=True)
    fleeter.git(fleeter.home, "init", "-q")
    fleeter.git(fleeter.home, "commit", "-q", "--allow-empty", "-m", "dotfiles")
    repo, other = setup(fleeter, "rm .git; echo evil > EVIL.txt")
    home_refs = fleeter.git(fleeter.home, "for-each-ref", "--format=%(refname) %(objectname)")
    before = {repo: git_state(fleeter, repo), other: git_state(fleeter, other)}
    r = fleeter.run("tasks.toml")
    assert_contained(fleeter, r, repo, before, ".git is missing")
    assert fleeter.git(fleeter.home, "for-each-ref", "--format=%(refname) %(objectname)") == home_refs
    assert fleeter.git(fleeter.home, "rev-list", "--all", "--count").strip() == "1"


def test_git_directory_created_commits_nothing(fleeter):
    repo, other = setup(fleeter, "rm .git && git init -q && echo evil > EVIL.txt")
    before = {repo: git_state(fleeter, repo), other: git_state(fleeter, other)}
    r = fleeter.run("tasks.toml")
    task = assert_contained(fleeter, r, repo, before, ".git is not a regular file")
    assert not has_commit(Path(task.worktree))  # the agent's own repository got nothing


def test_tampered_worktree_is_not_reused_by_the_next_attempt(fleeter):
    # attempt 1 rewrites .git and dies (no commit step runs after a died session);
    # attempt 2 would run in the tampered worktree and have its work committed there
    other = fleeter.path / "other"
    script = f'if [ "$1" = 1 ]; then echo "gitdir: {other}/.git" > .git; exit 1; fi; echo evil > EVIL.txt'
    repo, other = setup(fleeter, script)
    before = {repo: git_state(fleeter, repo), other: git_state(fleeter, other)}
    r = fleeter.run("tasks.toml")
    task = assert_contained(fleeter, r, repo, before, ".git was rewritten to point at <tmp>/w/other", attempts=2)
    assert task.resumes == 1
    atts = fleeter.ledger().attempts(task.id)
    assert atts[-1].outcome == "worktree_tampered"  # the second never started
    assert not (Path(task.worktree) / "EVIL.txt").exists()


def test_untampered_worktree_still_commits_on_its_branch(fleeter):
    # the pinned git still does the ordinary thing
    repo, other = setup(fleeter, "echo fine > GOOD.txt")
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    task = fleeter.task("t1")
    assert "GOOD.txt" in fleeter.git(repo, "ls-tree", "-r", "--name-only", task.branch)
    assert not Path(task.worktree).exists()  # clean after DONE: removed


def test_untampered_worktree_from_a_subfolder_commits_and_shows_the_brain_its_diff(fleeter):
    # a task whose cwd is a folder of the repository: the pin is the worktree's top,
    # the commit and the brain's diff cover the whole worktree
    repo = fleeter.make_repo(files={"README.md": "hello\n", "pkg/a.txt": "a\n"})
    with BrainServer() as brain:
        fleeter.write_config(f'[brain]\nurl = "{brain.url}"\nmodel = "tiny"\n')
        brain.script("PASS")
        fleeter.write_tasks("""
            [agents.ok]
            command = ["sh", "-c", "echo fine > GOOD.txt; echo more > ../TOP.txt"]

            [[task]]
            name = "t1"
            cwd = "repo/pkg"
            agent = "ok"
            git_ref = "main"
            prompt = "p"
              [[task.verify]]
              run = "test -f GOOD.txt"
              [[task.verify]]
              brain = "Is it fine?"
        """)
        r = fleeter.run("tasks.toml")
        prompts = [q.prompt for q in brain.requests]
    assert r.ret == 0, r.stdout + r.stderr
    task = fleeter.task("t1")
    files = fleeter.git(repo, "ls-tree", "-r", "--name-only", task.branch).split()
    assert "pkg/GOOD.txt" in files and "TOP.txt" in files
    (prompt,) = prompts
    assert "pkg/GOOD.txt" in prompt and "+fine" in prompt and "TOP.txt" in prompt


def test_cleanup_keeps_a_worktree_tampered_after_its_commit(fleeter):
    # something the agent left behind rewrites .git after the work was committed (a
    # verifier stands in for it here): after DONE, cleanup must not run git in it or
    # remove it, and says why in the task's notes
    repo, other = setup(fleeter, "echo fine > GOOD.txt")
    tasks = (
        (fleeter.path / "tasks.toml")
        .read_text()
        .replace('run = "true"', 'run = "rm .git && ln -s ' + str(other) + '/.git .git"')
    )
    (fleeter.path / "tasks.toml").write_text(tasks)
    before = {other: git_state(fleeter, other)}
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    task = fleeter.task("t1")
    assert "GOOD.txt" in fleeter.git(repo, "ls-tree", "-r", "--name-only", task.branch).split()
    assert Path(task.worktree).is_dir() and (Path(task.worktree) / "GOOD.txt").exists()
    notes = [text for _, text in fleeter.ledger().notes(task.id)]
    assert any(
        n.startswith(f"kept worktree {task.worktree}: it was tampered with")
        and "is a symlink" in n.replace(str(fleeter.path.parent), "<tmp>")
        for n in notes
    ), notes
    assert git_state(fleeter, other) == before[other]


def test_the_brain_never_reviews_what_a_rewritten_git_points_at(fleeter):
    # the .git is rewritten after the work was committed (a verifier stands in for a
    # process the agent left behind): git run there would diff against the other
    # repository, so the brain must not be asked at all
    repo, other = setup(fleeter, "echo fine > GOOD.txt")
    tamper = f"echo 'gitdir: {other}/.git' > .git"
    tasks = (
        (fleeter.path / "tasks.toml")
        .read_text()
        .replace(
            'run = "true"', f'run = {json.dumps(tamper)}\n          [[task.verify]]\n          brain = "Is it fine?"'
        )
    )
    (fleeter.path / "tasks.toml").write_text(tasks)
    before = {repo: git_state(fleeter, repo), other: git_state(fleeter, other)}
    with BrainServer() as brain:
        fleeter.write_config(f'[brain]\nurl = "{brain.url}"\nmodel = "tiny"\n')
        brain.script("PASS")
        r = fleeter.run("tasks.toml")
        prompts = [q.prompt for q in brain.requests]
    assert prompts == []  # a tampered worktree gets no verdict
    assert r.ret == 1, r.stdout + r.stderr
    task = fleeter.task("t1")
    assert task.state.value == "NEEDS_HUMAN"
    assert task.reason.startswith("worktree_tampered:"), task.reason
    verdicts = fleeter.ledger().verdicts(attempt_id=fleeter.ledger().attempts(task.id)[0].id)
    assert [v.passed for v in verdicts] == [True, False]
    assert "WorktreeTampered" in verdicts[1].reason and "rewritten" in verdicts[1].reason
    for path, state in before.items():
        assert git_state(fleeter, path) == state, path


def test_head_moved_off_the_task_branch_gets_no_commit(fleeter):
    # with git itself, the agent moves its worktree onto another branch: fleetrun's own
    # commit must still go only onto the branch it made for the task
    repo, other = setup(fleeter, "git checkout -q -b elsewhere && echo evil > EVIL.txt")
    r = fleeter.run("tasks.toml")
    assert r.ret == 1, r.stdout + r.stderr
    task = fleeter.task("t1")
    assert task.state.value == "NEEDS_HUMAN"
    assert task.reason.startswith("worktree_tampered:its HEAD is refs/heads/elsewhere, not the task's branch"), (
        task.reason
    )
    main = fleeter.git(repo, "rev-parse", "main").strip()
    assert fleeter.git(repo, "rev-parse", "elsewhere").strip() == main
    assert fleeter.git(repo, "rev-parse", task.branch).strip() == main
    assert task.retries == 0 and len(fleeter.ledger().attempts(task.id)) == 1

"""End to end: no file in a worktree can make fleetrun's git run a command (issue 21,
item 1).

An agent that writes only plain files leaves ``sub/.git/`` (a ``HEAD`` naming a commit,
``objects/info/alternates`` pointing at the repository's objects, and a ``config`` with
``core.fsmonitor = <command>``): git records ``sub`` as a gitlink, and a ``git status``
or ``git diff HEAD`` run on the worktree then runs the command, as the supervisor, with
its environment. Or it writes a ``.gitattributes`` naming a filter or diff driver the
repository's config defines. The command here appends to a marker file, with a secret
of the supervisor's environment: after the run, the marker must not exist.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from brainserver import BrainServer

from .test_security_worktree import assert_contained, git_state, setup

SECRET = "s3cret-of-the-supervisor"


def plant(fleeter: Any, marker: Path, where: str = "sub") -> str:
    """A shell script that leaves an embedded repository at ``where`` in the worktree, as
    plain files (its HEAD the worktree's commit, its objects the repository's), whose
    ``core.fsmonitor`` writes the marker, with the secret."""
    objects = fleeter.path / "repo" / ".git" / "objects"
    return (
        f"mkdir -p {where}/.git/objects/info {where}/.git/refs\n"
        f"git rev-parse HEAD > {where}/.git/HEAD\n"
        f"echo {objects} > {where}/.git/objects/info/alternates\n"
        f"cat > {where}/.git/config <<'EOF'\n"
        "[core]\n"
        "\trepositoryformatversion = 0\n"
        f'\tfsmonitor = "echo ran $FLEETRUN_TEST_SECRET >> {marker}; false"\n'
        "EOF\n"
    )


def test_an_embedded_repository_is_refused_and_its_fsmonitor_never_runs(fleeter, monkeypatch):
    monkeypatch.setenv("FLEETRUN_TEST_SECRET", SECRET)
    marker = fleeter.path / "marker"
    repo, other = setup(fleeter, plant(fleeter, marker) + "echo work > WORK.txt")
    before = {repo: git_state(fleeter, repo), other: git_state(fleeter, other)}
    r = fleeter.run("tasks.toml")
    task = assert_contained(fleeter, r, repo, before, "embedded repository sub/")
    assert task.reason.startswith("worktree_tampered:embedded repository sub/"), task.reason
    assert not marker.exists(), marker.read_text()
    # nothing of it reached the task's branch, not even as a gitlink
    assert "sub" not in fleeter.git(repo, "ls-tree", "-r", "--name-only", task.branch).split()
    # fleetrun's own look at the kept worktree (status, logs) runs nothing either
    fleeter.run("status")
    fleeter.run("logs", "t1")
    assert not marker.exists(), marker.read_text()


def test_a_nested_embedded_repository_and_one_the_agent_staged_are_refused(fleeter, monkeypatch):
    # one deep in a new folder, one the agent added to the index with its own git, one
    # whose .git is a file naming another repository: each would be a gitlink on the
    # task's branch
    monkeypatch.setenv("FLEETRUN_TEST_SECRET", SECRET)
    marker = fleeter.path / "marker"
    script = (
        plant(fleeter, marker, "a/b/deep")
        + plant(fleeter, marker, "staged")
        + "git add staged 2>/dev/null\n"
        + f"mkdir gitfile && echo 'gitdir: {fleeter.path / 'other' / '.git'}' > gitfile/.git\n"
        + "echo work > WORK.txt"
    )
    repo, other = setup(fleeter, script)
    before = {repo: git_state(fleeter, repo), other: git_state(fleeter, other)}
    r = fleeter.run("tasks.toml")
    assert_contained(fleeter, r, repo, before, "embedded repository a/b/deep/, gitfile/, staged/")
    assert not marker.exists(), marker.read_text()


def test_the_brain_diff_runs_no_embedded_repositorys_fsmonitor(fleeter, monkeypatch):
    # the agent's work is committed; then something it left behind (a verifier stands in
    # for it) plants a repository and stages it as a gitlink: the diff the brain is shown
    # (git diff HEAD) must not look inside it
    monkeypatch.setenv("FLEETRUN_TEST_SECRET", SECRET)
    marker = fleeter.path / "marker"
    repo, other = setup(fleeter, "echo fine > GOOD.txt")
    later = plant(fleeter, marker) + "git add sub 2>/dev/null; true"
    tasks = (
        (fleeter.path / "tasks.toml")
        .read_text()
        .replace(
            'run = "true"', f'run = {json.dumps(later)}\n          [[task.verify]]\n          brain = "Is it fine?"'
        )
    )
    (fleeter.path / "tasks.toml").write_text(tasks)
    assert not marker.exists()
    with BrainServer() as brain:
        fleeter.write_config(f'[brain]\nurl = "{brain.url}"\nmodel = "tiny"\n')
        brain.script("PASS")
        r = fleeter.run("tasks.toml")
        prompts = [q.prompt for q in brain.requests]
    assert len(prompts) == 1, r.stdout + r.stderr
    assert "GOOD.txt" in prompts[0]
    assert not marker.exists(), marker.read_text()
    assert SECRET not in prompts[0]


def test_gc_without_yes_runs_no_embedded_repositorys_fsmonitor(fleeter, monkeypatch):
    # the worktree an ended task left holds a staged gitlink to the agent's repository:
    # fleetrun gc looks at it (git status) to say what it would remove
    monkeypatch.setenv("FLEETRUN_TEST_SECRET", SECRET)
    marker = fleeter.path / "marker"
    repo, _ = setup(fleeter, plant(fleeter, marker) + "git add sub 2>/dev/null; echo work > WORK.txt")
    fleeter.run("tasks.toml")
    task = fleeter.task("t1")
    assert task.worktree and (Path(task.worktree) / "sub" / ".git" / "config").exists()
    marker.unlink(missing_ok=True)  # what the run itself did is the tests above
    r = fleeter.run("gc")
    assert r.ret == 0, r.stdout + r.stderr
    assert not marker.exists(), marker.read_text()
    assert Path(task.worktree).exists()


def test_gitattributes_drivers_are_not_run_for_the_brain_diff(fleeter):
    # the repository's own config defines a filter and a diff driver (textconv and an
    # external diff command); the agent's .gitattributes names them for every file.
    # The diff the brain is shown runs none of them. Committing the work runs the
    # repository's filter, as the user's own git add would (docs/security.md): each run
    # writes the git command line it ran under, and none may be a diff.
    gate = fleeter.path / "gate"
    marker = fleeter.path / "marker"
    repo, _ = setup(fleeter, "printf '* filter=x diff=x\\n' > .gitattributes; echo fine > GOOD.txt")
    for key, what in (("filter.x.clean", "filter"), ("diff.x.textconv", "textconv"), ("diff.x.command", "extdiff")):
        log = f'test -f {gate} && {{ echo {what}; tr "\\0" " " < /proc/$(ps -o ppid= -p $PPID | tr -d " ")/cmdline; echo; }} >> {marker}'
        fleeter.git(repo, "config", key, f"sh -c '{log}; cat \"$0\" 2>/dev/null || cat'")
    later = f"touch {gate}; echo more >> GOOD.txt; echo changed >> keep.txt"
    tasks = (
        (fleeter.path / "tasks.toml")
        .read_text()
        .replace(
            'run = "true"', f'run = {json.dumps(later)}\n          [[task.verify]]\n          brain = "Is it fine?"'
        )
    )
    (fleeter.path / "tasks.toml").write_text(tasks)
    with BrainServer() as brain:
        fleeter.write_config(f'[brain]\nurl = "{brain.url}"\nmodel = "tiny"\n')
        brain.script("PASS")
        r = fleeter.run("tasks.toml")
        prompts = [q.prompt for q in brain.requests]
    assert len(prompts) == 1, r.stdout + r.stderr
    assert "+more" in prompts[0] and "+changed" in prompts[0]
    ran = marker.read_text() if marker.exists() else ""
    assert "textconv" not in ran and "extdiff" not in ran, ran
    assert " diff " not in ran, ran


def test_a_git_dir_in_fleetruns_environment_sends_no_git_command_elsewhere(fleeter, monkeypatch):
    # fleetrun started from a git hook or alias inherits GIT_DIR (and GIT_INDEX_FILE):
    # passed on, they would send every command fleetrun runs to that repository
    repo, other = setup(fleeter, "echo fine > GOOD.txt")
    before = git_state(fleeter, other)
    monkeypatch.setenv("GIT_DIR", str(other / ".git"))
    monkeypatch.setenv("GIT_INDEX_FILE", str(other / ".git" / "index"))
    monkeypatch.setenv("GIT_WORK_TREE", str(other))
    r = fleeter.run("tasks.toml")
    for name in ("GIT_DIR", "GIT_INDEX_FILE", "GIT_WORK_TREE"):
        monkeypatch.delenv(name)
    assert r.ret == 0, r.stdout + r.stderr
    task = fleeter.task("t1")
    assert "GOOD.txt" in fleeter.git(repo, "ls-tree", "-r", "--name-only", task.branch).split()
    assert git_state(fleeter, other) == before
    assert fleeter.git(other, "worktree", "list").count("\n") == 1


def test_an_ignored_nested_repository_and_the_repositorys_own_submodule_are_not_refused(fleeter, monkeypatch):
    # what git never records is not refused: a repository in an ignored folder (a
    # virtualenv's src/ checkout, say), and a submodule of the user's repository as a
    # new worktree has it (its gitlink, its folder empty); and neither runs anything
    monkeypatch.setenv("FLEETRUN_TEST_SECRET", SECRET)
    marker = fleeter.path / "marker"
    repo, other = setup(
        fleeter, "echo .venv/ > .gitignore\n" + plant(fleeter, marker, ".venv/src/pkg") + "echo fine > GOOD.txt"
    )
    fleeter.git(repo, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(other), "lib")
    fleeter.git(repo, "commit", "-q", "-m", "a submodule")
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    task = fleeter.task("t1")
    files = fleeter.git(repo, "ls-tree", "-r", "--name-only", task.branch).split()
    assert "GOOD.txt" in files and "lib" in files and not any(f.startswith(".venv") for f in files)
    assert not marker.exists(), marker.read_text()


def embedded_writes(fleeter: Any, marker: Path, where: str = "sub") -> list[list[str]]:
    """The fake claude's actions that leave the embedded repository of :func:`plant`,
    each a plain file written (Claude Code's Write tool)."""
    repo = fleeter.path / "repo"
    config = (
        f'[core]\n\trepositoryformatversion = 0\n\tfsmonitor = "echo ran $FLEETRUN_TEST_SECRET >> {marker}; false"\n'
    )
    return [
        ["write", f"{where}/.git/HEAD", fleeter.git(repo, "rev-parse", "main")],
        ["write", f"{where}/.git/objects/info/alternates", f"{repo / '.git' / 'objects'}\n"],
        ["write", f"{where}/.git/refs/.keep", ""],
        ["write", f"{where}/.git/config", config],
    ]


def claude_task(fleeter: Any, verify: str) -> Path:
    repo = fleeter.make_repo(files={"README.md": "hello\n"})
    fleeter.write_tasks(f"""
        [[task]]
        name = "greet"
        cwd = "repo"
        prompt = "Write hello.txt saying hello."
        git_ref = "main"
        max_retries = 2
        {verify}
    """)
    return repo


def test_a_claude_agent_that_only_writes_files_gets_no_fsmonitor_run(fleeter, fake_claude, monkeypatch):
    # the scenario as it was filed: Claude Code's Write tool, nothing else
    monkeypatch.setenv("FLEETRUN_TEST_SECRET", SECRET)
    marker = fleeter.path / "marker"
    repo = claude_task(fleeter, '[[task.verify]]\n          run = "true"')
    fake_claude.script(greet=[{"actions": [*embedded_writes(fleeter, marker), ["write", "hello.txt", "hello\n"]]}])
    r = fleeter.run("tasks.toml")
    assert not marker.exists(), marker.read_text()
    assert r.ret == 1, r.stdout + r.stderr
    task = fleeter.task("greet")
    assert task.state.value == "NEEDS_HUMAN", task.reason
    assert task.reason.startswith("worktree_tampered:embedded repository sub/"), task.reason
    assert task.retries == 0 and len(fleeter.ledger().attempts(task.id)) == 1
    assert fleeter.git(repo, "rev-parse", task.branch) == fleeter.git(repo, "rev-parse", "main")


def test_the_reviewers_diff_runs_no_embedded_repositorys_fsmonitor(fleeter, fake_claude, monkeypatch):
    # the work is committed; a process the agent left behind (a run verifier stands in)
    # then plants the repository and stages it: the agent reviewer's diff must not look
    # inside it
    monkeypatch.setenv("FLEETRUN_TEST_SECRET", SECRET)
    marker = fleeter.path / "marker"
    later = plant(fleeter, marker) + "git add sub 2>/dev/null; true"
    claude_task(
        fleeter,
        f"[[task.verify]]\n          run = {json.dumps(later)}\n"
        f'          [[task.verify]]\n          agent = "Does hello.txt say hello?"',
    )
    fake_claude.script(
        **{
            "greet": [{"actions": [["write", "hello.txt", "hello\n"]]}],
            "greet:review": [{"actions": [["read", "hello.txt"]], "result": "PASS"}],
        }
    )
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    (call,) = fake_claude.review_calls()
    assert call["error"] is None
    assert not marker.exists(), marker.read_text()


def test_many_embedded_repositories_are_named_a_few_at_a_time(fleeter):
    # the names are the agent's: the reason names five and counts the rest
    script = (
        "for i in 1 2 3 4 5 6 7; do mkdir -p r$i/.git/refs r$i/.git/objects; "
        "git rev-parse HEAD > r$i/.git/HEAD; done; echo work > WORK.txt"
    )
    repo, other = setup(fleeter, script)
    before = {repo: git_state(fleeter, repo), other: git_state(fleeter, other)}
    r = fleeter.run("tasks.toml")
    assert_contained(fleeter, r, repo, before, "embedded repository r1/, r2/, r3/, r4/, r5/ and 2 more")

"""``base = "dependencies"``: a dependent's worktree starts from its ``git_ref`` with each
dependency's branch merged in, in ``depends_on`` order, through the real CLI (real git,
the fake claude, real shepherds and the ledger)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

pytest_plugins = ["sshd"]

USAGE_ERROR = 4


def chain(fleeter: Any, extra: str = "", verify: str = "test -f api.py && test -f schema.sql") -> Path:
    """The demo's chain: user-schema, then user-api building on it."""
    repo = fleeter.make_repo()
    fleeter.write_tasks(f'''
        [[task]]
        name = "user-schema"
        cwd = "repo"
        prompt = "Add a users table."
        git_ref = "main"

        [[task]]
        name = "user-api"
        cwd = "repo"
        prompt = "Add CRUD endpoints."
        git_ref = "main"
        depends_on = ["user-schema"]
        base = "dependencies"
        {extra}

          [[task.verify]]
          run = "{verify}"
    ''')
    return repo


def branch_files(fleeter: Any, repo: Path, branch: str) -> list[str]:
    return fleeter.git(repo, "ls-tree", "-r", "--name-only", branch).split()


def test_the_dependent_starts_with_its_dependencys_work_merged_in(fleeter, fake_claude):
    repo = chain(fleeter)
    fake_claude.script(
        **{
            "user-schema": [
                {
                    "actions": [["write", "schema.sql", "CREATE TABLE users"]],
                    "result": "Added the users table in schema.sql",
                }
            ],
            # the agent sees schema.sql in its worktree before it writes a line
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
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    schema, api = fleeter.task("user-schema"), fleeter.task("user-api")
    files = branch_files(fleeter, repo, api.branch)
    assert {"schema.sql", "api.py", "saw-schema.txt"} <= set(files)
    assert fleeter.git(repo, "show", f"{api.branch}:saw-schema.txt").strip() == "CREATE TABLE users"
    # one merge commit, --no-ff, by fleetrun's fixed identity, whose second parent is the dependency's tip
    merges = fleeter.git(repo, "log", "--merges", "--format=%H %an <%ae> %s", api.branch).strip().splitlines()
    assert len(merges) == 1
    sha, rest = merges[0].split(" ", 1)
    assert rest.startswith("fleetrun <fleetrun@localhost> ")
    assert schema.branch in rest and "user-schema" in rest
    parents = fleeter.git(repo, "rev-list", "--parents", "-n1", sha).split()[1:]
    assert parents == [
        fleeter.git(repo, "rev-parse", "main").strip(),
        fleeter.git(repo, "rev-parse", schema.branch).strip(),
    ]
    # the prompt says the work is merged in, not only where it is
    (call,) = fake_claude.calls("user-api")
    assert "merged into this worktree" in call["prompt"]
    assert f"user-schema is DONE on branch {schema.branch}" in call["prompt"]


def test_without_base_the_dependent_starts_from_git_ref(fleeter, fake_claude):
    """The default is unchanged: the dependency's file is not in the dependent's tree."""
    repo = fleeter.make_repo()
    fleeter.write_tasks("""
        [[task]]
        name = "user-schema"
        cwd = "repo"
        prompt = "Add a users table."
        git_ref = "main"

        [[task]]
        name = "user-api"
        cwd = "repo"
        prompt = "Add CRUD endpoints."
        git_ref = "main"
        depends_on = ["user-schema"]
    """)
    fake_claude.script(
        **{
            "user-schema": [{"actions": [["write", "schema.sql", "x"]]}],
            "user-api": [{"actions": [["write", "api.py", "# api"]]}],
        }
    )
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    api = fleeter.task("user-api")
    assert "schema.sql" not in branch_files(fleeter, repo, api.branch)
    assert "merged into this worktree" not in fake_claude.calls("user-api")[0]["prompt"]


def two_writers(fleeter: Any, extra: str = "") -> tuple[Path, dict[str, Any]]:
    """``both`` depends on ``left`` and ``right``, which write one file differently."""
    repo = fleeter.make_repo(files={"README.md": "hello\n", "shared.txt": "base\n"})
    fleeter.write_tasks(f"""
        [[task]]
        name = "left"
        cwd = "repo"
        prompt = "Write left."
        git_ref = "main"

        [[task]]
        name = "right"
        cwd = "repo"
        prompt = "Write right."
        git_ref = "main"

        [[task]]
        name = "both"
        cwd = "repo"
        prompt = "Use both."
        git_ref = "main"
        depends_on = ["left", "right"]
        base = "dependencies"
        {extra}

          [[task.verify]]
          run = "test \\"$(cat shared.txt)\\" = merged && test -f L.txt && test -f R.txt"
    """)
    steps = {
        "left": [{"actions": [["write", "shared.txt", "left\n"], ["write", "L.txt", "l"], ["commit", "left"]]}],
        "right": [{"actions": [["write", "shared.txt", "right\n"], ["write", "R.txt", "r"], ["commit", "right"]]}],
    }
    return repo, steps


def test_a_merge_conflict_asks_a_human_and_the_agent_never_starts(fleeter, fake_claude):
    repo, steps = two_writers(fleeter)
    fake_claude.script(**steps, both=[{"actions": [["write", "x.txt", "x"]]}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 1, r.stdout + r.stderr
    both = fleeter.task("both")
    assert both.state.value == "NEEDS_HUMAN"
    assert both.reason == "merge_conflict:shared.txt"
    from fleetrun.states import CAUSES, cause_word

    assert cause_word(both.reason) in CAUSES
    assert fake_claude.calls("both") == []
    r.fnmatch_lines(["*both NEEDS_HUMAN*merge_conflict:shared.txt*"])
    # the worktree is kept, mid-merge, where the human can resolve it; status knows where it is
    wt = Path(both.worktree)
    assert "<<<<<<<" in (wt / "shared.txt").read_text()
    assert (wt / "L.txt").exists()  # the first dependency merged cleanly
    notes = [n for _, n in fleeter.ledger().notes(both.id)]
    assert any("right" in n and "shared.txt" in n and str(wt) in n for n in notes), notes

    # a retry with the merge still stopped asks again, and still starts no agent
    assert fleeter.run("retry", "both").ret == 0
    fleeter.run("work", "--until-idle")
    assert (fleeter.task("both").state.value, fleeter.task("both").reason) == (
        "NEEDS_HUMAN",
        "merge_conflict:shared.txt",
    )
    assert fake_claude.calls("both") == []

    # the human resolves it and commits; a retry reuses the worktree as it is: no second merge
    (wt / "shared.txt").write_text("merged\n")
    fleeter.git(wt, "add", "shared.txt")
    fleeter.git(wt, "commit", "-q", "--no-edit")
    merges_before = fleeter.git(repo, "rev-list", "--merges", "--count", both.branch).strip()
    assert fleeter.run("retry", "both").ret == 0
    r = fleeter.run("work", "--until-idle")
    assert r.ret == 0, r.stdout + r.stderr
    assert fleeter.task("both").state.value == "DONE"
    assert fleeter.git(repo, "rev-list", "--merges", "--count", both.branch).strip() == merges_before == "2"
    (call,) = fake_claude.calls("both")
    assert "conflict" not in call["prompt"].lower()


def test_on_conflict_agent_starts_the_agent_on_the_conflicted_tree(fleeter, fake_claude):
    repo, steps = two_writers(fleeter, extra='on_conflict = "agent"')
    fake_claude.script(
        **steps,
        both=[
            {
                "actions": [
                    ["bash", "git diff --name-only --diff-filter=U > markers.txt"],
                    ["write", "shared.txt", "merged\n"],
                    ["commit", "resolve the merge"],
                ]
            }
        ],
    )
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    both = fleeter.task("both")
    (call,) = fake_claude.calls("both")
    prompt = call["prompt"]
    # the conflict comes first, named with its files and branch, before the task itself
    assert prompt.startswith("## A merge conflict to resolve first")
    right = fleeter.task("right")
    assert f"right (branch {right.branch})" in prompt and "shared.txt" in prompt
    assert prompt.index("shared.txt") < prompt.index("Use both.")
    assert fleeter.git(repo, "show", f"{both.branch}:markers.txt").strip() == "shared.txt"
    # the agent's commit concluded the merge: both dependencies are parents in the history
    log = fleeter.git(repo, "rev-list", "--parents", "-n1", both.branch).split()
    assert fleeter.git(repo, "rev-parse", right.branch).strip() in log


def test_merge_runs_no_hooks_of_the_repository(fleeter, fake_claude):
    repo = chain(fleeter)
    hooks = fleeter.path / "hooks"
    hooks.mkdir()
    marker = fleeter.path / "hook-ran"
    # each would stop or record a merge (prepare-commit-msg is told "merge" as its $2)
    for name, when in (
        ("pre-merge-commit", "true"),
        ("post-merge", "true"),
        ("prepare-commit-msg", '[ "$2" = merge ]'),
    ):
        h = hooks / name
        h.write_text(f"#!/bin/sh\nif {when}; then echo {name} >> {marker}; exit 1; fi\n")
        h.chmod(0o755)
    fleeter.git(repo, "config", "core.hooksPath", str(hooks))
    fake_claude.script(
        **{
            "user-schema": [{"actions": [["write", "schema.sql", "x"]]}],
            "user-api": [{"actions": [["write", "api.py", "# api"]]}],
        }
    )
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    assert not marker.exists()
    api = fleeter.task("user-api")
    assert fleeter.git(repo, "rev-list", "--merges", "--count", api.branch).strip() == "1"


def test_validate_rejects_base_and_on_conflict_where_they_cannot_apply(fleeter):
    fleeter.make_repo()
    fleeter.write_tasks("""
        [[task]]
        name = "a"
        cwd = "repo"
        prompt = "a"
        git_ref = "main"
        base = "dependencies"

        [[task]]
        name = "b"
        cwd = "repo"
        prompt = "b"
        git_ref = "main"
        depends_on = ["a"]
        on_conflict = "agent"

        [[task]]
        name = "c"
        cwd = "repo"
        prompt = "c"
        depends_on = ["a"]
        base = "dependencies"

        [[task]]
        name = "d"
        cwd = "repo"
        prompt = "d"
        git_ref = "main"
        depends_on = ["a"]
        base = "deps"
        on_conflict = "ask"
    """)
    r = fleeter.run("validate", "tasks.toml")
    assert r.ret == USAGE_ERROR
    assert "Traceback" not in r.stderr
    assert r.errlines == [
        "ERROR: tasks.toml:6: task 'a': base: \"dependencies\" needs depends_on: a task without "
        "dependencies has nothing to merge",
        "ERROR: tasks.toml:14: task 'b': on_conflict: applies only with base = \"dependencies\"",
        "ERROR: tasks.toml:21: task 'c': base: \"dependencies\" needs git_ref: the branches are merged "
        "into the task's worktree",
        "ERROR: tasks.toml:29: task 'd': base: 'deps' is not one of git_ref, dependencies",
        "ERROR: tasks.toml:30: task 'd': on_conflict: 'ask' is not one of human, agent",
    ]


def test_validate_rejects_a_task_that_merges_its_dependencies_pinned_to_a_peer(fleeter):
    """It would wait for ever ("cannot place" at the end of the run): an error at validate,
    at the line of the pin; a pin to this machine is no mistake."""
    chain(fleeter, extra='peer = "p1"')
    r = fleeter.run("validate", "tasks.toml")
    assert "Traceback" not in r.stderr
    assert (r.ret, r.errlines) == (
        USAGE_ERROR,
        [
            "ERROR: tasks.toml:14: task 'user-api': peer: pinned to p1, but a task with base = \"dependencies\" "
            "runs on this machine (the dependencies' branches are merged here)"
        ],
    )
    tasks = fleeter.path / "tasks.toml"
    tasks.write_text(tasks.read_text().replace('peer = "p1"', 'peer = "local"'))
    assert fleeter.run("validate", "tasks.toml").ret == 0


def test_base_as_a_default_applies_only_to_tasks_with_dependencies(fleeter, fake_claude):
    repo = fleeter.make_repo()
    fleeter.write_tasks("""
        base = "dependencies"
        git_ref = "main"

        [[task]]
        name = "user-schema"
        cwd = "repo"
        prompt = "Add a users table."

        [[task]]
        name = "user-api"
        cwd = "repo"
        prompt = "Add CRUD endpoints."
        depends_on = ["user-schema"]
    """)
    assert fleeter.run("validate", "tasks.toml").ret == 0
    fake_claude.script(
        **{
            "user-schema": [{"actions": [["write", "schema.sql", "x"]]}],
            "user-api": [{"actions": [["write", "api.py", "# api"]]}],
        }
    )
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    assert "schema.sql" in branch_files(fleeter, repo, fleeter.task("user-api").branch)


def test_a_dependency_branch_that_is_not_here_asks_a_human(fleeter, fake_claude):
    """A dependency whose branch is not in this repository (it ran on a peer and was not
    fetched back, or someone deleted it): the dependent does not start."""
    repo = chain(fleeter)
    # the dependency's branch is gone by the time its dependent starts
    fleeter.write_fleetconf("""
        import subprocess

        def fleetrun_transition(task, from_state, to_state, cause, attempt, config):
            if task.name == "user-schema" and to_state == "DONE":
                subprocess.run(["git", "-C", task.spec.cwd, "update-ref", "-d", "refs/heads/" + task.branch],
                               check=True)
    """)
    fake_claude.script(
        **{
            "user-schema": [{"actions": [["write", "schema.sql", "x"]]}],
            "user-api": [{"actions": [["write", "api.py", "# api"]]}],
        }
    )
    r = fleeter.run("tasks.toml")
    assert r.ret == 1, r.stdout + r.stderr
    schema, api = fleeter.task("user-schema"), fleeter.task("user-api")
    assert api.state.value == "NEEDS_HUMAN"
    assert api.reason == (
        f"workspace_failed:the branch {schema.branch} of dependency user-schema is not in {repo}"
        " (a dependency that ran on a peer has its branch fetched back when it ends)"
    )
    assert fake_claude.calls("user-api") == []


def test_a_dependency_that_ran_on_a_peer_is_merged_from_its_fetched_branch(fleeter, fake_claude, peer_lab):
    """The dependency runs on a peer whose repository is a clone: its branch exists only
    there until the fetch-back (a task with dependents is fetched back) brings it here,
    and the dependent, on this machine, starts with it merged in."""
    repo = fleeter.make_repo()
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

        [[task]]
        name = "client"
        cwd = "repo"
        prompt = "Use the API."
        git_ref = "main"
        depends_on = ["api"]
        base = "dependencies"

          [[task.verify]]
          run = "test -f API.txt && test -f CLIENT.txt"
    """)
    fake_claude.script(
        **{
            "api": [{"actions": [["write", "API.txt", "GET /things\n"], ["commit", "add api"]]}],
            "client": [{"actions": [["write", "CLIENT.txt", "uses it\n"], ["commit", "client"]]}],
        }
    )
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    api, client = fleeter.task("api"), fleeter.task("client")
    assert (api.host, client.host) == ("mini", "local")
    assert {"API.txt", "CLIENT.txt"} <= set(branch_files(fleeter, repo, client.branch))
    merged = fleeter.git(repo, "log", "--merges", "--format=%s", client.branch).strip()
    assert merged == f"fleetrun: merge api ({api.branch}) into client"


def test_a_task_that_merges_its_dependencies_stays_on_this_machine():
    from fleetrun.plugins.placement import stays_local
    from fleetrun.taskspec import TaskSpec

    spec = TaskSpec(name="t", prompt="p", cwd="/", git_ref="main", depends_on=["a"], base="dependencies")
    assert stays_local(spec) == 'base = "dependencies"'
    # a default of every task on one without dependencies changes nothing
    assert stays_local(TaskSpec(name="t", prompt="p", cwd="/", git_ref="main", base="dependencies")) is None

"""The pure parts of :mod:`fleetrun.depmerge`: which branch of a dependency is merged,
and how a conflict is named (the merging itself: tests/acceptance/test_depbase.py)."""

from __future__ import annotations

from types import SimpleNamespace

from fleetrun.depmerge import (
    CAUSE_FILES,
    conflict_cause,
    conflict_note,
    conflict_prompt,
    dependency_branch,
)
from fleetrun.taskspec import TaskSpec


def dep(branch, handoff_branch=None):
    return SimpleNamespace(
        name="d",
        branch=branch,
        handoff={"branch": handoff_branch} if handoff_branch else None,
        spec=TaskSpec(name="d", prompt="p", cwd="/", git_ref="main"),
    )


def test_the_merged_branch_is_fleetruns_own():
    assert dependency_branch(dep("fleetrun/d-1")) == "fleetrun/d-1"
    # the name a fetch-back gave a branch that had diverged here
    assert dependency_branch(dep("fleetrun/d-1", "fleetrun/d-1-from-mini")) == "fleetrun/d-1-from-mini"
    # any other name in the handoff is not one fleetrun gave it: the ledger's branch wins
    for other in ("main", "evil", "fleetrun/d-1-from-mini/../../x", "-fleetrun/d-1-from-x"):
        assert dependency_branch(dep("fleetrun/d-1", other)) == "fleetrun/d-1"
    assert dependency_branch(dep(None, "fleetrun/x")) is None


def test_a_conflict_is_named_with_its_files():
    files = [f"f{k}.txt" for k in range(CAUSE_FILES + 3)]
    assert conflict_cause({"files": ["a.txt", "b\x1b[31m.txt"]}) == "merge_conflict:a.txt, b\\x1b[31m.txt"
    assert conflict_cause({"files": files}).endswith(f"f{CAUSE_FILES - 1}.txt and 3 more")
    rec = {
        "task": "right",
        "branch": "fleetrun/right-2",
        "files": ["shared.txt"],
        "pending": [{"task": "last", "branch": "fleetrun/last-3"}],
    }
    note = conflict_note(rec, "/h/worktrees/both-4", "both")
    assert note == (
        "merging right (branch fleetrun/right-2) into the worktree /h/worktrees/both-4 stopped on a "
        "conflict in shared.txt; the agent was not started; not merged yet: last (fleetrun/last-3). "
        "Resolve it there and commit, then `fleetrun retry both`"
    )
    prompt = conflict_prompt(rec, "main")
    assert prompt.startswith("## A merge conflict to resolve first\nThis worktree was made from main")
    assert "Merging right (branch fleetrun/right-2) stopped on a conflict in: shared.txt." in prompt
    assert prompt.endswith("`git merge --no-ff fleetrun/last-3` (last).")

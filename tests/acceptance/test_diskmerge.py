"""A dependency merge a full disk stopped part way (the long soak's finding): git wrote
some of the dependency's files into the dependent's worktree, then could not write the
next one ("error: unable to write file t0116.txt"), and left what it had written there,
untracked, the last one empty. The worktree kept, the next attempt's merge of that
dependency was refused ("untracked working tree files would be overwritten by merge")
and the task, and its dependents, went to a human (``workspace_failed``), for a full
disk, which clears by itself.

The home is a real 2 MB tmpfs (the soak's own mechanism); a ``git`` wrapper first on
PATH fills it, once, while the real git runs the command the test names (fleetrun's Nth
merge, or the first ``worktree add -b`` of a task's branch), then frees it. The
repository is not on the tmpfs: only the worktree's files cannot be written, as in the
soak. (Needs root and mount: skipped with the reason otherwise.)
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from .test_crash_points import _no_strays  # noqa: F401 (nothing a test starts outlives it)
from .test_disk_full import mount_home
from .test_prepcrash import KILL_FLEETRUN

# fleetrun's own merges (`merge --no-ff`) are counted in {flags}/merges. At the one
# numbered $(cat kill-at) the supervisor (the first process up the parent chain whose
# command line names fleetrun) is SIGKILLed and git exits 1 without merging; at the one
# numbered $(cat fill-at) the real git runs on a full disk; so does the first
# `worktree add -b` whose arguments hold $(cat fill-add); at $(cat fill-kill-at) the
# real git runs on a full disk, then the supervisor is SIGKILLed before it learns how the
# merge went. The file system is filled by writing $(cat filler) until it is full, and
# freed by removing it once git is done.
WRAPPER = (
    "#!/bin/sh\n"
    + KILL_FLEETRUN
    + """filled() {{
  filler=$(cat "{flags}/filler")
  head -c 1000000000 /dev/zero > "$filler" 2>/dev/null
  "{git}" "$@"
  rc=$?
  rm -f "$filler"
  return $rc
}}
case "$*" in
  *" worktree add -b "*)
    if [ -e "{flags}/fill-add" ] && [ ! -e "{flags}/add-filled" ] && echo "$*" | grep -qF "$(cat "{flags}/fill-add")"; then
      touch "{flags}/add-filled"
      filled "$@"
      exit $?
    fi ;;
  *" merge --no-ff "*)
    echo x >> "{flags}/merges"
    n=$(wc -l < "{flags}/merges")
    if [ -e "{flags}/kill-at" ] && [ "$n" -eq "$(cat "{flags}/kill-at")" ]; then
      kill_fleetrun
    fi
    if [ -e "{flags}/fill-at" ] && [ "$n" -eq "$(cat "{flags}/fill-at")" ]; then
      touch "{flags}/merge-filled"
      filled "$@"
      exit $?
    fi
    if [ -e "{flags}/fill-kill-at" ] && [ "$n" -eq "$(cat "{flags}/fill-kill-at")" ]; then
      touch "{flags}/merge-filled"
      filled "$@"
      kill_fleetrun
    fi ;;
esac
exec "{git}" "$@"
"""
)

# big's files: the full disk stops its merge at the first of them (left empty)
BIG = {f"big/b{i}.txt": f"line {i}\n" * 200 for i in range(1, 4)}


@pytest.fixture
def home2m(fleeter, tmp_path, monkeypatch):
    """A 2 MB tmpfs as FLEETRUN_HOME; :return: the tmpfs (the filler goes there)."""
    yield from mount_home(fleeter, tmp_path, monkeypatch, "2m")


def queue(fleeter: Any, fake_claude: Any) -> Path:
    """``api`` merges ``schema`` then ``big`` (``base = "dependencies"``)."""
    repo = fleeter.make_repo()
    fleeter.write_tasks("""
        [[task]]
        name = "schema"
        cwd = "repo"
        prompt = "Write the schema."
        git_ref = "main"

        [[task]]
        name = "big"
        cwd = "repo"
        prompt = "Write the big files."
        git_ref = "main"

        [[task]]
        name = "api"
        cwd = "repo"
        prompt = "Write the api."
        git_ref = "main"
        depends_on = ["schema", "big"]
        base = "dependencies"

          [[task.verify]]
          run = "test -f api.py"
    """)
    fake_claude.script(
        schema=[{"actions": [["write", "schema.sql", "CREATE TABLE users"]]}],
        big=[{"actions": [["write", name, text] for name, text in BIG.items()]}],
        api=[{"actions": [["write", "api.py", "# api"]]}],
    )
    return repo


def wrapper(fleeter: Any, mnt: Path, **at: str) -> Path:
    """The wrapper first on PATH, armed with ``at`` (``kill_at="1"``, ``fill_at="3"``,
    ``fill_add="api-"``); :return: its flags folder."""
    flags = fleeter.git_first_on_path(WRAPPER)
    (flags / "filler").write_text(str(mnt / "filler"))
    for key, value in at.items():
        (flags / key.replace("_", "-")).write_text(value + "\n")
    return flags


def api_worktree(fleeter: Any) -> Path:
    (root,) = (fleeter.home / "worktrees").glob("api-*")
    return root


def killed(fleeter: Any, flags: Path) -> None:
    r = fleeter.runsub("tasks.toml", timeout=120)
    assert r.ret == -signal.SIGKILL, f"the supervisor was not killed at the merge (exit {r.ret}):\n{r.stdout}{r.stderr}"
    assert (flags / "killed").exists()
    assert not (flags / "log").exists(), (flags / "log").read_text()


def assert_api_done_with_both(fleeter: Any, repo: Path, r: Any) -> list[str]:
    """Every task DONE, ``api`` never NEEDS_HUMAN, its branch holding big's files as big
    wrote them; :return: api's causes."""
    assert r.ret == 0, r.stdout + r.stderr
    assert fleeter.states() == {"schema": "DONE", "big": "DONE", "api": "DONE"}
    api = fleeter.task("api")
    for name, text in BIG.items():
        assert fleeter.git(repo, "show", f"{api.branch}:{name}") == text
    assert fleeter.git(repo, "show", f"{api.branch}:schema.sql") == "CREATE TABLE users"
    transitions = fleeter.ledger().transitions(api.id)
    assert [t.to_state for t in transitions].count("NEEDS_HUMAN") == 0, [t.cause for t in transitions]
    return [t.cause for t in transitions]


def test_a_merge_the_full_disk_stopped_in_a_worktree_made_on_an_existing_branch_is_merged_again(
    fleeter, fake_claude, home2m
):
    """The soak's path (t0120): the first `worktree add -b` fails on the full disk after
    git made the branch, so the worktree is added on that branch (not a branch made
    now); schema merges, and big's merge stops on the full disk with big's files half
    written; the attempt after it must merge big again, not send api to a human."""
    repo = queue(fleeter, fake_claude)
    flags = wrapper(fleeter, home2m, fill_add="fleetrun/api-", fill_at="2")
    r = fleeter.runsub("tasks.toml", timeout=120)
    assert (flags / "add-filled").exists() and (flags / "merge-filled").exists()
    causes = assert_api_done_with_both(fleeter, repo, r)
    assert any("unable to write file big/b1.txt" in c for c in causes), causes


def test_a_merge_the_full_disk_stopped_in_a_reused_worktree_is_merged_again(fleeter, fake_claude, home2m):
    """The soak's other path (t0039): the supervisor is killed once api's worktree is
    made; the restart reuses it, merges schema, and big's merge stops on the full disk.
    What that merge wrote is removed (only that: a file an agent left untracked there
    stays), and the next attempt merges big."""
    repo = queue(fleeter, fake_claude)
    flags = wrapper(fleeter, home2m, kill_at="1", fill_at="3")
    killed(fleeter, flags)
    root = api_worktree(fleeter)
    (root / "big").mkdir()
    (root / "big" / "mine.txt").write_text("the agent's own\n")  # untracked, not big's
    r = fleeter.runsub("work", "--until-idle", timeout=120)
    assert (flags / "merge-filled").exists()
    causes = assert_api_done_with_both(fleeter, repo, r)
    assert any("unable to write file big/b1.txt" in c for c in causes), causes
    api = fleeter.task("api")
    assert fleeter.git(repo, "show", f"{api.branch}:big/mine.txt") == "the agent's own\n"


def test_a_merge_the_full_disk_stopped_and_the_supervisor_died_after_is_merged_again(fleeter, fake_claude, home2m):
    """The supervisor is killed while big's merge runs on the full disk, so nothing took
    out what it wrote (big/b1.txt, empty: no content check can know it): the restart
    knows it from the record the merge left, and merges big."""
    repo = queue(fleeter, fake_claude)
    flags = wrapper(fleeter, home2m, fill_kill_at="2")
    killed(fleeter, flags)
    assert (flags / "merge-filled").exists()
    root = api_worktree(fleeter)
    assert (root / "big" / "b1.txt").read_bytes() == b""  # what the cut-short merge left
    r = fleeter.runsub("work", "--until-idle", timeout=120)
    assert_api_done_with_both(fleeter, repo, r)


def test_a_reused_worktree_holding_the_dependencys_own_files_merges_it(fleeter, fake_claude, home2m):
    """What a merge stopped on a full disk left behind, found by a later attempt (the
    supervisor killed before it cleaned up): an untracked file byte-identical to the one
    in the dependency's tree is the dependency's, removed before the merge writes it
    again."""
    repo = queue(fleeter, fake_claude)
    flags = wrapper(fleeter, home2m, kill_at="1")
    killed(fleeter, flags)
    root = api_worktree(fleeter)
    (root / "big").mkdir()
    for name, text in BIG.items():
        (root / name).write_text(text)
    (root / "schema.sql").write_text("CREATE TABLE users")
    r = fleeter.runsub("work", "--until-idle", timeout=120)
    assert_api_done_with_both(fleeter, repo, r)


def test_a_reused_worktree_holding_other_content_at_a_dependencys_path_keeps_it(fleeter, fake_claude, home2m):
    """An untracked file at a path of the dependency's tree that is not the dependency's
    content is someone's work: it is not removed, and the merge it blocks asks a
    human, naming it."""
    queue(fleeter, fake_claude)
    flags = wrapper(fleeter, home2m, kill_at="1")
    killed(fleeter, flags)
    root = api_worktree(fleeter)
    (root / "big").mkdir()
    (root / "big" / "b2.txt").write_text("someone's work\n")
    r = fleeter.runsub("work", "--until-idle", timeout=120)
    assert r.ret == 1, r.stdout + r.stderr
    api = fleeter.task("api")
    assert api.state.value == "NEEDS_HUMAN"
    assert api.reason.startswith("workspace_failed:merging big"), api.reason
    assert "untracked working tree files would be overwritten" in api.reason, api.reason
    assert (root / "big" / "b2.txt").read_text() == "someone's work\n"

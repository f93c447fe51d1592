"""Local effects off the loop's critical path (issue 16): a new worktree is added, an
ended attempt's work collected (``git ls-files``, ``status``, ``add``, ``commit``), a handoff's
commit subjects read (``git log``), and a DONE task's clean worktree removed, on a
worker of :mod:`fleetrun.effects` while the loop handles other tasks; two adds or
removes in one repository never overlap.

No timing is asserted: a ``git`` wrapper on PATH holds the slow repository's
``worktree add`` until another task's verifier has run (a file it touches), and its
``worktree remove`` until a third task's verifier has. With either effect on the loop's
thread, that verifier could never run while git waits: the wrapper gives up (its log
says ``timed out``) and the order the test asserts is not the one seen. The collect's
first git command (its ``ls-files``) and the handoff's ``git log`` are held the same way.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest

from fleetrun.crash import CRASH_EXIT

from .test_crash_points import (  # noqa: F401 (_no_strays: nothing a test starts outlives it)
    _no_strays,
    check_invariants,
    check_work_landed,
    run_until_done,
    write_queue,
)

WRAPPER = """#!/bin/sh
# (fleetrun puts its -c settings between -C REPO and the command)
# the repository "slow": worktree add waits for $FLAGS/add.go, remove for $FLAGS/rm.go
case "$*" in
  *"/slow "*" worktree add"*) f="{flags}/add.go" ;;
  *"/slow "*" worktree remove"*) f="{flags}/rm.go" ;;
  *"/fast "*" worktree "*)
    # one add or remove at a time in one repository, or the log says so
    mkdir "{flags}/busy" 2>/dev/null || echo overlap >> "{flags}/log"
    sleep 0.05
    "{git}" "$@"; code=$?
    rmdir "{flags}/busy" 2>/dev/null
    exit $code ;;
  *) exec "{git}" "$@" ;;
esac
i=0
while [ ! -e "$f" ] && [ $i -lt 300 ]; do sleep 0.05; i=$((i+1)); done
if [ -e "$f" ]; then echo "$(basename "$f") released" >> "{flags}/log"; else echo "$(basename "$f") timed out" >> "{flags}/log"; fi
exec "{git}" "$@"
"""

AGENT = "echo x > f.txt && git add f.txt && git -c user.name=t -c user.email=t@example.invalid commit -q -m work"


def task(name: str, repo: str, verify: str, extra: str = "", agent: str = "sh") -> str:
    return f'''
[[task]]
name = "{name}"
cwd = "{repo}"
prompt = "p"
agent = "{agent}"
git_ref = "main"
{extra}
  [[task.verify]]
  run = {json.dumps(verify)}
'''


def git_wrapper(fleeter: Any, template: str, *repos: str) -> Path:
    """Make ``repos``, then put first on PATH a ``git`` made from ``template``:
    :return: the flags folder."""
    for name in repos:
        fleeter.make_repo(name)
    return fleeter.git_first_on_path(template)


def test_worktree_add_and_remove_do_not_block_other_tasks(fleeter, monkeypatch):
    flags = git_wrapper(fleeter, WRAPPER, "slow", "fast")
    fleeter.write_tasks(
        f'[agents.sh]\ncommand = ["/bin/sh", "-c", {json.dumps(AGENT)}]\n'
        + task("s", "slow", "true")
        + task("f1", "fast", f"touch {flags}/add.go")
        + task("f2", "fast", "true")
        + task("g", "fast", f"touch {flags}/rm.go", 'depends_on = ["s"]')
    )
    r = fleeter.run("tasks.toml", "--max-tasks", "4")
    assert r.ret == 0, r.stdout + r.stderr
    log = (flags / "log").read_text().split("\n")
    # s's add waited for f1's verifier, s's removal for g's (which could start only once s was DONE)
    assert [ln for ln in log if ln] == ["add.go released", "rm.go released"], log
    assert fleeter.states() == {"s": "DONE", "f1": "DONE", "f2": "DONE", "g": "DONE"}
    led = fleeter.ledger()
    for name in ("s", "f1", "f2", "g"):
        t = fleeter.task(name)
        assert not Path(t.worktree).exists(), name
        notes = [text for _, text in led.notes(t.id)]
        assert any(n.startswith(f"removed clean worktree {t.worktree}") for n in notes), (name, notes)
        assert "f.txt" in fleeter.git(
            fleeter.path / ("slow" if name == "s" else "fast"), "ls-tree", "-r", "--name-only", t.branch
        )


# The repository "slow": the pinned `git ls-files` of fleetrun_collect_work, its first (its
# --git-dir is slow's worktrees/ folder), and the handoff's `git log` (run in the
# repository), when $FLAGS/hold.collect (hold.log) is there, say they began, then wait
# for $FLAGS/go. The repository "fail" refuses
# the collect's commit.
COLLECT_WRAPPER = """#!/bin/sh
case "$*" in
  *"/slow/.git/worktrees/"*" ls-files "*)
    [ -e "{flags}/hold.collect" ] || exec "{git}" "$@"
    touch "{flags}/collect.began"
    i=0
    while [ ! -e "{flags}/go" ] && [ $i -lt 300 ]; do sleep 0.05; i=$((i+1)); done
    if [ -e "{flags}/go" ]; then echo "collect released" >> "{flags}/log"; else echo "collect timed out" >> "{flags}/log"; fi ;;
  *"/slow "*" log "*)
    [ -e "{flags}/hold.log" ] || exec "{git}" "$@"
    touch "{flags}/log.began"
    i=0
    while [ ! -e "{flags}/go" ] && [ $i -lt 300 ]; do sleep 0.05; i=$((i+1)); done
    if [ -e "{flags}/go" ]; then echo "log released" >> "{flags}/log"; else echo "log timed out" >> "{flags}/log"; fi ;;
  *"/fail/.git/worktrees/"*" commit "*)
    echo "fatal: the disk said no" >&2; exit 128 ;;
esac
exec "{git}" "$@"
"""


def collect_setup(fleeter: Any, monkeypatch: Any, *repos: str) -> Path:
    return git_wrapper(fleeter, COLLECT_WRAPPER, *repos)


def fleetrun_commits(fleeter: Any, repo: str, branch: str) -> list[str]:
    subjects = fleeter.git(fleeter.path / repo, "log", "--format=%s", f"main..{branch}").splitlines()
    return [s for s in subjects if s.startswith("fleetrun: uncommitted work")]


@pytest.mark.parametrize("cancel", [False, True], ids=["collected", "cancelled-while-collecting"])
def test_collecting_the_work_does_not_block_other_tasks(fleeter, monkeypatch, cancel):
    # s's agent leaves its work uncommitted, so fleetrun_collect_work's `git ls-files` finds
    # it and it is committed; that ls-files waits until f's verifier has run. f's agent ends
    # only once s's collect has begun (so it is on its way when f's end comes), and, in
    # the second case, cancels s first. With the collect on the loop's thread, f's end
    # could not be handled while git waits: the wrapper gives up (`collect timed out`).
    flags = collect_setup(fleeter, monkeypatch, "slow", "fast")
    (flags / "hold.collect").touch()
    wait_began = (
        f"i=0; while [ ! -e {flags}/collect.began ] && [ $i -lt 300 ]; do sleep 0.05; i=$((i+1)); done; "
        f'[ -e {flags}/collect.began ] || echo "f never saw it begin" >> {flags}/log; '
    )
    cancel_s = f"{shlex.quote(sys.executable)} -m fleetrun cancel s >> {flags}/cancel.out 2>&1; " if cancel else ""
    fleeter.write_tasks(
        f'[agents.s]\ncommand = ["/bin/sh", "-c", "echo x > f.txt"]\n'
        f'[agents.f]\ncommand = ["/bin/sh", "-c", {json.dumps(wait_began + cancel_s + AGENT)}]\n'
        + task("s", "slow", "true", "", "s")
        + task("f", "fast", f"touch {flags}/go", "", "f")
    )
    r = fleeter.run("tasks.toml", "--max-tasks", "4")
    log = [ln for ln in (flags / "log").read_text().split("\n") if ln] if (flags / "log").exists() else []
    assert log == ["collect released"], (log, r.stdout + r.stderr)
    s = fleeter.task("s")
    led = fleeter.ledger()
    went = [row.to_state for row in led.transitions(s.id)]
    if not cancel:
        assert r.ret == 0, r.stdout + r.stderr
        assert fleeter.states() == {"s": "DONE", "f": "DONE"}
        # the work the agent left is on s's branch, committed by fleetrun once
        assert "f.txt" in fleeter.git(fleeter.path / "slow", "ls-tree", "-r", "--name-only", s.branch)
        assert fleetrun_commits(fleeter, "slow", s.branch) == ["fleetrun: uncommitted work of attempt 1"]
        assert went[-3:] == ["RUNNING", "VERIFYING", "DONE"], went
    else:
        assert r.ret == 1, r.stdout + r.stderr
        assert fleeter.states() == {"s": "CANCELLED", "f": "DONE"}, (flags / "cancel.out").read_text()
        # the collect that was running finished (its commit is there once), its result was
        # dropped: s never went on to VERIFYING, and no second attempt was started
        assert went[-2:] == ["RUNNING", "CANCELLED"], went
        assert "VERIFYING" not in went
        assert len(led.attempts(s.id)) == 1
        assert fleetrun_commits(fleeter, "slow", s.branch) == ["fleetrun: uncommitted work of attempt 1"]


def test_a_commit_git_refuses_is_noted_and_the_verifiers_run_all_the_same(fleeter, monkeypatch):
    # the GitError of the collect's commit, raised on the effects' worker, is handled on
    # the loop's thread as it was inline: a note on the task, and the verifiers run
    collect_setup(fleeter, monkeypatch, "fail")
    fleeter.write_tasks(
        '[agents.s]\ncommand = ["/bin/sh", "-c", "echo x > f.txt"]\n' + task("t", "fail", "test -f f.txt", "", "s")
    )
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    t = fleeter.task("t")
    notes = [text for _, text in fleeter.ledger().notes(t.id)]
    assert any(n.startswith("could not commit the attempt's work: git ") and "the disk said no" in n for n in notes), (
        notes
    )
    assert fleetrun_commits(fleeter, "fail", t.branch) == []
    assert [row.to_state for row in fleeter.ledger().transitions(t.id)][-2:] == ["VERIFYING", "DONE"]


def test_a_crash_while_the_work_is_collected_loses_nothing(fleeter, fake_claude, tmp_path):
    # the crash suite's queue, crashed on the effects' worker with a's work staged and not
    # committed (its task RUNNING, its attempt ended): the restart collects again, and
    # every invariant of the crash points holds
    expected, calls = write_queue(fleeter, fake_claude)
    r = fleeter.runsub("tasks.toml", env={"FLEETRUN_CRASH_AT": "mid_collect"}, timeout=60)
    assert r.ret == CRASH_EXIT, f"mid_collect was never hit (exit {r.ret}):\n{r.stdout}\n{r.stderr}"
    a = fleeter.task("a")
    att = fleeter.ledger().latest_attempt(a.id)
    assert (a.state.value, att.state) == ("RUNNING", "ended")
    assert fleetrun_commits(fleeter, "repo", a.branch) == []
    run_until_done(fleeter, expected)
    bad = check_invariants(fleeter, fake_claude, expected, calls, root=tmp_path)
    bad += check_work_landed(fleeter)
    assert not bad, "after a crash at mid_collect:\n" + "\n".join(bad)
    assert fleetrun_commits(fleeter, "repo", a.branch) == ["fleetrun: uncommitted work of attempt 1"]


def test_the_handoffs_commit_subjects_do_not_block_other_tasks(fleeter, monkeypatch):
    # s's agent writes no summary and has no result text: its handoff is the subjects of
    # its branch's commits, from a `git log` that waits until f's verifier has run; f's
    # agent ends only once that log has begun. On the loop's thread, f's end could not be
    # handled while git waits (`log timed out`).
    flags = collect_setup(fleeter, monkeypatch, "slow", "fast")
    (flags / "hold.log").touch()
    wait_began = (
        f"i=0; while [ ! -e {flags}/log.began ] && [ $i -lt 300 ]; do sleep 0.05; i=$((i+1)); done; "
        f'[ -e {flags}/log.began ] || echo "f never saw it begin" >> {flags}/log; '
    )
    fleeter.write_tasks(
        f'[agents.sh]\ncommand = ["/bin/sh", "-c", {json.dumps(AGENT)}]\n'
        f'[agents.f]\ncommand = ["/bin/sh", "-c", {json.dumps(wait_began + AGENT)}]\n'
        + task("s", "slow", "true")
        + task("f", "fast", f"touch {flags}/go", "", "f")
    )
    r = fleeter.run("tasks.toml", "--max-tasks", "4")
    log = [ln for ln in (flags / "log").read_text().split("\n") if ln] if (flags / "log").exists() else []
    assert log == ["log released"], (log, r.stdout + r.stderr)
    assert r.ret == 0, r.stdout + r.stderr
    assert fleeter.states() == {"s": "DONE", "f": "DONE"}
    s = fleeter.task("s")
    assert s.handoff["summary"] == "(no summary written) the commits on its branch:\n- work", s.handoff
    assert s.handoff["branch"] == s.branch
    went = [row.to_state for row in fleeter.ledger().transitions(s.id)]
    assert went[-2:] == ["VERIFYING", "DONE"], went

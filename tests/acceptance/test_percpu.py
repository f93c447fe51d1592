"""What a trivial task costs in processes (issue 24, the per-task CPU): the git commands
and the interpreters fleetrun starts for one task whose agent commits its own work, each
counted from a log, never timed.

A ``git`` first on PATH logs its arguments and runs the real one; the counts below are
what fleetrun itself runs (its ``-c core.fsmonitor=false`` settings mark its commands
apart from the agent's own ``git add`` and ``git commit``).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetrun import shepherd
from fleetrun.procutil import CAPPED_PATH

#: The agent: writes a file and commits it itself.
AGENT = "echo x > f.txt && git add f.txt && git -c user.name=t -c user.email=t@example.invalid commit -q -m work"


def task(name: str, repo: str, verify: str) -> str:
    return f"""
[[task]]
name = "{name}"
cwd = "{repo}"
prompt = "p"
agent = "sh"
git_ref = "main"
  [[task.verify]]
  run = {json.dumps(verify)}
"""


@pytest.fixture
def stray_fd(tmp_path: Path) -> Iterator[int]:
    """A descriptor of the supervisor's that is not close-on-exec (as a shell or a CI
    runner may leave one): nothing fleetrun starts may get it."""
    fd = os.open(tmp_path / "stray", os.O_WRONLY | os.O_CREAT, 0o600)
    os.set_inheritable(fd, True)
    yield fd
    os.close(fd)


def git_wrapper(fleeter: Any, monkeypatch: Any, template: str, *repos: str) -> Path:
    """Make ``repos``, and put first on PATH a ``git`` written from ``template`` (given
    the flags folder and the real git): :return: the flags folder."""
    for name in repos:
        fleeter.make_repo(name)
    flags = fleeter.path / "flags"
    flags.mkdir()
    bindir = fleeter.path / "bin"
    bindir.mkdir()
    real = shutil.which("git")
    assert real
    wrapper = bindir / "git"
    wrapper.write_text(template.format(flags=flags, git=real))
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{Path(real).parent}:{Path(sys.executable).parent}:/usr/bin:/bin")
    return flags


LOGGER = """#!/bin/sh
echo "$*" >> "{flags}/git.log"
exec "{git}" "$@"
"""


def pinned_git(flags: Path) -> list[str]:
    """The commands of fleetrun's git runs pinned to a worktree (``--work-tree=``): the
    word after the pin, in order."""
    out = []
    for line in (flags / "git.log").read_text().splitlines():
        words = line.split()
        pin = [i for i, w in enumerate(words) if w.startswith("--work-tree=")]
        if pin and "core.fsmonitor=false" in words:
            out.append(words[pin[0] + 1])
    return out


def one_task(fleeter: Any, monkeypatch: Any, verify: str = "true") -> Path:
    flags = git_wrapper(fleeter, monkeypatch, LOGGER, "repo")
    fleeter.write_tasks(f'[agents.sh]\ncommand = ["/bin/sh", "-c", {json.dumps(AGENT)}]\n' + task("t1", "repo", verify))
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    assert fleeter.states() == {"t1": "DONE"}
    return flags


def test_collecting_a_committed_attempts_work_runs_two_git_commands(fleeter, monkeypatch):
    # the collect asks git twice: one ls-files for the embedded repositories (the
    # untracked and the index's in one listing) and one status; nothing to commit, so
    # no add, commit or rev-parse. Each runs pinned to the worktree (--work-tree).
    flags = one_task(fleeter, monkeypatch)
    assert Counter(pinned_git(flags)) == Counter({"ls-files": 1, "status": 1}), pinned_git(flags)


# The agent records its shepherd's parent: the pid and that process's command line.
PARENT = 'pp=$(cut -d" " -f4 /proc/$PPID/stat); echo "$pp $(tr "\\0" " " < /proc/$pp/cmdline)" >> {flags}/parents; '


def test_a_runs_shepherds_are_forked_by_one_starter_that_ends_with_the_run(fleeter, monkeypatch):
    # one `shepherd.py --starter` forks every shepherd of the run (not an interpreter
    # started for each), and it ends when the run does
    flags = git_wrapper(fleeter, monkeypatch, LOGGER, "repo")
    agent = PARENT.format(flags=flags) + AGENT
    fleeter.write_tasks(
        f'[agents.sh]\ncommand = ["/bin/sh", "-c", {json.dumps(agent)}]\n'
        + "".join(task(f"t{i}", "repo", "true") for i in range(3))
    )
    r = fleeter.run("tasks.toml", "--max-tasks", "2")
    assert r.ret == 0, r.stdout + r.stderr
    assert fleeter.states() == {"t0": "DONE", "t1": "DONE", "t2": "DONE"}
    parents = {ln.split(" ", 1)[0]: ln.split(" ", 1)[1] for ln in (flags / "parents").read_text().splitlines()}
    assert len(parents) == 1, parents
    ((pid, cmdline),) = parents.items()
    assert int(pid) != os.getpid()
    assert cmdline.split()[-2:] == [shepherd.SHEPHERD_PATH, shepherd.STARTER_ARG], cmdline
    assert not Path(f"/proc/{pid}").exists() or shepherd.STARTER_ARG not in Path(f"/proc/{pid}/cmdline").read_text()


# A verifier records its wrapper's command line (its parent's), and what it has open,
# each in one write (two verifiers may run at once).
VPARENT = (
    'printf "%s\\n" "$(tr "\\0" " " < /proc/$PPID/cmdline)" >> {flags}/vparents; '
    'printf "%s\\n" "$(ls /proc/self/fd | tr "\\n" " ")" >> {flags}/vfds'
)


def test_a_runs_verifiers_are_forked_by_its_starter_not_started_as_interpreters(fleeter, monkeypatch, stray_fd):
    # each `run` verifier's wrapper (fleetrun.capped) is a fork of the run's starter, not
    # a `python -I -S capped.py` of its own; the verifier and the agent get nothing of
    # ours open (0, 1, 2, and the listing's own 3)
    flags = git_wrapper(fleeter, monkeypatch, LOGGER, "repo")
    agent = f"printf '%s\\n' \"$(ls /proc/self/fd | tr '\\n' ' ')\" >> {flags}/agentfds; " + AGENT
    fleeter.write_tasks(
        f'[agents.sh]\ncommand = ["/bin/sh", "-c", {json.dumps(agent)}]\n'
        + "".join(task(f"t{i}", "repo", VPARENT.format(flags=flags)) for i in range(3))
    )
    r = fleeter.run("tasks.toml", "--max-tasks", "2")
    assert r.ret == 0, r.stdout + r.stderr
    assert fleeter.states() == {"t0": "DONE", "t1": "DONE", "t2": "DONE"}
    wrappers = [ln.split() for ln in (flags / "vparents").read_text().splitlines()]
    assert wrappers == [[sys.executable, "-I", "-S", shepherd.SHEPHERD_PATH, shepherd.STARTER_ARG]] * 3, wrappers
    assert [ln.split() for ln in (flags / "vfds").read_text().splitlines()] == [["0", "1", "2", "3"]] * 3
    assert [ln.split() for ln in (flags / "agentfds").read_text().splitlines()] == [["0", "1", "2", "3"]] * 3


def test_a_starter_that_dies_leaves_shepherds_started_by_path(fleeter, monkeypatch, stray_fd):
    # the first agent kills the starter that forked its shepherd: the run goes on, the
    # next shepherds spawned by path by the supervisor itself, and says so once
    flags = git_wrapper(fleeter, monkeypatch, LOGGER, "repo")
    # (only a starter: without one the shepherd's parent is the supervisor, this test)
    kill = (
        'pp=$(cut -d" " -f4 /proc/$PPID/stat); '
        'if [ ! -e {flags}/killed ] && tr "\\0" " " < /proc/$pp/cmdline | grep -q -- " --starter"; '
        "then touch {flags}/killed; kill -9 $pp; fi; "
    )
    fds = f"printf '%s\\n' \"$(ls /proc/self/fd | tr '\\n' ' ')\" >> {flags}/agentfds; "
    agent = PARENT.format(flags=flags) + kill.format(flags=flags) + fds + AGENT
    fleeter.write_tasks(
        f'[agents.sh]\ncommand = ["/bin/sh", "-c", {json.dumps(agent)}]\n'
        + "".join(task(f"t{i}", "repo", VPARENT.format(flags=flags)) for i in range(3))
    )
    r = fleeter.run("tasks.toml", "--max-tasks", "1")
    assert r.ret == 0, r.stdout + r.stderr
    assert fleeter.states() == {"t0": "DONE", "t1": "DONE", "t2": "DONE"}
    first, *rest = [ln.split(" ", 1) for ln in (flags / "parents").read_text().splitlines()]
    assert first[1].split()[-1] == shepherd.STARTER_ARG, first
    assert [int(pid) for pid, _ in rest] == [os.getpid()] * 2, rest
    # and every verifier's wrapper, the first task's too, an interpreter started by path
    wrappers = [ln.split() for ln in (flags / "vparents").read_text().splitlines()]
    assert [w[:4] for w in wrappers] == [[sys.executable, "-I", "-S", CAPPED_PATH]] * 3, wrappers
    # a shepherd started by path closes what it was spawned with: its agent gets none of it
    assert [ln.split() for ln in (flags / "agentfds").read_text().splitlines()] == [["0", "1", "2", "3"]] * 3
    assert [ln.split() for ln in (flags / "vfds").read_text().splitlines()] == [["0", "1", "2", "3"]] * 3
    assert r.stderr.count("the shepherd starter is gone") == 1, r.stderr


def test_work_left_uncommitted_is_committed_without_asking_git_status(fleeter, monkeypatch):
    # the agent leaves a new file uncommitted: the ls-files that looks for embedded
    # repositories lists it, so the collect commits it without a `git status` first
    flags = git_wrapper(fleeter, monkeypatch, LOGGER, "repo")
    fleeter.write_tasks('[agents.sh]\ncommand = ["/bin/sh", "-c", "echo x > left.txt"]\n' + task("t1", "repo", "true"))
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    assert fleeter.states() == {"t1": "DONE"}
    ran = pinned_git(flags)
    assert "status" not in ran and ran.count("ls-files") == 1 and ran.count("commit") == 1, ran
    t = fleeter.task("t1")
    assert "left.txt" in fleeter.git(fleeter.path / "repo", "ls-tree", "-r", "--name-only", t.branch)


def test_work_left_uncommitted_is_committed_on_the_branch_its_head_file_names_without_asking_git(fleeter, monkeypatch):
    # the check that HEAD is still on the task's branch, before fleetrun commits there,
    # reads the worktree's HEAD file in the repository's administrative folder (what
    # git reads): no `git symbolic-ref` when it names the branch. One that names another
    # branch is asked of git, and refused (test_security_worktree.py's
    # test_head_moved_off_the_task_branch_gets_no_commit)
    flags = git_wrapper(fleeter, monkeypatch, LOGGER, "repo")
    fleeter.write_tasks('[agents.sh]\ncommand = ["/bin/sh", "-c", "echo x > left.txt"]\n' + task("t1", "repo", "true"))
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    assert fleeter.states() == {"t1": "DONE"}
    assert pinned_git(flags) == ["ls-files", "add", "config", "commit", "rev-parse"], pinned_git(flags)


def test_an_attempts_folder_is_its_files_and_no_folder(fleeter, monkeypatch):
    # every file an attempt makes costs an inode, which on a busy disk is most of what a
    # small write costs (~0.4 ms of CPU each, measured): a trivial attempt leaves these,
    # its verifier's record was one file beside its output (no `children/` folder), and
    # its shepherd, forked by the starter, had nothing to say (no `shepherd.out`)
    one_task(fleeter, monkeypatch)
    (adir,) = (fleeter.home / "attempts").iterdir()
    names = sorted(p.name + ("/" if p.is_dir() else "") for p in adir.iterdir())
    assert names == ["log", "prompt", "spec.json", "start.lock", "status.json", "verify-1.out"], names


def test_a_forked_shepherd_that_has_something_to_say_makes_its_output_file(tmp_path):
    # a shepherd forked for an attempt that already ran says so, in its shepherd.out,
    # made on that first word; one for a folder that is not there is an error answer
    from fleetrun.hosts import ShepherdStarter

    adir = tmp_path / "a1"
    adir.mkdir()
    (adir / shepherd.SPEC).write_text(json.dumps({"attempt_id": "a1", "argv": ["/bin/true"]}))
    (adir / shepherd.STATUS).write_text(json.dumps({"state": "ended"}))
    starter = ShepherdStarter(tmp_path / "starter.out")
    try:
        pid = starter.start(str(adir), dict(os.environ))
        deadline = time.monotonic() + 120  # bounds a hang only
        while shepherd.proc_token(pid) is not None:  # until it has exited (a zombie has)
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with pytest.raises(OSError) as e:
            starter.start(str(tmp_path / "gone"), dict(os.environ))
        assert e.value.errno == 2
    finally:
        starter.close()
    out = (adir / shepherd.SHEPHERD_OUT).read_text()
    assert "already ran here (its status says ended)" in out, out
    assert json.loads((adir / shepherd.STATUS).read_text()) == {"state": "ended"}


# Logs, for each of fleetrun's pinned commands, whether the worktree's index was written
# (replaced by git's index.lock: a new inode) while it ran.
INDEX_LOGGER = """#!/bin/sh
gd=""
for a in "$@"; do case "$a" in --git-dir=*) gd="${{a#--git-dir=}}";; esac; done
before=$( [ -n "$gd" ] && stat -c %i "$gd/index" 2>/dev/null )
"{git}" "$@"
rc=$?
if [ -n "$gd" ]; then
  after=$(stat -c %i "$gd/index" 2>/dev/null)
  echo "$* index:$( [ "$before" = "$after" ] && echo kept || echo written )" >> "{flags}/git.log"
fi
exit $rc
"""


def test_the_collects_git_status_writes_no_index(fleeter, monkeypatch):
    # git status refreshes a worktree's index and writes it back (an index.lock made and
    # renamed: a new file, ~0.4 ms of CPU on a busy disk) when it may; the collect only
    # asks whether there is work to commit, and `git worktree remove` refreshes it anyway
    flags = git_wrapper(fleeter, monkeypatch, INDEX_LOGGER, "repo")
    fleeter.write_tasks(f'[agents.sh]\ncommand = ["/bin/sh", "-c", {json.dumps(AGENT)}]\n' + task("t1", "repo", "true"))
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    assert fleeter.states() == {"t1": "DONE"}
    ran = [ln.split() for ln in (flags / "git.log").read_text().splitlines()]
    status = [words[-1] for words in ran if "status" in words and "core.fsmonitor=false" in words]
    assert status == ["index:kept"], ran

"""What a trivial task costs in processes (issue 24, the per-task CPU): the git commands
and the interpreters fleetrun starts for one task whose agent commits its own work, each
counted from a log, never timed.

A ``git`` first on PATH logs its arguments and runs the real one; the counts below are
what fleetrun itself runs (its ``-c core.fsmonitor=false`` settings mark its commands
apart from the agent's own ``git add`` and ``git commit``).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from .test_offpath import AGENT, git_wrapper, task

LOGGER = '''#!/bin/sh
echo "$*" >> "{flags}/git.log"
exec "{git}" "$@"
'''


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
    fleeter.write_tasks(f'[agents.sh]\ncommand = ["/bin/sh", "-c", {json.dumps(AGENT)}]\n'
                        + task("t1", "repo", verify))
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

"""`status` and `logs` say where a task's work is (issue 14): the worktree, while it
exists (a peer's is on the peer), and the branch."""

from __future__ import annotations

import json
import os
from pathlib import Path

from .test_local_loop import one_task


def needs_human(fleeter, fake_claude):
    one_task(fleeter, extra="max_retries = 0", verify='run = "false"')
    fake_claude.script(t1=[{"actions": [["write", "out.txt", "x"]]}])
    assert fleeter.run("tasks.toml").ret == 1
    return fleeter.task("t1")


def row_of(r, task):
    header = next(line for line in r.outlines if line.startswith("NAME"))
    row = next(line for line in r.outlines if task.id in line)
    return header, row


def test_status_has_a_worktree_column_while_the_worktree_exists(fleeter, fake_claude, monkeypatch):
    task = needs_human(fleeter, fake_claude)
    monkeypatch.setenv("COLUMNS", "200")
    r = fleeter.run("status")
    assert all(len(line) <= 200 for line in r.outlines), "\n".join(r.outlines)
    header, row = row_of(r, task)
    assert "WORKTREE" in header and header.index("BRANCH") < header.index("WORKTREE") < header.index("REASON")
    start = header.index("WORKTREE")
    cell = row[start : header.index("REASON")].strip()
    # the home is shown as ~ when it is under $HOME; cut on the left, the folder's own name stays
    assert cell.endswith(Path(task.worktree).name)
    wide = fleeter.run("status", "--wide")
    assert task.worktree in row_of(wide, task)[1]
    fleeter.run("gc", "--yes", "--force")
    header, row = row_of(fleeter.run("status"), task)
    assert row[header.index("WORKTREE") : header.index("REASON")].strip() == "-"


def test_status_cuts_a_worktree_path_on_the_left_and_leaves_it_out_first_when_narrow(fleeter, fake_claude, monkeypatch):
    task = needs_human(fleeter, fake_claude)
    monkeypatch.setenv("COLUMNS", "118")
    r = fleeter.run("status")
    assert all(len(line) <= 118 for line in r.outlines), "\n".join(r.outlines)
    header, row = row_of(r, task)
    if "WORKTREE" in header:
        cell = row[header.index("WORKTREE") : header.index("REASON")].strip()
        assert cell.startswith("…") and cell.endswith(task.id)
    monkeypatch.setenv("COLUMNS", "80")
    r = fleeter.run("status")
    assert all(len(line) <= 80 for line in r.outlines), "\n".join(r.outlines)
    assert "WORKTREE" not in row_of(r, task)[0]
    r.fnmatch_lines(["(cut to fit 80 columns; *WORKTREE* left out; --wide shows all)"])


def test_status_says_a_peer_tasks_worktree_is_on_the_peer(fleeter, fake_claude, monkeypatch):
    task = needs_human(fleeter, fake_claude)
    with fleeter.ledger().tx() as cur:  # as if it had run on the peer "mini"
        cur.execute("UPDATE tasks SET host='mini', worktree='/home/u/.fleetrun/worktrees/t1-x' WHERE id=?", (task.id,))
    r = fleeter.run("status", "--wide")
    assert "/home/u/.fleetrun/worktrees/t1-x (on mini)" in row_of(r, task)[1]
    fleeter.run("logs", "t1").fnmatch_lines(
        ["worktree: /home/u/.fleetrun/worktrees/t1-x on mini (on the peer; fleetrun gc here does not touch it)"]
    )
    fleeter.run("gc").fnmatch_lines(
        [
            f"worktree of needs_human task t1 {task.id}: /home/u/.fleetrun/worktrees/t1-x "
            "on mini (on the peer: not touched here)"
        ]
    )


def test_logs_says_gc_collects_an_ended_tasks_worktree(fleeter, fake_claude):
    task = needs_human(fleeter, fake_claude)
    fleeter.run("logs", "t1").fnmatch_lines(
        [
            f"worktree: {task.worktree}",
            f"branch: {task.branch}",
            "(the task has ended: `fleetrun gc` lists its worktree, `fleetrun gc --branches` its branch)",
        ]
    )
    (row,) = json.loads(fleeter.run("status", "--json").stdout)
    assert row["worktree"] == task.worktree and os.path.isdir(task.worktree)

"""The queue's digest, through the real command line: what an unchanged file's queue is
found by again. Each input of what a queue would do changes it (a task's key, a task
more, a default at the file's top, the file's ``[agents]`` tables, ``-k``, ``-m``, where
a ``cwd`` leads; the project file's defaults: ``tests/test_projconf.py``); how the file
is written does not (comments, the order of the tasks and of their keys, quoting, a
sub-table written inline). A queue made before the digest's version 2 is still resumed.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
from typing import Any

import pytest

from fleetrun.fleeter import Fleeter

TASKS = """\
model = "sonnet"

[agents.demo]
command = ["demo-agent", "{prompt}"]

[[task]]
name = "a"
cwd = "repo"
prompt = "Write a.txt."
max_retries = 1
tags = ["api"]

  [[task.verify]]
  run = "test -f a.txt"

[[task]]
name = "b"
cwd = "repo"
prompt = "Write b.txt."
depends_on = ["a"]
"""


def digests(fleeter: Fleeter) -> list[str]:
    with sqlite3.connect(fleeter.home / "state.db") as db:
        return [h for (h,) in db.execute("SELECT source_hash FROM queues ORDER BY created, rowid")]


def queue(fleeter: Fleeter, *args: str) -> str:
    result = fleeter.run("queue", *args, "tasks.toml")
    assert result.ret == 0, result.stderr
    return digests(fleeter)[-1]


COUNTS = {
    "a task's prompt": ('prompt = "Write a.txt."', 'prompt = "Write A.txt."'),
    "a task's limit": ("max_retries = 1", "max_retries = 2"),
    "a task's tag": ('tags = ["api"]', 'tags = ["api", "slow"]'),
    "a verifier's command": ('run = "test -f a.txt"', 'run = "test -s a.txt"'),
    "a dependency": ('depends_on = ["a"]', "depends_on = []"),
    "a key a task adds": ('name = "b"\n', 'name = "b"\nbudget_usd = 2\n'),
    "a task more": ('depends_on = ["a"]\n', 'depends_on = ["a"]\n\n[[task]]\nname = "c"\ncwd = "repo"\nprompt = "c"\n'),
    "a default at the file's top": ('model = "sonnet"', 'model = "opus"'),
    "a default added at the file's top": ('model = "sonnet"', 'model = "sonnet"\ntimeout_min = 5'),
    "an [agents] table": ('"demo-agent"', '"demo-agent-2"'),
}


@pytest.mark.parametrize("change", list(COUNTS), ids=list(COUNTS))
def test_each_input_of_what_a_queue_does_changes_its_digest(fleeter: Fleeter, change: str) -> None:
    fleeter.make_repo("repo")
    fleeter.write_tasks(TASKS)
    first = queue(fleeter)
    assert queue(fleeter) == first  # unchanged: the same digest
    old, new = COUNTS[change]
    assert old in TASKS
    fleeter.write_tasks(TASKS.replace(old, new, 1))
    assert queue(fleeter) != first


def test_k_and_m_change_the_digest(fleeter: Fleeter) -> None:
    fleeter.make_repo("repo")
    fleeter.write_tasks(TASKS)
    plain, by_k, by_m = queue(fleeter), queue(fleeter, "-k", "a"), queue(fleeter, "-m", "api")
    assert len({plain, by_k, by_m}) == 3
    assert queue(fleeter, "-k", "a") == by_k


def test_where_a_cwd_leads_changes_the_digest(fleeter: Fleeter) -> None:
    """The same text, ``cwd = "repo"``, leading to another folder (a symlink moved):
    the tasks would run elsewhere."""
    one, two = fleeter.make_repo("one"), fleeter.make_repo("two")
    os.symlink(one, fleeter.path / "repo")
    fleeter.write_tasks(TASKS)
    first = queue(fleeter)
    os.unlink(fleeter.path / "repo")
    os.symlink(two, fleeter.path / "repo")
    assert queue(fleeter) != first


REWRITES = {
    "a comment and blank lines": lambda t: "# the nightly run\n\n" + t.replace("[[task]]\n", "\n# next\n[[task]]\n"),
    "the tasks in another order": lambda t: (
        t[: t.index("[[task]]")]
        + t[t.index('[[task]]\nname = "b"') :]
        + "\n"
        + t[t.index("[[task]]") : t.index('[[task]]\nname = "b"')]
    ),
    "a task's keys in another order": lambda t: t.replace(
        'name = "a"\ncwd = "repo"\nprompt = "Write a.txt."', 'prompt = "Write a.txt."\nname = "a"\ncwd = "repo"'
    ),
    "other quotes": lambda t: t.replace('prompt = "Write b.txt."', "prompt = 'Write b.txt.'"),
    "a verifier written inline": lambda t: t.replace(
        'tags = ["api"]\n\n  [[task.verify]]\n  run = "test -f a.txt"\n',
        'tags = ["api"]\nverify = [{ run = "test -f a.txt" }]\n',
    ),
    "the [agents] table written as a dotted key": lambda t: t.replace(
        '[agents.demo]\ncommand = ["demo-agent", "{prompt}"]', 'agents.demo.command = ["demo-agent", "{prompt}"]'
    ),
}


@pytest.mark.parametrize("rewrite", list(REWRITES), ids=list(REWRITES))
def test_how_the_file_is_written_does_not_change_the_digest(fleeter: Fleeter, rewrite: str) -> None:
    fleeter.make_repo("repo")
    fleeter.write_tasks(TASKS)
    first = queue(fleeter)
    text = REWRITES[rewrite](TASKS)
    assert text != TASKS
    fleeter.write_tasks(text)
    assert queue(fleeter) == first


# -- a queue made before version 2 -------------------------------------------------------

POSITION_FIELDS = ("source", "line", "key_lines", "defaulted")


def version_1_digest(fleeter: Fleeter, queue_id: str, files: str) -> str:
    """What the code before version 2 wrote as the queue's digest, made here from the
    ledger's rows (each spec as the ledger keeps it is what that digest encoded, less
    where it was written): ``FILES|tasks=SHA256(json.dumps([sorted([name, spec]...),
    settings], sort_keys=True, default=str, separators=(",", ":")))|k=``."""
    with sqlite3.connect(fleeter.home / "state.db") as db:
        rows = db.execute("SELECT name, spec FROM tasks WHERE queue_id=?", (queue_id,)).fetchall()
        (settings,) = db.execute("SELECT settings FROM queues WHERE id=?", (queue_id,)).fetchone()
    whole = []
    for name, text in rows:
        spec = json.loads(text)
        for key in POSITION_FIELDS:
            del spec[key]
        for key in ("verify", "setup"):
            spec[key] = [{k: v for k, v in step.items() if k != "line"} for step in spec[key]]
        whole.append((name, spec))
    body = json.dumps([sorted(whole), json.loads(settings)], sort_keys=True, default=str, separators=(",", ":"))
    return f"{files}|tasks={hashlib.sha256(body.encode()).hexdigest()}|k="


def test_a_queue_made_with_the_version_1_digest_is_resumed(
    fleeter: Fleeter, fake_claude: Any, monkeypatch: Any
) -> None:
    """A ledger whose queue holds the digest the code before version 2 wrote (made here
    as it made it): an unchanged file resumes that queue, its DONE work not done again;
    the specs' digest (0.8 s at 100,000 tasks) is made only for a ledger that holds such
    a queue of these files; a changed file makes a new queue, its unchanged DONE tasks
    kept."""
    from fleetrun import rerun

    fleeter.make_repo("repo")
    # no model (the fake claude's default), each task on a branch, a verifier the fake's work passes
    text = TASKS.replace('model = "sonnet"', 'git_ref = "main"').replace("test -f a.txt", "test -f out.txt")
    fleeter.write_tasks(text)
    fake_claude.script(default=[{"actions": [["write", "out.txt", "x"], ["commit", "work"]], "result": "did it"}])
    made: list[int] = []
    real = rerun.files_digest

    def files_digest(specs: Any, settings: Any) -> str:
        made.append(len(specs))
        return real(specs, settings)

    monkeypatch.setattr(rerun, "files_digest", files_digest)
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    assert made == []  # a new ledger: no queue of version 1
    files = str(fleeter.path / "tasks.toml")
    (queue_id,) = {t.queue_id for t in fleeter.ledger().tasks()}
    (mine,) = digests(fleeter)
    assert mine.startswith(f"{files}|tasks2=")
    with sqlite3.connect(fleeter.home / "state.db") as db:
        db.execute("UPDATE queues SET source_hash=? WHERE id=?", (version_1_digest(fleeter, queue_id, files), queue_id))
    calls = len(fake_claude.calls())

    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    r.fnmatch_lines([f"resuming queue {queue_id} from an unchanged file (2 done)*"])
    assert made == [2]  # made, once, to find the queue of version 1
    assert len(fake_claude.calls()) == calls
    assert len(fleeter.ledger().tasks()) == 2

    fleeter.write_tasks(text.replace("Write b.txt.", "Write B.txt."))
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    r.no_fnmatch_line("*resuming queue*")
    r.fnmatch_lines(["1 unchanged (done earlier): a; --new-queue runs it again"])
    assert len(fleeter.ledger().tasks()) == 4

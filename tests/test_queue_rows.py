"""What ``fleetrun queue`` writes, row for row, for a varied tasks file: the ledger's
``queues``, ``tasks``, ``transitions``, ``deps`` and ``notes`` rows, what ``queue``
prints, the ``queued`` events and ``status --json``.

The expected rows are in ``tests/golden/queue/``, written once by the code before the
queue was made cheap per task (``python tests/test_queue_rows.py --write DIR`` with that
code first on ``PYTHONPATH``); the queue must write them again unchanged, but for two
things: a task's ``key_lines`` in the ledger hold the lines of the defaults it took only
(where its own keys were written is found in the file when an error asks, not kept for
every task: docs/durability.md, "What the ledger keeps of a task"), and a queue's digest
is version 2's, ``|tasks2=`` (the tables the tasks were made from, not every field of
every spec: docs/durability.md, "The queue's digest"; a queue of version 1 is still
resumed, ``test_a_queue_made_with_the_version_1_digest_is_resumed``).

Ids, times and the temporary folder are replaced by stable words before comparing.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

GOLDEN = Path(__file__).parent / "golden" / "queue"
N = 60


def tasks_toml() -> str:
    """60 tasks of every kind of key: file defaults (a list, a number, setup), their own
    values over them, verifiers of three kinds with names and a run verifier's keys,
    setup as strings and tables, tags, paths, Claude Code options, fan-in and fan-out,
    ``base = "dependencies"``, escapes and non-ASCII text."""
    out = [
        'model = "sonnet"\nmax_retries = 1\nrequires = ["bench-never"]\ntags = ["nightly"]\n'
        'setup = ["make deps"]\ngit_ref = "main"\n\n'
    ]
    for i in range(N):
        lines = [f'[[task]]\nname = "t{i:02d}"\ncwd = "repo"\nprompt = "do item {i}: café \\"{i}\\""']
        deps = [f"t{j:02d}" for j in (i - 1, i - 3, i // 2) if 0 <= j < i]
        deps = list(dict.fromkeys(deps))
        if deps:
            lines.append(f"depends_on = {json.dumps(deps)}")
        if i % 5 == 1 and deps:
            lines.append('base = "dependencies"')
            if i % 10 == 1:
                lines.append('on_conflict = "agent"')
        if i % 4 == 0:
            lines.append('model = "opus"\nmax_retries = 3\ntimeout_min = 30\nstall_timeout_min = 5.5')
        if i % 6 == 2:
            lines.append('tags = ["api", "slow"]\nbudget_usd = 2.5\npermission_mode = "acceptEdits"')
        if i % 7 == 3:
            lines.append('setup = ["uv sync", { run = "make db", timeout_s = 120 }]')
        if i % 9 == 4:
            lines.append('requires = []\npaths = ["src", "docs/x.md"]' + ("" if i % 7 == 3 else "\nsetup = []"))
        if i % 8 == 5:
            lines.append('allowed_tools = ["Bash(git:*)", "Edit"]\nmax_turns = 12\nappend_system_prompt = "be brief"')
        if i % 11 == 6:
            lines.append('branch = "fleet/item-' + str(i) + '"')
        block = "\n".join(lines) + "\n"
        if i % 3 == 0:
            block += '\n  [[task.verify]]\n  run = "pytest -q"\n  name = "unit"\n  timeout_s = 60\n'
        if i % 3 == 1:
            block += '\n  [[task.verify]]\n  run = "true"\n  baseline = false\n'
            block += '\n  [[task.verify]]\n  brain = "Is the change small?"\n  model = "haiku"\n'
        if i % 10 == 7:
            block += '\n  [[task.verify]]\n  agent = "review it"\n  budget_usd = 1\n'
        out.append(block + "\n")
    return "".join(out)


def make_repo(root: Path) -> None:
    repo = root / "repo"
    repo.mkdir(parents=True)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
    (repo / "README").write_text("x\n")
    subprocess.run([*git, "add", "README"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "init"], check=True)


def queue_and_read(root: Path) -> dict[str, Any]:
    """Queue ``root``'s tasks file with ``python -m fleetrun`` (whichever fleetrun is first
    on ``PYTHONPATH``) and read back everything it wrote, made stable."""
    make_repo(root)
    (root / "tasks.toml").write_text(tasks_toml(), encoding="utf-8")
    home = root / "home"
    home.mkdir(mode=0o700)
    env = {**os.environ, "FLEETRUN_HOME": str(home), "TERM": "dumb"}
    run = [sys.executable, "-m", "fleetrun"]
    queued = subprocess.run([*run, "queue", "tasks.toml"], cwd=root, env=env, capture_output=True, text=True)
    assert queued.returncode == 0, queued.stderr
    status = subprocess.run([*run, "status", "--json"], cwd=root, env=env, capture_output=True, text=True)
    assert status.returncode == 0, status.stderr
    conn = sqlite3.connect(home / "state.db")
    conn.row_factory = sqlite3.Row

    def rows(sql: str) -> list[dict[str, Any]]:
        return [dict(r) for r in conn.execute(sql)]

    got = {
        "queues": rows("SELECT source, source_hash, settings FROM queues"),
        "tasks": rows(
            "SELECT id, name, state, spec, source, queue_id, seq, reason, host, branch, handoff FROM tasks ORDER BY seq"
        ),
        "transitions": rows("SELECT task_id, from_state, to_state, cause, attempt, host FROM transitions ORDER BY id"),
        "deps": rows("SELECT task_id, dep_id FROM deps ORDER BY rowid"),
        "notes": rows("SELECT task_id, text FROM notes ORDER BY id"),
        "printed": queued.stdout.splitlines(),
        "events": [json.loads(line) for line in (home / "events.ndjson").read_text().splitlines()],
        "status": json.loads(status.stdout),
    }
    conn.close()
    # a digest of the tasks, their absolute cwd included: test_files_digest_is_the_whole_texts
    for q in got["queues"]:
        q["source_hash"] = re.sub(r"(tasks2?)=[0-9a-f]{64}", r"\1=<DIGEST>", q["source_hash"])
    text = json.dumps(got, indent=1, sort_keys=True, ensure_ascii=False)
    # stable words for what differs from run to run
    queue_id = got["tasks"][0]["queue_id"]
    text = text.replace(str(root.resolve()), "<ROOT>").replace(str(root), "<ROOT>").replace(queue_id, "<QUEUE>")
    text = re.sub(r'"(at|created|updated)": [^,\n]+', r'"\1": "<TIME>"', text)
    return json.loads(text)


def own_key_lines_aside(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with each ledger spec's ``key_lines`` cut to the defaults' (see the module's docstring)."""
    for row in data["tasks"]:
        spec = json.loads(row["spec"])
        spec["key_lines"] = {k: v for k, v in spec["key_lines"].items() if k in spec["defaulted"]}
        row["spec"] = json.dumps(spec)
    return data


def digest_version_2(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with each queue's digest named as version 2 names it (the module's docstring)."""
    for q in data["queues"]:
        q["source_hash"] = q["source_hash"].replace("|tasks=<DIGEST>", "|tasks2=<DIGEST>")
    return data


def test_queue_writes_the_rows_it_wrote_before(tmp_path: Path) -> None:
    got = queue_and_read(tmp_path / "q")
    want = digest_version_2(own_key_lines_aside(json.loads((GOLDEN / "rows.json").read_text(encoding="utf-8"))))
    assert len(got["tasks"]) == N and len(got["printed"]) == N  # the comparison below means something
    assert any(json.loads(r["spec"])["key_lines"] for r in got["tasks"])  # some took a default's line
    for key in want:
        assert got[key] == want[key], key


def test_files_digest_is_the_whole_texts(tmp_path: Path) -> None:
    """The digest a queue is resumed by, fed a task at a time, is the SHA-256 of the
    whole text it always was: an unchanged file queued before is still found."""
    import hashlib

    from fleetrun.collect import KeyTable, collect_toml
    from fleetrun.rerun import POSITION_FIELDS, files_digest
    from fleetrun.taskspec import KeyDecl

    make_repo(tmp_path)
    (tmp_path / "tasks.toml").write_text(tasks_toml(), encoding="utf-8")
    kinds = [[KeyDecl(k, (str,), where="verify_kind") for k in ("run", "brain", "agent")]]
    from fleetrun.taskkeys import RUN_VERIFY_KEYS

    kinds.append(list(RUN_VERIFY_KEYS))
    claude = [KeyDecl(k, (int, str, list, bool)) for k in ("max_turns", "append_system_prompt")]
    specs = collect_toml(tmp_path / "tasks.toml", KeyTable.build([*kinds, claude]), "tasks.toml").tasks
    settings = {"agents": {"x": {"command": ["é", 1.5]}}}

    def whole(spec: Any) -> dict[str, Any]:
        data = {k: v for k, v in spec.to_json().items() if k not in POSITION_FIELDS}
        for key in ("verify", "setup"):
            data[key] = [{k: v for k, v in step.items() if k != "line"} for step in data[key]]
        return data

    rows = sorted((s.name, whole(s)) for s in specs)
    text = json.dumps([rows, settings], sort_keys=True, default=str, separators=(",", ":"))
    assert len(specs) == N
    assert files_digest(specs, settings) == hashlib.sha256(text.encode()).hexdigest()
    assert files_digest(list(reversed(specs)), settings) == files_digest(specs, settings)
    empty = json.dumps([[], {}], sort_keys=True, default=str, separators=(",", ":"))
    assert files_digest([], {}) == hashlib.sha256(empty.encode()).hexdigest()


if __name__ == "__main__":  # pragma: no cover - run by hand, with the code before on PYTHONPATH
    if sys.argv[1:2] == ["--write"]:
        import tempfile

        dest = Path(sys.argv[2]).resolve()
        dest.mkdir(parents=True, exist_ok=True)
        data = queue_and_read(Path(tempfile.mkdtemp()) / "q")
        (dest / "rows.json").write_text(json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False) + "\n")

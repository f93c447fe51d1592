"""The ``events`` plugin: the versioned event stream (docs/events.md) through the real
CLI, its rotation, ``--events -``, its config keys, and the schema check every test's
events go through (``tests/conftest.py``)."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import re
import shlex
import stat
from pathlib import Path
from typing import Any

import pytest
from eventcheck import event_files, event_problems

import fleetrun
from fleetrun.plugins.events import stamp
from fleetrun.plugins.events.log import HomeLog, chunks
from fleetrun.plugins.events.schema import check_lines, load_schema
from fleetrun.taskspec import TaskSpec
from fleetrun.waiting import TICKERS_KEY

DOCS = Path(__file__).resolve().parents[1] / "docs" / "events.md"
TYPES = {
    "run_start",
    "run_end",
    "queued",
    "transition",
    "attempt_started",
    "attempt_ended",
    "verdict",
    "waiting",
}  # peer_heartbeat: tests/acceptance/test_events_peer.py


def read_events(home: Path) -> list[dict[str, Any]]:
    """The home's events, the rotated files' first (oldest first)."""
    files = sorted(home.glob("events.ndjson*"), key=lambda p: -int(p.suffix[1:]) if p.suffix[1:].isdigit() else 0)
    return [json.loads(line) for f in files for line in f.read_text().splitlines()]


def test_a_run_streams_every_type_on_stdout_rotates_and_validates(fleeter: Any, fake_claude: Any) -> None:
    """One run through the real CLI as a subprocess, with ``--events -`` and a small
    ``[events] max_bytes``: every event type, stdout holds only event lines (the
    terminal's output is on stderr), the home's log is rotated, 0600, and every line
    follows the schema."""
    fleeter.make_repo()
    fleeter.write_tasks("""
        [[task]]
        name = "a"
        cwd = "repo"
        prompt = "Write a.txt."
        git_ref = "main"
        [[task.verify]]
        run = "test -f a.txt"

        [[task]]
        name = "b"
        cwd = "repo"
        prompt = "Write b.txt."
        git_ref = "main"
    """)
    fleeter.write_config("[events]\nmax_bytes = 1800\nkeep = 2\n")
    # a's first attempt writes nothing: its verifier fails, attempt 2 (a retry) passes
    fake_claude.script(
        a=[{"result": "nothing", "cost": 0.01}, {"actions": [["write", "a.txt", "a"], ["commit", "a"]], "cost": 0.02}]
    )
    r = fleeter.runsub("tasks.toml", "--events", "-", "--max-tasks", "1")
    assert r.ret == 0, r.stdout + r.stderr
    streamed = [json.loads(line) for line in r.outlines]  # every stdout line is an event
    r.fnmatch_lines(["*a DONE (attempt 2)*", "=== 2 done in *"], stream="err")
    assert {e["type"] for e in streamed} == TYPES
    assert all(e["v"] == 1 and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", e["at"]) for e in streamed)
    assert streamed[0]["type"] == "run_start" and streamed[-1]["type"] == "run_end"
    assert streamed[-1]["exit_status"] == 0 and streamed[-1]["counts"] == {"DONE": 2}
    a = fleeter.task("a")
    queued = [e for e in streamed if e["type"] == "queued"]
    assert [(e["name"], e["to"], e["cause"]) for e in queued] == [("a", "READY", "queued"), ("b", "READY", "queued")]
    assert queued[0]["task"] == a.id and queued[0]["queue"] == a.queue_id == streamed[-1]["queue"]
    # every transition says where it came from (entering the ledger is `queued`)
    moves = [(e["from"], e["to"], e["attempt"]) for e in streamed if e["type"] == "transition" and e["task"] == a.id]
    assert moves == [
        ("READY", "ASSIGNED", 1),
        ("ASSIGNED", "RUNNING", 1),
        ("RUNNING", "VERIFYING", 1),
        ("VERIFYING", "RETRYING", 1),
        ("RETRYING", "ASSIGNED", 2),
        ("ASSIGNED", "RUNNING", 2),
        ("RUNNING", "VERIFYING", 2),
        ("VERIFYING", "DONE", 2),
    ]
    started = [e for e in streamed if e["type"] == "attempt_started" and e["task"] == a.id]
    ended = [e for e in streamed if e["type"] == "attempt_ended" and e["task"] == a.id]
    assert [(e["attempt"], e["kind"], e["host"]) for e in started] == [(1, "fresh", "local"), (2, "retry", "local")]
    assert all(isinstance(e["pid"], int) for e in started)
    assert [(e["attempt"], e["exit_code"], e["cost_usd"]) for e in ended] == [(1, 0, 0.01), (2, 0, 0.02)]
    assert ended[0]["session_id"] == fleeter.ledger().attempts(a.id)[0].session_id
    verdicts = [(e["attempt"], e["kind"], e["label"], e["passed"]) for e in streamed if e["type"] == "verdict"]
    assert verdicts == [(1, "run", "test -f a.txt", False), (2, "run", "test -f a.txt", True)]
    # b waited for the one slot a held
    [waiting] = [e for e in streamed if e["type"] == "waiting"]
    assert waiting["name"] == "b" and waiting["reason"]
    # the home's log: rotated to events.ndjson.1 and .2, the oldest dropped; what is kept
    # is the end of what was streamed, line for line
    names = sorted(p.name for p in fleeter.home.glob("events.ndjson*"))
    assert names == ["events.ndjson", "events.ndjson.1", "events.ndjson.2"]
    kept = read_events(fleeter.home)
    assert kept == streamed[-len(kept) :] and len(kept) < len(streamed)
    assert all(p.stat().st_size <= 1800 for p in fleeter.home.glob("events.ndjson*"))
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in fleeter.home.glob("events.ndjson*"))
    # what the suite's own check walks sees the subprocess's files, and they pass it
    assert set(event_files(fleeter.root)) == set(fleeter.home.glob("events.ndjson*"))
    assert check_lines(r.outlines) == []


def test_events_file_is_a_copy_besides_the_homes_log(fleeter: Any, fake_claude: Any) -> None:
    fleeter.make_repo()
    fleeter.write_tasks('[[task]]\nname = "a"\ncwd = "repo"\nprompt = "p"\n')
    r = fleeter.run("tasks.toml", "--events", "out/ev.ndjson")
    assert r.ret == 4  # its folder does not exist: said before anything starts
    assert "ERROR: --events: cannot write to" in r.stderr and not (fleeter.home / "events.ndjson").exists()
    (fleeter.path / "out").mkdir()
    r = fleeter.run("tasks.toml", "--events", "out/ev.ndjson")
    assert r.ret == 0, r.stdout + r.stderr
    assert any("a DONE" in line for line in r.outlines)  # the terminal keeps stdout
    copy = (fleeter.path / "out" / "ev.ndjson").read_text().splitlines()
    assert [json.loads(x) for x in copy] == read_events(fleeter.home)
    assert stat.S_IMODE((fleeter.path / "out" / "ev.ndjson").stat().st_mode) == 0o600
    assert check_lines(copy) == []
    # with `--events -`, what the run itself says before any event goes to stderr too
    (fleeter.path / "empty.toml").write_text("# no tasks yet\n")
    r = fleeter.run("empty.toml", "--events", "-")
    assert (r.ret, r.stdout, r.errlines) == (5, "", ["no tasks collected"])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[events]\nmax_bytes = 0\n", "config.toml:2: events.max_bytes: must be at least 1"),
        ("[events]\nkeep = -1\n", "config.toml:2: events.keep: must be 0 or more"),
        ('[events]\nkeep = "3"\n', "config.toml:2: events.keep:"),
    ],
)
def test_a_bad_events_setting_is_a_usage_error(fleeter: Any, text: str, message: str) -> None:
    fleeter.make_repo()
    fleeter.write_tasks('[[task]]\nname = "a"\ncwd = "repo"\nprompt = "p"\n')
    fleeter.write_config(text)
    r = fleeter.run("tasks.toml")
    assert r.ret == 4 and message in r.stderr, r.stderr
    assert not (fleeter.home / "events.ndjson").exists()


def _append(path: str, who: int, n: int, max_bytes: int, batch: int) -> None:
    """``n`` lines, written ``batch`` lines at a time (``i % batch + 1`` when rotating:
    one line, or a pass's few)."""
    log = HomeLog(Path(path), max_bytes=max_bytes, keep=1000)
    lines = [
        (
            json.dumps(
                {"v": 1, "type": "waiting", "at": stamp(i), "task": f"t{who}", "name": str(i), "reason": "x" * (i % 50)}
            )
            + "\n"
        ).encode()
        for i in range(n)
    ]
    i = 0
    while i < n:
        step = batch if max_bytes > 10**6 else i % batch + 1
        log.write_lines(lines[i : i + step])
        i += step


@pytest.mark.parametrize(("n", "max_bytes", "batch"), [(400, 3000, 6), (3000, 10**7, 1000)])
def test_concurrent_writers_rotate_without_losing_or_cutting_a_line(
    tmp_path: Path, n: int, max_bytes: int, batch: int
) -> None:
    """Two processes append lines one or a few at a time while the file rotates every
    ~40 lines; then in batches of ~140 KiB, written in chunks of whole lines."""
    path = tmp_path / "logs" / "events.ndjson"
    path.parent.mkdir()
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_append, args=(str(path), who, n, max_bytes, batch)) for who in (1, 2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    lines = [line for f in path.parent.glob("events.ndjson*") for line in f.read_text().splitlines()]
    got = [(e["task"], int(e["name"])) for e in map(json.loads, lines)]
    assert sorted(got) == sorted((f"t{w}", i) for w in (1, 2) for i in range(n))
    if max_bytes < 10**6:
        assert len(list(path.parent.glob("events.ndjson.*"))) >= 10
    else:  # one file: each writer's lines in its order
        assert [i for w, i in got if w == "t1"] == list(range(n))
    assert not (path.parent / "events.ndjson.lock").exists()  # the lock is not one of the log's files


def test_a_chunk_is_whole_lines_within_the_limits() -> None:
    lines = [b"a" * 10 + b"\n"] * 5 + [b"b" * 40 + b"\n"]
    assert chunks(lines, 0, 0, 1000, limit=34) == 3  # 3 lines of 11 bytes; a 4th would pass 34
    assert chunks(lines, 3, 0, 1000, limit=34) == 5  # the 41-byte line after them goes alone
    assert chunks(lines, 5, 0, 1000, limit=34) == 6  # longer than the limit: alone, whole
    assert chunks(lines, 0, 80, 100) == 1  # a file of 80 bytes takes one more before 100
    assert chunks(lines, 0, 95, 100) == 0  # not one: rotate first
    assert chunks(lines, 5, 0, 20) == 6  # an empty file takes a line of any length
    assert chunks(lines, 6, 0, 20) == 6  # nothing left


def test_the_validator_names_the_file_and_line_of_a_bad_event(tmp_path: Path) -> None:
    """What fails a test whose run wrote a bad event (the autouse check of conftest.py)."""
    home = tmp_path / "h"
    home.mkdir()
    good = {"v": 1, "type": "waiting", "at": stamp(0), "task": "t1", "name": "a", "reason": "no slot"}
    bad = [
        dict(good, v=2),
        {k: v for k, v in good.items() if k != "reason"},
        {**good, "type": "transition", "from": None, "to": "READY", "cause": "queued", "attempt": None, "host": None},
    ]
    (home / "events.ndjson.1").write_text("\n".join(json.dumps(e) for e in [good, *bad]) + "\n{not json\n")
    problems = event_problems(tmp_path)
    where = str(home / "events.ndjson.1")
    assert [p.split(": ", 1)[0] for p in problems] == [f"{where}:2", f"{where}:3", f"{where}:4", f"{where}:5"]
    assert "v: 1 was expected" in problems[0]
    assert "'reason' is a required property" in problems[1]
    assert "from: None is not one of" in problems[2]
    assert "not JSON" in problems[3]
    (home / "events.ndjson.1").write_text(json.dumps(good) + "\n" + json.dumps(good))  # cut mid-write
    assert event_problems(tmp_path) == [f"{where}: the last line is cut (no newline at its end)"]
    (home / "events.ndjson.1").unlink()  # this test's own teardown check passes


def doc_lines() -> list[str]:
    """The event lines shown in docs/events.md (its ```json blocks, one event a line)."""
    blocks = re.findall(r"```json\n(.*?)```", DOCS.read_text(), re.S)
    return [line for b in blocks for line in b.splitlines() if line.startswith("{")]


def test_the_docs_example_lines_follow_the_schema_and_show_every_type() -> None:
    lines = doc_lines()
    assert check_lines(lines, "docs/events.md") == []
    assert {json.loads(line)["type"] for line in lines} == TYPES | {"peer_heartbeat"}


def test_the_docs_name_every_field_of_every_type() -> None:
    text = DOCS.read_text()
    schema = load_schema()
    missing = [
        f"{t}.{f}"
        for t, sub in schema["$defs"].items()
        for f in sub["properties"]
        if f"`{f}`" not in text or f"`{t}`" not in text
    ]
    assert not missing, missing


def test_the_attempt_hooks_come_once_per_attempt_with_the_recorded_attempt(fleeter: Any, fake_claude: Any) -> None:
    """``fleetrun_attempt_started`` after the move to RUNNING, ``fleetrun_attempt_ended``
    after the end is recorded and before the task moves on; a session that died is
    ended too (its cost unknown), and its resume is an attempt of its own."""
    fleeter.make_repo()
    fleeter.write_tasks('[[task]]\nname = "a"\ncwd = "repo"\nprompt = "p"\ngit_ref = "main"\n')
    fake_claude.script(a=[{"mode": "no_result", "exit": 1}, {"cost": 0.03, "result": "ok"}])
    r = fleeter.inline_run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    calls = r.hooks.getcalls("fleetrun_transition,fleetrun_attempt_started,fleetrun_attempt_ended")
    seen = [
        (c._name, getattr(c, "to_state", None))
        for c in calls
        if c._name != "fleetrun_transition" or c.to_state in ("RUNNING", "VERIFYING", "RESUMING")
    ]
    assert seen == [
        ("fleetrun_transition", "RUNNING"),
        ("fleetrun_attempt_started", None),
        ("fleetrun_attempt_ended", None),
        ("fleetrun_transition", "RESUMING"),
        ("fleetrun_transition", "RUNNING"),
        ("fleetrun_attempt_started", None),
        ("fleetrun_attempt_ended", None),
        ("fleetrun_transition", "VERIFYING"),
    ]
    started = r.hooks.getcalls("fleetrun_attempt_started")
    ended = r.hooks.getcalls("fleetrun_attempt_ended")
    assert [(c.attempt.number, c.attempt.kind, c.attempt.state, c.host.name) for c in started] == [
        (1, "fresh", "running", "local"),
        (2, "resume", "running", "local"),
    ]
    assert [(c.attempt.number, c.attempt.state, c.attempt.exit_code, c.attempt.cost_usd) for c in ended] == [
        (1, "ended", 1, None),
        (2, "ended", 0, 0.03),
    ]
    assert ended[1].result.session_id == ended[1].attempt.session_id and ended[1].task.cost_usd == 0.03


class FirstPasses:
    """Stops the loop after two passes; counts the ``write`` calls into the home's
    ``events.ndjson`` and the lines each carried, and what was written by the end of
    each pass (a ticker: asked at each wait, so after the pass and its hooks)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.writes: list[bytes] = []
        self.after_pass: list[int] = []
        real = os.write

        def write(fd: int, data: Any) -> int:
            if os.readlink(f"/proc/self/fd/{fd}").endswith("/events.ndjson"):
                self.writes.append(bytes(data))
            return real(fd, data)

        monkeypatch.setattr(os, "write", write)

    @fleetrun.hookimpl
    def fleetrun_configure(self, config: Any) -> None:
        config.stash.setdefault(TICKERS_KEY, []).append(self)

    def tick(self) -> float:
        self.after_pass.append(len(self.writes))
        if len(self.after_pass) >= 2:
            raise KeyboardInterrupt
        return 0.0


def test_a_pass_writes_its_lines_in_one_write(fleeter: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """200 READY tasks a draining machine holds: the first pass says each is waiting, and
    the run's start and those 200 lines reach events.ndjson in one ``write``, each line
    whole; the idle pass after it writes nothing; the run's end is written as it stops."""
    repo = fleeter.make_repo()
    fleeter.write_policy("[local]\ndrain = true\n")
    specs = [TaskSpec(name=f"r{i}", prompt="p", cwd=str(repo), git_ref="main") for i in range(200)]
    fleeter.ledger().add_tasks(specs, source="tasks.toml", source_hash="h")
    probe = FirstPasses(monkeypatch)
    r = fleeter.run("work", plugins=[probe])
    assert r.ret == 2, r.stderr  # stopped by the probe, as by Ctrl-C
    assert probe.after_pass == [1, 1]
    first = [json.loads(line) for line in probe.writes[0].decode().splitlines()]
    assert probe.writes[0].endswith(b"\n") and len(first) == 201
    assert first[0]["type"] == "run_start" and {e["type"] for e in first[1:]} == {"waiting"}
    assert [json.loads(w)["type"] for w in probe.writes[1:]] == ["run_end"]
    assert b"".join(probe.writes) == (fleeter.home / "events.ndjson").read_bytes()


def test_the_stamp_is_what_datetime_says() -> None:
    """``stamp`` keeps the second it last formatted (a pass's lines share a few): the
    same text as ``datetime``'s, rounding included, across a second's edge and back."""
    from datetime import datetime, timezone

    rng = random.Random(15)
    times = [rng.uniform(0, 4e9) for _ in range(3000)] + [1764606600 + i / 1000 for i in range(-5, 6)]
    times += [1764606600.9995, 1764606600.9999996, 1764606599.0, 1764606600.0004999]
    for t in times:
        assert stamp(t) == datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="milliseconds")[:-6] + "Z", t


NAMES = ["t1", 'quote " and \\ back', "café ☕ 𝄞", "tab\u2028sep", "x" * 100, "é" * 3]


def test_a_queues_lines_are_what_json_dumps_writes_of_each_event(fleeter: Any) -> None:
    """``fleetrun queue``'s ``queued`` lines are made from a text the fields share and
    each field's JSON string (no dict a line): each is the very line ``json.dumps`` of
    its event writes (quotes, backslashes, non-ASCII, a line separator in a name), and
    the lines of one queue share its ``at``."""
    from fleetrun.plugins.events import queued_lines
    from fleetrun.states import State

    rows = [
        (f"task_q_{i}", n, State.READY if i % 2 else State.DONE, "queued" if i % 2 else f"unchanged:{n}")
        for i, n in enumerate(NAMES)
    ]
    at = "2026-12-05T01:48:55.123Z"
    want = [
        json.dumps(
            {"v": 1, "type": "queued", "at": at, "task": i, "name": n, "queue": "q\u00e9", "to": s.value, "cause": c},
            default=str,
            allow_nan=False,
        ).encode()
        + b"\n"
        for i, n, s, c in rows
    ]
    assert list(queued_lines(at, "q\u00e9", rows)) == want

    fleeter.make_repo()
    fleeter.write_tasks(
        "".join(f'[[task]]\nname = {json.dumps(n, ensure_ascii=False)}\nprompt = "p"\ncwd = "repo"\n' for n in NAMES)
    )
    r = fleeter.run("queue", "tasks.toml")
    assert r.ret == 0, r.stderr
    lines = (fleeter.home / "events.ndjson").read_bytes().splitlines(keepends=True)
    events = [json.loads(line) for line in lines]
    assert [e["name"] for e in events] == NAMES and len({e["at"] for e in events}) == 1
    assert lines == [json.dumps(e, default=str, allow_nan=False).encode() + b"\n" for e in events]


class LogAtEachTransition:
    """At each ``fleetrun_transition`` (before the events plugin's own: it is ``trylast``),
    the home's ``events.ndjson`` as it is then."""

    def __init__(self, home: Path) -> None:
        self.path = home / "events.ndjson"
        self.seen: list[tuple[str, str, list[dict[str, Any]]]] = []

    @fleetrun.hookimpl
    def fleetrun_transition(self, task: Any, to_state: Any) -> None:
        lines = self.path.read_text().splitlines() if self.path.exists() else []
        self.seen.append((task.name, str(to_state), [json.loads(line) for line in lines]))


@pytest.mark.parametrize("verb", ["cancel", "retry"])
def test_an_operators_verb_writes_each_line_as_it_happens(fleeter: Any, verb: str) -> None:
    """Outside a work loop nothing is kept for later (docs/events.md, "When a line is
    written"): when ``cancel a b`` moves b, a's line is in the home's log already."""
    repo = fleeter.make_repo()
    specs = [TaskSpec(name=n, prompt="p", cwd=str(repo), git_ref="main") for n in ("a", "b")]
    fleeter.ledger().add_tasks(specs, source="tasks.toml", source_hash="h")
    if verb == "retry":
        assert fleeter.run("cancel", "a", "b").ret == 0
    probe = LogAtEachTransition(fleeter.home)
    r = fleeter.run(verb, "a", "b", plugins=[probe])
    assert r.ret == 0, r.stdout + r.stderr
    (a, to, _), (b, _, then) = probe.seen
    assert (a, b) == ("a", "b")
    assert [(e["name"], e["to"]) for e in then if e["type"] == "transition"][-1:] == [("a", to)]


def test_events_on_stdout_are_read_while_the_run_goes_on(
    fleeter: Any, fake_claude: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--events -`` is written and flushed line by line: whoever reads the pipe sees the
    move to RUNNING while the agent runs (it runs until the test has read that line)."""
    import selectors
    import time

    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)  # a pipe's stdout is buffered, as for a user
    fleeter.make_repo()
    # the agent may run Bash (the default lets it run git only): it waits for a file
    fleeter.write_tasks(
        '[[task]]\nname = "a"\ncwd = "repo"\nprompt = "p"\ngit_ref = "main"\nallowed_tools = ["Bash"]\n'
    )
    gate = tmp_path / "agent-may-end"
    fake_claude.script(
        a=[
            {
                "actions": [
                    ["bash", f"while [ ! -e {shlex.quote(str(gate))} ]; do sleep 0.05; done"],
                    ["write", "a.txt", "a"],
                    ["commit", "a"],
                ]
            }
        ]
    )
    proc = fleeter.popen("tasks.toml", "--events", "-")
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    got = b""
    running = False
    deadline = time.monotonic() + 120  # a bound for a hung run, not a timing
    try:
        while not running:
            assert proc.poll() is None, "the run ended before the agent could"
            assert time.monotonic() < deadline, f"no RUNNING line on stdout while the agent runs: {got!r}"
            if sel.select(timeout=1):
                got += os.read(proc.stdout.fileno(), 65536)
            events = [json.loads(line) for line in got[: got.rfind(b"\n") + 1].decode().splitlines()]
            running = any(e["type"] == "transition" and e["to"] == "RUNNING" for e in events)
        # read while the agent runs (it cannot end before the gate), not in what an exit flushed
        assert [e["type"] for e in events if e["type"] in ("attempt_ended", "run_end")] == []
    finally:
        sel.close()
        gate.touch()
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode(errors="replace")
    streamed = [json.loads(line) for line in (got + out).decode().splitlines()]
    assert streamed[-1]["type"] == "run_end" and streamed[-1]["counts"] == {"DONE": 1}

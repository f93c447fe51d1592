"""What ``fleetrun status`` prints, byte for byte, on a large and varied ledger: every
state, long names, non-ASCII names and control characters, peers, costs (known,
unknown, none), waits, worktrees here, on a peer and removed, dependencies, links.

The expected output is in ``tests/golden/status/``, written once by the code before
``status`` was made cheap per row (``python tests/test_viewing.py --write DIR`` with
that code first on ``PYTHONPATH``); every way of printing the table (no width, cut to
a terminal's, one state) and ``--json`` / ``--graph`` must print it again unchanged.
"""

from __future__ import annotations

import io
import json
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import pytest

GOLDEN = Path(__file__).parent / "golden" / "status"
#: The clock ``status`` reads while the golden files are printed.
NOW = 1_760_000_000.0

#: Each golden file: (the arguments after ``status``, $COLUMNS or None for a pipe).
FORMS: dict[str, tuple[list[str], Any]] = {
    "table": ([], None),
    "table-wide": (["--wide"], "60"),
    "table-200": ([], "200"),
    "table-100": ([], "100"),
    "table-60": ([], "60"),
    "table-24": ([], "24"),
    "table-ready": (["--state", "ready"], None),
    "table-running-80": (["--state", "running"], "80"),
    "json": (["--json"], None),
    "graph": (["--graph"], None),
    "graph-pending": (["--graph", "--state", "pending"], None),
}

NAMES = [
    "plain",
    "café-crème",
    "日本語のタスク",
    "emoji-🚀-task",
    "esc\x1b[2Jclear",
    "bidi\u202eevil",
    "tab\there",
    "x" * 95,
    "c1\x9bcsi",
    "ünïcödé-" * 12,
    "a",
    "new\nline",
]
STATES = [
    "PENDING",
    "READY",
    "ASSIGNED",
    "RUNNING",
    "VERIFYING",
    "RETRYING",
    "RESUMING",
    "DONE",
    "NEEDS_HUMAN",
    "CANCELLED",
]
HOSTS = [None, "local", "mini", "peer-\x1b]0;x\x07", "büro"]
REASONS = [
    "queued",
    "waiting for a place",
    "verify_failed:tests: 3 failed, 1 passed in 0.5s",
    "retries_exhausted:pytest: " + "long reason " * 20,
    "operator_cancel",
    "bad\x1b[31mred",
    "résumé: ça marche",
    "",
]
AGES = [0, 5, 59, 60, 3599, 3600, 3661, 86399, 86400, 10 * 86400, 400 * 86400]


def build_ledger(home: Path, n: int = 240) -> None:
    """A ledger whose every row is fixed: ids, times, costs, paths (no random token,
    no clock), so that what ``status`` prints of it can be compared byte for byte."""
    from fleetrun import ledger as ledgermod
    from fleetrun.ledger import Ledger
    from fleetrun.taskspec import TaskSpec

    tokens = iter(f"q{i:03d}" for i in range(1000))
    real = ledgermod.new_token
    ledgermod.new_token = lambda: next(tokens)
    try:
        with Ledger(home / "state.db") as led:
            specs = []
            for i in range(n):
                name = f"{NAMES[i % len(NAMES)]}-{i}"
                deps = []  # within its own queue (of two)
                if i % 7 == 3 and (i - 3) // (n // 2) == i // (n // 2):
                    deps = [specs[i - 3].name]
                if i % 11 == 5 and (i - 17) // (n // 2) == i // (n // 2):
                    deps.append(specs[i - 17].name)
                specs.append(TaskSpec(name=name, prompt=f"p{i}", cwd="/repo", depends_on=deps))
            tasks = led.add_tasks(specs[: n // 2]) + led.add_tasks(specs[n // 2 :])
            waits = {}
            for i, t in enumerate(tasks):
                if i % 5 == 1:
                    waits[t.id] = f"waiting for memory ({i} MiB free)" if i % 2 else "host büro is paused"
            led.set_meta("waits", json.dumps(waits))
            for i, t in enumerate(tasks[:40]):
                if i % 3 == 0:
                    led.set_link(t.id, "pull_request", f"https://example.com/pr/{i}")
                if i % 4 == 0:
                    led.set_link(t.id, "issue", f"https://example.com/issue/{i}?q=ü")
    finally:
        ledgermod.new_token = real
    conn = sqlite3.connect(str(home / "state.db"))
    with conn:
        for i, t in enumerate(tasks):
            state = STATES[(i * 7) % len(STATES)] if not t.deps else ("PENDING" if i % 2 else "DONE")
            host = HOSTS[i % len(HOSTS)] if state not in ("PENDING", "READY") else None
            if state in ("ASSIGNED", "RUNNING", "VERIFYING") and host is None:
                host = "local"
            worktree = None
            if i % 4 == 1:
                worktree = [
                    "/usr/lib",
                    "/nonexistent/wt/gone",
                    "/usr/share/doc",
                    "/etc",
                    "/usr/" + "deep/" * 12 + "wt",
                ][i % 5]
            cost = [0.0, 0.004, 1.5, 12.345, 0.0, 1234.5][i % 6]
            branch = f"fleetrun/{t.name[:20]}" if i % 3 else None
            created = NOW - AGES[i % len(AGES)] - (i % 3)
            conn.execute(
                "UPDATE tasks SET state=?, host=?, worktree=?, cost_usd=?, branch=?, created=?, updated=?,"
                " reason=?, attempts=? WHERE id=?",
                (
                    state,
                    host,
                    worktree,
                    cost,
                    branch,
                    created,
                    created + 1.25,
                    REASONS[i % len(REASONS)],
                    i % 4,
                    t.id,
                ),
            )
            if i % 9 == 2:  # an attempt whose cost was never reported
                conn.execute(
                    "INSERT INTO attempts (id, task_id, number, kind, created, ended, cost_usd, host, state)"
                    " VALUES (?,?,?,?,?,?,?,?,?)",
                    (
                        f"att_{i}",
                        t.id,
                        1,
                        "fresh",
                        created,
                        created + 1,
                        None,
                        host or "local",
                        "ended",
                    ),
                )
    conn.close()
    # a peer that stopped answering (its tasks' reason comes from the relay's hook)
    (home / "peers-state.json").write_text(
        json.dumps({"mini": {"last_heard": NOW - 700, "error": "timed out", "error_at": NOW - 10}})
    )


def render(home: Path, args: list[str], columns: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    from fleetrun.cli import main

    monkeypatch.setenv("HOME", "/usr")  # a worktree under it is shown as ~/...
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    monkeypatch.setattr(time, "time", lambda: NOW)
    out, err = io.StringIO(), io.StringIO()
    code = main(["--home", str(home), "status", *args], stdout=out, stderr=err)
    assert code == 0, err.getvalue()
    return out.getvalue()


@pytest.fixture(scope="module")
def varied_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("golden") / "home"
    home.mkdir(mode=0o700)
    build_ledger(home)
    return home


@pytest.mark.parametrize("form", sorted(FORMS))
def test_status_prints_what_it_printed_before(
    varied_home: Path, form: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)  # no project file
    args, columns = FORMS[form]
    got = render(varied_home, args, columns, monkeypatch)
    want = (GOLDEN / f"{form}.txt").read_text(encoding="utf-8")
    assert got.count("\n") > 5  # the check below means something
    assert got == want


def write_golden(dest: Path) -> None:  # pragma: no cover - run by hand, with the code before
    import os
    import tempfile

    os.chdir(tempfile.mkdtemp())
    home = Path(tempfile.mkdtemp()) / "home"
    home.mkdir(mode=0o700)
    build_ledger(home)
    mp = pytest.MonkeyPatch()
    dest.mkdir(parents=True, exist_ok=True)
    for form, (args, columns) in FORMS.items():
        text = render(home, args, columns, mp)
        (dest / f"{form}.txt").write_text(text, encoding="utf-8")
        mp.undo()


if __name__ == "__main__":  # pragma: no cover
    if sys.argv[1:2] == ["--write"]:
        write_golden(Path(sys.argv[2]).resolve())


def statements_of_status(home: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The SQL statements one ``fleetrun status`` runs on ``home``'s ledger."""
    from fleetrun import ledger_schema
    from fleetrun.cli import main

    seen: list[str] = []
    real = sqlite3.connect

    def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn = real(*args, **kwargs)
        conn.set_trace_callback(seen.append)
        return conn

    monkeypatch.setattr(ledger_schema.sqlite3, "connect", connect)
    out, err = io.StringIO(), io.StringIO()
    assert main(["--home", str(home), "status"], stdout=out, stderr=err) == 0, err.getvalue()
    monkeypatch.setattr(ledger_schema.sqlite3, "connect", real)
    return seen


def test_status_reads_the_placed_tasks_in_one_query_not_one_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The placed tasks (whose host's plugin is asked about each) are read together: the
    statements ``status`` runs do not grow with how many tasks are placed."""
    from fleetrun.ledger import Ledger
    from fleetrun.states import State
    from fleetrun.taskspec import TaskSpec

    monkeypatch.chdir(tmp_path)
    counts = []
    for n in (2, 40):
        home = tmp_path / f"home{n}"
        home.mkdir(mode=0o700)
        with Ledger(home / "state.db") as led:
            tasks = led.add_tasks([TaskSpec(name=f"t{i}", prompt="p", cwd="/repo") for i in range(n + 5)])
            for t in tasks[:n]:
                led.lease(t.id, State.READY, "local", "fresh")
        seen = statements_of_status(home, monkeypatch)
        assert any("FROM tasks" in s for s in seen)  # the count below means something
        counts.append(len(seen))
    assert counts[0] == counts[1], counts


def test_status_escapes_only_the_cells_that_need_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cell of printable text is printed as it is: the escaping regular expression runs
    for the cells holding a control character only (with 10,000 rows, running it on
    every cell was a fifth of ``status``'s time)."""
    from fleetrun import textutil
    from fleetrun.cli import main
    from fleetrun.ledger import Ledger
    from fleetrun.taskspec import TaskSpec

    class Counting:
        def __init__(self, pattern: Any) -> None:
            self.pattern, self.calls = pattern, 0

        def sub(self, *args: Any) -> str:
            self.calls += 1
            return str(self.pattern.sub(*args))

    monkeypatch.chdir(tmp_path)
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    with Ledger(home / "state.db") as led:
        led.add_tasks([TaskSpec(name=n, prompt="p", cwd="/repo") for n in ["plain", "café", "evil\x1b[2J", "x" * 90]])
    counting = Counting(textutil._CONTROL)
    monkeypatch.setattr(textutil, "_CONTROL", counting)
    out = io.StringIO()
    assert main(["--home", str(home), "status"], stdout=out, stderr=io.StringIO()) == 0
    assert "evil\\x1b[2J" in out.getvalue() and "x" * 79 + "…" in out.getvalue()
    assert counting.calls == 1  # the one name with an escape


def test_status_json_carries_the_fields_plugins_add_and_never_loses_the_cores(tmp_path: Path) -> None:
    """``fleetrun_status_fields``: called once with every task printed; a plugin's field
    follows the core's, and one named as a core field does not replace it. The
    ``mailbox`` plugin's own (``role``, ``message``) are in
    tests/acceptance/test_mailbox_ux.py."""
    from fleetrun import hookimpl
    from fleetrun.cli import main
    from fleetrun.ledger import Ledger
    from fleetrun.taskspec import TaskSpec

    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    with Ledger(home / "state.db") as led:
        a, _ = led.add_tasks([TaskSpec(name=n, prompt="p", cwd="/repo") for n in ("a", "b")])
    calls: list[list[str]] = []

    class Fields:
        @hookimpl
        def fleetrun_status_fields(self, tasks: list[Any], config: Any) -> dict[str, dict[str, Any]]:
            calls.append([t.name for t in tasks])
            return {a.id: {"colour": "blue", "state": "FORGED"}}

    out, err = io.StringIO(), io.StringIO()
    assert main(["--home", str(home), "status", "--json"], plugins=[Fields()], stdout=out, stderr=err) == 0, (
        err.getvalue()
    )
    rows = json.loads(out.getvalue())
    assert calls == [["a", "b"]]
    assert (rows[0]["name"], rows[0]["state"], rows[0]["colour"]) == ("a", "READY", "blue")
    assert list(rows[0])[-1] == "colour" and "colour" not in rows[1]

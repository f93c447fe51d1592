"""The ledger commits of a task's life, counted: each is an fsync (``synchronous=FULL``),
so writes that no effect separates share one (docs/durability.md, *Writes that share
a commit*). Counted, not timed: the ``COMMIT`` statements every ledger connection of
the run sends to SQLite."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fleetrun import ledger_schema
from fleetrun.fleeter import Fleeter

N = 6


class Commits:
    """The commits that wrote a task's rows, by the SQL of each transaction. One that
    writes only the ``meta`` table (the waits ``status`` shows, saved once a pass when
    they changed) is left out: how many there are depends on the machine's speed."""

    def __init__(self) -> None:
        self.n = 0
        self.all = 0  # every COMMIT, the meta table's too
        self.tasks = False

    def __call__(self, sql: str) -> None:
        word = sql.split(None, 1)[0].upper() if sql.strip() else ""
        if word == "COMMIT":
            self.all += 1
        if word == "BEGIN":
            self.tasks = False
        elif word in ("INSERT", "UPDATE", "DELETE") and " meta " not in f" {sql} ":
            self.tasks = True
        elif word == "COMMIT" and self.tasks:
            self.n += 1


@pytest.fixture
def commits(monkeypatch: pytest.MonkeyPatch) -> Commits:
    seen = Commits()
    real_init = ledger_schema.LedgerFile.__init__

    def init(self: ledger_schema.LedgerFile, *a: Any, **kw: Any) -> None:
        real_init(self, *a, **kw)
        self.conn.set_trace_callback(seen)

    monkeypatch.setattr(ledger_schema.LedgerFile, "__init__", init)
    return seen


def n_trivial_tasks(fleeter: Fleeter, fake_claude: Any, more_verify: str = "") -> None:
    """:data:`N` tasks, each writing and committing out.txt, verified by ``test -f
    out.txt`` (and ``more_verify``, more ``[[task.verify]]`` tables)."""
    fleeter.make_repo()
    task = """
[[task]]
name = "t{i}"
cwd = "repo"
prompt = "Write out.txt."
git_ref = "main"
  [[task.verify]]
  run = "test -f out.txt"{more}
"""
    fleeter.write_tasks("\n".join(task.format(i=i, more=more_verify) for i in range(N)))
    fake_claude.script(**{f"t{i}": [{"actions": [["write", "out.txt", "x"], ["commit", "add out"]]}] for i in range(N)})


def test_a_trivial_task_costs_at_most_eight_commits(
    fleeter: Fleeter, fake_claude: Any, commits: Commits, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ledger_schema.LedgerFile, "BATCH_HOLD_S", 1e9, raising=False)  # a timing: not here
    n_trivial_tasks(fleeter, fake_claude)
    queued = commits.n
    r = fleeter.run("tasks.toml", "--max-tasks", "2")
    assert r.ret == 0, r.stdout + r.stderr
    per_task = (commits.n - queued) / N
    # the durable points (the lease, starting + the workspace, DONE + the attempt
    # verified before the removal) and the passes' commits that RUNNING, the end,
    # VERIFYING, the verdict and the removal's note share with other tasks' writes:
    # about 6.5 with two tasks at a time, and the run's own (the queue) spread over the
    # tasks; it was 8 with one commit a write (11 before that)
    assert per_task < 8, f"{per_task:.2f} commits a task"
    attempts = fleeter.ledger().attempts()
    assert [a.state for a in attempts] == ["verified"] * N
    assert all(a.shepherd_pid and a.started and a.workspace and a.dir for a in attempts)
    assert all(t.branch and t.worktree for t in fleeter.ledger().tasks())  # recorded with `starting`


def test_a_hook_raising_before_the_start_still_leaves_the_worktree_recorded(fleeter: Fleeter, fake_claude: Any) -> None:
    """The workspace waits for the attempt's next write; a prompt hook that raises
    before it comes leaves the worktree the task's all the same (gc and retry find it)."""
    fleeter.make_repo()
    fleeter.write_tasks("""
        [[task]]
        name = "boom"
        cwd = "repo"
        prompt = "p"
        git_ref = "main"
    """)
    fleeter.write_fleetconf("""
import fleetrun

@fleetrun.hookimpl(tryfirst=True)
def fleetrun_build_prompt(task, attempt, config, context):
    raise RuntimeError("injected")
""")
    r = fleeter.run("tasks.toml")
    assert r.ret == 1, r.stdout + r.stderr
    task = fleeter.task("boom")
    assert (task.state.value, task.reason) == ("NEEDS_HUMAN", "internal_error:RuntimeError: injected")
    assert task.worktree and (Path(task.worktree) / ".git").exists() and task.branch
    (att,) = fleeter.ledger().attempts()
    assert att.workspace and att.workspace["path"] and att.state == "abandoned"


class PassCommits:
    """Per loop pass: the COMMITs made (``commits``, counted since the last pass) and
    the moves it made, by the state each went to."""

    def __init__(self, commits: Commits) -> None:
        self.commits = commits
        self.mark = 0
        self.moves: list[str] = []
        self.passes: list[tuple[int, list[str]]] = []

    def fleetrun_transition(
        self, task: Any, from_state: str, to_state: str, cause: str, attempt: Any, config: Any
    ) -> None:
        self.moves.append(to_state)

    def fleetrun_loop_pass(self, config: Any, duration_s: float) -> None:
        self.passes.append((self.commits.all - self.mark, self.moves))
        self.mark, self.moves = self.commits.all, []


def test_a_pass_commits_once_plus_its_durable_points(
    fleeter: Fleeter, fake_claude: Any, commits: Commits, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The transitions, notes and verdicts a pass decides share one commit (issue 23
    item 3); what an effect needs durable first commits before it (docs/durability.md,
    *Durable points*): a lease and an attempt's ``starting`` before its worktree and
    shepherd (one in the pass of its ASSIGNED, one in that of its RUNNING: the worktree
    may be made off the loop's thread in between), a task's end before its worktree is
    removed (one a DONE or NEEDS_HUMAN). Every pass of a run that ends, verifies and moves six tasks, several
    a pass, stays within that; one commit for each write did not (it was up to 10 a pass)."""
    monkeypatch.setattr(ledger_schema.LedgerFile, "BATCH_HOLD_S", 1e9, raising=False)  # a timing: not here
    n_trivial_tasks(fleeter, fake_claude, '\n  [[task.verify]]\n  run = "true"')
    seen = PassCommits(commits)
    r = fleeter.run("tasks.toml", plugins=[seen])
    assert r.ret == 0, r.stdout + r.stderr
    assert [t.state.value for t in fleeter.ledger().tasks()] == ["DONE"] * N
    over = []
    for n, (made, moves) in enumerate(seen.passes[1:], 1):  # the first counts the queueing and adoption too
        durable = sum(moves.count(s) for s in ("ASSIGNED", "RUNNING", "DONE", "NEEDS_HUMAN"))
        if made > 1 + durable:
            over.append(f"pass {n}: {made} commits for {moves}")
    busy = [m for _, m in seen.passes if len([s for s in m if s not in ("ASSIGNED", "RUNNING")]) >= 2]
    assert busy, f"no pass moved two tasks: {seen.passes}"  # what the test is about happened
    assert not over, "\n".join(over)


class CommittedCheck:
    """Reads, from a connection of its own (as another process would), whether each
    reported transition is committed when ``fleetrun_transition`` hears of it."""

    def __init__(self, db: Path) -> None:
        self.db = db
        self.seen = 0
        self.missing: list[str] = []

    def fleetrun_transition(
        self, task: Any, from_state: str, to_state: str, cause: str, attempt: Any, config: Any
    ) -> None:
        import sqlite3

        conn = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True)
        try:
            found = conn.execute(
                "SELECT 1 FROM transitions WHERE task_id=? AND to_state=? AND cause=?", (task.id, to_state, cause)
            ).fetchone()
        finally:
            conn.close()
        self.seen += 1
        if found is None:
            self.missing.append(f"{task.name} -> {to_state} ({cause})")


def test_the_transition_hook_hears_only_of_committed_moves(fleeter: Fleeter, fake_claude: Any) -> None:
    """ops.move's contract kept with one commit a pass: the hooks are told after it."""
    fleeter.make_repo()
    fleeter.write_tasks(
        "\n".join(
            f"""
        [[task]]
        name = "t{i}"
        cwd = "repo"
        prompt = "Write out.txt."
        git_ref = "main"
        max_retries = 1
          [[task.verify]]
          run = "test -f out.txt"
    """
            for i in range(3)
        )
    )
    # t0 fails its verifier once: RETRYING, then a second attempt
    fake_claude.script(
        t0=[{"actions": []}, {"actions": [["write", "out.txt", "x"], ["commit", "add out"]]}],
        **{f"t{i}": [{"actions": [["write", "out.txt", "x"], ["commit", "add out"]]}] for i in (1, 2)},
    )
    check = CommittedCheck(fleeter.home / "state.db")
    r = fleeter.run("tasks.toml", plugins=[check])
    assert r.ret == 0, r.stdout + r.stderr
    assert check.seen >= 3 * 5
    assert not check.missing, check.missing

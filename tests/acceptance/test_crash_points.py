"""Crash points: the supervisor ``os._exit``s at every named point of the loop
(``FLEETRUN_CRASH_AT``), ``fleetrun work --until-idle`` is restarted, and the
invariants hold: every task ends where it would have without the crash, no work
is done twice, no two attempts of a task overlap, nothing is left behind, and the
transition log is a valid path through the state machine.

The helpers here (``check_invariants``, ``leftover_processes``, ``kill_leftovers``)
are shared with the random-kill and adoption tests.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Optional

import psutil
import pytest

from fleetrun.crash import CRASH_EXIT
from fleetrun.states import State, allowed

FAIL_UNLESS_FINAL = "test \"$(cat FIX.txt)\" = final || { echo 'FIX.txt must contain exactly the word final'; exit 1; }"

# ---------------------------------------------------------------------------------
# processes


def _mentions(proc: psutil.Process, needle: str) -> bool:
    try:
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        if any(needle in part for part in proc.cmdline()):
            return True
        if needle in proc.cwd():
            return True
        env = proc.environ()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
        return False
    return any(needle in env.get(k, "") for k in ("FLEETRUN_HOME", "FLEETRUN_WORKTREE", "FAKE_CLAUDE_STATE"))


def leftover_processes(root: Path) -> list[psutil.Process]:
    """Live processes (not zombies, not this test) that belong to the tmp folder ``root``:
    a shepherd (its attempt folder is on its command line), an agent or a verifier
    (its cwd is a worktree, its environment names the home)."""
    me = os.getpid()
    needle = str(root) + os.sep  # not a sibling whose name merely starts the same
    out = []
    for proc in psutil.process_iter():
        if proc.pid == me:
            continue
        if _mentions(proc, needle):
            out.append(proc)
    return out


def wait_no_leftovers(root: Path, timeout: float = 10.0) -> list[psutil.Process]:
    """Poll until nothing of ``root`` runs (a shepherd takes a moment to exit after
    writing its end); :return: what is still running at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        left = leftover_processes(root)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.1)


def describe_procs(procs: list[psutil.Process]) -> str:
    lines = []
    for p in procs:
        try:
            lines.append(f"{p.pid} {p.status()} {' '.join(p.cmdline())[:200]}")
        except psutil.Error:
            lines.append(f"{p.pid} (gone)")
    return "\n".join(lines)


def kill_leftovers(root: Path) -> None:
    """SIGKILL everything of ``root`` that still runs (test teardown)."""
    for _ in range(3):
        procs = leftover_processes(root)
        if not procs:
            return
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL) if os.getpgid(p.pid) == p.pid else p.kill()
            except (ProcessLookupError, PermissionError, psutil.Error, OSError):
                pass
        psutil.wait_procs(procs, timeout=3)


@pytest.fixture(autouse=True)
def _no_strays(tmp_path: Path):
    """Whatever a test starts, nothing outlives it."""
    yield
    kill_leftovers(tmp_path)


# ---------------------------------------------------------------------------------
# invariants


def read_status(adir: Path) -> Optional[dict[str, Any]]:
    try:
        return json.loads((adir / "status.json").read_text())
    except (OSError, ValueError):
        return None


def check_invariants(
    fleeter: Any,
    fake_claude: Any,
    expected_states: dict[str, str],
    expected_calls: Optional[dict[str, int]] = None,
    root: Optional[Path] = None,
) -> list[str]:
    """Every violation of the durability promise found in the ledger, the attempt
    folders, the fake's call log and the process table (empty: all good)."""
    bad: list[str] = []
    led = fleeter.ledger()
    tasks = led.tasks()
    states = {t.name: t.state.value for t in tasks}
    if states != expected_states:
        bad.append(f"end states {states} != {expected_states}")
    calls = fake_claude.calls() if fake_claude is not None else []
    by_attempt: dict[tuple[str, str], int] = {}
    for c in calls:
        key = (c["env"].get("FLEETRUN_TASK_ID", "?"), c["env"].get("FLEETRUN_ATTEMPT", "?"))
        by_attempt[key] = by_attempt.get(key, 0) + 1
    for key, n in by_attempt.items():
        if n != 1:
            bad.append(f"task {key[0]} attempt {key[1]}: the agent was started {n} times")
    if expected_calls is not None:
        per_task = {t.name: sum(n for (tid, _), n in by_attempt.items() if tid == t.id) for t in tasks}
        if per_task != expected_calls:
            bad.append(f"agent runs per task {per_task} != {expected_calls} (work redone or lost)")

    for t in tasks:
        atts = led.attempts(t.id)
        # -- attempts: one shepherd each; none left in flight; never overlapping
        spans = []
        for a in atts:
            if a.state in ("leased", "starting", "running"):
                bad.append(f"{t.name} attempt {a.number} is still {a.state}")
            adir = fleeter.home / "attempts" / a.id
            st = read_status(adir)
            ran = (t.id, str(a.number)) in by_attempt
            if a.state == "abandoned" and a.outcome == "never_started":
                if st is not None and st.get("shepherd_pid"):
                    bad.append(
                        f"{t.name} attempt {a.number} was abandoned as never started, "
                        f"but shepherd {st.get('shepherd_pid')} ran it"
                    )
                if ran:
                    bad.append(f"{t.name} attempt {a.number} was abandoned as never started, but its agent ran")
                continue
            if st is None:
                if a.state in ("ended", "verified"):
                    bad.append(f"{t.name} attempt {a.number} ({a.state}) has no status.json")
                continue
            if a.shepherd_pid and st.get("shepherd_pid") != a.shepherd_pid:
                bad.append(
                    f"{t.name} attempt {a.number}: the ledger's shepherd {a.shepherd_pid} is not "
                    f"the one that ran it ({st.get('shepherd_pid')})"
                )
            end = st.get("ended")
            if st.get("state") != "ended":
                if a.outcome == "died" and a.ended:  # its shepherd was killed: the loop saw it gone then
                    end = a.ended
                else:
                    bad.append(f"{t.name} attempt {a.number}: its shepherd never wrote an end ({st.get('state')})")
            if fake_claude is not None and t.spec.agent == "claude" and st.get("agent_pid") and not ran:
                bad.append(f"{t.name} attempt {a.number}: an agent ran but the fake has no call for it")
            spans.append((st.get("started") or 0.0, end or float("inf"), a.number))
        spans.sort()
        for (s1, e1, n1), (s2, e2, n2) in zip(spans, spans[1:]):
            if s2 < e1:
                bad.append(f"{t.name}: attempts {n1} and {n2} overlapped ({s1:.3f}-{e1:.3f} and {s2:.3f}-{e2:.3f})")

        # -- the transition log is a path through the state machine
        rows = led.transitions(t.id)
        prev: Optional[str] = None
        for i, r in enumerate(rows):
            if i == 0:
                if r.from_state is not None:
                    bad.append(f"{t.name}: the first transition starts from {r.from_state}")
            elif r.from_state != prev:
                bad.append(
                    f"{t.name}: transition {r.from_state}->{r.to_state} ({r.cause}) does not start "
                    f"where the last one ended ({prev})"
                )
            elif not allowed(State(r.from_state), State(r.to_state)):
                bad.append(f"{t.name}: {r.from_state}->{r.to_state} ({r.cause}) is not allowed")
            prev = r.to_state
        if rows and rows[-1].to_state != t.state.value:
            bad.append(f"{t.name}: the log ends in {rows[-1].to_state}, the task is {t.state.value}")

        # -- verdicts: once each, in order, a failure ends the attempt's run of verifiers
        rows_v = led.conn.execute(
            "SELECT attempt_id, idx, COUNT(*) FROM verdicts WHERE task_id=? GROUP BY attempt_id, idx", (t.id,)
        ).fetchall()
        for aid, idx, n in rows_v:
            if n != 1:
                bad.append(f"{t.name}: verdict {idx} of {aid} recorded {n} times")
        for a in atts:
            vs = led.verdicts(attempt_id=a.id)
            if [v.idx for v in vs] != list(range(len(vs))):
                bad.append(f"{t.name} attempt {a.number}: verdicts {[v.idx for v in vs]} are not 0..n-1")
            if any(not v.passed for v in vs[:-1]):
                bad.append(f"{t.name} attempt {a.number}: a verifier ran after one failed")
        if t.state is State.DONE and t.spec.verify:
            last = [a for a in atts if a.state == "verified"]
            vs = led.verdicts(attempt_id=last[-1].id) if last else []
            if len(vs) != len(t.spec.verify) or not all(v.passed for v in vs):
                bad.append(
                    f"{t.name} is DONE but its last attempt's verdicts are "
                    f"{[(v.idx, v.passed) for v in vs]} of {len(t.spec.verify)} verifiers"
                )

        # -- a DONE task that merges its dependencies holds each one's head on its branch
        if t.state is State.DONE and t.spec.merges_dependencies:
            bad += missing_dependency_heads(led, t)
        # -- a DONE task with setup had it pass before the agent that did the work started
        if t.state is State.DONE and t.spec.setup:
            done_at = max((a.number for a in atts if a.state == "verified"), default=0)
            if not any((a.info or {}).get("setup") == "passed" and a.number <= done_at for a in atts):
                bad.append(
                    f"{t.name} is DONE but no attempt up to its verified one ({done_at}) recorded its "
                    f"setup passed: {[(a.number, (a.info or {}).get('setup')) for a in atts]}"
                )

        # -- a clean DONE worktree is removed (the branch stays)
        if t.state is State.DONE and t.worktree and Path(t.worktree).exists():
            notes = " / ".join(text for _, text in led.notes(t.id))
            if "kept worktree" not in notes:
                bad.append(f"{t.name} is DONE but its worktree {t.worktree} is still there ({notes or 'no note'})")

    if root is not None:
        left = wait_no_leftovers(root)
        if left:
            bad.append("processes left running:\n" + describe_procs(left))
    return bad


def missing_dependency_heads(led: Any, t: Any) -> list[str]:
    """What a DONE task with ``base = "dependencies"`` lacks of its dependencies: each
    dependency's branch head must be an ancestor of the task's branch."""
    bad = []
    for dep in (led.get(i) for i in t.deps):
        if dep is None or not dep.branch or not t.branch:
            bad.append(f"{t.name} is DONE but a dependency of it has no branch ({dep and dep.name})")
            continue
        proc = subprocess.run(
            [
                "git",
                "-C",
                t.spec.cwd,
                "merge-base",
                "--is-ancestor",
                "--end-of-options",
                f"refs/heads/{dep.branch}",
                f"refs/heads/{t.branch}",
            ],
            capture_output=True,
        )
        if proc.returncode != 0:
            bad.append(
                f"{t.name} is DONE but its branch {t.branch} lacks its dependency {dep.name}'s head "
                f"({dep.branch}): {proc.stderr.decode(errors='replace').strip()}"
            )
    return bad


def run_until_done(fleeter: Any, expected: dict[str, str], rounds: int = 3, timeout: float = 20.0) -> list[Any]:
    """Restart ``fleetrun work --until-idle`` until every task is where it should be."""
    results = []
    for _ in range(rounds):
        try:
            r = fleeter.runsub("work", "--until-idle", timeout=timeout)
        except subprocess.TimeoutExpired as e:
            out = (e.stdout or b"").decode(errors="replace")[-3000:] if isinstance(e.stdout, bytes) else ""
            raise AssertionError(
                f"`fleetrun work --until-idle` did not finish in {timeout:g}s; states {fleeter.states()}\n{out}"
            ) from None
        results.append(r)
        if fleeter.states() == expected:
            break
    return results


# ---------------------------------------------------------------------------------
# the queue


def write_queue(fleeter: Any, fake_claude: Any) -> tuple[dict[str, str], dict[str, int]]:
    """Six tasks with git worktrees: ``a`` (the first to end; leaves its work
    uncommitted), ``b`` (after ``a``, merged into its worktree; a setup command that needs it there;
    two verifiers), ``c`` (after ``a``; fails its
    verifier once: the run's second verdict), ``d`` (its first session dies), ``e``
    (fails with no retries left: NEEDS_HUMAN) and ``f`` (after ``e``: never runs). The
    dependencies and sleeps order the events; :func:`check_site` proves that a crash
    hit the case it is meant for.

    :return: (end states, agent runs per task)."""
    fleeter.make_repo()
    fleeter.write_tasks(f"""
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
        depends_on = ["a"]
        base = "dependencies"
        setup = ["test -f a.txt"]
          [[task.verify]]
          run = "test -f b.txt"
          [[task.verify]]
          run = "true"

        [[task]]
        name = "c"
        cwd = "repo"
        prompt = "Fix it."
        git_ref = "main"
        depends_on = ["a"]
        max_retries = 2
          [[task.verify]]
          run = {json.dumps(FAIL_UNLESS_FINAL)}

        [[task]]
        name = "d"
        cwd = "repo"
        prompt = "Write d.txt."
        git_ref = "main"
          [[task.verify]]
          run = "test -f d.txt"

        [[task]]
        name = "e"
        cwd = "repo"
        prompt = "Try."
        git_ref = "main"
        max_retries = 0
          [[task.verify]]
          run = "echo no; false"

        [[task]]
        name = "f"
        cwd = "repo"
        prompt = "After e."
        git_ref = "main"
        depends_on = ["e"]
    """)
    fake_claude.script(
        a=[{"actions": [["write", "a.txt", "a"]], "result": "wrote a.txt"}],
        b=[{"actions": [["sleep", 1.5], ["write", "b.txt", "b"], ["commit", "b"]]}],
        c=[
            {"actions": [["write", "FIX.txt", "draft"], ["commit", "draft"]]},
            {"actions": [["write", "FIX.txt", "final"], ["commit", "final"]]},
        ],
        d=[
            {"mode": "die", "actions": [["sleep", 1.5], ["write", "half.txt", "x"]]},
            {"actions": [["write", "d.txt", "d"]]},
        ],
        e=[{"actions": [["sleep", 2.0]]}],
    )
    return (
        {"a": "DONE", "b": "DONE", "c": "DONE", "d": "DONE", "e": "NEEDS_HUMAN", "f": "NEEDS_HUMAN"},
        {"a": 1, "b": 1, "c": 2, "d": 2, "e": 1, "f": 0},
    )


def branch_file(fleeter: Any, branch: str, path: str) -> Optional[str]:
    try:
        return fleeter.git(fleeter.path / "repo", "show", f"{branch}:{path}")
    except AssertionError:
        return None


def check_work_landed(fleeter: Any) -> list[str]:
    """The agents' work is on the task branches (committed by the agent or by fleetrun)."""
    bad = []
    want = {"a": ("a.txt", "a"), "b": ("b.txt", "b"), "c": ("FIX.txt", "final"), "d": ("d.txt", "d")}
    for name, (path, text) in want.items():
        t = fleeter.task(name)
        got = branch_file(fleeter, t.branch, path) if t.branch else None
        if got != text:
            bad.append(f"{name}: {path} on {t.branch} is {got!r}, not {text!r}")
    return bad


# Every crash point the queue passes through: before and after each transition, by the
# state it goes to, and the named points between a side effect and its record.
TRANSITION_STATES = ["READY", "ASSIGNED", "RUNNING", "VERIFYING", "RETRYING", "RESUMING", "DONE", "NEEDS_HUMAN"]
OTHER_POINTS = [
    "after_lease",
    "after_worktree",
    "after_shepherd_start",
    "mid_verifier",
    "after_verdict",
    "after_verdict@2",
    "before_dependency_merge",
    "mid_setup",
    "after_setup",
    # inside a pass's batch, before its commit: the pass's writes are lost, the
    # restart decides them again (docs/durability.md, "One commit a pass")
    "uncommitted:VERIFYING",
    "uncommitted:RETRYING",
    "uncommitted:RESUMING",
    "uncommitted:DONE",
    "uncommitted:NEEDS_HUMAN",
    "before_batch_commit@3",
    # each action of fleetrun.decide that the points above did not cover (Collect,
    # HandOff, CleanUp); VerifierWait's and PauseHost's have queues of their own below
    "before_collect",
    "before_handoff",
    "before_cleanup",
]

#: What the ledger must show right after the crash, to prove it hit the case meant:
#: ("verdict", task, passed): the last verdict recorded; ("state", task, state): where
#: that task stands (and for RUNNING, its attempt's end is recorded).
SITE: dict[str, tuple[str, str, Any]] = {
    "after_verdict": ("verdict", "a", True),
    "after_verdict@2": ("verdict", "c", False),  # the failure is recorded, its RETRYING is not
    # a pass's writes share its commit (Ledger.batch): a crash inside the pass finds the
    # ledger as the last commit left it, and the restart decides the pass again
    "mid_verifier": ("state", "a", "RUNNING"),  # its VERIFYING is the pass's that started the verifier
    "before_transition:VERIFYING": ("state", "a", "RUNNING"),  # its end recorded, VERIFYING not
    "after_transition:VERIFYING": ("state", "a", "VERIFYING"),  # its work not committed yet
    "before_transition:RETRYING": ("state", "c", "VERIFYING"),  # its failed verdict is the same pass's
    "before_transition:NEEDS_HUMAN": ("state", "e", "VERIFYING"),
    # its end recorded in an earlier pass or in this one, whose commit is lost
    "before_transition:RESUMING": ("state", "d", ("RUNNING", "RUNNING, attempt running")),
    "uncommitted:RETRYING": ("state", "c", "VERIFYING"),
    "uncommitted:NEEDS_HUMAN": ("state", "e", "VERIFYING"),
    # b's worktree and branch made, a's branch not merged into it yet
    "before_dependency_merge": ("state", "b", "ASSIGNED"),
    "mid_setup": ("state", "b", "ASSIGNED"),  # its setup command running
    "after_setup": ("state", "b", "ASSIGNED"),  # setup passed and recorded, its agent not started
    # its end recorded (in an earlier pass, or in this one, whose commit is lost), its work not committed
    "before_collect": ("state", "a", ("RUNNING", "RUNNING, attempt running")),
    "before_handoff": ("state", "a", "VERIFYING"),  # every verdict recorded, no handoff yet
}

BUG_NOT_HIT = (
    "BUG: ledger.lease() (ASSIGNED) and ops.promote() (READY) change state without "
    "passing a crash point: crash points belong in ops.move and around the lease"
)
BUG_STUCK_RUNNING = (
    "BUG: a crash between recording an attempt's end and the transition after it "
    "leaves the task RUNNING with an ended attempt that adopt() never looks at: "
    "`work --until-idle` never ends"
)
BUG_FAIL_BECOMES_DONE = (
    "BUG: adopt() resumes a VERIFYING task at idx=len(verdicts) even when the "
    "last verdict FAILED: the failure is skipped and the task goes DONE undone"
)
BUG_DONE_CLEANUP = (
    "BUG: a crash after the DONE transition, before cleanup_workspace, leaves the clean worktree behind for good"
)
BUG_COLLECT_WORK = (
    "BUG: a crash between RUNNING->VERIFYING and fleetrun_collect_work leaves the "
    "agent's work uncommitted: not on the branch, the worktree kept dirty"
)

XFAIL: dict[str, str] = {}  # every point passes; a bug found later goes here as a strict xfail


def all_points() -> list[str]:
    return [f"{when}_transition:{s}" for s in TRANSITION_STATES for when in ("before", "after")] + OTHER_POINTS


def points() -> list[Any]:
    if os.environ.get("FLEETRUN_TEST_NO_XFAIL"):  # checking the fixes: every point must pass
        return all_points()
    return [
        pytest.param(p, marks=pytest.mark.xfail(strict=True, reason=XFAIL[p])) if p in XFAIL else p
        for p in all_points()
    ]


def check_site(fleeter: Any, point: str) -> None:
    if point not in SITE:
        return
    what, name, value = SITE[point]
    led = fleeter.ledger()
    if what == "verdict":
        last = led.verdicts()[-1]
        task = led.get(last.task_id)
        assert task is not None
        got: tuple[str, Any] = (task.name, last.passed)
    else:
        task = led.find(name)
        att = led.latest_attempt(task.id)
        got = (name, task.state.value)
        if att is not None and "RUNNING" in (value if isinstance(value, tuple) else (value,)):
            got = (name, "RUNNING" if att.state == "ended" else f"RUNNING, attempt {att.state}")
    if isinstance(value, tuple):  # either of these
        value = got[1] if got[1] in value else value
    assert got == (name, value), (
        f"the crash at {point} came after {what} {got}, not {(name, value)}: the queue's timing changed"
    )


# Not marked slow (~3 s each): the crash points are the ledger's promise, so the
# default run, which CI runs, keeps them.
@pytest.mark.parametrize("point", points())
def test_crash_point(fleeter, fake_claude, tmp_path, point):
    expected, calls = write_queue(fleeter, fake_claude)
    r = fleeter.runsub("tasks.toml", env={"FLEETRUN_CRASH_AT": point}, timeout=60)
    assert r.ret == CRASH_EXIT, f"crash point {point} was never hit (exit {r.ret}):\n{r.stdout}\n{r.stderr}"
    check_site(fleeter, point)
    run_until_done(fleeter, expected)
    bad = check_invariants(fleeter, fake_claude, expected, calls, root=tmp_path)
    bad += check_work_landed(fleeter)
    assert not bad, f"after a crash at {point}:\n" + "\n".join(bad)


def test_a_verdict_that_cost_money_is_not_paid_for_twice_after_a_crash_in_its_pass(fleeter, fake_claude, tmp_path):
    """A reviewer's verdict is committed before the next verifier starts (a durable point,
    docs/durability.md): a crash as that verifier starts, in the same pass, does not lose
    it, and the restart asks no reviewer again. A free verdict waits for its pass's
    commit (a crash there runs its verifier again)."""
    fleeter.make_repo()
    fleeter.write_tasks("""
        [[task]]
        name = "t1"
        cwd = "repo"
        prompt = "Write out.txt."
        git_ref = "main"
          [[task.verify]]
          agent = "Is out.txt there?"
          [[task.verify]]
          run = "test -f out.txt"
    """)
    fake_claude.script(
        t1=[{"actions": [["write", "out.txt", "x"], ["commit", "out"]]}],
        **{"t1:review": [{"structured": {"verdict": "PASS", "reason": "there"}, "result": "PASS", "cost": 0.25}] * 2},
    )
    # the reviewer is verifier 1's start (mid_verifier), the run verifier the second
    r = fleeter.runsub("tasks.toml", env={"FLEETRUN_CRASH_AT": "mid_verifier@2"}, timeout=60)
    assert r.ret == CRASH_EXIT, r.stdout + r.stderr
    run_until_done(fleeter, {"t1": "DONE"})
    assert len(fake_claude.review_calls("t1")) == 1
    assert fleeter.task("t1").cost_usd >= 0.25
    bad = check_invariants(fleeter, fake_claude, {"t1": "DONE"}, {"t1": 1}, root=tmp_path)
    assert not bad, "\n".join(bad)


def test_a_crash_as_a_done_tasks_worktree_is_removed_does_not_verify_it_again(fleeter, fake_claude, tmp_path):
    """A task's end is committed before its worktree is removed (a durable point,
    docs/durability.md): a supervisor that dies as the cleanup starts leaves the task
    DONE, and the restart only removes the worktree; the end lost with the pass would
    have it verified again, in a worktree the removal may have taken away."""
    fleeter.make_repo()
    runs = tmp_path / "verifier-runs"
    flag = tmp_path / "crashed-once"
    fleeter.write_tasks(f"""
        [[task]]
        name = "t1"
        cwd = "repo"
        prompt = "Write out.txt."
        git_ref = "main"
          [[task.verify]]
          run = "echo run >> {runs} && test -f out.txt"
    """)
    fleeter.write_fleetconf(
        f"""
        import os
        import fleetrun

        @fleetrun.hookimpl(tryfirst=True)
        def fleetrun_cleanup_workspace(task, host, config):
            if not os.path.exists({str(flag)!r}):
                open({str(flag)!r}, "w").close()
                os._exit(86)  # the supervisor dies as the removal starts
    """,
        folder=".",
    )
    fake_claude.script(t1=[{"actions": [["write", "out.txt", "x"], ["commit", "out"]]}])
    r = fleeter.runsub("tasks.toml", timeout=60)
    assert r.ret == CRASH_EXIT, r.stdout + r.stderr
    assert fleeter.task("t1").state.value == "DONE"
    run_until_done(fleeter, {"t1": "DONE"})
    assert runs.read_text().split() == ["run"]
    bad = check_invariants(fleeter, fake_claude, {"t1": "DONE"}, {"t1": 1}, root=tmp_path)
    assert not bad, "\n".join(bad)


# ---------------------------------------------------------------------------------
# the actions whose crash needs a queue of its own: a verifier's wait, a usage pause


def test_crash_point_after_a_verifiers_wait_is_recorded(fleeter, fake_claude, tmp_path):
    """VerifierWait: the supervisor dies once the wait of a verifier that could not judge
    is recorded; the restart resumes it (the verifier is asked again, the agent is not)."""
    from brainserver import BrainServer, Status

    with BrainServer() as brain:
        brain.script(Status(503, {"error": "busy"}), "PASS")
        fleeter.make_repo()
        fleeter.write_tasks(f'''
            [brain]
            url = "{brain.url}"
            model = "tiny"

            [[task]]
            name = "greet"
            cwd = "repo"
            prompt = "Write hello.txt."
            git_ref = "main"
              [[task.verify]]
              brain = "Does hello.txt say hello?"
        ''')
        cfg = fleeter.home / "config.toml"
        fleeter.write_config(cfg.read_text() + "\n[fleetrun]\nverifier_error_backoff_s = 0.05\n")
        fake_claude.script(greet=[{"actions": [["write", "hello.txt", "hello"], ["commit", "hello"]]}])
        r = fleeter.runsub("tasks.toml", env={"FLEETRUN_CRASH_AT": "after_verifier_wait"}, timeout=60)
        assert r.ret == CRASH_EXIT, r.stdout + r.stderr
        last = fleeter.ledger().latest_attempt(fleeter.task("greet").id)
        assert last.info["verify_wait"]["tries"] == 1 and len(brain.requests) == 1
        run_until_done(fleeter, {"greet": "DONE"}, timeout=120)
        assert len(brain.requests) == 2
    bad = check_invariants(fleeter, fake_claude, {"greet": "DONE"}, {"greet": 1}, root=tmp_path)
    assert not bad, "\n".join(bad)


def test_crash_point_after_a_usage_pause_is_recorded(fleeter, fake_claude, tmp_path):
    """PauseHost: the supervisor dies once a usage limit's pause is recorded, before the
    task's move; the restart decides the recorded end again, waits for the same reset
    and resumes the task without using a retry or a resume."""
    fleeter.make_repo()
    fleeter.write_tasks("""
        [[task]]
        name = "t1"
        cwd = "repo"
        prompt = "Write out.txt."
        git_ref = "main"
          [[task.verify]]
          run = "test -f out.txt"
    """)
    reset_at = int(time.time()) + 3
    fake_claude.script(
        t1=[
            {"mode": "usage_limit", "reset_at": reset_at, "limit_style": "legacy"},
            {"actions": [["write", "out.txt", "x"]]},
        ]
    )
    r = fleeter.runsub("tasks.toml", env={"FLEETRUN_CRASH_AT": "after_pause"}, timeout=60)
    assert r.ret == CRASH_EXIT, r.stdout + r.stderr
    led = fleeter.ledger()
    assert fleeter.task("t1").state.value == "RUNNING" and led.usage_pauses()
    run_until_done(fleeter, {"t1": "DONE"}, timeout=120)
    task = fleeter.task("t1")
    assert task.retries == 0 and task.resumes == 0
    first, second = fleeter.ledger().attempts(task.id)
    assert second.created >= reset_at - 0.5
    bad = check_invariants(fleeter, fake_claude, {"t1": "DONE"}, {"t1": 2}, root=tmp_path)
    assert not bad, "\n".join(bad)

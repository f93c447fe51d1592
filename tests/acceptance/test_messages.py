"""Messages that tell the truth: the resume prompt gives the real cause, a long verifier
output is trimmed on line boundaries with its head and tail, an approved task hands
off like a DONE one, a drain says where it comes from, `status` fits the terminal,
`logs` names the worktree and branch, and `gc` says up front what it keeps."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from .test_adoption import alive, loops, running_agent, sigkill_group, wait_for  # noqa: F401
from .test_local_loop import one_task

# ---------------------------------------------------------------------------------
# the resume prompt says why the previous session ended


def second_prompt(fake_claude, name: str = "t1") -> str:
    calls = fake_claude.calls(name)
    assert len(calls) >= 2, calls
    return calls[1]["prompt"]


def test_resume_after_a_session_that_died_says_it_was_killed(fleeter, fake_claude):
    one_task(fleeter)
    fake_claude.script(t1=[{"mode": "die"}, {"actions": [["write", "out.txt", "x"]]}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    prompt = second_prompt(fake_claude)
    assert "(placed)" not in prompt
    assert (
        "Your previous session on this task was interrupted: its process died (killed by signal 9, SIGKILL)"
    ) in prompt, prompt
    assert "assess the working directory" in prompt


def test_resume_after_a_timeout_names_timeout_min(fleeter, fake_claude):
    one_task(fleeter, extra="timeout_min = 0.02")
    fake_claude.script(t1=[{"mode": "hang"}, {"actions": [["write", "out.txt", "x"]]}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    prompt = second_prompt(fake_claude)
    assert "(placed)" not in prompt
    assert (
        "Your previous session on this task was interrupted: it was stopped after running 1 second (timeout_min = 0.02)"
    ) in prompt, prompt


def test_resume_after_a_stall_names_stall_timeout_min(fleeter, fake_claude):
    one_task(fleeter, extra="stall_timeout_min = 0.02")
    fake_claude.script(t1=[{"stall": 30, "actions": [["print", "thinking"]]}, {"actions": [["write", "out.txt", "x"]]}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    prompt = second_prompt(fake_claude)
    assert "(placed)" not in prompt
    assert (
        "Your previous session on this task was interrupted: it produced no output for "
        "1 second and was stopped (stall_timeout_min = 0.02)"
    ) in prompt, prompt


def test_resume_after_a_killed_shepherd_says_so(fleeter, fake_claude, loops):  # noqa: F811
    one_task(fleeter)
    fake_claude.script(t1=[{"actions": [["sleep", 60]]}, {"actions": [["write", "out.txt", "x"]]}])
    fleeter.run("queue", "tasks.toml")
    proc = loops.start("work", "--until-idle")
    st = running_agent(fleeter, fake_claude, "t1")
    os.kill(st["shepherd_pid"], signal.SIGKILL)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, out.decode() + err.decode()
    prompt = second_prompt(fake_claude)
    assert "(placed)" not in prompt
    assert (
        "Your previous session on this task was interrupted: the fleetrun process that "
        "watched it (its shepherd) was killed, and the session was stopped with it"
    ) in prompt, prompt


def test_resume_after_the_machine_restarted_says_so(fleeter, fake_claude, loops, monkeypatch):  # noqa: F811
    """The supervisor, the shepherd and the agent all die at once (a reboot); the next
    `work` finds the machine booted after the attempt started."""
    one_task(fleeter)
    fake_claude.script(t1=[{"actions": [["sleep", 60]]}, {"actions": [["write", "out.txt", "x"]]}])
    fleeter.run("queue", "tasks.toml")
    proc = loops.start("work", "--until-idle")
    st = running_agent(fleeter, fake_claude, "t1")
    loops.sigkill(proc)
    sigkill_group(st["agent_pid"])
    os.kill(st["shepherd_pid"], signal.SIGKILL)
    wait_for(lambda: not alive(st["shepherd_pid"]) and not alive(st["agent_pid"]), what="the attempt to die")
    import psutil

    booted = time.time()
    monkeypatch.setattr(psutil, "boot_time", lambda: booted)
    r = fleeter.run("work", "--until-idle")
    assert r.ret == 0, r.stdout + r.stderr
    prompt = second_prompt(fake_claude)
    assert (
        "Your previous session on this task was interrupted: the machine it ran on (local) was restarted"
    ) in prompt, prompt


# ---------------------------------------------------------------------------------
# a long verifier output in the retry prompt


BIG_VERIFIER = r"""
import sys
out = sys.stdout
out.write("============================= test session starts ==============================\n")
out.write("___________________________ test_first_failure ___________________________\n")
out.write("    def test_first_failure():\n>       assert parse('x') == 1\n")
out.write("E       AssertionError: FIRST-TRACEBACK-MARKER\n")
i = 0
while i < 1350:
    out.write(f"tests/test_mod.py:{i}: in helper_{i}\n    value = compute_something_long({i}) + 42  # filler\n")
    i += 1
for n in range(54):
    out.write(f"FAILED tests/test_mod.py::test_case_{n} - AssertionError: case {n}\n")
out.write("======================== 54 failed, 12 passed in 3.21s =========================\n")
sys.exit(1)
"""


def test_retry_prompt_keeps_head_and_tail_of_a_long_output(fleeter, fake_claude):
    fleeter.write("bigout.py", BIG_VERIFIER)
    script = fleeter.path / "bigout.py"
    one_task(fleeter, extra="max_retries = 1", verify=f'run = "python3 {script}"')
    fake_claude.script(t1=[{}, {}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 1, r.stdout + r.stderr
    task = fleeter.task("t1")
    first = fleeter.ledger().attempts(task.id)[0]
    out_file = fleeter.home / "attempts" / first.id / "verify-1.out"
    whole = out_file.read_text()
    assert 120_000 < len(whole) < 140_000
    prompt = second_prompt(fake_claude)
    assert "FIRST-TRACEBACK-MARKER" in prompt  # the first failure is kept
    assert "FAILED tests/test_mod.py::test_case_0 -" in prompt and "54 failed, 12 passed" in prompt
    n_lines = len(whole.splitlines())
    assert f"{len(whole.encode()):,} bytes, {n_lines:,} lines" in prompt, prompt[-3000:]
    assert str(out_file) in prompt
    block = prompt[prompt.index("```\n") + 4 : prompt.rindex("\n```")]
    kept = block.splitlines()
    omitted = [x for x in kept if x.startswith("… ") and x.endswith(" lines omitted …")]
    assert len(omitted) == 1, kept[:5]
    n_omitted = int(omitted[0].split()[1].replace(",", ""))
    # every line shown is a whole line of the output, and the counts add up
    body = [x for x in kept if x is not omitted[0]]
    whole_lines = set(whole.splitlines())
    assert all(x in whole_lines for x in body)
    assert len(body) + n_omitted == n_lines
    assert len(block) < 14_000


# ---------------------------------------------------------------------------------
# approve hands off like DONE


def test_approved_task_hands_off_its_branch_and_summary(fleeter, fake_claude):
    fleeter.make_repo()
    fleeter.write_tasks("""
        [[task]]
        name = "a"
        cwd = "repo"
        prompt = "Do A."
        git_ref = "main"
        max_retries = 0
          [[task.verify]]
          run = "false"

        [[task]]
        name = "b"
        cwd = "repo"
        prompt = "Do B."
        git_ref = "main"
        depends_on = ["a"]
    """)
    fake_claude.script(
        a=[{"actions": [["write", "a.txt", "A"]], "result": "Wrote a.txt with the A thing"}],
        b=[{"actions": [["write", "b.txt", "B"]]}],
    )
    r = fleeter.run("tasks.toml")
    assert r.ret == 1
    a = fleeter.task("a")
    assert a.state.value == "NEEDS_HUMAN" and a.branch
    assert fleeter.run("approve", "a").ret == 0
    r = fleeter.run("work", "--until-idle")
    assert r.ret == 0, r.stdout + r.stderr
    (call,) = fake_claude.calls("b")
    assert "a is DONE on branch " + a.branch in call["prompt"], call["prompt"]
    assert "Wrote a.txt with the A thing" in call["prompt"]
    # as after DONE: the clean worktree is gone, the branch stays
    assert not Path(a.worktree).exists()
    assert fleeter.git(fleeter.path / "repo", "branch", "--list", a.branch).strip()


# ---------------------------------------------------------------------------------
# a drain says where it comes from


def test_drain_from_policy_toml_is_named_everywhere(fleeter, fake_claude):
    one_task(fleeter)
    fake_claude.script(t1=[{"actions": [["write", "out.txt", "x"]]}])
    fleeter.write_policy("[local]\nmax_tasks = 2\ndrain = true\n")
    policy = fleeter.home / "policy.toml"
    r = fleeter.run("undrain")
    assert r.ret == 1
    r.fnmatch_lines([f"this machine still drains: {policy}:3 sets [[]local[]] drain = true; remove it to start work"])
    r.no_fnmatch_line("*starts work again*")
    assert fleeter.run("status").outlines[0] == f"this machine is draining ({policy}:3)"
    r = fleeter.run("tasks.toml")
    assert r.ret == 1
    r.fnmatch_lines([f"waiting: task_* (t1): this machine is draining ({policy}:3)"])
    assert fake_claude.calls() == []
    fleeter.write_policy("[local]\nmax_tasks = 2\n")
    assert fleeter.run("undrain").ret == 0
    assert fleeter.run("tasks.toml").ret == 0


def test_drain_by_the_verb_is_named_in_status(fleeter):
    assert fleeter.run("drain").ret == 0
    assert fleeter.run("status").outlines[0] == (
        "this machine is draining (fleetrun drain; fleetrun undrain to start work)"
    )
    r = fleeter.run("undrain")
    assert r.ret == 0
    r.fnmatch_lines(["undrained: this machine starts work again"])
    assert not fleeter.run("status").outlines[0].startswith("this machine is draining")


# ---------------------------------------------------------------------------------
# status fits the terminal; logs and --json tell where the work is


LONG_NAME = "refactor-the-user-authentication-module-and-its-session-handling"
LONG_PROMPT = "Rewrite everything. " * 30


def test_status_fits_an_80_column_terminal_and_wide_shows_all(fleeter, fake_claude, monkeypatch):
    fleeter.make_repo()
    fleeter.write_tasks(f'''
        [[task]]
        name = "{LONG_NAME}"
        cwd = "repo"
        prompt = "{LONG_PROMPT}"
        git_ref = "main"
        max_retries = 0
          [[task.verify]]
          run = "echo this verifier failed for a long and winding reason that goes on and on; exit 3"
    ''')
    fake_claude.script(**{LONG_NAME: [{}]})
    assert fleeter.run("tasks.toml").ret == 1
    task = fleeter.task(LONG_NAME)
    monkeypatch.setenv("COLUMNS", "80")
    r = fleeter.run("status")
    assert r.ret == 0
    assert all(len(line) <= 80 for line in r.outlines), "\n".join(r.outlines)
    header = next(line for line in r.outlines if line.startswith("NAME"))
    assert "BRANCH" in header and "REASON" in header
    row = next(line for line in r.outlines if "NEEDS_HUMAN" in line)
    assert "…" in row and task.id in row  # cells are cut, the id is whole
    wide = fleeter.run("status", "--wide")
    row = next(line for line in wide.outlines if "NEEDS_HUMAN" in line)
    assert LONG_NAME in row and task.branch in row and task.reason in row


def test_logs_of_a_needs_human_task_names_worktree_and_branch(fleeter, fake_claude):
    one_task(fleeter, extra="max_retries = 0", verify='run = "false"')
    fake_claude.script(t1=[{}])
    assert fleeter.run("tasks.toml").ret == 1
    task = fleeter.task("t1")
    assert task.worktree and Path(task.worktree).exists()
    r = fleeter.run("logs", "t1")
    r.fnmatch_lines([f"worktree: {task.worktree}", f"branch: {task.branch}"])


def test_status_json_gives_no_worktree_once_it_is_removed(fleeter, fake_claude):
    one_task(fleeter)
    fake_claude.script(t1=[{"actions": [["write", "out.txt", "x"], ["commit", "add"]]}])
    assert fleeter.run("tasks.toml").ret == 0
    task = fleeter.task("t1")
    assert task.worktree and not os.path.exists(task.worktree)  # removed: it was clean
    (row,) = json.loads(fleeter.run("status", "--json").stdout)
    assert row["worktree"] is None and row["branch"] == task.branch
    r = fleeter.run("logs", "t1")
    r.fnmatch_lines([f"worktree: removed (was {task.worktree})", f"branch: {task.branch}"])


# ---------------------------------------------------------------------------------
# gc says what it keeps; a cancelled task's worktree is collectable


def test_gc_says_up_front_what_yes_keeps_and_collects_cancelled_worktrees(fleeter, fake_claude):
    repo = fleeter.make_repo()
    fleeter.write_tasks("""
        [[task]]
        name = "c"
        cwd = "repo"
        prompt = "p"
        git_ref = "main"
    """)
    fleeter.run("queue", "tasks.toml")
    # the worktree a cancelled attempt leaves: made, then the task cancelled
    task = fleeter.task("c")
    wt = fleeter.home / "worktrees" / "c-cancelled"
    fleeter.git(repo, "worktree", "add", "-q", "-b", "fleetrun/c-x", str(wt), "main")
    with fleeter.ledger().tx() as cur:
        cur.execute("UPDATE tasks SET worktree=?, branch=? WHERE id=?", (str(wt), "fleetrun/c-x", task.id))
    assert fleeter.run("cancel", "c").ret == 0
    wroot = fleeter.home / "worktrees"
    dirty = wroot / "orphan-dirty"
    fleeter.git(repo, "worktree", "add", "-q", "-b", "orphan-dirty", str(dirty), "main")
    (dirty / "wip.txt").write_text("wip")
    clean = wroot / "orphan-clean"
    fleeter.git(repo, "worktree", "add", "-q", "-b", "orphan-clean", str(clean), "main")

    r = fleeter.run("gc")
    assert r.ret == 0, r.stdout + r.stderr
    r.fnmatch_lines(
        [
            f"worktree of cancelled task c {task.id}: {wt} (clean)",
            f"orphan worktree {clean} (clean)",
            f"orphan worktree {dirty} (uncommitted changes): --yes keeps it, --force removes it",
            "3 to collect: `fleetrun gc --yes` removes 2 and keeps 1 (uncommitted changes; "
            "`fleetrun gc --yes --force` removes it too; branches always stay)",
        ]
    )
    r = fleeter.run("gc", "--yes")
    assert r.ret == 0, r.stdout + r.stderr
    r.fnmatch_lines([f"removed worktree {wt} (branch fleetrun/c-x stays)"])
    assert not wt.exists() and dirty.exists() and not clean.exists()
    assert fleeter.task("c").worktree is None
    assert "fleetrun/c-x" in fleeter.git(repo, "branch", "--list", "fleetrun/c-x")


def test_gc_takes_a_needs_human_worktree_and_says_so(fleeter, fake_claude):
    """Issue 14 reverses issue 10's rule (only CANCELLED tasks gave up their worktree): a
    NEEDS_HUMAN task has ended, and gc collects its worktree with the usual checks."""
    one_task(fleeter, extra="max_retries = 0", verify='run = "false"')
    fake_claude.script(t1=[{}])
    assert fleeter.run("tasks.toml").ret == 1
    task = fleeter.task("t1")
    assert task.state.value == "NEEDS_HUMAN"
    fleeter.run("gc").fnmatch_lines([f"worktree of needs_human task t1 {task.id}: {task.worktree} (clean)"])
    r = fleeter.run("gc", "--yes")
    r.fnmatch_lines([f"removed worktree {task.worktree} (branch {task.branch} stays)"])
    assert not Path(task.worktree).exists()

"""The end of a run tells you what failed (issue 14): a failing verifier's last lines
without ``-v``, verifiers told apart by an optional ``name``, a cause that quotes the
failure's own summary line, a pytest ``-ra``-like section of what needs a human, and
``--durations N``; ``logs`` shows a passing verifier's output only with ``-v``."""

from __future__ import annotations

import json

# a verifier whose output looks like pytest's: progress, a failure, the summary line,
# and a line after it (the summary is the last line of *its shape*, not the last line)
PYTEST_LIKE = (
    "for i in 1 2 3 4 5 6 7 8 9; do echo progress-$i; done; "
    "echo 'FAILED tests/test_api.py::test_get - AssertionError: 404'; "
    "echo '======== 54 failed, 12 passed in 3.21s ========'; "
    "echo 'trailing-line'; exit 1"
)


def tasks(fleeter, unit: str = PYTEST_LIKE, max_retries: int = 0) -> None:
    fleeter.make_repo()
    fleeter.write_tasks(f"""
        [agents.ok]
        command = ["{{python}}", "-c", "print('done')"]

        [[task]]
        name = "api"
        cwd = "repo"
        prompt = "p"
        agent = "ok"
        git_ref = "main"
        max_retries = {max_retries}
          [[task.verify]]
          name = "lint"
          run = "echo lint-progress-dots"
          [[task.verify]]
          name = "unit"
          run = {json.dumps(unit)}

        [[task]]
        name = "docs"
        cwd = "repo"
        prompt = "p"
        agent = "ok"
        depends_on = ["api"]
    """)


def test_the_cause_names_the_verifier_and_quotes_its_summary_line(fleeter):
    tasks(fleeter)
    r = fleeter.run("tasks.toml")
    assert r.ret == 1, r.stdout + r.stderr
    api = fleeter.task("api")
    assert api.reason == "retries_exhausted:unit: 54 failed, 12 passed in 3.21s"
    r.fnmatch_lines(
        [
            "*api verify run `lint`: PASS (exit code 0)",
            "*api verify run `unit`: FAIL (exit code 1)",
            "*api NEEDS_HUMAN (attempt 1)  retries_exhausted:unit: 54 failed, 12 passed in 3.21s",
        ]
    )
    status = fleeter.run("status", "--wide")
    status.fnmatch_lines(["api *NEEDS_HUMAN*retries_exhausted:unit: 54 failed, 12 passed in 3.21s"])


def test_a_retry_cause_names_the_verifier_too(fleeter):
    tasks(fleeter, max_retries=1)
    r = fleeter.run("tasks.toml")
    assert r.ret == 1, r.stdout + r.stderr
    r.fnmatch_lines(
        [
            "*api RETRYING (attempt 1)  verify_fail:unit: 54 failed, 12 passed in 3.21s",
            "*api NEEDS_HUMAN (attempt 2)  retries_exhausted:unit: 54 failed, 12 passed in 3.21s",
        ]
    )


def test_without_a_name_the_label_stays_and_the_last_line_is_quoted(fleeter):
    """No name: the cause keeps the command's label; output of no known shape: its last
    non-empty line; no output at all: nothing after the label (as before)."""
    fleeter.write_tasks("""
        [agents.ok]
        command = ["{python}", "-c", "print('done')"]

        [[task]]
        name = "a"
        prompt = "p"
        agent = "ok"
        max_retries = 0
          [[task.verify]]
          run = "echo first; echo 'no such file: x.txt'; echo; exit 2"

        [[task]]
        name = "b"
        prompt = "p"
        agent = "ok"
        max_retries = 0
          [[task.verify]]
          run = "false"
    """)
    r = fleeter.run("tasks.toml")
    assert r.ret == 1, r.stdout + r.stderr
    assert fleeter.task("a").reason == (
        "retries_exhausted:echo first; echo 'no such file: x.txt'; echo; exit 2: no such file: x.txt"
    )
    assert fleeter.task("b").reason == "retries_exhausted:false"


def test_a_failing_verifier_prints_its_last_lines_without_v(fleeter):
    long_line = "x" * 400
    tasks(fleeter, unit=PYTEST_LIKE.replace("echo 'trailing-line'", f"echo {long_line}"))
    r = fleeter.run("tasks.toml")
    assert r.ret == 1, r.stdout + r.stderr
    r.fnmatch_lines(
        [
            "*api verify run `unit`: FAIL (exit code 1)",
            "           | progress-9",
            "           | FAILED tests/test_api.py::test_get - AssertionError: 404",
            "           | ======== 54 failed, 12 passed in 3.21s ========",
            "           | xxxxxxxx*…",
        ]
    )
    assert "progress-7" not in r.stdout  # a few lines, not all of them
    assert long_line not in r.stdout  # trimmed
    assert "lint-progress-dots" not in r.stdout  # a passing verifier's output is not shown
    # -v: more lines, whole
    v = fleeter.run("tasks.toml", "-v", "--new-queue")
    v.fnmatch_lines(
        ["*api verify run `unit`: FAIL (exit code 1)", "           | progress-1", f"           | {long_line}"]
    )
    # -q: no verdict lines at all
    q = fleeter.run("tasks.toml", "-q", "--new-queue")
    assert "| progress-9" not in q.stdout


def test_the_summary_lists_what_needs_a_human_like_pytest_ra(fleeter):
    tasks(fleeter)
    r = fleeter.run("tasks.toml")
    assert r.ret == 1, r.stdout + r.stderr
    api = fleeter.task("api")
    r.fnmatch_lines(
        [
            "=== short task summary info ===",
            "NEEDS_HUMAN api: retries_exhausted:unit: 54 failed, 12 passed in 3.21s",
            "    verify run `unit` (attempt 1): exit code 1 | 54 failed, 12 passed in 3.21s",
            f"    branch {api.branch}; look: fleetrun logs api",
            "NEEDS_HUMAN docs: dependency_needs_human:api",
            "    look: fleetrun logs docs",
            "=== 2 needs_human in * ===",
        ]
    )
    # the section is the end of the output: only the final line comes after it
    assert r.outlines[-1].startswith("=== 2 needs_human in ")
    # a run where everything is done has no such section
    fleeter.write_tasks(
        """
        [agents.ok]
        command = ["{python}", "-c", "print('done')"]

        [[task]]
        name = "fine"
        prompt = "p"
        agent = "ok"
    """,
        name="ok.toml",
    )
    ok = fleeter.run("ok.toml")
    assert ok.ret == 0, ok.stdout + ok.stderr
    assert "short task summary info" not in ok.stdout


def test_the_summary_lists_cancelled_tasks_and_counts_only_this_run(fleeter):
    fleeter.write_tasks("""
        [agents.slow]
        command = ["{python}", "-c", "import time; time.sleep(60)"]

        [[task]]
        name = "slow"
        prompt = "p"
        agent = "slow"
    """)
    proc = fleeter.popen("tasks.toml")
    import time

    deadline = time.time() + 120
    while time.time() < deadline:
        c = fleeter.run("cancel", "slow")
        if c.ret == 0:
            break
        time.sleep(0.2)
    out, err = proc.communicate(timeout=60)
    text = out.decode()
    assert proc.returncode == 1, text + err.decode()
    assert "=== short task summary info ===" in text, text
    assert "CANCELLED slow: operator_cancel" in text, text
    assert "    look: fleetrun logs slow" in text, text


def test_durations_lists_the_slowest_tasks_and_verifiers(fleeter):
    fleeter.write_tasks("""
        [agents.ok]
        command = ["{python}", "-c", "print('done')"]

        [[task]]
        name = "quick"
        prompt = "p"
        agent = "ok"

        [[task]]
        name = "sleepy"
        prompt = "p"
        agent = "ok"
          [[task.verify]]
          name = "nap"
          run = "sleep 1.2"
    """)
    r = fleeter.run("tasks.toml", "--durations", "0")
    assert r.ret == 0, r.stdout + r.stderr
    r.fnmatch_lines(
        [
            "=== slowest durations ===",
            "*.??s  task    sleepy",
            "*1.??s  verify  sleepy `nap` (attempt 1)",
            "*.??s  task    quick",
            "=== 2 done in * ===",
        ]
    )
    one = fleeter.run("tasks.toml", "--durations", "1", "--new-queue")
    one.fnmatch_lines(["=== slowest 1 durations ===", "*.??s  task    sleepy", "=== 2 done in * ==="])
    assert "verify  sleepy" not in one.stdout and "task    quick" not in one.stdout
    none = fleeter.run("tasks.toml", "--new-queue")
    assert "slowest" not in none.stdout
    bad = fleeter.run("tasks.toml", "--durations", "-1", "--new-queue")
    assert bad.ret == 4, bad.stdout + bad.stderr


def test_logs_shows_a_passing_verifiers_output_only_with_v(fleeter):
    tasks(fleeter)
    fleeter.run("tasks.toml")
    logs = fleeter.run("logs", "api")
    assert logs.ret == 0, logs.stdout + logs.stderr
    logs.fnmatch_lines(
        [
            "*PASS verifier 1 (run: lint) attempt 1: exit code 0",
            "*FAIL verifier 2 (run: unit) attempt 1: exit code 1",
            "    | progress-9",
        ]
    )
    assert "lint-progress-dots" not in logs.stdout
    verbose = fleeter.run("logs", "-v", "api")
    verbose.fnmatch_lines(["*PASS verifier 1 (run: lint) attempt 1: exit code 0", "    | lint-progress-dots"])


def test_verifier_names_are_checked(fleeter):
    fleeter.write_tasks("""
        [[task]]
        name = "a"
        prompt = "p"
          [[task.verify]]
          name = "unit"
          run = "true"
          [[task.verify]]
          name = "unit"
          run = "false"
          [[task.verify]]
          name = 3
          run = "false"
          [[task.verify]]
          name = ""
          run = "false"

        [[task]]
        name = "b"
        prompt = "p"
          [[task.verify]]
          name = "unit"
          run = "true"
    """)
    r = fleeter.run("validate", "tasks.toml")
    assert r.ret == 4, r.stdout + r.stderr
    r.fnmatch_lines(
        [
            "ERROR: tasks.toml:8: task 'a': verify #2: name: 'unit' is the name of verify #1 too; "
            "a task's verifiers need names of their own"
        ],
        stream="err",
    )
    r.fnmatch_lines(["ERROR: tasks.toml:11: task 'a': verify #3: name: must be a string, not *"], stream="err")
    r.fnmatch_lines(["ERROR: tasks.toml:14: task 'a': verify #4: name: must not be empty"], stream="err")
    assert "task 'b'" not in r.stderr  # another task may use the same name


def test_the_command_to_look_names_the_id_where_the_name_means_a_newer_task(fleeter):
    fleeter.write_tasks("""
        [agents.ok]
        command = ["{python}", "-c", "print('done')"]

        [[task]]
        name = "flaky"
        prompt = "p"
        agent = "ok"
        max_retries = 0
          [[task.verify]]
          run = "echo 'tests: 1 failed'; exit 1"
    """)
    assert fleeter.run("queue", "tasks.toml").ret == 0
    assert fleeter.run("queue", "tasks.toml").ret == 0
    r = fleeter.run("work", "--until-idle")
    assert r.ret == 1, r.stdout + r.stderr
    older, newer = (t for t in fleeter.ledger().tasks() if t.name == "flaky")
    assert older.created <= newer.created
    r.fnmatch_lines(
        [
            "=== short task summary info ===",
            "NEEDS_HUMAN flaky: *",
            "*",
            f"    look: fleetrun logs {older.id}",
            "NEEDS_HUMAN flaky: *",
            "*",
            "    look: fleetrun logs flaky",
            "=== 2 needs_human in * ===",
        ]
    )


def test_the_retry_prompt_names_the_verifier_and_says_what_it_runs(fleeter, fake_claude):
    fleeter.make_repo()
    fleeter.write_tasks("""
        [[task]]
        name = "t1"
        cwd = "repo"
        prompt = "Write out.txt."
        git_ref = "main"
        max_retries = 1
          [[task.verify]]
          name = "has-out"
          run = "test -f out.txt || { echo 'out.txt is missing'; exit 1; }"
    """)
    fake_claude.script(t1=[{"actions": []}, {"actions": [["write", "out.txt", "x"], ["commit", "add out"]]}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    second = fake_claude.calls("t1")[1]["prompt"]
    assert (
        "Verifier `has-out` (run: `test -f out.txt || { echo 'out.txt is missing'; exit 1; }`) failed: exit code 1."
    ) in second, second
    assert "out.txt is missing" in second

"""Running a tasks file again, through the real CLI with the fake claude: incremental
re-runs (only new, changed and not-DONE tasks run; unchanged DONE ones are kept), and
``--lf``/``--ff`` with pytest's meanings over the last run of the file."""

from __future__ import annotations

import pytest


def three(
    fleeter, a_prompt: str = "Write a.txt.", comment: str = "", order: str = "abc", extra_c: str = "", more: str = ""
) -> None:
    tasks = {
        "a": f'''
            [[task]]
            name = "a"
            cwd = "repo"
            git_ref = "main"
            prompt = "{a_prompt}"
            {comment}
        ''',
        "b": """
            [[task]]
            name = "b"
            cwd = "repo"
            git_ref = "main"
            prompt = "Write b.txt."
            depends_on = ["a"]
        """,
        "c": f"""
            [[task]]
            name = "c"
            cwd = "repo"
            git_ref = "main"
            prompt = "Write c.txt."
            {extra_c}
        """,
    }
    fleeter.write_tasks("\n".join(tasks[k] for k in order) + more)


@pytest.fixture
def done_three(fleeter, fake_claude):
    fleeter.make_repo()
    three(fleeter)
    fake_claude.script(default=[{"actions": [["write", "out.txt", "x"], ["commit", "work"]], "result": "did it"}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    return fake_claude


def ncalls(fake_claude) -> dict[str, int]:
    return {k: len(fake_claude.calls(k)) for k in "abc"}


def test_a_comment_or_the_order_of_tasks_reruns_nothing(fleeter, done_three):
    three(fleeter, comment="# a comment, and the tasks in another order", order="cab")
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    assert ncalls(done_three) == {"a": 1, "b": 1, "c": 1}
    r.fnmatch_lines(["resuming queue * from an unchanged file (3 done)*"])


def test_a_changed_task_reruns_with_its_dependents_the_rest_is_kept(fleeter, done_three):
    three(fleeter, a_prompt="Write a.txt, in French.")
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    assert ncalls(done_three) == {"a": 2, "b": 2, "c": 1}
    r.fnmatch_lines(
        ["1 unchanged (done earlier): c; --new-queue runs it again", "=== 2 done, 1 unchanged (done earlier) in * ==="]
    )
    # the kept task is in the new queue as DONE, its branch that of the task it stands for
    led = fleeter.ledger()
    old_c, new_c = [t for t in led.tasks() if t.name == "c"]
    assert new_c.queue_id != old_c.queue_id and new_c.state.value == "DONE"
    assert new_c.branch == old_c.branch and new_c.reason == f"unchanged:{old_c.id}"
    fleeter.run("logs", new_c.id).fnmatch_lines(
        [f"*note: unchanged since the file's last run: task {old_c.id} did this work*"]
    )
    # by its name, the run that did the work (issue 22)
    fleeter.run("logs", "c").fnmatch_lines([f"c {old_c.id} [[]DONE]*"])
    # kept again: still named after the task that did the work
    three(fleeter, a_prompt="Write a.txt, in German.")
    assert fleeter.run("tasks.toml").ret == 0
    assert fleeter.task("c").reason == f"unchanged:{old_c.id}"


def test_a_dependent_of_an_unchanged_done_task_gets_its_handoff(fleeter, done_three):
    fleeter.write_tasks("""
        [[task]]
        name = "a"
        cwd = "repo"
        git_ref = "main"
        prompt = "Write a.txt."

        [[task]]
        name = "b"
        cwd = "repo"
        git_ref = "main"
        prompt = "Write b.txt, twice."
        depends_on = ["a"]

        [[task]]
        name = "c"
        cwd = "repo"
        git_ref = "main"
        prompt = "Write c.txt."
    """)
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    assert ncalls(done_three) == {"a": 1, "b": 2, "c": 1}
    r.fnmatch_lines(["2 unchanged (done earlier): a, c; --new-queue runs them again"])
    a = [t for t in fleeter.ledger().tasks() if t.name == "a"][0]
    assert "a is DONE on branch " + a.branch in done_three.calls("b")[-1]["prompt"]
    assert "did it" in done_three.calls("b")[-1]["prompt"]


def test_tasks_that_did_not_end_done_run_again_and_new_ones_run(fleeter, fake_claude):
    fleeter.make_repo()
    flag = fleeter.path / "c-may-pass"
    three(fleeter, extra_c=f'max_retries = 0\n[[task.verify]]\nrun = "test -f {flag}"')
    fake_claude.script(default=[{"result": "ok"}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 1
    assert fleeter.states()["c"] == "NEEDS_HUMAN"
    flag.write_text("")
    three(
        fleeter,
        extra_c=f'max_retries = 0\n[[task.verify]]\nrun = "test -f {flag}"',
        more='\n[[task]]\nname = "d"\nprompt = "new"\n',
    )
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    assert ncalls(fake_claude) == {"a": 1, "b": 1, "c": 2}
    assert len(fake_claude.calls("d")) == 1
    assert fleeter.states() == {"a": "DONE", "b": "DONE", "c": "DONE", "d": "DONE"}
    r.fnmatch_lines(["2 unchanged (done earlier): a, b; --new-queue runs them again"])


def test_limits_and_tags_are_not_part_of_the_definition(fleeter, done_three):
    three(fleeter, comment='max_retries = 5\ntimeout_min = 9\ntags = ["x"]')
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    assert ncalls(done_three) == {"a": 1, "b": 1, "c": 1}
    r.fnmatch_lines(["3 unchanged (done earlier): a, b, c; --new-queue runs them again"])
    # the new tags are the kept task's, for -m
    assert fleeter.run("cancel", "-m", "x").ret == 5  # a is DONE: nothing to cancel, but it matched
    assert [t.spec.tags for t in fleeter.ledger().tasks() if t.name == "a"][-1] == ["x"]


def test_a_changed_verifier_counts(fleeter, done_three):
    three(fleeter, extra_c='[[task.verify]]\nrun = "true"')
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    assert ncalls(done_three) == {"a": 1, "b": 1, "c": 2}


def test_new_queue_still_queues_all(fleeter, done_three):
    three(fleeter, a_prompt="Write a.txt, in French.")
    r = fleeter.run("tasks.toml", "--new-queue")
    assert r.ret == 0, r.stdout + r.stderr
    assert ncalls(done_three) == {"a": 2, "b": 2, "c": 2}


def failing_c(fleeter, fake_claude):
    fleeter.make_repo()
    flag = fleeter.path / "c-may-pass"
    three(fleeter, extra_c=f'max_retries = 0\n[[task.verify]]\nrun = "test -f {flag}"')
    fake_claude.script(default=[{"result": "ok"}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 1
    return flag


def test_last_failed_runs_only_the_failures(fleeter, fake_claude):
    flag = failing_c(fleeter, fake_claude)
    co = fleeter.run("--co", "--lf", "tasks.toml")
    co.fnmatch_lines(["run-last-failure: rerun previous 1 failure", "<Task c>", "1/3 tasks collected (2 deselected)"])
    flag.write_text("")
    r = fleeter.run("--lf", "tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    r.fnmatch_lines(["run-last-failure: rerun previous 1 failure", "2 deselected (--lf)", "=== 1 done in *"])
    assert ncalls(fake_claude) == {"a": 1, "b": 1, "c": 2}
    # none failed now: --lf runs all (pytest's --lfnf=all), and all of it is DONE already
    r = fleeter.run("--lf", "tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    r.fnmatch_lines(
        [
            "run-last-failure: no previously failed tasks, not deselecting any",
            "3 unchanged (done earlier): a, b, c; --new-queue runs them again",
        ]
    )
    assert ncalls(fake_claude) == {"a": 1, "b": 1, "c": 2}


def test_last_failed_takes_a_failed_tasks_dependencies_along(fleeter, fake_claude):
    fleeter.make_repo()
    flag = fleeter.path / "b-may-pass"
    fleeter.write_tasks(f"""
        [[task]]
        name = "a"
        cwd = "repo"
        git_ref = "main"
        prompt = "Write a.txt."

        [[task]]
        name = "b"
        cwd = "repo"
        git_ref = "main"
        prompt = "Write b.txt."
        depends_on = ["a"]
        max_retries = 0
        [[task.verify]]
        run = "test -f {flag}"
    """)
    fake_claude.script(default=[{"actions": [["write", "o.txt", "x"], ["commit", "w"]], "result": "did a"}])
    assert fleeter.run("tasks.toml").ret == 1
    flag.write_text("")
    r = fleeter.run("--lf", "tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    assert (len(fake_claude.calls("a")), len(fake_claude.calls("b"))) == (1, 2)
    r.fnmatch_lines(
        [
            "run-last-failure: rerun previous 1 failure",
            "also selected, as a dependency: a",
            "1 unchanged (done earlier): a*",
        ]
    )
    assert "did a" in fake_claude.calls("b")[-1]["prompt"]


def test_failed_first_orders_the_failures_first(fleeter, fake_claude):
    failing_c(fleeter, fake_claude)
    co = fleeter.run("--co", "--ff", "tasks.toml")
    assert [line for line in co.outlines if line.startswith("<Task")] == ["<Task c>", "<Task a>", "<Task b>  (after a)"]
    co.fnmatch_lines(["run-last-failure: 1 failure first"])
    fleeter.write_policy("[local]\nmax_tasks = 1\n")
    r = fleeter.run("--ff", "--new-queue", "tasks.toml")
    names = [c["env"]["FLEETRUN_TASK_NAME"] for c in fake_claude.calls()][3:]
    assert names == ["c", "a", "b"], r.stdout


def test_an_unfinished_task_of_the_last_run_is_named(fleeter, fake_claude):
    fleeter.make_repo()
    three(fleeter)
    assert fleeter.run("queue", "tasks.toml").ret == 0  # queued, never worked: READY
    old_c = fleeter.task("c")
    fake_claude.script(default=[{"result": "ok"}])
    three(fleeter, extra_c='model = "opus"')
    r = fleeter.run("tasks.toml", "-k", "c")
    r.fnmatch_lines(
        [
            f"warning: c of the file's last run ({old_c.id}) is READY, not finished: it runs besides "
            f"the new one; fleetrun cancel {old_c.id} stops it"
        ]
    )

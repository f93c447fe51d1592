"""The operator's bulk verbs through the real CLI: ``cancel A B``, ``cancel --all``,
``retry --state needs_human``, ``-k``/``-m`` on cancel, retry and approve."""

from __future__ import annotations

CHAIN = """
    [[task]]
    name = "api-a"
    prompt = "a"

    [[task]]
    name = "api-b"
    prompt = "b"
    depends_on = ["api-a"]

    [[task]]
    name = "docs"
    prompt = "d"
"""


def test_cancel_several_names_one_line_each_and_a_count(fleeter):
    fleeter.write_tasks(CHAIN)
    assert fleeter.run("queue", "tasks.toml").ret == 0
    r = fleeter.run("cancel", "docs", "api-a")
    assert r.ret == 0, r.stderr
    r.fnmatch_lines(
        [
            "cancelled docs task_*",
            "cancelled api-a task_*",
            "  api-b * -> NEEDS_HUMAN (dependency_cancelled:api-a)",
            "2 cancelled",
        ]
    )
    assert fleeter.states() == {"api-a": "CANCELLED", "api-b": "NEEDS_HUMAN", "docs": "CANCELLED"}


def test_cancel_names_are_all_checked_before_anything_changes(fleeter):
    fleeter.write_tasks(CHAIN)
    fleeter.run("queue", "tasks.toml")
    r = fleeter.run("cancel", "docs", "nosuch")
    assert r.ret == 4
    r.fnmatch_lines(["ERROR: TASK: no task with id or name 'nosuch'*"])
    assert fleeter.states()["docs"] == "READY"


def test_cancel_all(fleeter):
    fleeter.write_tasks(CHAIN)
    fleeter.run("queue", "tasks.toml")
    r = fleeter.run("cancel", "--all")
    assert r.ret == 0, r.stderr
    r.fnmatch_lines(["cancelled api-a *", "*cancelled api-b *", "cancelled docs *", "3 cancelled"])
    assert set(fleeter.states().values()) == {"CANCELLED"}
    # nothing left to cancel: said, and exit 5 as pytest's "no tests ran" after -k
    r = fleeter.run("cancel", "--all")
    assert r.ret == 5
    r.fnmatch_lines(["no task to cancel (--all)*"])


def test_cancel_with_k(fleeter):
    fleeter.write_tasks(CHAIN)
    fleeter.run("queue", "tasks.toml")
    r = fleeter.run("cancel", "-k", "doc")
    assert r.ret == 0
    assert fleeter.states()["docs"] == "CANCELLED"
    r = fleeter.run("cancel", "-k", "nomatch")
    assert r.ret == 5
    r.fnmatch_lines(["no task to cancel (-k nomatch)*"])


def test_retry_state_needs_human_revives_the_chain(fleeter):
    fleeter.write_tasks(CHAIN)
    fleeter.run("queue", "tasks.toml")
    fleeter.run("cancel", "api-a", "docs")
    # api-b needs a human because api-a was cancelled; retrying it alone still waits on api-a
    r = fleeter.run("retry", "--state", "needs_human")
    assert r.ret == 0, r.stderr
    r.fnmatch_lines(["api-b * -> PENDING", "1 retried"])
    r = fleeter.run("retry", "--state", "cancelled", "-k", "api")
    assert r.ret == 0, r.stderr
    r.fnmatch_lines(["api-a * -> READY", "1 retried"])
    assert fleeter.states() == {"api-a": "READY", "api-b": "PENDING", "docs": "CANCELLED"}
    r = fleeter.run("retry", "--state", "needs_human")
    assert r.ret == 5
    r.fnmatch_lines(["no task to retry (--state needs_human)*"])


def test_retry_without_a_task_or_selector_is_a_usage_error(fleeter):
    fleeter.write_tasks(CHAIN)
    fleeter.run("queue", "tasks.toml")
    r = fleeter.run("retry")
    assert r.ret == 4
    r.fnmatch_lines(["ERROR: TASK: name a task, or select some with --all, --state, -k or -m*"])


def test_bad_state_is_a_usage_error(fleeter):
    fleeter.write_tasks(CHAIN)
    fleeter.run("queue", "tasks.toml")
    r = fleeter.run("retry", "--state", "nope")
    assert r.ret == 4
    r.fnmatch_lines(["ERROR: --state: 'nope' is not a state*"])


def test_approve_with_k(fleeter):
    fleeter.write_tasks(CHAIN)
    fleeter.run("queue", "tasks.toml")
    fleeter.run("cancel", "api-a")
    r = fleeter.run("approve", "-k", "api")
    assert r.ret == 0, r.stderr
    r.fnmatch_lines(["api-b * -> DONE", "1 approved"])
    assert fleeter.states()["api-b"] == "DONE"


def test_one_name_keeps_its_old_output(fleeter):
    fleeter.write_tasks(CHAIN)
    fleeter.run("queue", "tasks.toml")
    r = fleeter.run("cancel", "docs")
    assert r.ret == 0
    assert r.outlines[-1].startswith("cancelled docs ")
    r = fleeter.run("cancel", "--all", "-k", "docs")
    assert r.ret == 5  # docs is CANCELLED already: nothing to cancel


def test_retry_elsewhere_selects_running_tasks_too(fleeter):
    fleeter.write_tasks(CHAIN)
    fleeter.run("queue", "tasks.toml")
    led = fleeter.ledger()
    from fleetrun.states import State

    task = fleeter.task("docs")
    led.lease(task.id, State.READY, "mini", "fresh")
    led.transition(task.id, State.ASSIGNED, State.RUNNING, "started", attempt=1, host="mini")
    assert fleeter.run("retry", "--state", "running").ret == 5  # a running task needs --elsewhere
    assert fleeter.run("retry", "--elsewhere", "--all").ret == 5  # and its state named
    r = fleeter.run("retry", "--elsewhere", "--state", "running")
    assert r.ret == 0, r.stderr
    r.fnmatch_lines(["docs * -> RESUMING", "1 retried"])

"""``tags`` on a task and ``-m EXPR`` through the real CLI, as pytest's markers:
``--co`` shows the selection, the header says how many were deselected."""

from __future__ import annotations

TAGGED = """
    [[task]]
    name = "api"
    prompt = "a"
    tags = ["backend"]

    [[task]]
    name = "slow-api"
    prompt = "b"
    depends_on = ["api"]
    tags = ["backend", "slow"]

    [[task]]
    name = "ui"
    prompt = "u"
    tags = ["frontend"]
"""


def test_collect_only_with_m_shows_the_selection_and_the_deselected(fleeter):
    fleeter.write_tasks(TAGGED)
    r = fleeter.run("--co", "-m", "backend and not slow", "tasks.toml")
    assert r.ret == 0, r.stderr
    assert r.outlines[0] == "<Task api>  [backend]"
    r.fnmatch_lines(["1/3 tasks collected (2 deselected)"])
    r.no_fnmatch_line("<Task ui>*")
    # a selected task takes its dependencies along, as with -k
    r = fleeter.run("--co", "-m", "slow", "tasks.toml")
    r.fnmatch_lines(
        [
            "<Task api>  [[]backend]",
            "<Task slow-api>  (after api)  [[]backend, slow]",
            "2/3 tasks collected (1 deselected)",
        ]
    )
    # -k and -m both
    r = fleeter.run("--co", "-m", "backend", "-k", "not slow", "tasks.toml")
    r.fnmatch_lines(["<Task api>*", "1/3 tasks collected (2 deselected)"])
    r = fleeter.run("--co", "-m", "nothing", "tasks.toml")
    assert r.ret == 5


def test_run_header_says_how_many_were_deselected(fleeter, fake_claude):
    fleeter.write_tasks(TAGGED)
    fake_claude.script(default=[{"result": "ok"}])
    r = fleeter.run("-m", "frontend", "tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    r.fnmatch_lines(["collected 1 task", "2 deselected (-m frontend)"])
    assert fleeter.states() == {"ui": "DONE"}


def test_bad_tags_are_usage_errors(fleeter):
    fleeter.write_tasks("""
        [[task]]
        name = "a"
        prompt = "a"
        tags = ["two words", "not"]

        [[task]]
        name = "b"
        prompt = "b"
        tags = "backend"
    """)
    r = fleeter.run("validate", "tasks.toml")
    assert r.ret == 4
    r.fnmatch_lines(
        [
            "ERROR: tasks.toml:*: task 'a': tags: 'two words' is not a tag*",
            "ERROR: tasks.toml:*: task 'b': tags: must be a list, not *",
        ]
    )


def test_bad_m_expression(fleeter):
    fleeter.write_tasks(TAGGED)
    r = fleeter.run("--co", "-m", "backend and", "tasks.toml")
    assert r.ret == 4
    r.fnmatch_lines(["ERROR: -m: bad expression 'backend and': unexpected end"])


def test_tags_as_a_default_of_every_task(fleeter):
    fleeter.write_tasks("""
        tags = ["nightly"]

        [[task]]
        name = "a"
        prompt = "a"

        [[task]]
        name = "b"
        prompt = "b"
        tags = ["quick"]
    """)
    r = fleeter.run("--co", "-m", "nightly", "tasks.toml")
    r.fnmatch_lines(["<Task a>  [[]nightly]", "1/2 tasks collected (1 deselected)"])


def test_cancel_with_m(fleeter):
    fleeter.write_tasks(TAGGED)
    fleeter.run("queue", "tasks.toml")
    r = fleeter.run("cancel", "-m", "backend and not slow")
    assert r.ret == 0, r.stderr
    r.fnmatch_lines(["cancelled api *", "  slow-api * -> NEEDS_HUMAN (dependency_cancelled:api)", "1 cancelled"])
    assert fleeter.states()["ui"] == "READY"

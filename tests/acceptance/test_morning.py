"""What a person sees in the morning, after a night of runs of one tasks file, through
the real CLI: ``status`` shows each task name's latest run (its history under
``--all``), ``--state needs_human`` what needs them now, and ``logs NAME`` of a task
kept unchanged shows the run that did its work (issue 22, "The morning")."""

from __future__ import annotations

from fleetrun.fleeter import ECHO_AGENT, echo_task


def seven(fleeter, flag, changed: str = "", lines: str = "") -> None:
    """Seven tasks: t5 passes once ``flag`` exists, t6 never passes; ``changed`` names
    the task whose prompt differs (a change that makes it run again)."""
    text = ECHO_AGENT
    for i in range(1, 8):
        name = f"t{i}"
        keys = {"prompt": f"p {lines}" if name == changed else "p"}
        verify = "true"
        if name == "t5":
            verify, keys["max_retries"] = f"test -f {flag}", 0
        elif name == "t6":
            verify, keys["max_retries"] = "false", 0
        text += echo_task(name, verify=verify, **keys)
    fleeter.write_tasks(text)


def three_runs(fleeter) -> None:
    flag = fleeter.path / "t5-may-pass"
    seven(fleeter, flag)
    assert fleeter.run("tasks.toml").ret == 1  # t5 and t6 need a human
    flag.write_text("")
    seven(fleeter, flag, changed="t1", lines="again")
    assert fleeter.run("tasks.toml").ret == 1  # t1 changed, t5 passes, t6 fails again
    seven(fleeter, flag, changed="t2", lines="and again")
    assert fleeter.run("tasks.toml").ret == 1  # t2 changed, t6 fails again


def rows(text: str) -> list[list[str]]:
    """The status table's rows (after the supervisor line and the header), split."""
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("NAME "))
    return [line.split() for line in lines[head + 1 :] if line.strip()]


def test_status_shows_each_names_latest_run_and_the_history_under_all(fleeter):
    three_runs(fleeter)
    led = fleeter.ledger()
    assert len(led.tasks()) == 21  # three queues of seven: the ledger keeps the history
    newest = {t.name: t for t in led.tasks()}  # oldest first: the newest of each name wins
    r = fleeter.run("status")
    assert r.ret == 0, r.stdout + r.stderr
    shown = rows(r.stdout)
    assert [(row[0], row[1], row[6]) for row in shown] == [
        (f"t{i}", newest[f"t{i}"].state.value, newest[f"t{i}"].id) for i in range(1, 8)
    ], r.stdout
    assert {row[0]: row[1] for row in shown}["t5"] == "DONE"  # not NEEDS_HUMAN as well
    # the history: every run of every name
    every = rows(fleeter.run("status", "--all").stdout)
    assert sorted(row[6] for row in every) == sorted(t.id for t in led.tasks())


def test_status_state_needs_human_lists_what_needs_you_now(fleeter):
    three_runs(fleeter)
    r = fleeter.run("status", "--state", "needs_human")
    assert r.ret == 0, r.stdout + r.stderr
    assert [(row[0], row[1], row[6]) for row in rows(r.stdout)] == [("t6", "NEEDS_HUMAN", fleeter.task("t6").id)], (
        r.stdout
    )
    # its history: t5's first run and t6's three
    every = rows(fleeter.run("status", "--all", "--state", "needs_human").stdout)
    assert sorted(row[0] for row in every) == ["t5", "t6", "t6", "t6"]
    # --json and --graph show the same tasks as the table
    import json

    assert [t["name"] for t in json.loads(fleeter.run("status", "--json").stdout)] == [f"t{i}" for i in range(1, 8)]
    assert len(json.loads(fleeter.run("status", "--json", "--all").stdout)) == 21


def test_logs_of_a_task_kept_unchanged_shows_the_run_that_did_the_work(fleeter):
    three_runs(fleeter)
    led = fleeter.ledger()
    t3 = [t for t in led.tasks() if t.name == "t3"]
    worker = t3[0]  # the first run did t3's work; the two later ones kept it
    assert t3[-1].reason == f"unchanged:{worker.id}"
    r = fleeter.run("logs", "t3")
    assert r.ret == 0, r.stdout + r.stderr
    r.fnmatch_lines(
        [
            f"t3 {worker.id} [[]DONE]*",
            f"(kept unchanged by the later runs of the file: latest {t3[-1].id})",
            "*attempt 1 (fresh) ended: *",
            "*PASS verifier 1 (run: true) attempt 1*",
        ]
    )
    # the kept task itself is still there by its id
    fleeter.run("logs", t3[-1].id).fnmatch_lines(
        [f"t3 {t3[-1].id} [[]DONE]*", f"*note: unchanged since the file's last run: task {worker.id} did this work*"]
    )

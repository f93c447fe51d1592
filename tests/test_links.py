"""Links a plugin attaches to a task (fleetrun/links.py): the ledger's ``links`` table
and its migration, the strict URL check, and where a link shows — the handoff in a
dependent's prompt, ``fleetrun logs`` and ``fleetrun status --json`` — through the real
CLI, with a fleetconf.py that attaches one on DONE."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import fleetrun
from fleetrun.ledger import SCHEMA_VERSION, Ledger
from fleetrun.links import check_url
from fleetrun.reports import Handoff
from fleetrun.taskspec import TaskSpec


def test_a_version_3_ledger_gets_the_links_table_and_keeps_its_rows(tmp_path: Path) -> None:
    db = tmp_path / "home" / "state.db"
    with Ledger(db) as led:
        (t,) = led.add_tasks([TaskSpec(name="a", prompt="do a", cwd="/repo")])
    conn = sqlite3.connect(str(db), isolation_level=None)
    conn.execute("DROP TABLE links")  # what a fleetrun before links made
    conn.execute("PRAGMA user_version=3")
    conn.close()
    with Ledger(db) as led:
        assert led.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 4
        assert led.get(t.id) is not None and led.links() == {}
        led.set_link(t.id, "pull_request", "https://example.com/pull/1")
        led.set_link(t.id, "pull_request", "https://example.com/pull/2")  # replaced, not added
        led.set_link(t.id, "ci_run", "https://ci.example.com/7")
        assert fleetrun.task_links(led, t.id) == {
            "pull_request": "https://example.com/pull/2",
            "ci_run": "https://ci.example.com/7",
        }


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("https://github.com/o/r/pull/12", None),
        ("http://127.0.0.1:8080/x", None),
        ("javascript:alert(1)", "must start with https:// or http://"),
        ("https://", "names no host"),
        ("https://x.com/a b", "holds a space, a control or a non-ASCII character"),
        ("https://x.com/\x1b[31m", "holds a space, a control or a non-ASCII character"),
        ("https://x.com:99999/", "is not a URL (Port out of range 0-65535)"),
        (["https://x.com"], "is not a string (list)"),
        ("", "must be 1 to 2000 characters long"),
    ],
)
def test_a_url_is_checked_strictly(url: Any, why: Any) -> None:
    assert check_url(url) == why


def test_a_handoff_renders_its_links() -> None:
    h = Handoff("api", "fleetrun/api-1", "Added /users.", links={"pull_request": "https://x.com/pull/3"})
    assert h.render() == (
        "- api is DONE on branch fleetrun/api-1.\n  Its pull request: https://x.com/pull/3\n"
        "  Its summary: Added /users."
    )


FLEETCONF = """
import fleetrun

@fleetrun.hookimpl
def fleetrun_transition(task, from_state, to_state, cause, attempt, config):
    if to_state == "DONE" and task.name == "api":
        fleetrun.add_link(config, task.id, "pull_request", "https://git.example.com/o/r/pull/7")
        fleetrun.add_note(config, task.id, "opened a pull request")
        try:
            fleetrun.add_link(config, task.id, "Bad Name", "https://x.com")
        except ValueError as e:
            fleetrun.add_note(config, task.id, str(e))
"""


def test_a_link_reaches_the_dependents_prompt_logs_and_status(fleeter: Any) -> None:
    fleeter.write_tasks("""
        [agents.echo]
        command = ["{python}", "-c", "print('hi')"]

        [[task]]
        name = "api"
        prompt = "do it"
        cwd = "."
        agent = "echo"

        [[task]]
        name = "ui"
        prompt = "use it"
        cwd = "."
        agent = "echo"
        depends_on = ["api"]
    """)
    fleeter.write_fleetconf(FLEETCONF)
    result = fleeter.run("tasks.toml")
    result.assert_outcomes(done=2)
    ui = fleeter.task("ui")
    (att,) = fleeter.ledger().attempts(ui.id)
    prompt = (fleeter.home / "attempts" / att.id / "prompt").read_text()
    assert "- api is DONE.\n  Its pull request: https://git.example.com/o/r/pull/7" in prompt

    status = fleeter.run("status", "--json")
    rows = {r["name"]: r for r in json.loads(status.stdout)}
    assert rows["api"]["links"] == {"pull_request": "https://git.example.com/o/r/pull/7"}
    assert rows["ui"]["links"] == {}
    logs = fleeter.run("logs", "api")
    logs.fnmatch_lines(
        [
            "*  link: pull request: https://git.example.com/o/r/pull/7",
            "*  note: opened a pull request",
            "*  note: link name 'Bad Name': lowercase letters, digits and _, starting with a letter*",
        ],
        stream="out",
    )
    as_json = json.loads(fleeter.run("logs", "api", "--json").stdout)
    assert as_json["task"]["links"] == {"pull_request": "https://git.example.com/o/r/pull/7"}

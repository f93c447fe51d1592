"""The HTML report of tasks that ran elsewhere than here: on a peer (a real sshd on
127.0.0.1 as the peer ``mini``, the real CLI on both sides, the fake ``claude`` as the
agent), and in a role's mailbox (a role bound to a folder, reporting through the real
``fleetrun mailbox done``)."""

from __future__ import annotations

import shlex
from html.parser import HTMLParser
from typing import Any, Optional

from .test_mailbox import ROLE_TASK, finish, message, report_from, role_dir, wait_for

pytest_plugins = ["sshd"]


def read_page(path: Any) -> Elements:
    page = Elements()
    page.feed(path.read_text(encoding="utf-8"))
    return page


class Elements(HTMLParser):
    """Every element's tag, attributes and the text right inside it."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: list[tuple[str, dict[str, str]]] = []
        self.text = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, Optional[str]]]) -> None:
        self.found.append((tag, {k: v or "" for k, v in attrs}))

    def handle_data(self, data: str) -> None:
        self.text += data


def test_a_peer_task_has_its_own_lane_and_the_command_that_fetches_its_branch(
    fleeter: Any, fake_claude: Any, peer_lab: Any
) -> None:
    fleeter.make_repo()
    mini = peer_lab.machine("mini")
    mini.write("config.toml", (fleeter.home / "config.toml").read_text())
    r = fleeter.run("relay", "add", "mini", mini.address, "--accept-new", "--command", shlex.join(mini.command()))
    assert r.ret == 0, r.stdout + r.stderr
    assert fleeter.run("drain").ret == 0  # this machine takes nothing: the task goes to mini
    fleeter.write_tasks("""
        [[task]]
        name = "t1"
        cwd = "repo"
        prompt = "Write out.txt."
        git_ref = "main"

          [[task.verify]]
          run = "test -f out.txt"
    """)
    fake_claude.script(t1=[{"actions": [["write", "out.txt", "x"], ["commit", "x"]]}])
    r = fleeter.run("tasks.toml", "--html", "report.html")
    assert r.ret == 0, r.stdout + r.stderr
    t = fleeter.task("t1")
    assert t.state.value == "DONE" and t.host == "mini"

    page = Elements()
    page.feed((fleeter.path / "report.html").read_text(encoding="utf-8"))
    lanes = [a["data-host"] for tag, a in page.found if tag == "g" and "lane" in a.get("class", "").split()]
    assert lanes == ["mini"]
    bars = [a for tag, a in page.found if tag == "a" and "attempt" in a.get("class", "").split()]
    assert [(b["data-task"], b["data-host"], b["data-outcome"]) for b in bars] == [("t1", "mini", "done")]
    (row,) = [a for tag, a in page.found if tag == "tr" and "data-state" in a]
    assert row["data-task"] == "t1" and row["data-state"] == "DONE"
    assert t.branch and t.branch in page.text
    assert f"git fetch ssh://{mini.address}" in page.text and f" {t.branch}" in page.text


def test_a_mailbox_task_has_the_mailbox_lane_and_its_handoff_is_text(fleeter: Any) -> None:
    proj = role_dir(fleeter)
    assert fleeter.runsub("role", "bind", "relay", str(proj)).ret == 0
    fleeter.write_tasks(ROLE_TASK)
    run = fleeter.popen("tasks.toml", "--html", "report.html")
    msg = wait_for(lambda: message(fleeter, "reconnect"), why="the delivery")
    summary = "reconnects <img src=x onerror=alert(1)> with backoff"
    done = report_from(proj, "mailbox", "done", msg.task_id, "--summary", summary)
    assert done.returncode == 0, done.stderr
    code, out = finish(run)
    assert code == 0, out
    assert fleeter.task("reconnect").state.value == "DONE"

    page = read_page(fleeter.path / "report.html")
    lanes = [a["data-host"] for tag, a in page.found if tag == "g" and "lane" in a.get("class", "").split()]
    assert lanes == ["mailbox"]
    bars = [a for tag, a in page.found if tag == "a" and "attempt" in a.get("class", "").split()]
    assert [(b["data-task"], b["data-host"], b["data-outcome"]) for b in bars] == [("reconnect", "mailbox", "done")]
    assert summary in page.text  # the handoff it gave, as text
    assert not [tag for tag, _ in page.found if tag == "img"]

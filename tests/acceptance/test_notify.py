"""End to end: the ``notify`` plugin posts to a real HTTP server on 127.0.0.1 through
apprise's ``json://`` URLs, from real runs of the CLI: a cascade of NEEDS_HUMAN becomes
one message, the run's end is summed up, a usage-limit pause is sent while the run
waits, and an endpoint that is down or answers 500 never changes how the run ends.
Long waits use the fake clock (``FLEETRUN_TEST_CLOCK``)."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.acceptance import test_waits
from tests.acceptance.test_placement_e2e import until

from .test_local_loop import one_task

live, clock, wait_exit = test_waits.live, test_waits.clock, test_waits.wait_exit  # fixtures, a helper

pytest.importorskip("apprise")


class Webhook:
    """A real HTTP server on 127.0.0.1 (a random port) that records each JSON body
    posted to it and answers ``status``."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.posts: list[dict[str, Any]] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                hook.posts.append({"path": self.path, "body": json.loads(body)})
                self.send_response(hook.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str = "hook") -> str:
        return f"json://127.0.0.1:{self.port}/{path}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def webhook() -> Any:
    made: list[Webhook] = []

    def make(status: int = 200) -> Webhook:
        made.append(Webhook(status))
        return made[-1]

    yield make
    for w in made:
        w.close()


def closed_port() -> int:
    """A port on 127.0.0.1 nothing listens on (bound, then let go)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def add_config(fleeter: Any, text: str) -> None:
    path = fleeter.home / "config.toml"
    path.write_text(path.read_text() + text)


def test_five_needs_human_make_one_message_then_the_run_end(fleeter, fake_claude, webhook):
    fleeter.make_repo()
    fleeter.write_tasks(
        "".join(
            f"""
        [[task]]
        name = "t{i}"
        cwd = "repo"
        prompt = "Do {i}."
        git_ref = "main"
        max_retries = 0
          [[task.verify]]
          run = "false"
    """
            for i in range(1, 6)
        )
    )
    ok, dead = webhook(), closed_port()
    # a long window: the five are held, and flushed as one message when the run ends
    add_config(fleeter, f'[notify]\nurls = ["{ok.url()}", "json://127.0.0.1:{dead}/down"]\nmin_interval = 3600\n')
    r = fleeter.runsub("tasks.toml", timeout=120)
    assert r.ret == 1, r.stdout + r.stderr  # the dead endpoint changes nothing
    assert fleeter.states() == {f"t{i}": "NEEDS_HUMAN" for i in range(1, 6)}
    assert [p["path"] for p in ok.posts] == ["/hook", "/hook"], ok.posts
    batch, end = (p["body"] for p in ok.posts)
    assert batch["title"].endswith(": 5 tasks need a human") and batch["type"] == "warning"
    for i in range(1, 6):
        task = fleeter.task(f"t{i}")
        assert f"- t{i} ({task.id}) needs a human after attempt 1: retries_exhausted:false\n" in batch["message"]
        assert f"  look: fleetrun logs {task.id}\n" in batch["message"]
    assert batch["message"].rstrip().endswith("Every task: fleetrun status")
    assert end["title"].endswith(": run ended: 5 needs_human") and end["type"] == "warning"
    assert "Exit status: 1 (some tasks need a human or were cancelled)" in end["message"]
    assert "Duration: " in end["message"] and "Tasks file: tasks.toml" in end["message"]
    # the closed port: one warning line, however many messages failed, and a note at the end
    warnings = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.startswith("warning: notify:")]
    assert len(warnings) == 1, r.stdout + r.stderr
    assert f"json://127.0.0.1:{dead}/down" in warnings[0]
    r.fnmatch_lines([f"notify: 2 of 2 notifications were not sent to json://127.0.0.1:{dead}/down*"])
    assert "Traceback" not in r.stdout + r.stderr


def test_a_usage_limit_pause_is_sent_while_the_run_waits(fleeter, fake_claude, webhook, live, clock):
    one_task(fleeter)
    reset_at = int(time.time()) + 3600
    fake_claude.script(
        t1=[
            {"mode": "usage_limit", "reset_at": reset_at, "limit_style": "legacy"},
            {"actions": [["write", "out.txt", "x"]]},
        ]
    )
    failing = webhook(status=500)  # what it is sent is recorded, and refused
    add_config(fleeter, f'[notify]\nurls = ["{failing.url("ops")}"]\nevents = ["paused"]\nmin_interval = 0\n')
    run = live("tasks.toml", env=clock.env)
    hhmm = time.strftime("%H:%M", time.localtime(reset_at))
    run.wait_for(f"waiting: * (t1): this machine is paused: usage limit, resumes at {hhmm}")
    # fleetrun_host_paused, sent from the loop's own wait while the machine is paused (not at the end)
    until(lambda: failing.posts, 20, f"no notification of the pause; {run.dump()}")
    assert run.proc.poll() is None
    body = failing.posts[0]["body"]
    assert body["title"].endswith(f": local paused until {hhmm}"), body
    assert (
        f"- local is paused until {hhmm}" in body["message"]
        and f"usage_limit:usage limit, resumes at {hhmm}" in body["message"]
    ), body
    run.wait_for("warning: notify: could not send to json://127.0.0.1:*/ops: *500*")

    clock.set(reset_at - time.time() + 5)  # the reset time has come
    assert wait_exit(run) == 0, run.dump()  # the 500s change nothing
    assert fleeter.states() == {"t1": "DONE"}
    assert len(failing.posts) == 1, failing.posts  # events = ["paused"]: no run-end message
    assert len(run.matching("warning: notify:*")) == 1, run.dump()
    assert "Traceback" not in run.dump()

"""The ``notify`` plugin's pure parts (the batch window, the messages' text) tested
directly, and its configuration through the real CLI: mistakes are ``ERROR:
file:line`` with exit 4 before anything starts, and ``status`` never imports apprise.
The sending itself is driven end to end in tests/acceptance/test_notify.py."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleetrun.plugins.notify.messages import (
    Batch,
    NeedsHuman,
    Paused,
    batch_message,
    run_end_message,
)


def nh(i: int, cause: str = "retries_exhausted:pytest: 1 failed") -> NeedsHuman:
    return NeedsHuman(task_id=f"task_{i}", name=f"t{i}", cause=cause, attempt=2)


# -- the window ----------------------------------------------------------------------------


def test_a_cascade_within_the_window_is_one_batch_sent_at_its_end() -> None:
    b = Batch(min_interval=60)
    assert b.wait(0) is None and b.take(0) == []
    for i in range(50):
        b.add(nh(i), now=100 + i / 10)  # 50 within five seconds
    assert b.wait(130) == 30
    assert b.take(159.9) == []
    items = b.take(160)
    assert [i.name for i in items] == [f"t{i}" for i in range(50)]
    assert b.take(1000) == [] and b.wait(1000) is None
    b.add(nh(99), now=161)  # the next window starts with the next event
    assert b.take(220) == [] and len(b.take(221)) == 1


def test_the_end_of_the_run_takes_what_is_held_and_a_host_is_listed_once() -> None:
    b = Batch(min_interval=3600)
    b.add(Paused("local", 1000.0, "usage_limit:a"), now=0)
    b.add(nh(1), now=1)
    b.add(Paused("local", 2000.0, "usage_limit:b"), now=2)  # paused again: the latest
    assert b.take(3) == []
    assert b.take(3, force=True) == [nh(1), Paused("local", 2000.0, "usage_limit:b")]


def test_min_interval_zero_sends_at_the_next_turn() -> None:
    b = Batch(min_interval=0)
    b.add(nh(1), now=5)
    assert b.wait(5) == 0 and len(b.take(5)) == 1


# -- the messages --------------------------------------------------------------------------


def test_a_needs_human_message_names_each_task_its_cause_and_where_to_look() -> None:
    m = batch_message([nh(1), nh(2, cause="verify_fail:\x1b[31mred\x07")], machine="box", home_opt="")
    assert m.title == "fleetrun on box: 2 tasks need a human" and m.kind == "warning"
    assert m.body.splitlines() == [
        "- t1 (task_1) needs a human after attempt 2: retries_exhausted:pytest: 1 failed",
        "  look: fleetrun logs task_1",
        "- t2 (task_2) needs a human after attempt 2: verify_fail:\\x1b[31mred\\x07",  # shown, not sent
        "  look: fleetrun logs task_2",
        "Every task: fleetrun status",
    ]
    one = batch_message([nh(1)], machine="box", home_opt=" --home /srv/fleet")
    assert one.title == "fleetrun on box: t1 needs a human"
    assert "  look: fleetrun logs task_1 --home /srv/fleet" in one.body.splitlines()


def test_a_long_cascade_lists_the_first_and_counts_the_rest() -> None:
    m = batch_message([nh(i) for i in range(50)], machine="box", home_opt="")
    lines = m.body.splitlines()
    assert m.title.endswith(": 50 tasks need a human")
    assert sum(ln.startswith("- t") for ln in lines) == 20 and "- and 30 more" in lines


def test_a_pause_message_says_the_host_and_until_when() -> None:
    m = batch_message(
        [Paused("mini", 1_800_000_000.0, "usage_limit:usage limit, resumes at 09:00")], machine="box", home_opt=""
    )
    assert m.title.startswith("fleetrun on box: mini paused until ") and m.kind == "warning"
    assert m.body.splitlines()[0].startswith("- mini is paused until ")
    assert "nothing starts there before then: usage_limit:usage limit, resumes at 09:00" in m.body
    both = batch_message(
        [nh(1), Paused("mini", 1_800_000_000.0, "x"), Paused("local", 1_800_000_000.0, "x")], machine="box", home_opt=""
    )
    assert both.title == "fleetrun on box: t1 needs a human, 2 hosts paused"


def test_the_run_end_message_sums_it_up() -> None:
    m = run_end_message(
        {"DONE": 3, "NEEDS_HUMAN": 2, "CANCELLED": 0},
        exitstatus=1,
        duration_s=192,
        cost_usd=0.684,
        cost_unknown=False,
        files=["plans/tasks.toml"],
        machine="box",
        home_opt="",
    )
    assert m.title == "fleetrun on box: run ended: 3 done, 2 needs_human" and m.kind == "warning"
    assert m.body.splitlines() == [
        "Exit status: 1 (some tasks need a human or were cancelled)",
        "Duration: 3m12s",
        "Cost: $0.68",
        "Tasks file: plans/tasks.toml",
        "Every task: fleetrun status",
    ]
    ok = run_end_message({"DONE": 1}, 0, 5, 0.0, True, [], "box", "")
    assert ok.kind == "success" and "Cost: $0.00+ (a session did not report its cost)" in ok.body
    assert run_end_message({}, 3, 1, 0.0, False, [], "box", "").kind == "failure"


# -- the configuration, through the CLI ----------------------------------------------------


def test_config_mistakes_are_errors_with_their_line_before_anything_starts(fleeter, fake_claude):
    pytest.importorskip("apprise")
    fleeter.make_repo()
    fleeter.write_tasks('[[task]]\nname = "t1"\ncwd = "repo"\nprompt = "x"\n')
    cfg = fleeter.home / "config.toml"
    cfg.write_text(
        cfg.read_text() + '[notify]\nurls = ["json://127.0.0.1:9/ok", "nosuch://tok3n@x"]\n'
        'events = ["needs_human", "done"]\nmin_interval = -1\n'
    )
    r = fleeter.run("tasks.toml")
    assert r.ret == 4, r.stdout + r.stderr
    r.fnmatch_lines(
        [
            f"ERROR: {cfg}:4: notify.urls: item 2 (nosuch://...) is not a URL apprise can send to*",
            f"ERROR: {cfg}:5: notify.events: 'done' is not one of needs_human, run_end, paused",
            f"ERROR: {cfg}:6: notify.min_interval: must be 0 or more (seconds)",
        ]
    )
    assert "tok3n" not in r.stdout + r.stderr  # a URL's secret is not echoed
    assert fake_claude.calls() == [] and fleeter.states() == {}
    assert fleeter.run("validate", "tasks.toml").ret == 4
    # the URLs are this machine's (they carry tokens): a project file may not set them
    cfg.write_text(cfg.read_text().split("[notify]")[0])
    fleeter.write("fleetrun.toml", '[notify]\nurls = ["json://127.0.0.1:9/ok"]\n')
    r = fleeter.run("validate", "tasks.toml")
    assert r.ret == 4
    r.fnmatch_lines(["ERROR: *fleetrun.toml:2: notify.urls: is a setting of this machine*"])


def test_notify_configured_without_apprise_says_what_to_install(fleeter, fake_claude, monkeypatch):
    fleeter.make_repo()
    fleeter.write_tasks('[[task]]\nname = "t1"\ncwd = "repo"\nprompt = "x"\n')
    cfg = fleeter.home / "config.toml"
    cfg.write_text(cfg.read_text() + '[notify]\nurls = ["json://127.0.0.1:9/x"]\n')
    monkeypatch.setitem(sys.modules, "apprise", None)  # `import apprise` fails, as when not installed
    r = fleeter.run("tasks.toml")
    assert r.ret == 4, r.stdout + r.stderr
    r.fnmatch_lines(
        [f"ERROR: {cfg}:4: notify.urls: needs apprise, which is not installed: pip install 'fleetrun[[]notify[]]'"]
    )
    assert fake_claude.calls() == []
    assert fleeter.run("status").ret == 0  # the operator's verbs do not need it


PROBE = """
import json, sys
from fleetrun.cli import main
code = main(sys.argv[1:])
sys.stderr.write("\\nPROBE " + json.dumps({"code": code, "apprise": "apprise" in sys.modules}) + "\\n")
"""


def test_status_and_help_do_not_import_apprise_when_notify_is_configured(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text('[notify]\nurls = ["json://127.0.0.1:9/x"]\n')
    (tmp_path / "tasks.toml").write_text('[[task]]\nname = "t1"\nprompt = "x"\n')
    env = dict(os.environ, FLEETRUN_HOME=str(home), FLEETRUN_DISABLE_PLUGIN_AUTOLOAD="1")

    def probe(*args: str) -> dict[str, object]:
        proc = subprocess.run(
            [sys.executable, "-c", PROBE, *args],
            env=env,
            cwd=str(tmp_path),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
        )
        lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("PROBE ")]
        assert lines, (args, proc.stdout, proc.stderr)
        return dict(json.loads(lines[-1][len("PROBE ") :]))

    assert probe("status") == {"code": 0, "apprise": False}
    assert probe("--help") == {"code": 0, "apprise": False}
    if importlib.util.find_spec("apprise") is not None:  # the probe sees it where it is used
        assert probe("validate", "tasks.toml")["apprise"] is True


def test_an_endpoint_that_never_answers_is_given_up_at_the_end() -> None:
    """The sender's bound, with a real socket that accepts and never answers: the loop's
    ``send`` returns at once, and ``close`` gives up after its timeout, counting the
    message as not sent (the thread is a daemon; apprise's own read timeout ends it)."""
    pytest.importorskip("apprise")
    import socket

    from fleetrun.plugins.notify.messages import Message
    from fleetrun.plugins.notify.sender import make_sender

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        sender = make_sender([f"json://127.0.0.1:{port}/hang?rto=1"])
        sender.send(Message("t", "b", "info"))
        assert sender.pending == 1
        assert sender.close(timeout=0.3) == [] and sender.pending == 1
        assert sender.thread is not None and sender.thread.daemon
        sender.thread.join(120)  # apprise's read timeout (1 s here) ends the post; 120 s bounds a hang
        assert [o.failures[0][0] for o in sender.done()] == [f"json://127.0.0.1:{port}/hang"]

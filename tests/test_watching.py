"""``fleetrun status --watch`` and ``fleetrun logs -f TASK`` (issue 14, "Watching a
run"): a loop running in another process, watched through the ledger and the logs."""

from __future__ import annotations

import io
import time
from types import SimpleNamespace

import pytest
from test_liveview import COLS, LINES, screen_of


def queue_two(fleeter, fake_claude, verify: str = "sleep 1; test -f api.py", files=None) -> None:
    fleeter.make_repo(files=files)
    fleeter.write_tasks(f'''
        [[task]]
        name = "api"
        cwd = "repo"
        prompt = "p"
        git_ref = "main"
          [[task.verify]]
          run = "{verify}"

        [[task]]
        name = "docs"
        cwd = "repo"
        prompt = "p"
        git_ref = "main"
    ''')
    fake_claude.script(
        api=[
            {
                "actions": [["write", "api.py", "x"], ["sleep", 3], ["commit", "api"]],
                "cost": 0.25,
                "result": "Wrote api.py",
            }
        ],
        docs=[{"actions": [["write", "docs.md", "x"], ["sleep", 3]], "cost": 0.1}],
    )
    r = fleeter.runsub("queue", "tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr


def test_status_watch_shows_a_loop_running_elsewhere_and_ends_on_ctrl_c(fleeter, fake_claude, monkeypatch):
    import pexpect

    # the verifier runs until the watch has shown it (a one-second verifier could fall
    # between two of its one-second refreshes on a loaded machine)
    gate = fleeter.path / "verifier-may-end"
    queue_two(
        fleeter,
        fake_claude,
        verify="sh gate.sh; test -f api.py",
        files={"gate.sh": f"while [ ! -e '{gate}' ]; do sleep 0.1; done\n"},
    )
    monkeypatch.delenv("COLUMNS", raising=False)
    watch = fleeter.spawn("status", "--watch", dimensions=(LINES, COLS), env={"TERM": "xterm"})
    work = fleeter.popen("work", "--until-idle")
    raw = b""
    seen: list[str] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            raw += watch.read_nonblocking(65536, timeout=0.3)
        except pexpect.TIMEOUT:
            pass
        seen.append("\n".join(screen_of(raw)))
        if "verify 1/1 run sh gate.sh; test -f api.py" in seen[-1]:
            gate.touch()
        if "[2/2 done" in seen[-1]:
            break
    gate.touch()  # never leave the loop waiting on it
    work.communicate(timeout=60)
    assert any("api" in s and "RUNNING" in s and "Write api.py" in s for s in seen), seen[-1]
    assert any("docs" in s and "Write docs.md" in s for s in seen)
    assert any("verify 1/1 run sh gate.sh; test -f api.py" in s for s in seen)
    assert "[2/2 done, 0 running, 0 waiting]" in seen[-1]
    assert "api DONE (attempt 1)  verify_pass" in seen[-1]  # transitions above the region
    watch.sendintr()
    watch.expect(pexpect.EOF)
    raw += watch.before
    watch.close()
    assert watch.exitstatus == 0
    final = "\n".join(screen_of(raw))
    assert "[2/2 done" not in final and "api DONE (attempt 1)" in final  # the region is gone


def test_status_watch_without_a_terminal_prints_lines(fleeter, fake_claude):
    from fleetrun.ledger import Ledger
    from fleetrun.watching import watch_status

    queue_two(fleeter, fake_claude)
    led = Ledger(fleeter.home / "state.db")
    out = io.StringIO()
    calls = []

    def sleep(s: float) -> None:
        calls.append(s)
        if len(calls) == 1:  # meanwhile a loop works the queue
            assert fleeter.runsub("work", "--until-idle").ret == 0
        else:
            raise KeyboardInterrupt

    config = SimpleNamespace(option=SimpleNamespace(color="auto"))
    assert watch_status(config, led, out, sleep=sleep) == 0  # type: ignore[arg-type]
    led.close()
    text = out.getvalue()
    assert text.splitlines()[0] == "[0/2 done, 0 running, 2 waiting]"
    assert "api RUNNING (attempt 1) on local  started" in text
    assert text.splitlines()[-1] == "[2/2 done, 0 running, 0 waiting]"
    assert "\x1b" not in text


def test_logs_follow_renders_the_transcript_for_people_until_the_task_ends(fleeter, fake_claude):
    queue_two(fleeter, fake_claude)
    work = fleeter.popen("work", "--until-idle")
    try:
        r = fleeter.runsub("logs", "-f", "api", timeout=60)
    finally:
        work.communicate(timeout=60)
    assert r.ret == 0, r.stderr
    r.fnmatch_lines(
        [
            "*api READY*",
            "--- attempt 1 (fresh) on local: */log",
            "*→ Write api.py",
            "*← result*",
            "result: success, $0.25*",
            "  Wrote api.py",
            "*api VERIFYING (attempt 1)*",
            "PASS verifier 1 (run: sleep 1; test -f api.py) attempt 1*",
            "*api DONE (attempt 1)  verify_pass",
            "api is DONE, $0.25",
        ]
    )
    assert '{"type"' not in r.stdout
    raw = fleeter.runsub("logs", "-f", "--raw", "api")
    assert raw.ret == 0
    assert '"type":"result"' in raw.stdout.replace(" ", "")
    assert "READY" not in raw.stdout


def test_logs_follow_of_an_ended_task_ends_at_once(fleeter, fake_claude):
    queue_two(fleeter, fake_claude)
    assert fleeter.runsub("work", "--until-idle").ret == 0
    r = fleeter.runsub("logs", "-f", "docs", timeout=20)
    assert r.ret == 0
    assert r.stdout.splitlines()[-1] == "docs is DONE, $0.10"


@pytest.mark.parametrize("args", [["logs", "-f", "nope"]])
def test_logs_follow_of_no_task_is_a_usage_error(fleeter, args):
    r = fleeter.runsub(*args)
    assert r.ret == 4

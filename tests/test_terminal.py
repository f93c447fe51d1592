"""The terminal plugin: colour only on a terminal, NO_COLOR honoured, -q and -v."""

from __future__ import annotations

import re

import pytest

TASKS = """
[agents.ok]
command = ["{python}", "-c", "print('done')"]

[[task]]
name = "a"
prompt = "p"
agent = "ok"
  [[task.verify]]
  run = "true"
"""


@pytest.mark.parametrize("no_color", [False, True])
def test_colour_only_on_a_terminal_and_never_with_no_color(fleeter, monkeypatch, no_color):
    import pexpect

    fleeter.write_tasks(TASKS)
    monkeypatch.delenv("NO_COLOR", raising=False)
    if no_color:
        monkeypatch.setenv("NO_COLOR", "1")
    child = fleeter.spawn("tasks.toml")
    child.expect(pexpect.EOF)
    out = child.before
    child.close()
    assert child.exitstatus == 0, out
    assert b"=== 1 done in " in out
    # colour is SGR (ESC [ ... m); the live view's cursor moves are no colour and stay
    assert (re.search(rb"\x1b\[[0-9;]*m", out) is not None) is (not no_color)


def test_plain_when_not_a_terminal(fleeter):
    fleeter.write_tasks(TASKS)
    r = fleeter.runsub("tasks.toml")
    assert r.ret == 0
    assert "\x1b[" not in r.stdout


def test_quiet_and_verbose(fleeter):
    fleeter.write_tasks(TASKS)
    q = fleeter.run("tasks.toml", "-q")
    assert q.ret == 0
    assert not any(line.startswith("fleetrun ") for line in q.outlines)
    q.fnmatch_lines(["*a DONE*", "=== 1 done in * ==="])
    q.no_fnmatch_line("*a RUNNING*")
    v = fleeter.run("tasks.toml", "-v", "--new-queue")
    v.fnmatch_lines(["*a READY*queued", "*a RUNNING*", "*verify run `true`: PASS*"])


# -- hostile text (issue 10) ----------------------------------------------------------------

ESCAPES = "\x1b[2J\x1b]0;owned\x07\x9b6n\u202e"

HOSTILE = """
[[task]]
name = "rtl\\u202eevil"
prompt = "p"
max_retries = 0
  [[task.verify]]
  run = "cat out.txt; exit 1 # \\u001b[2J\\u001b]0;owned\\u0007"
"""


def _leaks(text: str) -> list[str]:
    """Control characters in ``text`` other than newline: with no colour (not a tty),
    any of them came from a name, a command, a reason or an agent."""
    return sorted(
        {
            repr(c)
            for c in text
            if (ord(c) < 32 and c != "\n")
            or 0x7F <= ord(c) <= 0x9F
            or 0x202A <= ord(c) <= 0x202E
            or 0x2066 <= ord(c) <= 0x2069
        }
    )


def test_no_raw_control_characters_reach_the_terminal(fleeter, fake_claude):
    """A name with a bidi override, a verifier command with escapes, an agent that
    writes escapes into the file the verifier prints and into its result text: the run
    (-v, so verifier output is shown), `status` and `logs` print them all escaped."""
    fleeter.write_tasks(HOSTILE)
    fake_claude.script(
        **{
            "rtl\u202eevil": [
                {"actions": [["write", "out.txt", f"agent says {ESCAPES}\n"]], "result": f"finished {ESCAPES}"}
            ]
        }
    )
    r = fleeter.run("tasks.toml", "-v")
    assert r.ret == 1, r.stdout + r.stderr
    assert _leaks(r.stdout) == [] and _leaks(r.stderr) == [], r.stdout
    r.fnmatch_lines(
        [
            "*| agent says \\x1b?2J\\x1b]0;owned\\x07\\x9b6n\\u202e",
            "*rtl\\u202eevil NEEDS_HUMAN*retries_exhausted:cat out.txt; exit 1 # \\x1b?2J\\x1b]0;owned\\x07: "
            "agent says *",
        ]
    )
    status = fleeter.run("status")
    assert status.ret == 0 and _leaks(status.stdout) == [], status.stdout
    status.fnmatch_lines(["rtl\\u202eevil *NEEDS_HUMAN*retries_exhausted:cat out.txt; exit 1 # \\x1b?2J*"])
    graph = fleeter.run("status", "--graph")
    assert _leaks(graph.stdout) == [], graph.stdout
    # the summary's command to look names the task by its id: the name cannot be typed as shown
    task_id = fleeter.task("rtl\u202eevil").id
    r.fnmatch_lines(["NEEDS_HUMAN rtl\\u202eevil: retries_exhausted:*", f"    look: fleetrun logs {task_id}"])
    logs = fleeter.run("logs", "rtl\u202eevil")
    assert logs.ret == 0 and _leaks(logs.stdout) == [], logs.stdout
    logs.fnmatch_lines(
        [
            "rtl\\u202eevil task_* ?NEEDS_HUMAN?*",
            "*FAIL verifier 1 (run: cat out.txt*\\x1b?2J*",
            "*| agent says \\x1b?2J*",
        ]
    )


def test_relay_peers_shows_a_peers_reply_escaped(fleeter):
    """A peer's probe reply (cached in peers-state.json) with escapes in its tool
    versions and its last error: `relay peers --cached` prints them escaped."""
    import json
    import time

    fleeter.home.mkdir(parents=True, exist_ok=True)
    (fleeter.home / "peers.toml").write_text('[peers.mini]\naddress = "me@127.0.0.1"\n')
    now = time.time()
    probe = {
        "fleetrun": "0.1.0\x1b]0;owned\x07",
        "tools": {"git": "2.43\x1b[2J", "claude": "2.1\x9b6n"},
        "os": "linux",
        "arch": "x86_64",
        "free_mem_mb": 1000,
        "load_per_core": 0.1,
        "free_disk_mb": 9000,
        "running": 0,
        "features": ["stop\x1b[5m"],
    }
    (fleeter.home / "peers-state.json").write_text(
        json.dumps({"mini": {"last_heard": now - 5, "probe": probe, "error": "refused \x1b[2J", "error_at": now}})
    )
    r = fleeter.run("relay", "peers", "--cached")
    assert "Traceback" not in r.stderr, r.stderr
    assert _leaks(r.stdout) == [] and _leaks(r.stderr) == [], r.stdout
    r.fnmatch_lines(["*fleetrun 0.1.0\\x1b]0;owned\\x07*git 2.43\\x1b?2J*"])


# -- the end of a run (issue 14) ------------------------------------------------------------

FAILING = """
[agents.ok]
command = ["{python}", "-c", "print('done')"]

[[task]]
name = "a"
prompt = "p"
agent = "ok"
max_retries = 0
  [[task.verify]]
  name = "unit"
  run = "echo first; printf '%0150d\\\\n' 7; echo '== 1 failed in 0.01s =='; exit 1"
"""


def test_on_a_terminal_the_failing_lines_fit_its_width_and_the_summary_is_coloured(fleeter, monkeypatch):
    import re

    import pexpect

    fleeter.write_tasks(FAILING)
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("COLUMNS", raising=False)
    child = fleeter.spawn("tasks.toml", dimensions=(24, 80))
    child.expect(pexpect.EOF)
    out = child.before.decode()
    child.close()
    assert child.exitstatus == 1, out
    # a line printed while the live view is up comes after the view is erased
    # (ESC[1A ESC[J): what the screen shows of it is what follows the last erase
    shown = "\n".join(line.split("\x1b[J")[-1] for line in out.split("\n"))
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", shown).replace("\r", "")
    lines = plain.splitlines()
    tail = [line for line in lines if line.startswith("           | ")]
    assert tail[0] == "           | first", plain
    assert tail[1].startswith("           | 0000") and tail[1].endswith("…") and len(tail[1]) == 80, tail
    assert tail[2] == "           | == 1 failed in 0.01s ==", tail
    assert "=== short task summary info ===" in lines, plain
    assert "\x1b[31mNEEDS_HUMAN a: retries_exhausted:unit: 1 failed in 0.01s" in out, out

"""The live view (issue 14, "Watching a run"): on a terminal, a row per running or
verifying task and a counter below the transition lines, redrawn in place; through a
real pty, the screen checked with a terminal emulator (pyte)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from fleetrun.ledger import Task
from fleetrun.liveview import Region, Row, cells, counter, fit, render
from fleetrun.states import State
from fleetrun.transcript import Activity, LogTail, tool_call

COLS, LINES = 100, 30


def screen_of(raw: bytes, cols: int = COLS, lines: int = LINES) -> list[str]:
    """What a terminal of that size shows after ``raw``: the rows, trailing blanks cut."""
    import pyte

    screen = pyte.Screen(cols, lines)
    stream = pyte.ByteStream(screen)
    stream.feed(raw.replace(b"\n", b"\r\n") if b"\r\n" not in raw else raw)
    return [ln.rstrip() for ln in screen.display]


def two_agents(fleeter, fake_claude) -> None:
    fleeter.make_repo()
    fleeter.write_tasks("""
        [[task]]
        name = "api"
        cwd = "repo"
        prompt = "p"
        git_ref = "main"
          [[task.verify]]
          run = "sleep 2; test -f api.py"

        [[task]]
        name = "docs"
        cwd = "repo"
        prompt = "p"
        git_ref = "main"
    """)
    fake_claude.script(
        api=[{"actions": [["write", "api.py", "x"], ["sleep", 2.5], ["commit", "api"]], "cost": 0.25}],
        docs=[{"actions": [["write", "docs.md", "x"], ["sleep", 2.5]], "cost": 0.1}],
    )


def test_rows_appear_update_and_disappear_on_a_real_terminal(fleeter, fake_claude, monkeypatch):
    import pexpect

    pytest.importorskip("pyte")
    two_agents(fleeter, fake_claude)
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("COLUMNS", raising=False)
    child = fleeter.spawn("tasks.toml", dimensions=(LINES, COLS), env={"TERM": "xterm"})
    raw = b""
    seen: list[list[str]] = []
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            raw += child.read_nonblocking(65536, timeout=0.2)
        except pexpect.TIMEOUT:
            pass
        except pexpect.EOF:
            break
        seen.append(screen_of(raw))
    child.close()
    assert child.exitstatus == 0, raw.decode(errors="replace")
    text = ["\n".join(s) for s in seen]
    # the counter and a row per running task, with where, attempt and what it does
    assert any("[0/2 done" in t and "2 running" in t for t in text), text[-1]
    assert any("api" in t and "RUNNING" in t and "local" in t and "#1" in t and "Write api.py" in t for t in text), (
        "\n---\n".join(text[-5:])
    )
    assert any("docs" in t and "Write docs.md" in t for t in text)
    # the verifier that runs, and for how long
    assert any("VERIFYING" in t and "verify 1/1 run sleep 2; test -f api.py" in t for t in text)
    # rows update: the counter moved on while the view was up
    assert any("[1/2 done" in t for t in text)
    # in the end: the transition lines and the summary, nothing of the region
    final = seen[-1]
    joined = "\n".join(final)
    assert "=== 2 done in " in joined
    assert "running]" not in joined and "RUNNING  local" not in joined
    body = [ln for ln in final if ln]
    assert body[-1].startswith("=== 2 done in "), body
    assert b"\x1b[?25h" in raw  # the cursor is given back


def test_plain_lines_when_not_a_terminal(fleeter, fake_claude):
    two_agents(fleeter, fake_claude)
    r = fleeter.runsub("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    assert "\x1b[" not in r.stdout and "running]" not in r.stdout


@pytest.mark.parametrize(
    ("flag", "env", "colour"),
    [("--color=no", {}, False), ("--color=yes", {"NO_COLOR": "1"}, True), ("--color=auto", {"NO_COLOR": "1"}, False)],
)
def test_color_option_as_pytest(fleeter, flag, env, colour, monkeypatch):
    import pexpect

    monkeypatch.delenv("NO_COLOR", raising=False)
    fleeter.write_tasks("""
        [agents.ok]
        command = ["true"]
        [[task]]
        name = "a"
        prompt = "p"
        agent = "ok"
    """)
    child = fleeter.spawn("tasks.toml", flag, env=env)
    child.expect(pexpect.EOF)
    out = child.before
    child.close()
    assert child.exitstatus == 0, out
    assert (b"\x1b[32m" in out) is colour  # DONE in green


def test_color_yes_colours_a_pipe(fleeter):
    fleeter.write_tasks("""
        [agents.ok]
        command = ["true"]
        [[task]]
        name = "a"
        prompt = "p"
        agent = "ok"
    """)
    r = fleeter.runsub("tasks.toml", "--color=yes")
    assert r.ret == 0
    assert "\x1b[32m" in r.stdout and "running]" not in r.stdout  # colour, but no live region


# -- the pieces ------------------------------------------------------------------------------


def _task(state: State, n: int = 0) -> Task:
    from fleetrun.taskspec import TaskSpec

    return Task(
        id=f"t{n}",
        name=f"t{n}",
        state=state,
        spec=TaskSpec(name="t", prompt="p", cwd="/"),
        source="",
        queue_id="q",
        created=0,
        updated=0,
    )


def test_counter() -> None:
    states = (
        [State.DONE] * 3
        + [State.NEEDS_HUMAN]
        + [State.RUNNING, State.VERIFYING]
        + [State.PENDING] * 2
        + [State.READY, State.RETRYING]
    )
    assert counter([_task(s, i) for i, s in enumerate(states)]) == "[3/10 done, 1 needs_human, 2 running, 4 waiting]"


def test_rows_fit_the_width_and_what_it_does_is_cut_first() -> None:
    rows = [
        Row("a-long-task-name", "RUNNING", "local", "1", "12s", "$0.10", "Bash " + "x" * 200),
        Row("界界界", "VERIFYING", "mini", "2", "3m", "-", "verify 1/2 run pytest (5s)"),
    ]
    lines = render(rows, "[0/2 done, 2 running, 0 waiting]", 60, color=False)
    assert all(cells(ln) <= 59 for ln in lines), lines
    assert lines[1].endswith("…") and "a-long-task-name  RUNNING" in lines[1]
    assert fit("界界界", 4) == "界…"
    coloured = render(rows, "x", 60, color=True)
    assert coloured[1].startswith("\x1b[36m") and coloured[1].endswith("\x1b[0m")


def test_region_redraws_in_place_and_leaves_nothing(tmp_path: Path) -> None:
    import io

    out = io.StringIO()
    region = Region(out)
    region.show(["[0/1 done]", "  a RUNNING"])
    region.show(["[0/1 done]", "  a RUNNING"])  # nothing changed: nothing sent
    sent = out.getvalue()
    region.above("a RUNNING (attempt 1)\n")
    region.show(["[0/1 done]", "  a VERIFYING"])
    region.stage(["[1/1 done]"])  # a transition: its line comes with the rows after it
    assert out.getvalue().endswith("  a VERIFYING")
    region.above("a DONE (attempt 1)\n")
    assert out.getvalue().endswith("a DONE (attempt 1)\n[1/1 done]")
    region.close()
    assert out.getvalue().count("  a RUNNING") == 2  # drawn, then drawn again under the line
    assert screen_of(out.getvalue().encode())[:3] == ["a RUNNING (attempt 1)", "a DONE (attempt 1)", ""]
    assert sent.startswith("\x1b[?25l")


def test_a_log_is_read_as_it_grows_and_strictly(tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.write_bytes(b"")
    tail = LogTail(log)
    assert tail.read() == []
    with open(log, "ab") as f:
        f.write(b'{"a": 1}\r\n{"b"')
    assert tail.read() == ['{"a": 1}\r']
    with open(log, "ab") as f:
        f.write(b": 2}\n" + b"x" * (2 << 20) + b"\nnot json\n")
    # it grew past one read: what it does now matters, so its newest part, from a line start
    assert tail.read() == ["not json"]
    with open(log, "ab") as f:
        f.write(b"y" * (2 << 20))  # a line too long to keep: skipped to its end
    assert tail.read() == []
    with open(log, "ab") as f:
        f.write(b"yyy\n{}\n")
    assert tail.read() == ["{}"]


def test_what_an_agent_does_from_its_stream(tmp_path: Path) -> None:
    assert tool_call("Edit", {"file_path": "/w/src/api.py"}, "/w") == "Edit src/api.py"
    assert tool_call("Bash", {"command": "cargo test\n  --all"}) == "Bash cargo test --all"
    assert tool_call("Bash", {"command": "\x1b[2J"}) == "Bash \\x1b[2J"
    assert tool_call(["x"], None) == "?"
    log = tmp_path / "log"
    log.write_text(
        '{"type":"assistant","message":{"content":[{"type":"text","text":"Let me look."}]}}\n'
        '{"type":"assistant","message":{"content":[{"type":"tool_use","name":"Read","input":{"file_path":"a.py"}}]}}\n'
        '{"type":"user","message":{"content":[{"type":"tool_result","content":"1\\tprint()","is_error":false}]}}\n'
        '{"type":"assistant","message":"not a message"}\n'
        '{"type":"result","subtype":"success","total_cost_usd":0.42,"num_turns":3,"result":"Done."}\n'
    )
    act = Activity(log)
    lines = act.poll()
    assert lines == [
        "  Let me look.",
        "  → Read a.py",
        "    ← result:",
        "      1\tprint()",
        "result: success, $0.42, 3 turns",
        "  Done.",
    ]
    assert act.cost_usd == 0.42


@pytest.mark.parametrize("args", [["--help"], ["status"]], ids=" ".join)
def test_the_live_view_is_off_the_import_path_of_help_and_status(tmp_path: Path, args: list[str]) -> None:
    import os
    import subprocess
    import sys

    env = dict(os.environ, FLEETRUN_HOME=str(tmp_path / "home"), FLEETRUN_DISABLE_PLUGIN_AUTOLOAD="1")
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "fleetrun", *args],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    imported = {ln.rsplit("|", 1)[-1].strip() for ln in proc.stderr.splitlines() if ln.startswith("import time:")}
    assert "fleetrun.cli" in imported
    assert not imported & {"fleetrun.liveview", "fleetrun.transcript", "fleetrun.watching"}


def test_an_attempt_first_seen_before_its_worktree_was_recorded_shows_paths_inside_it_short(tmp_path):
    """The live view met the attempt while its task was ASSIGNED, its worktree being made
    off the loop's thread and not recorded yet: once it is, a file the agent writes in it
    is shown relative to it (the row showed the whole absolute path, cut, before)."""
    import json

    from fleetrun.liveview import Watcher

    folder = tmp_path / "attempt"
    folder.mkdir()
    wt = tmp_path / "wt"
    w = Watcher(led=None)  # type: ignore[arg-type]  # _activity reads no ledger
    assert w._activity("a1", str(folder), "local", None) is not None  # first seen: no worktree yet
    act = w._activity("a1", str(folder), "local", str(wt))
    assert act is not None
    (folder / "log").write_text(
        json.dumps(
            {
                "type": "assistant",
                "message": {
                    "content": [{"type": "tool_use", "name": "Write", "input": {"file_path": str(wt / "docs.md")}}]
                },
            }
        )
        + "\n"
    )
    act.poll()
    assert act.doing == "Write docs.md"

"""Whether a live session can receive its role's mail (receiving.py): fleetrun's Stop
hook in the settings Claude Code read for that session, as the real CLI reads them (the
folder the session started in, the user's settings of its own environment,
``--setting-sources``, ``--settings``), with real processes: the fake ``claude``, and
``sleep`` processes whose environment is the session's."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from test_mailbox_store import session

from fleetrun.plugins.mailbox import store
from fleetrun.plugins.mailbox.liveness import scan, start_time
from fleetrun.plugins.mailbox.receiving import is_stop_hook_of, receptions, session_problem

PREFIX = shlex.join([sys.executable, "-m", "fleetrun"])


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        p.kill()
        p.wait()


def write_hook(folder: Path, command: str, name: str = ".claude/settings.local.json") -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps({"hooks": {"Stop": [{"hooks": [{"type": "command", "command": f"{command} mailbox stop-hook"}]}]}})
    )
    return path


def test_a_stop_hook_is_fleetruns_when_it_runs_fleetrun_for_this_home(tmp_path: Path) -> None:
    home = tmp_path / "h"
    home.mkdir()
    (tmp_path / "link").symlink_to(home)
    env = {"HOME": str(tmp_path / "user")}
    assert is_stop_hook_of(f"/opt/bin/fleetrun --home {home} mailbox stop-hook", home, env)
    assert is_stop_hook_of(f"/opt/bin/fleetrun --home={tmp_path / 'link'} mailbox stop-hook", home, env)
    assert is_stop_hook_of(f"{sys.executable} -m fleetrun --home '{home}' mailbox stop-hook", home, env)
    # no --home: the session's FLEETRUN_HOME, else its ~/.fleetrun
    assert is_stop_hook_of("fleetrun mailbox stop-hook", home, {"FLEETRUN_HOME": str(home)})
    assert not is_stop_hook_of("fleetrun mailbox stop-hook", home, env)
    assert is_stop_hook_of("fleetrun mailbox stop-hook", tmp_path / "user" / ".fleetrun", env)
    assert is_stop_hook_of(f"env FLEETRUN_HOME={home} /opt/bin/fleetrun mailbox stop-hook", home, env)
    assert is_stop_hook_of(f"FLEETRUN_HOME={home} uv run fleetrun mailbox stop-hook", home, env)
    assert not is_stop_hook_of(f"FLEETRUN_HOME={tmp_path} fleetrun mailbox stop-hook", home, env)
    for other in (
        f"/opt/bin/fleetrun --home {tmp_path / 'other'} mailbox stop-hook",  # another home's
        f"/opt/bin/notfleetrun --home {home} mailbox stop-hook",
        f"/opt/bin/fleetrun --home {home} mailbox read",
        f"/opt/bin/fleetrun --home {home} mailbox stop-hook --extra",
        f"/opt/bin/fleetrun --home '{home} mailbox stop-hook",  # an unclosed quote
        "mailbox stop-hook",
        "",
    ):
        assert not is_stop_hook_of(other, home, env), other


def test_a_session_receives_only_with_the_hook_in_the_settings_it_started_with(
    tmp_path: Path, fake_claude: Any, procs: list[subprocess.Popen[bytes]]
) -> None:
    home = Path(os.environ["FLEETRUN_HOME"]) if "FLEETRUN_HOME" in os.environ else tmp_path / "h"
    command = f"{PREFIX} --home {shlex.quote(str(home))}"
    root = tmp_path / "repo"
    nested = root / "src"
    nested.mkdir(parents=True)
    write_hook(root, command)
    conn = store.connect(str(tmp_path / "state.db"))
    try:
        at_root = session(fake_claude, root, procs)
        store.bind(conn, "repo", str(root), at_root.pid, start_time(at_root.pid))
        # a session started in a folder below: Claude Code reads that folder's settings only
        below = session(fake_claude, nested, procs)
        store.bind(conn, "src", str(nested), below.pid, start_time(below.pid))
        got = receptions(scan(), store.roles(conn), home)
        assert got["repo"].receives and got["repo"].sessions == (at_root.pid,)
        assert got["src"].live and not got["src"].receives
        local = nested.resolve() / ".claude" / "settings.local.json"
        assert got["src"].problem == (
            f"fleetrun's Stop hook is not in {local} nor in the other settings it started "
            f"with (run fleetrun role install-hooks {nested.resolve()}, then start the "
            "session again)"
        )
        # written after it started: Claude Code took its hooks at the start
        time.sleep(1.5)  # not a timed assertion: the file must be newer than the session's start
        write_hook(nested, command)
        problem = receptions(scan(), store.roles(conn), home)["src"].problem
        assert problem is not None and f"was written to {local} after the session started" in problem
        # the user's settings (of the session's environment) count, in every folder
        user = write_hook(Path(os.environ["CLAUDE_CONFIG_DIR"]), command, "settings.json")
        os.utime(user, (0, 0))  # written before it started
        assert receptions(scan(), store.roles(conn), home)["src"].receives
        # another home's hook is not this home's
        assert not receptions(scan(), store.roles(conn), tmp_path / "elsewhere")["repo"].receives
    finally:
        conn.close()


def test_a_bound_process_that_is_no_claude_code_session_is_taken_at_its_word(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    p = subprocess.Popen(["sleep", "60"], cwd=str(tmp_path))
    procs.append(p)
    conn = store.connect(str(tmp_path / "state.db"))
    try:
        store.bind(conn, "relay", str(tmp_path), p.pid, start_time(p.pid))
        got = receptions(scan(), store.roles(conn), tmp_path / "h")["relay"]
        assert got.receives and got.why_live == f"pid {p.pid} runs" and got.sessions == ()
    finally:
        conn.close()


@pytest.mark.parametrize("kind", ["fifo", "device", "huge", "not-json", "array", "deep", "bad-shapes", "disabled"])
def test_settings_an_agent_wrote_are_read_strictly(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]], kind: str
) -> None:
    """The session's folder is the agent's: a settings file there that is a FIFO (no
    hang), a device, too large, not JSON, nested too deeply or of the wrong shape holds
    no hook, as Claude Code skips it; nothing raises. ``disableAllHooks`` turns the hook
    off."""
    home = tmp_path / "h"
    folder = tmp_path / "proj"
    (folder / ".claude").mkdir(parents=True)
    path = folder / ".claude" / "settings.local.json"
    hook = {"type": "command", "command": f"fleetrun --home {home} mailbox stop-hook"}
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path.symlink_to("/dev/zero")
    elif kind == "huge":
        path.write_text(json.dumps({"hooks": {"Stop": [{"hooks": [hook]}]}, "pad": "x" * (5 * 1024 * 1024)}))
    elif kind == "not-json":
        path.write_bytes(b"\xff{not json")
    elif kind == "array":
        path.write_text(json.dumps([{"hooks": {"Stop": [{"hooks": [hook]}]}}]))
    elif kind == "deep":
        path.write_text("[" * 100_000 + "]" * 100_000)
    elif kind == "bad-shapes":
        path.write_text(
            json.dumps({"hooks": {"Stop": ["x", {"hooks": "x"}, {"hooks": [1, {"type": "command", "command": 5}]}]}})
        )
    else:
        path.write_text(json.dumps({"hooks": {"Stop": [{"hooks": [hook]}]}, "disableAllHooks": True}))
    # a process with the environment of a session: its user settings are an empty folder's
    p = subprocess.Popen(
        ["sleep", "60"],
        env={"HOME": str(tmp_path), "CLAUDE_CONFIG_DIR": str(tmp_path / "cfg"), "PATH": os.environ["PATH"]},
    )
    procs.append(p)
    problem = session_problem(p.pid, str(folder), time.time() + 3600, home)
    assert problem is not None
    if kind == "disabled":
        assert problem == f"disableAllHooks is set in {path}, so no hook of it runs"
    else:
        assert problem.startswith(f"fleetrun's Stop hook is not in {path}")


def test_setting_sources_and_settings_on_the_sessions_command_line_count(
    tmp_path: Path, fake_claude: Any, procs: list[subprocess.Popen[bytes]]
) -> None:
    home = tmp_path / "h"
    command = f"{PREFIX} --home {shlex.quote(str(home))}"
    folder = tmp_path / "proj"
    write_hook(folder, command)
    fake_claude.script(default=[{"actions": [["sleep", 60]]}])

    def problem_of(*args: str) -> Any:
        p = subprocess.Popen(
            [str(Path(__file__).parent / "fakes" / "claude"), "-p", "wait", *args],
            cwd=str(folder),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
        )
        procs.append(p)
        deadline = time.monotonic() + 120
        while not any(s.pid == p.pid for s in scan().sessions()):  # until it is the fake
            assert time.monotonic() < deadline, "the fake claude session did not show up"
            time.sleep(0.05)
        return session_problem(p.pid, str(folder.resolve()), time.time() + 3600, home)

    assert problem_of() is None
    # its local settings left out: the hook there is not its
    assert problem_of("--setting-sources", "user,project") is not None
    # --settings adds one, as JSON or as a file (relative to where it started)
    inline = json.dumps(
        {"hooks": {"Stop": [{"hooks": [{"type": "command", "command": f"{command} mailbox stop-hook"}]}]}}
    )
    assert problem_of("--setting-sources", "user", "--settings", inline) is None
    (folder / "s.json").write_text(inline)
    assert problem_of("--setting-sources", "user", "--settings", "s.json") is None

"""The mailbox as a user meets it (issue 22): a live session that cannot receive (no
fleetrun Stop hook in the settings Claude Code reads for it) is said so by ``role list``
and ``status``, and the claim timeout holds for it; ``status`` and ``--json`` show a
task's role and its message's state; the run prints a ``waiting:`` line while a session
is home; delivery needs no ``claude`` on the supervisor's PATH.

Real processes throughout: the role's session is the fake ``claude`` started in the
role's folder (it reads ``.claude/settings.local.json`` of the folder it started in, as
the real CLI does, and runs its Stop hook when its turn ends), held in its turn by a gate
file."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from .test_crash_points import kill_leftovers
from .test_mailbox import (
    FAKE,
    PREFIX,
    ROLE_TASK,
    finish,
    install_stop_hook,
    message,
    role_dir,
    wait_for,
)


@pytest.fixture(autouse=True)
def _no_strays(tmp_path: Path):
    yield
    kill_leftovers(tmp_path)


def path_without_claude(fleeter: Any) -> str:
    """A PATH holding git and sh, and no ``claude``."""
    bin_dir = fleeter.path.parent / "bin-no-claude"
    bin_dir.mkdir(exist_ok=True)
    for tool in ("git", "sh"):
        found = next(Path(d) / tool for d in os.environ["PATH"].split(os.pathsep) if (Path(d) / tool).exists())
        (bin_dir / tool).symlink_to(found)
    return str(bin_dir)


def session(folder: Path) -> subprocess.Popen[bytes]:
    """A role's live session: the fake ``claude`` started in ``folder``."""
    return subprocess.Popen(
        [str(FAKE), "-p", "hello", "--permission-mode", "bypassPermissions"],
        cwd=str(folder),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def status_json(fleeter: Any) -> Any:
    r = fleeter.runsub("status", "--json")
    assert r.ret == 0, r.stdout + r.stderr
    return json.loads(r.stdout)


def test_delivery_needs_no_claude_on_the_supervisors_path(fleeter: Any, fake_claude: Any) -> None:
    proj = role_dir(fleeter)
    install_stop_hook(proj)
    assert fleeter.runsub("role", "bind", "relay", str(proj)).ret == 0
    fleeter.write_config("")  # the default executable, `claude`, which PATH does not have
    fleeter.write_tasks(ROLE_TASK)
    run = fleeter.popen("tasks.toml", env={"PATH": path_without_claude(fleeter)})
    wait_for(
        lambda: message(fleeter, "reconnect") or fleeter.states().get("reconnect") == "NEEDS_HUMAN",
        why="the delivery, or the task given up",
    )
    msg = message(fleeter, "reconnect")
    assert msg is not None, (fleeter.task("reconnect").reason, finish(run))
    fake_claude.script(
        default=[
            {"actions": [["print", "idle"]]},
            {"actions": [["bash", f"{PREFIX} mailbox done {msg.task_id} --summary 'no claude needed'"]]},
        ]
    )
    proc = session(proj)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
    code, out = finish(run)
    assert code == 0, out
    task = fleeter.task("reconnect")
    assert task.state.value == "DONE" and task.handoff["summary"] == "no claude needed"
    assert fake_claude.calls("reconnect") == []  # delivered, never spawned


def test_a_live_session_without_fleetruns_stop_hook_cannot_receive_and_the_claim_timeout_holds(
    fleeter: Any, fake_claude: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = fleeter.path / "clock"
    clock.write_text("0")
    monkeypatch.setenv("FLEETRUN_TEST_CLOCK", str(clock))
    proj = role_dir(fleeter)  # no .claude/settings.local.json: the session has no Stop hook of fleetrun's
    go = fleeter.path / "go"
    fake_claude.script(
        default=[{"actions": [["bash", f"until test -f {go}; do sleep 0.1; done"]]}],
        reconnect=[{"actions": [["write", "peer.rs", "spawned"]], "result": "spawned"}],
    )
    live = session(proj)
    try:
        assert fleeter.runsub("role", "bind", "relay", str(proj), "--pid", str(live.pid)).ret == 0
        local = proj.resolve() / ".claude" / "settings.local.json"
        listed = fleeter.runsub("role", "list")
        assert listed.ret == 0
        assert f"live (pid {live.pid} runs), cannot receive: fleetrun's Stop hook is not in {local}" in listed.stdout
        assert f"fleetrun role install-hooks {proj.resolve()}" in listed.stdout
        row = json.loads(fleeter.runsub("role", "list", "--json").stdout)[0]
        assert row["live"] is True and row["receives"] is False
        assert row["cannot_receive"].startswith("fleetrun's Stop hook is not in ")
        fleeter.write_policy("claim_timeout_secs = 60\n")
        fleeter.write_tasks(ROLE_TASK)
        run = fleeter.popen("tasks.toml")
        msg = wait_for(lambda: message(fleeter, "reconnect"), why="the delivery")
        assert msg.state == "pending"
        status = fleeter.runsub("status", "--wide")
        line = next(ln for ln in status.stdout.splitlines() if ln.startswith("reconnect"))
        assert f"session {live.pid} cannot receive: fleetrun's Stop hook is not in {local}" in line
        assert "spawned if nobody claims it in 60s" in line
        clock.write_text("600")  # the claim timeout holds, though the session is live: withdrawn, spawned
        code, out = finish(run)
        assert code == 0, out
        msg = message(fleeter, "reconnect")
        assert msg.state == "withdrawn" and msg.reason.startswith("unclaimed: role relay did not claim it in 60s")
        assert "cannot receive" in msg.reason
        task = fleeter.task("reconnect")
        assert task.state.value == "DONE" and (proj / "peer.rs").read_text() == "spawned"
        assert len(fake_claude.calls("reconnect")) == 1
    finally:
        go.write_text("")
        live.communicate(timeout=60)


def test_status_shows_a_tasks_role_and_message_and_the_run_says_waiting_while_a_session_is_home(
    fleeter: Any, fake_claude: Any
) -> None:
    proj = role_dir(fleeter)
    install_stop_hook(proj)
    go, go2 = fleeter.path / "go", fleeter.path / "go2"
    turn = {"actions": [["bash", f"until test -f {go}; do sleep 0.1; done"]]}
    fake_claude.script(default=[turn])
    live = session(proj)  # in its first turn: live, home, and its Stop hook has not run yet
    try:
        assert fleeter.runsub("role", "bind", "relay", str(proj), "--pid", str(live.pid)).ret == 0
        listed = fleeter.runsub("role", "list")
        assert f"live (pid {live.pid} runs)" in listed.stdout and "cannot receive" not in listed.stdout
        fleeter.write_tasks(ROLE_TASK)
        run = fleeter.popen("tasks.toml")
        msg = wait_for(lambda: message(fleeter, "reconnect"), why="the delivery")
        row = status_json(fleeter)[0]
        assert (row["name"], row["state"], row["role"], row["message"]) == ("reconnect", "RUNNING", "relay", "pending")
        home = f"in role relay's mailbox: session {live.pid} is home and takes it when its turn ends"
        status = fleeter.runsub("status", "--wide")
        assert home in next(ln for ln in status.stdout.splitlines() if ln.startswith("reconnect"))
        # its turn ends: the Stop hook hands it the task, it works on it until go2, then reports
        fake_claude.script(
            default=[
                turn,
                {
                    "actions": [
                        ["bash", f"until test -f {go2}; do sleep 0.1; done"],
                        ["bash", f"{PREFIX} mailbox done {msg.task_id} --summary 'done at home'"],
                    ]
                },
            ]
        )
        go.write_text("")
        wait_for(lambda: message(fleeter, "reconnect").state == "claimed", why="the claim")
        row = status_json(fleeter)[0]
        assert (row["role"], row["message"]) == ("relay", "claimed")
        status = fleeter.runsub("status", "--wide")
        assert f"role relay works on it (session {live.pid})" in status.stdout
        go2.write_text("")
        code, out = finish(run)
        assert code == 0, out
        assert f"waiting: {msg.task_id} (reconnect): {home}" in out
        row = status_json(fleeter)[0]
        assert (row["state"], row["role"], row["message"]) == ("DONE", "relay", None)
    finally:
        go.write_text("")
        go2.write_text("")
        live.communicate(timeout=60)


def test_auto_route_routes_no_task_to_a_live_role_that_cannot_receive(fleeter: Any, fake_claude: Any) -> None:
    """A task nobody declared for the role is spawned at once, rather than left in the
    mailbox of a session that would never take it until the claim timeout."""
    proj = role_dir(fleeter)  # no Stop hook of fleetrun's there
    go = fleeter.path / "go"
    fake_claude.script(
        default=[{"actions": [["bash", f"until test -f {go}; do sleep 0.1; done"]]}],
        tidy=[{"actions": [["write", "tidy.txt", "spawned"]], "result": "tidied"}],
    )
    live = session(proj)
    try:
        assert fleeter.runsub("role", "bind", "relay", str(proj)).ret == 0  # the session answers to it by folder
        wait_for(lambda: status_json_roles(fleeter) == [("relay", True, False)], why="the session seen live")
        owner = fleeter.runsub("role", "owner", "proj/a.py")  # the rule routing applies
        assert (
            owner.ret == 1 and "role relay is live but cannot receive: fleetrun's Stop hook is not in" in owner.stdout
        )
        fleeter.write_policy("auto_route = true\n")
        fleeter.write_tasks("""
            [[task]]
            name = "tidy"
            cwd = "proj"
            prompt = "Tidy up."
        """)
        run = fleeter.popen("tasks.toml")
        wait_for(
            lambda: message(fleeter, "tidy") or fleeter.states().get("tidy") == "DONE",
            why="delivered, or spawned and DONE",
        )
        assert message(fleeter, "tidy") is None
        code, out = finish(run)
        assert code == 0, out
        assert (proj / "tidy.txt").read_text() == "spawned" and len(fake_claude.calls("tidy")) == 1
    finally:
        go.write_text("")
        live.communicate(timeout=60)


def status_json_roles(fleeter: Any) -> list[tuple[str, bool, bool]]:
    """``role list --json``: (role, live, receives) of each."""
    r = fleeter.runsub("role", "list", "--json")
    assert r.ret == 0, r.stderr
    return [(row["role"], row["live"], row["receives"]) for row in json.loads(r.stdout)]

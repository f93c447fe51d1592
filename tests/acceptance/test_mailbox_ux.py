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
    return subprocess.Popen([str(FAKE), "-p", "hello", "--permission-mode", "bypassPermissions"], cwd=str(folder),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def test_delivery_needs_no_claude_on_the_supervisors_path(fleeter: Any, fake_claude: Any) -> None:
    proj = role_dir(fleeter)
    install_stop_hook(proj)
    assert fleeter.runsub("role", "bind", "relay", str(proj)).ret == 0
    fleeter.write_config("")  # the default executable, `claude`, which PATH does not have
    fleeter.write_tasks(ROLE_TASK)
    run = fleeter.popen("tasks.toml", env={"PATH": path_without_claude(fleeter)})
    wait_for(lambda: message(fleeter, "reconnect") or fleeter.states().get("reconnect") == "NEEDS_HUMAN",
             why="the delivery, or the task given up")
    msg = message(fleeter, "reconnect")
    assert msg is not None, (fleeter.task("reconnect").reason, finish(run))
    fake_claude.script(default=[
        {"actions": [["print", "idle"]]},
        {"actions": [["bash", f"{PREFIX} mailbox done {msg.task_id} --summary 'no claude needed'"]]},
    ])
    proc = session(proj)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
    code, out = finish(run)
    assert code == 0, out
    task = fleeter.task("reconnect")
    assert task.state.value == "DONE" and task.handoff["summary"] == "no claude needed"
    assert fake_claude.calls("reconnect") == []  # delivered, never spawned

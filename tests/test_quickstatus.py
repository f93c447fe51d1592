"""``fleetrun status`` answered before any plugin is loaded (:mod:`fleetrun.quickstatus`):
the table of a ledger with no placed task, and ``--graph``, import no plugin machinery
(pluggy, the installed plugins' look-up), print what the usual way prints, byte for
byte, and leave to the usual way what a plugin takes part in: a placed task (an
installed plugin's ``fleetrun_status_reason`` still shows), ``--json``, ``addopts``."""

from __future__ import annotations

import io
import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from test_viewing import NOW, build_ledger

#: What the plugins' part of ``status`` imports: the manager (pluggy), the installed
#: plugins' look-up (``importlib.metadata``, and its ``email`` and ``zipfile``), the
#: hook specs, the run's Config.
PLUGIN_MACHINERY = {
    "pluggy",
    "importlib.metadata",
    "email",
    "zipfile",
    "fleetrun.pluginmanager",
    "fleetrun.hookspec",
    "fleetrun.hookimpl",
    "fleetrun.config",
    "fleetrun.plugins",
}
#: What the table does without: the ledger's row types (and their dataclasses'
#: ``inspect``); it reads tuples. ``--graph`` walks Task objects.
ROW_TYPES = {"fleetrun.ledger", "fleetrun.records", "inspect"}

PROBE = """
import json, sys
from fleetrun.cli import main
code = main(sys.argv[1:])
sys.stdout.flush()
sys.stderr.write("\\nPROBE " + json.dumps({"code": code, "modules": sorted(sys.modules)}) + "\\n")
"""


def probe(args: list[str], home: Path, cwd: Path, **env: str) -> tuple[dict[str, Any], str]:
    """``fleetrun ARGS`` in a fresh interpreter, plugin autoload on (the installed
    plugins: CI installs plugins/fleetrun-*): its exit code, modules and output."""
    environ = dict(os.environ, FLEETRUN_HOME=str(home), **env)
    for name in ("FLEETRUN_PLUGINS", "FLEETRUN_DISABLE_PLUGIN_AUTOLOAD", "FLEETRUN_ADDOPTS", "COLUMNS"):
        if name not in env:
            environ.pop(name, None)
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        env=environ,
        cwd=str(cwd),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("PROBE ")]
    assert lines, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return json.loads(lines[-1][len("PROBE ") :]), proc.stdout


def queued_home(home: Path, placed: bool = False) -> list[Any]:
    """Tasks that wait (READY, PENDING), one that ended, and with ``placed`` one
    RUNNING here. :return: the tasks."""
    from fleetrun.ledger import Ledger
    from fleetrun.states import State
    from fleetrun.taskspec import TaskSpec

    with Ledger(home / "state.db") as led:
        tasks = led.add_tasks(
            [
                TaskSpec(name="ready", prompt="p", cwd="/repo"),
                TaskSpec(name="pending", prompt="p", cwd="/repo", depends_on=["ready"]),
                TaskSpec(name="gone", prompt="p", cwd="/repo"),
            ]
        )
        led.transition(tasks[2].id, State.READY, State.CANCELLED, "operator_cancel")
        if placed:
            led.lease(tasks[0].id, State.READY, "local", "fresh")
            led.transition(tasks[0].id, State.ASSIGNED, State.RUNNING, "started", 1, "local")
    return tasks


def test_status_of_tasks_that_wait_imports_no_plugin_machinery(tmp_path: Path) -> None:
    """With nothing placed no plugin takes part in the table: ``status`` neither builds
    a plugin manager nor looks the installed plugins up (pluggy, importlib.metadata:
    most of its start-up at 10,000 tasks, issue 24)."""
    home = tmp_path / "home"
    queued_home(home)
    for args in (["status"], ["status", "--graph"], ["--home", str(home), "status", "--state", "pending", "--wide"]):
        got, out = probe(args, home, tmp_path)
        assert got["code"] == 0, out
        assert "pending" in out  # it did its work
        assert "fleetrun.viewing" in got["modules"]
        avoided = PLUGIN_MACHINERY if "--graph" in args else PLUGIN_MACHINERY | ROW_TYPES
        assert not set(got["modules"]) & avoided, (args, sorted(set(got["modules"]) & avoided))


def test_status_with_a_placed_task_or_json_loads_the_plugins(tmp_path: Path) -> None:
    """What a plugin takes part in goes the usual way: the installed plugins are
    looked up and the hooks asked (the check above means something)."""
    home = tmp_path / "home"
    queued_home(home, placed=True)
    for args in (["status"], ["status", "--json"]):
        got, out = probe(args, home, tmp_path)
        assert got["code"] == 0, out
        assert {"pluggy", "importlib.metadata", "fleetrun.pluginmanager"} <= set(got["modules"]), args


#: The table's forms, as test_viewing prints them: (arguments after ``status``, $COLUMNS).
FORMS = [
    ([], None),
    (["--wide"], "60"),
    ([], "200"),
    ([], "100"),
    ([], "60"),
    ([], "24"),
    (["--state", "ready"], None),
    (["--state", "done"], "80"),
    (["--state", "ReTrYiNg"], None),
    (["--state", "running"], None),
    (["--all"], None),
    (["--all", "--state", "cancelled", "-v", "--color", "no"], "100"),
    (["--graph"], None),
    (["--graph", "--state", "pending"], None),
    (["--graph", "--all"], None),
]


@pytest.fixture(scope="module")
def nothing_placed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """test_viewing's varied ledger (every state, names with control characters,
    peers, costs known and unknown, waits, worktrees), its placed tasks moved back to
    READY with no host, and a second run of some names (``--all`` shows both)."""
    home = tmp_path_factory.mktemp("quick") / "home"
    home.mkdir(mode=0o700)
    build_ledger(home)
    conn = sqlite3.connect(str(home / "state.db"))
    with conn:
        conn.execute("UPDATE tasks SET state='READY', host=NULL WHERE state IN ('ASSIGNED','RUNNING','VERIFYING')")
        conn.execute(
            "INSERT INTO tasks (id, name, state, spec, created, updated, reason)"
            " SELECT id || '_again', name, 'DONE', spec, created + 1, updated + 1, 'again' FROM tasks"
            " WHERE state IN ('DONE','CANCELLED') AND seq % 2 = 0"
        )
    conn.close()
    return home


class Bystander:
    """A plugin that takes part in nothing: ``main(plugins=[...])`` with it runs the
    usual way (a plugin manager, every plugin), as any command line naming a plugin."""


@pytest.mark.parametrize(("args", "columns"), FORMS, ids=lambda x: " ".join(x) if isinstance(x, list) else str(x))
def test_status_prints_what_the_usual_way_prints(
    nothing_placed: Path, args: list[str], columns: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from fleetrun import cli

    monkeypatch.chdir(tmp_path)  # no project file
    monkeypatch.setenv("HOME", "/usr")  # a worktree under it is shown as ~/...
    monkeypatch.delenv("FLEETRUN_ADDOPTS", raising=False)
    monkeypatch.delenv("FLEETRUN_PLUGINS", raising=False)
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    monkeypatch.setattr(time, "time", lambda: NOW)
    configured: list[list[str]] = []
    usual = cli._configure
    monkeypatch.setattr(
        cli, "_configure", lambda args, *rest, **kw: configured.append(args) or usual(args, *rest, **kw)
    )
    printed = []
    for plugins in (None, [Bystander()]):
        out, err = io.StringIO(), io.StringIO()
        code = cli.main(["--home", str(nothing_placed), "status", *args], plugins=plugins, stdout=out, stderr=err)
        printed.append((code, out.getvalue(), err.getvalue()))
    assert len(configured) == 1  # the first answered without a plugin manager, the second with one
    assert printed[0] == printed[1]
    assert printed[0][0] == 0 and printed[0][1]


def test_a_placed_task_met_while_reading_gives_the_table_to_the_usual_way(tmp_path: Path) -> None:
    """A task placed between the look for placed tasks and the read of the rows is seen
    as the rows are read: the table without plugins is not made, the usual way asks
    them."""
    from fleetrun.ledger_schema import LedgerFile
    from fleetrun.viewing import table_text

    home = tmp_path / "home"
    queued_home(home, placed=True)
    with LedgerFile(home / "state.db") as led:
        assert table_text(home, led, None, True, None, None) is None
        done = table_text(home, led, None, True, None, lambda tid, state, host, reason: f"asked about {host}")
    assert done is not None and "asked about local" in done


def test_addopts_and_plugins_named_take_the_usual_way(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The project file's ``addopts`` and ``FLEETRUN_ADDOPTS`` are put before the
    command line, ``-p`` and ``FLEETRUN_PLUGINS`` load a plugin: ``status`` reads them
    as it always has."""
    from fleetrun.cli import main

    home = tmp_path / "home"
    queued_home(home)
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)
    monkeypatch.delenv("FLEETRUN_ADDOPTS", raising=False)
    monkeypatch.delenv("FLEETRUN_PLUGINS", raising=False)

    def status(*args: str) -> str:
        out, err = io.StringIO(), io.StringIO()
        assert main(["--home", str(home), "status", *args], stdout=out, stderr=err) == 0, err.getvalue()
        return out.getvalue()

    assert "ready" in status() and "pending" in status()
    (project / "fleetrun.toml").write_text('addopts = ["--state", "pending"]\n')
    assert "pending" in status() and "ready" not in status()
    (project / "fleetrun.toml").write_text("[task]\n")  # a project file without addopts
    assert "ready" in status()
    (project / "fleetrun.toml").unlink()
    (project / "pyproject.toml").write_text('[tool.fleetrun]\naddopts = "--state cancelled"\n')
    assert "gone" in status() and "ready" not in status()
    (project / "pyproject.toml").unlink()
    monkeypatch.setenv("FLEETRUN_ADDOPTS", "--state pending")
    assert "ready" not in status()
    monkeypatch.delenv("FLEETRUN_ADDOPTS")
    out, err = io.StringIO(), io.StringIO()
    assert main(["--home", str(home), "-p", "no_such_plugin_module", "status"], stdout=out, stderr=err) == 4
    assert "no_such_plugin_module" in err.getvalue()


#: An installed plugin (a module and its dist-info, as ``pip install`` leaves them) that
#: says why a task on this machine waits, as a peer plugin says its peer stopped answering.
REASON_PLUGIN = """
import fleetrun

@fleetrun.hookimpl
def fleetrun_status_reason(task, config):
    return f"the reason plugin says: {task.name} waits for the lab's GPU"
"""


def test_an_installed_plugins_status_reason_still_shows(tmp_path: Path) -> None:
    """``fleetrun_status_reason`` is asked for every placed task with a host, by
    whatever plugin is installed: a placed task takes ``status`` the usual way."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "reason_plugin.py").write_text(REASON_PLUGIN)
    dist = site / "reason_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: reason-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[fleetrun]\nreason = reason_plugin\n")
    home = tmp_path / "home"
    queued_home(home, placed=True)
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
    got, out = probe(["status"], home, tmp_path, **env)
    assert got["code"] == 0, out
    assert "the reason plugin says: ready waits for the lab's GPU" in out
    assert "reason_plugin" in got["modules"]


@pytest.mark.parametrize(
    ("args", "got"),
    [
        (["status"], {}),
        (
            ["--home", "h", "-v", "status", "--state=ready", "--wide"],
            {"home": "h", "": "1", "state": "ready", "wide": "1"},
        ),
        (
            ["status", "--all", "--graph", "--color", "no", "--home=a", "--home", "b"],
            {"all": "1", "graph": "1", "color": "no", "home": "b"},
        ),
        (["status", "--json"], None),  # the plugins' fields
        (["status", "--watch"], None),
        (["status", "-p", "mod"], None),
        (["-p", "no:relay", "status"], None),
        (["status", "--wid"], None),  # argparse takes an abbreviation: the usual way does
        (["status", "--help"], None),
        (["status", "--version"], None),
        (["status", "--state"], None),
        (["status", "--state", "--wide"], None),
        (["status", "--color", "red"], None),
        (["status", "status"], None),
        (["status", "--", "x"], None),
        (["logs", "x"], None),
        ([], None),
    ],
)
def test_the_command_lines_read_without_plugins(args: list[str], got: Any) -> None:
    from fleetrun.quickstatus import read_args

    assert read_args(args) == got

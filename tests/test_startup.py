"""Start-up commands stay light: ``--help``, ``--version`` and ``status`` do not import
paramiko (SSH, needed only to reach peers) or pexpect (needed only by running
attempts). Timing goals live in ``bench/startup.py``, not here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

HEAVY = ("paramiko", "pexpect")

# Runs the real CLI entry point in a fresh interpreter, then reports what it imported.
PROBE = f"""
import json, sys
from fleetrun.cli import main
code = main(sys.argv[1:])
heavy = sorted(m for m in sys.modules if m.split(".")[0] in {HEAVY!r})
sys.stdout.flush()
sys.stderr.write("\\nPROBE " + json.dumps({{"code": code, "heavy": heavy}}) + "\\n")
"""


def run_probe(args: list[str], home: Path) -> dict:
    env = dict(os.environ, FLEETRUN_HOME=str(home), FLEETRUN_DISABLE_PLUGIN_AUTOLOAD="1")
    env.pop("FLEETRUN_PLUGINS", None)
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        env=env,
        cwd=str(home.parent),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("PROBE ")]
    assert proc.returncode == 0 and lines, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return json.loads(lines[-1][len("PROBE ") :])


@pytest.mark.parametrize(
    "args", [["--help"], ["--version"], ["status"], ["status", "--json"]], ids=lambda a: " ".join(a)
)
def test_startup_commands_do_not_import_ssh_or_pexpect(tmp_path: Path, args: list[str]) -> None:
    home = tmp_path / "home"
    got = run_probe(args, home)
    assert got["code"] == 0
    assert got["heavy"] == [], f"fleetrun {' '.join(args)} imported {got['heavy']}"


def test_importtime_of_help_has_no_paramiko(tmp_path: Path) -> None:
    """The same, seen from outside: ``python -X importtime -m fleetrun --help``."""
    env = dict(os.environ, FLEETRUN_HOME=str(tmp_path / "home"), FLEETRUN_DISABLE_PLUGIN_AUTOLOAD="1")
    env.pop("FLEETRUN_PLUGINS", None)
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "fleetrun", "--help"],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "usage: fleetrun" in proc.stdout
    imported = [ln.rsplit("|", 1)[-1].strip() for ln in proc.stderr.splitlines() if ln.startswith("import time:")]
    assert "fleetrun.cli" in imported  # the check below means something
    assert not [m for m in imported if m.split(".")[0] in HEAVY]


#: What a command line that is only read (``--help``, ``--version``) must not import:
#: the ledger, git, the loop, the agents' readers, the built-ins that declare no verb,
#: option or hook, and the standard library's heavy parts only they need
#: (``bench/startup.py`` checks the same list, and times it).
NOT_FOR_HELP = {
    "sqlite3",
    "importlib.metadata",
    "psutil",
    "socket",
    "subprocess",
    "hashlib",
    "tomllib",
    "datetime",
    "threading",
    "uuid",
    "fleetrun.ledger",
    "fleetrun.gitutil",
    "fleetrun.loop",
    "fleetrun.claudecli",
    "fleetrun.collect",
    "fleetrun.reports",
    "fleetrun.hosts",
    "jinja2",
    "markupsafe",
    "fleetrun.plugins.htmlreport.model",
    "fleetrun.plugins.htmlreport.render",
}
#: The built-ins ``--help`` and ``--version`` load: those declaring verbs, options or hooks.
READING_PLUGINS = {
    "fleetrun.plugins",
    "fleetrun.plugins.relay",
    "fleetrun.plugins.mailbox",
    "fleetrun.plugins.terminal",
    "fleetrun.plugins.events",
    "fleetrun.plugins.events.log",
    "fleetrun.plugins.junitxml",
    "fleetrun.plugins.htmlreport",
}

MODULES_PROBE = """
import json, sys
from fleetrun.cli import main
code = main(sys.argv[1:])
sys.stdout.flush()
sys.stderr.write("\\nPROBE " + json.dumps({"code": code, "modules": sorted(sys.modules)}) + "\\n")
"""


def modules_of(args: list[str], tmp_path: Path, autoload: bool = False) -> tuple[dict, str]:
    env = dict(os.environ, FLEETRUN_HOME=str(tmp_path / "home"))
    env.pop("FLEETRUN_PLUGINS", None)
    if not autoload:
        env["FLEETRUN_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    proc = subprocess.run(
        [sys.executable, "-c", MODULES_PROBE, *args],
        env=env,
        cwd=str(tmp_path),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("PROBE ")]
    assert lines, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return json.loads(lines[-1][len("PROBE ") :]), proc.stdout


@pytest.mark.parametrize(
    "args", [["--help"], ["--version"], ["status", "--help"], ["-p", "no:relay", "--help"]], ids=" ".join
)
def test_help_and_version_import_only_what_reading_the_command_line_needs(tmp_path: Path, args: list[str]) -> None:
    got, out = modules_of(args, tmp_path)
    assert got["code"] == 0, out
    modules = set(got["modules"])
    assert "fleetrun.cli" in modules and "argparse" in modules  # the checks below mean something
    assert not modules & NOT_FOR_HELP, sorted(modules & NOT_FOR_HELP)
    plugins = {m for m in modules if m.startswith("fleetrun.plugins")}
    assert plugins <= READING_PLUGINS, sorted(plugins - READING_PLUGINS)
    if args == ["--help"]:  # all the same, every verb and option the plugins declare is there
        for word in (
            "relay ",
            "host ",
            "role ",
            "mailbox ",
            "--durations",
            "--color",
            "--events",
            "--junitxml",
            "--html",
            "report ",
        ):
            assert word in out, word
    if args == ["--version"]:  # and every built-in is listed, loaded or not
        from fleetrun.pluginmanager import BUILTIN_PLUGINS

        listed = out.splitlines()[1].removeprefix("plugins: ").split(", ")
        assert listed == list(BUILTIN_PLUGINS)


def test_installed_plugins_load_and_help_stays_light(tmp_path: Path) -> None:
    """Autoload on: the installed plugins (CI installs plugins/fleetrun-*) are found
    through ``importlib.metadata`` and loaded, and neither they nor the look-up import
    what ``--help`` does without."""
    got, out = modules_of(["--version"], tmp_path, autoload=True)
    assert got["code"] == 0, out
    modules = set(got["modules"])
    assert "importlib.metadata" in modules  # the check below means something
    from importlib import metadata

    installed = {ep.name for ep in metadata.entry_points(group="fleetrun")}
    assert installed <= set(out.splitlines()[1].removeprefix("plugins: ").split(", "))
    # what the standard look-up itself imports (email, zipfile: threading, socket...) is its
    # cost; the plugins add nothing of the list
    lookup = subprocess.run(
        [
            sys.executable,
            "-c",
            "import importlib.metadata as m, json, sys; "
            "m.entry_points(group='fleetrun'); print(json.dumps(sorted(sys.modules)))",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    theirs = set(json.loads(lookup.stdout))
    heavy = {m for m in modules if m.split(".")[0] in HEAVY} | (modules & (NOT_FOR_HELP - theirs))
    assert not heavy, sorted(heavy)


def test_a_help_word_a_verb_takes_as_its_own_runs_the_verb(tmp_path: Path) -> None:
    """``relay peers --help`` is the relay verb's own help (its arguments are its own):
    the command is not only read, every plugin is loaded and the verb answers."""
    got, out = modules_of(["relay", "peers", "--help"], tmp_path)
    assert got["code"] == 0, out
    assert "fleetrun.plugins.worktree" in got["modules"]
    assert "usage: fleetrun relay peers" in out


def test_the_builtins_loaded_to_read_a_command_line_are_all_that_take_part_in_it() -> None:
    """``ARGUMENT_PLUGINS`` is every built-in implementing a hook called before the
    command line is parsed: a built-in missing from it would lose its verbs or options
    in ``--help``."""
    import importlib

    from fleetrun.pluginmanager import (
        ARGUMENT_HOOKS,
        ARGUMENT_PLUGINS,
        BUILTIN_PLUGINS,
        FleetPluginManager,
    )

    pm = FleetPluginManager()
    pm.consider_builtins()
    taking_part = {
        pm.get_name(impl.plugin) for hook in ARGUMENT_HOOKS for impl in getattr(pm.hook, hook).get_hookimpls()
    }
    assert taking_part == set(ARGUMENT_PLUGINS)
    assert all(importlib.import_module(BUILTIN_PLUGINS[n]) for n in ARGUMENT_PLUGINS)


#: What the operator's verbs that touch no stage of a task (``status``, ``logs``,
#: ``cancel``, ``drain``...) must not import, on a home with tasks on this machine and on
#: a peer no plugin provides: git, the loop and its placement, Claude Code's reader, the
#: diff a reviewer is shown, the relay's wire, SSH and its worker, notifications, and
#: the standard library's parts only those need (``bench/startup.py`` checks a part of
#: the list, and times it).
NOT_FOR_OPERATOR = {
    "subprocess",
    "uuid",
    "socket",
    "threading",
    "hashlib",
    "secrets",
    "psutil",
    "apprise",
    "jinja2",
    "importlib.metadata",
    "fleetrun.gitutil",
    "fleetrun.depmerge",
    "fleetrun.loop",
    "fleetrun.claudecli",
    "fleetrun.claudeopts",
    "fleetrun.collect",
    "fleetrun.placement",
    "fleetrun.decide",
    "fleetrun.reports",
    "fleetrun.diffutil",
    "fleetrun.procutil",
    "fleetrun.probe",
    "fleetrun.plugins.relay.protocol",
    "fleetrun.plugins.relay.supervisor",
    "fleetrun.plugins.relay.transport",
    "fleetrun.plugins.relay.worker",
    "fleetrun.plugins.notify.sender",
}
#: Each verb of ``OPERATOR_VERBS`` as the tests below run it on that home.
OPERATOR_RUNS = [
    ["status"],
    ["status", "--json"],
    ["status", "--graph"],
    ["logs", "running"],
    ["cancel", "running"],
    ["retry", "--state", "cancelled"],
    ["drain"],
    ["undrain"],
    ["gc"],
]


def a_home_with_tasks(home: Path) -> None:
    """Tasks waiting, running here, placed on a peer that no plugin provides (no
    peers.toml), and cancelled: ``status`` asks the hosts and the hosts' plugins about
    the placed ones, ``cancel`` stops an attempt, ``retry`` takes a cancelled one back.
    Made three days ago, so that an age printed is the same a second later."""
    import sqlite3

    from fleetrun.ledger import Ledger
    from fleetrun.states import State
    from fleetrun.taskspec import TaskSpec

    with Ledger(home / "state.db") as led:
        ready, running, placed, gone = led.add_tasks(
            [TaskSpec(name=n, prompt="p", cwd="/repo") for n in ("ready", "running", "placed", "gone")]
        )
        led.lease(running.id, State.READY, "local", "fresh")
        led.transition(running.id, State.ASSIGNED, State.RUNNING, "started", 1, "local")
        led.lease(placed.id, State.READY, "mini", "fresh")
        led.transition(gone.id, State.READY, State.CANCELLED, "operator_cancel")
        led.add_note(ready.id, "a note")
    conn = sqlite3.connect(str(home / "state.db"))
    with conn:
        conn.execute("UPDATE tasks SET created = created - 3 * 86400")
    conn.close()


@pytest.mark.parametrize("args", OPERATOR_RUNS[:5] + OPERATOR_RUNS[6:7], ids=" ".join)
def test_operator_verbs_import_only_what_they_need(tmp_path: Path, args: list[str]) -> None:
    from fleetrun.pluginmanager import BUILTIN_PLUGINS, OPERATOR_PLUGINS

    a_home_with_tasks(tmp_path / "home")
    got, out = modules_of(args, tmp_path)
    assert got["code"] == 0, out
    modules = set(got["modules"])
    assert {"fleetrun.ledger", "sqlite3"} <= modules  # it did open the ledger
    if args == ["status"]:  # and asked the hosts: the peer no plugin provides is said
        assert "fleetrun.hosts" in modules and "no peer named 'mini'" in out
    if args[0] == "cancel":
        assert "cancelled running" in out
    assert not modules & NOT_FOR_OPERATOR, sorted(modules & NOT_FOR_OPERATOR)
    builtins = {m for m in modules if m in BUILTIN_PLUGINS.values()}
    if args == ["status", "--graph"]:  # asks no plugin: none is loaded (fleetrun.quickstatus)
        assert builtins == set() and "pluggy" not in modules
    else:
        assert builtins == {BUILTIN_PLUGINS[n] for n in OPERATOR_PLUGINS}


def test_the_builtins_an_operator_verb_loads_are_all_that_take_part_in_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``OPERATOR_PLUGINS`` is every built-in implementing a hook of ``OPERATOR_HOOKS``,
    and the verbs of ``OPERATOR_VERBS`` call no other hook: what they print and what
    they leave in the home is what they do with every built-in loaded, byte for byte."""
    import io
    import shutil

    from fleetrun import hookimpl
    from fleetrun.cli import main
    from fleetrun.pluginmanager import (
        BUILTIN_PLUGINS,
        OPERATOR_HOOKS,
        OPERATOR_PLUGINS,
        OPERATOR_VERBS,
        FleetPluginManager,
    )

    pm = FleetPluginManager()
    pm.consider_builtins()
    taking_part = {
        pm.get_name(impl.plugin) for hook in OPERATOR_HOOKS for impl in getattr(pm.hook, hook).get_hookimpls()
    }
    assert taking_part == set(OPERATOR_PLUGINS)
    assert {a[0] for a in OPERATOR_RUNS} == set(OPERATOR_VERBS)

    home, pristine = tmp_path / "home", tmp_path / "pristine"
    a_home_with_tasks(pristine)
    monkeypatch.chdir(tmp_path)  # no project file: nothing makes the verbs load every built-in
    called: set[str] = set()

    class Monitor:
        pm: Any = None

        @hookimpl
        def fleetrun_addhooks(self, pluginmanager: Any) -> None:  # historic: at once
            self.pm = pluginmanager
            pluginmanager.add_hookcall_monitoring(
                lambda name, impls, kw: called.add(name), lambda outcome, name, impls, kw: None
            )

    def ledger_rows() -> list[Any]:
        import sqlite3

        conn = sqlite3.connect(str(home / "state.db"))
        try:
            return [conn.execute(f"SELECT * FROM {t} ORDER BY 1").fetchall() for t in ("tasks", "meta", "notes")]
        finally:
            conn.close()

    for args in OPERATOR_RUNS:
        seen = []
        for everything in (False, True):
            shutil.rmtree(home, ignore_errors=True)
            shutil.copytree(pristine, home)
            out, err = io.StringIO(), io.StringIO()
            extra = list(BUILTIN_PLUGINS) if everything else []
            monitor = Monitor()
            code = main(["--home", str(home), *args], plugins=[monitor, *extra], stdout=out, stderr=err)
            assert (monitor.pm.get_plugin("worktree") is not None) == everything, args
            events = (
                [json.loads(ln)["type"] for ln in (home / "events.ndjson").read_text().splitlines()]
                if (home / "events.ndjson").exists()
                else []
            )
            rows = [[r[:8] for r in rows] for rows in ledger_rows()]  # not the times of a change
            seen.append((code, out.getvalue(), err.getvalue(), events, rows))
        assert seen[0] == seen[1], args
    assert called and called <= set(OPERATOR_HOOKS), sorted(called - set(OPERATOR_HOOKS))
    assert {"fleetrun_hosts", "fleetrun_status_reason", "fleetrun_transition"} <= called


def test_an_operator_verb_reading_config_toml_loads_the_builtins_it_left_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The built-ins ``cancel`` does not load still declare their ``config.toml`` keys
    when it reads the file (the event log's limits, as it writes the transition): the
    tables of ``claude`` and ``worktree`` are known as in any run, so ``[events]`` is
    read (the log rotates at 1 byte), not refused whole as unknown tables."""
    import io

    from fleetrun.cli import main

    monkeypatch.chdir(tmp_path)
    home = tmp_path / "home"
    a_home_with_tasks(home)
    (home / "config.toml").write_text(
        '[claude]\nexecutable = "claude"\n[worktree]\ncommit_message = "x"\n[events]\nmax_bytes = 1\n'
    )
    for name in ("ready", "placed"):
        out, err = io.StringIO(), io.StringIO()
        assert main(["--home", str(home), "cancel", name], stdout=out, stderr=err) == 0, err.getvalue()
        assert f"cancelled {name}" in out.getvalue()
    assert json.loads((home / "events.ndjson.1").read_text())["task"].endswith("_0")  # ready's, rotated
    assert json.loads((home / "events.ndjson").read_text())["task"].endswith("_2")  # placed's


#: What ``status`` (each form) does not import either, on that home: the operator's
#: actions (``cancel``, ``retry``... only), the policy module (no policy.toml: nothing
#: drains this machine), the mailbox's messages (its host is asked about none), the
#: parsing of a brain's reply.
NOT_FOR_STATUS = {
    "fleetrun.ops",
    "fleetrun.crash",
    "fleetrun.policy",
    "fleetrun.plugins.mailbox.store",
    "fleetrun.watching",
    "fleetrun.transcript",
}


@pytest.mark.parametrize("args", [["status"], ["status", "--json"], ["status", "--graph"]], ids=" ".join)
def test_status_imports_none_of_the_other_verbs_parts(tmp_path: Path, args: list[str]) -> None:
    a_home_with_tasks(tmp_path / "home")
    got, out = modules_of(args, tmp_path)
    assert got["code"] == 0, out
    modules = set(got["modules"])
    assert {"fleetrun.viewing", "fleetrun.ledger"} <= modules  # it did its work
    if args == ["status"]:  # and asked the hosts about the placed tasks
        assert "fleetrun.plugins.mailbox.host" in modules
    assert not modules & NOT_FOR_STATUS, sorted(modules & NOT_FOR_STATUS)


MARKERS_CHECK = """
import importlib
import fleetrun
specs = importlib.import_module("fleetrun.hookspec")
assert type(specs).__name__ == "module" and hasattr(specs, "fleetrun_configure")
import fleetrun.hookimpl
from fleetrun import hookimpl, hookspec
assert type(fleetrun.hookimpl).__name__ == type(hookimpl).__name__ == "HookimplMarker"
assert type(fleetrun.hookspec).__name__ == type(hookspec).__name__ == "HookspecMarker"
print("ok")
"""


@pytest.mark.parametrize(
    "first",
    [
        "import sys, fleetrun; assert 'pluggy' not in sys.modules, 'import fleetrun imported pluggy'",
        "import fleetrun.hookspec",
        "import fleetrun.hookimpl",
        "from fleetrun.hookimpl import hookimpl",
    ],
)
def test_import_fleetrun_costs_no_pluggy_and_the_markers_keep_their_names(first: str) -> None:
    """``import fleetrun`` (every command's first cost) imports no pluggy: the markers
    come on first use, and stay the markers whichever of their modules (whose names
    they share) is imported first."""
    proc = subprocess.run(
        [sys.executable, "-c", first + "\n" + MARKERS_CHECK],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.stdout.strip() == "ok", proc.stderr

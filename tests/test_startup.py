"""Start-up commands stay light: ``--help``, ``--version`` and ``status`` do not import
paramiko (SSH, needed only to reach peers) or pexpect (needed only by running
attempts). Timing goals live in ``bench/startup.py``, not here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

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
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], env=env, cwd=str(home.parent),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("PROBE ")]
    assert proc.returncode == 0 and lines, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return json.loads(lines[-1][len("PROBE "):])


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["status"], ["status", "--json"]],
                         ids=lambda a: " ".join(a))
def test_startup_commands_do_not_import_ssh_or_pexpect(tmp_path: Path, args: list[str]) -> None:
    home = tmp_path / "home"
    got = run_probe(args, home)
    assert got["code"] == 0
    assert got["heavy"] == [], f"fleetrun {' '.join(args)} imported {got['heavy']}"


def test_importtime_of_help_has_no_paramiko(tmp_path: Path) -> None:
    """The same, seen from outside: ``python -X importtime -m fleetrun --help``."""
    env = dict(os.environ, FLEETRUN_HOME=str(tmp_path / "home"), FLEETRUN_DISABLE_PLUGIN_AUTOLOAD="1")
    env.pop("FLEETRUN_PLUGINS", None)
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "fleetrun", "--help"], env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "usage: fleetrun" in proc.stdout
    imported = [ln.rsplit("|", 1)[-1].strip() for ln in proc.stderr.splitlines() if ln.startswith("import time:")]
    assert "fleetrun.cli" in imported  # the check below means something
    assert not [m for m in imported if m.split(".")[0] in HEAVY]


#: What a command line that is only read (``--help``, ``--version``) must not import:
#: the ledger, git, the loop, the agents' readers, the built-ins that declare no verb,
#: option or hook, and the standard library's heavy parts only they need
#: (``bench/startup.py`` checks the same list, and times it).
NOT_FOR_HELP = {"sqlite3", "importlib.metadata", "psutil", "socket", "subprocess", "hashlib", "tomllib",
                "threading", "uuid", "fleetrun.ledger", "fleetrun.gitutil", "fleetrun.loop", "fleetrun.claudecli",
                "fleetrun.collect", "fleetrun.reports", "fleetrun.hosts"}
#: The built-ins ``--help`` and ``--version`` load: those declaring verbs, options or hooks.
READING_PLUGINS = {"fleetrun.plugins", "fleetrun.plugins.relay", "fleetrun.plugins.mailbox",
                   "fleetrun.plugins.terminal", "fleetrun.plugins.events", "fleetrun.plugins.events.log",
                   "fleetrun.plugins.junitxml"}

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
    proc = subprocess.run([sys.executable, "-c", MODULES_PROBE, *args], env=env, cwd=str(tmp_path),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("PROBE ")]
    assert lines, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return json.loads(lines[-1][len("PROBE "):]), proc.stdout


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["status", "--help"], ["-p", "no:relay", "--help"]],
                         ids=" ".join)
def test_help_and_version_import_only_what_reading_the_command_line_needs(tmp_path: Path, args: list[str]) -> None:
    got, out = modules_of(args, tmp_path)
    assert got["code"] == 0, out
    modules = set(got["modules"])
    assert "fleetrun.cli" in modules and "argparse" in modules  # the checks below mean something
    assert not modules & NOT_FOR_HELP, sorted(modules & NOT_FOR_HELP)
    plugins = {m for m in modules if m.startswith("fleetrun.plugins")}
    assert plugins <= READING_PLUGINS, sorted(plugins - READING_PLUGINS)
    if args == ["--help"]:  # all the same, every verb and option the plugins declare is there
        for word in ("relay ", "host ", "role ", "mailbox ", "--durations", "--color", "--events", "--junitxml"):
            assert word in out, word
    if args == ["--version"]:  # and every built-in is listed, loaded or not
        from fleetrun.pluginmanager import BUILTIN_PLUGINS

        listed = out.splitlines()[1].removeprefix("plugins: ").split(", ")
        assert listed == list(BUILTIN_PLUGINS)


def test_entry_points_are_found_without_importlib_metadata(tmp_path: Path) -> None:
    """Autoload on: the installed plugins are looked for by reading their dist-info
    folders, not through ``importlib.metadata`` (~10 ms of imports)."""
    from importlib import metadata

    if list(metadata.entry_points().select(group="fleetrun")):
        pytest.skip("a fleetrun plugin is installed here: --help would load it")
    got, out = modules_of(["--help"], tmp_path, autoload=True)
    assert got["code"] == 0, out
    assert "fleetrun.entrypoints" in got["modules"] and "importlib.metadata" not in got["modules"]


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
    taking_part = {pm.get_name(impl.plugin) for hook in ARGUMENT_HOOKS
                   for impl in getattr(pm.hook, hook).get_hookimpls()}
    assert taking_part == set(ARGUMENT_PLUGINS)
    assert all(importlib.import_module(BUILTIN_PLUGINS[n]) for n in ARGUMENT_PLUGINS)

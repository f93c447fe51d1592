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

"""The fake claude is a package folder, fleetrun/testing/fake_claude/ (issue 12: no
module over ~500 lines), run three ways: by path (``python <folder>``, as
tests/fakes/claude and the ``fake_claude`` fixture run it), as ``python -m
fleetrun.testing.fake_claude``, and imported. Its ``__init__`` docstring says how its
modules find each other; these tests hold it to that."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import fleetrun.testing.fake_claude as packaged

FOLDER = Path(packaged.__file__).parent
MODULES = sorted(p.stem for p in FOLDER.glob("*.py") if not p.stem.startswith("__"))


def test_no_module_of_the_fake_is_named_as_a_standard_library_module() -> None:
    """Run by path, the folder is first on sys.path: a ``json.py`` there would be the
    ``json`` every later import gets."""
    assert MODULES  # the check below means something
    assert not [m for m in MODULES if m in sys.stdlib_module_names]


def test_by_path_it_needs_no_fleetrun_and_imports_no_bare_module_names(tmp_path: Path) -> None:
    """``-I -S``: no site-packages (so no fleetrun, installed or editable) and no cwd on
    sys.path; the fake still runs, loaded under its private package name only."""
    probe = (
        "import json, runpy, sys\n"
        f"sys.argv = ['claude', '-p', '--output-format', 'json', 'hi']\n"
        "try:\n"
        f"    runpy.run_path({str(FOLDER)!r}, run_name='__main__')\n"
        "except SystemExit as e:\n"
        "    code = e.code\n"
        f"bare = sorted(m for m in sys.modules if m in {MODULES!r})\n"
        "ours = sorted(m for m in sys.modules if m.startswith('_fleetrun_fake_claude'))\n"
        "fleetrun = sorted(m for m in sys.modules if m.split('.')[0] == 'fleetrun')\n"
        "sys.stderr.write('PROBE ' + json.dumps([code, bare, ours, fleetrun]) + '\\n')\n"
    )
    env = {
        "PATH": "/usr/bin:/bin",
        "FAKE_CLAUDE_STATE": str(tmp_path / "state"),
        "CLAUDE_CONFIG_DIR": str(tmp_path / "claude-config"),
    }
    proc = subprocess.run(
        [sys.executable, "-I", "-S", "-c", probe],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("PROBE ")]
    code, bare, ours, fleetrun = json.loads(line[len("PROBE ") :])
    assert (code, bare, fleetrun) == (0, [], [])
    assert ours == sorted(["_fleetrun_fake_claude"] + [f"_fleetrun_fake_claude.{m}" for m in MODULES])
    assert json.loads(proc.stdout.splitlines()[0])["result"] == "ok"


@pytest.mark.parametrize("how", ["folder", "module"])
def test_python_runs_the_folder_and_the_module(tmp_path: Path, how: str) -> None:
    target = [str(FOLDER)] if how == "folder" else ["-m", "fleetrun.testing.fake_claude"]
    proc = subprocess.run(
        [sys.executable, *target, "--version"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert (proc.returncode, proc.stdout) == (0, f"{packaged.VERSION} (Claude Code)\n")


def test_imported_it_is_one_package_of_fleetrun() -> None:
    from fleetrun.testing.fake_claude import cli, common

    assert packaged.main is cli.main and packaged.VERSION == common.VERSION
    assert set(packaged.__all__) <= set(dir(packaged))

"""With peers paired, the commands that must start fast still do not import paramiko:
the relay plugin reads peers.toml and registers its hosts without connecting."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = """
import json, sys
from fleetrun.cli import main
code = main(sys.argv[1:])
sys.stdout.flush()
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("paramiko", "cryptography"))
sys.stderr.write("\\nPROBE " + json.dumps({"code": code, "heavy": heavy}) + "\\n")
"""


@pytest.mark.parametrize(
    "args",
    [["--help"], ["status"], ["status", "--json"], ["relay", "peers", "--cached"], ["host", "probe", "--json"]],
    ids=" ".join,
)
def test_no_paramiko_without_a_connection(tmp_path: Path, args: list[str]) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "peers.toml").write_text('[peers.mini]\naddress = "me@127.0.0.1:1"\ncommand = ["fleetrun"]\n')
    env = dict(os.environ, FLEETRUN_HOME=str(home), FLEETRUN_DISABLE_PLUGIN_AUTOLOAD="1")
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        env=env,
        cwd=str(tmp_path),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("PROBE ")]
    assert lines, proc.stdout + proc.stderr
    got = json.loads(lines[-1][len("PROBE ") :])
    assert got["code"] == 0, proc.stdout + proc.stderr
    assert got["heavy"] == []


def test_a_broken_peers_toml_stops_work_but_not_status(fleeter) -> None:
    fleeter.home.mkdir(parents=True, exist_ok=True)
    (fleeter.home / "peers.toml").write_text('[peers.mini]\naddres = "me@host"\n')
    r = fleeter.run("status")
    assert r.ret == 0
    r = fleeter.run("work", "--until-idle")
    assert r.ret == 4
    assert "peers.toml:2: peers.mini.addres: unknown key (one of address, key, command, added)" in r.stderr
    r = fleeter.run("relay", "peers")
    assert r.ret == 4

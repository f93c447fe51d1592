"""The terminal plugin: colour only on a terminal, NO_COLOR honoured, -q and -v."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys

import pytest

TASKS = '''
[agents.ok]
command = ["{python}", "-c", "print('done')"]

[[task]]
name = "a"
prompt = "p"
agent = "ok"
  [[task.verify]]
  run = "true"
'''


def run_on_pty(args: list[str], env: dict[str, str], cwd: str) -> tuple[int, bytes]:
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "fleetrun", *args], stdin=slave, stdout=slave,
                            stderr=slave, env=env, cwd=cwd, close_fds=True)
    os.close(slave)
    out = b""
    while True:
        r, _, _ = select.select([master], [], [], 60)
        if not r:
            break
        try:
            data = os.read(master, 65536)
        except OSError:
            break
        if not data:
            break
        out += data
    os.close(master)
    return proc.wait(timeout=60), out


@pytest.mark.parametrize("no_color", [False, True])
def test_colour_only_on_a_terminal_and_never_with_no_color(fleeter, no_color):
    fleeter.write_tasks(TASKS)
    env = dict(os.environ)
    env.pop("NO_COLOR", None)
    if no_color:
        env["NO_COLOR"] = "1"
    code, out = run_on_pty(["tasks.toml"], env, str(fleeter.path))
    assert code == 0, out
    assert b"=== 1 done in " in out
    assert (b"\x1b[" in out) is (not no_color)


def test_plain_when_not_a_terminal(fleeter):
    fleeter.write_tasks(TASKS)
    r = fleeter.runsub("tasks.toml")
    assert r.ret == 0
    assert "\x1b[" not in r.stdout


def test_quiet_and_verbose(fleeter):
    fleeter.write_tasks(TASKS)
    q = fleeter.run("tasks.toml", "-q")
    assert q.ret == 0
    assert not any(line.startswith("fleetrun ") for line in q.outlines)
    q.fnmatch_lines(["*a DONE*", "=== 1 done in * ==="])
    q.no_fnmatch_line("*a RUNNING*")
    v = fleeter.run("tasks.toml", "-v", "--new-queue")
    v.fnmatch_lines(["*a READY*queued", "*a RUNNING*", "*verify run `true`: PASS*"])

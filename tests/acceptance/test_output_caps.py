"""Issue 21 items 5 and 6, end to end with the real CLI, real shepherds and real git:
every file fleetrun writes from an untrusted stream (the agent's log, a verifier's or a
setup step's output) is cut to ``[output] max_bytes``, head and tail kept around a
marker, and the task that flooded is the one that pays; nothing an agent or a verifier
detaches (``setsid sleep 3000 &``) outlives it."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from fleetrun.capped import marker

from .test_adoption import loops, running_agent, wait_for  # noqa: F401
from .test_crash_points import _no_strays, kill_leftovers  # noqa: F401
from .test_disk_full import mount_home

CAP = 1_000_000
MARK_MAX = len(marker(10**12, CAP))


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return False
    return data[data.rindex(b")") + 2 :].split()[0] not in (b"Z", b"X")


def detach(pidfile: Path, n: int = 1) -> str:
    """Shell that starts ``n`` ``sleep 3000`` in sessions of their own (out of the caller's
    process group: a group kill misses them), their pids in ``pidfile``, and returns once
    they are all written."""
    one = f"setsid sh -c 'echo $$ >> {pidfile}; exec sleep 3000' >/dev/null 2>&1 </dev/null &"
    return " ".join([one] * n) + f' while [ "$(wc -l < {pidfile} 2>/dev/null || echo 0)" -lt {n} ]; do sleep 0.05; done'


@pytest.fixture
def pids_of(tmp_path):
    """The pids a test's detached processes wrote, read after the run; SIGKILLed at the end
    whatever the test found (a failing test leaves no `sleep 3000` behind)."""
    files: list[Path] = []

    def read(path: Path) -> list[int]:
        files.append(path)
        return [int(x) for x in path.read_text().split()] if path.exists() else []

    yield read
    for path in files:
        for pid in (int(x) for x in path.read_text().split()) if path.exists() else ():
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass


def one_task(fleeter, verify: str = "test -f out.txt", extra: str = "", top: str = "") -> None:
    fleeter.make_repo()
    fleeter.write_tasks(f"""
        {top}
        [[task]]
        name = "t1"
        cwd = "repo"
        prompt = "Write out.txt."
        git_ref = "main"
        max_retries = 0
        {extra}
          [[task.verify]]
          run = {json.dumps(verify)}
    """)


def test_nothing_an_agent_detaches_outlives_its_task(fleeter, fake_claude, tmp_path, pids_of):
    pidfile = tmp_path / "agent-pids"
    one_task(fleeter, extra='allowed_tools = ["Bash"]')
    fake_claude.script(t1=[{"actions": [["bash", detach(pidfile, 5)], ["write", "out.txt", "x"]]}])
    r = fleeter.run("tasks.toml")
    pids = pids_of(pidfile)
    assert r.ret == 0, r.stdout + r.stderr
    assert fleeter.states() == {"t1": "DONE"}
    assert len(pids) == 5
    assert [p for p in pids if alive(p)] == [], "processes the agent detached outlived its task"


def test_a_run_verifiers_detached_process_dies_with_it(fleeter, fake_claude, tmp_path, pids_of):
    pidfile = tmp_path / "verifier-pids"
    one_task(fleeter, verify=detach(pidfile) + "; test -f out.txt")
    fake_claude.script(t1=[{"actions": [["write", "out.txt", "x"]]}])
    r = fleeter.run("tasks.toml")
    pids = pids_of(pidfile)
    assert r.ret == 0, r.stdout + r.stderr
    assert fleeter.states() == {"t1": "DONE"}
    assert len(pids) == 1 and not alive(pids[0]), "the verifier's detached process outlived it"


def test_a_setup_steps_detached_process_dies_with_it(fleeter, fake_claude, tmp_path, pids_of):
    pidfile = tmp_path / "setup-pids"
    one_task(fleeter, extra=f"setup = [{json.dumps(detach(pidfile))}]")
    fake_claude.script(t1=[{"actions": [["write", "out.txt", "x"]]}])
    r = fleeter.run("tasks.toml")
    pids = pids_of(pidfile)
    assert r.ret == 0, r.stdout + r.stderr
    assert len(pids) == 1 and not alive(pids[0]), "the setup step's detached process outlived it"


def only_attempt_dir(fleeter) -> Path:
    (att,) = fleeter.ledger().attempts(fleeter.task("t1").id)
    return fleeter.home / "attempts" / att.id


def test_a_verifiers_flood_is_cut_to_the_cap_and_its_verdict_says_so(fleeter, fake_claude):
    """200 MB from a failing verifier: its output file holds the cap (plus the marker),
    its first and last lines; the verdict, and so the task's cause, says it was cut."""
    fleeter.write_config(f"[output]\nmax_bytes = {CAP}\n")
    one_task(fleeter, verify="echo FIRST; head -c 200000000 /dev/zero | tr '\\0' x; echo; echo LAST; exit 1")
    fake_claude.script(t1=[{"actions": [["write", "out.txt", "x"]]}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 1, r.stdout + r.stderr
    assert fleeter.states() == {"t1": "NEEDS_HUMAN"}
    out = (only_attempt_dir(fleeter) / "verify-1.out").read_bytes()
    assert len(out) <= CAP + MARK_MAX, len(out)
    assert out.startswith(b"FIRST\nxxx") and out.endswith(b"xxx\nLAST\n")
    assert b"\n[fleetrun: 199,000,012 bytes cut: output over its 1.0 MB cap]\n" in out
    (v,) = fleeter.ledger().verdicts(fleeter.task("t1").id)
    assert v.reason == "exit code 1; output cut: 199 MB over the 1.0 MB cap"
    assert v.output.endswith("LAST\n")


def test_a_setup_steps_flood_is_cut_to_the_cap(fleeter, fake_claude):
    fleeter.write_config(f"[output]\nmax_bytes = {CAP}\n")
    one_task(fleeter, extra='setup = ["echo FIRST; head -c 30000000 /dev/zero; echo LAST"]')
    fake_claude.script(t1=[{"actions": [["write", "out.txt", "x"]]}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    out = (only_attempt_dir(fleeter) / "setup-1.out").read_bytes()
    assert len(out) <= CAP + MARK_MAX, len(out)
    assert out.startswith(b"FIRST\n") and out.endswith(b"LAST\n") and b"bytes cut: output over its" in out


FLOOD_AGENT = """
[agents.flood]
command = ["/bin/sh", "-c", "echo FIRST; head -c 50000000 /dev/zero >&2; echo; echo LAST; echo x > out.txt"]
"""


def test_an_agents_stderr_flood_is_cut_and_the_task_notes_it(fleeter, fake_claude):
    fleeter.write_config(f"[output]\nmax_bytes = {CAP}\n")
    one_task(fleeter, top=FLOOD_AGENT, extra='agent = "flood"')
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    assert fleeter.states() == {"t1": "DONE"}
    log = (only_attempt_dir(fleeter) / "log").read_bytes()
    assert len(log) <= CAP + MARK_MAX, len(log)
    assert log.startswith(b"FIRST\n") and log.endswith(b"LAST\n")
    notes = [text for _t, text in fleeter.ledger().notes(fleeter.task("t1").id)]
    assert "attempt 1: its log was cut: output cut: 49 MB over the 1.0 MB cap" in notes, notes
    assert b"\n[fleetrun: 49,000,012 bytes cut: output over its 1.0 MB cap]\n" in log
    # the log only grows (the head as it comes, the marker and the tail at the end):
    # `logs -f`, which follows what is appended, shows the end
    fleeter.run("logs", "-f", "--raw", "t1").fnmatch_lines(["LAST"])


@pytest.fixture
def home_16m(fleeter, tmp_path, monkeypatch):
    yield from mount_home(fleeter, tmp_path, monkeypatch, "16m")


def test_one_tasks_flood_does_not_stop_the_fleet(fleeter, fake_claude, home_16m, tmp_path):
    """On a 16 MB home, t1's verifier prints 100 MB: its output is cut to the cap and t1
    goes on (DONE: the verifier passed), and so does t2. Without the cap the flood fills
    the home, the loop starts nothing new until it clears, and it never clears."""
    fleeter.write_config(f"[output]\nmax_bytes = {CAP}\n")
    fleeter.write_policy("[local]\nmax_tasks = 1\n")
    fleeter.make_repo()
    fleeter.write_tasks("""
        [[task]]
        name = "t1"
        cwd = "repo"
        prompt = "Write t1.txt."
        git_ref = "main"
          [[task.verify]]
          run = "head -c 100000000 /dev/zero; test -f t1.txt"

        [[task]]
        name = "t2"
        cwd = "repo"
        prompt = "Write t2.txt."
        git_ref = "main"
          [[task.verify]]
          run = "test -f t2.txt"
    """)
    fake_claude.script(t1=[{"actions": [["write", "t1.txt", "x"]]}], t2=[{"actions": [["write", "t2.txt", "x"]]}])
    try:
        r = fleeter.runsub("tasks.toml", timeout=120)
    finally:
        kill_leftovers(tmp_path)
    assert r.ret == 0, r.stdout + r.stderr
    assert fleeter.states() == {"t1": "DONE", "t2": "DONE"}
    (v,) = fleeter.ledger().verdicts(fleeter.task("t1").id)
    assert v.reason == "exit code 0; output cut: 99 MB over the 1.0 MB cap"


def test_a_claude_log_cut_in_the_middle_still_gives_the_attempts_result(fleeter, fake_claude):
    """The log of a Claude Code session is stream-json: cut, a line is broken in two at
    each end of the marker. The result event at the end is kept, and read: the task is
    DONE, its cost counted."""
    fleeter.write_config(f"[output]\nmax_bytes = {CAP}\n")
    one_task(fleeter)
    fake_claude.script(t1=[{"actions": [["print", "y" * 3_000_000], ["write", "out.txt", "x"]], "cost": 0.25}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    assert fleeter.states() == {"t1": "DONE"}
    log = (only_attempt_dir(fleeter) / "log").read_bytes()
    assert len(log) <= CAP + MARK_MAX and b" bytes cut: output over its 1.0 MB cap]" in log
    assert fleeter.task("t1").cost_usd == pytest.approx(0.25)


def test_what_a_verifier_detached_dies_when_a_crash_left_it_running(
    fleeter,
    fake_claude,
    loops,  # noqa: F811
    tmp_path,
    pids_of,
):
    """The supervisor is SIGKILLed while a verifier holds (after detaching a `setsid
    sleep`): its wrapper dies with the recorded group at the restart, so what it
    detached is found by the marker it carries in its environment and ended too."""
    pidfile, marks = tmp_path / "verifier-pids", tmp_path / "verifier-runs"
    hold = f"while [ ! -e {tmp_path / 'gate'} ]; do sleep 0.05; done"
    one_task(
        fleeter,
        verify=f"echo run >> {marks}; if [ $(grep -c run {marks}) -eq 1 ]; then "
        f"{detach(pidfile)}; {hold}; fi; test -f out.txt",
    )
    fake_claude.script(t1=[{"actions": [["write", "out.txt", "x"]]}])
    fleeter.run("queue", "tasks.toml")
    proc = loops.start("work")
    wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), what="the verifier to detach its sleep")
    loops.sigkill(proc)
    r = fleeter.runsub("work", "--until-idle", timeout=60)
    pids = pids_of(pidfile)
    assert r.ret == 0, r.stdout + r.stderr
    assert fleeter.states() == {"t1": "DONE"}
    assert len(pids) == 1 and not alive(pids[0]), "what the cut-off verifier detached outlived the restart"


def test_what_an_agent_detached_dies_when_its_shepherd_is_killed(
    fleeter,
    fake_claude,
    loops,  # noqa: F811
    tmp_path,
    pids_of,
):
    """A SIGKILLed shepherd can end nothing: the loop, finding it dead, ends its agent's
    group and then every process carrying that shepherd's identity in its environment
    (``FLEETRUN_SHEPHERD``), so the resumed attempt runs alone."""
    pidfile, gate = tmp_path / "agent-pids", tmp_path / "gate"
    one_task(fleeter, extra='allowed_tools = ["Bash"]')
    fake_claude.script(
        t1=[
            {"actions": [["bash", detach(pidfile)], ["bash", f"while [ ! -e {gate} ]; do sleep 0.05; done"]]},
            {"actions": [["write", "out.txt", "x"]]},
        ]
    )
    fleeter.run("queue", "tasks.toml")
    proc = loops.start("work", "--until-idle")
    st = running_agent(fleeter, fake_claude, "t1")
    wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), what="the agent to detach its sleep")
    os.kill(st["shepherd_pid"], signal.SIGKILL)
    out, err = proc.communicate(timeout=60)
    pids = pids_of(pidfile)
    assert proc.returncode == 0, out.decode() + err.decode()
    assert fleeter.states() == {"t1": "DONE"}
    assert len(pids) == 1 and not alive(pids[0]), "what the dead shepherd's agent detached outlived it"

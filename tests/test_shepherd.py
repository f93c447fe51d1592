"""The shepherd runs by path from its source (``python -I -S``), standard library only:
nothing of the package, and no ``subprocess`` (it starts its agent with ``posix_spawn``)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fleetrun import shepherd

#: What the shepherd does without: it cannot import the package (it runs by path), and
#: starts its agent with ``posix_spawn`` on a pty of its own.
EXPENSIVE = {"fleetrun", "subprocess", "pty"}


def imported(adir: Path) -> tuple[str, set[str]]:
    """(what the shepherd ran, the modules it had imported), from its debug list."""
    lines = (adir / shepherd.MODULES).read_text().splitlines()
    return lines[0], set(lines[1:])


def test_a_run_starts_its_shepherd_by_path_from_its_source_with_the_standard_library_only(
    fleeter, fake_claude, monkeypatch
) -> None:
    monkeypatch.setenv(shepherd.DEBUG_ENV, "1")
    fleeter.make_repo()
    fleeter.write_tasks("""
        [[task]]
        name = "t1"
        cwd = "repo"
        prompt = "Write out.txt."
        git_ref = "main"
    """)
    fake_claude.script(t1=[{"actions": [["write", "out.txt", "hello"], ["commit", "add out"]]}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    (adir,) = [p.parent for p in (fleeter.home / "attempts").glob(f"*/{shepherd.MODULES}")]
    ran, modules = imported(adir)
    assert ran == shepherd.SHEPHERD_PATH and ran.endswith(".py"), ran
    assert "json" in modules and "socket" in modules  # the check below means something
    assert not {m.split(".")[0] for m in modules} & EXPENSIVE, sorted(modules & EXPENSIVE)
    status = json.loads((adir / shepherd.STATUS).read_text())
    assert status["state"] == "ended" and status["exit_code"] == 0


def run_shepherd(adir: Path, spec: dict, code: str) -> subprocess.CompletedProcess:
    adir.mkdir(mode=0o700)
    (adir / shepherd.SPEC).write_text(json.dumps(spec))
    env = dict(os.environ, **{shepherd.DEBUG_ENV: "1"})
    return subprocess.run(
        [sys.executable, "-I", "-S", code, str(adir)],
        env=env,
        timeout=60,
        stdin=subprocess.DEVNULL,
        capture_output=True,
    )


def test_the_shepherd_runs_an_agent_on_a_pty_and_wakes_the_loop(tmp_path: Path) -> None:
    """The agent found on the spec's PATH (not ours) in its folder, its input from a file,
    its output on a pty into the log, its end in the status and on the loop's socket."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    agent = bindir / "agent"
    agent.write_text('#!/bin/sh\nread line; test -t 1 && echo "tty $line in $(pwd)"; exit 3\n')
    agent.chmod(0o700)
    (tmp_path / "prompt").write_text("hello\n")
    sock_path = str(tmp_path / "loop.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(sock_path)
        sock.settimeout(30)
        code = shepherd.SHEPHERD_PATH
        adir = tmp_path / "a1"
        spec = {
            "attempt_id": "a1",
            "argv": ["agent"],
            "cwd": str(tmp_path),
            "env": {"PATH": f"/usr/bin:/bin:{bindir}"},
            "stdin_file": str(tmp_path / "prompt"),
            "notify": sock_path,
        }
        proc = run_shepherd(adir, spec, code)
        assert proc.returncode == 0, proc.stderr
        assert sock.recv(100) == b"a1"
    st = json.loads((adir / shepherd.STATUS).read_text())
    assert (st["state"], st["exit_code"], st["reason"]) == ("ended", 3, "exited")
    assert (adir / shepherd.LOG).read_text() == f"tty hello in {tmp_path}\n"
    ran, modules = imported(adir)
    assert ran == code and not {m.split(".")[0] for m in modules} & EXPENSIVE, sorted(modules & EXPENSIVE)


@pytest.mark.parametrize(
    "argv, cwd, reason, error",
    [
        (["no-such-agent"], None, "start_failed:agent_not_found", "no-such-agent is not on PATH"),
        (["/etc/passwd"], None, "start_failed:agent_not_found", "/etc/passwd is not executable"),
        (["sh"], "/no/such/folder", "start_failed", "cannot start sh: No such file or directory"),
    ],
)
def test_an_agent_that_cannot_start_is_an_ended_status(tmp_path: Path, argv, cwd, reason, error) -> None:
    proc = run_shepherd(
        tmp_path / "a1",
        {"attempt_id": "a1", "argv": argv, "cwd": cwd, "env": {"PATH": "/usr/bin:/bin"}},
        shepherd.SHEPHERD_PATH,
    )
    assert proc.returncode == 0, proc.stderr
    st = json.loads((tmp_path / "a1" / shepherd.STATUS).read_text())
    assert (st["state"], st["reason"], st["error"], st["agent_pid"]) == ("ended", reason, error, None)


def test_the_host_starts_the_shepherd_by_path_isolated() -> None:
    assert shepherd.shepherd_argv("ADIR") == [sys.executable, "-I", "-S", shepherd.SHEPHERD_PATH, "ADIR"]
    out = subprocess.run(shepherd.shepherd_argv("ADIR")[:-1], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "usage: shepherd.py ATTEMPT_DIR" in out.stderr  # it is the shepherd


def test_a_shepherd_whose_folder_was_removed_ends_with_its_agent(tmp_path: Path) -> None:
    """The end is written again and again on a full disk (the supervisor waits while the
    shepherd lives), but a folder that is gone (``rm -rf`` of the home, a test's tmp dir
    cleaned up) can never take it: the shepherd ends with its agent instead of trying
    once a second for ever."""
    gate = tmp_path / "gate"
    adir = tmp_path / "a1"
    spec = {
        "attempt_id": "a1",
        "argv": ["/bin/sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done"],
        "cwd": str(tmp_path),
        "env": {"PATH": "/usr/bin:/bin"},
    }
    adir.mkdir(mode=0o700)
    (adir / shepherd.SPEC).write_text(json.dumps(spec))
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", shepherd.SHEPHERD_PATH, str(adir)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not (shepherd.read_json(str(adir / shepherd.STATUS)) or {}).get("agent_pid"):
            assert time.monotonic() < deadline, "the agent never started"
            time.sleep(0.05)
        shutil.rmtree(adir)
        gate.touch()
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie has ended)."""
    return shepherd.proc_token(pid) is not None


def kill_pids(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass


#: Five processes, each in a session of its own (out of the agent's process group),
#: one of them deaf to SIGTERM; their pids in ``pids``, then the agent ends.
DETACH_FIVE = (
    "for i in 1 2 3 4; do setsid sh -c 'echo $$ >> pids; exec sleep 3000' >/dev/null 2>&1 </dev/null & done; "
    "setsid sh -c 'trap \"\" TERM; echo $$ >> pids; exec sleep 3000' >/dev/null 2>&1 </dev/null & "
    'while [ "$(wc -l < pids 2>/dev/null || echo 0)" -lt 5 ]; do sleep 0.05; done'
)


def test_nothing_the_agent_detaches_outlives_its_attempt(tmp_path: Path) -> None:
    """Issue 21 item 6: five ``setsid sleep 3000`` the agent started (out of its process
    group, one ignoring SIGTERM) are ended by the shepherd, its child subreaper, before
    it records the end."""
    proc = run_shepherd(
        tmp_path / "a1",
        {
            "attempt_id": "a1",
            "argv": ["/bin/sh", "-c", DETACH_FIVE],
            "cwd": str(tmp_path),
            "env": {"PATH": "/usr/bin:/bin"},
        },
        shepherd.SHEPHERD_PATH,
    )
    pids = [int(line) for line in (tmp_path / "pids").read_text().split()]
    try:
        assert proc.returncode == 0, proc.stderr
        assert len(pids) == 5
        st = json.loads((tmp_path / "a1" / shepherd.STATUS).read_text())
        assert (st["state"], st["exit_code"]) == ("ended", 0)
        assert [p for p in pids if alive(p)] == []
    finally:
        kill_pids(pids)


def test_an_agents_flood_is_cut_to_its_cap_head_and_tail_kept(tmp_path: Path) -> None:
    """Issue 21 item 5: 50 MB on the agent's stderr leaves a log of the cap (plus the
    marker), its first and last lines kept, and the status says how much was cut."""
    cap = 1_000_000
    flood = "echo FIRST; head -c 50000000 /dev/zero | tr '\\0' x >&2; echo; echo LAST"
    proc = run_shepherd(
        tmp_path / "a1",
        {
            "attempt_id": "a1",
            "argv": ["/bin/sh", "-c", flood],
            "cwd": str(tmp_path),
            "env": {"PATH": "/usr/bin:/bin"},
            "max_output": cap,
        },
        shepherd.SHEPHERD_PATH,
    )
    assert proc.returncode == 0, proc.stderr
    log = (tmp_path / "a1" / shepherd.LOG).read_bytes()
    assert len(log) <= cap + 100, len(log)
    assert log.startswith(b"FIRST\n") and log.endswith(b"x\nLAST\n")
    assert b"[fleetrun: 49,000,012 bytes cut: output over its 1.0 MB cap]" in log
    st = json.loads((tmp_path / "a1" / shepherd.STATUS).read_text())
    assert st["state"] == "ended" and st["log_cut"] == 50_000_012 - cap and st["log_cap"] == cap


def test_a_cut_log_can_be_followed_while_the_agent_runs(tmp_path: Path) -> None:
    """While the agent floods, the log holds the head as it came (what ``logs -f``
    follows: the file only grows), and the marker and the tail come at the end."""
    cap, gate = 1_000_000, tmp_path / "gate"
    flood = f"echo FIRST; head -c 5000000 /dev/zero; while [ ! -e {gate} ]; do sleep 0.05; done; echo; echo LAST"
    adir = tmp_path / "a1"
    adir.mkdir(mode=0o700)
    (adir / shepherd.SPEC).write_text(
        json.dumps(
            {
                "attempt_id": "a1",
                "argv": ["/bin/sh", "-c", flood],
                "cwd": str(tmp_path),
                "env": {"PATH": "/usr/bin:/bin"},
                "max_output": cap,
            }
        )
    )
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", shepherd.SHEPHERD_PATH, str(adir)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        log = adir / shepherd.LOG
        deadline = time.monotonic() + 120
        while not (log.exists() and log.stat().st_size >= cap // 2):
            assert time.monotonic() < deadline, "the head never reached the log"
            time.sleep(0.05)
        assert log.read_bytes()[:6] == b"FIRST\n" and log.stat().st_size == cap // 2
        gate.touch()
        assert proc.wait(timeout=120) == 0
        data = log.read_bytes()
        assert data.startswith(b"FIRST\n") and data.endswith(b"\nLAST\n") and b"bytes cut: output over" in data
        assert len(data) <= cap + 100
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("second_while", ["running", "ended"])
def test_a_second_shepherd_of_an_attempt_starts_nothing(tmp_path: Path, second_while: str) -> None:
    """Never twice: a scheduler may run a job's script a second time (measured with
    Slurm: a controller killed hard just after a submit ran it again 6 s later, even with
    ``--no-requeue``). A shepherd started in a folder whose status says the attempt
    already started or ended runs nothing and leaves the status as it was."""
    runs = tmp_path / "runs"
    gate = tmp_path / "gate"
    agent = tmp_path / "agent"
    agent.write_text(f"#!/bin/sh\necho run >> {runs}\nwhile [ ! -e {gate} ]; do sleep 0.05; done\n")
    agent.chmod(0o700)
    adir = tmp_path / "a1"
    adir.mkdir(mode=0o700)
    (adir / shepherd.SPEC).write_text(json.dumps({"attempt_id": "a1", "argv": [str(agent)], "cwd": str(tmp_path)}))
    argv = [sys.executable, "-I", "-S", shepherd.SHEPHERD_PATH, str(adir)]
    first = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120  # bounds a hang only
        while not (runs.exists() and json.loads((adir / shepherd.STATUS).read_text())["state"] == "running"):
            assert time.monotonic() < deadline and first.poll() is None
            time.sleep(0.02)
        if second_while == "ended":
            gate.touch()
            first.wait(timeout=120)
        before = (adir / shepherd.STATUS).read_bytes()
        second = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
        assert second.returncode == 0, second.stderr
        assert "already" in second.stderr, second.stderr
        assert (adir / shepherd.STATUS).read_bytes() == before
        gate.touch()
        first.wait(timeout=120)
    finally:
        gate.touch()
        if first.poll() is None:
            first.kill()
            first.wait()
    assert runs.read_text() == "run\n"  # the agent ran once
    assert json.loads((adir / shepherd.STATUS).read_text())["state"] == "ended"


def test_the_end_wakes_the_loop_before_its_fsync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The end is renamed into place, the loop (or a peer's worker) woken, and only then
    fsynced, the file and its folder: whoever waits reads it at once, not after the disk
    (docs/durability.md argues a power cut in between). Checked in-process at each fsync:
    the datagram is there already, and status.json says the end."""
    adir = tmp_path / "a1"
    adir.mkdir()
    sock_path = str(tmp_path / "loop.sock")
    (adir / shepherd.SPEC).write_text(json.dumps({"attempt_id": "a1", "argv": ["true"], "notify": sock_path}))
    synced: list[tuple[str, bytes, object]] = []
    real_fsync = os.fsync
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(sock_path)
        sock.setblocking(False)

        def fsync(fd: int) -> None:
            try:
                heard = sock.recv(100)
            except BlockingIOError:
                heard = b""
            state = shepherd.read_json(str(adir / shepherd.STATUS)) or {}
            synced.append(("folder" if os.path.isdir(f"/proc/self/fd/{fd}") else "file", heard, state.get("state")))
            if heard:  # the next fsync must see it too
                sock.sendto(heard, sock_path)
            real_fsync(fd)

        monkeypatch.setattr(os, "fsync", fsync)
        sh = shepherd.Shepherd(str(adir))
        sh.status.update(state="ended", reason="exited", exit_code=0, ended=time.time())
        sh.end()
        monkeypatch.undo()
        assert synced == [("file", b"a1", "ended"), ("folder", b"a1", "ended")]
        assert sock.recv(100) == b"a1"
        with pytest.raises(BlockingIOError):  # woken once
            sock.recv(100)

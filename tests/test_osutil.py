"""fleetrun.osutil with real processes: a lock held by another process, a process group
ended, a detached child that outlives the process that started it."""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fleetrun import osutil, shepherd
from fleetrun.osutil import FileLock, LockHeld, end_group, proc_token, spawn_detached

HOLDER = """
import sys
from fleetrun.osutil import FileLock
with FileLock(sys.argv[1]):
    print("locked", flush=True)
    sys.stdin.read()  # hold it until the test closes our stdin
"""


def wait_until(cond: object, timeout: float = 120.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return True
        time.sleep(0.02)
    return False


def alive(pid: int) -> bool:
    return proc_token(pid) is not None


def reap(proc: subprocess.Popen) -> int:  # type: ignore[type-arg]
    """Wait for a child and close its pipes (tests run with warnings as errors)."""
    code = proc.wait(10)
    for f in (proc.stdin, proc.stdout):
        if f is not None:
            f.close()
    return code


def test_osutil_imports_only_the_standard_library() -> None:
    tree = ast.parse(Path(osutil.__file__).read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [("." * n.level) + (n.module or "") for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    ours = [m for m in names if m.startswith(".") or m.split(".")[0] == "fleetrun"]
    assert ours == [] and set(names) <= set(sys.stdlib_module_names) | {"__future__", "collections.abc"} | {"psutil"}, (
        names
    )


def test_process_groups_are_signalled_by_end_group_alone() -> None:
    """One helper ends a process group: ``osutil.end_group`` (the peer's verifier runner
    loads it by path). The shepherd, run by path, keeps the one allowed copy: its run
    loop owns the grace, so that the log is copied while the agent ends."""
    package = Path(osutil.__file__).parent
    allowed = {package / "osutil.py", package / "shepherd.py"}
    calls = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "killpg" and path not in allowed:
                calls.append(f"{path.relative_to(package)}:{node.lineno}")
    assert calls == [], calls


# -- locks ------------------------------------------------------------------------------


def test_a_lock_held_by_another_process(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        assert path.stat().st_mode & 0o777 == 0o600

        nb = FileLock(path, blocking=False)
        assert nb.acquire() is False and not nb.held
        with pytest.raises(LockHeld), nb:
            pass

        got = threading.Event()

        def take() -> None:
            with FileLock(path):
                got.set()

        t = threading.Thread(target=take)
        t.start()
        assert not got.wait(0.5)  # the blocking form waits for the holder...
        assert holder.stdin is not None
        holder.stdin.close()
        assert got.wait(10)  # ...and gets it when the holder lets go
        t.join(10)
    finally:
        holder.kill()
        reap(holder)
    with FileLock(path, blocking=False) as lock:  # free now
        assert lock.held and lock.fd is not None
        os.pwrite(lock.fd, b"mine", 0)  # read-write, for a holder that records itself
    assert not lock.held
    assert path.read_bytes() == b"mine"


def test_a_lock_goes_with_its_holder_when_it_dies(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
    holder.kill()
    reap(holder)
    lock = FileLock(path, blocking=False)
    assert lock.acquire()
    lock.release()
    lock.release()  # safe to repeat


# -- process groups -----------------------------------------------------------------------


def start_group(script: str) -> tuple[subprocess.Popen[bytes], list[int]]:
    """A shell in a session of its own, with a background child; :return: both pids."""
    proc = subprocess.Popen(
        ["/bin/sh", "-c", f"{script}; sleep 60 & echo $!; wait"], stdout=subprocess.PIPE, start_new_session=True
    )
    assert proc.stdout is not None
    child = int(proc.stdout.readline())
    return proc, [proc.pid, child]


def test_end_group_ends_the_whole_group() -> None:
    proc, pids = start_group("true")
    assert all(alive(p) for p in pids)
    t0 = time.monotonic()
    assert end_group(proc.pid, None, grace_s=5.0) is True
    assert time.monotonic() - t0 < 4.0  # SIGTERM was enough: no wait for the grace
    proc.poll()
    assert proc.returncode == -signal.SIGTERM
    reap(proc)
    assert wait_until(lambda: not any(alive(p) for p in pids))


def test_end_group_kills_a_group_that_ignores_sigterm() -> None:
    proc, pids = start_group("trap '' TERM")
    t0 = time.monotonic()
    assert end_group(proc.pid, proc_token(proc.pid), grace_s=0.5) is True
    assert time.monotonic() - t0 >= 0.5
    assert reap(proc) == -signal.SIGKILL
    assert wait_until(lambda: not any(alive(p) for p in pids))


def test_end_group_with_no_grace_is_one_sigkill() -> None:
    proc, pids = start_group("trap '' TERM")
    assert end_group(proc.pid, proc_token(proc.pid), grace_s=0) is True
    assert reap(proc) == -signal.SIGKILL
    assert wait_until(lambda: not any(alive(p) for p in pids))


def test_end_group_kills_what_is_left_when_the_leader_has_ended() -> None:
    """The leader ended (a zombie not yet reaped): its group is ended all the same."""
    proc = subprocess.Popen(["/bin/sh", "-c", "sleep 60 & echo $!"], stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout is not None
    child = int(proc.stdout.readline())
    assert wait_until(lambda: proc_token(proc.pid) is None)  # a zombie now
    assert alive(child)
    assert end_group(proc.pid, None, grace_s=1.0) is True
    assert wait_until(lambda: not alive(child))
    reap(proc)


def test_a_reused_pid_is_left_alone() -> None:
    proc, pids = start_group("true")
    try:
        assert end_group(proc.pid, "linux:1", grace_s=0) is False  # not the process we started
        assert end_group(proc.pid, "", grace_s=0) is False
        time.sleep(0.1)
        assert all(alive(p) for p in pids)
    finally:
        end_group(proc.pid, None, grace_s=0)
        reap(proc)


@pytest.mark.parametrize("pid", [0, -1, 1 << 22, True, "123", None, 1.5])
def test_end_group_refuses_what_is_not_a_pid(pid: object) -> None:
    # killpg(0) would be our own group
    assert end_group(pid, None, grace_s=0) is False


def test_the_shepherd_computes_the_same_token() -> None:
    """The shepherd keeps its own copy (it cannot import the package): they must agree."""
    proc = subprocess.Popen(["sleep", "60"])
    try:
        for pid in (os.getpid(), proc.pid, 1 << 21):
            assert osutil.proc_token(pid) == shepherd.proc_token(pid)
        assert proc_token(proc.pid) is not None
    finally:
        proc.kill()
        proc.wait()
    assert proc_token(proc.pid) is None == shepherd.proc_token(proc.pid)


# -- detached spawn ------------------------------------------------------------------------

PARENT = """
import os, sys
from fleetrun.osutil import spawn_detached
child = ("import os, sys, time; print(os.getpid(), os.getsid(0), os.getpgid(0), repr(sys.stdin.read()), "
         "os.environ.get('ONLY'), flush=True); print('to stderr', file=sys.stderr, flush=True); time.sleep(60)")
pid = spawn_detached([sys.executable, "-c", child], {"ONLY": "this", "PATH": os.environ["PATH"]}, sys.argv[1])
print(pid, flush=True)
"""


def test_a_detached_child_outlives_its_parent(tmp_path: Path) -> None:
    out = tmp_path / "child.out"
    parent = subprocess.run(
        [sys.executable, "-c", PARENT, str(out)], capture_output=True, text=True, timeout=30, start_new_session=True
    )
    assert parent.returncode == 0, parent.stderr
    pid = int(parent.stdout)
    token = proc_token(pid)
    try:
        assert token is not None  # the parent is gone; the child runs on
        assert wait_until(lambda: out.exists() and "to stderr" in out.read_text())
        got_pid, sid, pgid, stdin, only = out.read_text().splitlines()[0].split()
        assert int(got_pid) == pid and int(sid) == pid and int(pgid) == pid  # a session of its own
        assert stdin == "''"  # /dev/null
        assert only == "this"  # the environment given, nothing else
        assert out.stat().st_mode & 0o777 == 0o600
    finally:
        assert end_group(pid, token, grace_s=2.0)
    assert wait_until(lambda: not alive(pid))


def test_detached_output_is_appended(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.write_text("before\n")
    pid = spawn_detached(["/bin/sh", "-c", "echo after"], {}, out)
    os.waitpid(pid, 0)
    assert out.read_text() == "before\nafter\n"


def test_spawn_detached_raises_when_it_cannot_start(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        spawn_detached([str(tmp_path / "no-such-program")], {}, tmp_path / "out")

"""The detached runner of one ``run`` verifier on a peer, run by path as
``python -I -S verify_runner.py DIR`` (as the shepherd is): standard library only and
nothing of the package.

It runs the command under ``/bin/sh -c`` in the worktree, the timeout enforced here
(so a dropped link cannot leave it running), and writes the verdict to ``result.json``.
The command runs under the wrapper of :mod:`fleetrun.capped` (its path named in the
spec), as a local verifier does: the output goes to ``out`` cut to this
peer's ``[output] max_bytes`` (the verdict says ``output cut``), and whatever the command
detaches is ended when it ends.

It starts the command with ``os.posix_spawn`` and waits on a pidfd (or a short poll),
which is all it would use of ``subprocess``. Ending the command's process group is
``fleetrun/osutil.py``'s :func:`end_group` (standard library only), loaded by path.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import time
from typing import Any

KEEP_BYTES = 64 * 1024  # the output's tail kept in the verdict (procutil.KEEP_BYTES)
MAX_OUTPUT = 20_000_000  # fleetrun.capped.DEFAULT_MAX_BYTES, when the spec names none
MIN_OUTPUT = 4096  # fleetrun.capped.MIN_MAX_BYTES
GRACE_S = 2.0  # after SIGTERM, the verifier's group gets this long before SIGKILL
#: The package's ``osutil.py``: this file is ``fleetrun/plugins/relay/peer/verify_runner.py``.
OSUTIL = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))), "osutil.py"
)
#: Set (not ``0``) in its environment: the runner lists what it imported in MODULES
#: (the shepherd's switch: one for both detached helpers).
DEBUG_ENV = "FLEETRUN_SHEPHERD_DEBUG"
MODULES = "runner.modules"


def _osutil() -> Any:
    """``fleetrun/osutil.py``, loaded by path (the package is not importable here)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("fleetrun_osutil_for_runner", OSUTIL)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _read_json(path: str) -> object:
    """The JSON value in ``path``, or None."""
    try:
        with open(path, "rb") as f:
            return json.loads(f.read())
    except (OSError, ValueError):
        return None


def _write_json(path: str, data: dict) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = memoryview(json.dumps(data).encode())
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)  # the verdict: its one record until the supervisor has read it
    finally:
        os.close(fd)
    os.replace(tmp, path)


def tail_text(path: str, limit: int = KEEP_BYTES) -> str:
    """The last ``limit`` bytes of a file, cut on a UTF-8 character boundary
    (``procutil.tail_text``)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - limit))
            data = f.read()
    except OSError:
        return ""
    if size > limit:
        i = 0
        while i < len(data) and i < 4 and (data[i] & 0xC0) == 0x80:
            i += 1
        data = data[i:]
    return data.decode("utf-8", "replace")


def _spawn(argv: list[str], cwd: str, env: dict) -> int:
    """``argv`` (the wrapper, which runs ``/bin/sh -c text``) in ``cwd``, in a session of
    its own, its input /dev/null, its output ours (``runner.out``: the wrapper says
    nothing unless it breaks), SIGPIPE and SIGXFSZ back to their defaults, none of our
    files open in it (ours are all close-on-exec); what ``subprocess.Popen`` with
    ``start_new_session=True`` did. ``posix_spawn`` cannot change folder: this process
    changes into ``cwd`` first, and back.

    :raises OSError: no such folder, or no interpreter.
    """
    here = os.getcwd()
    stdin = os.open(os.devnull, os.O_RDONLY)
    try:
        os.chdir(cwd)
        actions = [(os.POSIX_SPAWN_DUP2, stdin, 0)]
        return os.posix_spawn(
            argv[0],
            argv,
            env,
            file_actions=actions,
            setsid=True,
            setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),
        )
    finally:
        os.close(stdin)
        os.chdir(here)


def _read_cut(out: str) -> tuple[int, int] | None:
    """(bytes cut, the cap) the wrapper wrote beside ``out`` (``fleetrun.capped.read_cut``)."""
    try:
        with open(out + ".cut") as f:
            cut, cap = f.read().split()
        return int(cut), int(cap)
    except (OSError, ValueError):
        return None


def _size_text(n: int) -> str:
    """A copy of ``fleetrun.capped.size_text``."""
    for unit, name in ((10**9, "GB"), (10**6, "MB"), (10**3, "kB")):
        if n >= unit:
            value = n / unit
            return f"{value:.1f} {name}" if value < 10 else f"{value:.0f} {name}"
    return f"{n} bytes"


def _poll(pid: int) -> int | None:
    """The verifier's exit code (minus the signal that ended it), or None while it runs."""
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # pragma: no cover - reaped already
        return -9
    return os.waitstatus_to_exitcode(status) if done else None


def verify_runner(vdir: str) -> int:
    """Run the verifier of ``vdir/spec.json``; its verdict goes to ``vdir/result.json``."""
    spec = _read_json(os.path.join(vdir, "spec.json"))
    if not isinstance(spec, dict):
        return 2
    started = time.monotonic()
    timeout_s = float(spec["timeout_s"])
    out = os.path.join(vdir, "out")

    def finish(passed: bool, reason: str) -> int:
        cut = _read_cut(out)
        if cut:  # the flood is this verifier's to answer for, in its own verdict
            reason = f"{reason}; output cut: {_size_text(cut[0])} over the {_size_text(cut[1])} cap"
        _write_json(
            os.path.join(vdir, "result.json"),
            {
                "passed": passed,
                "reason": reason,
                "output": tail_text(out),
                "duration_s": time.monotonic() - started,
                "ended": time.time(),
            },
        )
        return 0

    env = dict(os.environ)
    env.update({str(k): str(v) for k, v in (spec.get("env") or {}).items()})
    max_bytes = spec.get("max_output")
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < MIN_OUTPUT:
        max_bytes = MAX_OUTPUT
    wrapper = spec.get("wrapper")
    if not isinstance(wrapper, str) or not wrapper:
        return finish(False, "cannot start: the spec names no output wrapper")
    argv = [sys.executable, "-I", "-S", wrapper, str(max_bytes), out, "--", "/bin/sh", "-c", str(spec["text"])]
    try:
        pid = _spawn(argv, str(spec["cwd"]), env)
    except OSError as e:
        return finish(False, f"cannot start: {e.strerror or e}")
    rfd, wfd = os.pipe()  # a SIGTERM wakes the wait below
    os.set_blocking(rfd, False)
    os.set_blocking(wfd, False)
    signal.set_wakeup_fd(wfd)
    stopped: list[str] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopped.append("stopped"))
    try:
        pidfd = os.pidfd_open(pid)  # readable the moment it exits
    except (AttributeError, OSError):
        pidfd = -1
    deadline = started + timeout_s
    timed_out = False
    end_group = _osutil().end_group
    while True:
        code = _poll(pid)
        if code is not None:
            break
        now = time.monotonic()
        if stopped or now >= deadline:
            timed_out = not stopped
            end_group(pid, None, GRACE_S)  # SIGTERM, the grace, SIGKILL: the leader has ended
            code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            break
        wait = deadline - now
        if pidfd < 0:
            wait = min(wait, 0.02)
        try:
            ready, _, _ = select.select([rfd] + ([pidfd] if pidfd >= 0 else []), [], [], max(0.001, wait))
        except InterruptedError:  # pragma: no cover
            ready = []
        if rfd in ready:
            try:
                os.read(rfd, 512)
            except OSError:
                pass
    end_group(pid, None, grace_s=0)  # leftovers of the group
    if timed_out:
        return finish(False, f"timed out after {timeout_s:g}s")
    if stopped:
        return finish(False, "stopped by the supervisor")
    if code == 0:
        return finish(True, "exit code 0")
    if code < 0:
        return finish(False, f"killed by signal {-code}")
    return finish(False, f"exit code {code}")


def _write_modules(vdir: str) -> None:
    """The debug list of what this process imported (``DEBUG_ENV``)."""
    try:
        main = sys.modules["__main__"]
        text = "\n".join([str(getattr(main, "__file__", "")), *sorted(sys.modules)]) + "\n"
        fd = os.open(os.path.join(vdir, MODULES), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
    except OSError:
        pass


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(
            "usage: python -I -S verify_runner.py DIR (fleetrun host verify-start starts it)",
            file=sys.stderr,
        )
        return 2
    try:
        return verify_runner(argv[0])
    finally:
        if os.environ.get(DEBUG_ENV, "0") != "0":
            _write_modules(os.path.abspath(argv[0]))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

"""The detached runner of one ``run`` verifier on a peer, run by path as
``python -I -S verify_runner.py DIR`` (as the shepherd is): standard library only and
nothing of the package, so it starts in a few milliseconds instead of the ~100 ms a
``python -m fleetrun...`` start takes (site, the package's imports), which a peer task
paid between VERIFYING and its verdict.

It runs the command under ``/bin/sh -c`` in the worktree, output to a file, the
timeout enforced here (so a dropped link cannot leave it running), and writes the
verdict to ``result.json``. The process-group ending is ``fleetrun/osutil.py``'s own
(stdlib only), loaded by path.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

KEEP_BYTES = 64 * 1024  # the output's tail kept in the verdict (procutil.KEEP_BYTES)
OSUTIL = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))),
                      "osutil.py")


def _osutil() -> Any:
    """``fleetrun/osutil.py``, loaded by path (the package is not importable here)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("fleetrun_osutil_for_runner", OSUTIL)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _read_json(path: str) -> Any:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _write_json(path: str, data: dict[str, Any]) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
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


def verify_runner(vdir: str) -> int:
    """Run the verifier of ``vdir/spec.json``; its verdict goes to ``vdir/result.json``."""
    spec = _read_json(os.path.join(vdir, "spec.json"))
    if not isinstance(spec, dict):
        return 2
    started = time.monotonic()
    timeout_s = float(spec["timeout_s"])
    stopped: list[str] = []
    out = os.path.join(vdir, "out")

    def finish(passed: bool, reason: str) -> int:
        _write_json(os.path.join(vdir, "result.json"),
                    {"passed": passed, "reason": reason, "output": tail_text(out),
                     "duration_s": time.monotonic() - started, "ended": time.time()})
        return 0

    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        proc = subprocess.Popen(["/bin/sh", "-c", spec["text"]], cwd=spec["cwd"],
                                env=dict(os.environ, **(spec.get("env") or {})),
                                stdin=subprocess.DEVNULL, stdout=fd, stderr=fd, start_new_session=True,
                                close_fds=True)
    except OSError as e:
        return finish(False, f"cannot start: {e.strerror or e}")
    finally:
        os.close(fd)
    end_group = _osutil().end_group

    def kill_group() -> None:
        end_group(proc.pid, None, grace_s=2.0)  # the wait below reaps it

    def on_term(signum: int, frame: object) -> None:
        stopped.append("stopped")
        kill_group()

    signal.signal(signal.SIGTERM, on_term)
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_group()
        proc.wait()
        return finish(False, f"timed out after {timeout_s:g}s")
    end_group(proc.pid, None, grace_s=0)  # leftovers of the group
    if stopped:
        return finish(False, "stopped by the supervisor")
    if code == 0:
        return finish(True, "exit code 0")
    if code < 0:
        return finish(False, f"killed by signal {-code}")
    return finish(False, f"exit code {code}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -I -S verify_runner.py DIR (fleetrun host verify-start starts it)")
    raise SystemExit(verify_runner(sys.argv[1]))

"""Built-in ``verify_run`` plugin: ``run = "cmd"`` verifiers.

The command runs with ``/bin/sh -c`` in the attempt's workspace (it is the user's own
command line; names and prompts never reach it). Its output goes to a file in the
attempt folder while it runs (so a large output can never fill a pipe and deadlock),
and the last 64 KiB is kept with the verdict. The exit code is the verdict; a timeout
or a command that cannot start is a FAIL with that reason.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any, Optional

from ..hookimpl import hookimpl
from ..hosts import forget_child, record_child
from ..procutil import end_group, tail_text
from ..reports import Verdict


class RunHandle:
    """A running ``run`` verifier; ``poll()`` gives the Verdict once it has ended."""

    def __init__(self, verifier: Any, cwd: str, out_path: Path, env: dict[str, str], host: str = "local") -> None:
        self.verifier = verifier
        self.out_path = out_path
        self.host = host
        self.started = time.monotonic()
        self.deadline = self.started + float(verifier.timeout_s)
        self.verdict: Optional[Verdict] = None
        self._pidfd: Optional[int] = None
        fd = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            self.proc: Optional[subprocess.Popen[bytes]] = subprocess.Popen(
                ["/bin/sh", "-c", verifier.text], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                stdout=fd, stderr=fd, start_new_session=True, close_fds=True,
            )
        except OSError as e:
            self.proc = None
            self.verdict = self._make(False, f"cannot start: {e.strerror or e}")
        finally:
            os.close(fd)
        if self.proc is not None:
            # a restarted supervisor ends it before running the verifier again
            record_child(out_path.parent, out_path.stem, self.proc.pid)
        if self.proc is not None and hasattr(os, "pidfd_open"):
            try:
                self._pidfd = os.pidfd_open(self.proc.pid)
            except OSError:
                self._pidfd = None

    def fileno(self) -> int:
        """Readable when the command has ended (Linux pidfd), for the loop's select."""
        return self._pidfd if self._pidfd is not None else -1

    def _make(self, passed: bool, reason: str) -> Verdict:
        return Verdict(passed=passed, kind="run", label=self.verifier.label, reason=reason,
                       output=tail_text(self.out_path), duration_s=time.monotonic() - self.started,
                       host=self.host)

    def _close(self) -> None:
        if self.proc is not None and self.proc.returncode is not None:
            forget_child(self.out_path.parent, self.out_path.stem)
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None

    def poll(self) -> Optional[Verdict]:
        if self.verdict is not None or self.proc is None:
            self._close()
            return self.verdict
        code = self.proc.poll()
        if code is None:
            if time.monotonic() < self.deadline:
                return None
            self._kill()
            self.verdict = self._make(False, f"timed out after {self.verifier.timeout_s:g}s")
        elif code == 0:
            self.verdict = self._make(True, "exit code 0")
        elif code < 0:
            self.verdict = self._make(False, f"killed by signal {-code}")
        else:
            self.verdict = self._make(False, f"exit code {code}")
        self._close()
        return self.verdict

    def next_deadline(self) -> float:
        return self.deadline

    def _kill(self) -> None:
        assert self.proc is not None
        end_group(self.proc)

    def cancel(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self._kill()
        self._close()


def verifier_env(task: Any, attempt: Any, workspace: Any) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        FLEETRUN_TASK_ID=task.id, FLEETRUN_TASK_NAME=task.name, FLEETRUN_ATTEMPT=str(attempt.number),
        FLEETRUN_WORKTREE=workspace.path,
    )
    return env


@hookimpl(trylast=True)
def fleetrun_verify(task: Any, verifier: Any, workspace: Any, attempt: Any, config: Any) -> Optional[RunHandle]:
    if verifier.kind != "run":
        return None
    adir = config.home / "attempts" / attempt.id
    adir.mkdir(parents=True, exist_ok=True, mode=0o700)
    idx = task.spec.verify.index(verifier) if verifier in task.spec.verify else 0
    return RunHandle(verifier, workspace.path, adir / f"verify-{idx + 1}.out", verifier_env(task, attempt, workspace))

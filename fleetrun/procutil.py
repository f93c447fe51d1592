"""Running processes for an attempt: :func:`task_env` (the environment every agent and
verifier gets) and :class:`ProcessHandle` (a verifier's process group, for the loop to
poll), both public (``fleetrun.task_env``, ``fleetrun.ProcessHandle``); output tails.

The operating-system parts (locks, ending a group, detached spawn) are
:mod:`fleetrun.osutil`."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from .capped import CUT_SUFFIX, DEFAULT_MAX_BYTES, cut_note, read_cut
from .osutil import end_group
from .reports import Verdict, Workspace

if TYPE_CHECKING:
    from .ledger import Attempt, Task

KEEP_BYTES = 64 * 1024
#: The wrapper every verifier runs under, by path (:mod:`fleetrun.capped`).
CAPPED_PATH = str(Path(__file__).with_name("capped.py"))

#: How a host forks the wrapper rather than start an interpreter for it
#: (:meth:`fleetrun.hosts.LocalHost.start_capped`): ``(max_bytes, out, argv, cwd, env,
#: stdin path)`` -> (its pid, the read end of the pipe its exit code comes through), or
#: None to start it by path. Raises ``OSError`` when it cannot start.
CappedStart = Callable[[int, str, list[str], str, Mapping[str, str], Optional[str]], Optional[tuple[int, int]]]


class ForkedWrapper:
    """The capped wrapper a host's starter forked for a verifier: what ``Popen`` gives of
    a child of ours (``pid``, ``poll()``, ``returncode``), for one that is not: its exit
    code is the line it writes to a pipe only it holds (:func:`fleetrun.shepherd._fork_capped`),
    once what it ran and everything that left behind it have ended; the pipe's end with no
    line is a wrapper killed (``SIGKILL``: nothing else stops it before it writes).

    :ivar token: its identity (:func:`fleetrun.osutil.proc_token`), to end its group by
        (its pid is not ours to vouch for: the starter reaps it).
    """

    def __init__(self, pid: int, status_fd: int) -> None:
        from .osutil import proc_token

        self.pid = pid
        self.fd = status_fd
        os.set_blocking(status_fd, False)
        self.token = proc_token(pid)
        self.returncode: Optional[int] = None
        self._buf = b""

    def fileno(self) -> int:
        """Readable once it has ended (its line, or the pipe's end); -1 once closed."""
        return self.fd

    def poll(self) -> Optional[int]:
        """Its exit code once it has ended (minus a signal), else None."""
        if self.returncode is not None or self.fd < 0:
            return self.returncode
        while b"\n" not in self._buf:
            try:
                chunk = os.read(self.fd, 64)
            except BlockingIOError:
                return None
            except OSError:
                chunk = b""
            if not chunk:
                break
            self._buf += chunk
        line, newline, _ = self._buf.partition(b"\n")
        # strictly what the wrapper writes: a line, an exit code or minus a signal's number
        try:
            code: Optional[int] = int(line) if newline and len(line) <= 4 else None
        except ValueError:
            code = None
        self.returncode = code if code is not None and -64 <= code <= 255 else -int(signal.SIGKILL)
        return self.returncode

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def tail_text(path: Path, limit: int = KEEP_BYTES) -> str:
    """The last ``limit`` bytes of a file, cut on a UTF-8 character boundary."""
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


def task_env(
    task: Task, attempt: Attempt, workspace: Workspace | str, base: Optional[Mapping[str, str]] = None, **extra: str
) -> dict[str, str]:
    """The environment an agent or a verifier of an attempt runs with: ``base`` plus
    ``FLEETRUN_TASK_ID``, ``FLEETRUN_TASK_NAME``, ``FLEETRUN_ATTEMPT`` (its number)
    and ``FLEETRUN_WORKTREE`` (the workspace's path), then ``extra``.

    :param task: the task (its ``id`` and ``name``).
    :param attempt: the attempt (its ``number``).
    :param workspace: the attempt's workspace, or its path.
    :param base: what to start from; None (the default) for fleetrun's own environment
        (``os.environ``), ``{}`` for fleetrun's variables alone (what a spec file
        records for a process that inherits the rest where it runs).
    :param extra: more variables, which win (``FLEETRUN_VERIFIER="agent"``).
    :return: a new dict.
    """
    env = dict(os.environ if base is None else base)
    env.update(
        FLEETRUN_TASK_ID=task.id,
        FLEETRUN_TASK_NAME=task.name,
        FLEETRUN_ATTEMPT=str(attempt.number),
        FLEETRUN_WORKTREE=workspace if isinstance(workspace, str) else workspace.path,
    )
    env.update(extra)
    return env


class ProcessHandle:
    """A verifier running as a child process group, for the loop to poll.

    The child runs under the wrapper of :mod:`fleetrun.capped` (the group's leader): its
    output goes to ``out_path`` (never to us through a pipe: no deadlock on large output)
    cut to ``max_bytes`` (``[output] max_bytes``; head and tail kept, see
    :meth:`output_cut`), and whatever it detaches is ended when it ends; its process group
    is recorded in the attempt folder, so a restarted supervisor ends it before running the
    step again; ``fileno()`` is a pidfd the loop can select on. Subclasses say what the
    end means: :meth:`ended`, :meth:`timed_out`, :meth:`cannot_start`. It is a
    :class:`~fleetrun.reports.VerifyHandle` with every optional method (``cancel``,
    ``fileno``, ``next_deadline``).

    :param start: how the host forks the wrapper (:data:`CappedStart`, a
        :class:`~fleetrun.hosts.LocalHost`'s ``start_capped``): the wrapper is then the
        host's starter's child (a :class:`ForkedWrapper`, ``fileno()`` its exit-code
        pipe), not an interpreter started for it; without it, or when it answers None
        (no starter, or it is gone), the wrapper is started by path, our child.
    """

    def __init__(
        self,
        verifier: Any,
        argv: list[str],
        cwd: str,
        env: dict[str, str],
        out_path: Path,
        stdin_path: Optional[Path] = None,
        host: str = "local",
        max_bytes: Optional[int] = None,
        start: Optional[CappedStart] = None,
    ) -> None:
        from .hosts import CHILD_MARKER, forget_child, record_child, record_child_intent

        self.verifier = verifier
        self.out_path = out_path
        self.host = host
        self.started = time.monotonic()
        self.deadline = self.started + float(verifier.timeout_s)
        self.verdict: Optional[Verdict] = None
        self._pidfd: Optional[int] = None
        self.proc: Optional[Union[subprocess.Popen[bytes], ForkedWrapper]] = None
        self.max_bytes = max_bytes or DEFAULT_MAX_BYTES
        # recorded before it starts: a supervisor killed in between still finds it
        marker = record_child_intent(out_path.parent, out_path.stem)
        self.marker = marker
        env = {**env, CHILD_MARKER: marker}
        for stale in (out_path, Path(f"{out_path}{CUT_SUFFIX}")):  # a run before a crash
            try:
                stale.unlink()
            except FileNotFoundError:
                pass
        exe = argv[0] if os.sep in argv[0] else shutil.which(argv[0], path=env.get("PATH", os.defpath))
        try:
            if exe is None or not os.access(exe, os.X_OK):
                raise FileNotFoundError(2, "No such file or directory", argv[0])
            # under the wrapper (fleetrun.capped): the output capped, and every process the
            # command detaches (`setsid sleep &`) ended with it, as its subreaper; forked by
            # the host's starter when it keeps one (no interpreter to start), else by path
            forked = None
            if start is not None:  # the starter's folder is not ours to count on: paths made absolute
                stdin = os.path.abspath(stdin_path) if stdin_path else None
                forked = start(self.max_bytes, os.path.abspath(out_path), argv, os.path.abspath(cwd), env, stdin)
            if forked is not None:
                self.proc = ForkedWrapper(*forked)
            else:
                self._popen(argv, cwd, env, stdin_path)
        except OSError as e:
            forget_child(out_path.parent, out_path.stem)
            self.verdict = self.cannot_start(str(e.strerror or e))
        if self.proc is not None:
            record_child(out_path.parent, out_path.stem, self.proc.pid, marker)
            if hasattr(os, "pidfd_open") and not isinstance(self.proc, ForkedWrapper):
                try:
                    self._pidfd = os.pidfd_open(self.proc.pid)
                except OSError:
                    self._pidfd = None

    def _popen(self, argv: list[str], cwd: str, env: dict[str, str], stdin_path: Optional[Path]) -> None:
        """Start the wrapper by path, our child. :raises OSError: it could not start."""
        with open(stdin_path, "rb") if stdin_path else open(os.devnull, "rb") as stdin:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", CAPPED_PATH, str(self.max_bytes), str(self.out_path), "--", *argv],
                cwd=cwd,
                env=env,
                stdin=stdin,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                close_fds=True,
            )

    def output_cut(self) -> Optional[str]:
        """What the verdict says when the output was cut to its cap (``output cut: 1.0 GB
        over the 20 MB cap``), or None."""
        got = read_cut(str(self.out_path))
        return cut_note(*got) if got else None

    # -- what subclasses decide --------------------------------------------------------

    def cannot_start(self, error: str) -> Verdict:
        raise NotImplementedError

    def timed_out(self) -> Verdict:
        raise NotImplementedError

    def ended(self, code: int) -> Verdict:
        raise NotImplementedError

    # -- the handle the loop polls -----------------------------------------------------

    def fileno(self) -> int:
        """Readable when the child has ended (Linux pidfd; a forked wrapper's exit-code
        pipe), for the loop's select."""
        if isinstance(self.proc, ForkedWrapper):
            return self.proc.fileno()
        return self._pidfd if self._pidfd is not None else -1

    def next_deadline(self) -> float:
        return self.deadline

    def poll(self) -> Optional[Verdict]:
        if self.verdict is not None or self.proc is None:
            self._close()
            return self.verdict
        code = self.proc.poll()
        if code is None:
            if time.monotonic() < self.deadline:
                return None
            self._end()
            self.verdict = self.timed_out()
        else:
            self.verdict = self.ended(code)
        self._close()
        return self.verdict

    def cancel(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self._end()
        self._close()

    def _end(self) -> None:
        """End the group; then what it detached, should a command deaf to SIGTERM have had
        its reaping wrapper SIGKILLed with it (found by the marker it inherited)."""
        from .hosts import kill_marked

        assert self.proc is not None
        # a forked wrapper is the starter's child, not ours: its group is signalled while
        # it is the process that was forked (its token), as a shepherd's would be; one
        # whose token could not be read is not vouched for ("" matches no process)
        end_group(self.proc.pid, (self.proc.token or "") if isinstance(self.proc, ForkedWrapper) else None)
        self.proc.poll()  # reap it: the group is gone (or will be, if it hangs in the kernel)
        kill_marked(self.marker)

    def _close(self) -> None:
        from .hosts import forget_child

        if self.proc is not None and self.proc.returncode is not None:
            forget_child(self.out_path.parent, self.out_path.stem)
            if isinstance(self.proc, ForkedWrapper):
                self.proc.close()
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None

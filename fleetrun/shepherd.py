"""The shepherd: a small detached monitor for one attempt (like conmon for containers).

Run as ``python -I -S shepherd.py ATTEMPT_DIR`` (the file itself, not the package:
:func:`shepherd_argv`), so it imports only the standard library. It reads ``spec.json`` from the
attempt folder, starts the agent with its output on a pty, copies the output to
``log``, enforces the timeout and the stall watchdog, watches for a ``cancel`` file or
SIGTERM, and records everything in ``status.json`` (written atomically: temp file +
rename). It outlives the supervisor, which only reads these files and signals it.

Why a pty for output but a file for input: agents line-buffer on a terminal, so
output arrives as it is made; but a pty's canonical mode cuts input lines at 4096
bytes, so a long prompt goes in from a file, never through the terminal.

Why no ``subprocess``: the agent is started with ``os.posix_spawn`` on a pty of its
own (``os.openpty``), which is what ``subprocess`` would do here, in a few lines.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import time
from collections.abc import Callable  # cheap: re (json) loaded collections, abc names _collections_abc

STATUS = "status.json"
SPEC = "spec.json"
LOG = "log"
#: Where the agent may write the summary handed to its dependents, on whichever machine
#: the shepherd runs (fleetrun.summary reads it; the names are kept here too).
SUMMARY = "summary"
SUMMARY_ENV = "FLEETRUN_SUMMARY_FILE"
#: The shepherd's identity (``PID:TOKEN``) in its agent's environment, inherited by all
#: the agent starts: should the shepherd be SIGKILLed (it can end nothing then), the
#: supervisor finds what the agent detached by it (fleetrun.hosts.kill_environ).
SHEPHERD_ENV = "FLEETRUN_SHEPHERD"
CANCEL = "cancel"
START_LOCK = "start.lock"
GRACE_S = 5.0
#: What the log may hold when the spec names no ``max_output`` (``[output] max_bytes``;
#: fleetrun.capped.DEFAULT_MAX_BYTES, the same number).
MAX_OUTPUT = 20_000_000
MIN_OUTPUT = 4096
PR_SET_CHILD_SUBREAPER = 36
#: Set (not ``0``) in its environment: the shepherd lists what it imported in MODULES.
DEBUG_ENV = "FLEETRUN_SHEPHERD_DEBUG"
MODULES = "shepherd.modules"
#: This file, run by path (it cannot import the package).
SHEPHERD_PATH = os.path.abspath(__file__)


def shepherd_argv(attempt_dir: str) -> list[str]:
    """The command that starts a shepherd for ``attempt_dir``: this interpreter, isolated
    (``-I``: no user site, no environment's ``PYTHON*``) and without ``site`` (``-S``)."""
    return [sys.executable, "-I", "-S", SHEPHERD_PATH, attempt_dir]


# Run by path under ``-I -S``, this file cannot import the package, so it keeps its
# own copies of what fleetrun.osutil holds for everyone else (proc_token, signalling
# a process group, its start lock) and of fleetrun.capped's writer and reaping: keep
# them in step (tests/test_osutil.py checks that the two proc_token agree,
# tests/test_capped.py that the two writers cut a stream alike).


def proc_token(pid: int) -> str | None:
    """An identity for a process that a reused pid does not share (its start time).
    A copy of :func:`fleetrun.osutil.proc_token` (see above)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        if sys.platform.startswith("linux"):
            return None
        try:
            import psutil

            return f"psutil:{psutil.Process(pid).create_time():.3f}"
        except Exception:
            return None
    fields = data[data.rindex(b")") + 2 :].split()
    if fields[0] in (b"Z", b"X"):  # a zombie has ended
        return None
    return "linux:" + fields[19].decode()


class CappedLog:
    """The log under a cap: the first half as it comes, the last half kept in memory and
    written after a marker at the end. A copy of :class:`fleetrun.capped.CappedWriter`
    (see above); a failed write raises ``OSError``."""

    def __init__(self, fd: int, max_bytes: int) -> None:
        self.fd, self.max_bytes = fd, max_bytes
        self.head_left = max_bytes // 2
        self.tail_max = max_bytes - max_bytes // 2
        self.tail = bytearray()
        self.seen = 0

    @property
    def cut(self) -> int:
        return max(0, self.seen - self.tail_max)

    def write(self, data: bytes) -> None:
        if self.head_left > 0:
            head, data = data[: self.head_left], data[self.head_left :]
            self.head_left -= len(head)
            _write_all(self.fd, head)
        if data:
            self.seen += len(data)
            self.tail += data
            if len(self.tail) > self.tail_max + 1_048_576:
                del self.tail[: len(self.tail) - self.tail_max]

    def close(self) -> int:
        tail, self.tail = bytes(self.tail[-self.tail_max :]), bytearray()
        if self.cut:
            tail = (
                f"\n[fleetrun: {self.cut:,} bytes cut: output over its {size_text(self.max_bytes)} cap]\n".encode()
                + tail
            )
        _write_all(self.fd, tail)
        return self.cut


def size_text(n: int) -> str:
    """A copy of :func:`fleetrun.capped.size_text`."""
    for unit, name in ((10**9, "GB"), (10**6, "MB"), (10**3, "kB")):
        if n >= unit:
            value = n / unit
            return f"{value:.1f} {name}" if value < 10 else f"{value:.0f} {name}"
    return f"{n} bytes"


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:  # a short write (a nearly full disk) is not the whole of it
        view = view[os.write(fd, view) :]


def set_subreaper() -> bool:
    """Become the child subreaper (Linux): what the agent detaches stays ours to end.
    A copy of :func:`fleetrun.capped.set_subreaper`."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes  # here, ~3 ms: nothing else of the shepherd needs it

        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def descendants(root: int) -> list[int]:
    """Every live process below ``root``, from ``/proc`` (a copy of
    :func:`fleetrun.capped.descendants`)."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    parent: dict[int, list[int]] = {}
    for name in names:
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    data = f.read()
            except OSError:
                continue
            fields = data[data.rindex(b")") + 2 :].split()
            if fields[0] not in (b"Z", b"X"):
                parent.setdefault(int(fields[1]), []).append(int(name))
    found, todo = [], [root]
    while todo:
        for child in parent.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


def end_descendants(grace_s: float) -> None:
    """SIGTERM to every process below this one, ``grace_s`` for them to go, SIGKILL for
    the rest until none is left, reaping as they end (:func:`fleetrun.capped.end_descendants`)."""
    me = os.getpid()
    left = descendants(me) if _has_children() else []
    for i in range(1000):  # a fork bomb cannot keep it here for ever
        if not left:
            break
        for p in left:
            try:
                os.kill(p, signal.SIGTERM if i == 0 else signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + (grace_s if i == 0 else 0.0)
        while True:
            time.sleep(0.02 if i == 0 else 0.01)
            _reap()
            left = descendants(me)
            if not left or time.monotonic() >= deadline:
                break
    _reap()


def _has_children() -> bool:
    """Whether a child still runs (:func:`fleetrun.capped.has_children`): without one, a
    subreaper has no descendant, and the end needs no ``/proc`` scan."""
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True


def _reap(agent: int = 0) -> int | None:
    """Collect every ended child (the orphans it inherits as subreaper) without waiting.
    :return: the wait status of ``agent`` when it was among them."""
    got = None
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return got
        if pid == 0:
            return got
        if pid == agent:
            got = status


def write_json(path: str, data: dict, sync: bool = True) -> None:
    """``data`` as JSON in ``path``, atomically, fsynced with ``sync`` (the package's)."""
    _write_atomic(path, json.dumps(data), sync)


def read_json(path: str) -> dict | None:
    """The JSON in ``path``, or None when it cannot be read or is not JSON."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _write_temp(path: str, text: str) -> tuple[str, int]:
    """``text`` written whole to a temp file beside ``path``: (its name, its open fd)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        data = memoryview(text.encode())
        while data:  # a short write (a nearly full disk) is not the whole file
            data = data[os.write(fd, data) :]
    except BaseException:
        os.close(fd)
        raise
    return tmp, fd


def _write_atomic(path: str, text: str, sync: bool) -> None:
    tmp, fd = _write_temp(path, text)
    try:
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _write_then_sync(path: str, text: str, wake: Callable[[], None]) -> None:
    """``text`` in ``path`` by temp file and rename, then ``wake()``, then the fsync of the
    file and of its folder. The end is read as soon as it is renamed into place (the
    loop, a peer's worker): they need not wait for the disk. The supervisor's ledger is
    what records the end durably once it has read it (with the status it read,
    ``end_status``); a power cut before this fsync leaves the status before it, an empty
    file or this one, each read as a session that died (or the end) by a restart, never
    as an end that did not happen (docs/durability.md)."""
    tmp, fd = _write_temp(path, text)
    try:
        os.replace(tmp, path)
        wake()
        os.fsync(fd)
    finally:
        os.close(fd)
    dfd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(dfd)  # the rename itself
    finally:
        os.close(dfd)


def _read_spec(path: str) -> dict | None:
    try:
        with open(path, "rb") as f:
            spec = json.loads(f.read())
    except (OSError, ValueError):
        return None
    return spec if isinstance(spec, dict) else None


class Shepherd:
    def __init__(self, adir: str) -> None:
        # absolute: the shepherd changes into the agent's folder to start it
        self.dir = os.path.abspath(adir)
        spec = _read_spec(os.path.join(self.dir, SPEC))
        if spec is None:
            raise SystemExit(f"shepherd: no readable {SPEC} in {adir}")
        self.spec = spec
        self.status: dict = {
            "state": "starting",
            "attempt": spec.get("attempt_id"),
            "shepherd_pid": os.getpid(),
            "shepherd_token": proc_token(os.getpid()),
            "started": time.time(),
        }
        self.reason: str | None = None
        self.stop_requested: str | None = None
        self.unsaved = False
        self.woken = False  # the end's notify was sent
        cap = spec.get("max_output")
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < MIN_OUTPUT:
            cap = MAX_OUTPUT
        self.max_output: int = cap
        self.out: CappedLog | None = None
        self.agent_status: int | None = None  # its wait status, once reaped

    def save(self, end: bool = False) -> bool:
        """Write status.json (fsynced only when it records the end); on a full or read-only
        disk keep going and try again later: the supervisor waits while we are alive. The
        ``end`` must be recorded: wait for space, but not for a folder that is gone."""
        while True:
            try:
                path, text = os.path.join(self.dir, STATUS), json.dumps(self.status)
                if end:
                    _write_then_sync(path, text, self.wake)
                else:
                    _write_atomic(path, text, sync=self.status.get("state") == "ended")
                self.unsaved = False
                return True
            except OSError:
                self.unsaved = True
                try:
                    os.unlink(os.path.join(self.dir, f"{STATUS}.{os.getpid()}.tmp"))
                except OSError:
                    pass
            if not end or not os.path.isdir(self.dir):  # removed while the agent ran: never
                return False
            time.sleep(1.0)

    def log(self, log_fd: int, data: bytes) -> None:
        if self.out is None:
            self.out = CappedLog(log_fd, self.max_output)
        try:
            self.out.write(data)
        except OSError:  # disk full: the output is lost, the attempt is not
            self.status["log_dropped"] = self.status.get("log_dropped", 0) + len(data)

    def close_log(self, log_fd: int) -> None:
        """The log's end: the marker and the kept tail when it was cut; the status says so."""
        if self.out is not None:
            try:
                self.out.close()
            except OSError:
                self.status["log_dropped"] = self.status.get("log_dropped", 0) + min(self.out.seen, self.out.tail_max)
            if self.out.cut:
                self.status.update(log_cut=self.out.cut, log_cap=self.max_output)
        os.close(log_fd)

    def poll_agent(self, pid: int) -> int | None:
        """The agent's exit code (minus the signal that ended it), or None while it runs;
        the orphans it left, ours as subreaper, are reaped on the way."""
        if self.agent_status is None:
            self.agent_status = _reap(pid)
        return None if self.agent_status is None else os.waitstatus_to_exitcode(self.agent_status)

    def end(self) -> None:
        """Record the end and wake who waits for it: woken as soon as the end is in place,
        before its fsync (:func:`_write_then_sync`); woken all the same when it could not
        be recorded (its folder removed), as before."""
        self.save(end=True)
        self.wake()

    def wake(self) -> None:
        """:meth:`notify`, once: a write of the end tried again (its fsync failed) wakes
        no one twice."""
        if not self.woken:
            self.woken = True
            self.notify()

    def notify(self) -> None:
        sock_path = self.spec.get("notify")
        if not sock_path:
            return
        import socket  # here: only a spec with a loop to wake needs it

        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            try:
                s.sendto(str(self.spec.get("attempt_id", "")).encode(), sock_path)
            finally:
                s.close()
        except OSError:
            pass  # the supervisor is not listening; it reads status.json when it comes back

    def earlier_run(self) -> str | None:
        """What an earlier shepherd of this attempt recorded (its state), or None when no
        shepherd ran here. Never twice: a scheduler may run a job's script again (a
        Slurm controller killed just after a submit did, 6 s later, even with
        ``--no-requeue``), and a second shepherd must start nothing. Any status counts,
        ``starting`` too (its agent may have started before ``running`` was written),
        and one that cannot be read (a shepherd wrote something there)."""
        try:
            with open(os.path.join(self.dir, STATUS), "rb") as f:
                raw = f.read(1 << 20)
        except FileNotFoundError:
            return None
        except OSError as e:
            return f"unreadable: {e.strerror}"
        try:
            status = json.loads(raw.decode())
        except ValueError:
            return "unreadable"
        state = status.get("state") if isinstance(status, dict) else None
        return state if isinstance(state, str) else "unreadable"

    def run(self) -> int:
        import fcntl
        import termios

        # The start handshake: a supervisor that gives this attempt up (it saw no status
        # in time) takes this lock and leaves a cancel file; we check it under the lock,
        # so either the agent starts and status says so, or it never starts. Taken before
        # the first status is written: that write must not cover an earlier run's.
        lock_fd = os.open(os.path.join(self.dir, START_LOCK), os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        earlier = self.earlier_run()
        if earlier is not None:
            os.close(lock_fd)
            sys.stderr.write(
                f"shepherd: attempt {self.spec.get('attempt_id')} already ran here "
                f"(its status says {earlier}): it is not started twice\n"
            )
            return 0
        if not self.save():  # what cannot be recorded must not start
            os.close(lock_fd)
            return 1
        rfd, wfd = os.pipe()
        os.set_blocking(wfd, False)
        signal.set_wakeup_fd(wfd)

        def on_term(signum: int, frame: object) -> None:
            self.stop_requested = self.stop_requested or "stopped"

        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

        if os.path.exists(os.path.join(self.dir, CANCEL)):
            self.status.update(
                state="ended",
                reason="cancelled",
                exit_code=None,
                ended=time.time(),
                agent_pid=None,
                error="given up before it started",
            )
            self.save(end=True)
            os.close(lock_fd)  # after the status: a second shepherd must find it
            self.wake()
            return 0
        master, slave = os.openpty()
        attrs = termios.tcgetattr(slave)
        attrs[1] &= ~termios.OPOST  # keep '\n' as is in the log (no '\r\n')
        attrs[3] &= ~(termios.ECHO | termios.ICANON)
        termios.tcsetattr(slave, termios.TCSANOW, attrs)

        env = dict(os.environ)
        env.update({k: str(v) for k, v in (self.spec.get("env") or {}).items()})
        # last: the summary is read from this one place, whatever the spec's env says
        env[SUMMARY_ENV] = os.path.join(os.path.abspath(self.dir), SUMMARY)
        env[SHEPHERD_ENV] = f"{os.getpid()}:{self.status['shepherd_token']}"
        stdin_path = self.spec.get("stdin_file")
        # before the agent starts: whatever it detaches is reparented to us, not to init
        set_subreaper()
        log_fd = os.open(os.path.join(self.dir, LOG), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            stdin = os.open(stdin_path or os.devnull, os.O_RDONLY)
            try:
                pid = spawn(self.spec["argv"], self.spec.get("cwd") or None, env, stdin, slave)
            finally:
                os.close(stdin)
                os.chdir(self.dir)  # hold no worktree open
        except OSError as e:
            os.close(slave)
            os.close(master)
            reason, msg = self.exec_failure(e, env)
            self.log(log_fd, (msg + "\n").encode())
            self.close_log(log_fd)
            self.status.update(
                state="ended", reason=reason, error=msg, exit_code=None, ended=time.time(), agent_pid=None
            )
            self.save(end=True)
            os.close(lock_fd)  # after the status: a second shepherd must find it
            self.wake()
            return 0
        os.close(slave)
        now = time.time()
        self.status.update(state="running", agent_pid=pid, agent_token=proc_token(pid), agent_started=now)
        self.save()
        os.close(lock_fd)  # releases the start lock

        timeout_s = self.spec.get("timeout_s")
        stall_s = self.spec.get("stall_s")
        deadline = now + timeout_s if timeout_s else None
        last_output = now
        last_beat = now
        kill_at: float | None = None
        cancel_path = os.path.join(self.dir, CANCEL)
        master_open = True
        pidfd = -1  # readable when the agent exits, so its end is seen at once
        if hasattr(os, "pidfd_open"):
            try:
                pidfd = os.pidfd_open(pid)
            except OSError:
                pidfd = -1
        while True:
            now = time.time()
            if self.reason is None:
                if self.stop_requested:
                    self.reason = self.stop_requested
                elif os.path.exists(cancel_path):
                    self.reason = "cancelled"
                elif deadline and now >= deadline:
                    self.reason = "timeout"
                elif stall_s and now - last_output >= stall_s:
                    self.reason = "stalled"
                if self.reason:
                    self._signal_group(pid, signal.SIGTERM)
                    kill_at = now + GRACE_S
            if kill_at and now >= kill_at:
                self._signal_group(pid, signal.SIGKILL)
                kill_at = now + 1.0
            if now - last_beat >= 5.0 or (self.unsaved and now - last_beat >= 1.0):
                self.status["beat"] = now  # proof of life for `fleetrun status`
                self.save()
                last_beat = now
            fds = [rfd] + ([master] if master_open else []) + ([pidfd] if pidfd >= 0 else [])
            waits = [1.0 if (master_open or pidfd >= 0) else 0.02]
            if deadline and not self.reason:
                waits.append(deadline - now)
            if stall_s and not self.reason:
                waits.append(last_output + stall_s - now)
            if kill_at:
                waits.append(kill_at - now)
            try:
                ready, _, _ = select.select(fds, [], [], max(0.01, min(waits)))
            except InterruptedError:  # pragma: no cover
                ready = []
            if rfd in ready:
                try:
                    os.read(rfd, 512)
                except OSError:
                    pass
            if master_open and master in ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: every writer closed its end
                    data = b""
                if data:
                    self.log(log_fd, data)
                    last_output = time.time()
                else:
                    master_open = False
            code = self.poll_agent(pid)
            if code is not None and (not master_open or not self._drain(master, log_fd)):
                break
        if master_open:
            os.close(master)
        if pidfd >= 0:
            os.close(pidfd)
        # nothing of the agent's process group may outlive it, nor anything it detached
        # (a `setsid` escapes the group, not its subreaper): SIGTERM, a grace, SIGKILL
        self._signal_group(pid, signal.SIGKILL)
        end_descendants(GRACE_S)
        self.close_log(log_fd)
        self.status.update(
            state="ended",
            exit_code=code if code >= 0 else None,
            signal=-code if code < 0 else None,
            reason=self.reason or "exited",
            ended=time.time(),
        )
        self.end()
        return 0

    def exec_failure(self, e: OSError, env: dict) -> tuple[str, str]:
        """(status reason, message) for an agent that could not be started.

        ``start_failed:agent_not_found`` when the executable is missing or cannot be
        run (trying again changes nothing: the supervisor asks a human at once);
        plain ``start_failed`` for what may clear by itself (no memory, too many
        processes). Only an error of the exec itself counts: :func:`spawn` names the
        executable in ``e.filename`` then (a failed chdir names the cwd).
        """
        import errno

        exe = self.spec["argv"][0]
        why = e.strerror or str(e)
        if e.filename != exe:
            return "start_failed", f"cannot start {exe}: {why}"
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            if os.sep not in exe:
                import shutil

                if not shutil.which(exe, path=env.get("PATH")):
                    return "start_failed:agent_not_found", f"{exe} is not on PATH"
            elif not os.path.exists(exe):
                return "start_failed:agent_not_found", f"{exe} does not exist"
            # it is there: what is missing is what runs it
            return ("start_failed:agent_not_found", f"{exe} cannot be run: {why} (is its #! interpreter installed?)")
        if e.errno in (errno.EACCES, errno.EPERM, errno.EISDIR):
            return "start_failed:agent_not_found", f"{exe} is not executable"
        if e.errno == errno.ENOEXEC:
            return "start_failed:agent_not_found", f"{exe} is not executable ({why})"
        return "start_failed", f"cannot start {exe}: {why}"

    def _drain(self, master: int, log_fd: int) -> bool:
        """Copy what is left on the pty; False when nothing more will come."""
        r, _, _ = select.select([master], [], [], 0.05)
        if not r:
            return False
        try:
            data = os.read(master, 65536)
        except OSError:
            return False
        if not data:
            return False
        self.log(log_fd, data)
        return True

    @staticmethod
    def _signal_group(pid: int, sig: int) -> None:
        # not fleetrun.osutil.end_group: the run loop above owns the grace, so that the
        # log keeps being copied while the agent ends
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def spawn(argv: list[str], cwd: str | None, env: dict[str, str], stdin: int, out: int) -> int:
    """Start the agent as ``subprocess.Popen`` would with ``start_new_session=True``:
    in a session of its own, ``stdin`` as its input, ``out`` as its output and error,
    ``argv[0]`` looked up on ``env``'s ``PATH`` (not ours), SIGPIPE and SIGXFSZ back to
    their defaults, none of our files open in it (ours are all close-on-exec). Its
    folder is ``cwd``: ``posix_spawn`` cannot change it, so this process changes into
    it first (the caller changes back).

    :return: its pid.
    :raises OSError: ``chdir`` failed (``e.filename`` is ``cwd``) or no exec did: the
        first error that is not "no such file", as ``execvpe`` reports, with
        ``e.filename`` the executable as given.
    """
    exe = argv[0]
    if cwd is not None:
        os.chdir(cwd)
    if os.sep in exe:
        paths = [exe]
    else:
        dirs = env.get("PATH", os.defpath).split(os.pathsep)
        paths = [os.path.join(d or os.curdir, exe) for d in dirs]
    actions = [(os.POSIX_SPAWN_DUP2, stdin, 0), (os.POSIX_SPAWN_DUP2, out, 1), (os.POSIX_SPAWN_DUP2, out, 2)]
    first = last = 2  # ENOENT
    for path in paths:
        try:
            return os.posix_spawn(
                path, argv, env, file_actions=actions, setsid=True, setsigdef=(signal.SIGPIPE, signal.SIGXFSZ)
            )
        except OSError as e:
            last = e.errno or last
            if last not in (2, 20) and first == 2:  # ENOENT, ENOTDIR: try the next folder
                first = last
    errno = first if first != 2 else last
    raise OSError(errno, os.strerror(errno), exe)


def _write_modules(adir: str) -> None:
    """The debug list of what this process imported (``DEBUG_ENV``)."""
    try:
        main = sys.modules["__main__"]
        text = "\n".join([str(getattr(main, "__file__", "")), *sorted(sys.modules)]) + "\n"
        _write_atomic(os.path.join(adir, MODULES), text, sync=False)
    except OSError:
        pass


#: ``shepherd.py --starter``: a long-lived process that forks a shepherd per request.
STARTER_ARG = "--starter"
#: Beside each attempt folder's files: what its shepherd printed (``spawn_detached``'s too).
SHEPHERD_OUT = "shepherd.out"


def starter() -> int:
    """Fork a shepherd, or a capped verifier, for each request read on standard input,
    until it closes.

    A host that starts many attempts (the supervisor's ``LocalHost``) keeps one of these
    (:class:`fleetrun.hosts.ShepherdStarter`): a fork of this small process, which has
    imported what a shepherd needs once, costs a fraction of an interpreter's start and
    this file's compile and imports, on every attempt (issue 24). A shepherd still
    outlives it, and the supervisor: each is in a session of its own, and this process
    only reaps the ones that end while it runs. The same holds for the wrapper of
    :mod:`fleetrun.capped` every local ``run`` verifier and setup step runs under: one
    fork each, not an interpreter (:func:`_fork_capped`).

    Standard input and output are one end of a socket pair: a request is one line of
    JSON, ``{"dir": ATTEMPT_DIR, "env": {...}}`` for a shepherd (the environment it runs
    with, the supervisor's at the time, as a spawn gives it), or ``{"capped": {...},
    "env": {...}}`` with one descriptor passed beside it for a capped command; the
    answer one line, ``pid PID`` or ``error ERRNO MESSAGE``.
    """
    # what every shepherd imports on its way (run, set_subreaper, notify), imported once
    # here for all of them: ctypes alone is ~3 ms of CPU a shepherd
    import ctypes  # noqa: F401
    import fcntl  # noqa: F401
    import socket
    import termios  # noqa: F401

    chan = socket.socket(fileno=0)
    cloexec = getattr(socket, "MSG_CMSG_CLOEXEC", 0)
    buf = b""
    fds: list[int] = []
    capped: list[object] = []  # fleetrun.capped, loaded on the first capped request
    while True:
        _reap()
        try:
            ready, _, _ = select.select([0], [], [], 1.0)
        except InterruptedError:  # pragma: no cover
            continue
        if not ready:
            continue
        try:
            chunk, got, _flags, _addr = socket.recv_fds(chan, 65536, 4, cloexec)
        except OSError:
            break
        fds += got
        if not chunk:
            break
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            # one request at a time (the supervisor waits for each answer): what came
            # with this line is its own
            mine, fds = fds, []
            _write_all(1, (_fork_for(line, mine, capped) + "\n").encode())
    for fd in fds:
        os.close(fd)
    _reap()
    return 0


def _close_inherited() -> None:
    """Close every descriptor above 2 this process was started with: a spawn passes on
    each one of its parent's that is not close-on-exec (``posix_spawn`` closes nothing),
    and this process would pass them on to the agent it spawns, or, as the starter, to
    every shepherd and capped command it forks and through them to every agent and
    verifier."""
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd") if name.isdigit()]
    except OSError:  # no /proc: the usual range
        fds = list(range(3, 256))
    for fd in fds:
        if fd > 2:
            try:
                os.close(fd)
            except OSError:
                pass  # the listing's own, closed already


def _fork_for(line: bytes, fds: list[int], capped: list[object]) -> str:
    """One request of :func:`starter`: the answer line. Every descriptor in ``fds`` is
    closed here (the forked child keeps its copies)."""
    try:
        req = json.loads(line)
        if not isinstance(req, dict):
            raise TypeError
        env = req["env"]
        if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise TypeError
        if "capped" in req:
            if len(fds) != 1:
                raise TypeError
            return _fork_capped(req["capped"], env, fds[0], capped)
        if fds:
            raise TypeError
        return _fork_shepherd(req["dir"], env)
    except (ValueError, KeyError, TypeError):
        return f"error {22} malformed request"  # EINVAL
    finally:
        for fd in fds:
            os.close(fd)


class LazyOut:
    """A forked shepherd's standard output and error: ``shepherd.out`` in its attempt
    folder, made on the first write. Most shepherds have nothing to say, and each file
    made costs an inode, ~0.4 ms of CPU on a busy disk (issue 24). Best effort, as the
    file it stands for was: a write that fails is dropped."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = -1

    def write(self, text: str) -> int:
        try:
            if self.fd < 0:
                self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            _write_all(self.fd, text.encode("utf-8", "backslashreplace"))
        except OSError:
            pass
        return len(text)

    def flush(self) -> None:
        pass


def _fork_shepherd(adir: object, env: dict[str, str]) -> str:
    """A shepherd for ``adir``: the answer line (the forked child never returns)."""
    if not isinstance(adir, str):
        raise TypeError
    try:  # a folder that is not there is an answer, as the open of its output was
        os.close(os.open(adir, os.O_RDONLY | os.O_DIRECTORY))
        pid = os.fork()
    except OSError as e:
        return f"error {e.errno} {e.strerror}"
    if pid:
        return f"pid {pid}"
    code = 1
    try:  # the shepherd, as spawn_detached starts one: its own session, no input, output to SHEPHERD_OUT
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):  # what it says goes through sys.stdout and sys.stderr
            os.dup2(null, fd)
        os.close(null)
        sys.stdout = sys.stderr = LazyOut(os.path.join(adir, SHEPHERD_OUT))
        os.environ.clear()
        os.environ.update(env)
        code = main([adir])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
        if not isinstance(e.code, int) and e.code is not None:
            sys.stderr.write(f"{e.code}\n")
    except BaseException as e:  # never back into the starter's loop
        sys.stderr.write(f"shepherd: {type(e).__name__}: {e}\n")
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
    return ""  # pragma: no cover (os._exit does not return)


def _load_capped(capped: list[object]) -> object:
    """``fleetrun/capped.py``, beside this file, loaded once (this file cannot import the
    package: it runs by path)."""
    if not capped:
        import importlib.util

        spec = importlib.util.spec_from_file_location(
            "fleetrun_capped", os.path.join(os.path.dirname(SHEPHERD_PATH), "capped.py")
        )
        if spec is None or spec.loader is None:  # pragma: no cover - the file is the package's own
            raise ImportError("capped.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        capped.append(module)
    return capped[0]


def _fork_capped(req: object, env: dict[str, str], status: int, capped: list[object]) -> str:
    """A command under the wrapper of :mod:`fleetrun.capped`, forked, as ``python -I -S
    capped.py MAX OUT -- ARGV`` started by ``Popen(cwd=CWD, stdin=STDIN,
    start_new_session=True)`` would run it: in a session of its own (the group the
    supervisor ends at a timeout), in ``cwd``, ``stdin`` (a path, or none) as its input,
    nothing of ours open in it. It is not the supervisor's child, so its exit code goes to
    ``status``, the write end of a pipe the supervisor passed with the request and reads:
    one line, ``CODE`` (minus the signal that ended the command), written once the
    command and everything it left behind have ended. No line and the pipe's end: the
    wrapper was killed. The command never holds ``status`` (close-on-exec).

    :return: the answer line (the forked child never returns).
    """
    if not isinstance(req, dict):
        raise TypeError
    max_bytes, out, argv, cwd, stdin = (req.get(k) for k in ("max_bytes", "out", "argv", "cwd", "stdin"))
    if (
        isinstance(max_bytes, bool)
        or not isinstance(max_bytes, int)
        or max_bytes < 0
        or not isinstance(out, str)
        or not isinstance(cwd, str)
        or not (stdin is None or isinstance(stdin, str))
        or not isinstance(argv, list)
        or not argv
        or not all(isinstance(a, str) for a in argv)
    ):
        raise TypeError
    try:
        module = _load_capped(capped)
    except (OSError, ImportError) as e:
        return f"error {getattr(e, 'errno', None) or 2} cannot load capped.py: {e}"
    opened: list[int] = []
    try:  # what Popen would fail on, failed here: an answer, not a wrapper that dies
        opened.append(os.open(cwd, os.O_RDONLY | os.O_DIRECTORY))
        opened.append(os.open(stdin or os.devnull, os.O_RDONLY))
        pid = os.fork()
    except OSError as e:
        for fd in opened:
            os.close(fd)
        return f"error {e.errno} {e.strerror}"
    if pid:
        for fd in opened:
            os.close(fd)
        return f"pid {pid}"
    code = 1  # as an interpreter that died of an exception would exit
    try:
        os.setsid()
        os.fchdir(opened[0])
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(opened[1], 0)
        os.dup2(null, 1)
        os.dup2(null, 2)
        for fd in (null, *opened):
            os.close(fd)
        os.set_inheritable(status, False)
        os.environ.clear()
        os.environ.update(env)
        code = module.run(max_bytes, out, argv)  # type: ignore[attr-defined]
    except BaseException:  # never back into the starter's loop
        pass
    finally:
        try:
            _write_all(status, f"{code}\n".encode())
        except OSError:
            pass  # nobody reads it any more (the supervisor is gone)
        finally:
            os._exit(0)
    return ""  # pragma: no cover (os._exit does not return)


def main(argv: list[str]) -> int:
    if argv == [STARTER_ARG]:
        return starter()
    if len(argv) != 1:
        print("usage: shepherd.py ATTEMPT_DIR | shepherd.py --starter", file=sys.stderr)
        return 2
    try:
        return Shepherd(argv[0]).run()
    finally:
        if os.environ.get(DEBUG_ENV, "0") != "0":
            _write_modules(os.path.abspath(argv[0]))


if __name__ == "__main__":
    # run by path (a shepherd, or the starter): what it starts, and what the starter forks,
    # gets nothing of its parent's but input, output and error (_close_inherited)
    _close_inherited()
    raise SystemExit(main(sys.argv[1:]))

"""Hosts: where an attempt runs. ``LocalHost`` is this machine (offered by the built-in
``local`` plugin through ``fleetrun_hosts``).

A host offers the same verbs whatever it is (:class:`fleetrun.hostapi.Host`) — start a
shepherd, read its status and log, stop it — so placement, retry and adoption never ask
which one they hold. The registry of a run's hosts is :mod:`fleetrun.hostapi`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence, TextIO

from .hostapi import (  # noqa: F401  (their old home: kept importable)
    AttemptRef,
    MissingHost,
    StartRefused,
    UnknownHost,
    get_host,
    missing_host_reason,
    stop_attempt,
)
from .osutil import FileLock, end_group, spawn_detached
from .shepherd import (
    CANCEL,
    LOG,
    SHEPHERD_ENV,
    SHEPHERD_OUT,
    SHEPHERD_PATH,  # noqa: F401  (tests find it here, its old home)
    SPEC,
    START_LOCK,
    STARTER_ARG,
    STATUS,
    proc_token,
    shepherd_argv,
    write_json,
)
from .untrusted import FILE_STATES, Malformed, parse_status, reason_of

if TYPE_CHECKING:
    from .config import Config
    from .reports import Candidate, Started


def executable_problem(exe: str, path: Optional[str] = None) -> Optional[str]:
    """Why ``exe`` (an agent's ``argv[0]``) cannot be started on this machine, or None.

    A bare name is looked up on ``path`` (default ``$PATH``), an absolute path is
    checked as it is; a relative path with a folder in it is left to the shepherd
    (it is relative to the worktree, not to us).
    """
    import shutil

    if not exe:
        return "the agent command is empty"
    if os.sep not in exe:
        return None if shutil.which(exe, path=path) else f"{exe} is not on PATH"
    if not os.path.isabs(exe):
        return None
    if not os.path.exists(exe):
        return f"{exe} does not exist"
    if os.path.isdir(exe) or not os.access(exe, os.X_OK):
        return f"{exe} is not executable"
    return None


class LocalHost:
    """This machine (a :class:`~fleetrun.hostapi.Host`). Attempt folders live in
    ``<root>/<attempt-id>``, ``$FLEETRUN_HOME/attempts`` by default.

    :param home: the fleetrun home.
    :param name: the host's name (``local``; a plugin may run a second one beside it
        under another name and root, as the test plugin ``tests/plugins/secondhost.py``
        does).
    :param root: the folder of its attempt folders (default ``home/attempts``).
    :param measure: what :meth:`candidate` returns (the ``local`` plugin passes the
        ``placement`` plugin's measurement of this machine); None: no candidate.
    :param starter: start shepherds through one long-lived :class:`ShepherdStarter`
        (made on the first start; :meth:`close` ends it) rather than an interpreter
        each: for a process that starts many, the supervisor's loop. A host made for
        one verb (a peer's ``host start``) starts its one shepherd by path.
    :param err: where to say that the starter is gone (default ``sys.stderr``).
    """

    local = True

    def __init__(
        self,
        home: Path,
        name: str = "local",
        root: Optional[Path] = None,
        measure: Optional[Callable[[Any], Optional[Candidate]]] = None,
        starter: bool = False,
        err: Optional[TextIO] = None,
    ) -> None:
        self.home = home
        self.name = name
        self.root = root if root is not None else home / "attempts"
        self.measure = measure
        self._children: dict[str, int] = {}
        self._use_starter = starter
        self._starter: Optional[ShepherdStarter] = None
        self._err = err

    def attempt_dir(self, attempt_id: str) -> Path:
        return self.root / attempt_id

    def candidate(self, config: Config) -> Optional[Candidate]:
        """This machine's headroom, as ``measure`` finds it (None without one)."""
        return self.measure(config) if self.measure is not None else None

    def start(self, attempt_id: str, spec: dict[str, Any], prompt: Optional[str] = None) -> Started:
        """Start a shepherd for an attempt; return its pid and identity token.

        The attempt folder gets ``spec.json`` (and ``prompt``) first, so a shepherd
        never starts without knowing what to run.
        """
        from .ledger import ensure_private_dir  # here: `host status` on a peer never needs sqlite

        adir = ensure_private_dir(self.attempt_dir(attempt_id))
        spec = dict(spec, attempt_id=attempt_id)
        if prompt is not None:
            ppath = adir / "prompt"
            fd = os.open(ppath, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(prompt)
            if spec.get("stdin") == "prompt":
                spec["stdin_file"] = str(ppath)
        # not fsynced: the ledger holds the intent (the attempt is ``starting``), and a
        # crash that loses this file takes the shepherd with it; adoption then finds no
        # status and gives the attempt up under the start lock (docs/durability.md)
        write_json(str(adir / SPEC), spec, sync=False)
        pid = self._start_shepherd(attempt_id, adir)
        from .reports import Started

        return Started(pid=pid, token=proc_token(pid), dir=str(adir))

    def _start_shepherd(self, attempt_id: str, adir: Path) -> int:
        """The shepherd's pid: forked by the starter when this host keeps one, else (or
        when the starter is gone) spawned by path."""
        starter = self._get_starter()
        if starter is not None:
            try:
                return starter.start(str(adir), os.environ)
            except StarterGone as e:
                self._starter_gone(e)
        # posix_spawn in a new session, not Popen: the shepherd is meant to outlive us,
        # and a Popen object would complain when collected with its child still running.
        pid = spawn_detached(shepherd_argv(str(adir)), os.environ, adir / SHEPHERD_OUT)
        self._children[attempt_id] = pid
        return pid

    def start_capped(
        self, max_bytes: int, out: str, argv: list[str], cwd: str, env: Mapping[str, str], stdin: Optional[str]
    ) -> Optional[tuple[int, int]]:
        """A capped command (a ``run`` verifier, a setup step) forked by this host's
        starter (:meth:`ShepherdStarter.start_capped`), or None when it is to be started
        by path (no starter, or it is gone): :class:`fleetrun.procutil.ProcessHandle`'s
        ``start``.

        :raises OSError: it could not be started.
        """
        starter = self._get_starter()
        if starter is None:
            return None
        try:
            return starter.start_capped(max_bytes, out, argv, cwd, env, stdin)
        except StarterGone as e:
            self._starter_gone(e)
            return None

    def _get_starter(self) -> Optional[ShepherdStarter]:
        """The starter, made on first use; None when this host starts by path."""
        if not self._use_starter:
            return None
        if self._starter is None:
            try:
                self._starter = ShepherdStarter(self.home / "shepherd-starter.out")
            except StarterGone as e:
                self._starter_gone(e)
                return None
        return self._starter

    def _starter_gone(self, e: StarterGone) -> None:
        # the run goes on without it: every shepherd and verifier is started by path from now
        self._use_starter = False
        self.close()
        (self._err or sys.stderr).write(
            f"fleetrun: the shepherd starter is gone ({e}); shepherds and verifiers start by path\n"
        )

    def close(self) -> None:
        """End the starter, if this host made one (its shepherds run on)."""
        starter, self._starter = self._starter, None
        if starter is not None:
            starter.close()

    def reap(self) -> None:
        """Collect exited shepherd children (they are detached, but ours until we exit)."""
        for aid, pid in list(self._children.items()):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                del self._children[aid]

    def status(self, attempt_id: str, pid: Optional[int], token: Optional[str]) -> dict[str, Any]:
        """The shepherd's status file, with ``state`` ``died`` if the shepherd is gone
        without having written an end (a reused pid does not count as alive)."""
        self.reap()
        adir = self.attempt_dir(attempt_id)
        st, bad = read_status(adir)
        if st.get("state") == "ended":
            return st
        alive = shepherd_alive(pid or st.get("shepherd_pid"), token or st.get("shepherd_token"))
        if alive:
            # a garbled file while the shepherd lives: it rewrites the file as it goes
            return st or {"state": "running" if bad else "starting"}
        # gone; read once more in case it ended between the two reads
        again, bad = read_status(adir)
        st = again or st
        if st.get("state") == "ended":
            return st
        if bad is not None:
            # the shepherd is gone and what it left cannot be read (the agent may have
            # written it): a session that died, with the reason, not a crash
            return {
                "state": "ended",
                "reason": "malformed_status",
                "exit_code": None,
                "error": f"malformed status.json: {bad}",
            }
        if not st and (adir / SPEC).exists():
            # given its attempt, gone without ever recording a start: it runs nothing it
            # cannot record (a full disk), so no agent ran. An attempt that did not start,
            # not a session that died: no resume is spent on it
            return {
                "state": "ended",
                "reason": "start_failed",
                "exit_code": None,
                "error": "its shepherd ended before it could record a start (is the home's disk full?)",
            }
        # The shepherd died (SIGKILL, OOM killer...) but its agent, in a session of its
        # own, may run on: end it, or the resumed attempt would run beside it; and what
        # the agent detached, which the dead shepherd can no longer end, by the
        # shepherd's identity it inherited
        kill_group(st.get("agent_pid"), st.get("agent_token"))
        spid, stoken = pid or st.get("shepherd_pid"), token or st.get("shepherd_token")
        if isinstance(spid, int) and isinstance(stoken, str) and stoken:
            kill_environ(f"{SHEPHERD_ENV}={spid}:{stoken}")
        return dict(st, state="died")

    def poll(self, attempts: Sequence[AttemptRef]) -> dict[str, dict[str, Any]]:
        """Each attempt's :meth:`status`: its shepherd's status file, read here (a local
        read costs no round trip, so one call per attempt is what a poll is)."""
        return {a.attempt_id: self.status(a.attempt_id, a.pid, a.token) for a in attempts}

    def give_up(self, attempt_id: str) -> dict[str, Any]:
        """Decide, under the shepherd's start lock, that an attempt never started: leave
        a cancel file so a shepherd that starts late runs nothing. :return: the status
        (with a ``shepherd_pid`` if it did start after all: then it is adopted)."""
        adir = self.attempt_dir(attempt_id)
        if not adir.exists():
            return {}
        with FileLock(adir / START_LOCK):
            st, _ = read_status(adir)
            if st.get("state") in ("running", "ended"):
                return st
            cfd = os.open(adir / CANCEL, os.O_WRONLY | os.O_CREAT, 0o600)
            os.close(cfd)
            return st

    def log_path(self, attempt_id: str) -> Path:
        return self.attempt_dir(attempt_id) / LOG

    def stop(self, attempt_id: str, pid: Optional[int], token: Optional[str]) -> bool:
        """Ask the shepherd to end the agent's process tree. Safe to repeat."""
        adir = self.attempt_dir(attempt_id)
        if adir.exists():
            fd = os.open(adir / CANCEL, os.O_WRONLY | os.O_CREAT, 0o600)
            os.close(fd)
        st, _ = read_status(adir)
        pid = pid or st.get("shepherd_pid")
        token = token or st.get("shepherd_token")
        if pid and shepherd_alive(pid, token):
            try:
                os.kill(pid, signal.SIGTERM)
                return True
            except ProcessLookupError:
                return False
        return False


MAX_STATUS_BYTES = 1 << 20  # a shepherd's status is a few hundred bytes


class StarterGone(Exception):
    """The shepherd starter did not answer (it died, or is stuck): shepherds start by path."""


class ShepherdStarter:
    """One ``python -I -S shepherd.py --starter`` (:func:`fleetrun.shepherd.starter`):
    it forks a shepherd for each :meth:`start`, and the wrapper of a capped command
    (a ``run`` verifier, a setup step) for each :meth:`start_capped`, which costs a
    fraction of a new interpreter's start, compile and imports (issue 24: ~22 ms of CPU
    a shepherd, ~14 ms a verifier's wrapper).

    It runs in a session of its own, its input and output one end of a socket pair
    whose other end is ours (a request may carry a descriptor); its errors go to
    ``log``. When we exit, however we exit, its input closes and it ends; the processes
    it forked, each in a session of its own, run on as ones spawned by path do.
    """

    #: How long a start may wait for the starter's answer (a fork takes milliseconds).
    ANSWER_S = 30.0

    def __init__(self, log: Path) -> None:
        import socket  # here: `status` and `cancel` import this module, and never a starter
        import threading

        mine, theirs = socket.socketpair()
        try:
            argv = shepherd_argv(STARTER_ARG)
            self.pid = os.posix_spawn(
                argv[0],
                argv,
                dict(os.environ),
                file_actions=[
                    (os.POSIX_SPAWN_DUP2, theirs.fileno(), 0),
                    (os.POSIX_SPAWN_DUP2, theirs.fileno(), 1),
                    (os.POSIX_SPAWN_OPEN, 2, os.fspath(log), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600),
                ],
                setsid=True,
            )
        except OSError as e:
            mine.close()
            raise StarterGone(str(e)) from None
        finally:
            theirs.close()
        self._sock = mine
        self._buf = b""
        # one request and its answer at a time, whichever thread starts attempts
        self._lock = threading.Lock()

    def start(self, adir: str, env: Mapping[str, str]) -> int:
        """Fork a shepherd for ``adir`` with ``env``: :return: its pid.

        :raises OSError: the fork failed (as a spawn's would).
        :raises StarterGone: no answer.
        """
        with self._lock:
            return self._ask({"dir": adir, "env": dict(env)})

    def start_capped(
        self, max_bytes: int, out: str, argv: list[str], cwd: str, env: Mapping[str, str], stdin: Optional[str]
    ) -> tuple[int, int]:
        """Fork the wrapper of :mod:`fleetrun.capped` running ``argv`` in ``cwd`` with
        ``env``, ``stdin`` (a path, or None for none) as its input, its output capped to
        ``max_bytes`` into ``out``: in a session of its own, as ``Popen(..., cwd=cwd,
        start_new_session=True)`` of ``python -I -S capped.py`` would start it.

        :return: (its pid, the read end of the pipe its exit code comes through: one line,
            then the pipe's end; the pipe's end alone when it was killed). Not our child:
            the starter reaps it.
        :raises OSError: it could not be started (``cwd`` or ``stdin`` cannot be opened,
            the fork failed), as ``Popen`` would raise.
        :raises StarterGone: no answer.
        """
        req = {
            "capped": {"max_bytes": max_bytes, "out": out, "argv": argv, "cwd": cwd, "stdin": stdin},
            "env": dict(env),
        }
        r, w = os.pipe()
        try:
            with self._lock:
                pid = self._ask(req, w)
        except BaseException:
            os.close(r)
            raise
        finally:
            os.close(w)  # the wrapper holds it now: its end (or death) is the pipe's end
        return pid, r

    def _ask(self, req: dict[str, Any], fd: Optional[int] = None) -> int:
        import select
        import socket

        data = (json.dumps(req) + "\n").encode()
        try:
            if fd is not None:  # the descriptor goes with the request's first bytes
                data = data[socket.send_fds(self._sock, [data], [fd]) :]
            _write_all(self._sock.fileno(), data)
        except OSError as e:
            raise StarterGone(f"its input: {e.strerror}") from None
        deadline = time.monotonic() + self.ANSWER_S
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self._sock], [], [], max(0.0, left))
            if not ready:
                raise StarterGone(f"no answer in {self.ANSWER_S:g} s")
            try:
                chunk = self._sock.recv(4096)
            except OSError as e:
                raise StarterGone(f"its output: {e.strerror}") from None
            if not chunk:
                raise StarterGone("it exited")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        words = line.decode("utf-8", "replace").split(" ", 2)
        if len(words) == 2 and words[0] == "pid" and words[1].isdigit():
            return int(words[1])
        if len(words) == 3 and words[0] == "error" and words[1].isdigit():
            raise OSError(int(words[1]), words[2])
        raise StarterGone(f"it answered {line[:100]!r}")

    def close(self) -> None:
        """Close its input, so it ends, and wait for it (it ends at once; killed after
        a few seconds if not)."""
        self._sock.close()
        deadline = time.monotonic() + 5.0
        while True:
            try:
                done, _ = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                return
            if done:
                return
            if time.monotonic() >= deadline:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
                return
            time.sleep(0.005)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def read_status(adir: Path) -> tuple[dict[str, Any], Optional[str]]:
    """An attempt folder's ``status.json``, checked (:func:`fleetrun.untrusted.parse_status`).

    :return: (the status, None); ({}, None) when there is none yet; ({}, the reason)
        when it is there but malformed (not JSON, not an object, a field of the wrong
        type). It lives in the home, but the agent runs as the same user: it is read
        as untrusted, never with ``int()`` or ``float()`` on what it holds.
    """
    try:
        with open(adir / STATUS, "rb") as f:
            raw = f.read(MAX_STATUS_BYTES + 1)
    except OSError:
        return {}, None
    return status_from_bytes(raw)


def status_from_bytes(raw: bytes) -> tuple[dict[str, Any], Optional[str]]:
    """:func:`read_status` on the file's bytes (pure: the fuzzers call it)."""
    if len(raw) > MAX_STATUS_BYTES:
        return {}, f"larger than {MAX_STATUS_BYTES} bytes"
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):
        # a partly written file cannot happen (temp file + rename): garbage it is
        return {}, "not JSON"
    try:
        return parse_status(data, FILE_STATES), None
    except Malformed as e:
        return {}, reason_of(e)


def kill_group(pid: Optional[int], token: Optional[str]) -> bool:
    """SIGKILL the process group led by ``pid`` if that process is still the one we
    started (same start-time token): :func:`fleetrun.osutil.end_group` with no grace.
    :return: whether it was signalled."""
    if not isinstance(token, str):
        return False  # a recorded child file that is not ours to believe
    return end_group(pid, token, grace_s=0)


#: Where the records of an attempt's process groups were kept before issue 24 (one
#: ``NAME.json`` each, written twice, by temp file and rename): still read, for a crash
#: left by an older version.
CHILDREN = "children"
#: The record of a process group the supervisor started for an attempt (a verifier, a
#: setup step): ``NAME.child`` beside its output in the attempt folder, one JSON object a
#: line, the later lines adding to the first (:func:`record_child_intent`, :func:`record_child`).
CHILD_SUFFIX = ".child"
#: What a record may hold: two short lines (the rest is not ours).
MAX_CHILD_RECORD = 1 << 16


#: The environment variable a recorded child carries: what finds it when its pid was
#: never recorded (the supervisor died between starting it and :func:`record_child`).
CHILD_MARKER = "FLEETRUN_CHILD"
_MARKER = re.compile(r"[A-Za-z0-9_.-]{1,80}-[0-9a-f]{16}")


def child_record(adir: Path, name: str) -> Path:
    """The record of process group ``name`` of the attempt in ``adir``."""
    return adir / f"{name}{CHILD_SUFFIX}"


def _record_line(path: Path, data: dict[str, Any], first: bool) -> None:
    # One file a process group, written in place: each file made costs an inode, which
    # on a busy disk is most of what a small write costs (~0.4 ms of CPU, against ~0.01
    # to append), and a temp file and rename made one for every write. A line cut short
    # (a crash mid-write) is not JSON and is skipped; the line before it still holds.
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (os.O_TRUNC if first else 0)
    fd = os.open(path, flags, 0o600)
    try:
        _write_all(fd, (json.dumps(data) + "\n").encode())
    finally:
        os.close(fd)


def record_child_intent(adir: Path, name: str) -> str:
    """Before a process group for an attempt (a verifier) starts: record the marker it
    will carry in its environment (``FLEETRUN_CHILD``), so a supervisor killed after the
    start and before :func:`record_child` leaves it findable. :return: the marker."""
    import secrets  # not on the operator's verbs' import path (tests/test_startup.py)

    marker = f"{name}-{secrets.token_hex(8)}"
    _record_line(child_record(adir, name), {"marker": marker}, first=True)
    return marker


def record_child(adir: Path, name: str, pid: int, marker: Optional[str] = None) -> None:
    """Remember a process group the supervisor started for an attempt (a verifier), so a
    restarted supervisor can end it before running the step again: its pid and token, a
    line after its intent's."""
    _record_line(child_record(adir, name), {"pid": pid, "token": proc_token(pid), "marker": marker}, first=False)


def read_child_record(path: Path) -> dict[str, Any]:
    """What a record says, its lines merged in order (a line that is not a JSON object is
    skipped; an old ``children/NAME.json`` is one such line)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_CHILD_RECORD)
    except OSError:
        return {}
    info: dict[str, Any] = {}
    for line in raw.splitlines():
        try:
            data = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(data, dict):
            info.update(data)
    return info


def kill_marked(marker: str) -> bool:
    """SIGKILL the process groups of every process of ours whose environment has the
    marker (Linux: ``/proc/PID/environ``; elsewhere nothing is found). :return: whether any."""
    return kill_environ(f"{CHILD_MARKER}={marker}")


def kill_environ(variable: str) -> bool:
    """SIGKILL the process groups of every process of ours (but our own group) whose
    environment holds ``variable`` (``NAME=value``, whole). :return: whether any."""
    needle = variable.encode()
    groups: set[int] = set()
    try:
        entries = [e.name for e in os.scandir("/proc") if e.name.isdigit()]
    except OSError:
        return False
    for name in entries:
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    groups.add(os.getpgid(int(name)))
        except OSError:  # gone, or not ours to read
            continue
    groups.discard(os.getpgrp())
    for pgid in groups:
        end_group(pgid, None, grace_s=0)
    return bool(groups)


def forget_child(adir: Path, name: str) -> None:
    child_record(adir, name).unlink(missing_ok=True)


def kill_recorded_children(adir: Path) -> int:
    """End every recorded process group of an attempt that still runs; :return: how many."""
    n = 0
    old = adir / CHILDREN
    records = sorted(adir.glob(f"*{CHILD_SUFFIX}")) + (sorted(old.glob("*.json")) if old.is_dir() else [])
    for f in records:
        info = read_child_record(f)
        marker = info.get("marker")
        marked = isinstance(marker, str) and _MARKER.fullmatch(marker) is not None
        if kill_group(info.get("pid"), info.get("token")):
            n += 1
            # what it detached (`setsid sleep &`) left the group, and the SIGKILL took its
            # reaper (fleetrun.capped's wrapper) before it could end it: it still carries
            # the marker in its environment
            if marked:
                kill_marked(str(marker))
        elif info.get("pid") is None and marked:
            n += kill_marked(str(marker))  # started, its pid never recorded
        f.unlink(missing_ok=True)
    return n


def shepherd_alive(pid: Optional[int], token: Optional[str]) -> bool:
    if not pid:
        return False
    now = proc_token(int(pid))
    if now is None:
        return False
    return token is None or now == token


def dump(obj: Any) -> str:
    return json.dumps(obj, default=str)

"""Which roles are live, and which role a Claude Code session answers to (psutil).

A process is a Claude Code session when its name is ``claude``, or the last part of
its ``cmdline[0]`` or ``cmdline[1]`` is (the npm CLI runs as ``node .../claude``, the
test fake as ``python3 .../claude``). A pid is told from a reused one by its start time
(psutil's ``create_time``), recorded when it is bound.

whoami (the seed's rule): a session answers to the role bound to its pid or to one of
its ancestors' (the nearest); else to the one role, of those bound to no running
process, whose folder holds the session's cwd, when exactly one does (a session
under both a root role and a nested one, neither pid-bound, answers to neither). A
role is live when its bound process runs, or a running session answers to it.

fleetrun's own sessions answer to no role (issue 21 item 7): a session fleetrun
spawned for a task (in the folder a role is bound over, say) must not take the role's
mail, report its tasks or earn it focus. fleetrun starts every agent and verifier with
``FLEETRUN_TASK_ID`` in its environment (:func:`fleetrun.procutil.task_env`), so a
process whose environment *as it started* (``/proc/PID/environ``, what psutil reads),
or whose ancestor's, holds it is fleetrun's: the agent cannot take the variable out of
its session's start environment, nor out of the fleetrun processes above it.

psutil is imported inside the functions: loading the plugin stays cheap.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from .store import Role

#: How close two start times must be to be one process's (psutil's own resolution).
_SAME_START_S = 0.05
#: The variable fleetrun puts in the environment of every agent and verifier it starts
#: for a task (``procutil.task_env``): what marks a process, and its children, as fleetrun's.
TASK_ENV = "FLEETRUN_TASK_ID"


@dataclass(frozen=True)
class Proc:
    """One process as seen once: enough to walk up to a session and to match a binding."""

    pid: int
    ppid: int
    started: float
    cwd: Optional[str] = None
    session: bool = False
    #: the task fleetrun started it for (``FLEETRUN_TASK_ID`` in its start environment),
    #: read for sessions and for the chain whoami walks; None otherwise
    task: Optional[str] = None


@dataclass
class ProcTable:
    """A snapshot of the processes that matter: a pid's ancestry and the sessions."""

    procs: dict[int, Proc] = field(default_factory=dict)

    def alive(self, pid: Optional[int], started: Optional[float]) -> bool:
        """Whether ``pid`` runs and is the process that started at ``started``."""
        p = self.procs.get(pid) if pid else None
        return p is not None and (started is None or abs(p.started - started) < _SAME_START_S)

    def chain(self, pid: int) -> list[Proc]:
        """``pid`` and its ancestors, nearest first (known ones only)."""
        out: list[Proc] = []
        seen: set[int] = set()
        p = self.procs.get(pid)
        while p is not None and p.pid not in seen:
            out.append(p)
            seen.add(p.pid)
            p = self.procs.get(p.ppid) if p.ppid else None
        return out

    def sessions(self) -> list[Proc]:
        return [p for p in self.procs.values() if p.session]


def is_session_cmd(name: str, cmdline: Sequence[str]) -> bool:
    """The rule for "this process is Claude Code" (pure, for the tests)."""
    if name == "claude":
        return True
    return any(os.path.basename(part) == "claude" for part in list(cmdline)[:2])


def _task_of(p: Any) -> Optional[str]:
    """``FLEETRUN_TASK_ID`` of a process's start environment, or None (not set, or not
    ours to read)."""
    import psutil

    try:
        value = p.environ().get(TASK_ENV)
    except (psutil.Error, OSError):
        return None
    return str(value)[:80] if value else None


def _proc_of(p: Any, with_cwd: bool, with_env: bool = False) -> Optional[Proc]:
    import psutil

    try:
        with p.oneshot():
            name = p.name()
            try:
                cmd = p.cmdline()
            except (psutil.AccessDenied, psutil.ZombieProcess):
                cmd = []
            session = is_session_cmd(name, cmd)
            cwd = None
            if with_cwd or session:
                try:
                    cwd = os.path.realpath(p.cwd())
                except (psutil.AccessDenied, psutil.ZombieProcess, OSError):
                    cwd = None
            task = _task_of(p) if with_env or session else None
            return Proc(pid=p.pid, ppid=p.ppid(), started=p.create_time(), cwd=cwd, session=session, task=task)
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
        return None


def scan() -> ProcTable:
    """Every process of this machine (a full scan: the loop's routing and claim checks,
    ``role list``)."""
    import psutil

    table = ProcTable()
    for p in psutil.process_iter():
        got = _proc_of(p, with_cwd=False)
        if got is not None:
            table.procs[got.pid] = got
    return table


def lineage(pid: int, extra: Iterable[Optional[int]] = ()) -> ProcTable:
    """Only ``pid``, its ancestors and the pids of ``extra`` (bound pids): what whoami of
    one process needs, without reading every process (the Stop hook's path)."""
    import psutil

    table = ProcTable()
    cur: Optional[int] = pid
    while cur and cur not in table.procs:
        try:
            got = _proc_of(psutil.Process(cur), with_cwd=cur == pid, with_env=True)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            got = None
        if got is None:
            break
        table.procs[cur] = got
        cur = got.ppid
    for other in extra:
        if other and other not in table.procs:
            try:
                got = _proc_of(psutil.Process(other), with_cwd=False)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                got = None
            if got is not None:
                table.procs[other] = got
    return table


def session_of(table: ProcTable, pid: int) -> Optional[Proc]:
    """The first Claude Code session on the way up from ``pid`` (itself included)."""
    return next((p for p in table.chain(pid) if p.session), None)


def covers(directory: str, path: str) -> bool:
    """Whether ``path`` is ``directory`` or below it (both canonical)."""
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


def started_for(table: ProcTable, pid: int) -> Optional[str]:
    """The task fleetrun started ``pid`` or one of its ancestors for (``FLEETRUN_TASK_ID``
    in a start environment), or None: a process of none of fleetrun's sessions,
    verifiers or agents."""
    return next((p.task for p in table.chain(pid) if p.task), None)


def own_task() -> Optional[str]:
    """The task fleetrun started this very process (or what started it) for, from its
    own environment: the hooks' answer before they load psutil."""
    return os.environ.get(TASK_ENV) or None


def answers_to(table: ProcTable, pid: int, cwd: Optional[str], roles: Sequence[Role]) -> tuple[Optional[Role], str]:
    """whoami for the process ``pid`` (a session) whose cwd is ``cwd``.

    :return: the role and how (``bound to pid N``, ``the one role over DIR``), or None
        and why not (a session fleetrun started for a task answers to none).
    """
    task = started_for(table, pid)
    if task is not None:
        return None, f"fleetrun started it for task {task}, and its own sessions answer to no role"
    chain = table.chain(pid)
    for depth, p in enumerate(chain):
        bound = [r for r in roles if r.pid == p.pid and table.alive(r.pid, r.pid_started)]
        if bound:
            who = "this session" if depth == 0 else f"its ancestor {p.pid}"
            return bound[0], f"bound to {who} (pid {p.pid})"
    if not cwd:
        return None, "its working directory cannot be read"
    free = [r for r in roles if not table.alive(r.pid, r.pid_started) and covers(r.dir, cwd)]
    if len(free) == 1:
        return free[0], f"the one role bound over {cwd}"
    if not free:
        return None, f"no role is bound over {cwd}"
    names = ", ".join(r.name for r in free)
    return None, f"{len(free)} roles are bound over {cwd} ({names}) and none to this session: bind one with --self"


def live_roles(table: ProcTable, roles: Sequence[Role]) -> dict[str, str]:
    """The live roles, by key, each with why it is live (its bound pid runs, or which
    session answers to it)."""
    out: dict[str, str] = {}
    for r in roles:
        if table.alive(r.pid, r.pid_started):
            out[r.key] = f"pid {r.pid} runs"
    for s in table.sessions():
        role, _ = answers_to(table, s.pid, s.cwd, roles)
        if role is not None and role.key not in out:
            out[role.key] = f"session {s.pid} answers to it"
    return out


def start_time(pid: int) -> Optional[float]:
    """The start time of a running ``pid`` (what a binding records), or None."""
    import psutil

    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None

"""What a supervisor sends a peer, checked, and what this peer prepared.

A request is untrusted (``docs/security.md``): every task and attempt id is checked
against the one pattern the ledger makes them by (:func:`fleetrun.untrusted.task_id`,
:func:`~fleetrun.untrusted.attempt_id`), and a task, attempt or workspace is rebuilt
from known fields only. ``prepared.json`` (the workspace made for each task at
``prepare``) is the one source of the paths ``collect``, ``cleanup``,
``verify-start`` and ``bundle`` act on: a request names a task, never a path.
"""

from __future__ import annotations

import contextvars
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any, Optional, Protocol

from ..protocol import TAMPERED

PREPARED = "prepared.json"


class HasHome(Protocol):
    """What the fast verbs (``verbs.FAST_VERBS``) read of a config: the home folder
    alone. They answer without a plugin manager, given a ``verbs.HomeOnly`` rather than
    a :class:`~fleetrun.config.Config`; a Config has a home too."""

    home: Path


class HostError(Exception):
    """A verb failed; the message goes back to the supervisor."""


class Refused(Exception):
    """``start`` will not start this attempt; the message says why."""


class _Unknown(HostError):
    pass


def _check(fn: Any, *args: Any, **kw: Any) -> Any:
    """An untrusted value through its checker; a :class:`Malformed` is a refusal."""
    from fleetrun.untrusted import Malformed

    try:
        return fn(*args, **kw)
    except Malformed as e:
        raise HostError(str(e)) from None


def _attempt_id(value: Any, task: Optional[str] = None) -> str:
    from fleetrun.untrusted import attempt_id

    return str(_check(attempt_id, value, task=task))


def _task_id(value: Any) -> str:
    from fleetrun.untrusted import task_id

    return str(_check(task_id, value))


#: A request's payload when the worker (``host serve``) runs a verb: set in the thread
#: that runs it, so the verb reads it exactly as a one-shot verb reads its stdin.
PAYLOAD: contextvars.ContextVar[Optional[bytes]] = contextvars.ContextVar("fleetrun_host_payload", default=None)
#: The worker's own wake-up socket, which a shepherd it starts writes to when its agent
#: ends (as a local shepherd writes to the loop's); a path the supervisor sends is never used.
NOTIFY: contextvars.ContextVar[Optional[str]] = contextvars.ContextVar("fleetrun_host_notify", default=None)


def _payload() -> dict[str, Any]:
    given = PAYLOAD.get()
    if given is not None:
        data = given
    else:
        data = sys.stdin.buffer.read() if sys.stdin is not None else b""
    try:
        obj = json.loads(data or b"{}")
    except (ValueError, RecursionError) as e:
        raise HostError(f"stdin is not JSON: {type(e).__name__}: {str(e)[:200]}") from None
    if not isinstance(obj, dict):
        raise HostError("stdin must hold a JSON object")
    return obj


def _known(cls: Any, data: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def _task(data: Any) -> Any:
    """The request's task, its id checked; a request that does not make one is refused."""
    from fleetrun.ledger import Task
    from fleetrun.states import State
    from fleetrun.taskspec import TaskSpec

    if not isinstance(data, dict):
        raise HostError("the request has no task")
    _task_id(data.get("id"))
    try:
        d = _known(Task, data)
        d["state"] = State(d["state"])
        d["spec"] = TaskSpec.from_json(d["spec"])
        d["host"] = "local"  # here, it is
        task = Task(**d)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise HostError(f"the request's task is not one: {type(e).__name__}: {e}") from None
    if not isinstance(task.spec.cwd, str) or not isinstance(task.name, str):
        raise HostError("the request's task is not one")
    return task


def _attempt(data: Any, task: Any) -> Any:
    """The request's attempt, which must be one of ``task``'s."""
    from fleetrun.ledger import Attempt

    if not isinstance(data, dict):
        raise HostError("the request has no attempt")
    _attempt_id(data.get("id"), task.id)
    try:
        d = _known(Attempt, data)
        d["host"] = "local"
        att = Attempt(**d)
    except (TypeError, ValueError) as e:
        raise HostError(f"the request's attempt is not one: {e}") from None
    if att.task_id != task.id or not isinstance(att.number, int) or att.id != f"{task.id}_a{att.number}":
        raise HostError(f"attempt {att.id} is not attempt {att.number} of {task.id}")
    return att


def _workspace(data: Any) -> Any:
    from fleetrun.reports import Workspace

    if not isinstance(data, dict):
        raise HostError("the request has no workspace")
    try:
        return Workspace(**_known(Workspace, data))
    except TypeError as e:
        raise HostError(f"the request's workspace is not one: {e}") from None


def _prepared_all(home: Path) -> dict[str, dict[str, Any]]:
    from fleetrun.shepherd import read_json

    data = read_json(str(home / PREPARED)) or {}
    return {k: v for k, v in data.items() if isinstance(v, dict)} if isinstance(data, dict) else {}


def _record_prepared(home: Path, task_id: str, ws: Any) -> None:
    """Remember the workspace made for a task (call under the lock). Kept after cleanup:
    a fetch-back may still ask for the branch."""
    from fleetrun.gitutil import common_dir
    from fleetrun.shepherd import write_json

    rec = dataclasses.asdict(ws)
    rec["common"] = common_dir(ws.repo) if ws.is_worktree and ws.repo else None
    rec["time"] = time.time()
    reg = _prepared_all(home)
    reg[task_id] = rec
    write_json(str(home / PREPARED), reg)


def _prepared(home: Path, task_id: str) -> dict[str, Any]:
    rec = _prepared_all(home).get(task_id)
    if rec is None:
        raise HostError(f"no workspace was prepared on this host for task {task_id}")
    return rec


def _pinned(rec: dict[str, Any]) -> Any:
    """The recorded worktree, pinned to its repository.

    :raises HostError: ``worktree_tampered: ...`` when its ``.git`` no longer leads there.
    """
    from fleetrun.gitutil import WorktreeTampered, pin_worktree

    root, common = rec.get("root") or rec.get("path"), rec.get("common")
    if not isinstance(root, str) or not isinstance(common, str):
        raise HostError(f"{TAMPERED}the record of this worktree is incomplete")
    try:
        return pin_worktree(root, common)
    except WorktreeTampered as e:
        raise HostError(f"{TAMPERED}{e}") from None


def _recorded_workspace(rec: dict[str, Any]) -> Any:
    from fleetrun.reports import Workspace

    return Workspace(**_known(Workspace, rec))


def _local_host(config: HasHome) -> Any:
    from fleetrun.hosts import LocalHost

    return LocalHost(config.home)

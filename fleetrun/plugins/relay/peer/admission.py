"""Whether this peer takes an attempt: room (its own ``[local] max_tasks``, counting
its own ``fleetrun work``), drain, one attempt of a task at a time; and the host
lock that ``hosted.json`` and ``prepared.json`` are read and written under.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from fleetrun.exceptions import UsageError
from fleetrun.osutil import FileLock

from .request import (
    HostError,
    Refused,
    _attempt,
    _attempt_id,
    _local_host,
    _payload,
    _prepared_all,
    _record_prepared,
    _task,
    _task_id,
)

if TYPE_CHECKING:
    from fleetrun.config import Config

HOSTED = "hosted.json"
LOCK = "host.lock"


@contextmanager
def _host_lock(home: Path) -> Iterator[None]:
    from fleetrun.ledger import ensure_private_dir

    ensure_private_dir(home)
    with FileLock(home / LOCK):
        yield


def _policy(config: Config) -> tuple[Any, Optional[str]]:
    from fleetrun.policy import Policy, load_policy

    try:
        return load_policy(config.home / "policy.toml"), None
    except UsageError as e:
        return Policy(), e.format()


def _drained(config: Config, policy: Any) -> bool:
    if policy.local.drain:
        return True
    db = config.home / "state.db"
    if not db.exists():
        return False
    import sqlite3

    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=2)
        try:
            row = conn.execute("SELECT value FROM meta WHERE key='drain'").fetchone()
        finally:
            conn.close()
    except sqlite3.Error:
        return False
    return bool(row and row[0] == "1")


def _hosted(config: Config) -> dict[str, dict[str, Any]]:
    """Attempts started here for supervisors and still alive (call under the lock)."""
    from fleetrun.shepherd import read_json, write_json

    path = config.home / HOSTED
    reg = read_json(str(path)) or {}
    host = _local_host(config)
    alive = {}
    for aid, entry in reg.items():
        st = host.status(aid, entry.get("pid"), entry.get("token"))
        if st.get("state") not in ("ended", "died"):
            alive[aid] = entry
    if alive != reg:
        write_json(str(path), alive)
    return alive


def _own_loop_running(config: Config) -> int:
    """Tasks this machine's own ``fleetrun work`` runs, if one runs."""
    from fleetrun.shepherd import proc_token, read_json

    data = read_json(str(config.home / "supervisor.json")) or {}
    pid = data.get("pid")
    if not pid or proc_token(int(pid)) is None or (data.get("token") and proc_token(int(pid)) != data.get("token")):
        return 0
    return int(data.get("running") or 0)


def _check_room(config: Config, hosted: dict[str, dict[str, Any]], task_id: str) -> None:
    """Refuse a task this machine will not start now (call under the lock)."""
    same = [aid for aid, e in hosted.items() if e.get("task_id") == task_id]
    if same:
        raise Refused(f"is still running attempt {same[0]} of this task (a task never runs twice at once)")
    policy, policy_error = _policy(config)
    if policy_error:
        raise Refused(f"has a broken policy.toml: {policy_error}")
    if _drained(config, policy):
        raise Refused("is draining")
    running = len(hosted) + _own_loop_running(config)
    if running >= policy.local.max_tasks:
        raise Refused(f"is running {running} of {policy.local.max_tasks} tasks (its own [local] max_tasks)")


def cmd_prepare(config: Config, ns: argparse.Namespace) -> dict[str, Any]:
    p = _payload()
    task = _task(p.get("task"))
    att = _attempt(p.get("attempt"), task)
    if not os.path.isdir(task.spec.cwd):
        raise HostError("working directory does not exist on this host")
    if task.spec.merges_dependencies:  # a supervisor never sends one (placement keeps it home)
        raise HostError(
            'a task with base = "dependencies" is prepared on the supervising machine, where its '
            "dependencies' branches are merged; this peer does not prepare it"
        )
    with _host_lock(config.home):  # refuse now, before a worktree is made for nothing
        _check_room(config, _hosted(config), task.id)
    try:
        ws = config.hook.fleetrun_prepare_workspace(task=task, attempt=att, host=_local_host(config), config=config)
    except Exception as e:
        raise HostError(str(e) or type(e).__name__) from None
    if ws is None:
        raise HostError("no plugin prepared a workspace on the peer")
    with _host_lock(config.home):
        _record_prepared(config.home, task.id, ws)
    return {"workspace": dataclasses.asdict(ws)}


def _output_cap(config: Config, asked: object) -> int:
    """This host's ``[output] max_bytes``, or the supervisor's ``asked`` when it is lower."""
    from fleetrun.capped import MIN_MAX_BYTES
    from fleetrun.config import output_cap

    mine = output_cap(config)
    if isinstance(asked, bool) or not isinstance(asked, int) or asked < MIN_MAX_BYTES:
        return mine
    return min(mine, asked)


def cmd_start(config: Config, ns: argparse.Namespace) -> dict[str, Any]:
    p = _payload()
    task_id = _task_id(p.get("task_id"))
    attempt_id = _attempt_id(p.get("attempt_id"), task_id)
    spec = p.get("spec")
    if not isinstance(spec, dict) or not isinstance(spec.get("argv"), list) or not spec["argv"]:
        raise HostError("the request has no spec with an argv")
    rec = _prepared_all(config.home).get(task_id)
    if rec is not None and rec.get("is_worktree") and spec.get("cwd") != rec.get("path"):
        raise HostError(
            f"the attempt would run in {spec.get('cwd')}, not in the worktree prepared here for "
            f"{task_id} ({rec.get('path')})"
        )
    from fleetrun.shepherd import write_json

    from .request import NOTIFY

    notify = NOTIFY.get()
    if notify is not None:  # started by the worker: it hears of the end at once
        spec = dict(spec, notify=notify)
    # the agent's log is written on this machine's disk: its own [output] max_bytes caps it,
    # and the supervisor's only lowers that
    spec = dict(spec, max_output=_output_cap(config, spec.get("max_output")))
    host = _local_host(config)
    with _host_lock(config.home):
        hosted = _hosted(config)
        if attempt_id in hosted:  # asked again (a lost reply): the same shepherd
            e = hosted[attempt_id]
            return {"pid": e["pid"], "token": e["token"], "dir": str(host.attempt_dir(attempt_id)), "again": True}
        _check_room(config, hosted, task_id)
        if spec.get("cwd") and not os.path.isdir(spec["cwd"]):
            raise HostError("working directory does not exist on this host")
        info = host.start(attempt_id, spec, p.get("prompt"))
        hosted[attempt_id] = {"task_id": task_id, "pid": info.pid, "token": info.token, "started": time.time()}
        write_json(str(config.home / HOSTED), hosted)
    return {"pid": info.pid, "token": info.token, "dir": info.dir}

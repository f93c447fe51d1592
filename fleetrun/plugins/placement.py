"""Built-in ``placement`` plugin: this machine as a candidate, and the default place hook."""

from __future__ import annotations

import os
import socket
import time
from typing import Any, Optional, Union

from ..hookimpl import hookimpl
from ..placement import decide
from ..reports import Candidate, Placement, Wait
from ..states import ACTIVE, State


def local_running(config: Any) -> int:
    """Tasks that hold a slot here: placed, running, or being verified (a verifier such
    as a test suite takes the machine as much as the agent did)."""
    led = config.stash.get("ledger")
    if led is None:
        return 0
    return sum(1 for t in led.tasks(set(ACTIVE)) if t.host in (None, "local"))


def measure_local(path: str) -> dict[str, Optional[float]]:
    import psutil

    out: dict[str, Optional[float]] = {}
    try:
        out["free_mem_mb"] = psutil.virtual_memory().available / 2**20
    except Exception:
        out["free_mem_mb"] = None
    try:
        out["load_per_core"] = os.getloadavg()[0] / (os.cpu_count() or 1)
    except (OSError, AttributeError):
        out["load_per_core"] = None
    try:
        out["free_disk_mb"] = psutil.disk_usage(path).free / 2**20
    except Exception:
        out["free_disk_mb"] = None
    return out


@hookimpl(trylast=True)
def fleetrun_candidates(config: Any) -> list[Candidate]:
    policy = config.stash.get("policy")
    local = policy.local if policy is not None else None
    led = config.stash.get("ledger")
    drain = bool(local and local.drain) or (led is not None and led.get_meta("drain") == "1")
    max_tasks = config.getoption("max_tasks") or (local.max_tasks if local else 4)
    m = measure_local(str(config.home))
    tags = config.setting("relay", "tags", []) or []
    return [Candidate(
        name="local", kind="local",
        free_mem_mb=m["free_mem_mb"], load_per_core=m["load_per_core"], free_disk_mb=m["free_disk_mb"],
        running=local_running(config), max_tasks=int(max_tasks), drain=drain,
        tags=frozenset(tags),
        tools=config.stash.get("local_tools", {}),
        auth=frozenset(config.stash.get("local_auth", ())),
        mem_per_task_mb=float(local.mem_per_task_mb) if local else 1024.0,
        min_free_mem_mb=local.min_free_mem_mb if local else None,
        max_load_per_core=local.max_load_per_core if local else None,
        min_free_disk_mb=local.min_free_disk_mb if local else None,
    )]


@hookimpl(trylast=True)
def fleetrun_place(task: Any, candidates: list[Candidate], policy: Any, config: Any) -> Union[Placement, Wait]:
    pin = task.spec.peer
    if pin is not None and pin in (socket.gethostname(), "localhost"):
        pin = "local"
    if task.state in (State.RETRYING, State.RESUMING) and task.host:
        pin = task.host  # same machine, same worktree
    backoff = config.stash.get("backoff", {}).get(task.id, {})
    return decide(task.spec.requires, candidates, backoff, time.time(), pin=pin)

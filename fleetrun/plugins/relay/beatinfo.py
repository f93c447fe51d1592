"""A peer's heartbeat, told to ``fleetrun_host_heartbeat``: the heartbeat thread's
entry (``peers-state.json``'s, see :mod:`.peers`) as the hook's ``info``, posted to the
loop's thread (:func:`fleetrun.heartbeats.post`)."""

from __future__ import annotations

from typing import Any, Optional

from ... import heartbeats

ERROR_LIMIT = 300


def _number(value: Any) -> Optional[float]:
    # a bool is an int to Python, and no count or headroom
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def heartbeat_info(entry: dict[str, Any], seconds: float) -> dict[str, Any]:
    """What one heartbeat round heard: its probe's headroom when the peer answered, the
    error when it did not (the last reply is not this round's, so it is not repeated)."""
    error = entry.get("error")
    reachable = not error
    probe = (entry.get("probe") or {}) if reachable else {}
    running, max_tasks = _number(probe.get("running")), _number(probe.get("max_tasks"))
    text = " ".join(str(error).split()) if error else None
    return {
        "reachable": reachable,
        "running": int(running) if running is not None else None,
        "max_tasks": int(max_tasks) if max_tasks is not None else None,
        "free_slots": int(max(0.0, max_tasks - running)) if running is not None and max_tasks is not None else None,
        "free_mem_mb": _number(probe.get("free_mem_mb")),
        "load_per_core": _number(probe.get("load_per_core")),
        "free_disk_mb": _number(probe.get("free_disk_mb")),
        "latency_ms": round(seconds * 1000.0, 1),
        "error": text[:ERROR_LIMIT] if text else None,
    }


def post_heartbeat(host: Any, entry: dict[str, Any], seconds: float) -> None:
    """From the heartbeat thread: the round's ``info`` for ``fleetrun_host_heartbeat``."""
    relay = getattr(host, "relay", None)
    if relay is not None:
        heartbeats.post(relay.config, host, heartbeat_info(entry, seconds))

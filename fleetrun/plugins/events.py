"""Built-in ``events`` plugin: an NDJSON event log at ``$FLEETRUN_HOME/events.ndjson``.

One JSON object per line: ``transition``, ``verdict`` and ``waiting`` events, each
with ``time``, ``task`` (id) and ``name``. Appended with one ``write`` per event so
concurrent writers never interleave within a line.
"""

from __future__ import annotations

import json
import os
import time
from typing import TYPE_CHECKING, Any

from ..hookimpl import hookimpl

if TYPE_CHECKING:
    from ..config import Config


def _write(config: Config, event: dict[str, Any]) -> None:
    path = config.home / "events.ndjson"
    try:
        config.home.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, (json.dumps(event, default=str) + "\n").encode())
        finally:
            os.close(fd)
    except OSError:
        pass  # the event log must never stop the loop; the ledger has the truth


@hookimpl(trylast=True)
def fleetrun_transition(task: Any, from_state: str, to_state: str, cause: str, attempt: Any, config: Config) -> None:
    _write(config, {"event": "transition", "time": time.time(), "task": task.id, "name": task.name,
                    "from": from_state or None, "to": to_state, "cause": cause, "attempt": attempt,
                    "host": task.host})


@hookimpl(trylast=True)
def fleetrun_verdict(task: Any, verdict: Any, attempt: Any, config: Config) -> None:
    _write(config, {"event": "verdict", "time": time.time(), "task": task.id, "name": task.name,
                    "attempt": attempt.number, "kind": verdict.kind, "label": verdict.label,
                    "passed": verdict.passed, "reason": verdict.reason, "cost_usd": verdict.cost_usd})


@hookimpl(trylast=True)
def fleetrun_task_waiting(task: Any, reason: str, config: Config) -> None:
    _write(config, {"event": "waiting", "time": time.time(), "task": task.id, "name": task.name,
                    "reason": reason})

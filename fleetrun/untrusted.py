"""The one strict parsing layer for what fleetrun does not trust.

An agent's stream-json, a shepherd's status file, a peer's replies and its cached
probe, a brain's replies: each is read through the checks here, which either return a
value of the promised type and range or raise :class:`Malformed` with a reason. The
callers turn a :class:`Malformed` into a reasoned outcome (a died session, a FAIL
verdict, an unreachable peer); it never reaches the loop as an exception.

``docs/security.md`` lists what is trusted and what is not.
"""

from __future__ import annotations

import math
import re as _re
import time
from typing import Any, Optional, TypeVar

T = TypeVar("T")

#: A cost above this is not a real session's cost (it guards sums and the ledger).
MAX_COST_USD = 1e6
#: A reset time further ahead than this is not believed (``|99999999999`` would pause a
#: machine until the year 5138).
MAX_RESET_HORIZON_S = 7 * 24 * 3600.0
MAX_TEXT = 1 << 20


class Malformed(ValueError):
    """An untrusted value does not have the type or range it must have."""


def obj(value: Any, what: str) -> dict[str, Any]:
    """A JSON object (a dict with string keys)."""
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise Malformed(f"{what}: expected an object, got {_kind(value)}")
    return value


def opt_obj(data: dict[str, Any], key: str, what: str) -> Optional[dict[str, Any]]:
    v = data.get(key)
    return None if v is None else obj(v, f"{what}.{key}")


def number(value: Any, what: str, lo: float = -math.inf, hi: float = math.inf) -> float:
    """A finite int or float (not a bool, not a string) within [lo, hi]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Malformed(f"{what}: expected a number, got {_kind(value)}")
    f = float(value)
    if not math.isfinite(f):
        raise Malformed(f"{what}: {value!r} is not a finite number")
    if not lo <= f <= hi:
        raise Malformed(f"{what}: {value!r} is out of range [{lo:g}, {hi:g}]")
    return f


def opt_number(
    data: dict[str, Any],
    key: str,
    what: str,
    lo: float = -math.inf,
    hi: float = math.inf,
    default: Optional[float] = None,
) -> Optional[float]:
    v = data.get(key)
    return default if v is None else number(v, f"{what}.{key}", lo, hi)


def integer(value: Any, what: str, lo: int = -(1 << 62), hi: int = 1 << 62) -> int:
    """An int (not a bool, not a float, not a string) within [lo, hi]."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise Malformed(f"{what}: expected an integer, got {_kind(value)}")
    if not lo <= value <= hi:
        raise Malformed(f"{what}: {value!r} is out of range [{lo}, {hi}]")
    return value


def opt_integer(
    data: dict[str, Any], key: str, what: str, lo: int = -(1 << 62), hi: int = 1 << 62, default: Optional[int] = None
) -> Optional[int]:
    v = data.get(key)
    return default if v is None else integer(v, f"{what}.{key}", lo, hi)


def cost(value: Any, what: str) -> float:
    """A cost in USD: finite, >= 0, below :data:`MAX_COST_USD`. None counts as 0."""
    if value is None:
        return 0.0
    return number(value, what, 0.0, MAX_COST_USD)


def boolean(value: Any, what: str) -> bool:
    """Exactly ``true`` or ``false`` (``"no"`` is not a boolean, and ``bool("no")`` is True)."""
    if not isinstance(value, bool):
        raise Malformed(f"{what}: expected true or false, got {_kind(value)}")
    return value


def opt_boolean(data: dict[str, Any], key: str, what: str, default: bool = False) -> bool:
    v = data.get(key)
    return default if v is None else boolean(v, f"{what}.{key}")


def text(value: Any, what: str, limit: int = MAX_TEXT) -> str:
    """A string, cut to ``limit`` characters."""
    if not isinstance(value, str):
        raise Malformed(f"{what}: expected a string, got {_kind(value)}")
    return value if len(value) <= limit else value[:limit]


def opt_text(
    data: dict[str, Any], key: str, what: str, limit: int = MAX_TEXT, default: Optional[str] = None
) -> Optional[str]:
    v = data.get(key)
    return default if v is None else text(v, f"{what}.{key}", limit)


def str_list(value: Any, what: str, limit: int = 10_000) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise Malformed(f"{what}: expected a list of strings, got {_kind(value)}")
    return value[:limit]


def one_of(value: Any, what: str, allowed: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise Malformed(f"{what}: expected one of {', '.join(allowed)}, got {_short(value)}")
    return value


def reset_time(value: Any, what: str, now: Optional[float] = None) -> float:
    """An epoch time (seconds; milliseconds are taken as such) no further ahead than
    :data:`MAX_RESET_HORIZON_S` and not absurdly far behind."""
    f = number(value, what)
    if f > 1e11:  # milliseconds
        f /= 1000.0
    now = time.time() if now is None else now
    if not now - 86400.0 <= f <= now + MAX_RESET_HORIZON_S:
        raise Malformed(f"{what}: {_short(value)} is not a reset time within the next 7 days")
    return f


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: f"the string {_short(value)}",
        list: "a list",
        dict: "an object",
    }.get(type(value), type(value).__name__)


def _short(value: Any) -> str:
    r = repr(value)
    return r if len(r) <= 60 else r[:57] + "..."


# ---------------------------------------------------------------------------------
# Ids a supervisor sends to a peer (``fleetrun host``) and a peer sends back. The
# ledger makes them (``Ledger.add_tasks``/``Ledger.lease``): a task id is
# ``task_<queue token>_<index>`` (the queue token is base 36 milliseconds and 6 hex
# digits), an attempt id ``<task id>_a<number>``. Nothing else is a path component
# fleetrun builds from an id, so anything else (``..``, ``/``, a NUL) is refused here,
# in this one place.


TASK_ID = _re.compile(r"task_[0-9a-z]{1,40}_[0-9]{1,9}")
ATTEMPT_ID = _re.compile(r"(task_[0-9a-z]{1,40}_[0-9]{1,9})_a([1-9][0-9]{0,8})")
SHA = _re.compile(r"[0-9a-f]{40}(?:[0-9a-f]{24})?")


def task_id(value: Any, what: str = "task id") -> str:
    """A task id as the ledger makes it (``task_<base36>_<i>``)."""
    if not isinstance(value, str) or not TASK_ID.fullmatch(value):
        raise Malformed(f"bad {what} {_short(value)}: expected task_<queue>_<index>")
    return value


def attempt_id(value: Any, what: str = "attempt id", task: Optional[str] = None) -> str:
    """An attempt id as the ledger makes it (``<task id>_a<n>``); with ``task``, one of
    that task's attempts."""
    m = ATTEMPT_ID.fullmatch(value) if isinstance(value, str) else None
    if m is None:
        raise Malformed(f"bad {what} {_short(value)}: expected task_<queue>_<index>_a<number>")
    if task is not None and m.group(1) != task:
        raise Malformed(f"bad {what} {_short(value)}: not an attempt of {task}")
    return value


def sha(value: Any, what: str) -> str:
    """A full git object name (40 or 64 lowercase hex digits)."""
    if not isinstance(value, str) or not SHA.fullmatch(value):
        raise Malformed(f"{what}: expected a commit id, got {_kind(value)}")
    return value


def opt_str_list(data: dict[str, Any], key: str, what: str, limit: int = 10_000) -> list[str]:
    """A list of strings, or [] when absent (a string is not a list of its letters)."""
    v = data.get(key)
    return [] if v is None else str_list(v, f"{what}.{key}", limit)


# --- added for the agent side: text that reaches the ledger and the terminal, the
# --- shepherd's status file, a short reason


def clean_text(value: Any, what: str, limit: int = MAX_TEXT) -> str:
    """:func:`text`, with lone surrogates (``"\\ud800"`` is valid JSON) replaced: SQLite
    and a UTF-8 terminal refuse them, so they would turn a reply into a crash."""
    s = text(value, what, limit)
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        s = s.encode("utf-8", "replace").decode("utf-8")
    return s


def opt_clean_text(
    data: dict[str, Any], key: str, what: str, limit: int = MAX_TEXT, default: Optional[str] = None
) -> Optional[str]:
    v = data.get(key)
    return default if v is None else clean_text(v, f"{what}.{key}", limit)


def reason_of(err: BaseException, limit: int = 160) -> str:
    """One line, at most ``limit`` characters, printable: a Malformed's message as the
    detail of a cause (``session_died:malformed_output:<this>``)."""
    msg = " ".join(str(err).split())
    msg = "".join(c if c.isprintable() else "?" for c in msg)
    return msg if len(msg) <= limit else msg[: limit - 3] + "..."


#: The states a shepherd writes, and the two a host adds (``died``: the shepherd is gone
#: without an end; ``unreachable``: a peer did not answer).
STATUS_STATES = ("starting", "running", "ended", "died", "unreachable")
#: The reasons a shepherd writes for an end (``malformed_status`` is the supervisor's).
STATUS_REASONS = ("exited", "timeout", "stalled", "cancelled", "stopped", "start_failed", "malformed_status")
MAX_PID = 1 << 22  # Linux's pid_max ceiling
_EPOCH_HI = 1e11  # a time stamp past the year 5138 is not one


#: The states a shepherd itself writes in ``status.json``.
FILE_STATES = ("starting", "running", "ended")


def parse_status(data: Any, states: tuple[str, ...] = STATUS_STATES) -> dict[str, Any]:
    """A shepherd's ``status.json`` (``states=FILE_STATES``) or a host's status reply,
    checked: only the keys fleetrun reads, each of its type and range.

    :raises Malformed: with the reason.
    """
    d = obj(data, "status")
    out: dict[str, Any] = {"state": one_of(d.get("state"), "status.state", states)}
    for key in ("shepherd_pid", "agent_pid"):
        v = opt_integer(d, key, "status", 1, MAX_PID)
        if v is not None:
            out[key] = v
    for key in ("shepherd_token", "agent_token", "attempt"):
        v2 = opt_clean_text(d, key, "status", 200)
        if v2 is not None:
            out[key] = v2
    for key in ("started", "agent_started", "ended", "beat"):
        v3 = opt_number(d, key, "status", 0.0, _EPOCH_HI)
        if v3 is not None:
            out[key] = v3
    if "exit_code" in d:  # present and null: it ended without an exit code (a signal)
        out["exit_code"] = opt_integer(d, "exit_code", "status", -255, 255)
    sig = opt_integer(d, "signal", "status", 0, 255)
    if sig is not None:
        out["signal"] = sig
    reason = opt_clean_text(d, "reason", "status", 500)
    if reason is not None:
        one_of(reason.split(":", 1)[0], "status.reason", STATUS_REASONS)
        out["reason"] = reason
    err = opt_clean_text(d, "error", "status", 2000)
    if err is not None:
        out["error"] = err
    for key in ("log_dropped", "log_cut", "log_cap"):  # bytes of the log lost, cut, its cap
        n = opt_integer(d, key, "status", 0)
        if n is not None:
            out[key] = n
    return out


def opt_list(data: dict[str, Any], key: str, what: str, limit: int = 10_000) -> list[Any]:
    """A list (its items still to be checked), cut to ``limit`` items; absent or null is []."""
    v = data.get(key)
    if v is None:
        return []
    if not isinstance(v, list):
        raise Malformed(f"{what}.{key}: expected a list, got {_kind(v)}")
    return v[:limit]

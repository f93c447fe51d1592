"""Placement as a pure function: filter the candidates, score the rest.

``decide(task, candidates, backoff, now)`` -> :class:`Placement` or :class:`Wait`.
No I/O: the loop measures, this decides, the loop writes the lease.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Optional, Union

from .reports import Candidate, Placement, Wait


@dataclass
class Backoff:
    """Refusals in a row of one task by one machine, and when it may be tried again."""

    count: int
    until: float
    cause: str = "peer_refused"


BACKOFF_BASE_S = 5.0
BACKOFF_MAX_S = 300.0


def backoff_delay(count: int) -> float:
    """5 s after one refusal in a row, then 10, 20, 40, 80, 160, at most 5 minutes."""
    if count <= 0:
        return 0.0
    return min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2 ** (count - 1))


_REQ = re.compile(r"^([A-Za-z0-9_.+-]+?)(?:(>=)([0-9][0-9A-Za-z.]*)|(:auth))?$")


def _version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:4])


def requirement_met(req: str, c: Candidate) -> bool:
    """A tag, a tool, ``tool>=version`` or ``tool:auth``; anything else is never met."""
    m = _REQ.match(req.strip())
    if not m:
        return False
    name, ge, version, auth = m.groups()
    if auth:
        return name in c.auth
    if ge:
        have = c.tools.get(name)
        return have is not None and _version_tuple(have) >= _version_tuple(version)
    return name in c.tags or name in c.tools


def label(c: Candidate) -> str:
    return "this machine" if c.kind == "local" else c.name


def _mb(x: float) -> str:
    return f"{int(x)} MB"


def why_not(c: Candidate, requires: Iterable[str], est_mem_mb: float,
            backoff: Optional[Backoff], now: float) -> Optional[str]:
    """Why ``c`` cannot take the task now, or None if it can."""
    who = label(c)
    if c.why_not:
        return f"{who} {c.why_not}"
    if c.status == "never":
        return f"{who} has never been heard from"
    if c.status != "live" or not c.fresh:
        return f"{who} has not been heard from recently"
    if c.drain:
        return f"{who} is draining"
    if backoff is not None and backoff.until > now:
        return (f"{who} didn't start the last {backoff.count} attempt(s) ({backoff.cause}); "
                f"backing off {int(round(backoff.until - now))}s")
    if c.running >= c.max_tasks:
        is_are = "is" if c.kind == "local" else "is"
        return f"{who} {is_are} running {c.running} of {c.max_tasks} tasks"
    if c.min_free_mem_mb is not None:
        if c.free_mem_mb is None:
            return f"{who} has not reported its free memory"
        if c.free_mem_mb - est_mem_mb < c.min_free_mem_mb:
            return (f"{who} has {_mb(c.free_mem_mb)} free; a task needs {_mb(est_mem_mb)} "
                    f"above the floor of {_mb(c.min_free_mem_mb)}")
    if c.max_load_per_core is not None:
        if c.load_per_core is None:
            return f"{who} has not reported its load"
        if c.load_per_core > c.max_load_per_core:
            return f"{who} is loaded {c.load_per_core:.2f}/core (limit {c.max_load_per_core:g})"
    if c.min_free_disk_mb is not None:
        if c.free_disk_mb is None:
            return f"{who} has not reported its free disk"
        if c.free_disk_mb < c.min_free_disk_mb:
            return f"{who} has {_mb(c.free_disk_mb)} of disk free (floor {_mb(c.min_free_disk_mb)})"
    missing = [r for r in requires if not requirement_met(r, c)]
    if missing:
        return f"{who} lacks " + ", ".join(f"`{r}`" for r in missing)
    return None


def decide(
    requires: Iterable[str],
    candidates: list[Candidate],
    backoff: Optional[dict[str, Backoff]] = None,
    now: float = 0.0,
    pin: Optional[str] = None,
    est_mem_mb: Optional[dict[str, float]] = None,
) -> Union[Placement, Wait]:
    """Filter, then score: the most free memory after placing; ties to the fewest running.

    :param pin: the only candidate allowed (``peer =``, or a retry's machine).
    :param est_mem_mb: the memory a task is expected to take, per candidate name
        (default: that candidate's ``mem_per_task_mb``).
    """
    requires = list(requires)
    backoff = backoff or {}
    reasons: list[str] = []
    fit: list[tuple[float, int, int, Candidate]] = []
    pool = candidates
    if pin is not None:
        pool = [c for c in candidates if c.name == pin]
        if not pool:
            return Wait(f"pinned to {pin}, which is not a known machine")
    for i, c in enumerate(pool):
        est = (est_mem_mb or {}).get(c.name, c.mem_per_task_mb)
        why = why_not(c, requires, est, backoff.get(c.name), now)
        if why:
            reasons.append(why)
            continue
        after = (c.free_mem_mb - est) if c.free_mem_mb is not None else float("-inf")
        fit.append((-after, c.running, i, c))
    if not fit:
        until = min((b.until for n, b in backoff.items() if b.until > now and any(c.name == n for c in pool)),
                    default=None)
        return Wait("; ".join(reasons) or "no machine can take tasks", until=until)
    fit.sort(key=lambda t: (t[0], t[1], t[2]))
    best = fit[0][3]
    return Placement(best.name, reason=f"placed on {best.name}")

"""Placement as a pure function: filter the candidates, score the rest.

``decide(requires, candidates, backoff, now, pin=...)`` -> :class:`Placement` or
:class:`Wait`. No I/O and no clock: the loop measures, this decides, the loop writes
the lease. The rules are documented in ``docs/policy.md``. A plugin's own filter and
score (the ``fleetrun_place_filter``/``fleetrun_place_score`` hooks) come in as
callables, so they add to the built-in checks instead of replacing them.
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Optional, Union

from .reports import Candidate, Placement, Wait


@dataclass
class Backoff:
    """Refusals in a row of one task by one machine, and when it may be tried again.

    :ivar count: attempts in a row this machine didn't start.
    :ivar until: wall-clock time before which it is not tried for this task.
    :ivar cause: why the last one didn't start (``peer_refused``, ``start_failed``).
    """

    count: int
    until: float
    cause: str = "peer_refused"


BACKOFF_BASE_S = 5.0
BACKOFF_MAX_S = 300.0


def backoff_delay(count: int) -> float:
    """5 s after one refusal in a row, then 10, 20, 40, 80, 160, at most 5 minutes."""
    if count <= 0:
        return 0.0
    if count > 32:  # 2**n would only overflow past the cap anyway
        return BACKOFF_MAX_S
    return float(min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2 ** (count - 1)))


# A tag or tool name, then optionally ``>=VERSION`` or ``:auth``.
_REQ = re.compile(r"^([A-Za-z0-9_][A-Za-z0-9_.+-]*?)(?:\s*(>=)\s*([0-9][0-9A-Za-z.+-]*)|(:auth))?$")


@dataclass(frozen=True)
class Requirement:
    """One entry of ``requires``: ``name``, ``name>=version`` or ``name:auth``."""

    name: str
    min_version: Optional[str] = None
    auth: bool = False

    @property
    def bare(self) -> bool:
        """A bare word: met by a tag or by a tool of that name."""
        return self.min_version is None and not self.auth


@functools.lru_cache(maxsize=4096)
def parse_requirement(req: str) -> Optional[Requirement]:
    """Parse one ``requires`` entry; None if it fits none of the forms (never met)."""
    m = _REQ.match(req.strip())
    if not m:
        return None
    name, ge, version, auth = m.groups()
    return Requirement(name, version if ge else None, bool(auth))


@functools.lru_cache(maxsize=4096)
def version_tuple(v: str) -> tuple[int, ...]:
    """``"22.3.0"`` -> ``(22, 3, 0)``: the numbers in a version, for comparing."""
    return tuple(int(x) for x in re.findall(r"\d+", v)[:4])


def requirement_met(req: str, c: Candidate) -> bool:
    """Whether ``c`` meets one ``requires`` entry.

    A tag or a tool (bare word), ``tool>=version`` (the probed version, compared
    number by number), ``tool:auth`` (the tool has a credential). A tool present with
    no known version does not meet ``>=``; anything else is never met.
    """
    r = parse_requirement(req)
    if r is None:
        return False
    if r.auth:
        return r.name in c.auth
    if r.min_version is not None:
        have = c.tools.get(r.name)
        return have is not None and version_tuple(have) >= version_tuple(r.min_version)
    return r.name in c.tags or r.name in c.tools


def label(c: Candidate) -> str:
    """How a reason names a candidate: ``this machine`` or the peer's name."""
    return "this machine" if c.kind == "local" else c.name


def _mb(x: float) -> str:
    return f"{int(x)} MB"


def _secs(s: float) -> str:
    return f"{s:.0f}s" if s >= 1 else f"{s:.2g}s"


def why_not(
    c: Candidate, requires: Iterable[str], est_mem_mb: float, backoff: Optional[Backoff], now: float
) -> Optional[str]:
    """Why ``c`` cannot take the task now, or None if it can.

    The first reason found, in the order the filter checks: reachable, fresh, not
    draining, not backing off, a free slot, the floors (an unknown measurement fails
    a floor that is set), the requirements. The wording depends only on state that
    changes rarely, so the loop can print a reason when it changes.
    """
    if c.why_not:
        return f"{label(c)} {c.why_not}"
    if c.status == "never":
        return f"{label(c)} has never been heard from"
    if c.status != "live" or not c.fresh:
        return f"{label(c)} has not been heard from recently"
    if c.drain:
        return f"{label(c)} is draining"
    if backoff is not None and backoff.until > now and backoff.cause == "rate_limited":
        return (
            f"the API rate-limited the last attempt on {label(c)} (HTTP 429, no reset time given); "
            f"backing off until {time.strftime('%H:%M:%S', time.localtime(backoff.until))}"
        )
    if backoff is not None and backoff.until > now:
        return (
            f"{label(c)} didn't start the last {backoff.count} attempt(s) ({backoff.cause}); "
            f"backing off {_secs(backoff_delay(backoff.count))}"
        )
    if c.running >= c.max_tasks:
        return f"{label(c)} is running {c.running} of {c.max_tasks} tasks"
    if c.min_free_mem_mb is not None:
        if c.free_mem_mb is None:
            return f"{label(c)} has not reported its free memory"
        if c.free_mem_mb - est_mem_mb < c.min_free_mem_mb:
            return (
                f"{label(c)} has {_mb(c.free_mem_mb)} free; a task needs {_mb(est_mem_mb)} "
                f"above the floor of {_mb(c.min_free_mem_mb)}"
            )
    if c.max_load_per_core is not None:
        if c.load_per_core is None:
            return f"{label(c)} has not reported its load"
        if c.load_per_core > c.max_load_per_core:
            return f"{label(c)} is loaded {c.load_per_core:.2f}/core (limit {c.max_load_per_core:g})"
    if c.min_free_disk_mb is not None:
        if c.free_disk_mb is None:
            return f"{label(c)} has not reported its free disk"
        if c.free_disk_mb < c.min_free_disk_mb:
            return f"{label(c)} has {_mb(c.free_disk_mb)} of disk free (floor {_mb(c.min_free_disk_mb)})"
    missing = [r for r in requires if not requirement_met(r, c)] if requires else None
    if missing:
        return f"{label(c)} lacks " + ", ".join(f"`{r}`" for r in missing)
    return None


def blocked(c: Candidate, requires: Iterable[str]) -> Optional[str]:
    """Why ``c`` cannot take the task until a person changes something, or None if
    what stands in the way may clear by itself (memory, load, disk, slots, a stale
    peer, a backoff, a pause).

    Checked apart from :func:`why_not` (whose first reason may be one that clears,
    hiding one that never does): draining, no slots at all (``max_tasks`` 0), a reason
    of the candidate's own that needs a person, or ``requires`` not met by a candidate
    whose report is current (a peer not heard from may not have said what it has).
    """
    if c.why_not and c.why_not_needs_operator:
        return f"{label(c)} {c.why_not}"
    if c.drain:
        return f"{label(c)} is draining"
    if c.max_tasks <= 0:
        return f"{label(c)} is running {c.running} of {c.max_tasks} tasks"
    if c.status != "live" or not c.fresh or c.why_not:
        return None
    missing = [r for r in requires if not requirement_met(r, c)]
    if missing:
        return f"{label(c)} lacks " + ", ".join(f"`{r}`" for r in missing)
    return None


def unpaired(pin: str) -> str:
    """The reason of a task pinned to a machine no candidate is."""
    return f"pinned to peer '{pin}', which is not paired (fleetrun relay add {pin} USER@HOST)"


# The figures in a reason that are measurements (free memory, the estimate, load,
# free disk): they move on every pass without the reason having changed.
_MEASURED = re.compile(
    r"(has )\d+( MB free; a task needs )\d+( MB)|(loaded )[0-9.]+(/core)|(has )\d+( MB of disk free)"
)


def reason_shape(reason: str) -> str:
    """``reason`` with its measured figures blanked: two reasons with one shape say
    the same thing, so the second need not be shown again."""
    return _MEASURED.sub(lambda m: "#".join(g for g in m.groups() if g is not None), reason)


#: A plugin's filter for one task: why a candidate may not take it (a phrase that
#: follows the candidate's name, as in :func:`why_not`), or None/``""`` if it may.
PlaceFilter = Callable[[Candidate], Optional[str]]
#: A plugin's score for one task: added to the built-in score (see :func:`score`).
PlaceScore = Callable[[Candidate], float]


def score(c: Candidate, est_mem_mb: float, extra: float = 0.0) -> tuple[int, float, int]:
    """The rank of a candidate that passed the filter: lower is better.

    The built-in score is the candidate's **free memory after placing, in MB** (free
    memory minus ``est_mem_mb``); ``extra`` (a plugin's score) is added to it, so a
    score of 1000 weighs as much as 1000 MB of free memory. Ties go to the candidate
    running fewer tasks (then, in :func:`decide`, to the earlier one). A candidate
    whose free memory is unknown ranks below every one whose figure is known, and
    among such candidates ``extra`` alone decides.
    """
    if c.free_mem_mb is None:
        return (1, -extra, c.running)
    return (0, -(c.free_mem_mb - est_mem_mb + extra), c.running)


def decide(
    requires: Iterable[str],
    candidates: list[Candidate],
    backoff: Optional[Mapping[str, Backoff]] = None,
    now: float = 0.0,
    pin: Optional[str] = None,
    est_mem_mb: Optional[Mapping[str, float]] = None,
    extra_filter: Optional[PlaceFilter] = None,
    extra_score: Optional[PlaceScore] = None,
) -> Union[Placement, Wait]:
    """Filter, then score: the most free memory after placing; ties to the fewest
    running, then to the earlier candidate.

    Pure: it reads only its arguments (and calls the two callables), so a plugin's own
    ``fleetrun_place`` can call it to get the built-in decision and adjust it.

    :param requires: the task's ``requires``.
    :param candidates: where an attempt could run, with their headroom and limits.
    :param backoff: this task's backoff, per candidate name.
    :param now: the wall-clock time to compare backoff against.
    :param pin: the only candidate allowed (``peer =``, or a retry's machine).
    :param est_mem_mb: the memory a task is expected to take, per candidate name
        (default: that candidate's ``mem_per_task_mb``).
    :param extra_filter: called for each candidate that passed every built-in check
        (so never for one that :func:`why_not` excludes); a non-empty string excludes
        it, and the reason given for it is ``"<candidate> <string>"`` (``this machine``
        or the peer's name first, as in :func:`why_not`). Nothing clears such a reason
        by itself, so it counts as :func:`blocked`: when every candidate is held by one
        (or by a built-in reason only a person can change), the Wait is ``operator``.
    :param extra_score: called for each candidate that passed every check, the
        built-in ones and ``extra_filter``; its result is added to the built-in score
        (see :func:`score`: free memory after placing, in MB).
    :return: a :class:`Placement`, or a :class:`Wait` whose reason names every
        candidate that was considered and why it could not take the task, joined
        with ``; ``; ``until`` is the earliest end of a backoff, if any. When every
        candidate is :func:`blocked` (or there is none), the Wait is ``operator``
        and that names what only a person can change.
    """
    requires = list(requires)
    backoff = backoff or {}
    est_mem_mb = est_mem_mb or {}
    pool = candidates
    if pin is not None:
        pool = [c for c in candidates if c.name == pin]
        if not pool:
            return Wait(unpaired(pin), operator=unpaired(pin))
    reasons: list[str] = []
    filtered: dict[str, str] = {}
    best: Optional[Candidate] = None
    best_key: tuple[int, float, int] = (0, 0.0, 0)
    for c in pool:
        est = est_mem_mb.get(c.name, c.mem_per_task_mb)
        why = why_not(c, requires, est, backoff.get(c.name), now)
        if not why and extra_filter is not None:
            said = extra_filter(c)
            if said:
                why = filtered[c.name] = f"{label(c)} {said}"
        if why:
            reasons.append(why)
            continue
        key = score(c, est, extra_score(c) if extra_score is not None else 0.0)
        if best is None or key < best_key:
            best, best_key = c, key
    if best is None:
        names = {c.name for c in pool}
        until = min((b.until for n, b in backoff.items() if b.until > now and n in names), default=None)
        # a plugin's rule is code no pass changes: only a person (editing it) clears it
        stuck = [blocked(c, requires) or filtered.get(c.name) for c in pool]
        operator = "; ".join(s for s in stuck if s) if all(stuck) else None
        return Wait(
            "; ".join(reasons) or "no machine can take tasks",
            until=until,
            operator=operator if pool else "no machine can take tasks",
        )
    return Placement(best.name, reason=f"placed on {label(best)}")

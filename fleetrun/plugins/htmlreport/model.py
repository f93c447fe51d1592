"""What the HTML report shows, worked out from the ledger: the tasks of a run, their
attempts placed on a timeline (one lane per host), the waits between them, the table's
rows and each task's details.

Pure data: this module reads the ledger through its public API (``tasks``,
``attempts``, ``verdicts``, ``transitions``, ``notes``) and the prompt files the
attempts kept, and returns plain objects the template draws. Every string it returns
comes from the ledger as it is (much of it written by an agent): the template escapes
it; nothing here builds markup. Geometry (pixels) is computed here so that the
template holds no arithmetic.
"""

from __future__ import annotations

import functools
import json
import os
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from ...ledger import Attempt, Ledger, Task, TransitionRow, VerdictRow

#: How the table sorts: what needs a person first, then what is under way, waiting, and
#: what is over.
STATE_ORDER = (
    "NEEDS_HUMAN",
    "RETRYING",
    "RESUMING",
    "VERIFYING",
    "RUNNING",
    "ASSIGNED",
    "READY",
    "PENDING",
    "CANCELLED",
    "DONE",
)
#: Attempt outcome (as the transition that ended it says) -> the bar's class.
ENDED_BY = {
    "DONE": "done",
    "RETRYING": "failed",
    "NEEDS_HUMAN": "needs-human",
    "RESUMING": "died",
    "CANCELLED": "cancelled",
}
#: What a wait in each state is for, on the timeline.
WAIT_FOR = {
    "PENDING": "its dependencies",
    "READY": "a slot",
    "RETRYING": "its retry (backoff)",
    "RESUMING": "its resume",
    "ASSIGNED": "its start",
}

#: The timeline's drawing: width of the time axis, a lane row's height, the lane label column.
WIDTH = 950
ROW = 18
LABEL = 140
#: The shortest bar drawn, so a 2-second attempt of a 10-hour night stays visible.
MIN_BAR = 3.0
#: A verifier's output in the details: its head (the first failure) and tail (the
#: summary), as the retry prompt holds them.
HEAD_LIMIT = 4000
TAIL_LIMIT = 8000
#: The most of an attempt's prompt file read.
PROMPT_LIMIT = 32 * 1024

_FETCH = re.compile(r"git fetch ssh://[^\s`'\"]+ [^\s`'\"]+")


@dataclass
class Segment:
    """A part of a bar: the setup, the agent, or one verifier."""

    x: float
    w: float
    kind: str  # setup | agent | verify-pass | verify-fail | verify-error
    title: str


@dataclass
class Bar:
    """One attempt on the timeline."""

    anchor: str
    task: str
    number: int
    host: str
    x: float
    y: float
    w: float
    outcome: str
    title: str
    segments: list[Segment] = field(default_factory=list)
    wait: Optional[Segment] = None
    label: str = ""  # the task's name, written on the bar when it fits


@dataclass
class Lane:
    """One host's lane: its attempts, packed into as many rows as ran at once."""

    name: str
    y: float
    height: float
    rows: int


@dataclass
class Arrow:
    """A dependency: from the end of the dependency's last attempt to the start of the
    dependent's first."""

    x1: float
    y1: float
    x2: float
    y2: float
    title: str


@dataclass
class VerdictView:
    label: str
    kind: str
    outcome: str  # pass | fail | error
    reason: str
    head: str
    tail: str
    cut: bool
    duration: str
    cost: str


@dataclass
class AttemptView:
    number: int
    kind: str
    host: str
    outcome: str
    ended_by: str
    started: str
    duration: str
    cost: str
    prompt: str
    verdicts: list[VerdictView]
    error: str = ""  # a verifier that could not judge, as the attempt's info keeps it


@dataclass
class TaskView:
    anchor: str
    id: str
    name: str
    state: str
    attempts: int
    retries: int
    host: str
    duration: str
    cost: str
    branch: str
    fetch: str
    reason: str
    depends_on: list[str]
    transitions: list[tuple[str, str, str, str, str]]  # time, from, to, cause, host
    attempt_views: list[AttemptView]
    handoff_gave: str
    handoff_received: list[tuple[str, str]]
    notes: list[str]


@dataclass
class Report:
    title: str
    generated: str
    started: str
    span: str
    counts: list[tuple[str, int]]
    cost: str
    tasks: list[TaskView]
    lanes: list[Lane]
    bars: list[Bar]
    arrows: list[Arrow]
    ticks: list[tuple[float, str]]
    width: float
    height: float
    label_width: float
    live: bool


def clock(t: Optional[float]) -> str:
    return _clock(int(t)) if t else ""


@functools.lru_cache(maxsize=4096)
def _clock(t: int) -> str:
    # a night's thousands of transitions fall on far fewer seconds; localtime is not free
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def duration(seconds: Optional[float]) -> str:
    if seconds is None:
        return ""
    s = int(round(max(0.0, seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def money(usd: Optional[float]) -> str:
    if usd is None:
        return "unknown"
    # a cheap verifier's fraction of a cent is not nothing
    return f"${usd:.2f}" if usd == 0 or usd >= 0.1 else f"${usd:.3f}" if usd >= 0.001 else "<$0.001"


def head_tail(text: str) -> tuple[str, str, bool]:
    """``text`` as the retry prompt shows it: whole if short, else its head and tail."""
    if len(text) <= HEAD_LIMIT + TAIL_LIMIT:
        return text, "", False
    return text[:HEAD_LIMIT], text[-TAIL_LIMIT:], True


def read_prompt(att: Attempt) -> str:
    """The prompt an attempt was given, from its folder in the home (a peer's attempt
    keeps it on the peer: not shown)."""
    if not att.dir:
        return ""
    path = os.path.join(att.dir, "prompt")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return ""
    try:
        import stat

        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return ""
        data = os.read(fd, PROMPT_LIMIT + 1)
    except OSError:
        return ""
    finally:
        os.close(fd)
    text = data[:PROMPT_LIMIT].decode("utf-8", "replace")
    return text + ("\n[... cut ...]" if len(data) > PROMPT_LIMIT else "")


def verify_error(a: Attempt) -> str:
    """The verifier that could not judge this attempt (``info["verify_error"]``:
    label, error kind, reason), read defensively: whatever shape it has, text or nothing."""
    found = (a.info or {}).get("verify_error") if isinstance(a.info, dict) else None
    if not isinstance(found, dict):
        return ""
    label, kind, reason = (str(found.get(k, "") or "") for k in ("label", "error", "reason"))
    return f"{label}: {reason}" + (f" ({kind})" if kind else "")


def verdict_outcome(v: VerdictRow) -> str:
    """pass, fail, or error (a verifier that could not judge: the kind the ledger holds
    when it has one, read defensively)."""
    if v.passed:
        return "pass"
    if getattr(v, "error", False) or str(getattr(v, "verdict", "") or "").lower() == "error":
        return "error"
    return "fail"


def _json(value: Any) -> str:
    if value is None:
        return ""
    try:
        return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)
    except (TypeError, ValueError):
        return str(value)


def choose_tasks(ledger: Ledger, queue_ids: Optional[list[str]] = None) -> list[Task]:
    """The tasks of ``queue_ids`` (all tasks of the ledger with None), in queue order."""
    if queue_ids is None:
        return ledger.tasks()
    return [t for q in queue_ids for t in ledger.tasks(queue_id=q)]


def build(ledger: Ledger, tasks: list[Task], title: str, live: bool = False, now: Optional[float] = None) -> Report:
    """The report of ``tasks`` as the ledger has them now."""
    now = time.time() if now is None else now
    ids = {t.id for t in tasks}
    anchors = {t.id: f"task-{i}" for i, t in enumerate(tasks)}
    by_id = {t.id: t for t in tasks}
    attempts: dict[str, list[Attempt]] = {}
    for a in ledger.attempts():
        if a.task_id in ids:
            attempts.setdefault(a.task_id, []).append(a)
    verdicts: dict[str, list[VerdictRow]] = {}
    for v in ledger.verdicts():
        if v.task_id in ids:
            verdicts.setdefault(v.attempt_id, []).append(v)
    transitions: dict[str, list[TransitionRow]] = {}
    for tr in ledger.transitions():
        if tr.task_id in ids:
            transitions.setdefault(tr.task_id, []).append(tr)

    # -- the time axis
    times = [t.created for t in tasks]
    for atts in attempts.values():
        for a in atts:
            times.append(a.created)
            times.append(_end(a, verdicts.get(a.id, []), now))
    for trs in transitions.values():
        times.extend(tr.time for tr in trs)
    t0 = min(times) if times else now
    t1 = max(times) if times else now
    span = max(t1 - t0, 1.0)

    def x(t: float) -> float:
        return round(LABEL + (t - t0) / span * WIDTH, 2)

    # -- lanes: one per host, attempts packed into rows (greedy, by start)
    hosts: dict[str, list[Attempt]] = {}
    for atts in attempts.values():
        for a in atts:
            hosts.setdefault(a.host or "?", []).append(a)
    lane_order = sorted(hosts, key=lambda h: (h != "local", h.startswith("mailbox"), h))
    lanes: list[Lane] = []
    row_of: dict[str, tuple[float, int]] = {}  # attempt id -> (lane y, row)
    y = 24.0
    for h in lane_order:
        ends: list[float] = []
        for a in sorted(hosts[h], key=lambda a: (a.created, a.number)):
            end = _end(a, verdicts.get(a.id, []), now)
            start_px, end_px = x(a.created), max(x(end), x(a.created) + MIN_BAR)
            row = next((i for i, e in enumerate(ends) if e <= start_px - 1), None)
            if row is None:
                row = len(ends)
                ends.append(end_px)
            else:
                ends[row] = end_px
            row_of[a.id] = (y, row)
        rows = max(1, len(ends))
        lanes.append(Lane(name=h, y=y, height=rows * ROW + 8, rows=rows))
        y += rows * ROW + 8
    height = y + 4

    bars: list[Bar] = []
    first_bar: dict[str, Bar] = {}
    last_bar: dict[str, Bar] = {}
    for t in tasks:
        trs = transitions.get(t.id, [])
        for a in attempts.get(t.id, []):
            if a.id not in row_of:
                continue
            lane_y, row = row_of[a.id]
            vs = verdicts.get(a.id, [])
            end = _end(a, vs, now)
            outcome, ended_by, why = _outcome(a, trs)
            bx, bw = x(a.created), max(x(end) - x(a.created), MIN_BAR)
            by = lane_y + 4 + row * ROW
            cost = money(a.cost_usd) if a.cost_usd is not None else "unknown"
            bar_title = (
                f"{t.name} · attempt {a.number} ({a.kind}) on {a.host}\n"
                f"{outcome_words(outcome, ended_by)} · {duration(end - a.created)} · {cost}"
                + (f"\n{why}" if why and why != "verify_pass" else "")
            )
            bar = Bar(
                anchor=anchors[t.id],
                task=t.name,
                number=a.number,
                host=a.host or "?",
                x=bx,
                y=by,
                w=round(bw, 2),
                outcome=outcome,
                title=bar_title,
                label=_fit(t.name, bw),
            )
            started = _clamp(a.started, a, now)
            if started and started > a.created:
                bar.segments.append(
                    Segment(bx, round(max(x(started) - bx, 0.5), 2), "setup", f"setup {duration(started - a.created)}")
                )
            for v in vs:
                vo = verdict_outcome(v)
                # within its bar, whatever the clocks said (a peer's verdict is timed there)
                vx1 = min(max(x(v.time - max(v.duration_s or 0.0, 0.0)), bx), bx + bw - 1.0)
                vx2 = min(max(x(v.time), vx1 + 1.0), bx + bw)
                bar.segments.append(
                    Segment(
                        round(vx1, 2),
                        round(max(vx2 - vx1, 1.0), 2),
                        f"verify-{vo}",
                        f"verify {v.kind} {v.label}: {vo.upper()} ({duration(v.duration_s)})",
                    )
                )
            wait = _wait_before(a, trs)
            if wait is not None:
                since, state, cause = wait
                if a.created - since >= 0.5:
                    what = WAIT_FOR.get(state, state.lower())
                    if cause.startswith("usage_limit"):  # the account's limit, not a backoff
                        what = f"the usage limit to reset ({cause})"
                    bar.wait = Segment(
                        x(since),
                        round(bx - x(since), 2),
                        "wait",
                        f"{t.name} waited {duration(a.created - since)} for {what}",
                    )
            bars.append(bar)
            first_bar.setdefault(t.id, bar)
            last_bar[t.id] = bar

    arrows: list[Arrow] = []
    for t in tasks:
        dst = first_bar.get(t.id)
        for dep in t.deps:
            src = last_bar.get(dep)
            if dst is None or src is None:
                continue
            arrows.append(
                Arrow(
                    x1=round(src.x + src.w, 2),
                    y1=src.y + 6,
                    x2=dst.x,
                    y2=dst.y + 6,
                    title=f"{by_id[dep].name} → {t.name}",
                )
            )

    # the start's clock, then round times: the axis reads as a clock across the night
    ticks: list[tuple[float, str]] = [(x(t0), time.strftime("%H:%M:%S", time.localtime(t0)))]
    step = _tick_step(span)
    k = (int(t0 // step) + 1) * step
    if k - t0 < step / 2:  # too close to the start's label
        k += step
    while k < t1 and len(ticks) < 40:
        ticks.append((x(k), time.strftime("%H:%M" if step >= 60 else "%H:%M:%S", time.localtime(k))))
        k += step

    views = [
        _task_view(t, anchors, by_id, attempts.get(t.id, []), verdicts, transitions.get(t.id, []), ledger, now)
        for t in tasks
    ]
    rank = {s: i for i, s in enumerate(STATE_ORDER)}
    views.sort(key=lambda v: rank.get(v.state, len(rank)))
    counts: dict[str, int] = {}
    for t in tasks:
        counts[t.state.value] = counts.get(t.state.value, 0) + 1
    return Report(
        title=title,
        generated=clock(now),
        started=clock(t0 if tasks else None),
        span=duration(t1 - t0),
        counts=sorted(counts.items(), key=lambda kv: rank.get(kv[0], len(rank))),
        cost=money(sum(t.cost_usd for t in tasks)),
        tasks=views,
        lanes=lanes,
        bars=bars,
        arrows=arrows,
        ticks=ticks,
        width=LABEL + WIDTH + 10,
        height=height,
        label_width=LABEL,
        live=live,
    )


def outcome_words(outcome: str, ended_by: str) -> str:
    return {
        "done": "DONE",
        "failed": f"verify failed → {ended_by}",
        "needs-human": "NEEDS_HUMAN",
        "died": "ended early → RESUMING",
        "verifier-error": f"a verifier could not judge → {ended_by}",
        "cancelled": "CANCELLED",
        "running": "under way",
    }.get(outcome, ended_by or outcome)


def _clamp(t: Optional[float], a: Attempt, now: float) -> Optional[float]:
    """An attempt's start or end as drawn: within its lease and now. A peer's shepherd
    reports them, by its own clock: a wrong one must not stretch the whole axis."""
    if t is None or t != t:  # None, NaN
        return None
    return min(max(t, a.created), max(now, a.created))


def _end(a: Attempt, vs: list[VerdictRow], now: float) -> float:
    ends = [_clamp(a.ended, a, now) or 0.0, _clamp(a.started, a, now) or 0.0, a.created] + [v.time for v in vs]
    end = max(ends)
    if a.ended is None and a.state in ("leased", "starting", "running"):
        end = max(end, now)
    return end


def _outcome(a: Attempt, trs: list[TransitionRow]) -> tuple[str, str, str]:
    """How the attempt ended, as the transition that ended it says: the bar's class,
    the state it led to, and that transition's cause."""
    for tr in trs:
        # an operator's cancel names no attempt: it ends the one under way
        mine = tr.attempt == a.number or (tr.attempt is None and tr.to_state == "CANCELLED")
        if mine and tr.to_state in ENDED_BY and tr.time >= a.created - 1:
            if tr.cause.startswith("verifier_error"):  # the verifier's failure, not the agent's
                return "verifier-error", tr.to_state, tr.cause
            return ENDED_BY[tr.to_state], tr.to_state, tr.cause
    if a.state in ("abandoned",):
        return "died", a.outcome or "abandoned", a.outcome or ""
    return "running", "", ""


def _wait_before(a: Attempt, trs: list[TransitionRow]) -> Optional[tuple[float, str, str]]:
    """Since when, in which state and after which cause the task waited before this
    attempt was placed."""
    last: Optional[TransitionRow] = None
    for tr in trs:
        if tr.time <= a.created + 1e-6 and tr.to_state != "ASSIGNED":
            last = tr
        elif tr.time > a.created:
            break
    if last is None or last.to_state not in WAIT_FOR:
        return None
    # a READY task first waited PENDING for its dependencies: the wait runs from then
    since, state, cause = last.time, last.to_state, last.cause
    for tr in trs:
        if tr.to_state == "PENDING" and tr.time <= since and last.to_state == "READY" and tr.attempt is None:
            since, state = tr.time, "PENDING"
    return since, state, cause


def _fit(name: str, width: float) -> str:
    """``name`` cut to what a bar ``width`` pixels wide holds (about 6 px a character),
    or nothing when not even a few characters fit."""
    room = int((width - 6) // 6)
    if room < 4:
        return ""
    return name if len(name) <= room else name[: room - 1] + "…"


def _tick_step(span: float) -> float:
    for step in (1, 5, 10, 30, 60, 300, 600, 1800, 3600, 7200, 14400):
        if span / step <= 12:
            return float(step)
    return 21600.0


def _task_view(
    t: Task,
    anchors: dict[str, str],
    by_id: dict[str, Task],
    atts: list[Attempt],
    verdicts: dict[str, list[VerdictRow]],
    trs: list[TransitionRow],
    ledger: Ledger,
    now: float,
) -> TaskView:
    views = []
    for a in atts:
        outcome, ended_by, _ = _outcome(a, trs)
        vs = []
        for v in verdicts.get(a.id, []):
            head, tail, cut = head_tail(v.output or "")
            vs.append(
                VerdictView(
                    label=v.label,
                    kind=v.kind,
                    outcome=verdict_outcome(v),
                    reason=v.reason or "",
                    head=head,
                    tail=tail,
                    cut=cut,
                    duration=duration(v.duration_s),
                    cost=money(v.cost_usd),
                )
            )
        end = _end(a, verdicts.get(a.id, []), now)
        views.append(
            AttemptView(
                number=a.number,
                kind=a.kind,
                host=a.host,
                outcome=outcome,
                ended_by=ended_by,
                started=clock(a.started or a.created),
                duration=duration(end - a.created),
                cost=money(a.cost_usd),
                prompt=read_prompt(a),
                verdicts=vs,
                error=verify_error(a),
            )
        )
    first = min((a.created for a in atts), default=None)
    last = max((_end(a, verdicts.get(a.id, []), now) for a in atts), default=None)
    handoff = _json(t.handoff)
    fetch = ""
    if t.host and t.host != "local" and not t.host.startswith("mailbox"):
        found = _FETCH.search(handoff) or next(
            (m for m in (_FETCH.search(n) for _, n in ledger.notes(t.id)) if m), None
        )
        fetch = found.group(0) if found else ""
    received = [(by_id[d].name if d in by_id else d, _json(by_id[d].handoff if d in by_id else None)) for d in t.deps]
    return TaskView(
        anchor=anchors[t.id],
        id=t.id,
        name=t.name,
        state=t.state.value,
        attempts=t.attempts,
        retries=t.retries,
        host=t.host or "",
        duration=duration(last - first) if first is not None and last is not None else "",
        cost=money(t.cost_usd),
        branch=t.branch or "",
        fetch=fetch,
        reason=t.reason or "",
        depends_on=[by_id[d].name if d in by_id else d for d in t.deps],
        transitions=[(clock(tr.time), tr.from_state or "", tr.to_state, tr.cause, tr.host or "") for tr in trs],
        attempt_views=views,
        handoff_gave=handoff,
        handoff_received=received,
        notes=[text for _, text in ledger.notes(t.id)],
    )

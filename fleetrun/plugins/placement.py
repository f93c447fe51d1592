"""Built-in ``placement`` plugin: this machine as a candidate (:func:`local_candidate`,
which the ``local`` plugin's host answers ``candidate()`` with), and the default place hook.

This machine's headroom is measured with psutil on every pass that has a task to
place: free memory, load per core, free disk where worktrees live, tasks holding a
slot, and the memory the running attempts' agents take (see :class:`MemorySampler`).
Tools are probed (:mod:`fleetrun.probe`) only when a task waiting for a place has
``requires``. The decision itself is :func:`fleetrun.placement.decide`, a pure function;
:func:`builtin_place` adds the pins and the backoff around it and brings in what the
``fleetrun_place_filter``/``fleetrun_place_score`` hooks say (:func:`plugin_rules`).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections import OrderedDict
from collections.abc import Container
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from .. import clock
from ..hookimpl import hookimpl
from ..ledger import LEDGER_KEY
from ..placement import PlaceFilter, PlaceScore, decide, parse_requirement, reason_shape
from ..policy import POLICY_KEY, local_drain_source
from ..probe import Prober, tool_names
from ..reports import Candidate, Placement, Wait
from ..stash import Stash, StashKey
from ..states import ACTIVE, PLACEABLE, State
from ..taskview import tasks_in

#: A declaration the loop reads (not a hook): this plugin's ``fleetrun_place`` and its
#: filters and scores decide from the task, the candidates, the policy, the tasks holding
#: slots and its backoff alone, so a waiting task's decision is kept until one of those
#: changes (:meth:`fleetrun.starting.Starting.pure_placement`).
PURE_PLACEMENT = True

if TYPE_CHECKING:
    from ..config import Config

#: An attempt's memory counts toward the estimate once its agent has run this long
#: (an agent that just started has not loaded much yet).
SETTLE_S = 10.0
#: How many attempts' peaks the estimate is the mean of (the most recent ones).
KEEP_PEAKS = 50


def local_running(config: Config) -> int:
    """Tasks that hold a slot here: placed, running, or being verified (a verifier such
    as a test suite takes the machine as much as the agent did)."""
    return sum(1 for t in tasks_in(config, ACTIVE) if t.host in (None, "local"))


def _existing(path: Path) -> Path:
    while not path.exists() and path.parent != path:
        path = path.parent
    return path


def measure_local(path: str) -> dict[str, Optional[float]]:
    """Free memory (MB), load per core (1-minute) and free disk (MB) at ``path``;
    None for what could not be measured."""
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
        out["free_disk_mb"] = psutil.disk_usage(str(_existing(Path(path)))).free / 2**20
    except Exception:
        out["free_disk_mb"] = None
    return out


def tree_rss_mb(pid: int, token: Optional[str] = None) -> Optional[float]:
    """The resident memory of ``pid`` and all its descendants, in MB; None if it is
    gone, not ours to read, or (``token`` given) a reused pid."""
    import psutil

    from ..shepherd import proc_token

    if token is not None and proc_token(pid) != token:
        return None
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except (psutil.Error, OSError):
        return None
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except (psutil.Error, OSError):
            continue  # a child that ended meanwhile
    return total / 2**20


class MemorySampler:
    """The memory the running attempts here take, sampled on every placing pass.

    Each running attempt's agent process tree (its pid from the shepherd's
    ``status.json``) is measured; an attempt's figure is the highest seen. Once some
    attempt has run :data:`SETTLE_S`, the mean of those figures over the last
    :data:`KEEP_PEAKS` attempts is the estimate for a new task, replacing
    ``mem_per_task_mb``.
    """

    def __init__(self, measure: Callable[[int, Optional[str]], Optional[float]] = tree_rss_mb) -> None:
        self.measure = measure
        self.peaks: OrderedDict[str, float] = OrderedDict()

    def sample(self, attempts: list[tuple[str, dict[str, Any]]], now: float) -> None:
        """:param attempts: (attempt id, its status.json) of the running attempts."""
        for aid, st in attempts:
            pid = st.get("agent_pid")
            started = st.get("agent_started")
            if not pid or st.get("state") != "running" or not isinstance(started, (int, float)):
                continue
            if now - started < SETTLE_S and aid not in self.peaks:
                continue
            mb = self.measure(int(pid), st.get("agent_token"))
            if mb is None:
                continue
            self.peaks[aid] = max(mb, self.peaks.get(aid, 0.0))
            self.peaks.move_to_end(aid)
        while len(self.peaks) > KEEP_PEAKS:
            self.peaks.popitem(last=False)

    def estimate(self) -> Optional[float]:
        """The mean measured memory per task (MB), or None before any is known."""
        if not self.peaks:
            return None
        return sum(self.peaks.values()) / len(self.peaks)


#: The memory per task measured on this machine over the run (placement's estimate).
MEMORY_KEY = StashKey[MemorySampler]()
#: The tools probed on this machine, cached for the run (a probe runs ``--version``s).
PROBER_KEY = StashKey[Prober]()
#: task id -> the reason it was last told to wait (:func:`steady` keeps it word for word).
REASONS_KEY = StashKey[dict[str, str]]()
#: This pass's candidates and the waits decided for them, per task shape (:func:`same_pass`).
PASS_KEY = StashKey[tuple[list[Candidate], dict[Any, Wait]]]()
#: whether a placeable task has ``requires`` (tools are probed only then), for a list of the
#: view (read from its rows)
WANTS_TOOLS_KEY = StashKey[tuple[list[Any], bool]]()
#: what the fleetrun_place_filter/score hooks said this pass (:class:`PassRules`)
RULES_KEY = StashKey["PassRules"]()


def running_statuses(
    config: Config, now: Optional[float] = None, known: Container[str] = ()
) -> list[tuple[str, dict[str, Any]]]:
    """(attempt id, status.json) of the attempts running on this machine.

    Given ``now``, an attempt whose shepherd started less than :data:`SETTLE_S` before
    it and that is not in ``known`` is left out, its file not read: its agent started
    later still, so :meth:`MemorySampler.sample` would pass over it (a run of short
    tasks read every running attempt's file on every pass, for nothing)."""
    from ..hosts import read_status  # checked: the agent can write to its attempt folder

    led = config.stash.get(LEDGER_KEY)
    if led is None:
        return []
    out = []
    for att in led.attempts(states={"running"}, host="local"):
        if now is not None and att.started is not None and now - att.started < SETTLE_S and att.id not in known:
            continue
        st, _ = read_status(config.home / "attempts" / att.id)
        if st:
            out.append((att.id, st))
    return out


def configured_tools(config: Config) -> dict[str, str]:
    """Tool name -> executable: the probed tools plus ``[relay] tools``; ``claude`` is
    the executable ``[claude] executable`` names."""
    extra = config.setting("relay", "tools", []) or []
    names = tool_names(x for x in extra if isinstance(x, str)) if isinstance(extra, list) else tool_names()
    exe = {n: n for n in names}
    claude = config.setting("claude", "executable")
    if isinstance(claude, str) and claude:
        exe["claude"] = claude
    return exe


def configured_tags(config: Config) -> list[str]:
    tags = config.setting("relay", "tags", []) or []
    return [t for t in tags if isinstance(t, str)] if isinstance(tags, list) else []


def _wants_tools(config: Config) -> bool:
    """Whether a placeable task ``requires`` something (the tools are probed only then).

    Read from the view's rows (the spec's ``requires`` is a narrow column), so no
    waiting task's spec is parsed for it, and kept until the view's list changes."""
    tasks = tasks_in(config, PLACEABLE)
    memo = config.stash.get(WANTS_TOOLS_KEY)
    if memo is not None and memo[0] is tasks:  # the view's list: the same until one of them changes
        return memo[1]
    wants = any(t.has_requirements() for t in tasks)  # from the view's rows: no spec parsed
    config.stash[WANTS_TOOLS_KEY] = (tasks, wants)
    return wants


def local_candidate(config: Config) -> Candidate:
    """This machine as a placement candidate: what the ``local`` plugin's host answers
    to ``candidate()`` (measured on every pass that has a task to place)."""
    policy = config.stash.get(POLICY_KEY)
    local = policy.local if policy is not None else None
    led = config.stash.get(LEDGER_KEY)
    drain = bool(local and local.drain) or (led is not None and led.get_meta("drain") == "1")
    # a drain `fleetrun undrain` cannot clear says where it is set
    why_not = None
    if local is not None and local.drain:
        why_not = f"is draining ({local_drain_source(config.home / 'policy.toml') or 'policy.toml'})"
    opt = config.getoption("max_tasks")
    max_tasks = opt if opt is not None else (local.max_tasks if local else 4)
    running = local_running(config)
    # it can take nothing, whatever its free memory, load, disk and tools: placement's
    # reason is the drain or the full slots (they come before the floors and the
    # requirements), so those are not measured (most passes of a busy run: a slot freed is)
    full = bool(why_not or drain or running >= int(max_tasks))
    if full:
        m: dict[str, Optional[float]] = {"free_mem_mb": None, "load_per_core": None, "free_disk_mb": None}
    else:
        m = measure_local(str(config.home))

    now = time.time()
    sampler: MemorySampler = config.stash.setdefault(MEMORY_KEY, MemorySampler())
    sampler.sample(running_statuses(config, now, sampler.peaks), now)
    measured = sampler.estimate()
    per_task = float(local.mem_per_task_mb) if local else 1024.0

    tools: dict[str, Optional[str]] = {}
    auth: frozenset[str] = frozenset()
    if not full and _wants_tools(config):
        prober: Prober = config.stash.setdefault(PROBER_KEY, Prober())
        probe = prober.get(configured_tools(config))
        tools, auth = dict(probe.tools), probe.auth
    return Candidate(
        name="local",
        kind="local",
        free_mem_mb=m["free_mem_mb"],
        load_per_core=m["load_per_core"],
        free_disk_mb=m["free_disk_mb"],
        running=running,
        max_tasks=int(max_tasks),
        drain=drain,
        tags=frozenset(configured_tags(config)),
        tools=tools,
        auth=auth,
        mem_per_task_mb=measured if measured is not None else per_task,
        min_free_mem_mb=local.min_free_mem_mb if local else None,
        max_load_per_core=local.max_load_per_core if local else None,
        min_free_disk_mb=local.min_free_disk_mb if local else None,
        info={"mem_estimate": "measured" if measured is not None else "mem_per_task_mb"},
        why_not=why_not,
    )


#: Why each reason of :func:`stays_local` keeps a task here, for the validate error.
_WHY_HERE = {
    "a role": "its role's session is on this machine",
    'base = "dependencies"': "the dependencies' branches are merged here",
}


def _is_local_pin(pin: str) -> bool:
    # os.uname().nodename is socket.gethostname(), without importing socket on every command
    return pin in ("local", "localhost", os.uname().nodename)


def check_pins(config: Config, items: list[Any]) -> None:
    """A task pinned to a peer that must run here would wait for ever and end the run
    with ``cannot place``: an error before anything runs, at the line of its pin.

    :raises UsageError: one per such task.
    """
    from ..collect import display_path
    from ..exceptions import UsageError, UsageErrors
    from ..textutil import safe_name, safe_text

    errors = []
    for t in items:
        why_local = stays_local(t) if t.peer is not None and not _is_local_pin(t.peer) else None
        if why_local is None:
            continue
        because = _WHY_HERE.get(
            why_local, "the verifier runs here, and without git_ref the work on a peer is on no branch to fetch back"
        )
        errors.append(
            UsageError(
                f"pinned to {safe_text(t.peer)}, but a task with {why_local} runs on this machine ({because})",
                file=display_path(Path(t.file_of("peer") or t.source or "?"), config.invocation_dir),
                line=t.key_lines.get("peer", t.line),
                key=f"task '{safe_name(t.name)}': peer",
            )
        )
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise UsageErrors(errors)


def stays_local(spec: Any) -> Optional[str]:
    """Why a task must run on the supervising machine, or None: a role (the mailbox
    is local); ``base = "dependencies"`` (its dependencies' branches are merged here,
    where they were fetched back to); or a ``brain``/``agent`` verifier without a
    ``git_ref`` (those verifiers run here, on the task's branch fetched back from the
    peer, and without a ``git_ref`` the work on a peer is on no branch to fetch)."""
    if spec.role:
        return "a role"
    if getattr(spec, "merges_dependencies", False):  # the branches it merges are here
        return 'base = "dependencies"'
    if not spec.git_ref:
        kinds = sorted({v.kind for v in spec.verify if v.kind in ("brain", "agent")})
        if kinds:
            return f"a{'n' if kinds[0] == 'agent' else ''} {kinds[0]} verifier and no git_ref"
    return None


@hookimpl(trylast=True)
def fleetrun_place(task: Any, candidates: list[Candidate], policy: Any, config: Config) -> Union[Placement, Wait]:
    return builtin_place(task, candidates, config)


def builtin_place(
    task: Any,
    candidates: list[Candidate],
    config: Config,
    extra_filter: Optional[PlaceFilter] = None,
    extra_score: Optional[PlaceScore] = None,
) -> Union[Placement, Wait]:
    """The built-in placement decision for ``task``, every check included: the pin
    (``peer =``; a retry or resume goes back to its machine; a task with a role, or a
    ``brain``/``agent`` verifier without ``git_ref``, stays here), one task at a time in
    a checkout without ``git_ref``, this task's backoff, then :func:`~fleetrun.placement.decide`
    with the ``fleetrun_place_filter``/``fleetrun_place_score`` hooks' results.

    What the default ``fleetrun_place`` returns. A plugin's own ``fleetrun_place`` can
    call it to get the built-in decision and adjust it.

    :param task: the task to place (a :class:`~fleetrun.ledger.Task`).
    :param candidates: this pass's candidates (the list ``fleetrun_place`` was given:
        the per-pass memory is kept for that list).
    :param config: the run's config.
    :param extra_filter: a filter of your own, applied after the hooks' filters (see
        ``decide``'s ``extra_filter``). As for the hooks, a wait is remembered for the
        rest of the pass: the same task asked again in the pass gets the same wait.
    :param extra_score: a score of your own, added to the hooks' scores.
    :return: a :class:`~fleetrun.Placement` or a :class:`~fleetrun.Wait`.
    """
    pin = task.spec.peer
    if pin is not None and _is_local_pin(pin):
        pin = "local"
    why_local = stays_local(task.spec)
    kept_here = False  # kept here by what the task is, not by the user's `peer =`
    if why_local is not None and task.spec.role:
        if pin is not None and pin != "local":
            why = f"a task with {why_local} runs on this machine, but it is pinned to {pin}"
            return Wait(why, operator=why)
        kept_here = pin is None
        pin = "local"  # the mailbox is this machine's
    elif why_local is not None:
        # what it needs here (the branches it merges, the worktree its verifiers read) is
        # on any host whose workspaces are folders on this machine: this one, or a
        # cluster on a shared filesystem (fleetrun-slurm); never a peer
        if pin is not None and not _workspace_here(config, pin):
            why = f"a task with {why_local} runs on this machine, but it is pinned to {pin}"
            return Wait(why, operator=why)
        if pin is None:  # the filter's reason says what keeps it off the peers
            extra_filter = _here_only(config, why_local, extra_filter)
    if task.state in (State.RETRYING, State.RESUMING) and task.host:
        pin = task.host  # same machine, same worktree
    shared = checkout_in_use(config, task)
    if shared is not None:
        return Wait(f"another task works in {shared} (no git_ref)")
    from ..waiting import BACKOFF_KEY  # the loop's: not loaded for `--help`

    backoff = config.stash.get(BACKOFF_KEY, {}).get(task.id, {})
    filt, sc = plugin_rules(config, task, candidates, extra_filter, extra_score)
    decision = same_pass(
        config.stash, candidates, task.spec.requires, pin, backoff, task_id=task.id, extra_filter=filt, extra_score=sc
    )
    if kept_here and why_local is not None and isinstance(decision, Wait):
        decision = _kept_off_peers(decision, why_local, candidates)
    return steady(config.stash.setdefault(REASONS_KEY, {}), task.id, decision)


def _kept_off_peers(wait: Wait, why_local: str, candidates: list[Candidate]) -> Wait:
    """A task that must run here waits for this machine while a peer is live: its
    reason says both halves (``this machine is draining; a task with base =
    "dependencies" runs on this machine (...), not on the live peer mini``), or a person
    reading only the first asks why the live peer does not take it."""
    live = [c.name for c in candidates if c.kind != "local" and c.status == "live" and c.fresh]
    if not live:
        return wait
    because = _WHY_HERE.get(why_local, "its verifier runs here")
    peers = f"the live peer {live[0]}" if len(live) == 1 else f"the live peers {', '.join(live)}"
    also = f"a task with {why_local} runs on this machine ({because}), not on {peers}"
    return dataclasses.replace(
        wait, reason=f"{wait.reason}; {also}", operator=f"{wait.operator}; {also}" if wait.operator else None
    )


def _workspace_here(config: Config, name: str) -> bool:
    from ..hostapi import workspace_here  # the loop's: not loaded for `--help`

    return workspace_here(config, name)


def _here_only(config: Config, why: str, then: Optional[PlaceFilter]) -> PlaceFilter:
    """A filter that passes over the candidates whose workspaces are elsewhere, then ``then``."""

    def filt(c: Candidate) -> Optional[str]:
        if not _workspace_here(config, c.name):
            because = _WHY_HERE.get(why, "its verifier runs here")
            return f"is a peer, and a task with {why} runs where its files are: on this machine ({because})"
        return then(c) if then is not None else None

    return filt


class PassRules:
    """What the ``fleetrun_place_filter``/``fleetrun_place_score`` hooks said in one
    pass, per (task, candidate): each is asked at most once per pair and pass (the
    loop makes a new candidates list every pass; a new list starts afresh)."""

    def __init__(self) -> None:
        self.candidates: Optional[list[Candidate]] = None
        self.filters: dict[tuple[str, str], Optional[str]] = {}
        self.scores: dict[tuple[str, str], float] = {}

    def start(self, candidates: list[Candidate]) -> None:
        if self.candidates is not candidates:
            self.candidates = candidates
            self.filters.clear()
            self.scores.clear()


def _first_reason(results: list[Any]) -> Optional[str]:
    # the first non-empty string, in hook call order (yours before the built-ins')
    return next((r for r in results if isinstance(r, str) and r.strip()), None)


def plugin_rules(
    config: Config,
    task: Any,
    candidates: list[Candidate],
    extra_filter: Optional[PlaceFilter] = None,
    extra_score: Optional[PlaceScore] = None,
) -> tuple[Optional[PlaceFilter], Optional[PlaceScore]]:
    """The filter and score :func:`~fleetrun.placement.decide` applies for ``task``:
    the hooks' results (remembered for this pass) and the given extras; None for
    either when there is nothing to apply, so a fleet without such plugins decides
    as fast as before."""
    hook = config.hook
    has_filter = bool(hook.fleetrun_place_filter.get_hookimpls())
    has_score = bool(hook.fleetrun_place_score.get_hookimpls())
    if not (has_filter or has_score or extra_filter or extra_score):
        return None, None
    rules: PassRules = config.stash.setdefault(RULES_KEY, PassRules())
    rules.start(candidates)

    def filt(c: Candidate) -> Optional[str]:
        said: Optional[str] = None
        if has_filter:
            key = (task.id, c.name)
            if key not in rules.filters:
                rules.filters[key] = _first_reason(hook.fleetrun_place_filter(task=task, candidate=c, config=config))
            said = rules.filters[key]
        if not said and extra_filter is not None:
            said = extra_filter(c)
        return said

    def sc(c: Candidate) -> float:
        total = 0.0
        if has_score:
            key = (task.id, c.name)
            if key not in rules.scores:
                rules.scores[key] = float(sum(hook.fleetrun_place_score(task=task, candidate=c, config=config)))
            total = rules.scores[key]
        return total + (extra_score(c) if extra_score is not None else 0.0)

    return (filt if has_filter or extra_filter else None), (sc if has_score or extra_score else None)


def checkout_of(cwd: str) -> str:
    """The checkout holding ``cwd``: the nearest folder with a ``.git`` (no git run: this
    is asked on every pass), else ``cwd`` itself."""
    path = Path(os.path.realpath(cwd))
    for p in (path, *path.parents):
        if (p / ".git").exists():
            return str(p)
    return str(path)


#: The host of an attempt delivered to a role's mailbox (the mailbox plugin's): it
#: starts no agent, the role's own session does the work.
DELIVERED_HOST = "mailbox"


def checkout_in_use(config: Config, task: Any) -> Optional[str]:
    """A task without ``git_ref`` works in the user's checkout: the checkout, if another
    such task is placed, running or being verified there (two agents in one checkout
    edit, commit and switch branches under each other).

    A task holds its checkout whether or not it declares a ``role`` (issue 21 item 7c: a
    role task that asks for what a mailbox cannot carry is spawned like any other); only
    a task whose attempt was delivered to a role's mailbox holds none, since fleetrun
    started no agent for it. Before it is started, any task may be spawned, so a task
    being placed always waits for the checkout."""
    led = config.stash.get(LEDGER_KEY)
    if led is None or task.spec.git_ref:
        return None
    others = [t for t in tasks_in(config, ACTIVE) if t.id != task.id and not t.spec.git_ref]
    if not others:
        return None
    mine = checkout_of(task.spec.cwd)
    for other in others:
        if checkout_of(other.spec.cwd) == mine and not _delivered(led, other):
            return mine
    return None


def _delivered(led: Any, task: Any) -> bool:
    """Whether the task's current attempt was delivered to a role's mailbox."""
    att = led.latest_attempt(task.id)
    return att is not None and att.host == DELIVERED_HOST


def same_pass(
    stash: Stash,
    candidates: list[Candidate],
    requires: list[str],
    pin: Optional[str],
    backoff: dict[str, Any],
    task_id: Optional[str] = None,
    extra_filter: Optional[PlaceFilter] = None,
    extra_score: Optional[PlaceScore] = None,
) -> Union[Placement, Wait]:
    """:func:`decide`, remembering within one pass what a task of the same shape was told.

    A long queue mostly waits, and tasks with the same ``requires`` and pin get the
    same answer while the candidates are unchanged: the loop makes a new candidates
    list every pass and changes it only after a placement, which clears what is
    remembered. A task with a backoff of its own is always decided afresh, and so is
    every task with a plugin's filter or score, which may look at the task: the loop
    asks a task once a pass, and an answer kept by task id was one entry a waiting task
    held until the next placement (30,000 of them, each a key and a Wait). ``task_id``
    is no longer used (callers still pass it).
    """
    memo: Optional[tuple[list[Candidate], dict[Any, Wait]]] = stash.get(PASS_KEY)
    if memo is None or memo[0] is not candidates:
        memo = stash[PASS_KEY] = (candidates, {})
    key: Optional[tuple[Any, ...]] = (tuple(requires), pin) if not backoff else None
    if extra_filter is not None or extra_score is not None:
        key = None
    hit = memo[1].get(key) if key is not None else None
    if hit is not None:
        return Wait(hit.reason, until=hit.until, operator=hit.operator)
    decision = decide(
        requires, candidates, backoff, clock.now(), pin=pin, extra_filter=extra_filter, extra_score=extra_score
    )
    if isinstance(decision, Placement):
        memo[1].clear()
    elif key is not None:
        memo[1][key] = decision
    return decision


def steady(seen: dict[str, str], task_id: str, decision: Union[Placement, Wait]) -> Union[Placement, Wait]:
    """Keep a waiting task's reason word for word while only its measured figures
    move (free memory changes on every pass), so the loop, which shows a reason
    when it changes, shows it once. The figures are those of when it began."""
    if isinstance(decision, Placement):
        seen.pop(task_id, None)
        return decision
    prev = seen.get(task_id)
    if prev is not None and reason_shape(prev) == reason_shape(decision.reason):
        return Wait(prev, until=decision.until, operator=decision.operator)
    # one string for the many tasks told the same: a decision made afresh for each (with
    # a plugin's filter) words it anew, and the loop keeps a waiting task's reason and
    # what a person must change (30,000 READY tasks: 60,000 copies of the same words)
    reason = sys.intern(decision.reason)
    seen[task_id] = reason
    operator = sys.intern(decision.operator) if decision.operator else decision.operator
    return Wait(reason, until=decision.until, operator=operator)


# -- fleetrun validate -----------------------------------------------------------------


def _requires_line(source: str, head: int, cache: dict[str, Any]) -> int:
    """The line of a task's ``requires =`` (else its ``[[task]]`` line)."""
    from ..tomlfile import map_lines

    if source not in cache:
        try:
            cache[source] = map_lines(Path(source).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            cache[source] = None
    lines = cache[source]
    if lines is None:
        return head
    for where, line in lines.lines.items():
        if len(where) == 2 and where[0] == "task" and line == head:
            return int(lines.lines.get((*where, "requires"), head))
    return head


@hookimpl(trylast=True)
def fleetrun_collection_modifyitems(config: Config, items: list[Any]) -> None:
    """Warn about a ``requires`` entry that is never met: its name (``node`` in
    ``node>=22``) is neither a tag of this machine nor a probed tool. Nothing is probed
    here: whether a probed tool is installed, or new enough, is placement's business.
    Before that, a pin no placement could honour is an error (:func:`check_pins`)."""
    check_pins(config, items)
    tags = set(configured_tags(config))
    tools = list(configured_tools(config))
    from ..queueing import WARNINGS_KEY, warn_tasks
    from ..repochecks import checkout_warnings

    warnings = config.stash.setdefault(WARNINGS_KEY, [])
    cache: dict[str, Any] = {}

    warnings.extend(checkout_warnings(items, config.invocation_dir))
    # once a requirement, at its first task, with how many more (a default of every task,
    # or the same tag in each of 100,000 tasks, is one fact)
    found: dict[str, tuple[Any, int, str]] = {}
    met: set[str] = set()
    for t in items:
        for req in t.requires:
            if req in found:
                first, count, what = found[req]
                found[req] = (first, count + 1, what)
                continue
            if req in met:
                continue
            r = parse_requirement(req)
            if r is None or r.name in tags or r.name in tools:
                met.add(req)
                continue
            found[req] = (t, 1, f"`{req}`" if r.bare else f"`{req}`: `{r.name}`")
    probed = ", ".join(tools)
    for first, count, what in found.values():
        # where requires was written: the task, or the default it took (the project file);
        # the file is read again only for a collector that kept no key_lines
        line = (
            first.key_lines["requires"]
            if "requires" in first.key_lines
            else _requires_line(first.source, first.line, cache)
            if first.source
            else first.line
        )
        warn_tasks(
            config,
            first,
            count,
            "requires",
            f"{what} is neither a tag of this machine ([relay] tags in config.toml) nor a probed tool ({probed}); "
            "it is never met",
            line=line,
        )

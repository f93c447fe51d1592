"""The CLI verbs. Each ``cmd_VERB(config, out, err)`` returns an exit code."""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional, TextIO

from . import ops
from .exceptions import ExitCode, UsageError
from .ledger import Ledger, Task
from .states import State
from .textutil import safe_name, safe_text


def open_ledger(config: Any) -> Ledger:
    led = config.stash.get("ledger")
    if led is None:
        led = config.stash["ledger"] = Ledger(config.home / "state.db")
    return led


def notifier(config: Any) -> ops.Notify:
    def notify(task: Task, src: State, dst: State, cause: str, attempt: Optional[int]) -> None:
        config.hook.fleetrun_transition(task=task, from_state=src.value, to_state=dst.value,
                                        cause=cause, attempt=attempt, config=config)
    return notify


def collect_items(config: Any) -> list[Any]:
    from .cli import collect

    files = collect(config)
    items = [t for f in files for t in f.tasks]
    config.hook.fleetrun_collection_modifyitems(config=config, items=items)
    config.stash["files"] = files
    return items


def ago(t: Optional[float], now: Optional[float] = None) -> str:
    if not t:
        return "-"
    s = max(0, int((now or time.time()) - t))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d"


# ---------------------------------------------------------------------------------


def cmd_validate(config: Any, out: TextIO, err: TextIO) -> int:
    items = collect_items(config)
    from .collect import display_path

    for f in config.stash["files"]:
        n = len([t for t in f.tasks if t in items])
        shown = safe_text(display_path(Path(f.path), config.invocation_dir))
        if n:
            print(f"{shown}: {n} task{'s' if n != 1 else ''}, valid", file=out)
        else:
            print(f"{shown}: no tasks collected", file=out)
    for line in config.stash.get("warnings", []):
        print(f"warning: {safe_text(line)}", file=err)
    return ExitCode.OK if items else ExitCode.NO_TASKS_COLLECTED


def queue_items(config: Any, items: list[Any], out: TextIO) -> list[Task]:
    from .cli import source_hash

    led = open_ledger(config)
    src = ",".join(config.option.files)
    digest = "|".join(source_hash(f) for f in config.option.files) + "|k=" + (config.getoption("keyword") or "")
    tasks = led.add_tasks(items, source=src, source_hash=digest, settings=config.file_settings)
    by_name = {t.name: t for t in tasks}
    for reuse in config.stash.get("branch_reuse", []):
        if reuse.task_name in by_name:  # the user named a branch fleetrun made for this task before
            led.add_note(by_name[reuse.task_name].id, reuse.note)
    notify = notifier(config)
    for t in tasks:
        config.hook.fleetrun_transition(task=t, from_state="", to_state=t.state.value, cause="queued",
                                        attempt=None, config=config)
    del notify
    return tasks


def cmd_queue(config: Any, out: TextIO, err: TextIO) -> int:
    items = collect_items(config)
    if not items:
        print("no tasks collected", file=out)
        return ExitCode.NO_TASKS_COLLECTED
    tasks = queue_items(config, items, out)
    for t in tasks:
        print(f"queued {t.id}  {safe_name(t.name)}  [{t.state}]", file=out)
    from .session import wake_loop

    wake_loop(config.home)
    return ExitCode.OK


def cmd_run(config: Any, out: TextIO, err: TextIO) -> int:
    from .session import run_session

    items = collect_items(config)
    if config.getoption("collect_only") and items:
        for t in items:
            deps = f"  (after {', '.join(t.depends_on)})" if t.depends_on else ""
            print(f"<Task {safe_name(t.name)}>{safe_text(deps)}", file=out)
        print(f"\n{len(items)} task{'s' if len(items) != 1 else ''} collected", file=out)
        return ExitCode.OK
    if not items:
        print("no tasks collected", file=out)
        return ExitCode.NO_TASKS_COLLECTED
    for line in config.stash.get("warnings", []):  # what validate warns about, said before the run
        print(f"warning: {safe_text(line)}", file=err)
    return run_session(config, items, out, err)


def cmd_work(config: Any, out: TextIO, err: TextIO) -> int:
    from .session import run_session

    return run_session(config, None, out, err)


# ---------------------------------------------------------------------------------


def _where(t: Task) -> str:
    return t.host or "-"


def _worktree_now(t: Task) -> Optional[str]:
    """The task's worktree, or None once it was removed (after DONE, or by gc). A
    peer's worktree is on the peer: kept as recorded."""
    if t.worktree and t.host in (None, "local") and not os.path.lexists(t.worktree):
        return None
    return t.worktree


def terminal_width(out: TextIO) -> Optional[int]:
    """The width to fit: ``$COLUMNS``, else the terminal's; None (no limit) when
    ``out`` is not a terminal, so a pipe or a file gets every cell whole."""
    import shutil

    env = os.environ.get("COLUMNS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    try:
        if not out.isatty():
            return None
    except (AttributeError, ValueError):
        return None
    return shutil.get_terminal_size().columns


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else (text[:max(0, width - 1)] + "…")


#: status columns: header, right-aligned, the narrowest it is cut to (None: never cut,
#: an id must stay whole to be typed back).
_COLUMNS = [("NAME", False, 10), ("STATE", False, None), ("ATT", True, None), ("WHERE", False, 5),
            ("AGE", True, None), ("COST", True, None), ("ID", False, None), ("BRANCH", False, 10),
            ("REASON", False, 16)]
#: When a row is too wide: cells are cut in this order, and if that is not enough,
#: whole columns are left out in this one.
_CUT_ORDER = ["REASON", "BRANCH", "NAME", "WHERE"]
_DROP_ORDER = ["AGE", "COST", "ATT", "WHERE"]


def _fit_widths(cols: list[int], natural: list[int], width: int) -> Optional[list[int]]:
    """Widths for ``cols`` within ``width``, cutting the widest cuttable cell a
    character at a time (so no one column pays for all); None if it cannot fit."""
    widths = [natural[i] for i in cols]
    least = [max(_COLUMNS[c][2] or natural[c], len(_COLUMNS[c][0])) for c in cols]
    rank = {name: n for n, name in enumerate(_CUT_ORDER)}
    order = [k for k in range(len(cols)) if _COLUMNS[cols[k]][0] in rank]
    over = sum(widths) + 2 * (len(widths) - 1) - width
    while over > 0:
        room = [k for k in order if widths[k] > least[k]]
        if not room:
            return None
        k = max(room, key=lambda k: (widths[k], -rank[_COLUMNS[cols[k]][0]]))
        widths[k] -= 1
        over -= 1
    return widths


def fit_table(rows: list[list[str]], width: Optional[int]) -> tuple[list[str], list[str], bool]:
    """The header and ``rows`` as aligned lines no wider than ``width`` (None: no
    limit): the widest cells are cut with ``…`` (REASON first, never an ID), then
    the least needed columns are left out. :return: (lines, columns left out, whether
    a cell was cut)."""
    heads = [c[0] for c in _COLUMNS]
    natural = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(heads)]
    cols = list(range(len(heads)))
    widths: Optional[list[int]] = natural
    if width is not None:
        widths = _fit_widths(cols, natural, width)
        for name in _DROP_ORDER:
            if widths is not None:
                break
            cols.remove(heads.index(name))
            widths = _fit_widths(cols, natural, width)
        if widths is None:  # too narrow for anything: the narrowest there is
            widths = [max(_COLUMNS[c][2] or natural[c], len(heads[c])) for c in cols]
    assert widths is not None
    lines = []
    was_cut = False
    for cells in [heads, *rows]:
        parts = []
        for k, c in enumerate(cols):
            cell = _cut(cells[c], widths[k])
            was_cut = was_cut or cell != cells[c]
            last = k == len(cols) - 1
            parts.append(cell if last else (f"{cell:>{widths[k]}}" if _COLUMNS[c][1] else f"{cell:<{widths[k]}}"))
        lines.append("  ".join(parts).rstrip())
    return lines, [h for i, h in enumerate(heads) if i not in cols], was_cut


def cmd_status(config: Any, out: TextIO, err: TextIO) -> int:
    led = open_ledger(config)
    states = None
    if config.option.state:
        try:
            states = {State(config.option.state.upper())}
        except ValueError:
            raise UsageError(f"{config.option.state!r} is not a state; one of "
                             f"{', '.join(s.value for s in State)}", key="--state") from None
    tasks = led.tasks(states)
    if config.option.json:
        print(json.dumps([dict(t.to_json(), worktree=_worktree_now(t)) for t in tasks], indent=2), file=out)
        return ExitCode.OK
    if config.option.graph:
        _print_graph(led, tasks, out)
        return ExitCode.OK
    _print_supervisor_line(config, led, out)
    if not tasks:
        print("no tasks in the ledger" + (f" in state {config.option.state}" if states else ""), file=out)
        return ExitCode.OK
    now = time.time()
    waits = json.loads(led.get_meta("waits") or "{}")
    from .hosts import missing_host_reason

    peer_state: dict[str, Any] = {}
    if config.pluginmanager.get_plugin("relay") is not None:  # -p no:relay: nothing of the relay is read
        from .plugins.relay.peers import load_state

        peer_state = load_state(config.home)
    rows = []
    unknown = led.unknown_cost()
    for t in tasks:
        cost = f"${t.cost_usd:.2f}" if t.cost_usd else "-"
        if t.id in unknown:  # an attempt's cost was never reported: what is known is a floor
            cost = f"${t.cost_usd:.2f}+" if t.cost_usd else "?"
        reason = waits.get(t.id, t.reason) if t.state in (State.READY, State.RETRYING, State.RESUMING) else t.reason
        e = peer_state.get(t.host or "") if t.state in (State.ASSIGNED, State.RUNNING, State.VERIFYING) else None
        if e and e.get("error") and (e.get("error_at") or 0) >= (e.get("last_heard") or 0):
            reason = (f"{t.host} has not answered for {ago(e.get('last_heard'), now)}; the attempt may still "
                      "run there, so the task waits (fleetrun cancel to give up)")
        missing = missing_host_reason(config, t.host) if t.state in (State.ASSIGNED, State.RUNNING,
                                                                      State.VERIFYING) else None
        if missing:
            reason = f"{missing}; the attempt may still run there, so the task waits (fleetrun cancel to give up)"
        # what a task's name or reason holds is shown, not sent
        rows.append([safe_name(t.name), t.state.value, str(t.attempts), safe_text(_where(t)), ago(t.created, now),
                     cost, t.id, safe_text(t.branch or "-"), safe_text(reason)])
    width = None if getattr(config.option, "wide", False) else terminal_width(out)
    lines, left_out, was_cut = fit_table(rows, width)
    for line in lines:
        print(line, file=out)
    if width is not None and (left_out or was_cut):
        dropped = f"; {', '.join(left_out)} left out" if left_out else ""
        print(_cut(f"(cut to fit {width} columns{dropped}; --wide shows all)", width), file=out)
    return ExitCode.OK


def _print_supervisor_line(config: Any, led: Ledger, out: TextIO) -> None:
    from .policy import local_drain_source

    source = local_drain_source(config.home / "policy.toml")
    if source is not None:  # what undrain cannot clear comes first
        print(f"this machine is draining ({safe_text(source)})", file=out)
    elif led.get_meta("drain") == "1":
        print("this machine is draining (fleetrun drain; fleetrun undrain to start work)", file=out)
    try:
        from .liveness import describe

        line = describe(config.home)
    except ImportError:  # pragma: no cover
        line = None
    if line:
        print(safe_text(line), file=out)


def why(t: Task, by_id: dict[str, Task], waits: dict[str, str]) -> str:
    """Why a task is not running, in a few words."""
    if t.state is State.PENDING:
        blocking = [by_id[d] for d in t.deps if d in by_id and by_id[d].state is not State.DONE]
        if blocking:
            return "waiting for " + ", ".join(f"{safe_name(d.name)} ({d.state})" for d in blocking)
        return "dependencies done; waiting for the loop"
    if t.state in (State.READY, State.RETRYING, State.RESUMING):
        return waits.get(t.id) or ("waiting for a place" if t.state is State.READY else t.reason)
    if t.state in (State.NEEDS_HUMAN, State.CANCELLED):
        return t.reason
    return ""


def _print_graph(led: Ledger, tasks: list[Task], out: TextIO) -> None:
    by_id = {t.id: t for t in led.tasks()}
    shown = {t.id for t in tasks}
    waits = json.loads(led.get_meta("waits") or "{}")
    children: dict[str, list[Task]] = {}
    for t in tasks:
        for d in t.deps:
            children.setdefault(d, []).append(t)
    roots = [t for t in tasks if not any(d in shown for d in t.deps)]
    seen: set[str] = set()

    def show(t: Task, depth: int) -> None:
        reason = why(t, by_id, waits)
        again = t.id in seen
        extra = f"  {reason}" if reason and not again else ""
        print(f"{'  ' * depth}{safe_name(t.name)} [{t.state}] {t.id}{' (see above)' if again else ''}"
              f"{safe_text(extra)}", file=out)
        if again:
            return
        seen.add(t.id)
        for c in children.get(t.id, []):
            show(c, depth + 1)

    if not tasks:
        print("no tasks in the ledger", file=out)
    for r in roots:
        show(r, 0)


def cmd_logs(config: Any, out: TextIO, err: TextIO) -> int:
    led = open_ledger(config)
    task = ops.resolve(led, config.option.task)
    rows = led.transitions(task.id)
    verdicts = led.verdicts(task.id)
    attempts = {a.id: a for a in led.attempts(task.id)}
    if config.option.json:
        print(json.dumps({
            "task": dict(task.to_json(), worktree=_worktree_now(task)),
            "transitions": [r.__dict__ for r in rows],
            "verdicts": [v.__dict__ for v in verdicts],
            "attempts": [a.__dict__ for a in attempts.values()],
        }, indent=2, default=str), file=out)
        return ExitCode.OK
    plus = "+" if any(a.cost_usd is None for a in attempts.values()) else ""
    print(f"{safe_name(task.name)} {task.id} [{task.state}]  cost ${task.cost_usd:.2f}{plus}", file=out)
    # where its work is: what a human looking at a NEEDS_HUMAN task opens first
    if task.worktree:
        where = "" if task.host in (None, "local") else f" on {safe_text(task.host)}"
        shown = safe_text(task.worktree)
        print(f"worktree: {shown}{where}" if _worktree_now(task) else f"worktree: removed (was {shown})", file=out)
    if task.branch:
        print(f"branch: {safe_text(task.branch)}", file=out)
    events: list[tuple[float, int, str]] = []
    for r in rows:
        where = f" attempt {r.attempt}" if r.attempt else ""
        host = f" on {r.host}" if r.host else ""
        src = r.from_state or ""
        events.append((r.time, 0, f"{src:>11} -> {r.to_state:<11} {safe_text(r.cause)}{where}{safe_text(host)}"))
    for v in verdicts:
        att = attempts.get(v.attempt_id)
        num = att.number if att else "?"
        head = (f"{'PASS' if v.passed else 'FAIL'} verifier {v.idx + 1} ({safe_text(v.kind)}: {safe_text(v.label)}) "
                f"attempt {num}")
        if v.reason:
            head += f": {safe_text(v.reason)}"
        if v.cost_usd:
            head += f" (${v.cost_usd:.2f})"
        body = "".join(f"\n    | {safe_text(line)}" for line in v.output.rstrip().splitlines()[-40:])
        events.append((v.time, 1, head + body))
    for a in attempts.values():
        for s in (a.info or {}).get("setup_steps") or []:  # the task's setup commands, before its agent
            if not isinstance(s, dict):
                continue
            head = (f"{'PASS' if s.get('passed') else 'FAIL'} setup {s.get('n')} "
                    f"({safe_text(s.get('command'), limit=60)}) attempt {a.number}: {safe_text(s.get('reason'))}")
            lines = [] if s.get("passed") else str(s.get("output") or "").rstrip().splitlines()[-40:]
            events.append((float(s.get("time") or a.created), 1, head + "".join(
                f"\n    | {safe_text(line)}" for line in lines)))
        if a.ended:
            text = f"attempt {a.number} ({a.kind}) ended: {safe_text(a.outcome or '-')}"
            if a.cost_usd is None:
                text += ", cost unknown"
            elif a.cost_usd:
                text += f", ${a.cost_usd:.2f}"
            if a.dir:
                text += f", log {safe_text(Path(a.dir) / 'log')}"
            for d in (a.info or {}).get("denials") or []:
                if isinstance(d, dict):
                    tool_input = json.dumps(d.get("tool_input", {}))[:120]
                    text += f"\n    permission denied: {safe_text(d.get('tool_name'), limit=80)} {safe_text(tool_input)}"
            events.append((a.ended, 0, text))
    for t, text in led.notes(task.id):
        events.append((t, 2, f"note: {safe_text(text)}"))
    for t, _, text in sorted(events, key=lambda e: (e[0], e[1])):
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
        print(f"{stamp}  {text}", file=out)
    return ExitCode.OK


def cmd_cancel(config: Any, out: TextIO, err: TextIO) -> int:
    led = open_ledger(config)
    task = ops.resolve(led, config.option.task)
    active = led.latest_attempt(task.id) if task.state in (State.ASSIGNED, State.RUNNING, State.VERIFYING) else None
    changed, moved = ops.cancel(led, task, notifier(config))
    if not changed:
        print(f"{safe_name(task.name)} {task.id} was already CANCELLED", file=out)
        return ExitCode.OK
    not_stopped = None
    if active is not None:
        from .hosts import UnknownHost, stop_attempt

        try:
            stop_attempt(config, active)
        except UnknownHost as e:  # cancelled all the same: the ledger is ours, the peer is not
            not_stopped = (f"could not stop attempt {active.number} on {safe_text(active.host or '')}: "
                           f"{safe_text(str(e))}; it may still run there")
    print(f"cancelled {safe_name(task.name)} {task.id}", file=out)
    for t in moved:
        print(f"  {safe_name(t.name)} {t.id} -> {t.state} ({safe_text(t.reason)})", file=out)
    if not_stopped:
        print(not_stopped, file=err)
    return ExitCode.OK


def cmd_retry(config: Any, out: TextIO, err: TextIO) -> int:
    led = open_ledger(config)
    task = ops.resolve(led, config.option.task)
    if config.getoption("elsewhere"):
        moved = ops.retry_elsewhere(led, task, notifier(config))
    else:
        moved = ops.retry(led, task, notifier(config))
    for t in moved:
        print(f"{safe_name(t.name)} {t.id} -> {t.state}", file=out)
    return ExitCode.OK


def _handoff_for_approve(config: Any, led: Ledger, task: Task) -> Optional[dict[str, Any]]:
    """What an approved task hands to its dependents, made exactly as for a DONE one
    (``fleetrun_handoff``: its branch, its last session's summary), from the newest
    attempt that ran."""
    atts = [a for a in led.attempts(task.id) if a.state in ("ended", "verified")]
    att = atts[-1] if atts else led.latest_attempt(task.id)
    handoff = config.hook.fleetrun_handoff(task=task, attempt=att, config=config)
    return asdict(handoff) if handoff is not None else None


def cmd_approve(config: Any, out: TextIO, err: TextIO) -> int:
    led = open_ledger(config)
    task = ops.resolve(led, config.option.task)
    handoff = None
    if task.state is State.NEEDS_HUMAN:
        # recorded before the move to DONE: a loop running meanwhile may start a
        # dependent the moment it is DONE, and that one must get the handoff
        handoff = _handoff_for_approve(config, led, task)
        if handoff is not None:
            led.update_task(task.id, handoff=handoff)
    moved = ops.approve(led, task, notifier(config))
    for t in moved:
        print(f"{safe_name(t.name)} {t.id} -> {t.state}", file=out)
    if handoff is not None and handoff.get("branch") and led.dependents(task.id):
        print(f"  its dependents are told its work is on branch {safe_text(handoff['branch'])}", file=out)
    from .gitutil import GitError

    try:  # as after DONE: a clean worktree is removed, the branch stays
        config.hook.fleetrun_cleanup_workspace(task=moved[0], config=config)
    except (GitError, OSError) as e:
        led.add_note(task.id, f"cleanup failed: {e}")
    now = led.get(task.id)
    if now is not None and now.branch and _worktree_now(now) and now.host in (None, "local"):
        print(f"  kept its worktree {safe_text(now.worktree)}: what is not committed there is not on "
              f"branch {safe_text(now.branch)} (fleetrun logs {safe_name(now.name)} says why)", file=out)
    return ExitCode.OK


def cmd_drain(config: Any, out: TextIO, err: TextIO) -> int:
    open_ledger(config).set_meta("drain", "1")
    print("draining: this machine starts nothing new (running attempts finish); fleetrun undrain to undo", file=out)
    return ExitCode.OK


def cmd_undrain(config: Any, out: TextIO, err: TextIO) -> int:
    from .policy import local_drain_source

    led = open_ledger(config)
    was = led.get_meta("drain") == "1"
    led.set_meta("drain", None)
    source = local_drain_source(config.home / "policy.toml")
    if source is not None:  # undrain clears only what `fleetrun drain` set: say what still drains
        if was:
            print("undrained what `fleetrun drain` set", file=out)
        print(f"this machine still drains: {safe_text(source)} sets [local] drain = true; "
              "remove it to start work", file=err)
        return ExitCode.TASKS_FAILED
    print("undrained: this machine starts work again", file=out)
    return ExitCode.OK


def _relay_loaded(config: Any, verb: str) -> None:
    """``relay`` and ``host`` belong to the relay plugin: blocked, they are not there."""
    if config.pluginmanager.is_blocked("relay"):
        raise UsageError("the relay plugin is blocked (-p no:relay)", key=verb)


def cmd_relay(config: Any, out: TextIO, err: TextIO) -> int:
    _relay_loaded(config, "relay")
    from .plugins.relay.cli import main as relay_main

    return relay_main(config, list(config.option.rest or []), out, err)


def cmd_host(config: Any, out: TextIO, err: TextIO) -> int:
    _relay_loaded(config, "host")
    from .plugins.relay.peer.verbs import main as host_main

    return host_main(config, list(config.option.rest or []), out, err)


def cmd_gc(config: Any, out: TextIO, err: TextIO) -> int:
    from .gc import main as gc_main

    return gc_main(config, out, err)

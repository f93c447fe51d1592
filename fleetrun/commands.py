"""The core's verbs: ``cmd_VERB(config, out, err)`` returns an exit code, and
:data:`BUILTIN_VERBS` declares each (its help, its arguments), as a plugin declares
its own through ``fleetrun_verbs``."""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterable, Optional, TextIO

from . import ops
from .exceptions import ExitCode, UsageError
from .ledger import Ledger, Task, open_ledger
from .states import State
from .table import cut, fit_table, terminal_width
from .textutil import ago, safe_name, safe_text
from .verbs import VerbDecl


def notifier(config: Any) -> ops.Notify:
    def notify(task: Task, src: State, dst: State, cause: str, attempt: Optional[int]) -> None:
        config.hook.fleetrun_transition(task=task, from_state=src.value, to_state=dst.value,
                                        cause=cause, attempt=attempt, config=config)
    return notify


# ---------------------------------------------------------------------------------


def cmd_validate(config: Any, out: TextIO, err: TextIO) -> int:
    from .queueing import collect_items

    items = collect_items(config)
    from .collect import describe_defaults, display_path

    for f in config.stash["files"]:
        n = len([t for t in f.tasks if t in items])
        shown = safe_text(display_path(Path(f.path), config.invocation_dir))
        if n:
            print(f"{shown}: {n} task{'s' if n != 1 else ''}, valid", file=out)
            if config.verbosity > 0:  # where each task's effective settings come from
                for t in f.tasks:
                    if t in items:
                        print(f"  {safe_name(t.name)}: {describe_defaults(t, config.invocation_dir)}", file=out)
        else:
            print(f"{shown}: no tasks collected", file=out)
    for line in config.stash.get("warnings", []):
        print(f"warning: {safe_text(line)}", file=err)
    return ExitCode.OK if items else ExitCode.NO_TASKS_COLLECTED


def cmd_queue(config: Any, out: TextIO, err: TextIO) -> int:
    from .queueing import collect_items, queue_items

    items = collect_items(config)
    if not items:
        print("no tasks collected", file=out)
        return ExitCode.NO_TASKS_COLLECTED
    tasks = queue_items(config, items)
    for t in tasks:
        print(f"queued {t.id}  {safe_name(t.name)}  [{t.state}]", file=out)
    from .liveness import wake_loop

    wake_loop(config.home)
    return ExitCode.OK


def cmd_run(config: Any, out: TextIO, err: TextIO) -> int:
    from .queueing import collect_items
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
        print(cut(f"(cut to fit {width} columns{dropped}; --wide shows all)", width), file=out)
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


def cmd_gc(config: Any, out: TextIO, err: TextIO) -> int:
    from .gc import main as gc_main

    return gc_main(config, out, err)



# ---------------------------------------------------------------------------------
# The declarations: help and arguments of each verb


def _max_tasks(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:  # 0 or fewer starts nothing and waits forever: never what was meant
        raise argparse.ArgumentTypeError(
            f"{text} is not a whole number of at least 1 (to start nothing, use fleetrun drain)")
    return n


def _loop_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-x", "--exitfirst", action="store_true",
                   help="start no new task after the first NEEDS_HUMAN")
    p.add_argument("--max-tasks", type=_max_tasks, metavar="N", help="override [local] max_tasks")


def _run_arguments(p: argparse.ArgumentParser) -> None:
    _loop_arguments(p)
    p.add_argument("--collect-only", "--co", action="store_true", help="list the tasks; run nothing")
    p.add_argument("--new-queue", action="store_true",
                   help="queue the file anew even if an unchanged copy is still in the ledger")


def _work_arguments(p: argparse.ArgumentParser) -> None:
    _loop_arguments(p)
    p.add_argument("--until-idle", action="store_true", help="exit when nothing is left to do")


def _queued_files(config: Any) -> Iterable[Path]:
    """``work``: the queued tasks' files (their ``fleetconf.py`` files load), and their
    ``[agents]``/``[brain]`` tables, as they were when queued."""
    led = open_ledger(config)
    sources: list[Path] = []
    for _qid, files_, settings in led.live_queues():
        sources.extend(Path(f) for f in files_ if Path(f).exists())
        for key, table in settings.items():
            if isinstance(table, dict):
                config.file_settings.setdefault(key, {}).update(table)
    return sources


def _status_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--state", metavar="S", help="only tasks in this state")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--graph", action="store_true", help="the depends_on tree, and why anything waits")
    p.add_argument("--wide", action="store_true", help="every cell whole, however wide the terminal")


def _task_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("task", metavar="TASK", help="a task id, or a name (the newest task with it)")


def _logs_arguments(p: argparse.ArgumentParser) -> None:
    _task_argument(p)
    p.add_argument("--json", action="store_true", help="print JSON")


def _retry_arguments(p: argparse.ArgumentParser) -> None:
    _task_argument(p)
    p.add_argument("--elsewhere", action="store_true",
                   help="also for a task running on a peer that stopped answering: give up on that "
                        "machine and place the task again (you vouch the old attempt is gone)")


def _gc_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--yes", action="store_true", help="remove what is listed")
    p.add_argument("--force", action="store_true",
                   help="also remove dirty worktrees and branches with commits found nowhere else")


#: The core's verbs, in the order ``fleetrun --help`` lists them. ``config.toml`` is
#: checked as the verbs that run or queue work start; the operator's verbs (status,
#: logs, cancel...) still work with a broken one, and check it only if they read a
#: setting.
BUILTIN_VERBS: tuple[VerbDecl, ...] = (
    VerbDecl("run", "collect, queue and work the tasks files until nothing is left (the default)",
             cmd_run, _run_arguments, plugin_options=True, takes_tasks_files=True),
    VerbDecl("validate", "check tasks files: typos, dangling or cyclic depends_on", cmd_validate,
             takes_tasks_files=True),
    VerbDecl("queue", "validate and queue tasks files; runs nothing", cmd_queue, takes_tasks_files=True),
    VerbDecl("work", "run the queued tasks (keeps running unless --until-idle)", cmd_work, _work_arguments,
             plugin_options=True, tasks_files=_queued_files),
    VerbDecl("status", "one line per task (--graph: the depends_on tree and why anything waits)", cmd_status,
             _status_arguments, reads_config=False),
    VerbDecl("logs", "every transition and verdict of a task", cmd_logs, _logs_arguments, reads_config=False),
    VerbDecl("cancel", "cancel a task; its dependents need a human", cmd_cancel, _task_argument,
             reads_config=False),
    VerbDecl("retry", "send a NEEDS_HUMAN or CANCELLED task back to the queue", cmd_retry, _retry_arguments,
             reads_config=False),
    VerbDecl("approve", "accept a NEEDS_HUMAN task as DONE", cmd_approve, _task_argument, reads_config=False),
    VerbDecl("drain", "start nothing new on this machine", cmd_drain, reads_config=False),
    VerbDecl("undrain", "start work again after drain", cmd_undrain, reads_config=False),
    VerbDecl("gc", "list (and with --yes remove) worktrees and attempt folders no task owns", cmd_gc,
             _gc_arguments, reads_config=False),
)

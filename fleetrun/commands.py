"""The core's verbs: ``cmd_VERB(config, out, err)`` returns an exit code, and
:data:`BUILTIN_VERBS` declares each (its help, its arguments), as a plugin declares
its own through ``fleetrun_verbs``."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, TextIO

from .exceptions import ExitCode, UsageError, UsageErrors
from .textutil import safe_name, safe_text
from .verbs import VerbDecl

# The ledger, the operator's actions and the viewers are imported by the verbs that use
# them: `fleetrun --help` and `--version` read only the declarations at the end.
if TYPE_CHECKING:
    from . import ops
    from .config import Config
    from .ledger import Ledger, Task
    from .states import State


def notifier(config: Config) -> ops.Notify:
    def notify(task: Task, src: State, dst: State, cause: str, attempt: Optional[int]) -> None:
        config.hook.fleetrun_transition(
            task=task, from_state=src.value, to_state=dst.value, cause=cause, attempt=attempt, config=config
        )

    return notify


# ---------------------------------------------------------------------------------


def _policy_errors(config: Config) -> list[UsageError]:
    """The mistakes of this machine's ``policy.toml``, which a run refuses to start with
    (docs/policy.md): ``validate`` reports them rather than saying "valid"."""
    from .policy import load_policy

    try:
        load_policy(config.home / "policy.toml")
    except UsageErrors as e:
        return list(e.errors)
    except UsageError as e:
        return [e]
    return []


def cmd_validate(config: Config, out: TextIO, err: TextIO) -> int:
    from .queueing import FILES_KEY, WARNINGS_KEY, collect_items

    policy_errors = _policy_errors(config)
    try:
        items = collect_items(config)
    except UsageError as e:  # the machine's file first, then the tasks files'
        if not policy_errors:
            raise
        raise UsageErrors(policy_errors + (e.errors if isinstance(e, UsageErrors) else [e])) from None
    if policy_errors:
        raise UsageErrors(policy_errors) if len(policy_errors) > 1 else policy_errors[0]
    from .collect import describe_defaults, display_path

    # by identity: `t in items` compared each task with every one before it (a dataclass
    # == each), 5,000,000,000 comparisons for a file of 100,000 tasks
    selected = {id(t) for t in items}
    for f in config.stash[FILES_KEY]:
        n = sum(1 for t in f.tasks if id(t) in selected)
        shown = safe_text(display_path(Path(f.path), config.invocation_dir))
        if n:
            print(f"{shown}: {n} task{'s' if n != 1 else ''}, valid", file=out)
            if config.verbosity > 0:  # where each task's effective settings come from
                for t in f.tasks:
                    if id(t) in selected:
                        print(f"  {safe_name(t.name)}: {describe_defaults(t, config.invocation_dir)}", file=out)
        else:
            print(f"{shown}: no tasks collected", file=out)
    for line in config.stash.get(WARNINGS_KEY, []):
        print(f"warning: {safe_text(line)}", file=err)
    return ExitCode.OK if items else ExitCode.NO_TASKS_COLLECTED


def cmd_queue(config: Config, out: TextIO, err: TextIO) -> int:
    from .queueing import queue_files

    if not queue_files(config, out):
        print("no tasks collected", file=out)
        return ExitCode.NO_TASKS_COLLECTED
    from .liveness import wake_loop

    wake_loop(config.home)
    return ExitCode.OK


def cmd_run(config: Config, out: TextIO, err: TextIO) -> int:
    from .queueing import COLLECT_NOTES_KEY, DESELECTED_KEY, WARNINGS_KEY, collect_items
    from .session import run_session

    items = collect_items(config)
    out = config.out  # where a plugin sent the run's output (`--events -`: standard error)
    if config.getoption("collect_only") and items:
        for note in config.stash.get(COLLECT_NOTES_KEY, []):
            print(safe_text(note), file=out)
        for t in items:
            deps = f"  (after {', '.join(t.depends_on)})" if t.depends_on else ""
            tags = f"  [{', '.join(t.tags)}]" if t.tags else ""
            print(f"<Task {safe_name(t.name)}>{safe_text(deps + tags)}", file=out)
        n = len(items)
        gone = len(config.stash.get(DESELECTED_KEY, []))
        count = (
            f"{n}/{n + gone} tasks collected ({gone} deselected)"
            if gone
            else f"{n} task{'s' if n != 1 else ''} collected"
        )  # pytest's words
        print(f"\n{count}", file=out)
        return ExitCode.OK
    if not items:
        print("no tasks collected", file=out)
        return ExitCode.NO_TASKS_COLLECTED
    for line in config.stash.get(WARNINGS_KEY, []):  # what validate warns about, said before the run
        print(f"warning: {safe_text(line)}", file=err)
    return run_session(config, items, out, err)


def cmd_work(config: Config, out: TextIO, err: TextIO) -> int:
    from .session import run_session

    return run_session(config, None, out, err)


# ---------------------------------------------------------------------------------


def _matcher(config: Config) -> Optional[Callable[[Task], bool]]:
    """``-k`` (over names) and ``-m`` (over tags) of an operator verb, both to match."""
    from .kwexpr import KeywordExpr

    keyword, markexpr = config.getoption("keyword"), config.getoption("markexpr")
    k = KeywordExpr.compile(keyword) if keyword else None
    m = KeywordExpr.compile(markexpr, key="-m") if markexpr else None
    if k is None and m is None:
        return None
    return lambda t: (k is None or k(t.name)) and (m is None or m.tags(t.spec.tags))


def _selectors(config: Config) -> str:
    """The selectors of the command line, as written: ``--all -k api``."""
    words = []
    if config.getoption("all_tasks"):
        words.append("--all")
    for opt, dest in (("--state", "state"), ("-k", "keyword"), ("-m", "markexpr")):
        value = config.getoption(dest)
        if value:
            words.append(f"{opt} {value}")
    return " ".join(words)


def _eligible(config: Config, verb: str) -> frozenset[State]:
    """The states ``verb`` acts on. ``retry --elsewhere --state running`` also takes
    the tasks that run (on a peer that stopped answering), when ``--state`` names their
    state: ``--elsewhere --all`` never takes every running task off its machine."""
    from . import ops
    from .states import State

    running = {State.ASSIGNED, State.RUNNING, State.VERIFYING}
    state = config.getoption("state")
    if verb == "retry" and config.getoption("elsewhere") and state and ops.parse_state(state) in running:
        return ops.ELIGIBLE[verb] | running
    return ops.ELIGIBLE[verb]


def _selection(config: Config, led: Ledger, verb: str) -> tuple[list[Task], bool]:
    """The tasks ``verb`` acts on, and whether it is a bulk operation (then it ends
    with a count). Named tasks are checked, all of them, before anything changes.

    :raises UsageError: no task named and no selector; an unknown name; a named task
        the verb cannot act on.
    """
    from . import ops

    refs: list[str] = list(config.option.task or [])
    state_text = config.getoption("state")
    state = ops.parse_state(state_text) if state_text else None
    everything = bool(config.getoption("all_tasks"))
    match = _matcher(config)
    if not refs and not (everything or state or match):
        raise UsageError("name a task, or select some with --all, --state, -k or -m", key="TASK")
    tasks = ops.select(led, refs, eligible=_eligible(config, verb), everything=everything, state=state, match=match)
    if refs and not (verb == "retry" and config.getoption("elsewhere")):
        for t in tasks:
            why = ops.refusal(verb, t)
            if why:
                raise UsageError(why, key="TASK")
    return tasks, len(refs) != 1 or bool(everything or state or match)


def _bulk(config: Config, verb: str, past: str, out: TextIO, one: Callable[[Ledger, Task], bool]) -> int:
    """Run ``one`` on each selected task; end a bulk operation with a count.

    A selected task another one's operation moved meanwhile (a cancel's cascade, a
    retry's revived dependents) is looked at again and left alone if the verb no
    longer applies to it.
    """
    from .ledger import open_ledger

    led = open_ledger(config)
    tasks, bulk = _selection(config, led, verb)
    if not tasks:
        print(f"no task to {verb} ({_selectors(config)}): nothing {past}", file=out)
        return ExitCode.NO_TASKS_COLLECTED
    named = bool(config.option.task)
    done = 0
    for task in tasks:
        fresh = led.get(task.id) or task
        if bulk and not named and fresh.state not in _eligible(config, verb):
            continue
        if one(led, fresh):
            done += 1
    if bulk:
        print(f"{done} {past}", file=out)
    return ExitCode.OK


def cmd_cancel(config: Config, out: TextIO, err: TextIO) -> int:
    return _bulk(config, "cancel", "cancelled", out, lambda led, task: _cancel_one(config, led, task, out, err))


def _cancel_one(config: Config, led: Ledger, task: Task, out: TextIO, err: TextIO) -> bool:
    from . import ops
    from .states import State

    active = led.latest_attempt(task.id) if task.state in (State.ASSIGNED, State.RUNNING, State.VERIFYING) else None
    changed, moved = ops.cancel(led, task, notifier(config))
    if not changed:
        print(f"{safe_name(task.name)} {task.id} was already CANCELLED", file=out)
        return False
    not_stopped = None
    if active is not None:
        from .hostapi import UnknownHost, stop_attempt

        try:
            stop_attempt(config, active)
        except UnknownHost as e:  # cancelled all the same: the ledger is ours, the peer is not
            not_stopped = (
                f"could not stop attempt {active.number} on {safe_text(active.host or '')}: "
                f"{safe_text(str(e))}; it may still run there"
            )
    print(f"cancelled {safe_name(task.name)} {task.id}", file=out)
    for t in moved:
        print(f"  {safe_name(t.name)} {t.id} -> {t.state} ({safe_text(t.reason)})", file=out)
    if not_stopped:
        print(not_stopped, file=err)
    return True


def cmd_retry(config: Config, out: TextIO, err: TextIO) -> int:
    from . import ops

    def one(led: Ledger, task: Task) -> bool:
        if config.getoption("elsewhere"):
            moved = ops.retry_elsewhere(led, task, notifier(config))
        else:
            moved = ops.retry(led, task, notifier(config))
        for t in moved:
            print(f"{safe_name(t.name)} {t.id} -> {t.state}", file=out)
        return True

    return _bulk(config, "retry", "retried", out, one)


def _handoff_for_approve(config: Config, led: Ledger, task: Task) -> Optional[dict[str, Any]]:
    """What an approved task hands to its dependents, made exactly as for a DONE one
    (``fleetrun_handoff``: its branch, its last session's summary), from the newest
    attempt that ran."""
    atts = [a for a in led.attempts(task.id) if a.state in ("ended", "verified")]
    att = atts[-1] if atts else led.latest_attempt(task.id)
    from .hostapi import get_host
    from .reports import Handoff

    handoff = config.hook.fleetrun_handoff(task=task, attempt=att, host=get_host(config, task.host), config=config)
    if handoff is not None and not isinstance(handoff, Handoff):  # a handle: no loop here, so wait for it
        import time

        while (made := handoff.poll()) is None:
            time.sleep(0.01)
        handoff = made
    return asdict(handoff) if handoff is not None else None


def cmd_approve(config: Config, out: TextIO, err: TextIO) -> int:
    return _bulk(config, "approve", "approved", out, lambda led, task: _approve_one(config, led, task, out))


def _approve_one(config: Config, led: Ledger, task: Task, out: TextIO) -> bool:
    from . import ops
    from .states import State
    from .viewing import worktree_now

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
        from .hostapi import get_host

        config.hook.fleetrun_cleanup_workspace(task=moved[0], host=get_host(config, moved[0].host), config=config)
    except (GitError, OSError) as e:
        led.add_note(task.id, f"cleanup failed: {e}")
    now = led.get(task.id)
    if now is not None and now.branch and worktree_now(now) and now.host in (None, "local"):
        print(
            f"  kept its worktree {safe_text(now.worktree)}: what is not committed there is not on "
            f"branch {safe_text(now.branch)} (fleetrun logs {safe_name(now.name)} says why)",
            file=out,
        )
    return True


def cmd_drain(config: Config, out: TextIO, err: TextIO) -> int:
    from .ledger import open_ledger

    open_ledger(config).set_meta("drain", "1")
    print("draining: this machine starts nothing new (running attempts finish); fleetrun undrain to undo", file=out)
    return ExitCode.OK


def cmd_undrain(config: Config, out: TextIO, err: TextIO) -> int:
    from .ledger import open_ledger
    from .policy import local_drain_source

    led = open_ledger(config)
    was = led.get_meta("drain") == "1"
    led.set_meta("drain", None)
    source = local_drain_source(config.home / "policy.toml")
    if source is not None:  # undrain clears only what `fleetrun drain` set: say what still drains
        if was:
            print("undrained what `fleetrun drain` set", file=out)
        print(
            f"this machine still drains: {safe_text(source)} sets [local] drain = true; remove it to start work",
            file=err,
        )
        return ExitCode.TASKS_FAILED
    print("undrained: this machine starts work again", file=out)
    return ExitCode.OK


def cmd_gc(config: Config, out: TextIO, err: TextIO) -> int:
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
            f"{text} is not a whole number of at least 1 (to start nothing, use fleetrun drain)"
        )
    return n


def _loop_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-x", "--exitfirst", action="store_true", help="start no new task after the first NEEDS_HUMAN")
    p.add_argument("--max-tasks", type=_max_tasks, metavar="N", help="override [local] max_tasks")


def _run_arguments(p: argparse.ArgumentParser) -> None:
    _loop_arguments(p)
    p.add_argument("--collect-only", "--co", action="store_true", help="list the tasks; run nothing")
    p.add_argument(
        "--new-queue",
        action="store_true",
        help="queue every task anew: not the unchanged file's queue, not the DONE tasks of its last run",
    )
    p.add_argument(
        "--lf",
        "--last-failed",
        dest="last_failed",
        action="store_true",
        help="only the tasks that ended NEEDS_HUMAN or CANCELLED in the file's last run (all if none did)",
    )
    p.add_argument(
        "--ff",
        "--failed-first",
        dest="failed_first",
        action="store_true",
        help="all tasks, those that ended NEEDS_HUMAN or CANCELLED in the file's last run first",
    )


def _work_arguments(p: argparse.ArgumentParser) -> None:
    _loop_arguments(p)
    p.add_argument("--until-idle", action="store_true", help="exit when nothing is left to do")


def _queued_files(config: Config) -> list[Path]:
    """``work``: the queued tasks' files and their tables (:func:`fleetrun.queueing.queued_files`)."""
    from .queueing import queued_files

    return queued_files(config)


def cmd_status(config: Config, out: TextIO, err: TextIO) -> int:
    from .viewing import cmd_status as status

    return status(config, out, err)


def cmd_logs(config: Config, out: TextIO, err: TextIO) -> int:
    from .viewing import cmd_logs as logs

    return logs(config, out, err)


def _status_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--all",
        dest="all_tasks",
        action="store_true",
        help="every run of every task (the history), not only each name's latest",
    )
    p.add_argument("--state", metavar="S", help="only tasks in this state (of each name's latest run, or --all)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--graph", action="store_true", help="the depends_on tree, and why anything waits")
    p.add_argument("--wide", action="store_true", help="every cell whole, however wide the terminal")
    p.add_argument(
        "--watch",
        action="store_true",
        help="the live view of the running tasks, read again every second (Ctrl-C ends it)",
    )
    p.add_argument("--color", choices=("yes", "no", "auto"), default="auto", help="colour: yes, no, or auto")


def _task_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("task", metavar="TASK", help="a task id, or a name (the newest task with it)")


def _logs_arguments(p: argparse.ArgumentParser) -> None:
    _task_argument(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="follow the transitions, verdicts and the agent's transcript until the task ends",
    )
    p.add_argument("--raw", action="store_true", help="with -f: the agent's log lines as they are, not rendered")


def _select_arguments(p: argparse.ArgumentParser) -> None:
    """``cancel``, ``retry`` and ``approve``: tasks by name, or chosen by selectors."""
    p.add_argument("task", metavar="TASK", nargs="*", help="task ids, or names (each the newest task with it)")
    p.add_argument(
        "--all",
        dest="all_tasks",
        action="store_true",
        help="every task the verb applies to (cancel --all: every unfinished task)",
    )
    p.add_argument("--state", metavar="S", help="only tasks in this state (needs_human, cancelled...)")
    p.add_argument("-k", dest="keyword", metavar="EXPR", help="only tasks whose name matches EXPR (as run -k)")
    p.add_argument("-m", dest="markexpr", metavar="EXPR", help="only tasks whose tags match EXPR (as run -m)")


def _retry_arguments(p: argparse.ArgumentParser) -> None:
    _select_arguments(p)
    p.add_argument(
        "--elsewhere",
        action="store_true",
        help="also for a task running on a peer that stopped answering: give up on that "
        "machine and place the task again (you vouch the old attempt is gone)",
    )


def _gc_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--yes", action="store_true", help="remove what is listed")
    p.add_argument(
        "--force", action="store_true", help="also remove dirty worktrees and branches with commits found nowhere else"
    )
    p.add_argument(
        "--branches",
        action="store_true",
        help="also list (and with --yes delete) the branches fleetrun created for ended tasks "
        "that are merged into their git_ref or were never DONE",
    )


#: The core's verbs, in the order ``fleetrun --help`` lists them. ``config.toml`` is
#: checked as the verbs that run or queue work start; the operator's verbs (status,
#: logs, cancel...) still work with a broken one, and check it only if they read a
#: setting.
BUILTIN_VERBS: tuple[VerbDecl, ...] = (
    VerbDecl(
        "run",
        "collect, queue and work the tasks files until nothing is left (the default)",
        cmd_run,
        _run_arguments,
        plugin_options=True,
        takes_tasks_files=True,
    ),
    VerbDecl(
        "validate", "check tasks files: typos, dangling or cyclic depends_on", cmd_validate, takes_tasks_files=True
    ),
    VerbDecl("queue", "validate and queue tasks files; runs nothing", cmd_queue, takes_tasks_files=True),
    VerbDecl(
        "work",
        "run the queued tasks (keeps running unless --until-idle)",
        cmd_work,
        _work_arguments,
        plugin_options=True,
        tasks_files=_queued_files,
    ),
    VerbDecl(
        "status",
        "one line per task (--graph: the depends_on tree and why anything waits)",
        cmd_status,
        _status_arguments,
        reads_config=False,
    ),
    VerbDecl("logs", "every transition and verdict of a task", cmd_logs, _logs_arguments, reads_config=False),
    VerbDecl(
        "cancel",
        "cancel tasks (names, --all, --state, -k); their dependents need a human",
        cmd_cancel,
        _select_arguments,
        reads_config=False,
    ),
    VerbDecl(
        "retry",
        "send NEEDS_HUMAN or CANCELLED tasks back to the queue (names, --state, -k)",
        cmd_retry,
        _retry_arguments,
        reads_config=False,
    ),
    VerbDecl(
        "approve",
        "accept NEEDS_HUMAN tasks as DONE (names, --state, -k)",
        cmd_approve,
        _select_arguments,
        reads_config=False,
    ),
    VerbDecl("drain", "start nothing new on this machine", cmd_drain, reads_config=False),
    VerbDecl("undrain", "start work again after drain", cmd_undrain, reads_config=False),
    VerbDecl(
        "gc",
        "list (and with --yes remove) worktrees and attempt folders of no task or of ended tasks",
        cmd_gc,
        _gc_arguments,
        reads_config=False,
    ),
)

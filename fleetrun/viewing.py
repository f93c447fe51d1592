"""The verbs that read the ledger for a person: ``status`` (the table, ``--graph``,
``--json``, ``--watch``) and ``logs`` (a task's transitions, verdicts and notes;
``-f`` follows them; both of those are in :mod:`fleetrun.watching`)."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, TextIO

from .exceptions import ExitCode, UsageError
from .ledger_schema import LATEST
from .states import State
from .table import cut, fit_table, terminal_width
from .textutil import NAME_LIMIT, ago, safe_name, safe_text
from .whereis import ran_on_peer, where_text

# The ledger's row types are imported by what reads them: the status table reads
# tuples, before any plugin is loaded (fleetrun.quickstatus).
if TYPE_CHECKING:
    from collections.abc import Callable

    from .config import Config
    from .ledger import Ledger, Task
    from .ledger_schema import LedgerFile

    #: (task id, state, host, its reason) of a placed task -> the reason to show.
    PlacedReason = Callable[[str, str, str, str], str]


def _where(t: Task) -> str:
    return t.host or "-"


def worktree_now(t: Task) -> Optional[str]:
    """The task's worktree, or None once it was removed (after DONE, or by gc). A
    peer's worktree is on the peer: kept as recorded."""
    if t.worktree and t.host in (None, "local") and not os.path.lexists(t.worktree):
        return None
    return t.worktree


def worktree_cell(t: Task) -> str:
    """Where the task's worktree is, for the table: its path (the home as ``~`` when it
    is under ``$HOME``), ``PATH (on PEER)`` for a peer's, ``-`` for none or removed."""
    return _worktree_cell(t.worktree, t.host, os.path.expanduser("~"))


def _worktree_cell(worktree: Optional[str], host: Optional[str], home: str) -> str:
    path = worktree
    if path and host in (None, "local") and not os.path.lexists(path):
        path = None  # removed (after DONE, or by gc)
    if not path:
        return "-"
    if host not in (None, "local"):
        return f"{safe_text(path)} (on {safe_text(host)})"
    if home not in ("", "/", "~") and path.startswith(home.rstrip(os.sep) + os.sep):
        path = "~" + path[len(home.rstrip(os.sep)) :]
    return safe_text(path)


def parse_state(text: str) -> set[State]:
    """``--state``'s value, as a set of one state.

    :raises UsageError: no state is named so.
    """
    try:
        return {State(text.upper())}
    except ValueError:
        raise UsageError(
            f"{text!r} is not a state; one of {', '.join(s.value for s in State)}", key="--state"
        ) from None


def cmd_status(config: Config, out: TextIO, err: TextIO) -> int:
    from .ledger import open_ledger

    led = open_ledger(config)
    states = parse_state(config.option.state) if config.option.state else None
    if getattr(config.option, "watch", False):
        from .watching import watch_status

        return watch_status(config, led, out)
    # each name's latest run (what needs you now), unless --all asks for the history
    latest = not getattr(config.option, "all_tasks", False)
    if config.option.json:
        _print_json(config, led, states, latest, out)
        return ExitCode.OK
    if config.option.graph:
        out.write(graph_text(led, states, latest))
        return ExitCode.OK
    width = None if getattr(config.option, "wide", False) else terminal_width(out)
    placed = _placed_reason(config, led, states, latest)
    text = table_text(config.home, led, states, latest, width, placed, config.option.state or "")
    assert text is not None  # the placed tasks' reasons are asked for
    out.write(text)  # one write: 10,000 print() calls were a tenth of the time
    return ExitCode.OK


def graph_text(led: Ledger, states: Optional[set[State]], latest: bool) -> str:
    """``status --graph``: the depends_on tree and why anything waits (no plugin is asked)."""
    tasks = led.tasks(states, listed=True, latest=latest)  # no spec read: the graph shows none
    return "".join(line + "\n" for line in _graph_lines(led, tasks, everything=states is None and not latest))


def table_text(
    home: Path,
    led: LedgerFile,
    states: Optional[set[State]],
    latest: bool,
    width: Optional[int],
    placed: Optional[PlacedReason],
    state_text: str = "",
) -> Optional[str]:
    """The status table as printed: the supervisor's line, a row a task (fitted to
    ``width``; None: every cell whole), and what was cut to fit.

    :param placed: the reason to show of a placed task with a host, which the plugins
        are asked about (:func:`_placed_reason`); None when no plugin is loaded
        (:mod:`fleetrun.quickstatus`): then the text is None if the table holds such a task.
    :param state_text: ``--state``'s value as typed (``states``), for the line that says none is in it.
    """
    lines = _supervisor_lines(home, led)
    rows = _table_rows(led, states, latest, placed)
    if rows is None:
        return None
    if not rows:
        lines.append("no tasks in the ledger" + (f" in state {state_text}" if states else ""))
        return "".join(line + "\n" for line in lines)
    table, left_out, was_cut = fit_table(rows, width)
    lines += table
    if width is not None and (left_out or was_cut):
        dropped = f"; {', '.join(left_out)} left out" if left_out else ""
        lines.append(cut(f"(cut to fit {width} columns{dropped}; --wide shows all)", width))
    return "\n".join(lines) + "\n"


def _print_json(config: Config, led: Ledger, states: Optional[set[State]], latest: bool, out: TextIO) -> None:
    """``status --json``: the tasks as one JSON array, written a batch of rows at a time
    (what ``json.dumps(rows, indent=2)`` prints, byte for byte, without holding every
    row: 100,000 tasks in constant memory)."""
    links = led.links()  # one read for every task: name -> URL, what plugins attached
    from .baseline import all_tests

    tests = all_tests(led)  # one read: the counts of each task's latest per-test verdict
    first = True
    for tasks in led.listed_batches(states, latest=latest, size=2000):
        extra: dict[str, dict[str, object]] = {}  # what plugins know of them (a task's role)
        for got in config.hook.fleetrun_status_fields(tasks=tasks, config=config):
            for tid, fields in (got or {}).items():
                extra.setdefault(tid, {}).update(fields)
        chunk = []
        for t in tasks:
            row = dict(t.to_json(), worktree=worktree_now(t), links={n: u for n, (_, u) in links.get(t.id, {}).items()})
            if t.id in tests:
                row["tests"] = tests[t.id]
            for key, value in extra.get(t.id, {}).items():
                row.setdefault(key, value)  # a plugin's field never replaces the core's
            # an element of an indented array: its lines one level in (a string holds no newline)
            chunk.append("  " + _indented(row).replace("\n", "\n  "))
        out.write(("[\n" if first else ",\n") + ",\n".join(chunk))
        first = False
    out.write("[]\n" if first else "\n]\n")


def _indented(row: dict[str, Any]) -> str:
    """``json.dumps(row, indent=2)``, byte for byte, with the C encoder for each flat
    value: with ``indent`` json encodes in Python, token by token, which was most of
    ``status --json``'s time at 100,000 tasks."""
    if not row or not all(type(key) is str for key in row):  # (a plugin's odd key: json's own way)
        return json.dumps(row, indent=2)
    parts = []
    for key, value in row.items():
        kind = type(value)
        if kind is str:
            text = _string(value)
        elif value is None:
            text = "null"
        elif kind is int:
            text = int.__repr__(value)
        elif kind is float and math.isfinite(value):
            text = float.__repr__(value)
        elif kind is list and value and all(type(x) is str for x in value):  # depends_on
            text = "[\n    " + ",\n    ".join(map(_string, value)) + "\n  ]"
        elif isinstance(value, (list, dict)) and value:  # nested: as json indents it, one level in
            text = json.dumps(value, indent=2).replace("\n", "\n  ")
        else:  # a float (NaN...), a bool, an empty list: json's own
            text = json.dumps(value)
        parts.append(f"  {_string(key)}: {text}")
    return "{\n" + ",\n".join(parts) + "\n}"


#: How json writes a string (``ensure_ascii``), its C function when there is one.
_string = json.encoder.encode_basestring_ascii


#: The states whose reason is the loop's wait, when it has one (a VERIFYING task's too:
#: a verifier that could not judge waits for its next try; below, as a placed task)
_WAITING = {State.READY.value, State.RETRYING.value, State.RESUMING.value}
#: The states of a placed task, whose host's plugin is asked about it (when it has a host).
PLACED = frozenset({State.ASSIGNED.value, State.RUNNING.value, State.VERIFYING.value})
_VERIFYING = State.VERIFYING.value


def _placed_reason(config: Config, led: Ledger, states: Optional[set[State]], latest: bool) -> Optional[PlacedReason]:
    """What the plugins say of a placed task with a host: its host's plugin's reason
    (``fleetrun_status_reason``: a peer that stopped answering), and that no loaded
    plugin provides its host (``fleetrun_hosts``). None when the table can hold no
    placed task (``--state ready``)."""
    placed_states = {State(s) for s in PLACED} & (states or set(State))
    if not placed_states:
        return None
    from .hostapi import missing_host_reason

    # the placed tasks whose host's plugin is asked about them: read in one query, not one each
    tasks = {t.id: t for t in led.tasks(placed_states, listed=True, latest=latest)}
    missing: dict[str, Optional[str]] = {}

    def reason_of(tid: str, state: str, host: str, reason: str) -> str:
        task = tasks.get(tid)
        said = config.hook.fleetrun_status_reason(task=task, config=config) if task is not None else None
        if said:  # its host's plugin knows better (a peer that stopped answering)
            reason = said
        if host not in missing:
            missing[host] = missing_host_reason(config, host)
        if missing[host]:
            reason = f"{missing[host]}; the attempt may still run there, so the task waits (fleetrun cancel to give up)"
        return reason

    return reason_of


def _table_rows(
    led: LedgerFile, states: Optional[set[State]], latest: bool, placed: Optional[PlacedReason]
) -> Optional[list[tuple[str, ...]]]:
    """The status table's cells, one row a task, from the columns it shows only (with
    10,000 tasks, making each a :class:`Task` was most of the command's time, and then
    each cell's formatting: a task that needs none is not formatted again).

    :param latest: each name's latest run only (:data:`~fleetrun.ledger.LATEST`).
    :param placed: the reason of a placed task with a host (:func:`table_text`); None:
        the rows are None if there is one."""
    now = time.time()
    meta = led.get_meta("waits")
    waits = json.loads(meta) if meta else {}
    # the tasks with an ended attempt whose cost is unknown (Ledger.unknown_cost, without the row types)
    unknown = {r[0] for r in led.conn.execute("SELECT DISTINCT task_id FROM attempts WHERE cost_usd IS NULL")}
    sql = "SELECT id, name, state, attempts, host, created, cost_usd, branch, worktree, reason FROM tasks"
    args: list[str] = []
    where = [LATEST] if latest else []
    if states:
        where.append(f"state IN ({','.join('?' * len(states))})")
        args = [st.value for st in states]
    if where:
        sql += " WHERE " + " AND ".join(where)
    home = os.path.expanduser("~")
    ages: dict[float, str] = {}
    # tuples: the collector stops tracking a tuple of strings, while 100,000 lists were
    # walked again at each of its passes (a fifth of the table's time at 100,000 tasks)
    rows: list[tuple[str, ...]] = []
    append = rows.append
    cursor = led.conn.cursor()
    cursor.row_factory = None  # tuples: the connection's sqlite3.Row is a third of the read
    for tid, name, state, attempts, host, created, cost_usd, branch, worktree, reason in cursor.execute(
        sql + " ORDER BY created, seq", args
    ):
        cost = f"${cost_usd:.2f}" if cost_usd else "-"
        if tid in unknown:  # an attempt's cost was never reported: what is known is a floor
            cost = f"${cost_usd:.2f}+" if cost_usd else "?"
        if state in _WAITING:
            reason = waits.get(tid, reason)
        elif state in PLACED and host:
            if state == _VERIFYING:
                reason = waits.get(tid, reason)
            if placed is None:
                return None
            reason = placed(tid, state, host, reason)
        age = ages.get(created)
        if age is None:  # a queue's tasks share their time
            age = ages[created] = ago(created, now)
        # what a task's name or reason holds is shown, not sent (most need no escaping)
        append(
            (
                name if len(name) <= NAME_LIMIT and name.isprintable() else safe_name(name),
                state,
                str(attempts),
                "-" if not host else host if host.isprintable() else safe_text(host),
                age,
                cost,
                tid,
                "-" if not branch else branch if branch.isprintable() else safe_text(branch),
                "-" if worktree is None else _worktree_cell(worktree, host, home),
                reason if type(reason) is str and reason.isprintable() else safe_text(reason),
            )
        )
    return rows


def _supervisor_lines(home: Path, led: LedgerFile) -> list[str]:
    """Whether this machine drains, and whether a supervisor runs."""
    lines = []
    policy = home / "policy.toml"
    source = None
    if os.path.exists(policy):  # without it nothing drains this machine: no policy module to load
        from .policy import local_drain_source

        source = local_drain_source(policy)
    if source is not None:  # what undrain cannot clear comes first
        lines.append(f"this machine is draining ({safe_text(source)})")
    elif led.get_meta("drain") == "1":
        lines.append("this machine is draining (fleetrun drain; fleetrun undrain to start work)")
    try:
        from .liveness import describe

        line = describe(home)
    except ImportError:  # pragma: no cover
        line = None
    if line:
        lines.append(safe_text(line))
    return lines


def why(t: Task, by_id: dict[str, Task], waits: dict[str, str]) -> str:
    """Why a task is not running, in a few words."""
    if t.state is State.PENDING:
        blocking = [by_id[d] for d in t.deps if d in by_id and by_id[d].state is not State.DONE]
        if blocking:
            return "waiting for " + ", ".join(f"{safe_name(d.name)} ({d.state})" for d in blocking)
        return "dependencies done; waiting for the loop"
    if t.state in (State.READY, State.RETRYING, State.RESUMING):
        return waits.get(t.id) or ("waiting for a place" if t.state is State.READY else t.reason)
    if t.state is State.VERIFYING:
        return waits.get(t.id, "")
    if t.state in (State.NEEDS_HUMAN, State.CANCELLED):
        return t.reason
    return ""


def _graph_lines(led: Ledger, tasks: list[Task], everything: bool = False) -> list[str]:
    by_id = {t.id: t for t in (tasks if everything else led.tasks(listed=True))}
    shown = {t.id for t in tasks}
    waits = json.loads(led.get_meta("waits") or "{}")
    children: dict[str, list[Task]] = {}
    for t in tasks:
        for d in t.deps:
            children.setdefault(d, []).append(t)
    roots = [t for t in tasks if not any(d in shown for d in t.deps)]
    seen: set[str] = set()
    lines: list[str] = []  # written at once: 10,000 print() calls were a tenth of the time

    def show(t: Task, depth: int) -> None:
        reason = why(t, by_id, waits)
        again = t.id in seen
        extra = f"  {reason}" if reason and not again else ""
        name = t.name if len(t.name) <= NAME_LIMIT and t.name.isprintable() else safe_name(t.name)
        lines.append(
            f"{'  ' * depth}{name} [{t.state.value}] {t.id}{' (see above)' if again else ''}"
            f"{extra if extra.isprintable() else safe_text(extra)}"
        )
        if again:
            return
        seen.add(t.id)
        for c in children.get(t.id, []):
            show(c, depth + 1)

    if not tasks:
        lines.append("no tasks in the ledger")
    for r in roots:
        show(r, 0)
    return lines


def did_the_work(led: Ledger, task: Task) -> Optional[Task]:
    """The task whose run did ``task``'s work when an unchanged re-run kept it (its
    reason ``unchanged:ID``, always the task that ran: :meth:`Ledger.add_tasks`), or
    None for a task that ran itself (or whose worker is no longer in the ledger)."""
    if task.state is not State.DONE or not task.reason.startswith("unchanged:"):
        return None
    return led.get(task.reason.split(":", 1)[1])


def cmd_logs(config: Config, out: TextIO, err: TextIO) -> int:
    from . import ops
    from .ledger import open_ledger

    led = open_ledger(config)
    task = ops.resolve(led, config.option.task)
    kept_by: Optional[Task] = None
    if task.id != config.option.task:
        # a name: its latest task, which an unchanged re-run entered DONE without a run
        # of its own; what a person asks for is the run that did the work
        worker = did_the_work(led, task)
        if worker is not None:
            kept_by, task = task, worker
    if getattr(config.option, "follow", False):
        from .watching import follow_logs

        return follow_logs(config, led, task, out)
    rows = led.transitions(task.id)
    verdicts = led.verdicts(task.id)
    attempts = {a.id: a for a in led.attempts(task.id)}
    links = led.links(task.id).get(task.id, {})
    if config.option.json:
        print(
            json.dumps(
                {
                    "task": dict(
                        task.to_json(), worktree=worktree_now(task), links={n: u for n, (_, u) in links.items()}
                    ),
                    "transitions": [r.__dict__ for r in rows],
                    "verdicts": [v.__dict__ for v in verdicts],
                    "attempts": [a.__dict__ for a in attempts.values()],
                },
                indent=2,
                default=str,
            ),
            file=out,
        )
        return ExitCode.OK
    plus = "+" if any(a.cost_usd is None for a in attempts.values()) else ""
    print(f"{safe_name(task.name)} {task.id} [{task.state}]  cost ${task.cost_usd:.2f}{plus}", file=out)
    if kept_by is not None:
        print(f"(kept unchanged by the later runs of the file: latest {kept_by.id})", file=out)
    # where its work is: what a human looking at a NEEDS_HUMAN task opens first
    if task.worktree:
        shown = safe_text(task.worktree)
        if task.host not in (None, "local"):
            print(
                f"worktree: {shown} on {safe_text(task.host)} (on the peer; fleetrun gc here does not touch it)",
                file=out,
            )
        elif not worktree_now(task):
            print(f"worktree: removed (was {shown})", file=out)
        else:
            print(f"worktree: {shown}", file=out)
    elif ran_on_peer(task):  # removed on the peer after DONE: the path its attempt worked in
        was = next(
            (
                a.workspace.get("path")
                for a in reversed(list(attempts.values()))
                if isinstance(a.workspace, dict) and a.workspace.get("path")
            ),
            None,
        )
        if was:
            print(f"worktree: removed (was {safe_text(was)} on {safe_text(task.host)})", file=out)
    if task.branch:
        print(f"branch: {safe_text(task.branch)}", file=out)
    if ran_on_peer(task):  # where it ran, and whether its branch is here or on the peer
        print(f"where: {where_text(task)}", file=out)
    if task.state.terminal and task.host in (None, "local") and worktree_now(task):
        print("(the task has ended: `fleetrun gc` lists its worktree, `fleetrun gc --branches` its branch)", file=out)
    events: list[tuple[float, int, str]] = []
    for r in rows:
        where = f" attempt {r.attempt}" if r.attempt else ""
        host = f" on {r.host}" if r.host else ""
        src = r.from_state or ""
        events.append((r.time, 0, f"{src:>11} -> {r.to_state:<11} {safe_text(r.cause)}{where}{safe_text(host)}"))
    for v in verdicts:
        att = attempts.get(v.attempt_id)
        num = att.number if att else "?"
        head = (
            f"{'PASS' if v.passed else 'FAIL'} verifier {v.idx + 1} ({safe_text(v.kind)}: {safe_text(v.label)}) "
            f"attempt {num}"
        )
        if v.reason:
            head += f": {safe_text(v.reason)}"
        if v.cost_usd:
            head += f" (${v.cost_usd:.2f})"
        # a passing verifier's output (pages of progress dots) only with -v
        shown = v.output if not v.passed or config.verbosity > 0 else ""
        body = "".join(f"\n    | {safe_text(line)}" for line in shown.rstrip().splitlines()[-40:])
        events.append((v.time, 1, head + body))
    for a in attempts.values():
        for s in (a.info or {}).get("setup_steps") or []:  # the task's setup commands, before its agent
            if not isinstance(s, dict):
                continue
            head = (
                f"{'PASS' if s.get('passed') else 'FAIL'} setup {s.get('n')} "
                f"({safe_text(s.get('command'), limit=60)}) attempt {a.number}: {safe_text(s.get('reason'))}"
            )
            lines = [] if s.get("passed") else str(s.get("output") or "").rstrip().splitlines()[-40:]
            events.append(
                (float(s.get("time") or a.created), 1, head + "".join(f"\n    | {safe_text(line)}" for line in lines))
            )
        if a.ended:
            text = f"attempt {a.number} ({a.kind}) ended: {safe_text(a.outcome or '-')}"
            if a.cost_usd is None:
                text += ", cost unknown"
            elif a.cost_usd:
                text += f", ${a.cost_usd:.2f}"
            if a.dir:
                # a peer attempt's folder holds the mirror of its log under the relay's own
                # name, never `log` (a peer's bytes stay apart from a local attempt's files)
                log = Path(a.dir) / "log"
                text += f", log {safe_text(log)}" if log.exists() else f", its folder {safe_text(a.dir)}"
            for d in (a.info or {}).get("denials") or []:
                if isinstance(d, dict):
                    tool_input = json.dumps(d.get("tool_input", {}))[:120]
                    text += (
                        f"\n    permission denied: {safe_text(d.get('tool_name'), limit=80)} {safe_text(tool_input)}"
                    )
            events.append((a.ended, 0, text))
    for t, text in led.notes(task.id):
        events.append((t, 2, f"note: {safe_text(text)}"))
    for name, (t, url) in links.items():
        events.append((t, 3, f"link: {name.replace('_', ' ')}: {safe_text(url)}"))
    for t, _, text in sorted(events, key=lambda e: (e[0], e[1])):
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
        print(f"{stamp}  {text}", file=out)
    return ExitCode.OK

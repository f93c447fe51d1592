"""Running a tasks file again, as pytask and pytest do: what counts as a task's
definition, which tasks of the file's last run are kept, and ``--lf``/``--ff``.

A queue is resumed when the command line's tasks are the same, key for key
(:func:`fleetrun.queueing.queue_digest`: comments, blank lines and the order of the
tasks do not count; :func:`files_digest` is its version 1, what queues made before
version 2 are found by).

A task's *definition digest* is a hash of the collected :class:`TaskSpec` fields that
decide what its work is and how it is judged: all but :data:`NOT_DEFINITION_FIELDS`
(verifiers and setup without their lines and limits, plugin keys included), and the
``[agents.NAME]`` table of its command agent. Its name is its identity; its limits (retries, timeouts, budget),
where it may run (``requires``, ``peer``), its tags, its place in the file and the
file's comments are not part of it: changing them does not change what a DONE run
made.

Running a file again (``fleetrun FILE``, without ``--new-queue``) makes a queue in
which a task is *kept* — entered DONE, standing for the DONE task of the same name in
the file's last run, whose branch and handoff it carries — when that task ended DONE,
its definition digest is the same, and every task it depends on is kept too (a
dependent of a task that runs again runs again). Every other task is queued.

The last run of a file is, for each name, the newest task of that name in a queue
made from the same files (a ``-k`` run updates the names it ran, as pytest's cache
does for the tests it ran).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from .ledger import Task
from .states import State

if TYPE_CHECKING:
    from .config import Config
    from .taskspec import TaskSpec

#: The :class:`~fleetrun.taskspec.TaskSpec` fields that are not part of a task's
#: definition digest: its identity, where it was written, its tags, its limits and
#: where it may run. Every other field is (a field added later counts until it is
#: named here: when in doubt, a task runs again rather than being kept).
NOT_DEFINITION_FIELDS = frozenset(
    {
        "name",
        "source",
        "line",
        "key_lines",
        "defaulted",
        "tags",
        "max_retries",
        "timeout_min",
        "stall_timeout_min",
        "budget_usd",
        "requires",
        "peer",
    }
)
#: The fields of each verifier and setup command that do not count: its line and its
#: limits.
NOT_STEP_FIELDS = frozenset({"line", "timeout_s", "budget_usd"})

#: States a task of the last run "failed" in, for ``--lf``/``--ff``.
FAILED = frozenset({State.NEEDS_HUMAN, State.CANCELLED})


def _step(v: dict[str, Any]) -> dict[str, Any]:
    return {k: x for k, x in v.items() if k not in NOT_STEP_FIELDS}


def definition_digest(spec: TaskSpec, settings: dict[str, Any]) -> str:
    """The digest of what ``spec`` asks for (see the module's docstring).

    :param settings: the tasks files' own tables (the queue's settings): the
        ``[agents.NAME]`` table of the task's agent is part of its definition.
    """
    data = {k: v for k, v in spec.to_json().items() if k not in NOT_DEFINITION_FIELDS}
    data["verify"] = [_step(v) for v in data["verify"]]
    data["setup"] = [_step(v) for v in data["setup"]]
    agents = settings.get("agents")
    data["agent_table"] = agents.get(spec.agent) if isinstance(agents, dict) else None
    text = json.dumps(data, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


#: Where a spec was written: not part of any digest (a comment moves every line).
POSITION_FIELDS = ("source", "line", "key_lines", "defaulted")


def _whole(spec: TaskSpec) -> dict[str, Any]:
    data = spec.json_view()  # a dict of its own, its steps' dicts too: read, not kept
    for key in POSITION_FIELDS:
        del data[key]
    for key in ("verify", "setup"):
        for step in data[key]:
            del step["line"]
    return data


def files_digest(specs: list[TaskSpec], settings: dict[str, Any]) -> str:
    """The digest of a command line's tasks as a whole, for resuming the queue of an
    unchanged file: every collected key of every task (limits and tags too: a resumed
    queue keeps the tasks it holds), in name order, and the files' own tables. The
    order of the tasks, comments and blank lines do not count. The queue digest's
    version 1 (queues made before version 2 hold it), and version 2's for a file a
    plugin's collector read (:func:`fleetrun.queueing.queue_digest`).

    The SHA-256 of ``json.dumps([sorted((name, task) ...), settings], sort_keys=True)``,
    fed a task at a time (the text of 100,000 tasks is never made whole). Names are
    unique in a collection (check_graph), so the name alone orders them."""
    encode = json.JSONEncoder(sort_keys=True, default=str, separators=(",", ":")).encode
    h = hashlib.sha256(b"[[")
    sep = ""
    for spec in sorted(specs, key=_name):
        h.update((sep + encode([spec.name, _whole(spec)])).encode())
        sep = ","
    h.update(("]," + encode(settings) + "]").encode())
    return h.hexdigest()


def _name(spec: TaskSpec) -> str:
    return spec.name


def source_of(config: Config) -> str:
    """How the ledger names the files of this command line (``queues.source``)."""
    return ",".join(config.option.files)


def last_run(config: Config) -> dict[str, tuple[Task, dict[str, Any]]]:
    """By name, the newest task of the file's earlier queues, with its queue's settings;
    empty when there is no ledger yet."""
    if not (config.home / "state.db").exists():
        return {}
    from .ledger import open_ledger

    newest: dict[str, tuple[Task, dict[str, Any]]] = {}
    for task, settings in open_ledger(config).tasks_of_source(source_of(config)):
        newest[task.name] = (task, settings)  # oldest first: the newest wins
    return newest


def last_failed(config: Config, names: list[str]) -> list[str]:
    """Of ``names``, those whose task ended NEEDS_HUMAN or CANCELLED in the last run."""
    last = last_run(config)
    return [n for n in names if n in last and last[n][0].state in FAILED]


@dataclass
class Plan:
    """What a new queue of a file run again holds.

    :ivar kept: by name, the DONE task of the last run each kept task stands for.
    :ivar unfinished: the last run's tasks that are not terminal yet (an interrupted
        run): the loop works them as well as the new queue's task of their name.
    """

    kept: dict[str, Task] = field(default_factory=dict)
    unfinished: list[Task] = field(default_factory=list)


def plan(config: Config, items: list[TaskSpec]) -> Plan:
    """Which of ``items`` are kept (see the module's docstring); the rest is queued."""
    last = last_run(config)
    settings = config.file_settings
    same: set[str] = set()
    for spec in items:
        prev = last.get(spec.name)
        if prev is None or prev[0].state is not State.DONE:
            continue
        if definition_digest(prev[0].spec, prev[1]) == definition_digest(spec, settings):
            same.add(spec.name)
    by_name = {s.name: s for s in items}
    kept: dict[str, Task] = {}
    memo: dict[str, bool] = {}

    def keeps(name: str, seen: frozenset[str] = frozenset()) -> bool:
        if name not in memo:
            spec = by_name.get(name)
            # a dependency outside this selection is not queued here: it cannot be kept
            memo[name] = (
                name in same
                and spec is not None
                and name not in seen
                and all(keeps(d, seen | {name}) for d in spec.depends_on)
            )
        return memo[name]

    for spec in items:
        if keeps(spec.name):
            kept[spec.name] = last[spec.name][0]
    unfinished = [
        last[s.name][0] for s in items if s.name in last and last[s.name][0].state not in (State.DONE, *FAILED)
    ]
    return Plan(kept, unfinished)


def unfinished_notes(p: Plan) -> list[str]:
    """A warning for each task of the last run still unfinished: it runs besides the new
    queue's (``fleetrun cancel ID`` stops it)."""
    return [
        f"warning: {t.name} of the file's last run ({t.id}) is {t.state}, not finished: it runs "
        f"besides the new one; fleetrun cancel {t.id} stops it"
        for t in p.unfinished
    ]


def kept_note(p: Plan) -> Optional[str]:
    """``2 unchanged (done earlier): a, b; --new-queue runs them again``, or None."""
    if not p.kept:
        return None
    n = len(p.kept)
    names = list(p.kept)
    shown = ", ".join(names[:5]) + (f" and {n - 5} more" if n > 5 else "")
    return f"{n} unchanged (done earlier): {shown}; --new-queue runs {'them' if n != 1 else 'it'} again"

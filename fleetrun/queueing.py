"""From the command line's tasks files to tasks in the ledger: collect every file through
``fleetrun_collect_file`` (every usage error at once), apply
``fleetrun_collection_modifyitems``, and queue what was collected.

A queue is known by its digest (each file's path and tasks, ``-k`` and ``-m``): running
an unchanged file again resumes its queue instead of queueing it twice; a changed one
makes a queue in which the unchanged DONE tasks of its last run are kept
(:mod:`fleetrun.rerun`).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, TextIO

from .collect import KeyTable, TaskFile, check_graph, display_path, tasks_warning
from .exceptions import UsageError, UsageErrors
from .ledger import Ledger, QueuedTasks, Task, open_ledger
from .repochecks import BranchReuse, check_branches, check_refs
from .stash import StashKey

if TYPE_CHECKING:
    from .config import Config
    from .taskspec import TaskSpec

#: The files collected, for ``validate``'s per-file lines.
FILES_KEY = StashKey[list[TaskFile]]()
#: Tasks that name a branch fleetrun made for an earlier task of the same name: queueing
#: notes it on the new task.
BRANCH_REUSE_KEY = StashKey[list[BranchReuse]]()
#: What collection warns about (plugins add to it in ``fleetrun_collection_modifyitems``):
#: ``validate`` and a run print it before anything starts.
WARNINGS_KEY = StashKey[list[str]]()


def warn_tasks(config: Config, first: TaskSpec, count: int, key: str, what: str, line: Optional[int] = None) -> None:
    """Add to :data:`WARNINGS_KEY` one warning for ``count`` tasks that share a cause
    (:func:`fleetrun.collect.tasks_warning`)."""
    config.stash.setdefault(WARNINGS_KEY, []).append(
        tasks_warning(first, count, key, what, config.invocation_dir, line)
    )


#: Lines collection has for the header (``--lf``: how many failures it runs again).
COLLECT_NOTES_KEY = StashKey[list[str]]()
#: ``work``: the queues whose ``[agents]``/``[brain]`` tables and ``fleetconf.py`` files
#: are loaded, and the ledger's queue counter when they were read.
LOADED_QUEUES_KEY = StashKey[tuple[int, set[str]]]()
#: The names of the tasks ``-k``, ``-m`` and ``--lf`` left out.
DESELECTED_KEY = StashKey[list[str]]()
#: The names of the tasks ``-k`` did not match but took along, as dependencies of ones it did:
#: the session says so.
SELECTED_AS_DEPENDENCY_KEY = StashKey[list[str]]()


#: The version of the queue's digest new queues are written with (``|tasks2=``): each
#: file's :attr:`~fleetrun.collect.TaskFile.digest`, what its tasks were made from. A
#: queue made before it (``|tasks=``, version 1) holds :func:`fleetrun.rerun.files_digest`
#: of the collected specs, made only to resume such a queue (:func:`queue_to_resume`).
DIGEST_VERSION = 2
#: What names the tasks' part of each version's digest.
_TASKS_PART = {1: "|tasks=", 2: "|tasks2="}
#: The version 1 digest of the files' specs (:func:`fleetrun.rerun.files_digest`) and the
#: files it is of: a run may ask it twice.
_DIGEST_KEY = StashKey[tuple[list[TaskFile], str]]()


def queue_digest(config: Config, version: int = DIGEST_VERSION) -> str:
    """The digest of the queue the command line makes: the files named and what they
    hold, task by task (not their comments or the order of their tasks), ``-k``, ``-m``,
    and the project file's task defaults (they are part of every task). A
    ``--lf``/``--ff`` queue holds a choice of the last run's outcomes, so it is never an
    unchanged file's queue to resume.

    :param version: 2 (new queues): the tasks' part hashes each file's
        :attr:`~fleetrun.collect.TaskFile.digest`, the tables its tasks were made from
        (a file whose collector set none: its specs, as version 1 does); 1: the
        SHA-256 of every field of every collected spec (:func:`fleetrun.rerun.files_digest`),
        what queues made before version 2 hold.
    """
    files = config.stash.get(FILES_KEY, [])
    if version == 1:
        tasks = _specs_digest(config, files)
    else:
        import hashlib

        from .rerun import files_digest

        each = [f.digest or "specs:" + files_digest(f.tasks, f.settings) for f in files]
        tasks = hashlib.sha256(",".join(each).encode()).hexdigest()
    project = config.project.defaults_digest() if config.project is not None else ""
    marks = config.getoption("markexpr")
    rerun = "|rerun" if config.getoption("last_failed") or config.getoption("failed_first") else ""
    return (
        "|".join(config.option.files)
        + _TASKS_PART[version]
        + tasks
        + "|k="
        + (config.getoption("keyword") or "")
        + (f"|m={marks}" if marks else "")
        + project
        + rerun
    )


def _specs_digest(config: Config, files: list[TaskFile]) -> str:
    from .rerun import files_digest

    made = config.stash.get(_DIGEST_KEY, None)
    if made is not None and made[0] is files:  # 0.8 s at 100,000 tasks: asked once
        return made[1]
    with _bulk():  # a dict a task, made and dropped: a run asks it outside queue_items's
        tasks = files_digest([t for f in files for t in f.tasks], config.file_settings)
    config.stash[_DIGEST_KEY] = (files, tasks)
    return tasks


def queue_to_resume(config: Config, led: Ledger) -> Optional[str]:
    """The queue of the unchanged files this command line names, to resume, or None:
    the newest one with this digest (:func:`queue_digest`) that still has tasks. A queue
    made before the digest's version 2 is found by its version 1 digest, which is made
    (0.8 s at 100,000 tasks) only when the ledger holds such a queue of these files."""
    found = led.find_queue(queue_digest(config))
    if found is not None:
        return found
    older = "|".join(config.option.files) + _TASKS_PART[1]
    if any(h.startswith(older) for h in led.queue_hashes(",".join(config.option.files))):
        return led.find_queue(queue_digest(config, version=1))
    return None


def _branch_owner(config: Config) -> Optional[Callable[[str, str, str], Optional[str]]]:
    """Who fleetrun created a branch for, from the ledger; None when there is no
    ledger yet (then fleetrun created no branch; ``validate`` makes no ledger)."""
    if not (config.home / "state.db").exists():
        return None
    return open_ledger(config).branch_owner


def check_key_plugins(files: list[Any], config: Config) -> list[UsageError]:
    """A task key only a plugin acts on (``role =``: the ``mailbox`` delivers the task to
    the role) needs that plugin: with it blocked or not loaded, such a task is an error
    at that key's line, not a task that would quietly run without it."""
    from .builtin_plugins import KEY_PLUGINS, plugin_unavailable

    errors: list[UsageError] = []
    for key, plugin in KEY_PLUGINS.items():
        why = plugin_unavailable(getattr(config, "pluginmanager", None), plugin)
        if why is None:
            continue
        from .textutil import safe_name

        errors += [
            UsageError(
                f"the {plugin} plugin is {why}",
                line=spec.key_lines.get(key, spec.line),
                file=display_path(Path(spec.file_of(key) or f.path), config.invocation_dir),
                key=f"task '{safe_name(spec.name)}': {key}",
            )
            for f in files
            for spec in f.tasks
            if getattr(spec, key, None)
        ]
    return errors


def check_file_settings(tf: TaskFile, config: Config) -> list[UsageError]:
    """A tasks file's ``[agents.NAME]`` and ``[brain]``, checked as ``config.toml`` is,
    each mistake with its line: every table, whether a task of this run uses it or not
    (a slip in ``[agents.codex]`` is found at validate, not the night a task uses it)."""
    if not tf.settings:
        return []
    from .config import check_config
    from .tomlfile import map_lines

    skip = any(p is None for _n, p in config.pluginmanager.list_name_plugin())  # a blocked plugin's table
    return check_config(
        tf.settings,
        map_lines(tf.text),
        config.config_keys(),
        display_path(Path(tf.path), config.invocation_dir),
        skip_unknown_tables=skip,
    )


#: A verifier kind's built-in plugin is named ``verify_<kind>`` (``verify_run``,
#: ``verify_brain``...): how a kind that is missing because its plugin is blocked is
#: told apart from a misspelt key, without the core naming any plugin.
VERIFIER_PLUGIN_PREFIX = "verify_"


def missing_kinds(config: Config) -> dict[str, str]:
    """The verifier kinds whose built-in plugin is blocked, with why (for the error a
    verifier using one gets)."""
    pm = getattr(config, "pluginmanager", None)
    blocked = pm.blocked_builtins() if pm is not None and hasattr(pm, "blocked_builtins") else []
    return {
        name[len(VERIFIER_PLUGIN_PREFIX) :]: f"its plugin {name} is not loaded (-p no:{name})"
        for name in blocked
        if name.startswith(VERIFIER_PLUGIN_PREFIX)
    }


def collect(config: Config) -> list[TaskFile]:
    """Collect every file named on the command line; raise all usage errors at once.

    :return: the collected files; their top-level tables are merged into
        ``config.file_settings``.
    :raises UsageError: every problem of every file (``UsageErrors`` for several).
    """
    keys = KeyTable.build(config.hook.fleetrun_task_keys(config=config), missing_kinds=missing_kinds(config))
    files = []
    graph_only: list[Any] = []
    errors: list[UsageError] = []
    project_errors: list[UsageError] = []  # printed first: the file under every tasks file
    if config.project is not None:
        try:
            config.project.task_defaults(keys)  # its mistakes once, naming the project file
        except UsageErrors as e:
            project_errors.extend(e.errors)
        except UsageError as e:
            project_errors.append(e)
    for f in config.option.files:
        try:
            tf = config.hook.fleetrun_collect_file(file_path=f, config=config, keys=keys)
        except UsageErrors as e:
            errors.extend(e.errors)
            partial = getattr(e, "partial", None)
            if partial is not None:
                graph_only.append(partial)
            continue
        except UsageError as e:
            errors.append(e)
            continue
        if tf is None:
            errors.append(
                UsageError(
                    "no collector takes this kind of file (tasks files are .toml)",
                    file=display_path(Path(f), config.invocation_dir),
                )
            )
            continue
        errors.extend(check_file_settings(tf, config))
        files.append(tf)
    errors.extend(check_graph(files + graph_only, config.invocation_dir))
    repos: dict[str, Any] = {}  # one repository lookup per cwd for both checks
    errors.extend(check_refs(files + graph_only, config.invocation_dir, repos))
    branch_errors, reuse = check_branches(files + graph_only, _branch_owner(config), config.invocation_dir, repos)
    errors.extend(branch_errors)
    errors.extend(check_key_plugins(files + graph_only, config))
    config.stash[BRANCH_REUSE_KEY] = reuse
    if errors:
        order = {f: i for i, f in enumerate(config.option.files)}
        errors.sort(key=lambda e: (order.get(str(Path(e.file or "").resolve()), 0), e.line or 0))
    errors[:0] = project_errors
    if errors:
        raise UsageErrors(errors) if len(errors) > 1 else errors[0]
    for tf in files:
        for key, table in tf.settings.items():
            config.file_settings.setdefault(key, {})
            if isinstance(table, dict):
                config.file_settings[key].update(table)
    return files


@contextmanager
def _bulk() -> Iterator[None]:
    """Python's cycle collector paused while a tasks file's objects are made: they are
    many (a few dozen a task, 100,000 tasks) and none is garbage yet, and each full
    collection walked every one of them again (a quarter of ``fleetrun queue``'s CPU at
    30,000 tasks). The same while a dict or a :class:`Task` a task is made and dropped
    (the digest, the transition hook's tasks): each collection walked the 100,000 specs
    held, 0.5-1 s of CPU each phase. Reference counting still frees what is dropped; the
    collector runs again afterwards."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def collect_items(config: Config) -> list[TaskSpec]:
    """The tasks of every file, after ``fleetrun_collection_modifyitems`` (``-k``);
    the files are kept in ``config.stash[FILES_KEY]``."""
    with _bulk():
        files = collect(config)
        items = [t for f in files for t in f.tasks]
        config.hook.fleetrun_collection_modifyitems(config=config, items=items)
    config.stash[FILES_KEY] = files
    return items


def queue_items(config: Config, items: list[TaskSpec], kept: Optional[dict[str, Task]] = None) -> QueuedTasks:
    """Queue ``items`` as one new queue in the ledger, and report each new task's
    first state (cause ``queued``, or ``unchanged:ID`` for one entered DONE): to the
    plugins that implement ``fleetrun_queued``, in one call, then to every other
    plugin's ``fleetrun_transition``, once per task, as its contract says.

    The per-task calls cost about 10 us a task of pluggy, the :class:`Task` and the
    ``events`` plugin's line (a tenth of ``fleetrun queue``'s CPU at 100,000 tasks),
    which its ``fleetrun_queued`` writes without a ``Task`` of each; no ``Task`` is made
    when no plugin is left for the per-task calls. Each is made for its call and
    dropped (:class:`~fleetrun.ledger.QueuedTasks`).

    :param kept: by name, the DONE tasks of the file's last run that items stand for
        unchanged (:func:`fleetrun.rerun.plan`).
    """
    led = open_ledger(config)
    src = ",".join(config.option.files)
    with _bulk():
        tasks = led.queue_tasks(
            items, source=src, source_hash=queue_digest(config), settings=config.file_settings, kept=kept
        )
    for reuse in config.stash.get(BRANCH_REUSE_KEY, []):
        i = tasks.place.get(reuse.task_name)
        if i is not None:  # the user named a branch fleetrun made for this task before
            led.add_note(tasks.id_of(i), reuse.note)
    batch = config.hook.fleetrun_queued
    told = {impl.plugin for impl in batch.get_hookimpls()}
    with _bulk():  # a plugin may read a Task of each
        batch(tasks=tasks, config=config)
    pm = config.pluginmanager
    hook = (
        pm.subset_hook_caller("fleetrun_transition", remove_plugins=told) if told else config.hook.fleetrun_transition
    )
    if not hook.get_hookimpls():
        return tasks
    with _bulk():  # a Task a call, dropped after it: the collector walked them all again
        for t in tasks:
            hook(task=t, from_state="", to_state=t.state.value, cause=t.reason, attempt=None, config=config)
    return tasks


def queue_files(config: Config, out: TextIO) -> int:
    """``fleetrun queue``: collect the command line's files, queue their tasks as one
    queue and print a ``queued`` line for each; :return: how many were queued.

    The cycle collector is paused from the collection to the end: what the command
    makes (a few dozen objects a task, 100,000 tasks) lives until it ends, and none of
    it is cyclic garbage. Resumed after each phase, the collector's first young pass
    walked every object the phase had made (0.35 s of CPU at 100,000 tasks), to free
    nothing; here what the command made is dropped before the collector resumes."""
    from .textutil import safe_name

    with _bulk():
        items = collect_items(config)
        if not items:
            return 0
        tasks = queue_items(config, items)
        for task_id, name, state in tasks.shown():  # the rows written, not a Task again each
            out.write(f"queued {task_id}  {safe_name(name)}  [{state}]\n")
        n = len(tasks)
        # freed by their counts while the collector is paused: resumed, it finds nothing to walk
        del items, tasks
        config.stash.pop(FILES_KEY, None)
    return n


def queued_files(config: Config) -> list[Path]:
    """``work``: the queued tasks' files (their ``fleetconf.py`` files load), and their
    ``[agents]``/``[brain]`` tables, as they were when queued, merged into
    ``config.file_settings``; the queues read are remembered for :func:`load_new_queues`."""
    led = open_ledger(config)
    mark = led.queues_mark()
    sources, ids = _merge_queues(config, led.live_queues(), set())
    config.stash[LOADED_QUEUES_KEY] = (mark, ids)
    return sources


def load_new_queues(config: Config) -> None:
    """``work``, once a pass: a tasks file queued since the loop started brings its
    ``[agents]``/``[brain]`` tables and ``fleetconf.py`` files as :func:`queued_files`
    did for the files queued before (its tasks would otherwise meet "no plugin spawns
    agent"). Cheap when nothing was queued: one counter is read."""
    led = open_ledger(config)
    mark, seen = config.stash.get(LOADED_QUEUES_KEY, (-1, set()))
    now = led.queues_mark()
    if now == mark:
        return
    new = [q for q in led.live_queues() if q[0] not in seen]
    sources, ids = _merge_queues(config, new, seen)
    config.stash[LOADED_QUEUES_KEY] = (now, ids)
    if sources:
        try:
            config.pluginmanager.load_fleetconfs(sources)
        except UsageError as e:  # the file changed since it was queued: say so, go on
            warning = e.format().replace("ERROR: ", "WARNING: ", 1)
            config.err.write(f"{warning} (not loaded; it applies from the next `fleetrun work`)\n")


def _merge_queues(
    config: Config, queues: list[tuple[str, list[str], dict[str, Any]]], seen: set[str]
) -> tuple[list[Path], set[str]]:
    sources: list[Path] = []
    ids = set(seen)
    for qid, files_, settings in queues:
        ids.add(qid)
        sources.extend(Path(f) for f in files_ if Path(f).exists())
        for key, table in settings.items():
            if isinstance(table, dict):
                config.file_settings.setdefault(key, {}).update(table)
    return sources, ids

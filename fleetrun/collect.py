"""Collection: tasks files -> validated :class:`TaskSpec` items, with file:line errors.

The TOML collector here is the default ``fleetrun_collect_file``; it reports every
problem in a file at once, each as ``ERROR: file:LINE: task 'NAME': key: message``.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from .exceptions import UsageError, UsageErrors

# BUILTIN_*, SETUP_STEP_KEYS: importable from here, as before the key table had its own module
from .taskdefaults import (  # noqa: F401
    TaskDefaults,
    collect_defaults,
    not_a_default,
    take_default,
    unknown_default,
)
from .taskkeys import (  # noqa: F401
    BUILTIN_TASK_KEYS,
    BUILTIN_VERIFY_KEYS,
    BUILTIN_VERIFY_KINDS,
    DEFAULT_TASK_KEYS,
    NOT_DEFAULT_KEYS,
    NUM,
    SETUP_STEP_KEYS,
    KeyErrors,
    KeyTable,
    check_value,
    collect_setup,
    suggest,
    type_name,
    type_ok,
    value_problem,
)
from .taskspec import (
    DEFAULT_MAX_RETRIES,
    DEFAULT_STALL_TIMEOUT_MIN,
    DEFAULT_TIMEOUT_MIN,
    DEFAULT_VERIFY_TIMEOUT_S,
    TaskSpec,
    VerifySpec,
)
from .textutil import safe_name, safe_text
from .tomlfile import (  # noqa: F401  (display_path, LineMap, map_lines: importable from here as before)
    KeyLines,
    LineMap,
    TaskLines,
    display_path,
    map_lines,
    parse_toml_file,
)

#: Top-level tables a tasks file may hold besides ``[[task]]``; their contents are
#: settings merged over ``config.toml`` (checked by the plugins that read them).
TOP_LEVEL_TABLES = ("agents", "brain")
#: Top-level keys that are defaults for every ``[[task]]`` of the file that does not
#: set its own (written before the first table, as TOML requires); plugins' ``[[task]]``
#: keys may be too (:meth:`KeyTable.default_keys`).
TOP_LEVEL_DEFAULTS = DEFAULT_TASK_KEYS


# ---------------------------------------------------------------------------------


class GraphNode:
    """A task's name and dependencies, kept even when the task has other errors, so
    duplicate, dangling and cyclic names are reported in the same run.

    Its lines are read from ``lines`` (the task's :class:`~fleetrun.tomlfile.KeyLines`)
    only when an error names them; without it, ``name_line`` and ``deps_line`` are as given.
    """

    __slots__ = ("name", "depends_on", "file", "_name_line", "_deps_line", "_lines")

    def __init__(
        self,
        name: str,
        depends_on: list[str],
        file: str,
        name_line: int = 0,
        deps_line: int = 0,
        lines: Optional[KeyLines] = None,
    ) -> None:
        self.name = name
        self.depends_on = depends_on
        self.file = file
        self._name_line = name_line
        self._deps_line = deps_line
        self._lines = lines

    @property
    def name_line(self) -> int:
        return self._lines.get("name", self._lines.head) if self._lines is not None else self._name_line

    @property
    def deps_line(self) -> int:
        return self._lines.get("depends_on", self._lines.head) if self._lines is not None else self._deps_line

    def __repr__(self) -> str:
        return f"GraphNode({self.name!r}, {self.depends_on!r}, {self.file!r}, {self.name_line}, {self.deps_line})"


@dataclass
class TaskFile:
    """What a collector made of one file.

    :ivar digest: a hash of what the file's tasks were made from, by which the queue of
        an unchanged file is found again (:func:`fleetrun.queueing.queue_digest`); the
        TOML collector's is :func:`file_digest`'s. Empty: the queue's digest hashes the
        collected specs instead (a plugin's collector need not set it).
    """

    path: str
    tasks: list[TaskSpec]
    settings: dict[str, Any] = field(default_factory=dict)
    text: str = ""
    graph: list[GraphNode] = field(default_factory=list)
    digest: str = ""


def collect_toml(path: Path, keys: KeyTable, display: str, defaults: Optional[dict[str, Any]] = None) -> TaskFile:
    """Parse and validate one TOML tasks file; raise :class:`UsageErrors` with every problem.

    :param defaults: the project file's task defaults (:func:`collect_defaults`), under
        the file's own top-level defaults, which are under each task's own keys.
    """
    data, text = parse_toml_file(path, display)
    errs = KeyErrors(display)
    base = path.parent

    raw_tasks = data.get("task", [])
    tasks_ok = isinstance(raw_tasks, list) and all(isinstance(t, dict) for t in raw_tasks)
    # the lines of keys are found when an error asks (TaskLines): a valid task reads none
    lines = TaskLines(text, len(raw_tasks) if tasks_ok else 0)

    default_keys = keys.default_keys()
    tables = ("task", *TOP_LEVEL_TABLES)
    known_top = (*tables, *default_keys)
    own = TaskDefaults()
    for top, value in data.items():
        if top == "task":
            continue
        line = lines.top(top)
        # a table where a default takes none and a table's name is close: `[agent.codex]`
        # is a misspelt `[agents.codex]`, not a wrong `agent = "..."`
        misspelt_table = (
            isinstance(value, dict)
            and top in default_keys
            and dict not in default_keys[top].types
            and suggest(top, TOP_LEVEL_TABLES)
        )
        if top in TOP_LEVEL_TABLES:
            if not isinstance(value, dict):
                errs.add(line, top, "must be a table")
        elif top in default_keys and not misspelt_table:
            take_default(top, value, default_keys[top], (str(path), line), top, errs, own)
        elif top in NOT_DEFAULT_KEYS:
            errs.add(line, top, not_a_default(top))
        else:
            errs.add(
                line, top, f"unknown key{suggest(top, tables)}" if misspelt_table else unknown_default(top, known_top)
            )

    if not tasks_ok:
        errs.add(lines.top("task"), "task", "must be an array of tables, written [[task]]")
        raw_tasks = []

    merged = own.under(defaults)  # the file's own over the project file's, key by key
    digest = FileDigest(data, raw_tasks)  # before the loop drops each table

    specs: list[TaskSpec] = []
    graph: list[GraphNode] = []
    cwds: dict[Optional[str], tuple[str, Optional[str]]] = {}
    source = str(path)
    for i, raw in enumerate(raw_tasks):
        where = KeyLines(lines, i, tuple(k for k in raw if k != "verify"))
        spec = _collect_task(i, raw, keys, where, errs, base, merged, cwds)
        name = raw.get("name")
        if spec is not None:
            spec.source = source
            specs.append(spec)
            graph.append(GraphNode(name, spec.depends_on, display, lines=where))
        elif isinstance(name, str) and name:
            deps = raw.get("depends_on")
            deps = [d for d in deps if isinstance(d, str)] if isinstance(deps, list) else []
            graph.append(GraphNode(name, deps, display, lines=where))
        raw_tasks[i] = None  # the parsed table, once made a spec: 100,000 of them need not all live at once

    settings = {k: data[k] for k in TOP_LEVEL_TABLES if k in data}
    tf = TaskFile(path=str(path), tasks=specs, settings=settings, text=text, graph=graph)
    if errs.items:
        e = UsageErrors(errs.items)
        e.partial = tf  # type: ignore[attr-defined]
        raise e
    tf.digest = digest.hexdigest(cwds)
    return tf


#: The tables a digest encodes a JSON array at a time: one call of the C encoder for many
#: tables (a call a table cost more than the encoding).
DIGEST_CHUNK = 1000
_DIGEST_ENCODE = json.JSONEncoder(sort_keys=True, default=str, separators=(",", ":")).encode


def _table_name(table: Any) -> str:
    name = table.get("name") if isinstance(table, dict) else None
    return name if isinstance(name, str) else ""


class FileDigest:
    """The digest of a TOML tasks file as its tasks were made from it (version 2 of the
    queue's digest, :data:`fleetrun.queueing.DIGEST_VERSION`): the SHA-256 of the JSON
    (keys sorted, ``separators=(",", ":")``, ``default=str``) of the file's top-level
    keys but ``task`` (its defaults, ``[agents]``, ``[brain]``), then of its ``[[task]]``
    tables as ``tomllib`` parsed them, in name order, :data:`DIGEST_CHUNK` to a JSON
    array, then of the folders the tasks' ``cwd`` resolved to, as ``[[cwd, folder]...]``
    sorted by ``cwd`` (``null`` first: none given).

    What the tables say, not how: comments, blank lines, the order of the tasks and of
    a table's keys, quoting and layout do not count; a value does, each task's own and
    each default, and where a ``cwd`` leads (a symlink moved). The tables are encoded as
    parsed, before any default is spelled out: the old digest
    (:func:`fleetrun.rerun.files_digest`) encoded every field of every collected spec,
    52 MB of JSON for a 15 MB file of 100,000 tasks (0.8 s; this one, 0.13 s)."""

    def __init__(self, data: dict[str, Any], tables: list[Any]) -> None:
        import hashlib  # here: OpenSSL's start-up is ~5 ms, and most commands collect nothing

        self.hash = hashlib.sha256(_DIGEST_ENCODE({k: v for k, v in data.items() if k != "task"}).encode())
        ordered = sorted(tables, key=_table_name)  # a file's names are unique, or it is refused
        for k in range(0, len(ordered), DIGEST_CHUNK):
            self.hash.update(_DIGEST_ENCODE(ordered[k : k + DIGEST_CHUNK]).encode())

    def hexdigest(self, cwds: dict[Optional[str], tuple[str, Optional[str]]]) -> str:
        """The digest, given how each ``cwd`` of the file resolved (:func:`_resolve_cwd`'s cache)."""
        folders = sorted(([raw, cwd] for raw, (cwd, _problem) in cwds.items()), key=_cwd_order)
        self.hash.update(_DIGEST_ENCODE(folders).encode())
        return self.hash.hexdigest()


def _cwd_order(pair: list[Any]) -> tuple[bool, str]:
    return (pair[0] is not None, pair[0] or "")


def describe_defaults(spec: TaskSpec, invocation_dir: Optional[Path] = None) -> str:
    """The defaults ``spec`` took, each with where it was written, for ``validate -v``:
    ``model = "opus" (pyproject.toml:9), max_retries = 1 (tasks.toml:1)``, or
    ``no defaults``. Built-in keys in :data:`DEFAULT_TASK_KEYS` order, then plugins'."""
    order = [k for k in DEFAULT_TASK_KEYS if k in spec.defaulted]
    order += [k for k in spec.defaulted if k not in order]
    parts = []
    for key in order:
        if key == "setup":
            value: Any = [s.text for s in spec.setup]
        elif key in spec.extra:
            value = spec.extra[key]
        else:
            value = getattr(spec, key, None)
        where = display_path(Path(spec.defaulted[key]), invocation_dir)
        shown = json.dumps(value, ensure_ascii=False, default=str)
        parts.append(f"{key} = {shown} ({where}:{spec.key_lines.get(key, 0)})")
    return safe_text(", ".join(parts)) if parts else "no defaults"


#: The built-in declaration of each ``[[task]]`` / ``[[task.verify]]`` key, by name: a
#: value a built-in declaration took goes to the spec's field, a plugin's to ``extra``.
_BUILTIN_TASK = {d.key: d for d in BUILTIN_TASK_KEYS}
_BUILTIN_VERIFY = {d.key: d for d in BUILTIN_VERIFY_KEYS}
_SCALARS = (str, int, float, bool)


def _own(value: Any) -> Any:
    """A default's value for one task: its own lists and tables (a plugin may change one
    task's), its strings and numbers shared (they cannot change). TOML values only:
    what :func:`copy.deepcopy` made of them, without its memo and dispatch per object."""
    if isinstance(value, list):
        return [_own(v) for v in value]
    if isinstance(value, dict):
        return {k: _own(v) for k, v in value.items()}
    return value if isinstance(value, _SCALARS) else copy.deepcopy(value)


def tasks_warning(
    first: TaskSpec, count: int, key: str, what: str, invocation_dir: Optional[Path] = None, line: Optional[int] = None
) -> str:
    """One warning for ``count`` tasks that share a cause (the agent their ``key`` names
    is not installed here, a verifier's command is not found): at ``first``'s file and
    ``line`` (default: where ``key`` was written), naming it and how many more. A line
    a task would flood a file of 100,000 tasks with 100,000 warnings of one fact."""
    where = display_path(Path(first.file_of(key)), invocation_dir) if first.source else "?"
    if line is None:
        line = first.key_lines.get(key, first.line)
    more = count - 1
    who = f"task '{safe_name(first.name)}'" + (f" and {more} more task{'s' if more != 1 else ''}" if more else "")
    return f"{where}:{line}: {who}: {key}: {what}"


def _collect_task(
    i: int,
    raw: dict[str, Any],
    keys: KeyTable,
    where: KeyLines,
    errs: KeyErrors,
    base: Path,
    defaults: Optional[TaskDefaults] = None,
    cwds: Optional[dict[Optional[str], tuple[str, Optional[str]]]] = None,
) -> Optional[TaskSpec]:
    head = where.head
    name = raw.get("name")
    who = f"task '{safe_name(name)}'" if isinstance(name, str) and name else f"task #{i + 1}"
    n_before = len(errs.items)

    for required in ("name", "prompt"):
        if required not in raw:
            errs.add(head, f"{who}: {required}", "missing (every [[task]] needs name and prompt)")

    good: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    task_keys = keys.task
    for key, value in raw.items():
        if key == "verify":
            continue
        decl = task_keys.get(key)
        if decl is None:
            # a table's header ([task.misc], [[task.verifiy]]); an inline one is at its key
            line = where.table(key) or where.at(key)
            errs.add(line, f"{who}: {key}", f"unknown key{suggest(key, [*keys.task, 'verify'])}")
            continue
        problem = value_problem(decl, value)
        if problem is not None:
            errs.add(where.at(key), f"{who}: {key}", problem)
        elif _BUILTIN_TASK.get(key) is decl:
            good[key] = value
        else:
            extra[key] = value

    # defaults: for each key the task does not set itself (a list of its own replaces
    # the default's whole: no merging, as `setup` always did)
    defaults = defaults if defaults is not None else TaskDefaults()
    defaulted: dict[str, str] = {}
    default_lines: dict[str, int] = {}
    for key, value in defaults.items():
        if key in raw:
            continue
        defaulted[key], default_lines[key] = defaults.where.get(key, ("", head))
        if key == "setup":
            continue  # below
        decl = task_keys.get(key)
        if decl is not None and _BUILTIN_TASK.get(key) is decl:
            good[key] = _own(value)  # each task its own lists
        else:
            extra[key] = _own(value)
    where.took_defaults(default_lines)

    # cwd: relative to the tasks file, and it must exist.
    cwd_raw = good.get("cwd")
    cwd, problem = _resolve_cwd(base, cwd_raw, cwds if cwds is not None else {})
    if problem:
        errs.add(where.at("cwd"), f"{who}: cwd", problem)

    for p in good.get("paths", []):
        if os.path.isabs(p) or p.startswith("~"):
            errs.add(where.at("paths"), f"{who}: paths", f"{p!r} is absolute; paths are relative to cwd")
        elif os.path.normpath(p).split(os.sep)[0] == "..":
            errs.add(where.at("paths"), f"{who}: paths", f"{p!r} escapes cwd")
        else:
            # the text can be inside cwd while a symlink on the way leads out of it
            # (`root -> /` makes `root/etc/shadow` /etc/shadow): judge where it resolves
            try:
                real_cwd = os.path.realpath(cwd)
                real = os.path.realpath(os.path.join(real_cwd, p))
            except (OSError, ValueError) as e:
                errs.add(where.at("paths"), f"{who}: paths", f"{p!r} is not a usable path ({e})")
                continue
            if real != real_cwd and not real.startswith(real_cwd.rstrip(os.sep) + os.sep):
                errs.add(where.at("paths"), f"{who}: paths", f"{p!r} resolves to {real}, outside cwd")

    deps = good.get("depends_on", [])
    if deps:
        if isinstance(name, str) and name in deps:
            errs.add(where.at("depends_on"), f"{who}: depends_on", f"the task depends on itself ('{name}')")
        if len(set(deps)) != len(deps):
            errs.add(where.at("depends_on"), f"{who}: depends_on", "names a task twice")

    if "base" in good or "on_conflict" in good:
        _check_base(raw, good, deps, where.at, who, errs)

    setup = list(defaults.get("setup", []))
    if "setup" in good:  # the task's own list replaces the file's (`setup = []`: none)
        setup = collect_setup(good["setup"], where.at("setup"), f"{who}: setup", errs) or []

    verifies: list[VerifySpec] = []
    raw_verify = raw.get("verify", [])
    if not isinstance(raw_verify, list) or not all(isinstance(v, dict) for v in raw_verify):
        errs.add(
            where.table("verify") or where.at("verify"),
            f"{who}: verify",
            "must be an array of tables, written [[task.verify]]",
        )
        raw_verify = []
    named: dict[str, int] = {}
    for j, rv in enumerate(raw_verify):
        v = _collect_verify(j, rv, keys, where, errs, who)
        if v is not None:
            verifies.append(v)
            if v.name is not None and v.name in named:  # a name tells one verifier of the task from the others
                errs.add(
                    where.at("verify", j, "name"),
                    f"{who}: verify #{j + 1}: name",
                    f"{v.name!r} is the name of verify #{named[v.name]} too; a task's verifiers need names "
                    "of their own",
                )
            elif v.name is not None:
                named[v.name] = j + 1

    if len(errs.items) != n_before:
        return None
    return TaskSpec(
        name=good["name"],
        prompt=good["prompt"],
        cwd=cwd,
        line=head,
        git_ref=good.get("git_ref"),
        branch=good.get("branch"),
        depends_on=list(deps),
        max_retries=good.get("max_retries", DEFAULT_MAX_RETRIES),
        timeout_min=float(good.get("timeout_min", DEFAULT_TIMEOUT_MIN)),
        model=good.get("model"),
        permission_mode=good.get("permission_mode"),
        allowed_tools=good.get("allowed_tools"),
        budget_usd=float(good["budget_usd"]) if "budget_usd" in good else None,
        stall_timeout_min=float(good.get("stall_timeout_min", DEFAULT_STALL_TIMEOUT_MIN)),
        agent=good.get("agent", "claude"),
        role=good.get("role"),
        paths=list(good.get("paths", [])),
        requires=list(good.get("requires", [])),
        peer=good.get("peer"),
        verify=verifies,
        setup=setup,
        base=good.get("base", "git_ref"),
        on_conflict=good.get("on_conflict", "human"),
        tags=list(good.get("tags", [])),
        extra=extra,
        key_lines=where,
        defaulted=defaulted,
    )


def _resolve_cwd(
    base: Path, cwd_raw: Optional[str], cache: dict[Optional[str], tuple[str, Optional[str]]]
) -> tuple[str, Optional[str]]:
    """A task's ``cwd`` resolved against its file's folder, as a string, and why it is
    unusable (or None). ``cache``, one file's: a file of 100,000 tasks names a few
    folders, each resolved once (a ``realpath`` makes a system call for every component)
    and its string shared by their tasks."""
    hit = cache.get(cwd_raw)
    if hit is None:
        cwd, problem = _resolve_cwd_once(base, cwd_raw)
        hit = cache[cwd_raw] = (str(cwd), problem)
    return hit


def _resolve_cwd_once(base: Path, cwd_raw: Optional[str]) -> tuple[Path, Optional[str]]:
    if cwd_raw is None:
        return base.resolve(), None
    try:
        cwd = (base / cwd_raw).resolve()
        if not cwd.is_dir():
            return cwd, (
                f"{cwd_raw!r} does not exist (it is relative to the tasks file)"
                if not cwd.exists()
                else f"{cwd_raw!r} is not a directory"
            )
        return cwd, None
    except (OSError, ValueError, RuntimeError) as e:
        return base, f"{cwd_raw!r} is not a usable path ({getattr(e, 'strerror', None) or e})"


def _check_base(
    raw: dict[str, Any], good: dict[str, Any], deps: list[str], line_of: Callable[[str], int], who: str, errs: KeyErrors
) -> None:
    """``base = "dependencies"`` and ``on_conflict`` where they can apply. Written in the
    task, each is an error where it cannot; a default of every task is left as it is on
    a task without dependencies (there is nothing to merge), but not on one without
    ``git_ref``."""
    merges = good.get("base") == "dependencies"
    if merges and not deps:
        if "base" in raw:
            errs.add(
                line_of("base"),
                f"{who}: base",
                '"dependencies" needs depends_on: a task without dependencies has nothing to merge',
            )
        merges = False
    if merges and not good.get("git_ref"):
        line = line_of("base") if "base" in raw else line_of("depends_on")
        errs.add(
            line, f"{who}: base", '"dependencies" needs git_ref: the branches are merged into the task\'s worktree'
        )
    base_bad = "base" in raw and "base" not in good  # already reported
    if "on_conflict" in good and "on_conflict" in raw and good.get("base") != "dependencies" and not base_bad:
        errs.add(line_of("on_conflict"), f"{who}: on_conflict", 'applies only with base = "dependencies"')


def _collect_verify(
    j: int, rv: dict[str, Any], keys: KeyTable, where: KeyLines, errs: KeyErrors, who: str
) -> Optional[VerifySpec]:
    vline = where.verify(j)
    label = f"{who}: verify #{j + 1}"
    n_before = len(errs.items)
    verify_kinds = keys.verify_kinds
    kinds = [k for k in rv if k in verify_kinds]
    missing = [k for k in rv if k in keys.missing_kinds] if keys.missing_kinds else []
    for key in missing:  # a kind its plugin would declare: say that, not "unknown key"
        errs.add(
            where.at("verify", j, key),
            f"{label}: {key}",
            f"unknown verifier kind {key}: {keys.missing_kinds[key]}",
        )
    if len(kinds) != 1 and (kinds or not missing):  # a missing kind alone is said above, once
        names = " / ".join(verify_kinds)
        if not kinds:
            errs.add(vline, label, f"needs exactly one of {names}, found none")
        else:
            errs.add(vline, label, f"needs exactly one of {names}, found {len(kinds)}: {', '.join(kinds)}")
    good: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, value in rv.items():
        if key in missing:
            continue
        decl = verify_kinds.get(key) or keys.verify.get(key)
        if decl is None:
            errs.add(
                where.at("verify", j, key),
                f"{label}: {key}",
                f"unknown key{suggest(key, [*keys.verify_kinds, *keys.verify])}",
            )
            continue
        problem = value_problem(decl, value)
        if problem is not None:
            errs.add(where.at("verify", j, key), f"{label}: {key}", problem)
        elif key in verify_kinds or _BUILTIN_VERIFY.get(key) is decl:
            good[key] = value
        else:
            extra[key] = value
    if len(errs.items) != n_before or len(kinds) != 1:
        return None
    kind = kinds[0]
    return VerifySpec(
        kind=kind,
        text=good[kind],
        model=good.get("model"),
        budget_usd=float(good["budget_usd"]) if "budget_usd" in good else None,
        timeout_s=float(good.get("timeout_s", DEFAULT_VERIFY_TIMEOUT_S)),
        extra=extra,
        line=vline,
        name=good.get("name"),
    )


# ---------------------------------------------------------------------------------
# Checks across every collected file.


def check_graph(files: list[TaskFile], invocation_dir: Optional[Path] = None) -> list[UsageError]:
    """Duplicate names, dangling and cyclic ``depends_on`` across all collected files."""
    errors: list[UsageError] = []
    by_name: dict[str, GraphNode] = {}
    for f in files:
        for node in f.graph:
            if node.name in by_name:
                first = by_name[node.name]
                errors.append(
                    UsageError(
                        f"duplicate task name (first defined at {first.file}:{first.name_line})",
                        file=node.file,
                        line=node.name_line,
                        key=f"task '{safe_name(node.name)}': name",
                    )
                )
            else:
                by_name[node.name] = node

    for node in by_name.values():
        for dep in node.depends_on:
            if dep not in by_name:
                errors.append(
                    UsageError(
                        f"'{dep}' is not a task{suggest(dep, by_name)}",
                        file=node.file,
                        line=node.deps_line,
                        key=f"task '{node.name}': depends_on",
                    )
                )

    # cycles: iterative DFS in file order, each cycle reported once
    color: dict[str, int] = {}
    reported: set[frozenset[str]] = set()
    for start in by_name:
        if color.get(start):
            continue
        stack: list[tuple[str, int]] = [(start, 0)]
        path: list[str] = []
        while stack:
            name, k = stack.pop()
            if k == 0:
                color[name] = 1
                path.append(name)
            deps = [d for d in by_name[name].depends_on if d in by_name and d != name]
            if k < len(deps):
                stack.append((name, k + 1))
                nxt = deps[k]
                if color.get(nxt) == 1:
                    cyc = path[path.index(nxt) :] + [nxt]
                    key = frozenset(cyc)
                    if key not in reported:
                        reported.add(key)
                        node = by_name[cyc[0]]
                        errors.append(
                            UsageError(
                                f"dependency cycle: {' -> '.join(cyc)}",
                                file=node.file,
                                line=node.deps_line,
                                key=f"task '{node.name}': depends_on",
                            )
                        )
                elif not color.get(nxt):
                    stack.append((nxt, 0))
            else:
                color[name] = 2
                path.pop()
    return errors

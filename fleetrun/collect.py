"""Collection: tasks files -> validated :class:`TaskSpec` items, with file:line errors.

The TOML collector here is the default ``fleetrun_collect_file``; it reports every
problem in a file at once, each as ``ERROR: file:LINE: task 'NAME': key: message``.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from .exceptions import UsageError, UsageErrors
from .gitutil import GitError, git, repo_toplevel
from .taskspec import (
    DEFAULT_MAX_RETRIES,
    DEFAULT_SETUP_TIMEOUT_S,
    DEFAULT_STALL_TIMEOUT_MIN,
    DEFAULT_TIMEOUT_MIN,
    DEFAULT_VERIFY_TIMEOUT_S,
    PERMISSION_MODES,
    KeyDecl,
    TaskSpec,
    VerifySpec,
    ref_problem,
)
from .textutil import safe_name
from .tomlfile import LineMap, map_lines, parse_toml_file

NUM = (int, float)


def _nonneg(v: Any) -> Optional[str]:
    return None if v >= 0 else "must not be negative"  # nan fails too


def _positive(v: Any) -> Optional[str]:
    return None if v > 0 else "must be greater than 0"


def _str_list(v: Any) -> Optional[str]:
    if not all(isinstance(x, str) for x in v):
        return "must be a list of strings"
    return None


def _nonempty(v: Any) -> Optional[str]:
    return "must not be empty" if not v.strip() else None


def _name_check(v: str) -> Optional[str]:
    if not v.strip():
        return "must not be empty"
    if v.startswith("-"):
        return f"{v!r} starts with '-'"
    # C1 too: U+009B is CSI on some terminals, as good as ESC [
    if any(ord(c) < 32 or 127 <= ord(c) <= 159 for c in v):
        return "must not contain control characters"
    if len(v) > 100:
        return "is longer than 100 characters"
    return None


def _perm_check(v: str) -> Optional[str]:
    if v not in PERMISSION_MODES:
        return f"{v!r} is not one of {', '.join(PERMISSION_MODES)}"
    return None


def _ref_check(v: str) -> Optional[str]:
    return ref_problem(v)


#: The keys of a ``[[task]]`` table that fleetrun itself knows.
BUILTIN_TASK_KEYS: tuple[KeyDecl, ...] = (
    KeyDecl("name", (str,), doc="unique name of the task", check=_name_check),
    KeyDecl("prompt", (str,), doc="what the agent is asked to do", check=_nonempty),
    KeyDecl("cwd", (str,), doc="working directory, relative to the tasks file"),
    KeyDecl("git_ref", (str,), doc="run in a new worktree made from this ref", check=_ref_check),
    KeyDecl("branch", (str,), doc="branch name for the worktree", check=_ref_check),
    KeyDecl("depends_on", (list,), doc="names of tasks that must be DONE first", check=_str_list),
    KeyDecl("max_retries", (int,), doc="retries after a failed verifier", check=_nonneg),
    KeyDecl("timeout_min", NUM, doc="minutes an attempt may run", check=_positive),
    KeyDecl("model", (str,), doc="agent model"),
    KeyDecl("permission_mode", (str,), doc="Claude Code permission mode", check=_perm_check),
    KeyDecl("allowed_tools", (list,), doc="Claude Code allow rules", check=_str_list),
    KeyDecl("budget_usd", NUM, doc="cap on the task's total cost", check=_nonneg),
    KeyDecl("stall_timeout_min", NUM, doc="minutes without output", check=_positive),
    KeyDecl("agent", (str,), doc="agent backend name", check=_nonempty),
    KeyDecl("role", (str,), doc="mailbox role", check=_nonempty),
    KeyDecl("paths", (list,), doc="what the task is about, relative to cwd", check=_str_list),
    KeyDecl("requires", (list,), doc="tags or tools the machine must have", check=_str_list),
    KeyDecl("peer", (str,), doc="pin to this machine", check=_nonempty),
    KeyDecl("setup", (list,), doc="commands run in the workspace before the agent's first attempt"),
)

BUILTIN_VERIFY_KINDS: tuple[KeyDecl, ...] = (
    KeyDecl("run", (str,), where="verify_kind", doc="shell command; exit code is the verdict", check=_nonempty),
    KeyDecl("brain", (str,), where="verify_kind", doc="question for the local model", check=_nonempty),
    KeyDecl("agent", (str,), where="verify_kind", doc="prompt for a read-only reviewer", check=_nonempty),
)

BUILTIN_VERIFY_KEYS: tuple[KeyDecl, ...] = (
    KeyDecl("model", (str,), where="verify", doc="model for brain/agent verifiers"),
    KeyDecl("budget_usd", NUM, where="verify", doc="cost cap of an agent verifier", check=_nonneg),
    KeyDecl("timeout_s", NUM, where="verify", doc="seconds before the verifier fails", check=_positive),
)

#: Top-level tables a tasks file may hold besides ``[[task]]``; their contents are
#: settings merged over ``config.toml`` (checked by the plugins that read them).
TOP_LEVEL_TABLES = ("agents", "brain")
#: Top-level keys that are defaults for every ``[[task]]`` of the file that does not
#: set its own (written before the first table, as TOML requires).
TOP_LEVEL_DEFAULTS = ("setup",)
SETUP_STEP_KEYS = ("run", "timeout_s")

_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", list: "a list", bool: "true or false", dict: "a table"}


def _type_name(types: tuple[type, ...]) -> str:
    if types == NUM:
        return "a number"
    return " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in types)


def _type_ok(value: Any, types: tuple[type, ...]) -> bool:
    if isinstance(value, bool) and bool not in types:
        return False
    return isinstance(value, types)


# ---------------------------------------------------------------------------------


@dataclass
class GraphNode:
    """A task's name and dependencies, kept even when the task has other errors, so
    duplicate, dangling and cyclic names are reported in the same run."""

    name: str
    depends_on: list[str]
    file: str
    name_line: int
    deps_line: int


@dataclass
class TaskFile:
    """What a collector made of one file."""

    path: str
    tasks: list[TaskSpec]
    settings: dict[str, Any] = field(default_factory=dict)
    text: str = ""
    graph: list[GraphNode] = field(default_factory=list)


@dataclass
class KeyTable:
    task: dict[str, KeyDecl]
    verify: dict[str, KeyDecl]
    verify_kinds: dict[str, KeyDecl]

    @classmethod
    def build(cls, extra: Iterable[Iterable[KeyDecl]] = ()) -> KeyTable:
        table = cls(
            task={k.key: k for k in BUILTIN_TASK_KEYS},
            verify={k.key: k for k in BUILTIN_VERIFY_KEYS},
            verify_kinds={k.key: k for k in BUILTIN_VERIFY_KINDS},
        )
        for decls in extra:
            for d in decls or ():
                target = {"task": table.task, "verify": table.verify, "verify_kind": table.verify_kinds}.get(d.where)
                if target is None:
                    raise ValueError(f"KeyDecl {d.key!r}: where must be task, verify or verify_kind")
                target.setdefault(d.key, d)
        return table


def _suggest(key: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


class _Errors:
    def __init__(self, display: str) -> None:
        self.display = display
        self.items: list[UsageError] = []

    def add(self, line: int, key: Optional[str], message: str) -> None:
        self.items.append(UsageError(message, file=self.display, line=line, key=key))


def display_path(path: Path, invocation_dir: Optional[Path] = None) -> str:
    base = invocation_dir or Path.cwd()
    try:
        return os.path.relpath(path, base) if not os.path.relpath(path, base).startswith("..") else str(path)
    except ValueError:  # another drive on Windows
        return str(path)


def collect_toml(path: Path, keys: KeyTable, display: str) -> TaskFile:
    """Parse and validate one TOML tasks file; raise :class:`UsageErrors` with every problem."""
    data, text = parse_toml_file(path, display)
    lines = map_lines(text)
    errs = _Errors(display)
    base = path.parent

    known_top = ("task", *TOP_LEVEL_TABLES, *TOP_LEVEL_DEFAULTS)
    for top in data:
        if top not in known_top:
            errs.add(lines.get("top", top), top, f"unknown key{_suggest(top, known_top)}")
        elif top in TOP_LEVEL_TABLES and not isinstance(data[top], dict):
            errs.add(lines.get("top", top), top, "must be a table")

    raw_tasks = data.get("task", [])
    if not isinstance(raw_tasks, list) or not all(isinstance(t, dict) for t in raw_tasks):
        errs.add(lines.get("top", "task"), "task", "must be an array of tables, written [[task]]")
        raw_tasks = []

    default_setup: list[VerifySpec] = []
    if "setup" in data:
        default_setup = _collect_setup(data["setup"], lines.get("top", "setup"), "setup", errs) or []

    specs: list[TaskSpec] = []
    graph: list[GraphNode] = []
    for i, raw in enumerate(raw_tasks):
        spec = _collect_task(i, raw, keys, lines, errs, base, default_setup)
        if spec is not None:
            spec.source = str(path)
            specs.append(spec)
        name = raw.get("name")
        if isinstance(name, str) and name:
            deps = raw.get("depends_on")
            deps = [d for d in deps if isinstance(d, str)] if isinstance(deps, list) else []
            head = lines.get("task", i)
            graph.append(GraphNode(name, deps, display, lines.get("task", i, "name", default=head),
                                   lines.get("task", i, "depends_on", default=head)))

    settings = {k: data[k] for k in TOP_LEVEL_TABLES if k in data}
    tf = TaskFile(path=str(path), tasks=specs, settings=settings, text=text, graph=graph)
    if errs.items:
        e = UsageErrors(errs.items)
        e.partial = tf  # type: ignore[attr-defined]
        raise e
    return tf


def _check_value(
    decl: KeyDecl, value: Any, line: int, label: str, errs: _Errors
) -> bool:
    if not _type_ok(value, decl.types):
        errs.add(line, label, f"must be {_type_name(decl.types)}, not {_describe(value)}")
        return False
    if decl.check is not None:
        problem = decl.check(value)
        if problem:
            errs.add(line, label, problem)
            return False
    return True


def _describe(value: Any) -> str:
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (int, float)):
        return f"the number {value}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a table"
    return type(value).__name__


def _collect_setup(value: Any, line: int, label: str, errs: _Errors) -> Optional[list[VerifySpec]]:
    """A ``setup`` list: each command a string, or a table ``{run = "...", timeout_s = N}``
    (the keys of a ``run`` verifier). :return: the steps, or None after an error."""
    if not isinstance(value, list):
        errs.add(line, label, f"must be a list of commands, not {_describe(value)}")
        return None
    n_before = len(errs.items)
    steps: list[VerifySpec] = []
    for k, item in enumerate(value, 1):
        where = f"{label} #{k}"
        timeout: Any = DEFAULT_SETUP_TIMEOUT_S
        if isinstance(item, dict):
            for key in item:
                if key not in SETUP_STEP_KEYS:
                    errs.add(line, f"{where}: {key}", f"unknown key{_suggest(key, SETUP_STEP_KEYS)}")
            if "run" not in item:
                errs.add(line, where, "needs run = \"command\"")
                continue
            if "timeout_s" in item:
                timeout = item["timeout_s"]
                if not _type_ok(timeout, NUM):
                    errs.add(line, f"{where}: timeout_s", f"must be a number, not {_describe(timeout)}")
                    continue
                if not timeout > 0:
                    errs.add(line, f"{where}: timeout_s", "must be greater than 0")
                    continue
            item = item["run"]
            where = f"{where}: run"
        if not isinstance(item, str):
            errs.add(line, where, f"must be a command string or a table {{run = ..., timeout_s = ...}}, "
                                  f"not {_describe(item)}")
            continue
        if not item.strip():
            errs.add(line, where, "must not be empty")
            continue
        steps.append(VerifySpec(kind="run", text=item, timeout_s=float(timeout), extra={"setup": k}, line=line))
    return steps if len(errs.items) == n_before else None


def _collect_task(
    i: int, raw: dict[str, Any], keys: KeyTable, lines: LineMap, errs: _Errors, base: Path,
    default_setup: Optional[list[VerifySpec]] = None,
) -> Optional[TaskSpec]:
    head = lines.get("task", i)
    name = raw.get("name")
    who = f"task '{safe_name(name)}'" if isinstance(name, str) and name else f"task #{i + 1}"
    n_before = len(errs.items)

    for required in ("name", "prompt"):
        if required not in raw:
            errs.add(head, f"{who}: {required}", "missing (every [[task]] needs name and prompt)")

    good: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, value in raw.items():
        line = lines.get("task", i, key, default=head)
        if key == "verify":
            continue
        decl = keys.task.get(key)
        if decl is None:
            if isinstance(value, dict):
                line = lines.get("task", i, "table", key, default=line)
            errs.add(line, f"{who}: {key}", f"unknown key{_suggest(key, [*keys.task, 'verify'])}")
            continue
        if _check_value(decl, value, line, f"{who}: {key}", errs):
            if any(d is decl for d in BUILTIN_TASK_KEYS):
                good[key] = value
            else:
                extra[key] = value

    # cwd: relative to the tasks file, and it must exist.
    cwd = base
    if "cwd" in good:
        cwd_raw = good["cwd"]
        line = lines.get("task", i, "cwd", default=head)
        try:
            cwd = (base / cwd_raw).resolve()
            if not cwd.is_dir():
                errs.add(line, f"{who}: cwd",
                         f"{cwd_raw!r} does not exist (it is relative to the tasks file)" if not cwd.exists()
                         else f"{cwd_raw!r} is not a directory")
        except (OSError, ValueError, RuntimeError) as e:
            errs.add(line, f"{who}: cwd", f"{cwd_raw!r} is not a usable path ({getattr(e, 'strerror', None) or e})")
    else:
        cwd = base.resolve()

    for p in good.get("paths", []):
        line = lines.get("task", i, "paths", default=head)
        if os.path.isabs(p) or p.startswith("~"):
            errs.add(line, f"{who}: paths", f"{p!r} is absolute; paths are relative to cwd")
        elif os.path.normpath(p).split(os.sep)[0] == "..":
            errs.add(line, f"{who}: paths", f"{p!r} escapes cwd")
        else:
            # the text can be inside cwd while a symlink on the way leads out of it
            # (`root -> /` makes `root/etc/shadow` /etc/shadow): judge where it resolves
            try:
                real_cwd = os.path.realpath(cwd)
                real = os.path.realpath(os.path.join(real_cwd, p))
            except (OSError, ValueError) as e:
                errs.add(line, f"{who}: paths", f"{p!r} is not a usable path ({e})")
                continue
            if real != real_cwd and not real.startswith(real_cwd.rstrip(os.sep) + os.sep):
                errs.add(line, f"{who}: paths", f"{p!r} resolves to {real}, outside cwd")

    deps = good.get("depends_on", [])
    if isinstance(name, str) and name in deps:
        errs.add(lines.get("task", i, "depends_on", default=head), f"{who}: depends_on",
                 f"the task depends on itself ('{name}')")
    if len(set(deps)) != len(deps):
        errs.add(lines.get("task", i, "depends_on", default=head), f"{who}: depends_on", "names a task twice")

    setup = list(default_setup or [])
    if "setup" in good:  # the task's own list replaces the file's (`setup = []`: none)
        setup = _collect_setup(good["setup"], lines.get("task", i, "setup", default=head), f"{who}: setup",
                               errs) or []

    verifies: list[VerifySpec] = []
    raw_verify = raw.get("verify", [])
    if not isinstance(raw_verify, list) or not all(isinstance(v, dict) for v in raw_verify):
        errs.add(lines.get("task", i, "verify", default=head), f"{who}: verify",
                 "must be an array of tables, written [[task.verify]]")
        raw_verify = []
    for j, rv in enumerate(raw_verify):
        v = _collect_verify(i, j, rv, keys, lines, errs, who, head)
        if v is not None:
            verifies.append(v)

    if len(errs.items) != n_before:
        return None
    return TaskSpec(
        name=good["name"],
        prompt=good["prompt"],
        cwd=str(cwd),
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
        extra=extra,
        key_lines={k: lines.get("task", i, k, default=head) for k in raw if k != "verify"},
    )


def _collect_verify(
    i: int, j: int, rv: dict[str, Any], keys: KeyTable, lines: LineMap, errs: _Errors, who: str, head: int
) -> Optional[VerifySpec]:
    vline = lines.get("task", i, "verify", j, default=head)
    label = f"{who}: verify #{j + 1}"
    n_before = len(errs.items)
    kinds = [k for k in rv if k in keys.verify_kinds]
    if len(kinds) != 1:
        names = " / ".join(keys.verify_kinds)
        if not kinds:
            errs.add(vline, label, f"needs exactly one of {names}, found none")
        else:
            errs.add(vline, label, f"needs exactly one of {names}, found {len(kinds)}: {', '.join(kinds)}")
    good: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, value in rv.items():
        line = lines.get("task", i, "verify", j, key, default=vline)
        decl = keys.verify_kinds.get(key) or keys.verify.get(key)
        if decl is None:
            errs.add(line, f"{label}: {key}", f"unknown key{_suggest(key, [*keys.verify_kinds, *keys.verify])}")
            continue
        if _check_value(decl, value, line, f"{label}: {key}", errs):
            if key in keys.verify_kinds or any(d is decl for d in BUILTIN_VERIFY_KEYS):
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
                errors.append(UsageError(f"duplicate task name (first defined at {first.file}:{first.name_line})",
                                         file=node.file, line=node.name_line,
                                         key=f"task '{safe_name(node.name)}': name"))
            else:
                by_name[node.name] = node

    for node in by_name.values():
        for dep in node.depends_on:
            if dep not in by_name:
                errors.append(UsageError(f"'{dep}' is not a task{_suggest(dep, by_name)}",
                                         file=node.file, line=node.deps_line, key=f"task '{node.name}': depends_on"))

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
                    cyc = path[path.index(nxt):] + [nxt]
                    key = frozenset(cyc)
                    if key not in reported:
                        reported.add(key)
                        node = by_name[cyc[0]]
                        errors.append(UsageError(f"dependency cycle: {' -> '.join(cyc)}", file=node.file,
                                                 line=node.deps_line, key=f"task '{node.name}': depends_on"))
                elif not color.get(nxt):
                    stack.append((nxt, 0))
            else:
                color[name] = 2
                path.pop()
    return errors


# ---------------------------------------------------------------------------------
# Branches: fleetrun works only on branches it creates.

#: ``owner(task name, branch, repository) -> id of the task fleetrun created that
#: branch for``, or None (the ledger answers it).
BranchOwner = Callable[[str, str, str], Optional[str]]


@dataclass
class BranchReuse:
    """A task names a branch fleetrun created for an earlier task of the same name."""

    task_name: str
    branch: str
    owner_id: str

    @property
    def note(self) -> str:
        return f"reusing branch {self.branch} that fleetrun created for task {self.task_name} ({self.owner_id})"


def _branch_exists(repo: str, branch: str) -> bool:
    try:
        git(repo, "rev-parse", "--verify", "--quiet", "--end-of-options", f"refs/heads/{branch}")
        return True
    except GitError:
        return False


#: ``cwd -> (top level, real common git folder)`` of its repository, or None: shared by
#: :func:`check_branches` and :func:`check_refs` for one collection.
RepoCache = dict[str, Optional[tuple[str, str]]]


def check_branches(
    files: list[TaskFile], owner: Optional[BranchOwner] = None, invocation_dir: Optional[Path] = None,
    repos: Optional[RepoCache] = None,
) -> tuple[list[UsageError], list[BranchReuse]]:
    """Every ``branch =`` across all collected files: one task per branch of a
    repository, and no branch that already exists there unless the ledger shows
    fleetrun created it for a task of the same name (then it is reused, and said so).

    ``branch = "main"`` would otherwise commit the agent's work straight onto the
    user's main, and two tasks naming one branch would stack their commits on it.
    """
    errors: list[UsageError] = []
    reuse: list[BranchReuse] = []
    seen: dict[tuple[str, str], tuple[TaskSpec, str, int]] = {}
    repos = {} if repos is None else repos
    for f in files:
        display = display_path(Path(f.path), invocation_dir)
        for spec in f.tasks:
            if not spec.branch:
                continue
            line = spec.key_lines.get("branch", spec.line)
            key = f"task '{safe_name(spec.name)}': branch"
            found = _repo_of(spec.cwd, repos)
            if found is None:
                continue  # not in a repository: check_refs reports that if git_ref needs one
            top, common = found
            first = seen.get((common, spec.branch))
            if first is not None:
                other, other_file, other_line = first
                errors.append(UsageError(
                    f"branch '{safe_name(spec.branch)}' is also named by task '{safe_name(other.name)}' "
                    f"({other_file}:{other_line}); each task needs a branch of its own",
                    file=display, line=line, key=key))
                continue
            seen[(common, spec.branch)] = (spec, display, line)
            if not _branch_exists(top, spec.branch):
                continue
            owner_id = owner(spec.name, spec.branch, top) if owner is not None else None
            if owner_id is not None:
                reuse.append(BranchReuse(spec.name, spec.branch, owner_id))
                continue
            errors.append(UsageError(
                f"branch '{safe_name(spec.branch)}' already exists in {top}; fleetrun only works on branches "
                "it creates (leave branch out, or name a new one)", file=display, line=line, key=key))
    return errors, reuse


# ---------------------------------------------------------------------------------
# Refs: a git_ref that names nothing, or a cwd in no repository, can never start.


def _repo_of(cwd: str, cache: RepoCache) -> Optional[tuple[str, str]]:
    """(top level, real common git folder) of the repository holding ``cwd``, or None."""
    if cwd not in cache:
        top = repo_toplevel(cwd)
        try:
            common = git(top, "rev-parse", "--git-common-dir").strip() if top else ""
        except GitError:
            common = ""
        cache[cwd] = (top, os.path.realpath(os.path.join(top, common))) if top and common else None
    return cache[cwd]


def check_refs(files: list[TaskFile], invocation_dir: Optional[Path] = None,
               repos: Optional[RepoCache] = None) -> list[UsageError]:
    """Every ``git_ref =``: the task's ``cwd`` is in a git repository and the ref
    names a commit there (a branch, a tag or a commit id). One git call per distinct
    (repository, ref).

    Either mistake would otherwise only show when the attempt starts, as a failed
    workspace, after the whole queue was collected and the run begun.
    """
    errors: list[UsageError] = []
    repos = {} if repos is None else repos
    resolved: dict[tuple[str, str], bool] = {}
    for f in files:
        display = display_path(Path(f.path), invocation_dir)
        for spec in f.tasks:
            if not spec.git_ref:
                continue
            line = spec.key_lines.get("git_ref", spec.line)
            key = f"task '{safe_name(spec.name)}': git_ref"
            found = _repo_of(spec.cwd, repos)
            if found is None:
                errors.append(UsageError(f"{spec.cwd} is not in a git repository", file=display, line=line, key=key))
                continue
            top, common = found
            if (common, spec.git_ref) not in resolved:
                try:
                    git(top, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{spec.git_ref}^{{commit}}")
                    resolved[(common, spec.git_ref)] = True
                except GitError:
                    resolved[(common, spec.git_ref)] = False
            if not resolved[(common, spec.git_ref)]:
                errors.append(UsageError(f"no branch, tag or commit '{safe_name(spec.git_ref)}' in {top}",
                                         file=display, line=line, key=key))
    return errors


def checkout_warnings(specs: Iterable[TaskSpec], invocation_dir: Optional[Path] = None) -> list[str]:
    """One warning per task without ``git_ref`` (a role aside) whose ``cwd`` is in a git
    checkout: its agent works in the user's checkout itself, on whatever branch is
    checked out there, and commits onto it."""
    out: list[str] = []
    tops: dict[str, Optional[str]] = {}
    for spec in specs:
        if spec.git_ref or spec.role:
            continue
        if spec.cwd not in tops:
            tops[spec.cwd] = repo_toplevel(spec.cwd)
        if tops[spec.cwd] is None:
            continue
        where = display_path(Path(spec.source), invocation_dir) if spec.source else "?"
        out.append(f"{where}:{spec.line}: task '{safe_name(spec.name)}': no git_ref: the agent works in your "
                   f"checkout {tops[spec.cwd]} itself")
    return out

"""The built-in ``collect`` plugin: the TOML collector and ``-k``/``-m`` selection."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

from . import collect as _collect
from .hookimpl import hookimpl
from .kwexpr import KeywordExpr

if TYPE_CHECKING:
    from .config import Config


@hookimpl(trylast=True)
def fleetrun_collect_file(file_path: str, config: Config, keys: Any) -> Optional[_collect.TaskFile]:
    path = Path(file_path)
    if path.suffix != ".toml":
        return None
    display = _collect.display_path(path, config.invocation_dir)
    project = getattr(config, "project", None)
    return _collect.collect_toml(path, keys, display, project.task_defaults(keys) if project is not None else None)


@hookimpl(trylast=True)
def fleetrun_collection_modifyitems(config: Config, items: list[Any]) -> None:
    keyword = config.getoption("keyword")
    markexpr = config.getoption("markexpr")
    if keyword or markexpr:
        _select(config, items, keyword, markexpr)
    if config.getoption("last_failed") or config.getoption("failed_first"):
        _last_failed(config, items)


def _select(config: Config, items: list[Any], keyword: Optional[str], markexpr: Optional[str]) -> None:
    from .queueing import DESELECTED_KEY, SELECTED_AS_DEPENDENCY_KEY

    by_k = KeywordExpr.compile(keyword) if keyword else None
    by_m = KeywordExpr.compile(markexpr, key="-m") if markexpr else None
    chosen, added = take_along(items, lambda t: (by_k is None or by_k(t.name)) and (by_m is None or by_m.tags(t.tags)))
    config.stash[DESELECTED_KEY] = [t.name for t in items if t.name not in chosen]
    config.stash[SELECTED_AS_DEPENDENCY_KEY] = added
    items[:] = [t for t in items if t.name in chosen]


def _last_failed(config: Config, items: list[Any]) -> None:
    """``--lf``: only the tasks that failed in the file's last run (and what they depend
    on), or all when none did (pytest's ``--lfnf=all``); ``--ff``: those first."""
    from .queueing import COLLECT_NOTES_KEY, DESELECTED_KEY, SELECTED_AS_DEPENDENCY_KEY
    from .rerun import last_failed

    notes = config.stash.setdefault(COLLECT_NOTES_KEY, [])
    failed = last_failed(config, [t.name for t in items])
    n = len(failed)
    if not failed:
        notes.append(
            "run-last-failure: no previously failed tasks, "
            + ("not deselecting any" if config.getoption("last_failed") else "running them in file order")
        )
        return
    if config.getoption("last_failed"):
        chosen, added = take_along(items, lambda t: t.name in failed)
        gone = [t.name for t in items if t.name not in chosen]
        config.stash[DESELECTED_KEY] = [*config.stash.get(DESELECTED_KEY, []), *gone]
        config.stash[SELECTED_AS_DEPENDENCY_KEY] = [*config.stash.get(SELECTED_AS_DEPENDENCY_KEY, []), *added]
        items[:] = [t for t in items if t.name in chosen]
        notes.append(f"run-last-failure: rerun previous {n} failure{'s' if n != 1 else ''}")
    else:
        notes.append(f"run-last-failure: {n} failure{'s' if n != 1 else ''} first")
    first = set(failed)
    items[:] = [t for t in items if t.name in first] + [t for t in items if t.name not in first]


def take_along(items: list[Any], match: Callable[[Any], bool]) -> tuple[set[str], list[str]]:
    """The names of the tasks ``match`` selects, with their dependencies (a selected task
    takes them along), and those it took along, in the order found.

    :param items: the collected tasks (each with ``name`` and ``depends_on``).
    """
    by_name = {t.name: t for t in items}
    chosen = {t.name for t in items if match(t)}
    added: list[str] = []
    todo = list(chosen)
    while todo:
        for dep in by_name[todo.pop()].depends_on:
            if dep not in chosen and dep in by_name:
                chosen.add(dep)
                added.append(dep)
                todo.append(dep)
    return chosen, added

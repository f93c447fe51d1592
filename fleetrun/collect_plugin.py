"""The built-in ``collect`` plugin: the TOML collector and ``-k`` selection."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

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
    from .queueing import DESELECTED_KEY, SELECTED_AS_DEPENDENCY_KEY  # not loaded for `--help`

    expr = config.getoption("keyword")
    if not expr:
        return
    match = KeywordExpr.compile(expr)
    by_name = {t.name: t for t in items}
    chosen = {t.name for t in items if match(t.name)}
    added: list[str] = []
    todo = list(chosen)
    while todo:  # a selected task takes its dependencies along
        for dep in by_name[todo.pop()].depends_on:
            if dep not in chosen and dep in by_name:
                chosen.add(dep)
                added.append(dep)
                todo.append(dep)
    config.stash[DESELECTED_KEY] = [t.name for t in items if t.name not in chosen]
    config.stash[SELECTED_AS_DEPENDENCY_KEY] = added
    items[:] = [t for t in items if t.name in chosen]

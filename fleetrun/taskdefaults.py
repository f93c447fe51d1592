"""Defaults of every task: the keys of :data:`~fleetrun.taskkeys.DEFAULT_TASK_KEYS` (and
plugins' ``[[task]]`` keys) written once, at a tasks file's top level or in the project
file's ``[task]`` (docs/tasks-toml.md, "Defaults of every task").

Each default is checked as the same key of a ``[[task]]`` is, once, at the line it was
written on; :class:`TaskDefaults` keeps the values with where each was written, and the
collector (:mod:`fleetrun.collect`) gives each task the ones it does not set itself.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Optional

from .exceptions import UsageErrors
from .taskkeys import NOT_DEFAULT_KEYS, KeyErrors, KeyTable, check_value, collect_setup, suggest
from .taskspec import KeyDecl


class TaskDefaults(dict[str, Any]):
    """Checked defaults of every task, by key, as :func:`~fleetrun.collect.collect_toml` takes them (the
    value as written; ``setup``: its steps).

    :ivar where: the file and line each default was written on.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.where: dict[str, tuple[str, int]] = {}

    def under(self, other: Optional[dict[str, Any]]) -> TaskDefaults:
        """These defaults over ``other`` (the layer below them), key by key."""
        merged = TaskDefaults(other or {})
        merged.where.update(getattr(other, "where", {}))
        merged.update(self)
        merged.where.update(self.where)
        return merged


def not_a_default(key: str) -> str:
    """The message for ``key`` of :data:`~fleetrun.taskkeys.NOT_DEFAULT_KEYS` written as a default."""
    return f"cannot be a default of every task ({NOT_DEFAULT_KEYS[key]}); write it in each [[task]]"


def unknown_default(key: str, default_keys: Iterable[str], otherwise: str = "") -> str:
    """The message for ``key``, no default of every task: the closest default, or else
    the closest key only a ``[[task]]`` takes (``dependancies`` is a slip of
    ``depends_on``, which no default is close to), or else ``otherwise``."""
    hint = suggest(key, default_keys)
    if hint:
        return f"unknown key{hint}"
    import difflib

    close = difflib.get_close_matches(key, list(NOT_DEFAULT_KEYS), n=1, cutoff=0.6)
    if close:
        return f"unknown key (did you mean '{close[0]}'? It {not_a_default(close[0])})"
    return f"unknown key{otherwise}"


def take_default(
    key: str, value: Any, decl: KeyDecl, where: tuple[str, int], label: str, errs: KeyErrors, out: TaskDefaults
) -> None:
    """Check one default as the same key of a ``[[task]]`` is checked; keep it if good."""
    line = where[1]
    if key == "setup":
        steps = collect_setup(value, line, label, errs)
        if steps is None:
            return
        out[key] = steps
    elif check_value(decl, value, line, label, errs):
        out[key] = value
    else:
        return
    out.where[key] = where


def collect_defaults(
    table: dict[str, Any],
    line_of: Callable[[str], int],
    display: str,
    label: str,
    keys: Optional[KeyTable] = None,
    path: str = "",
) -> TaskDefaults:
    """Task defaults from outside a tasks file (the project file's ``[task]``): the keys
    a tasks file takes at its top level as defaults (:meth:`KeyTable.default_keys`),
    with the same checks.

    :param line_of: the line a key was written on.
    :param label: what errors put before a key (``tool.fleetrun.task.``).
    :param keys: the run's key table (plugins' ``[[task]]`` keys may be defaults too).
    :param path: the file, as :attr:`TaskDefaults.where` keeps it (default: ``display``).
    :return: the checked values, by key, as :func:`~fleetrun.collect.collect_toml` takes them.
    :raises UsageError: every mistake at once (``UsageErrors`` for several); its
        ``partial`` holds the defaults that passed, so the tasks files are still checked.
    """
    errs = KeyErrors(display)
    default_keys = (keys or KeyTable.build()).default_keys()
    out = TaskDefaults()
    for key, value in table.items():
        line = line_of(key)
        if key in default_keys:
            take_default(key, value, default_keys[key], (path or display, line), f"{label}{key}", errs, out)
        elif key in NOT_DEFAULT_KEYS:
            errs.add(line, f"{label}{key}", not_a_default(key))
        else:
            errs.add(
                line,
                f"{label}{key}",
                unknown_default(key, default_keys, f" (a default of every task can be: {', '.join(default_keys)})"),
            )
    if errs.items:
        e = UsageErrors(errs.items) if len(errs.items) > 1 else errs.items[0]
        e.partial = out  # type: ignore[attr-defined]
        raise e
    return out

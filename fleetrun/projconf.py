"""Project configuration: ``[tool.fleetrun]`` in a repository's ``pyproject.toml``, or a
``fleetrun.toml`` holding the same content at its top level (docs/configuration.md).

Found as pytest finds its configfile: from the current folder up to the repository's
root (the folder holding ``.git``; the current folder alone outside a repository), the
first ``fleetrun.toml``, or ``pyproject.toml`` with a ``[tool.fleetrun]`` table, wins;
files are never merged. It holds ``addopts`` (put before the command line's own
arguments), ``[task]`` defaults for every task of every tasks file, and the tables
plugins declare through ``fleetrun_config_keys``, except the machine-level ones, which
stay in ``$FLEETRUN_HOME/config.toml``.

The file is the user's, trusted as a tasks file is; it is read from where fleetrun runs,
never from inside the fleetrun home (a task's worktree is the agent's to write).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Optional

from .config import ConfigKey, check_config
from .exceptions import UsageError, UsageErrors
from .tomlfile import LineMap, describe_value, map_lines, parse_toml_file

if TYPE_CHECKING:
    from .taskkeys import KeyTable

PROJECT_FILE = "fleetrun.toml"
PYPROJECT = "pyproject.toml"
#: More ``addopts`` from the environment, after the file's (as ``PYTEST_ADDOPTS``).
ENV_ADDOPTS = "FLEETRUN_ADDOPTS"
#: The project file's own keys; every other one is a plugin's table.
OWN_KEYS = ("addopts", "task")


def _inside(path: Path, folder: Path) -> bool:
    real, top = os.path.realpath(path), os.path.realpath(folder)
    return real == top or real.startswith(top.rstrip(os.sep) + os.sep)


def find_root(start: Path) -> Path:
    """The top level of the git repository holding ``start`` (the nearest folder with a
    ``.git`` folder or file, as a linked worktree has), or ``start`` outside one.

    A look for ``.git`` rather than ``git rev-parse``: every command reads the project
    file as it starts, and a git process would cost more than all the rest.
    """
    for d in (start, *start.parents):
        if (d / ".git").exists():
            return d
    return start


class _Lines:
    """The file's :class:`LineMap` seen from inside ``[tool.fleetrun]``, so the checks
    of ``config.toml`` find the lines of ``pyproject.toml`` too."""

    def __init__(self, lines: LineMap, prefix: str) -> None:
        self.lines = lines
        self.base = prefix.rstrip(".")

    def get(self, *where: Any, default: int = 1) -> int:
        if not self.base:
            return self.lines.get(*where, default=default)
        if where[0] == "top":  # [tool.fleetrun.X], or X = ... inside [tool.fleetrun]
            inline = self.lines.get("table", self.base, *where[1:], default=default)
            return self.lines.get("table", f"{self.base}.{where[1]}", default=inline)
        return self.lines.get("table", f"{self.base}.{where[1]}", *where[2:], default=default)


@dataclass
class ProjectConfig:
    """The project file of this run.

    :ivar path: the file.
    :ivar display: its name as errors show it (relative to where fleetrun runs).
    :ivar prefix: ``"tool.fleetrun."`` in ``pyproject.toml``, ``""`` in ``fleetrun.toml``:
        what errors put before a key.
    :ivar data: the fleetrun table's content.
    """

    path: Path
    display: str
    prefix: str
    data: dict[str, Any]
    lines: _Lines
    _defaults: Optional[dict[str, Any]] = field(default=None, repr=False)

    def error(self, key: str, message: str, line: Optional[int] = None) -> UsageError:
        where = line if line is not None else self.lines.get("top", key.split(".", 1)[0])
        return UsageError(message, file=self.display, line=where, key=self.prefix + key)

    def addopts(self) -> list[str]:
        """``addopts``: a string (split as a shell would) or a list of strings.

        :raises UsageError: any other value, or a string that cannot be split.
        """
        value = self.data.get("addopts", [])
        if isinstance(value, str):
            import shlex

            try:
                return shlex.split(value)
            except ValueError as e:
                raise self.error("addopts", f"cannot be split into words ({e})") from None
        if isinstance(value, list) and all(isinstance(w, str) for w in value):
            return list(value)
        raise self.error("addopts", f"must be a string or a list of strings, not {describe_value(value)}")

    def task_defaults(self, keys: Optional[KeyTable] = None) -> dict[str, Any]:
        """``[task]``: defaults of every task of every tasks file (checked once, then kept).

        :param keys: the run's key table, so plugins' ``[[task]]`` keys may be defaults;
            the first call of a run decides.
        :return: a :class:`~fleetrun.taskdefaults.TaskDefaults`.
        :raises UsageError: on the first call, every mistake of the table, with its line;
            later calls return the defaults that passed (each mistake is reported once,
            with the tasks files' own).
        """
        if self._defaults is None:
            table = self.data.get("task", {})
            self._defaults = {}
            if not isinstance(table, dict):
                raise self.error("task", "must be a table")
            from .taskdefaults import collect_defaults

            try:
                self._defaults = collect_defaults(
                    table,
                    lambda key: self.lines.get("table", "task", key),
                    self.display,
                    f"{self.prefix}task.",
                    keys,
                    str(self.path),
                )
            except UsageError as e:
                self._defaults = getattr(e, "partial", {})
                raise
        return self._defaults

    def defaults_digest(self) -> str:
        """A part of the queue digest: changed defaults make different tasks (the whole
        ``[task]`` table, every key of it; a tasks file's own defaults are in its bytes)."""
        if not self.data.get("task"):
            return ""
        import hashlib  # here: OpenSSL's start-up is ~5 ms, and most commands need no digest
        import json

        text = json.dumps(self.data["task"], sort_keys=True, default=str)
        return "|project=" + hashlib.sha256(text.encode()).hexdigest()

    def tables(self, decls: Iterable[ConfigKey], skip_unknown_tables: bool = False) -> dict[str, Any]:
        """The plugin tables, checked as ``config.toml`` is; machine-level ones are errors.

        :raises UsageError: every problem at once, each with its line and key.
        """
        tables = {k: v for k, v in self.data.items() if k not in OWN_KEYS}
        errors = check_config(tables, self.lines, decls, self.display, skip_unknown_tables, machine_ok=False)
        for e in errors:
            e.key = self.prefix + (e.key or "")
        if errors:
            raise UsageErrors(errors) if len(errors) > 1 else errors[0]
        return tables


def _read(path: Path, invocation_dir: Path) -> Optional[ProjectConfig]:
    from .tomlfile import display_path

    display = display_path(path, invocation_dir)
    if path.name == PYPROJECT:
        try:
            text = path.read_text(encoding="utf-8-sig", errors="replace")
        except OSError:
            return None
        if "fleetrun" not in text:  # not parsed at all: a project of no concern to fleetrun
            return None
    data, text = parse_toml_file(path, display)
    lines = map_lines(text)
    if path.name == PROJECT_FILE:
        return ProjectConfig(path, display, "", data, _Lines(lines, ""))
    tool = data.get("tool")
    if not isinstance(tool, dict) or "fleetrun" not in tool:
        return None
    if not isinstance(tool["fleetrun"], dict):
        raise UsageError("must be a table", file=display, line=lines.get("top", "tool"), key="tool.fleetrun")
    return ProjectConfig(path, display, "tool.fleetrun.", tool["fleetrun"], _Lines(lines, "tool.fleetrun."))


def load_project(start: Path, home: Optional[Path] = None) -> Optional[ProjectConfig]:
    """The project file for a run started in ``start``, or None.

    :param home: the fleetrun home: below it (a task's worktree) nothing is read.
    :raises UsageError: the file found is no TOML, or its fleetrun table no table.
    """
    if home is not None and _inside(start, home):
        return None
    root = find_root(start)
    for d in (start, *start.parents):
        for name in (PROJECT_FILE, PYPROJECT):
            if (d / name).is_file():
                found = _read(d / name, start)
                if found is not None:
                    return found
        if d == root:
            break
    return None


def env_addopts() -> list[str]:
    """``FLEETRUN_ADDOPTS``, split as a shell would.

    :raises UsageError: it cannot be split.
    """
    value = os.environ.get(ENV_ADDOPTS, "")
    if not value.strip():
        return []
    import shlex

    try:
        return shlex.split(value)
    except ValueError as e:
        raise UsageError(f"cannot be split into words ({e})", file=ENV_ADDOPTS) from None

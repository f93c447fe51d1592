"""Reading a TOML file the way every fleetrun file is read: strict UTF-8, errors with
their line, and a map of where each table and key was written (``tomllib`` gives no
line numbers).

Tasks files, ``config.toml``, ``policy.toml`` and ``peers.toml`` all go through here,
so a mistake in any of them is reported as ``ERROR: file:LINE: key: message``.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from array import array
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from .exceptions import UsageError


def display_path(path: Path, invocation_dir: Optional[Path] = None) -> str:
    """``path`` as an error message shows it: relative to ``invocation_dir`` (default the
    current folder) when it is below it, else absolute."""
    p, base = os.fspath(path), os.fspath(invocation_dir or Path.cwd())
    if not (os.path.isabs(p) and os.path.isabs(base)):  # relative to the current folder: not cached
        return _display.__wrapped__(p, base)
    return _display(p, base)


@functools.lru_cache(maxsize=1024)
def _display(path: str, base: str) -> str:
    # cached: collection names each task's file several times (100,000 tasks, one file),
    # and relpath makes both paths absolute and splits them each time
    try:
        rel = os.path.relpath(path, base)
    except ValueError:  # another drive on Windows
        return path
    return path if rel.startswith("..") else rel


def _tomllib() -> Any:
    """``tomllib`` (``tomli`` before 3.11), imported by the first file read: a command
    that reads none (``fleetrun --help`` outside a project) does not pay for it."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on older Pythons only
        import tomli as tomllib
    return tomllib


def __getattr__(name: str) -> Any:  # PEP 562: ``from fleetrun.tomlfile import tomllib`` still works
    if name == "tomllib":
        return _tomllib()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# Line numbers: tomllib gives none, so a light scan of the source maps each table
# and key to the line it was written on.

_HEADER_AOT = re.compile(r"^\s*\[\[\s*([A-Za-z0-9_.\-\"' ]+?)\s*\]\]")
_HEADER_TAB = re.compile(r"^\s*\[\s*([A-Za-z0-9_.\-\"' ]+?)\s*\]")
_KEY = re.compile(r"""^\s*("[^"]*"|'[^']*'|[A-Za-z0-9_\-]+)(\s*\.\s*("[^"]*"|'[^']*'|[A-Za-z0-9_\-]+))*\s*=""")


@dataclass
class LineMap:
    """Where things were written in a TOML file."""

    lines: dict[tuple[Any, ...], int] = field(default_factory=dict)

    def get(self, *where: Any, default: int = 1) -> int:
        """The line of the most specific location known, falling back outward."""
        for n in range(len(where), 0, -1):
            hit = self.lines.get(tuple(where[:n]))
            if hit:
                return hit
        return default


def map_lines(text: str, first_line: int = 1, first_task: int = 0) -> LineMap:
    """Where each table and key of the TOML ``text`` was written (a light scan, no parse).

    :param first_line: the line ``text`` starts on in its file.
    :param first_task: the index of the first ``[[task]]`` table in ``text`` (``text`` a
        part of a file starting at that table: :class:`TaskLines`).
    """
    m = LineMap()
    task = first_task - 1
    verify = -1
    ctx: tuple[Any, ...] = ("top",)
    in_ml: Optional[str] = None
    for lineno, line in enumerate(text.splitlines(), first_line):
        if in_ml:
            if in_ml in line:
                in_ml = None
            continue
        hit = _HEADER_AOT.match(line)
        if hit:
            name = hit.group(1).replace(" ", "")
            if name == "task":
                task += 1
                verify = -1
                ctx = ("task", task)
            elif name == "task.verify":
                verify += 1
                ctx = ("task", task, "verify", verify)
            elif name.startswith("task.") and task >= 0:  # [[task.verifiy]]: its errors at its header
                ctx = ("task", task, "table", name[5:])
            else:
                ctx = ("table", name)
            m.lines.setdefault(ctx, lineno)
            continue
        hit = _HEADER_TAB.match(line)
        if hit and not _KEY.match(line):
            name = hit.group(1).replace(" ", "")
            if name.startswith("task.") and task >= 0 and (name == "task.verify" or not name.startswith("task.verify")):
                ctx = ("task", task, "table", name[5:])
            else:
                ctx = ("table", name)
            top = name.split(".")[0]
            m.lines.setdefault(("top", top), lineno)
            m.lines.setdefault(ctx, lineno)
            continue
        hit = _KEY.match(line)
        if hit:
            key = hit.group(1).strip("\"'")
            m.lines.setdefault((*ctx, key), lineno)
            rest = line[hit.end() :]
            for quote in ('"""', "'''"):
                if rest.count(quote) % 2 == 1:
                    in_ml = quote
    return m


#: A ``[[...]]`` header anywhere in a text: ``_HEADER_AOT`` with ``re.M``, its blanks
#: kept within one line.
_AOT_IN_TEXT = re.compile(r"^[^\S\n]*\[\[[^\S\n]*([A-Za-z0-9_.\-\"' ]+?)[^\S\n]*\]\]", re.M)
#: What :func:`map_lines` reads differently from a search of the whole text: multi-line
#: strings (a header inside one is text) and the line breaks ``str.splitlines`` counts
#: besides ``\n`` (a lone ``\r``, ``\v``, ``\f``, U+001C-U+001E, U+0085, U+2028, U+2029).
_NOT_PLAIN = ('"""', "'''", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029")


class TaskLines:
    """Where a tasks file's ``[[task]]`` tables and their keys were written, found as
    they are asked for: :func:`map_lines` of a whole file is a dict entry per key (a
    100,000-task file: 800,000 of them, most never read), while only an error, a warning
    or ``validate -v`` ever reads a key's line.

    One search of the text finds each ``[[task]]`` and ``[[task.verify]]`` header (the
    task's line and its verifiers', which every task keeps); a task's keys are mapped
    when first asked, by :func:`map_lines` of that task's part of the file, which gives
    the lines the whole file's map would. A text that search would read differently
    (multi-line strings, line breaks other than ``\n``), or whose headers it does not
    find one per task (``task = [{...}]``), is mapped whole, at once, as before.
    """

    def __init__(self, text: str, n_tasks: int) -> None:
        self.text = text
        self._full: Optional[LineMap] = None
        self._part: tuple[int, LineMap] = (-1, LineMap())
        #: per task: where its header starts in ``text``, its line, and its verifiers'
        #: header lines (``vlines[vfirst[i]:vfirst[i + 1]]``); arrays, not lists of int
        #: objects (they live as long as the tasks collected)
        self.starts = array("q")
        self.heads = array("q")
        self.vfirst = array("q")
        self.vlines = array("q")
        plain = not any(s in text for s in _NOT_PLAIN) and text.count("\r") == text.count("\r\n")
        if plain:
            line, pos = 1, 0
            for hit in _AOT_IN_TEXT.finditer(text):
                name = hit.group(1).replace(" ", "")
                if name != "task" and name != "task.verify":
                    continue
                line += text.count("\n", pos, hit.start())
                pos = hit.start()
                if name == "task":
                    self.starts.append(pos)
                    self.heads.append(line)
                    self.vfirst.append(len(self.vlines))
                elif self.heads:  # a [[task.verify]] before any [[task]]: the file's error
                    self.vlines.append(line)
        if not plain or len(self.heads) != n_tasks:
            self._full = map_lines(text)
            self.starts, self.heads, self.vfirst, self.vlines = array("q"), array("q"), array("q"), array("q")
        self.vfirst.append(len(self.vlines))
        self.starts.append(len(text))

    def full(self) -> LineMap:
        """The whole file's map (made once, when first needed)."""
        if self._full is None:
            self._full = map_lines(self.text)
        return self._full

    def head(self, task: int) -> int:
        """The line of task ``task``'s ``[[task]]`` header."""
        if self._full is not None:
            return self._full.get("task", task)
        return self.heads[task]

    def verify(self, task: int, j: int) -> int:
        """The line of the task's ``j``-th verifier: its ``[[task.verify]]`` header, or
        (written inline) its ``verify`` key, or the task's header."""
        if self._full is None:
            first = self.vfirst[task]
            if j < self.vfirst[task + 1] - first:
                return self.vlines[first + j]
        return self.get(task, "verify", j)

    def get(self, task: int, *where: Any) -> int:
        """``map_lines(text).get("task", task, *where, default=<its header>)``."""
        if self._full is not None:
            return self._full.get("task", task, *where, default=self._full.get("task", task))
        return self.part(task).get("task", task, *where, default=self.heads[task])

    def table(self, task: int, key: str) -> Optional[int]:
        """The line of the task's sub-table ``[task.KEY]`` / ``[[task.KEY]]``, if written so."""
        lines = self._full if self._full is not None else self.part(task)
        return lines.lines.get(("task", task, "table", key))

    def part(self, task: int) -> LineMap:
        """The map of task ``task``'s part of the file (the last one asked is kept: a
        task's errors ask for several of its keys)."""
        if self._part[0] != task:
            text = self.text[self.starts[task] : self.starts[task + 1]]
            self._part = (task, map_lines(text, self.heads[task], task))
        return self._part[1]

    def top(self, key: str) -> int:
        """Where the top-level ``key`` (a default, a table) was written."""
        if self._full is None and key in self.text[: self.starts[0]]:
            hit = map_lines(self.text[: self.starts[0]]).lines.get(("top", key))
            if hit:  # a key before the first [[task]]: nothing later is written first
                return hit
        return self.full().get("top", key)


class KeyLines(Mapping[str, int]):
    """A collected task's :attr:`~fleetrun.taskspec.TaskSpec.key_lines`: the line of
    each key it sets, found in the file when first read (:class:`TaskLines`), then of
    each default it took (``known``: where that default was written).

    :ivar head: the line of the task's ``[[task]]`` header.
    :ivar known: the lines of the defaults the task took, by key.
    """

    __slots__ = ("_lines", "_task", "_keys", "known", "head", "_found")

    def __init__(self, lines: TaskLines, task: int, keys: tuple[str, ...]) -> None:
        self._lines = lines
        self._task = task
        self._keys = keys
        self.known: dict[str, int] = {}
        self.head = lines.head(task)
        self._found: Optional[dict[str, int]] = None

    def took_defaults(self, known: dict[str, int]) -> None:
        """The defaults the task took, each with its line (in the file it was written in)."""
        self.known = known

    def at(self, *where: Any) -> int:
        """The line of ``where`` in the task (a key, ``"verify", j, key``...), falling
        back outward to the task's header, as :meth:`LineMap.get` does."""
        return self._lines.get(self._task, *where)

    def table(self, key: str) -> Optional[int]:
        """The line of the task's sub-table ``key``, if it was written as a table."""
        return self._lines.table(self._task, key)

    def verify(self, j: int) -> int:
        """The line of the task's ``j``-th verifier."""
        return self._lines.verify(self._task, j)

    def _own(self) -> dict[str, int]:
        if self._found is None:
            self._found = {k: self.at(k) for k in self._keys}
        return self._found

    def __getitem__(self, key: str) -> int:
        if key in self.known:  # a default's, never a key of the task's own
            return self.known[key]
        return self._own()[key]

    def __contains__(self, key: object) -> bool:
        return key in self.known or key in self._keys

    def get(self, key: str, default: Any = None) -> Any:
        # Mapping.get would try __getitem__: a key the task does not set needs no lines
        if key in self.known:
            return self.known[key]
        return self._own()[key] if key in self._keys else default

    def __iter__(self) -> Iterator[str]:
        yield from self._keys
        yield from self.known

    def __len__(self) -> int:
        return len(self._keys) + len(self.known)

    def __repr__(self) -> str:
        return repr(dict(self))

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[str, int]:
        # a copy (dataclasses.asdict of a spec, of a Task) is the lines, not the file's text
        return dict(self)


def describe_value(value: Any) -> str:
    """What a parsed TOML value is, for an error: ``a string``, ``the number 3``,
    ``true/false``, ``a list``, ``a table`` (every file's errors say it alike)."""
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


def not_one_of(value: Any, choices: Any) -> str:
    """``'acceptedits' is not one of acceptEdits, auto, ... (did you mean 'acceptEdits'?)``:
    a value that is not one of ``choices``, with the closest one when there is one (the
    case of a letter counts for nothing in the likeness, as it is the usual slip)."""
    import difflib

    names = [str(c) for c in choices]
    by_lower = {n.lower(): n for n in names}
    close = difflib.get_close_matches(str(value).lower(), list(by_lower), n=1, cutoff=0.6)
    hint = f" (did you mean '{by_lower[close[0]]}'?)" if close else ""
    return f"{value!r} is not one of {', '.join(names)}{hint}"


def parse_toml_file(path: Path, display: str) -> tuple[dict[str, Any], str]:
    """Read and parse one TOML file.

    :param display: the file's name as errors show it.
    :return: the parsed data and the text (for :func:`map_lines`).
    :raises UsageError: the file is missing, unreadable, not UTF-8 or not TOML.
    """
    try:
        # utf-8-sig: a byte-order mark (Notepad writes one) is not TOML, nor a character
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise UsageError("file not found", file=display) from None
    except UnicodeDecodeError as e:
        raise UsageError(f"not UTF-8 text ({e.reason})", file=display) from None
    except OSError as e:
        raise UsageError(f"cannot read: {e.strerror}", file=display) from None
    tomllib = _tomllib()
    try:
        return tomllib.loads(text), text
    except tomllib.TOMLDecodeError as e:
        msg = str(e)
        hit = re.search(r"\(at line (\d+), column \d+\)", msg)
        line = int(hit.group(1)) if hit else None
        if hit:
            msg = msg[: hit.start()].strip()
        lineno = getattr(e, "lineno", None) or line
        msg = getattr(e, "msg", None) or msg
        if lineno is None and "end of document" in str(e):
            lineno = max(1, len(text.splitlines()))
        raise UsageError(f"invalid TOML: {msg}", file=display, line=lineno) from None

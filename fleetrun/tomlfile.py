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


def map_lines(text: str) -> LineMap:
    """Where each table and key of the TOML ``text`` was written (a light scan, no parse)."""
    m = LineMap()
    task = -1
    verify = -1
    ctx: tuple[Any, ...] = ("top",)
    in_ml: Optional[str] = None
    for lineno, line in enumerate(text.splitlines(), 1):
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

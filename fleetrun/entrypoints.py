"""The installed plugins' entry points (group ``fleetrun``), found without
``importlib.metadata``.

Every ``fleetrun`` command looks for installed plugins first, and ``importlib.metadata``
costs ~10 ms of imports (email, zipfile, csv...) before it reads a file: a third of what
``fleetrun --help`` may take. What it reads is simple: ``entry_points.txt`` in each
``*.dist-info`` or ``*.egg-info`` folder of the folders on ``sys.path``, the first
distribution of a name winning. That is read here, with a few ``scandir`` calls. Where
a distribution could come from elsewhere (a zip or egg file on ``sys.path``, a finder
of ``sys.meta_path`` that finds distributions of its own) ``importlib.metadata`` is
asked, as before.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from dataclasses import dataclass
from typing import Any

#: ``module:attr.sub [extras]``, as ``importlib.metadata.EntryPoint.pattern``.
PATTERN = re.compile(r"(?P<module>[\w.]+)\s*(:\s*(?P<attr>[\w.]+)\s*)?((?P<extras>\[.*\])\s*)?$")


@dataclass(frozen=True)
class EntryPoint:
    """One entry point: ``name = value``, from the distribution ``dist``."""

    name: str
    value: str
    group: str
    dist: str

    def load(self) -> Any:
        """Import the module the value names and return its attribute (or the module).

        :raises ValueError: a value that names no module.
        """
        m = PATTERN.match(self.value)
        if m is None:
            raise ValueError(f"not an entry point: {self.value!r}")
        obj: Any = importlib.import_module(m.group("module"))
        for attr in (m.group("attr") or "").split(".") if m.group("attr") else ():
            obj = getattr(obj, attr)
        return obj


def entry_points(group: str) -> list[Any]:
    """The entry points of ``group`` of every installed distribution, in ``sys.path``
    order (:class:`EntryPoint`, or ``importlib.metadata``'s where it had to be asked)."""
    if not _scannable():
        from importlib import metadata

        eps = metadata.entry_points()
        if hasattr(eps, "select"):
            return list(eps.select(group=group))
        return list(eps.get(group, []))  # pragma: no cover - Python 3.9
    seen: set[str] = set()
    found: list[Any] = []
    for folder in sys.path:
        try:
            entries = sorted(os.scandir(folder or "."), key=lambda e: e.name)
        except OSError:
            continue
        for e in entries:
            name, dot, kind = e.name.rpartition(".")
            if not dot or kind not in ("dist-info", "egg-info") or not e.is_dir():
                continue
            dist = re.sub(r"[-_.]+", "_", name.split("-", 1)[0]).lower()
            if dist in seen:
                continue
            seen.add(dist)
            try:
                with open(os.path.join(e.path, "entry_points.txt"), encoding="utf-8") as f:
                    text = f.read()
            except OSError:
                continue
            found.extend(EntryPoint(n, v, group, dist) for n, v in parse(text, group))
    return found


def parse(text: str, group: str) -> list[tuple[str, str]]:
    """The ``name = value`` lines of the ``[group]`` section of an ``entry_points.txt``
    (the INI form ``importlib.metadata`` reads: ``#`` comments, blank lines)."""
    out: list[tuple[str, str]] = []
    section = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
            continue
        if section == group and "=" in line:
            name, _, value = line.partition("=")
            out.append((name.strip(), value.strip()))
    return out


def _scannable() -> bool:
    """Whether every distribution is a folder this module reads: no zip or egg file on
    ``sys.path``, no finder of distributions but the standard one."""
    from importlib.machinery import PathFinder

    if any(hasattr(f, "find_distributions") and f is not PathFinder for f in sys.meta_path):
        return False
    return not any(p and os.path.isfile(p) for p in sys.path)

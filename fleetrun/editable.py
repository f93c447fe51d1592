"""Finding editable installs of a checkout in a Python environment, without running it.

``pip install -e .`` in a venv makes that venv import the project from the folder it
was installed from. A ``run`` verifier that uses the venv in a task's worktree then
imports the user's checkout, not the worktree's code, and passes whatever the agent
broke. :func:`editable_trap` finds that case by reading the environment's
site-packages: pip's ``direct_url.json`` (``"dir_info": {"editable": true}``), and the
``.pth`` files and ``__editable__`` finders that editable installs leave.
"""

from __future__ import annotations

import ast
import glob
import json
import os
import re
import shlex
import shutil
from dataclasses import dataclass
from typing import Optional
from urllib.parse import unquote, urlparse

from .gitutil import repo_toplevel


@dataclass(frozen=True)
class EditableInstall:
    package: str
    project: str  # the folder it was installed from (pip's url), or where its code is


@dataclass(frozen=True)
class Trap:
    interpreter: str
    package: str
    project: str
    pythonpath: str  # what PYTHONPATH would make the worktree's copy win, relative to cwd


def checkout_of(cwd: str) -> Optional[str]:
    """The real path of the top of the repository that holds ``cwd``, or None."""
    top = repo_toplevel(cwd)
    return os.path.realpath(top) if top else None


def _inside(path: str, top: str) -> bool:
    real = os.path.realpath(path)
    return real == top or real.startswith(top.rstrip(os.sep) + os.sep)


def interpreter_of(command: str) -> Optional[str]:
    """The Python program a shell command starts, when its first word names one: a path
    (``/venv/bin/python``, ``~/venv/bin/pytest``) or a bare ``python*``/``pytest*``
    found on PATH. None when it is something else, a relative path (that is inside
    the worktree), or when the command sets ``PYTHONPATH`` itself."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    if words and words[0] == "env":
        words = words[1:]
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
        if words[0].startswith("PYTHONPATH="):
            return None  # the user chose what is imported
        words = words[1:]
    if not words:
        return None
    first = os.path.expanduser(words[0])
    if "/" not in first:
        if not re.match(r"(python|pytest|py\.test)", first):
            return None
        found = shutil.which(first)
        return found
    return first if os.path.isabs(first) else None


def site_packages(interpreter: str) -> list[str]:
    """The site-packages folders of the environment ``interpreter`` belongs to
    (``ENV/bin/NAME`` -> ``ENV/lib*/python*/site-packages``). The path is not resolved:
    a venv's python is a link to the base interpreter."""
    bindir = os.path.dirname(os.path.abspath(interpreter))
    if os.path.basename(bindir) != "bin":
        return []
    root = os.path.dirname(bindir)
    found: list[str] = []
    for lib in ("lib", "lib64"):
        for sp in sorted(glob.glob(os.path.join(glob.escape(root), lib, "python*", "site-packages"))):
            if os.path.isdir(sp) and os.path.realpath(sp) not in {os.path.realpath(f) for f in found}:
                found.append(sp)
    return found


def _read(path: str, limit: int = 256 * 1024) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(limit)
    except OSError:
        return ""


def _dist_name(dist_info: str) -> str:
    for line in _read(os.path.join(dist_info, "METADATA"), 64 * 1024).splitlines():
        if line.lower().startswith("name:"):
            return line.split(":", 1)[1].strip()
        if not line.strip():
            break
    return os.path.basename(dist_info).split("-", 1)[0]


def _packages_in(folder: str) -> list[str]:
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    return [n for n in names if n.isidentifier() and os.path.isfile(os.path.join(folder, n, "__init__.py"))]


def editable_installs(sp: str, top: str) -> tuple[EditableInstall, ...]:
    """Editable installs in site-packages ``sp`` whose code is inside checkout ``top``."""
    found: dict[str, EditableInstall] = {}
    for dist in sorted(glob.glob(os.path.join(glob.escape(sp), "*.dist-info"))):
        try:
            data = json.loads(_read(os.path.join(dist, "direct_url.json")) or "null")
        except ValueError:
            continue
        if not isinstance(data, dict) or not isinstance(data.get("dir_info"), dict):
            continue
        if data["dir_info"].get("editable") is not True or not isinstance(data.get("url"), str):
            continue
        url = urlparse(data["url"])
        if url.scheme != "file":
            continue
        project = unquote(url.path)
        if _inside(project, top):
            name = _dist_name(dist)
            found.setdefault(name.lower(), EditableInstall(name, project))
    for pth in sorted(glob.glob(os.path.join(glob.escape(sp), "*.pth"))):
        base = os.path.basename(pth)[: -len(".pth")]
        for line in _read(pth).splitlines():
            line = line.strip()
            if not line or line.startswith(("#", "import ", "import\t")):
                continue
            path = line if os.path.isabs(line) else os.path.join(sp, line)
            if not _inside(path, top):
                continue
            if base.startswith("__editable__."):  # __editable__.NAME-VERSION.pth
                name = base[len("__editable__.") :].split("-", 1)[0]
            else:  # a folder on sys.path (setup.py develop): name what it holds
                name = next(iter(_packages_in(path)), base)
            found.setdefault(name.lower(), EditableInstall(name, path))
    for finder in sorted(glob.glob(os.path.join(glob.escape(sp), "__editable___*_finder.py"))):
        hit = re.search(r"^MAPPING\s*(?::[^=]*)?=\s*(\{.*?\})\s*$", _read(finder), re.MULTILINE | re.DOTALL)
        try:
            mapping = ast.literal_eval(hit.group(1)) if hit else {}
        except (ValueError, SyntaxError):
            continue
        for name, path in mapping.items() if isinstance(mapping, dict) else ():
            if isinstance(name, str) and isinstance(path, str) and _inside(path, top):
                found.setdefault(name.lower(), EditableInstall(name, os.path.dirname(path)))
    return tuple(found.values())


def editable_trap(
    command: str, top: str, cwd: str, cache: Optional[dict[tuple[str, str], tuple[EditableInstall, ...]]] = None
) -> Optional[Trap]:
    """The first editable install of checkout ``top`` that the interpreter of ``command``
    would import instead of the worktree's copy, or None. ``cache`` (the caller's, for
    one collection) reads each environment once however many verifiers name it."""
    interpreter = interpreter_of(command)
    if interpreter is None:
        return None
    cache = {} if cache is None else cache
    for sp in site_packages(interpreter):
        if (sp, top) not in cache:
            cache[(sp, top)] = editable_installs(sp, top)
        for inst in cache[(sp, top)]:
            src = os.path.join(inst.project, "src")
            code = src if os.path.isdir(src) else inst.project
            rel = os.path.relpath(os.path.realpath(code), os.path.realpath(cwd))
            return Trap(interpreter, inst.package, inst.project, rel)
    return None

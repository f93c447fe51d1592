"""``fleetrun status`` answered before any plugin is loaded, when nothing it shows
needs one.

Plugins take part in ``status`` through three hooks only (docs/plugins.md): the hosts
(``fleetrun_hosts``: is a placed task's host still provided?) and
``fleetrun_status_reason``, both asked about a placed task with a host, and
``fleetrun_status_fields``, for ``--json``. The table of a ledger with no placed task
(tasks that wait, or have ended), and ``--graph``, ask no plugin. So those are answered
here, from the ledger alone: no plugin manager, no look-up of the installed plugins
(``importlib.metadata``), no pluggy, no row objects. That look-up and the plugins'
imports were most of the command's time (issue 24).

Anything else returns None and ``fleetrun status`` runs the usual way, every plugin
loaded and every hook asked: a placed task in the table (met as the rows are read,
so a task placed meanwhile is no exception), ``--json``, ``--watch``, a command line
this module does not read exactly as argparse would (``-p``, an abbreviated option,
``--help``...), ``FLEETRUN_PLUGINS``, ``addopts`` (``FLEETRUN_ADDOPTS``, or a project
file that holds them), and any error, which the usual way reports as it always has.
What is printed is the same, byte for byte (tests/test_quickstatus.py).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Optional, TextIO

from .exceptions import ExitCode

if TYPE_CHECKING:
    from .ledger_schema import LedgerFile
    from .states import State

#: ``status``'s options that take no value (``commands._status_arguments`` and the
#: general ones of ``cli._build_parser``), by the name the reader gives them.
_FLAGS = {
    "--all": "all",
    "--graph": "graph",
    "--wide": "wide",
    "-v": "",
    "--verbose": "",
    "-q": "",
    "--quiet": "",
}
#: Those that take one.
_VALUED = {"--state": "state", "--home": "home", "--color": "color"}
_COLORS = ("yes", "no", "auto")


def read_args(args: list[str]) -> Optional[dict[str, str]]:
    """``status``'s options, as ``fleetrun status`` parses them, or None for a command
    line that is not plainly one of ``status`` (the usual way reads it).

    :return: option name -> value (``"1"`` for a flag), the last one given winning.
    """
    got: dict[str, str] = {}
    verb = False
    i = 0
    while i < len(args):
        word = args[i]
        name, eq, value = word.partition("=")
        if word == "status" and not verb:
            verb = True
        elif word in _FLAGS:
            got[_FLAGS[word]] = "1"
        elif name in _VALUED:
            if not eq:
                i += 1
                if i == len(args) or args[i].startswith("-"):
                    return None  # argparse's error, or a value it reads its own way
                value = args[i]
            got[_VALUED[name]] = value
        else:
            return None
        i += 1
    if not verb or got.get("color", "auto") not in _COLORS:
        return None
    return got


def _may_hold_addopts(start: Path) -> bool:
    """Whether a project file may apply here (:func:`fleetrun.projconf.load_project`
    looks, from ``start`` up to its repository's root, for ``fleetrun.toml`` or a
    ``pyproject.toml`` that names fleetrun): its ``addopts`` may change the command
    line, so it is read the usual way. Where there is none, that module (and its
    ``dataclasses`` and TOML reader) is not imported."""
    for d in (start, *start.parents):
        if (d / "fleetrun.toml").is_file():
            return True
        pyproject = d / "pyproject.toml"
        if pyproject.is_file():
            try:
                if "fleetrun" in pyproject.read_text(encoding="utf-8-sig", errors="replace"):
                    return True
            except OSError:
                return True
        if (d / ".git").exists():
            break
    return False


def _as_typed(home: Path) -> bool:
    """Whether the command line is all there is: no ``addopts`` put before it (the
    environment's, a project file's) and no plugin named by ``FLEETRUN_PLUGINS``."""
    if os.environ.get("FLEETRUN_ADDOPTS", "").strip() or (os.environ.get("FLEETRUN_PLUGINS") or "").strip(","):
        return False
    cwd = Path.cwd()
    if not _may_hold_addopts(cwd):
        return True
    from .projconf import load_project

    project = load_project(cwd, home)
    return project is None or "addopts" not in project.data


def fast_main(args: list[str], out: TextIO, err: TextIO) -> Optional[int]:
    """``fleetrun ARGS`` when it is a ``status`` this module answers (the module's
    docstring says which); None when it is not, and nothing was printed."""
    opts = read_args(args)
    if opts is None:
        return None
    text: Optional[str] = None
    try:
        from .home import default_home

        home = Path(opts["home"]).expanduser().resolve() if opts.get("home") else default_home()
        if not _as_typed(home):
            return None
        text = _status_text(home, opts, out)
    except Exception:  # the usual way reports it (a damaged ledger, a bad --state...)
        return None
    if text is None:
        return None
    out.write(text)
    return ExitCode.OK


def _any_placed(led: LedgerFile, states: Optional[set[State]]) -> bool:
    """Whether the table would hold a placed task with a host (read through the state
    index: no row of the table is read)."""
    from .viewing import PLACED

    placed = sorted(PLACED & {s.value for s in states} if states else PLACED)
    if not placed:
        return False
    sql = f"SELECT 1 FROM tasks WHERE state IN ({','.join('?' * len(placed))}) AND host != '' LIMIT 1"
    return led.conn.execute(sql, placed).fetchone() is not None


def _status_text(home: Path, opts: dict[str, str], out: TextIO) -> Optional[str]:
    from . import viewing

    states = viewing.parse_state(opts["state"]) if opts.get("state") else None
    latest = not opts.get("all")
    if opts.get("graph"):
        from .ledger import Ledger

        with Ledger(home / "state.db") as led:
            return viewing.graph_text(led, states, latest)
    from .ledger_schema import LedgerFile
    from .table import terminal_width

    width = None if opts.get("wide") else terminal_width(out)
    with LedgerFile(home / "state.db") as led:
        if _any_placed(led, states):  # its host's plugin is asked about it: the usual way, at once
            return None
        return viewing.table_text(home, led, states, latest, width, None, opts.get("state", ""))

"""The verbs of the command line (``fleetrun VERB ...``), declared through the
``fleetrun_verbs`` registry hook: the core declares its own (``fleetrun.commands``)
exactly as a plugin declares one."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Optional, TextIO

from .exceptions import UsageError

if TYPE_CHECKING:
    from .config import Config
    from .pluginmanager import FleetPluginManager

#: A verb is one word: it shares the command line with tasks file names.
VERB_NAME = re.compile(r"[a-z][a-z0-9-]*\Z")


@dataclass(frozen=True)
class VerbDecl:
    """A verb (``fleetrun NAME ...``), declared through ``fleetrun_verbs``.

    :ivar name: the word on the command line: lowercase letters, digits and ``-``.
    :ivar help: one line for ``fleetrun --help`` and the verb's own ``--help``.
    :ivar run: ``run(config, out, err)`` does the verb and returns its exit code
        (:class:`~fleetrun.ExitCode`); its arguments are in ``config.option``. Raise
        :class:`~fleetrun.UsageError` for a mistake of the user's.
    :ivar add_arguments: ``add_arguments(parser)`` adds the verb's own arguments to its
        :class:`argparse.ArgumentParser` (every verb has ``-p``, ``--home``, ``-v``,
        ``-q`` and ``--version`` already).
    :ivar plugin_options: the options plugins add with ``fleetrun_addoption`` apply to
        this verb (they do to ``run`` and ``work``).
    :ivar reads_config: ``config.toml`` is read and checked before the verb runs, so a
        mistake in it stops the verb with its line; False for a verb that must work
        with a broken file (``status``, ``cancel``...).
    :ivar takes_tasks_files: the verb takes tasks files, as ``fleetrun [run]`` does:
        ``FILE ...`` (default ``tasks.toml``; a folder stands for its ``tasks.toml``) and
        ``-k EXPR``. The CLI resolves them into ``config.option.files`` (absolute) and
        loads their ``fleetconf.py`` files before the verb runs.
    :ivar tasks_files: for a verb that works on tasks files it does not take as
        arguments: ``tasks_files(config)``, called once the command line is parsed,
        returns them, and their ``fleetconf.py`` files are loaded before the verb
        runs (``work``: the queued files).
    """

    name: str
    help: str
    run: Callable[[Config, TextIO, TextIO], int]
    add_arguments: Optional[Callable[[argparse.ArgumentParser], None]] = None
    plugin_options: bool = False
    reads_config: bool = True
    takes_tasks_files: bool = False
    tasks_files: Optional[Callable[[Config], Iterable[Path]]] = None


def build_registry(builtin: Iterable[VerbDecl], pluginmanager: FleetPluginManager) -> dict[str, VerbDecl]:
    """The verbs of this run: the core's, then every loaded plugin's
    (``fleetrun_verbs``), by name, in that order.

    :raises UsageError: a verb that is no :class:`VerbDecl`, has a name that is not one
        word, or has a name fleetrun or another plugin already has (a plugin adds
        verbs; it cannot replace one).
    """
    builtin = list(builtin)
    verbs: dict[str, VerbDecl] = {decl.name: decl for decl in builtin}
    results = pluginmanager.hook.fleetrun_verbs(pluginmanager=pluginmanager)
    for result in reversed(results):  # pluggy calls the last registered first
        for decl in result or ():
            if not isinstance(decl, VerbDecl):
                raise UsageError(
                    f"fleetrun_verbs returned {decl!r}; return a list of fleetrun.VerbDecl",
                    key="fleetrun_verbs",
                    file=_declared_by(pluginmanager, None),
                )
            if not VERB_NAME.match(decl.name):
                raise UsageError(
                    f"verb {decl.name!r} is not one word of lowercase letters, digits and -",
                    key="fleetrun_verbs",
                    file=_declared_by(pluginmanager, decl.name),
                )
            if decl.name in verbs:
                owner = "fleetrun" if any(b.name == decl.name for b in builtin) else "another plugin"
                raise UsageError(
                    f"verb {decl.name!r} is declared twice: {owner} has it already (a plugin "
                    "adds verbs; it cannot replace one)",
                    key="fleetrun_verbs",
                    file=_declared_by(pluginmanager, decl.name),
                )
            verbs[decl.name] = decl
    return verbs


def _declared_by(pluginmanager: FleetPluginManager, name: Optional[str]) -> Optional[str]:
    """The plugins whose ``fleetrun_verbs`` return the verb ``name`` (or, with None,
    something that is no verb), for an error message; asked again only then."""
    found = []
    for impl in pluginmanager.hook.fleetrun_verbs.get_hookimpls():
        try:
            answer = impl.function(pluginmanager=pluginmanager)
        except Exception:  # pragma: no cover - it answered once already
            continue
        if any(
            (getattr(d, "name", None) == name) if name is not None else not isinstance(d, VerbDecl)
            for d in (answer if isinstance(answer, (list, tuple)) else ())
        ):
            found.append(str(getattr(impl.plugin, "__file__", None) or impl.plugin_name))
    return ", ".join(found) or None

"""fleetrun: run a queue of coding-agent tasks unattended, the way pytest runs tests."""

from __future__ import annotations

import sys
import types

from .version import __version__

TYPE_CHECKING = False  # not typing's: ``import fleetrun`` must not cost typing's import
if TYPE_CHECKING:
    from typing import Any

    from .capped import cut_note, read_cut
    from .commandword import not_found_error
    from .config import Config, ConfigKey, output_cap
    from .exceptions import ExitCode, UsageError, UsageErrors
    from .hookimpl import hookimpl, hookspec
    from .hostapi import AttemptRef, Host, StartRefused, poll_statuses
    from .ledger import open_ledger
    from .ledgerstats import LedgerCounts, ledger_counts
    from .links import add_link, add_note, check_url, task_links
    from .procutil import CAPPED_PATH, ProcessHandle, tail_text, task_env
    from .reports import (
        AgentResult,
        Cancellable,
        Candidate,
        Handoff,
        HasDeadline,
        Placement,
        Selectable,
        SpawnSpec,
        Started,
        Verdict,
        VerifyHandle,
        Wait,
        Workspace,
    )
    from .stash import Stash, StashKey
    from .states import State
    from .taskspec import KeyDecl, TaskSpec, VerifySpec
    from .verbs import VerbDecl

#: The rest of the public API, by the module that defines it: imported on first use
#: (PEP 562), so ``import fleetrun`` — which every ``fleetrun`` command and a role
#: session's Stop hook pay first — costs the version alone (the markers: ``_Package``).
_LAZY: dict[str, str] = {
    "cut_note": "capped",
    "read_cut": "capped",
    "not_found_error": "commandword",
    "Config": "config",
    "ConfigKey": "config",
    "output_cap": "config",
    "ExitCode": "exceptions",
    "UsageError": "exceptions",
    "UsageErrors": "exceptions",
    "AttemptRef": "hostapi",
    "Host": "hostapi",
    "StartRefused": "hostapi",
    "poll_statuses": "hostapi",
    "LedgerCounts": "ledgerstats",
    "ledger_counts": "ledgerstats",
    "open_ledger": "ledger",
    "add_link": "links",
    "add_note": "links",
    "check_url": "links",
    "task_links": "links",
    "CAPPED_PATH": "procutil",
    "ProcessHandle": "procutil",
    "tail_text": "procutil",
    "task_env": "procutil",
    "AgentResult": "reports",
    "Cancellable": "reports",
    "Candidate": "reports",
    "Handoff": "reports",
    "HasDeadline": "reports",
    "Placement": "reports",
    "Selectable": "reports",
    "SpawnSpec": "reports",
    "Started": "reports",
    "Verdict": "reports",
    "VerifyHandle": "reports",
    "Wait": "reports",
    "Workspace": "reports",
    "Stash": "stash",
    "StashKey": "stash",
    "State": "states",
    "KeyDecl": "taskspec",
    "TaskSpec": "taskspec",
    "VerifySpec": "taskspec",
    "VerbDecl": "verbs",
}


class _Package(types.ModuleType):
    """The package's module, whose ``hookimpl`` and ``hookspec`` are pluggy's markers,
    imported on first use: pluggy (and its ``inspect``) is a third of an operator's
    command's start-up, and ``fleetrun status`` needs no plugin unless what it shows
    does (:mod:`fleetrun.quickstatus`). The markers' names are also those of their
    modules (:mod:`fleetrun.hookimpl`, :mod:`fleetrun.hookspec`), which the import
    system binds on the package when it first imports them: the names stay the
    markers' whichever is imported first (a module's class may be a subclass of
    ``types.ModuleType``, the data model's documented way to give a module properties).
    """

    @property
    def hookimpl(self) -> Any:
        from .hookimpl import hookimpl

        return hookimpl

    @hookimpl.setter
    def hookimpl(self, module: Any) -> None:
        pass  # the submodule, bound by the import system: the marker stays

    @property
    def hookspec(self) -> Any:
        from .hookimpl import hookspec

        return hookspec

    @hookspec.setter
    def hookspec(self, module: Any) -> None:
        pass  # the submodule, bound by the import system: the marker stays


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fleetrun' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # once imported, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


def main(args: list[str] | None = None, plugins: list[object] | None = None) -> int:
    """Run fleetrun in-process, as ``pytest.main`` does: a fresh plugin manager each call.

    :param args: the command line, without the program name (default ``sys.argv[1:]``).
    :param plugins: plugin objects or module names to register besides the usual ones.
    :return: the exit code.
    """
    from .cli import main as _main

    return _main(args, plugins)


__all__ = [
    "CAPPED_PATH",
    "AgentResult",
    "AttemptRef",
    "Cancellable",
    "Candidate",
    "Config",
    "ConfigKey",
    "ExitCode",
    "Handoff",
    "HasDeadline",
    "Host",
    "KeyDecl",
    "LedgerCounts",
    "Placement",
    "ProcessHandle",
    "Selectable",
    "SpawnSpec",
    "StartRefused",
    "Started",
    "Stash",
    "StashKey",
    "State",
    "TaskSpec",
    "UsageError",
    "UsageErrors",
    "Verdict",
    "VerbDecl",
    "VerifyHandle",
    "VerifySpec",
    "Wait",
    "Workspace",
    "__version__",
    "add_link",
    "add_note",
    "check_url",
    "cut_note",
    "hookimpl",
    "hookspec",
    "ledger_counts",
    "main",
    "not_found_error",
    "open_ledger",
    "output_cap",
    "poll_statuses",
    "read_cut",
    "tail_text",
    "task_env",
    "task_links",
]

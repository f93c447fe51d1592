"""fleetrun: run a queue of coding-agent tasks unattended, the way pytest runs tests."""

from __future__ import annotations

from .config import Config, ConfigKey
from .exceptions import ExitCode, UsageError, UsageErrors
from .hookimpl import hookimpl
from .hookspec import hookspec
from .hostapi import Host, StartRefused
from .procutil import ProcessHandle, task_env
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
from .version import __version__


def main(args: list[str] | None = None, plugins: list[object] | None = None) -> int:
    """Run fleetrun in-process, as ``pytest.main`` does: a fresh plugin manager each call.

    :param args: the command line, without the program name (default ``sys.argv[1:]``).
    :param plugins: plugin objects or module names to register besides the usual ones.
    :return: the exit code.
    """
    from .cli import main as _main

    return _main(args, plugins)


__all__ = [
    "AgentResult",
    "Cancellable",
    "Candidate",
    "Config",
    "ConfigKey",
    "ExitCode",
    "Handoff",
    "HasDeadline",
    "Host",
    "KeyDecl",
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
    "hookimpl",
    "hookspec",
    "main",
    "task_env",
]

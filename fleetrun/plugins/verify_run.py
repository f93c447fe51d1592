"""Built-in ``verify_run`` plugin: ``run = "cmd"`` verifiers.

The command runs with ``/bin/sh -c`` in the attempt's workspace (it is the user's own
command line; names and prompts never reach it). Its output goes to a file in the
attempt folder while it runs (so a large output can never fill a pipe and deadlock),
cut to ``[output] max_bytes`` (head and tail kept; the verdict says ``output cut``),
and the last 64 KiB is kept with the verdict; what the command detaches ends with it
(:mod:`fleetrun.capped`). The exit code is the verdict; a timeout
or a command that cannot start is a FAIL with that reason. A task's ``setup`` commands
run through here too (see :mod:`fleetrun.setupstage`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from ..config import output_cap
from ..hookimpl import hookimpl
from ..hostapi import Host
from ..procutil import ProcessHandle, tail_text, task_env
from ..reports import Verdict
from ..shepherdrun import CACHE
from ..taskspec import SETUP_STEP_BASE, step_index

if TYPE_CHECKING:
    from ..config import Config


class RunHandle(ProcessHandle):
    """A running ``run`` verifier; ``poll()`` gives the Verdict once it has ended."""

    def __init__(self, verifier: Any, cwd: str, out_path: Path, env: dict[str, str], host: str = "local",
                 max_bytes: Optional[int] = None, cache: Optional[Path] = None) -> None:
        super().__init__(verifier, ["/bin/sh", "-c", verifier.text], cwd, env, out_path, host=host,
                         max_bytes=max_bytes, cache=cache)

    def _make(self, passed: bool, reason: str) -> Verdict:
        cut = self.output_cut()
        if cut:  # the flood is this verifier's to answer for, in its own verdict
            reason = f"{reason}; {cut}"
        return Verdict(passed=passed, kind="run", label=self.verifier.label, reason=reason,
                       output=tail_text(self.out_path), duration_s=time.monotonic() - self.started,
                       host=self.host)

    def cannot_start(self, error: str) -> Verdict:
        return self._make(False, f"cannot start: {error}")

    def timed_out(self) -> Verdict:
        return self._make(False, f"timed out after {self.verifier.timeout_s:g}s")

    def ended(self, code: int) -> Verdict:
        if code == 0:
            return self._make(True, "exit code 0")
        if code < 0:
            return self._make(False, f"killed by signal {-code}")
        return self._make(False, f"exit code {code}")


def verifier_env(task: Any, attempt: Any, workspace: Any) -> dict[str, str]:
    return task_env(task, attempt, workspace.path)



@hookimpl
def fleetrun_task_keys(config: Config) -> list[Any]:
    """The verifier kind "run" this plugin runs: in the attempt's workspace, on the
    host it ran on (a peer runs it there). Without this plugin
    (``-p no:verify_run``) a tasks file that uses it does not validate."""
    from ..taskkeys import kind_text_check
    from ..taskspec import KeyDecl

    return [KeyDecl("run", (str,), where="verify_kind", doc="shell command; exit code is the verdict", check=kind_text_check,
                    runs="host")]


@hookimpl(trylast=True)
def fleetrun_verify(task: Any, verifier: Any, workspace: Any, attempt: Any, host: Host,
                    config: Config) -> Optional[RunHandle]:
    if verifier.kind != "run" or not host.local:
        return None  # a host whose folders are elsewhere runs its own (the relay's on a peer)
    adir = host.attempt_dir(attempt.id)
    adir.mkdir(parents=True, exist_ok=True, mode=0o700)
    idx = step_index(task, verifier)
    # a setup command (extra["setup"] = K) writes setup-K.out beside the verifiers' outputs
    name = f"setup-{idx - SETUP_STEP_BASE + 1}.out" if idx >= SETUP_STEP_BASE else f"verify-{idx + 1}.out"
    return RunHandle(verifier, workspace.path, adir / name, verifier_env(task, attempt, workspace),
                     max_bytes=output_cap(config), cache=config.home / CACHE)


# ---------------------------------------------------------------------------------
# A command that is not there: the verifier would fail every attempt with "command not
# found", and the agent be retried for it.

#: Words /bin/sh runs itself: what follows them is not looked for.
_SHELL_WORDS = frozenset([
    "!", "{", "(", "[", "[[", ".", ":", "alias", "break", "case", "cd", "command", "continue", "declare",
    "echo", "eval", "exec", "exit", "export", "false", "for", "function", "if", "let", "local", "printf",
    "pwd", "read", "readonly", "return", "set", "shift", "source", "test", "then", "times", "trap", "true",
    "type", "ulimit", "umask", "unalias", "unset", "until", "wait", "while",
])


def missing_command(text: str, cwd: str, has_setup: bool) -> Optional[str]:
    """Why the first command of a ``run`` verifier is not found, or None (found, a
    shell word, or nothing sure to say: a variable, a command that does not split as
    the shell's words, a relative path a ``setup`` step may make)."""
    import os
    import shlex
    import shutil

    try:
        words = shlex.split(text, comments=True)
    except ValueError:
        return None
    first = next((w for w in words if not _is_assignment(w)), "")
    if not first or first in _SHELL_WORDS or any(c in first for c in "$`*?~;&|<>()"):
        return None
    if "/" not in first:
        return None if shutil.which(first) else f"{first} is not on PATH"
    if os.path.isabs(first):
        return None if os.path.exists(first) else f"{first} does not exist"
    if has_setup or os.path.exists(os.path.join(cwd, first)):
        return None
    return f"{first} is not in the task's cwd"


def _is_assignment(word: str) -> bool:
    name, eq, _ = word.partition("=")
    return bool(eq) and name.isidentifier()


def missing_command_warnings(config: Config, items: list[Any], warnings: list[str]) -> None:
    from ..collect import display_path

    for t in items:
        for i, v in enumerate(t.verify):
            if v.kind != "run":
                continue
            problem = missing_command(v.text, t.cwd, bool(t.setup))
            if problem:
                where = display_path(Path(t.source), config.invocation_dir) if t.source else "?"
                warnings.append(f"{where}:{v.line or t.line}: task '{t.name}': verify #{i + 1}: {problem} "
                                "(the verifier would fail, command not found)")


# ---------------------------------------------------------------------------------
# The editable-install trap: a `run` verifier whose interpreter imports the project
# from the user's checkout (``pip install -e .``), so it tests that, not the worktree.


@hookimpl(trylast=True)
def fleetrun_collection_modifyitems(config: Config, items: list[Any]) -> None:
    """Warn about every ``run`` verifier whose command is not found on this machine
    (:func:`missing_command`), and every one of a worktree task whose interpreter has an
    editable install of a package from the task's own repository checkout. Nothing is
    run: PATH, the task's cwd and the interpreter's site-packages are read."""
    from ..collect import display_path
    from ..editable import checkout_of, editable_trap
    from ..queueing import WARNINGS_KEY

    warnings = config.stash.setdefault(WARNINGS_KEY, [])
    missing_command_warnings(config, items, warnings)
    tops: dict[str, Optional[str]] = {}
    seen: dict[Any, Any] = {}
    for t in items:
        if not t.git_ref:
            continue  # it works in the checkout itself: an install of it is the right one
        if t.cwd not in tops:
            tops[t.cwd] = checkout_of(t.cwd)
        top = tops[t.cwd]
        if top is None:
            continue
        for v in t.verify:
            if v.kind != "run":
                continue
            trap = editable_trap(v.text, top, t.cwd, seen)
            if trap is None:
                continue
            where = display_path(Path(t.source), config.invocation_dir) if t.source else "?"
            warnings.append(
                f"{where}:{v.line or t.line}: task '{t.name}': verify: {trap.interpreter} imports {trap.package} "
                f"from {trap.project} (an editable install of the main checkout), not from the worktree; "
                f"add PYTHONPATH={trap.pythonpath} or a setup step (docs/verifiers.md)")

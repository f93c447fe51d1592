"""What a ``run`` verifier's command line starts with, and whether /bin/sh can find it:
shared by the ``verify_run`` plugin (its validate warning, and its verdicts) and the
``relay`` plugin's peer side (a peer's ``run`` verifier), which tell a verifier that
could not run from a FAIL with it.
Pure functions of the command text, PATH and the file system.
"""

from __future__ import annotations

import os
import shlex
import shutil
from typing import Optional

#: Words /bin/sh runs itself: what follows them is not looked for.
SHELL_WORDS = frozenset(
    [
        "!",
        "{",
        "(",
        "[",
        "[[",
        ".",
        ":",
        "alias",
        "break",
        "case",
        "cd",
        "command",
        "continue",
        "declare",
        "echo",
        "eval",
        "exec",
        "exit",
        "export",
        "false",
        "for",
        "function",
        "if",
        "let",
        "local",
        "printf",
        "pwd",
        "read",
        "readonly",
        "return",
        "set",
        "shift",
        "source",
        "test",
        "then",
        "times",
        "trap",
        "true",
        "type",
        "ulimit",
        "umask",
        "unalias",
        "unset",
        "until",
        "wait",
        "while",
    ]
)


def not_found_error(text: str, path_var: Optional[str], root: str) -> Optional[str]:
    """Why a ``run`` verifier that exited 127 or 126 could not run at all, or None when
    that exit is the work's (a FAIL).

    Only what the agent cannot touch counts: a first word that is a name not found on
    the PATH the command ran with (``pytset -q``: ``command not found: pytset``), or an
    absolute path outside ``root`` (the workspace) that is missing or not executable.
    A relative path or a path inside the workspace is the work's own script: the agent
    may have deleted it or made it non-executable, so that exit is a FAIL it can fix.
    So is anything the shell's words hide (a variable, ``PATH=...`` before the command).
    """
    try:
        words = shlex.split(text, comments=True)
    except ValueError:
        return None
    at = next((i for i, w in enumerate(words) if not is_assignment(w)), len(words))
    first = words[at] if at < len(words) else ""
    if any(w.startswith("PATH=") for w in words[:at]):
        return None  # it runs with a PATH of its own making
    if not first or first in SHELL_WORDS or any(c in first for c in "$`*?~;&|<>()"):
        return None
    if "/" not in first:
        return None if shutil.which(first, path=path_var) else f"command not found: {first}"
    if not os.path.isabs(first):
        return None
    real, top = os.path.realpath(first), os.path.realpath(root)
    if real == top or real.startswith(top.rstrip(os.sep) + os.sep):
        return None
    if not os.path.exists(first):
        return f"command not found: {first}"
    if os.path.isdir(first) or not os.access(first, os.X_OK):
        return f"command not executable: {first}"
    return None


def is_assignment(word: str) -> bool:
    name, eq, _ = word.partition("=")
    return bool(eq) and name.isidentifier()

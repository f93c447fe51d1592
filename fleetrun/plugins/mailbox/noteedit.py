"""``fleetrun role note-edit``: Claude Code's ``PostToolUse`` hook, which credits an edit to
the role the editing session answers to (a role's focus is where its recent edits
concentrate: :func:`~.owner.focus`).

Like the Stop hook it runs after every edit of every session whose settings name it,
so it has a fast path (cli.py's ``_FAST_PATHS``), never fails the session (an error is
logged to ``$FLEETRUN_HOME/mailbox-hook.log``, nothing is printed, exit 0), and loads
psutil only when some role could be the session's (one over its cwd, or one bound to a
process). The hook's JSON is read by ``hookio.parse_post_tool_use``.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any, Optional, TextIO

from .stophook import _log, fast_home, read_input

#: A Write's ``tool_input`` holds the whole file it wrote (hookio's own limit).
NOTE_INPUT_MAX = 16 * 1024 * 1024


def hookio() -> Any:
    """The hooks' strict JSON reader (``hookio.py``), imported by name: it is the
    install-hooks change's module, and this one must not fail to load without it."""
    return importlib.import_module(".hookio", __package__)


def run_note_edit(home: Path, text: str) -> int:
    """Credit the edit the hook's JSON names to the session's role, if any. Never raises."""
    try:
        edit = hookio().parse_post_tool_use(text)
        if edit.file_path is None:
            return 0  # not an edit (a Bash call under a wider matcher, say)
        db = home / "state.db"
        if not db.is_file():
            return 0
        from . import store
        from .liveness import answers_to, covers, lineage, own_task, session_of

        if own_task() is not None:
            return 0  # a session fleetrun spawned: its edits are its task's, no role's focus
        conn = store.connect(str(db), timeout_s=5.0)
        try:
            roles = store.roles(conn)
            here = os.path.realpath(edit.cwd)
            if not any(r.pid or covers(r.dir, here) for r in roles):
                return 0
            me = os.getpid()
            table = lineage(me, [r.pid for r in roles])
            session = session_of(table, me)
            pid = session.pid if session is not None else me
            role, _ = answers_to(table, pid, here, roles)
            if role is not None:
                store.note_edit(conn, role.name, pid if session is not None else None, edit.file_path)
            return 0
        finally:
            conn.close()
    except Exception:
        _log(home, "note-edit")
        return 0


def fast_main(args: list[str], out: TextIO, err: TextIO) -> Optional[int]:
    """``fleetrun [--home DIR] role note-edit`` without a plugin manager; None for any
    other command line."""
    home = fast_home(args, ["role", "note-edit"])
    if home is None:
        return None
    import sys

    return run_note_edit(home, read_input(sys.stdin, NOTE_INPUT_MAX))

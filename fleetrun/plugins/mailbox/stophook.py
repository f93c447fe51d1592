"""``fleetrun mailbox stop-hook``: Claude Code's Stop hook, and its fast path.

Claude Code runs it at the end of every turn of every session whose settings name it,
with the hook's JSON on stdin. It works out which role the session answers to (the
session's pid chain, its cwd: :func:`~.liveness.answers_to`; a session fleetrun itself
spawned for a task answers to none); when a message waits for that role it claims it and prints ``{"decision": "block", "reason": ...}``: the session
does not end, and takes the reason (the task's literal id, its prompt, and the exact
``fleetrun mailbox done``/``fail`` commands to report with; no ``$(...)``, which Claude
Code refuses to run) as its next instruction. Otherwise it prints nothing.

It never fails the session: any error is logged to ``$FLEETRUN_HOME/mailbox-hook.log``
and the hook exits 0 having printed nothing. It must be fast: :func:`fast_main` answers
``fleetrun [--home DIR] mailbox stop-hook`` before any plugin manager is built (cli.py's
``_FAST_PATHS``), reads the ledger file with a bare SQLite connection, and imports
psutil only when some message is pending (``bench/stophook.py`` measures it).
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Any, Optional, TextIO

from .hookio import block_decision, mail_reason, parse_stop

#: The most of stdin read: the hook's JSON is a few hundred bytes (plus the last message).
MAX_INPUT = 1 << 20
LOG = "mailbox-hook.log"


def command_prefix(home: Optional[str] = None) -> str:
    """How this fleetrun is run, for the commands a session is told to run: the console
    script's path, or ``<interpreter> -m fleetrun`` (either names this very install,
    whatever the session's ``PATH`` holds), and ``--home DIR`` when given one."""
    argv0 = sys.argv[0] if sys.argv and sys.argv[0] else "fleetrun"
    base = os.path.basename(argv0)
    if base == "__main__.py":
        words = [sys.executable, "-m", "fleetrun"]
    elif base == "fleetrun":
        words = [os.path.abspath(argv0)]
    else:  # run in-process (a test's fleetrun.main)
        words = ["fleetrun"]
    if home:
        words += ["--home", home]
    return shlex.join(words)


HOOK_WORDS = " mailbox stop-hook"


def hook_command(default: str) -> str:
    """The command the session's settings run this hook with, less ``mailbox
    stop-hook``: Claude Code runs a hook as ``/bin/sh -c COMMAND``, so the parent's
    command line has it word for word. The report commands start with it, so they match
    the allow rules installed beside the hook (``Bash(COMMAND mailbox done:*)``).
    ``default`` when the parent is no such shell."""
    import psutil

    try:
        cmd = psutil.Process(os.getppid()).cmdline()
    except (psutil.Error, OSError):
        return default
    if (
        len(cmd) == 3
        and os.path.basename(cmd[0]) in ("sh", "bash", "dash", "zsh")
        and cmd[1] == "-c"
        and cmd[2].rstrip().endswith(HOOK_WORDS)
        and "\n" not in cmd[2]
    ):
        return cmd[2].rstrip()[: -len(HOOK_WORDS)].strip() or default
    return default


def _task_name(conn: Any, task_id: str) -> str:
    try:
        row = conn.execute("SELECT name FROM tasks WHERE id=?", (task_id,)).fetchone()
    except Exception:
        return task_id
    return str(row[0]) if row else task_id


def run_stop_hook(home: Path, text: str, out: TextIO, prefix: str) -> int:
    """The hook: claim and print the next message of the session's role, if any. Never raises."""
    try:
        hook = parse_stop(text)
        db = home / "state.db"
        if not db.is_file():
            return 0
        from . import store

        conn = store.connect(str(db), timeout_s=5.0)
        try:
            if not store.any_pending(conn):
                return 0  # the common case: no psutil, one query
            from .liveness import answers_to, covers, lineage, own_task, session_of

            if own_task() is not None:
                return 0  # a session fleetrun spawned: its own sessions take no role's mail
            roles = store.roles(conn)
            waiting = {m.role.lower() for m in store.pending(conn)}
            here = os.path.realpath(hook.cwd or os.getcwd())
            if not any(r.pid or covers(r.dir, here) for r in roles if r.key in waiting):
                return 0  # mail, but for no role this session could answer to: still no psutil
            from ... import clock

            me = os.getpid()
            table = lineage(me, [r.pid for r in roles])
            session = session_of(table, me)
            pid = session.pid if session is not None else me
            cwd = here if hook.cwd else (session.cwd if session is not None else here)
            role, _ = answers_to(table, pid, cwd, roles)
            if role is None:
                return 0
            command = hook_command(prefix)
            for msg in store.pending(conn, role.name):
                # the reason first: a message is claimed only once the session can be told
                reason = mail_reason(msg.task_id, _task_name(conn, msg.task_id), msg.body, command)
                if store.claim(conn, msg.id, pid if session is not None else None, clock.now()):
                    out.write(block_decision(reason) + "\n")
                    return 0
            return 0
        finally:
            conn.close()
    except Exception:
        _log(home, "stop-hook")
        return 0


def _log(home: Path, what: str) -> None:
    import time
    import traceback

    try:
        home.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(home / LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "a") as f:
            f.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {what}\n{traceback.format_exc()}\n")
    except OSError:
        pass


def read_input(stream: Any, limit: int = MAX_INPUT) -> str:
    try:
        return str(stream.read(limit))
    except (OSError, ValueError, UnicodeDecodeError):
        return ""


def fast_args(args: list[str], words: list[str]) -> Optional[tuple[Path, Optional[str]]]:
    """``[--home DIR] WORDS`` (nothing else on the command line): (the home, the
    ``--home`` given or None); None for any other command line, which runs the usual
    way (where the verb does the same)."""
    from ...home import home_prefix

    found = home_prefix(args, words[0])
    if found is None:
        return None
    home, i = found
    if args[i:] != words:
        return None
    if "no:mailbox" in (os.environ.get("FLEETRUN_PLUGINS") or ""):
        return None  # blocked: the usual way says so
    if home:
        return Path(home).expanduser().resolve(), home
    from ...home import default_home

    return default_home(), None


def fast_home(args: list[str], words: list[str]) -> Optional[Path]:
    found = fast_args(args, words)
    return found[0] if found is not None else None


def fast_main(args: list[str], out: TextIO, err: TextIO) -> Optional[int]:
    """``fleetrun [--home DIR] mailbox stop-hook`` without a plugin manager; None for any
    other command line."""
    found = fast_args(args, ["mailbox", "stop-hook"])
    if found is None:
        return None
    return run_stop_hook(found[0], read_input(sys.stdin), out, command_prefix(found[1]))

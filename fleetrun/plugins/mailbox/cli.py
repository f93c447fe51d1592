"""The ``role`` and ``mailbox`` verbs (docs/mailbox.md).

``fleetrun role bind NAME [DIR] [--pid PID | --self]``, ``role list``, ``role unbind
NAME``, ``role owner PATH``, ``role whoami``; ``fleetrun mailbox read [--role R]
[--peek]``, ``mailbox done TASK [--summary TEXT]``, ``mailbox fail TASK --reason TEXT``,
``mailbox stop-hook``. A role's session runs them, so none reads config.toml, and none
needs a running loop (``done`` and ``fail`` wake one, so it notices at once).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING, Any, Optional, TextIO

from ... import clock
from ...exceptions import ExitCode, UsageError
from ...textutil import LINES, safe_text
from . import store

if TYPE_CHECKING:
    from ...config import Config
    from .liveness import ProcTable


def _conn(config: Config) -> Any:
    from ...ledger import open_ledger

    return open_ledger(config).conn


def _parse(parser: argparse.ArgumentParser, rest: list[str], out: TextIO) -> Optional[argparse.Namespace]:
    if rest[:1] == ["help"] or not rest:
        parser.print_help(out)
        return None
    try:
        return parser.parse_args(rest)
    except SystemExit as e:
        if e.code == 0:
            return None
        raise UsageError(f"see 'fleetrun {parser.prog.split()[-1]} help'", key=" ".join(rest[:1])) from None


def _refused(e: store.StoreError, key: str) -> UsageError:
    return UsageError(str(e), key=key)


def _me(conn: Any) -> tuple[ProcTable, int, Optional[str], bool]:
    """The calling process's session: (its processes, the session's pid — or ours —,
    its cwd, whether a session was found)."""
    from .liveness import lineage, session_of

    me = os.getpid()
    table = lineage(me, [r.pid for r in store.roles(conn)])
    session = session_of(table, me)
    if session is None:
        return table, me, os.path.realpath(os.getcwd()), False
    return table, session.pid, session.cwd, True


# -- role -----------------------------------------------------------------------------


def _role_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fleetrun role", description="roles: a name bound to a folder and a session")
    sub = p.add_subparsers(dest="verb", metavar="{bind,list,unbind,owner,whoami,install-hooks,note-edit}")
    b = sub.add_parser("bind", help="bind NAME to DIR (default: here), optionally to a process")
    b.add_argument("name", metavar="NAME")
    b.add_argument("dir", metavar="DIR", nargs="?")
    who = b.add_mutually_exclusive_group()
    who.add_argument("--pid", type=int, metavar="PID", help="bind to this running process too")
    who.add_argument(
        "--self", dest="self_", action="store_true", help="bind to the Claude Code session this command runs in"
    )
    ls = sub.add_parser("list", help="every role: folder, bound pid, live or not, focus")
    ls.add_argument("--json", action="store_true", help="print JSON")
    u = sub.add_parser("unbind", help="forget a role")
    u.add_argument("name", metavar="NAME")
    o = sub.add_parser("owner", help="the live role that owns PATH, or why none does")
    o.add_argument("path", metavar="PATH")
    sub.add_parser("whoami", help="the role this session answers to")
    h = sub.add_parser(
        "install-hooks",
        help="add fleetrun's Stop and PostToolUse hooks and report allow rules to DIR/.claude/settings.local.json",
    )
    h.add_argument("dir", metavar="DIR", nargs="?", help="the role's folder (default: here)")
    h.add_argument("--remove", action="store_true", help="take them out again")
    h.add_argument("--user", action="store_true", help="the user's ~/.claude/settings.json instead")
    sub.add_parser("note-edit", help="Claude Code's PostToolUse hook: credit an edit to the session's role")
    return p


def role_main(config: Config, rest: list[str], out: TextIO, err: TextIO) -> int:
    parser = _role_parser()
    ns = _parse(parser, rest, out)
    if ns is None:
        return ExitCode.OK
    if ns.verb in ("install-hooks", "note-edit"):  # neither needs the ledger opened here
        return role_main_hooks(config, ns, out)
    if ns.verb in ("bind", "unbind"):
        _not_fleetruns(f"role {ns.verb}")
    conn = _conn(config)
    if ns.verb == "bind":
        return _bind(conn, ns, out)
    if ns.verb == "list":
        return _list(config, conn, ns, out)
    if ns.verb == "unbind":
        if not store.unbind(conn, ns.name):
            raise UsageError(f"no role {ns.name!r} is bound (fleetrun role list)", key="role unbind")
        print(f"unbound role {safe_text(ns.name)}", file=out)
        return ExitCode.OK
    if ns.verb == "owner":
        return _owner(config, conn, ns.path, out)
    return _whoami(conn, out)


def _not_fleetruns(key: str) -> None:
    """Refuse a command run by a session (or verifier) fleetrun started for a task: its
    own sessions answer to no role, so they bind none and unbind none.

    :raises UsageError: it was.
    """
    from .liveness import lineage, started_for

    me = os.getpid()
    task = started_for(lineage(me), me)
    if task is not None:
        raise UsageError(
            f"fleetrun started this session for task {task}, and its own sessions answer to no "
            "role: they bind none and unbind none",
            key=key,
        )


def role_main_hooks(config: Config, ns: argparse.Namespace, out: TextIO) -> int:
    if ns.verb == "install-hooks":
        return _install_hooks(config, ns, out)
    from .noteedit import NOTE_INPUT_MAX, run_note_edit
    from .stophook import read_input

    return run_note_edit(config.home, read_input(sys.stdin, NOTE_INPUT_MAX))


def _install_hooks(config: Config, ns: argparse.Namespace, out: TextIO) -> int:
    """``settings.install`` with this fleetrun's command (``settings.default_command``:
    the console script or ``python -m fleetrun``, and ``--home`` unless the default)."""
    import importlib

    settings = importlib.import_module(".settings", __package__)  # the install-hooks change's module
    change = settings.install(
        ns.dir or os.getcwd(), settings.default_command(config.home), remove=ns.remove, user=ns.user
    )
    print(change.describe(), file=out)
    return ExitCode.OK


def _bind(conn: Any, ns: argparse.Namespace, out: TextIO) -> int:
    from .liveness import lineage, session_of, start_time

    pid: Optional[int] = None
    started: Optional[float] = None
    if ns.self_:
        me = os.getpid()
        session = session_of(lineage(me), me)
        if session is None:
            raise UsageError(
                "this command is not running inside a Claude Code session (no claude process "
                "above it); bind with --pid PID, or without one",
                key="role bind --self",
            )
        pid, started = session.pid, session.started
    elif ns.pid is not None:
        started = start_time(ns.pid)
        if started is None:
            raise UsageError(f"no running process {ns.pid}", key="role bind --pid")
        pid = ns.pid
    if pid is not None:
        table = lineage(pid, [r.pid for r in store.roles(conn)])
        other = next(
            (
                r
                for r in store.roles(conn)
                if r.pid == pid and r.key != ns.name.lower() and table.alive(r.pid, r.pid_started)
            ),
            None,
        )
        if other is not None:
            raise UsageError(
                f"pid {pid} is bound to role {other.name} already (fleetrun role unbind {other.name} first)",
                key="role bind",
            )
    try:
        role = store.bind(conn, ns.name, ns.dir or os.getcwd(), pid, started)
    except store.StoreError as e:
        raise _refused(e, "role bind") from None
    how = f" (pid {pid})" if pid is not None else ""
    print(f"bound role {role.name} to {safe_text(role.dir)}{how}", file=out)
    return ExitCode.OK


def _foci(conn: Any) -> dict[str, Optional[str]]:
    from .owner import focus

    return {key: focus(paths) for key, paths in store.edits(conn).items()}


def _list(config: Config, conn: Any, ns: argparse.Namespace, out: TextIO) -> int:
    from .liveness import scan
    from .receiving import Reception, receptions

    roles = store.roles(conn)
    got = receptions(scan(), roles, config.home) if roles else {}
    foci = _foci(conn)
    rows = []
    for r in roles:
        rec = got.get(r.key) or Reception(live=False)
        rows.append(
            {
                "role": r.name,
                "dir": r.dir,
                "pid": r.pid,
                "live": rec.live,
                "why": rec.why_live,
                "receives": rec.receives,
                "cannot_receive": rec.problem,
                "focus": foci.get(r.key),
            }
        )
    if ns.json:
        print(json.dumps(rows, indent=2), file=out)
        return ExitCode.OK
    if not rows:
        print("no roles bound (fleetrun role bind NAME [DIR])", file=out)
        return ExitCode.OK
    for row in rows:
        state = f"live ({row['why']})" if row["live"] else "not live"
        if row["cannot_receive"]:  # its session never takes its mail: say so, and how to fix it
            state += f", cannot receive: {row['cannot_receive']}"
        pid = f"pid {row['pid']}" if row["pid"] else "no pid"
        print(safe_text(f"{row['role']}  {row['dir']}  {pid}  {state}  focus {row['focus'] or '-'}"), file=out)
    return ExitCode.OK


def _owner(config: Config, conn: Any, path: str, out: TextIO) -> int:
    from .liveness import scan
    from .owner import owner
    from .receiving import receptions

    roles = store.roles(conn)
    got = receptions(scan(), roles, config.home) if roles else {}
    foci = _foci(conn)
    # the rule routing applies: a live role that cannot receive owns nothing
    role, why = owner([path], os.getcwd(), [r for r in roles if got[r.key].receives], foci)
    if role is None:
        deaf, _ = owner([path], os.getcwd(), [r for r in roles if got[r.key].live], foci)
        if deaf is not None:
            why += f" (role {deaf.name} is live but cannot receive: {got[deaf.key].problem})"
        print(safe_text(f"no owner: {why}"), file=out)
        return 1
    print(safe_text(why), file=out)
    return ExitCode.OK


def _whoami(conn: Any, out: TextIO) -> int:
    from .liveness import answers_to

    table, pid, cwd, found = _me(conn)
    role, why = answers_to(table, pid, cwd, store.roles(conn))
    where = f"session {pid}" if found else "not in a Claude Code session"
    if role is None:
        print(safe_text(f"no role ({where}): {why}"), file=out)
        return 1
    print(safe_text(f"{role.name} ({where}: {why})"), file=out)
    return ExitCode.OK


# -- mailbox --------------------------------------------------------------------------


def _mailbox_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fleetrun mailbox", description="a role's mailbox")
    sub = p.add_subparsers(dest="verb", metavar="{read,done,fail,stop-hook}")
    r = sub.add_parser("read", help="show (and claim) the messages waiting for a role")
    r.add_argument("--role", metavar="R", help="that role's (default: the one this session answers to)")
    r.add_argument("--peek", action="store_true", help="show, claim nothing")
    d = sub.add_parser("done", help="report a task done; the summary is its handoff")
    d.add_argument("task", metavar="TASK")
    d.add_argument("--summary", metavar="TEXT", default="")
    f = sub.add_parser("fail", help="report a task failed (it needs a human)")
    f.add_argument("task", metavar="TASK")
    f.add_argument("--reason", metavar="TEXT", required=True)
    sub.add_parser("stop-hook", help="Claude Code's Stop hook: the hook's JSON on stdin")
    return p


def mailbox_main(config: Config, rest: list[str], out: TextIO, err: TextIO) -> int:
    parser = _mailbox_parser()
    ns = _parse(parser, rest, out)
    if ns is None:
        return ExitCode.OK
    if ns.verb == "stop-hook":
        from .stophook import command_prefix, read_input, run_stop_hook

        return run_stop_hook(config.home, read_input(sys.stdin), out, command_prefix())
    conn = _conn(config)
    if ns.verb == "read":
        return _read(conn, ns, out)
    return _report(config, conn, ns, out)


def _read(conn: Any, ns: argparse.Namespace, out: TextIO) -> int:
    from .hookio import mail_reason
    from .liveness import answers_to, started_for
    from .stophook import _task_name, command_prefix

    table, pid, cwd, found = _me(conn)
    name = ns.role
    role, why = answers_to(table, pid, cwd, store.roles(conn))
    if name is None:
        if role is None:
            raise UsageError(f"this session answers to no role ({why}); name one with --role R", key="mailbox read")
        name = role.name
    elif not ns.peek and (found or started_for(table, pid)) and (role is None or role.key != name.lower()):
        # a claim hands the task to the caller: a session takes only its own role's mail
        # (a person, in no session, may take any role's, as an operator)
        who = f"role {role.name}" if role is not None else f"no role ({why})"
        raise UsageError(
            safe_text(
                f"this session answers to {who}, not to role {name}: it may read role "
                f"{name}'s mail with --peek, and claim none of it"
            ),
            key="mailbox read",
        )
    msgs = store.pending(conn, name)
    if not msgs:
        print(f"no mail for role {safe_text(name)}", file=out)
        return ExitCode.OK
    for msg in msgs:
        if not ns.peek and not store.claim(conn, msg.id, pid if found else None, clock.now()):
            continue  # another session claimed it meanwhile
        text = mail_reason(msg.task_id, _task_name(conn, msg.task_id), msg.body, command_prefix())
        print(safe_text(text, keep=LINES), file=out)
    return ExitCode.OK


def _log_report(config: Config, msg: store.Message, verb: str, text: str) -> None:
    """The attempt's ``log`` (what ``fleetrun logs`` points at): who reported what."""
    import time

    path = config.home / "attempts" / msg.attempt_id / "log"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    except OSError:
        return  # no attempt folder: nothing to add to
    with os.fdopen(fd, "a", encoding="utf-8") as f:
        f.write(
            f"{time.strftime('%Y-%m-%d %H:%M:%S')} role {msg.role} reported {verb}: "
            f"{store.clean_text(text, store.REPORT_CAP)}\n"
        )


def _reporter(conn: Any, msg: store.Message, task_id: str, verb: str) -> None:
    """Refuse a report from anyone but a session of the role the task was delivered to
    (issue 21 item 7b). Who calls is worked out as whoami does, from the caller's
    process chain and its session's folder, never from what it says: a session of
    another role, or one fleetrun started, cannot pass for the role. A person settles
    a delivered task with ``fleetrun cancel`` (then ``retry``), not by reporting it.

    :raises UsageError: the caller answers to another role, or to none.
    """
    from .liveness import answers_to

    table, pid, cwd, found = _me(conn)
    role, why = answers_to(table, pid, cwd, store.roles(conn))
    if role is not None and role.key == msg.role.lower():
        return
    me = "this session" if found else "this process (in no Claude Code session)"
    who = f"answers to role {role.name}" if role is not None else f"answers to no role ({why})"
    raise UsageError(
        safe_text(
            f"task {task_id} was delivered to role {msg.role}, and {me} {who}: only a session "
            f"of role {msg.role} may report it (a person settles it with fleetrun cancel "
            f"{task_id}, then retry)"
        ),
        key=f"mailbox {verb}",
    )


def _report(config: Config, conn: Any, ns: argparse.Namespace, out: TextIO) -> int:
    from ...ledger import open_ledger
    from ...liveness import wake_loop

    task = open_ledger(config).find(ns.task)
    task_id = task.id if task is not None else ns.task
    msg = store.message_of_task(conn, task_id)
    if msg is None:
        raise UsageError(f"no mailbox message for task {safe_text(ns.task)!r}", key=f"mailbox {ns.verb}")
    if msg.state not in ("pending", "claimed"):
        why = f": {msg.reason}" if msg.reason else ""
        raise UsageError(
            f"task {task_id}'s message is {msg.state}{safe_text(why)}; there is nothing to report",
            key=f"mailbox {ns.verb}",
        )
    _reporter(conn, msg, task_id, ns.verb)
    if ns.verb == "done":
        moved = store.finish(conn, msg.id, "done", clock.now(), summary=ns.summary)
    else:
        moved = store.finish(conn, msg.id, "failed", clock.now(), reason=ns.reason)
    if not moved:
        raise UsageError(f"task {task_id}'s message changed meanwhile; see fleetrun status", key=f"mailbox {ns.verb}")
    _log_report(config, msg, ns.verb, ns.summary if ns.verb == "done" else ns.reason)
    wake_loop(config.home)
    print(f"reported {task_id} {ns.verb}", file=out)
    return ExitCode.OK

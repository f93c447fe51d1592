"""Built-in ``mailbox`` plugin: roles, routing to the live session that owns the work,
delivery through Claude Code's Stop hook, and completion reports (docs/mailbox.md).

A *role* is a name bound to a folder (and optionally to a process): ``fleetrun role
bind relay src/relay --self`` inside a Claude Code session. A task with ``role =
"relay"``, or with ``auto_route = true`` in policy.toml one whose ``paths`` a live role
owns, is not spawned: its attempt is *delivered* to the role's mailbox (a row in the
ledger file), the session picks it up when its turn ends (``fleetrun mailbox
stop-hook``, its Stop hook, blocks with the task), and reports back with ``fleetrun
mailbox done TASK --summary ...`` or ``fleetrun mailbox fail TASK --reason ...``.

The hooks, each answering only for what is the mailbox's:

- ``fleetrun_hosts``: the ``mailbox`` host (:class:`~.host.MailboxHost`), where
  delivered attempts run; the loop polls, stops and adopts them there.
- ``fleetrun_start_attempt`` (normal priority, so before the ``shepherd`` plugin's
  ``trylast`` default): delivers the attempts :mod:`.delivery` routes to a role,
  returns None for the rest.
- ``fleetrun_agent_result`` and ``fleetrun_handoff``: for a delivered attempt, what the
  role reported (its summary is the handoff).
- ``fleetrun_attempt_started``: a delivered attempt's ``fleetrun_task_waiting`` (where
  its message waits: the run's ``waiting:`` line), said again as it changes.
- ``fleetrun_verbs``: ``role`` and ``mailbox`` (:mod:`.cli`); the Stop hook has a fast
  path that loads no plugin (:mod:`.stophook`).
- ``fleetrun_status_reason`` and ``fleetrun_status_fields``: ``fleetrun status`` says
  where a delivered task waits (a session home, one that cannot receive and why, nobody
  home), and ``--json`` gives every task's ``role`` and its ``message`` state.

With ``-p no:mailbox`` none of this exists: a task with ``role`` is a validate error.
This module imports nothing heavy (no psutil, no sqlite3): ``fleetrun --help`` loads it.
The package: :mod:`.store` (its tables), :mod:`.liveness` (sessions, whoami),
:mod:`.receiving` (whether a live session can receive: fleetrun's Stop hook in its settings),
:mod:`.owner` (the routing rule, pure), :mod:`.delivery`, :mod:`.host`, :mod:`.cli`,
:mod:`.stophook`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from ...hookimpl import hookimpl
from ...stash import StashKey

if TYPE_CHECKING:
    from ...config import Config
    from ...reports import AgentResult, Handoff, SpawnSpec, Started

#: The host delivered attempts run on (:data:`.host.MAILBOX_HOST`, without importing it).
HOST_NAME = "mailbox"
#: The cause words of a delivered attempt's ends (:data:`.host.MAILBOX_FAILED`...) and
#: of its start (the core knows them only from here).
CAUSE_WORDS = frozenset(
    {
        "mailbox_claimed_no_completion",
        "assigned_via_mailbox",
        "mailbox_failed",
        "mailbox_unclaimed",
        "mailbox_withdrawn",
    }
)


@hookimpl(trylast=True)
def fleetrun_hosts(config: Config) -> list[Any]:
    from .host import MailboxHost

    return [MailboxHost(config)]


@hookimpl
def fleetrun_start_attempt(
    task: Any, attempt: Any, host: Any, spawn: SpawnSpec, prompt: str, config: Config
) -> Optional[Started]:
    if attempt.kind != "fresh" or not getattr(host, "local", False):
        return None  # never delivered: do not even open the mailbox
    from .delivery import deliver

    return deliver(task, attempt, host, prompt, config)


def _message_of(attempt: Any, config: Config) -> Any:
    if attempt is None or attempt.host != HOST_NAME:
        return None
    from ...ledger import open_ledger
    from .store import message_of_attempt

    return message_of_attempt(open_ledger(config).conn, attempt.id)


@hookimpl
def fleetrun_agent_result(
    task: Any, attempt: Any, log_path: str, exit_code: Optional[int], config: Config
) -> Optional[AgentResult]:
    msg = _message_of(attempt, config)
    if msg is None:
        return None
    from ...reports import AgentResult
    from .host import end_of, status_of

    done = msg.state == "done"
    # fleetrun paid for no session: the role's own session's cost is its user's
    return AgentResult(
        ok=done,
        reason="" if done else f"mailbox_{msg.state}",
        exit_code=0 if done else None,
        cost_usd=0.0,
        result_text=(msg.summary if done else msg.reason) or "",
        end=end_of(status_of(msg)),
    )


@hookimpl
def fleetrun_handoff(task: Any, attempt: Any, host: Any, config: Config) -> Optional[Handoff]:
    msg = _message_of(attempt, config)
    if msg is None:
        return None
    from ...reports import Handoff

    return Handoff(
        task_name=task.name,
        branch=task.branch,
        summary=msg.summary or "",
        host=task.host or "local",
        fetch_hint=f"Done by role {msg.role} in its own session, in {task.spec.cwd}.",
    )


@hookimpl
def fleetrun_attempt_started(task: Any, attempt: Any, host: Any, config: Config) -> None:
    """A delivered attempt: say at once where its message waits (the run's ``waiting:``
    line); the mailbox host's polls say it again when that changes."""
    if attempt.host != HOST_NAME:
        return
    from ...hostapi import get_host
    from ...ledger import open_ledger
    from .store import message_of_attempt

    mailbox = get_host(config, HOST_NAME)
    msg = message_of_attempt(open_ledger(config).conn, attempt.id)
    tell = getattr(mailbox, "tell", None)
    if msg is not None and tell is not None:
        tell(msg)


#: Every task's newest message, read once per ``status`` (task id -> message).
_STATUS_MESSAGES = StashKey[dict[str, Any]]()


def _newest_messages(config: Config) -> dict[str, Any]:
    got = config.stash.get(_STATUS_MESSAGES)
    if got is None:
        from ...ledger import open_ledger

        conn = open_ledger(config).conn
        got = {}
        # no message was ever delivered: `status` loads none of the mailbox's modules
        if conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='mailbox_messages'").fetchone():
            from .store import newest_by_task

            got = newest_by_task(conn)
        config.stash[_STATUS_MESSAGES] = got
    return got


@hookimpl
def fleetrun_status_reason(task: Any, config: Config) -> Optional[str]:
    """Where a delivered task's message waits: a session is home and takes it when its
    turn ends; the role's session cannot receive, and why; nobody is home; the role
    works on it. (A process scan, only when a message is pending.)"""
    msg = _newest_messages(config).get(task.id)
    if msg is None or msg.state not in ("pending", "claimed"):
        return None
    from ...hostapi import get_host

    host = get_host(config, HOST_NAME)
    waits_in = getattr(host, "waits_in", None)
    return waits_in(msg) if waits_in is not None else None


@hookimpl
def fleetrun_status_fields(tasks: list[Any], config: Config) -> Optional[dict[str, dict[str, Any]]]:
    """For a task with a role (one it declares, or the one its message went to):
    ``role``, the role its message went to, else the declared one; and ``message``,
    ``pending`` or ``claimed`` while its message is in a mailbox, else None. A task
    without a role gets neither (its row is as without the plugin)."""
    import sqlite3

    from ...ledger import open_ledger

    newest = _newest_messages(config)
    conn = open_ledger(config).conn
    declared: dict[str, Any] = {}
    ids = [t.id for t in tasks]
    try:  # these tasks' roles only (status --json asks a batch at a time), not each whole spec
        for k in range(0, len(ids), 500):  # SQLite's limit on bound parameters
            chunk = ids[k : k + 500]
            declared.update(
                conn.execute(
                    f"SELECT id, json_extract(spec, '$.role') FROM tasks WHERE id IN ({','.join('?' * len(chunk))})"
                    " AND json_extract(spec, '$.role') IS NOT NULL",
                    chunk,
                )
            )
    except sqlite3.OperationalError:  # an SQLite without JSON functions: the messages' roles only
        declared = {}
    out: dict[str, dict[str, Any]] = {}
    for t in tasks:
        msg = newest.get(t.id)
        role = msg.role if msg is not None else declared.get(t.id)
        if not isinstance(role, str):
            continue
        state = msg.state if msg is not None and msg.state in ("pending", "claimed") else None
        out[t.id] = {"role": role, "message": state}
    return out


@hookimpl
def fleetrun_collection_modifyitems(config: Config, items: list[Any]) -> None:
    """A ``role`` that could never be bound (a reserved name, not a role name) is an
    error at its line; a role task that asks for what a mailbox cannot carry is a
    warning (it is spawned)."""
    roles = [t for t in items if t.role]
    if not roles:
        return
    from pathlib import Path

    from ...collect import display_path
    from ...exceptions import UsageError, UsageErrors
    from ...queueing import warn_tasks
    from ...textutil import safe_name
    from .delivery import spec_always_spawned
    from .store import StoreError, check_name

    errors = []
    spawned: dict[tuple[str, str], list[Any]] = {}  # by cause: one warning for the tasks that share one
    for t in roles:
        try:
            check_name(t.role)
        except StoreError as e:
            where = display_path(Path(t.file_of("role")), config.invocation_dir) if t.source else "?"
            line = t.key_lines.get("role", t.line)
            errors.append(UsageError(str(e), file=where, line=line, key=f"task '{safe_name(t.name)}': role"))
            continue
        why = spec_always_spawned(t)
        if why is not None:
            spawned.setdefault((why, t.role), []).append(t)
    for (why, role), tasks in spawned.items():
        warn_tasks(
            config,
            tasks[0],
            len(tasks),
            "role",
            f"{why}, so it is spawned, not delivered to role {role} (a mailbox carries only the prompt)",
        )
    if errors:
        raise UsageErrors(errors) if len(errors) > 1 else errors[0]


def _rest_arguments(metavar: str, text: str) -> Any:
    def add(parser: Any) -> None:
        import argparse

        parser.add_argument("rest", nargs=argparse.REMAINDER, metavar=metavar, help=text)

    return add


def _run_role(config: Config, out: Any, err: Any) -> int:
    from .cli import role_main

    return role_main(config, list(config.option.rest or []), out, err)


def _run_mailbox(config: Config, out: Any, err: Any) -> int:
    from .cli import mailbox_main

    return mailbox_main(config, list(config.option.rest or []), out, err)


@hookimpl
def fleetrun_verbs(pluginmanager: Any) -> list[Any]:
    """``role`` (bind a role to a folder and a session, list, owner, whoami) and
    ``mailbox`` (what a role's session runs: read, done, fail, stop-hook). Neither reads
    config.toml: a role's session runs them at every turn."""
    from ...verbs import VerbDecl

    return [
        VerbDecl(
            name="role",
            help="roles: role bind NAME [DIR] [--pid PID | --self], role list, role unbind NAME, "
            "role owner PATH, role whoami, role install-hooks [DIR], role note-edit",
            run=_run_role,
            reads_config=False,
            add_arguments=_rest_arguments(
                "bind|list|unbind|owner|whoami ...", "'fleetrun role help' lists them (docs/mailbox.md)"
            ),
        ),
        VerbDecl(
            name="mailbox",
            help="a role's mailbox: mailbox read [--role R] [--peek], mailbox done TASK "
            "[--summary TEXT], mailbox fail TASK --reason TEXT, mailbox stop-hook",
            run=_run_mailbox,
            reads_config=False,
            add_arguments=_rest_arguments(
                "read|done|fail|stop-hook ...", "'fleetrun mailbox help' lists them (docs/mailbox.md)"
            ),
        ),
    ]

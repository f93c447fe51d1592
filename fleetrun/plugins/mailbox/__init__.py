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
- ``fleetrun_verbs``: ``role`` and ``mailbox`` (:mod:`.cli`); the Stop hook has a fast
  path that loads no plugin (:mod:`.stophook`).

With ``-p no:mailbox`` none of this exists: a task with ``role`` is a validate error.
This module imports nothing heavy (no psutil, no sqlite3): ``fleetrun --help`` loads it.
The package: :mod:`.store` (its tables), :mod:`.liveness` (sessions, whoami),
:mod:`.owner` (the routing rule, pure), :mod:`.delivery`, :mod:`.host`, :mod:`.cli`,
:mod:`.stophook`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from ...hookimpl import hookimpl

if TYPE_CHECKING:
    from ...config import Config
    from ...reports import AgentResult, Handoff, SpawnSpec, Started

#: The host delivered attempts run on (:data:`.host.MAILBOX_HOST`, without importing it).
HOST_NAME = "mailbox"


@hookimpl(trylast=True)
def fleetrun_hosts(config: Config) -> list[Any]:
    from .host import MailboxHost

    return [MailboxHost(config)]


@hookimpl
def fleetrun_start_attempt(task: Any, attempt: Any, host: Any, spawn: SpawnSpec, prompt: str,
                           config: Config) -> Optional[Started]:
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
def fleetrun_agent_result(task: Any, attempt: Any, log_path: str, exit_code: Optional[int],
                          config: Config) -> Optional[AgentResult]:
    msg = _message_of(attempt, config)
    if msg is None:
        return None
    from ...reports import AgentResult

    done = msg.state == "done"
    # fleetrun paid for no session: the role's own session's cost is its user's
    return AgentResult(ok=done, reason="" if done else f"mailbox_{msg.state}", exit_code=0 if done else None,
                       cost_usd=0.0, result_text=(msg.summary if done else msg.reason) or "")


@hookimpl
def fleetrun_handoff(task: Any, attempt: Any, host: Any, config: Config) -> Optional[Handoff]:
    msg = _message_of(attempt, config)
    if msg is None:
        return None
    from ...reports import Handoff

    return Handoff(task_name=task.name, branch=task.branch, summary=msg.summary or "", host=task.host or "local",
                   fetch_hint=f"Done by role {msg.role} in its own session, in {task.spec.cwd}.")


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
    from ...queueing import WARNINGS_KEY
    from ...textutil import safe_name
    from .delivery import spec_always_spawned
    from .store import StoreError, check_name

    errors = []
    for t in roles:
        where = display_path(Path(t.file_of("role")), config.invocation_dir) if t.source else "?"
        line = t.key_lines.get("role", t.line)
        try:
            check_name(t.role)
        except StoreError as e:
            errors.append(UsageError(str(e), file=where, line=line, key=f"task '{safe_name(t.name)}': role"))
            continue
        why = spec_always_spawned(t)
        if why is not None:
            config.stash.setdefault(WARNINGS_KEY, []).append(
                f"{where}:{line}: task '{t.name}': role: {why}, so it is spawned, not delivered to role "
                f"{t.role} (a mailbox carries only the prompt)")
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
        VerbDecl(name="role", help="roles: role bind NAME [DIR] [--pid PID | --self], role list, role unbind NAME, "
                                   "role owner PATH, role whoami, role install-hooks [DIR], role note-edit",
                 run=_run_role, reads_config=False,
                 add_arguments=_rest_arguments("bind|list|unbind|owner|whoami ...",
                                               "'fleetrun role help' lists them (docs/mailbox.md)")),
        VerbDecl(name="mailbox", help="a role's mailbox: mailbox read [--role R] [--peek], mailbox done TASK "
                                      "[--summary TEXT], mailbox fail TASK --reason TEXT, mailbox stop-hook",
                 run=_run_mailbox, reads_config=False,
                 add_arguments=_rest_arguments("read|done|fail|stop-hook ...",
                                               "'fleetrun mailbox help' lists them (docs/mailbox.md)")),
    ]

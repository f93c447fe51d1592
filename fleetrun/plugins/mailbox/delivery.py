"""Routing and delivery: which attempts go to a role's mailbox instead of being spawned,
and the delivery itself (``fleetrun_start_attempt`` of the ``mailbox`` plugin).

An attempt is delivered when it is a fresh one, placed on this machine (``host.local``),
for a task that asks for no worktree (``git_ref``, ``branch``), ``model``,
``permission_mode``, ``budget_usd``, Claude Code options (``max_turns``, ``env``...) or
verifiers (a mailbox carries only the prompt),
and either the task names a ``role`` (it goes to that role, live or not: it waits in the
mailbox), or ``auto_route = true`` in policy.toml and a live role that can receive
(:mod:`.receiving`) owns its paths (:func:`~.owner.owner`). Everything else is left to the default, the shepherd.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any, Optional

from ... import clock, crash
from ...claudeopts import KEYS as CLAUDE_OPTIONS
from ...reports import Started
from . import store
from .host import MAILBOX_HOST

if TYPE_CHECKING:
    from ...config import Config


def always_spawned(task: Any, attempt: Any, host: Any) -> Optional[str]:
    """Why an attempt is never delivered, or None when it may be (pure)."""
    if attempt.kind != "fresh":
        return f"a {attempt.kind} attempt is always spawned"
    if not getattr(host, "local", False):
        return f"it was placed on {host.name}, another machine"
    return spec_always_spawned(task.spec)


def spec_always_spawned(spec: Any) -> Optional[str]:
    """Why a task (a :class:`~fleetrun.TaskSpec`) is never delivered, or None (pure)."""
    for key, what in (
        ("git_ref", "a worktree (git_ref)"),
        ("branch", "a worktree (branch)"),
        ("model", "a model"),
        ("permission_mode", "a permission mode"),
    ):
        if getattr(spec, key, None):
            return f"it asks for {what}"
    if spec.budget_usd is not None:
        return "it asks for a budget"
    asked = [k for k in CLAUDE_OPTIONS if k in (spec.extra or {})]
    if asked:  # a mailbox carries only the prompt to a session that is already running
        return f"it asks for Claude Code options ({', '.join(asked)})"
    if spec.verify:
        return "it has verifiers"
    return None


def route(task: Any, attempt: Any, host: Any, config: Config, conn: Any) -> Optional[tuple[str, str]]:
    """Where the attempt goes: (role name, why), or None to spawn it."""
    if always_spawned(task, attempt, host) is not None:
        return None
    if task.spec.role:
        return task.spec.role, f"role = {task.spec.role}"
    from ...policy import POLICY_KEY

    policy = config.stash.get(POLICY_KEY)
    if policy is None or not policy.auto_route:
        return None
    roles = store.roles(conn)
    if not roles:
        return None
    from .liveness import scan
    from .owner import focus, owner
    from .receiving import receptions

    # a live role whose sessions cannot receive (no fleetrun Stop hook in the settings they
    # started with) would hold the task until the claim timeout: it owns nothing here
    got = receptions(scan(), roles, config.home)
    foci = {key: focus(paths) for key, paths in store.edits(conn).items()}
    role, why = owner(task.spec.paths, task.spec.cwd, [r for r in roles if got[r.key].receives], foci)
    return (role.name, why) if role is not None else None


def deliver(task: Any, attempt: Any, host: Any, prompt: str, config: Config) -> Optional[Started]:
    """Deliver the attempt if it is routed to a role, else None (it is spawned).

    One transaction holds the message and the attempt moved onto the mailbox host as
    running: a crash right after it is adopted (the message is found, nothing is
    delivered twice); a crash before it left nothing (the attempt never started).
    """
    from ...ledger import open_ledger

    led = open_ledger(config)
    routed = route(task, attempt, host, config, led.conn)
    if routed is None:
        return None
    role, why = routed
    adir = config.home / "attempts" / attempt.id  # where MailboxHost.attempt_dir has it
    _write_prompt(adir, prompt)
    with store.tx(led.conn) as cur:
        mid = store.deliver(cur, role, task.id, attempt.id, prompt, why, clock.now())
        led.update_attempt(
            attempt.id,
            cur=cur,
            host=MAILBOX_HOST,
            state="running",
            started=time.time(),
            dir=str(adir),
            info={**attempt.info, "mailbox": {"role": role, "message": mid, "why": why}},
        )
    crash.point("after_delivery")
    return Started(
        pid=None,
        token=None,
        dir=str(adir),
        info={"role": role, "message": mid},
        host=MAILBOX_HOST,
        cause=f"assigned_via_mailbox:{why}",
    )


def _write_prompt(adir: Any, prompt: str) -> None:
    """The attempt folder's ``prompt``, as for a spawned attempt (``fleetrun logs``)."""
    from ...ledger import ensure_private_dir

    ensure_private_dir(adir)
    fd = os.open(adir / "prompt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(prompt)

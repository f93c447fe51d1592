"""The built-in plugins, by name: the one table in the core that names them.

Standard library only, so the command line can use it before pluggy is imported: the
built-ins (``-p no:NAME``), the verbs each declares (a blocked one's verbs say why they
are missing), the fast paths (verbs a plugin answers before any plugin manager is built)
and the built-ins that provide hosts and the keys of a task. Everything else in the core
reaches a plugin through a hook, never by name (``tests/test_imports.py``).
"""

from __future__ import annotations

from typing import Any, Optional

#: Built-in plugins, by the short name ``-p no:NAME`` uses, in registration order.
BUILTIN_PLUGINS: dict[str, str] = {
    "collect": "fleetrun.collect_plugin",
    "worktree": "fleetrun.plugins.worktree",
    "claude": "fleetrun.plugins.claude",
    "command_agent": "fleetrun.plugins.command_agent",
    "shepherd": "fleetrun.plugins.shepherd",
    "local": "fleetrun.plugins.local",
    "placement": "fleetrun.plugins.placement",
    "prompt": "fleetrun.plugins.prompt",
    "verify_run": "fleetrun.plugins.verify_run",
    "relay": "fleetrun.plugins.relay",
    "mailbox": "fleetrun.plugins.mailbox",
    "verify_brain": "fleetrun.plugins.verify_brain",
    "verify_agent": "fleetrun.plugins.verify_agent",
    "terminal": "fleetrun.plugins.terminal",
    "events": "fleetrun.plugins.events",
    "notify": "fleetrun.plugins.notify",
    "junitxml": "fleetrun.plugins.junitxml",
    "htmlreport": "fleetrun.plugins.htmlreport",
}

#: Verbs of built-in plugins, by plugin: when the plugin is blocked (``-p no:relay``)
#: its verbs do not exist, and the error says why rather than "not a file or a verb".
BLOCKED_PLUGIN_VERBS: dict[str, tuple[str, ...]] = {"relay": ("relay", "host"), "mailbox": ("role", "mailbox")}

#: ``fleetrun host status|log|stop|verify-status|verify-stop|bundle``, which a supervisor
#: polls over SSH, need only the home: the relay's peer side answers them before any
#: plugin manager is built (a module path, as :data:`BUILTIN_PLUGINS` names the built-ins).
#: So do ``fleetrun mailbox stop-hook`` and ``fleetrun role note-edit``, Claude Code's
#: Stop and PostToolUse hooks, run at every turn and every edit of every session in a
#: role's folder.
FAST_PATHS: dict[str, str] = {
    "host": "fleetrun.plugins.relay.peer.verbs",
    "mailbox": "fleetrun.plugins.mailbox.stophook",
    "role": "fleetrun.plugins.mailbox.noteedit",
}

#: The built-in that provides the host named ``local`` (this machine).
LOCAL_HOST_PLUGIN = "local"
#: The built-in that provides the hosts named in ``peers.toml`` (SSH peers).
PEER_HOSTS_PLUGIN = "relay"
#: Task keys only a built-in acts on, by key: a task that sets one needs that plugin
#: (``role``: the mailbox delivers the task to the role's session).
KEY_PLUGINS: dict[str, str] = {"role": "mailbox"}


def plugin_unavailable(pm: Any, name: str) -> Optional[str]:
    """Why the built-in ``name`` is not there (``blocked (-p no:NAME)`` or ``not
    loaded``), or None when it is loaded (or there is no plugin manager to ask)."""
    if pm is None or pm.get_plugin(name) is not None:
        return None
    return f"blocked (-p no:{name})" if pm.is_blocked(name) else "not loaded"

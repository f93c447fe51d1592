"""``host probe``: what this peer is and has (version, features, headroom, tools,
tags), the tool versions cached in the home for a few minutes.

Test hook: with ``FLEETRUN_FAKE_HEADROOM=/path/file.json`` set, ``probe`` reports the
numbers in that file (``free_mem_mb``, ``load_per_core``, ``free_disk_mb``) instead
of measuring them, so tests can give peers on one kernel different headroom.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from .admission import _drained, _host_lock, _hosted, _own_loop_running, _policy
from .request import HostError

if TYPE_CHECKING:
    from fleetrun.config import Config

TOOLS_CACHE = "probe-tools.json"
TOOLS_TTL_S = 300.0


def _headroom(config: Config) -> dict[str, Optional[float]]:
    fake = os.environ.get("FLEETRUN_FAKE_HEADROOM")
    if fake:  # a test hook: peers on one kernel all measure the same
        with open(fake, encoding="utf-8") as f:
            data = json.load(f)
        return {k: data.get(k) for k in ("free_mem_mb", "load_per_core", "free_disk_mb")}
    plugin = config.get_plugin("placement")
    measure = getattr(plugin, "measure_local", None)
    if measure is not None:
        return dict(measure(str(config.home)))
    import psutil

    return {
        "free_mem_mb": psutil.virtual_memory().available / 2**20,
        "load_per_core": os.getloadavg()[0] / (os.cpu_count() or 1),
        "free_disk_mb": psutil.disk_usage(str(config.home)).free / 2**20,
    }


def _tools(config: Config) -> tuple[dict[str, Optional[str]], list[str]]:
    """``TOOL --version`` of each probed tool (:mod:`fleetrun.probe`), and which have a
    credential; cached in the home for a few minutes (each probe starts processes)."""
    from fleetrun.probe import AUTH_CHECKS, probe_versions, tool_names
    from fleetrun.shepherd import read_json, write_json

    extra = config.setting("relay", "tools", []) or []
    names = tool_names(x for x in extra if isinstance(x, str)) if isinstance(extra, list) else tool_names()
    exes = {n: n for n in names}
    claude = config.setting("claude", "executable")
    if isinstance(claude, str) and claude:
        exes["claude"] = claude
    key = json.dumps([exes, os.environ.get("PATH", "")], sort_keys=True)
    cache_path = config.home / TOOLS_CACHE
    cache = read_json(str(cache_path)) or {}
    if cache.get("key") == key and time.time() - float(cache.get("time") or 0) < TOOLS_TTL_S:
        return dict(cache.get("tools") or {}), list(cache.get("auth") or [])
    tools = probe_versions(exes)
    home = Path(os.path.expanduser("~"))
    auth = sorted(n for n, check in AUTH_CHECKS.items() if n in tools and check(os.environ, home))
    from fleetrun.ledger import ensure_private_dir

    ensure_private_dir(config.home)
    write_json(str(cache_path), {"key": key, "time": time.time(), "tools": tools, "auth": auth})
    return tools, auth


def _tags(config: Config) -> list[str]:
    """``[relay] tags``: a list of strings (``tags = "gpu"`` is not the tags g, p, u)."""
    tags = config.setting("relay", "tags", [])
    if tags is None:
        return []
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise HostError(
            f"this peer's configuration is broken: {config.home / 'config.toml'}: [relay] tags must "
            f'be a list of strings, like tags = ["gpu"], not {json.dumps(tags)[:80]}'
        )
    return tags


def cmd_probe(config: Config, ns: argparse.Namespace) -> dict[str, Any]:
    import platform
    import socket

    from ....version import __version__
    from ..protocol import FEATURES, WORKER_PROTOCOL

    policy, policy_error = _policy(config)
    with _host_lock(config.home):
        hosted = _hosted(config)
    reply: dict[str, Any] = {
        "fleetrun": __version__,
        "features": list(FEATURES),
        "worker": WORKER_PROTOCOL,
        "hostname": socket.gethostname(),
        "os": platform.system().lower(),
        "arch": platform.machine(),
        "python": platform.python_version(),
        "home": str(config.home),
        "time": time.time(),
        "running": len(hosted) + _own_loop_running(config),
        "max_tasks": policy.local.max_tasks,
        "drain": _drained(config, policy),
        "tags": _tags(config),
        "mem_per_task_mb": policy.local.mem_per_task_mb,
    }
    reply["tools"], reply["auth"] = _tools(config)
    reply.update(_headroom(config))
    if policy_error:
        reply["policy_error"] = policy_error
    return reply

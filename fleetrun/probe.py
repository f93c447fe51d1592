"""Which tools this machine has, with their versions, and which have a credential.

A probe runs ``TOOL --version`` for each tool, all at once, each with a short
timeout, and keeps the first version-looking token it printed. Each probe starts a
process (``claude --version`` starts a Node runtime), so the results are cached for
:data:`PROBE_TTL_S` and the ``placement`` plugin probes only when a task waiting for a
place has ``requires``.

A tool is *present* when ``TOOL --version`` ran and exited 0; it is then listed with
its version, or with None when it printed nothing that looks like one (``tool`` is
met, ``tool>=N`` is not: an unknown is never plenty).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from .osutil import end_group

#: The tools probed on every machine, as the seed page lists them; ``[relay] tools``
#: in ``config.toml`` adds more.
PROBED_TOOLS: tuple[str, ...] = ("claude", "git", "cargo", "python3", "node")

PROBE_TTL_S = 600.0
PROBE_TIMEOUT_S = 5.0

_VERSION = re.compile(r"(?<![\w.])v?(\d+(?:\.\d+)+)")
_NUMBER = re.compile(r"(?<![\w.])v?(\d+)(?![\w.])")


def parse_version(text: str) -> Optional[str]:
    """The first version-looking token in ``text``: ``2.43.0`` from ``git version
    2.43.0``, ``22.3.0`` from ``v22.3.0``; a dotted number first, else a bare one."""
    m = _VERSION.search(text) or _NUMBER.search(text)
    return m.group(1) if m else None


def tool_names(extra: Iterable[str] = ()) -> list[str]:
    """The probed tools plus ``extra`` (``[relay] tools``), in order, without repeats."""
    out: list[str] = []
    for name in (*PROBED_TOOLS, *extra):
        if isinstance(name, str) and name and name not in out:
            out.append(name)
    return out


def probe_versions(tools: Mapping[str, str], timeout: float = PROBE_TIMEOUT_S) -> dict[str, Optional[str]]:
    """Run ``EXECUTABLE --version`` for every tool at once.

    :param tools: tool name -> executable (a name looked up on ``PATH``, or a path).
    :param timeout: seconds all of them together may take; one still running then is
        killed and counts as missing.
    :return: the present tools, name -> version (None: present, version unknown).
    """
    running: dict[str, subprocess.Popen[bytes]] = {}
    for name, exe in tools.items():
        path = shutil.which(exe)
        if path is None:
            continue
        try:
            running[name] = subprocess.Popen(
                [path, "--version"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError:
            continue
    deadline = time.monotonic() + timeout
    found: dict[str, Optional[str]] = {}
    for name, proc in running.items():
        try:
            out, _ = proc.communicate(timeout=max(0.01, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            # the whole group: a child holding the pipe would keep us waiting
            if not end_group(proc.pid, None, grace_s=0):
                proc.kill()
            proc.communicate()
            continue
        if proc.returncode == 0:
            found[name] = parse_version(out.decode(errors="replace"))
    return {name: found[name] for name in tools if name in found}


def claude_auth(env: Mapping[str, str], home: Path) -> bool:
    """Whether Claude Code has a credential here, checked without a network call.

    An API key or token in the environment (``ANTHROPIC_API_KEY``,
    ``ANTHROPIC_AUTH_TOKEN``, ``CLAUDE_CODE_OAUTH_TOKEN``), Bedrock or Vertex turned
    on, or a logged-in configuration: ``.credentials.json`` holding a token, or
    ``.claude.json`` naming an ``oauthAccount`` (on macOS the token itself is in the
    Keychain). The configuration lives in ``$CLAUDE_CONFIG_DIR`` when that is set,
    else ``~/.claude`` and ``~/.claude.json``.
    """
    for key in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN"):
        if env.get(key, "").strip():
            return True
    for key in ("CLAUDE_CODE_USE_BEDROCK", "CLAUDE_CODE_USE_VERTEX"):
        if env.get(key, "").strip() not in ("", "0", "false"):
            return True
    cfg_dir = env.get("CLAUDE_CONFIG_DIR")
    if cfg_dir:
        creds, state = Path(cfg_dir) / ".credentials.json", Path(cfg_dir) / ".claude.json"
    else:
        creds, state = home / ".claude" / ".credentials.json", home / ".claude.json"
    data = _read_json(creds)
    if isinstance(data, dict) and any(data.values()):
        return True
    data = _read_json(state)
    return isinstance(data, dict) and bool(data.get("oauthAccount"))


def _read_json(path: Path) -> object:
    try:
        if path.stat().st_size > 16 * 2**20:
            return None
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


#: How ``tool:auth`` is checked, per tool; a tool not listed never has ``:auth``.
AUTH_CHECKS: dict[str, Callable[[Mapping[str, str], Path], bool]] = {"claude": claude_auth}


@dataclass
class ToolProbe:
    """What one probe found."""

    tools: dict[str, Optional[str]] = field(default_factory=dict)
    auth: frozenset[str] = frozenset()
    at: float = 0.0


class Prober:
    """Probes this machine's tools at most once per ``ttl`` seconds (one per process:
    the ``placement`` plugin keeps it in ``config.stash``)."""

    def __init__(
        self, ttl: float = PROBE_TTL_S, timeout: float = PROBE_TIMEOUT_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ttl = ttl
        self.timeout = timeout
        self.clock = clock
        self._last: Optional[ToolProbe] = None
        self._key: Optional[tuple[object, ...]] = None
        self.runs = 0

    def get(self, tools: Mapping[str, str]) -> ToolProbe:
        """The cached probe of ``tools`` (name -> executable), probing when stale."""
        key = (*sorted(tools.items()), os.environ.get("PATH", ""))
        now = self.clock()
        if self._last is not None and self._key == key and now - self._last.at < self.ttl:
            return self._last
        self.runs += 1
        found = probe_versions(tools, self.timeout)
        home = Path(os.path.expanduser("~"))
        auth = frozenset(n for n, check in AUTH_CHECKS.items() if n in found and check(os.environ, home))
        self._last = ToolProbe(found, auth, now)
        self._key = key
        return self._last

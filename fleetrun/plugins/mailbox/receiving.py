"""Whether a role's live session can receive its mail: fleetrun's Stop hook must be in
the settings Claude Code read for that session (issue 22).

A session is handed a task only by its Stop hook (``fleetrun mailbox stop-hook``), so a
session whose settings lack it never takes its role's mail, however long it is home.
Claude Code reads hooks, when a session starts, from the settings of these sources
(``--setting-sources`` may name fewer of the last three; ``--settings`` adds one):

- the managed settings, ``/etc/claude-code/managed-settings.json``;
- the user's, ``$CLAUDE_CONFIG_DIR/settings.json``, else ``~/.claude/settings.json``
  (of the session's own environment);
- the project's and the local ones, ``.claude/settings.json`` and
  ``.claude/settings.local.json`` of the folder the session **started in** (measured:
  not of a parent folder, nor of one it later works in). That is the session process's
  cwd: Claude Code keeps its process there and moves only its Bash tool's shell;
- ``--settings FILE|JSON`` on its command line.

A Stop hook is fleetrun's for this home when its command ends in ``mailbox stop-hook``,
runs a fleetrun (``.../fleetrun`` or ``... -m fleetrun``, perhaps behind ``env`` or
``uv run``), and names this home (with ``--home``, else ``FLEETRUN_HOME=`` before it,
else the session's ``$FLEETRUN_HOME``, else ``~/.fleetrun``). A hook in a
file written after the session started does not count (Claude Code took its hooks at
the start), nor does any with ``disableAllHooks`` set in a file it read.

A bound process that is not a Claude Code session (a terminal, a script that runs
``mailbox read``) is taken at its word: it may receive. Everything here reads what an
agent may have written (its folder's settings, its process's environment), strictly:
a file that is not a regular file, too large, or not JSON counts as holding no hook,
as Claude Code skips it; nothing here raises on it.
"""

from __future__ import annotations

import json
import os
import shlex
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from .liveness import ProcTable, answers_to
from .store import Role

#: Claude Code's managed settings on Linux (an administrator's; hooks there run too).
MANAGED_SETTINGS = "/etc/claude-code/managed-settings.json"
#: A settings file larger than this holds no hook we read (Claude Code's are a few KB).
MAX_SETTINGS = 4 * 1024 * 1024
#: The sources ``--setting-sources`` names (all three by default).
SOURCES = ("user", "project", "local")
#: A file written this soon after a session's start time still counts as read at the
#: start (the start time is the process's, the settings are read a little later).
_START_SLACK_S = 1.0


@dataclass(frozen=True)
class Reception:
    """Whether a live role can be handed its mail, and why not.

    :ivar live: a process bound to it runs, or a session answers to it.
    :ivar why_live: how it is live (``pid 42 runs``), or "".
    :ivar problem: why none of its homes can receive (each session's reason, joined),
        or None: one can (or it is not live).
    :ivar sessions: the pids of the Claude Code sessions home for it.
    """

    live: bool
    why_live: str = ""
    problem: Optional[str] = None
    sessions: tuple[int, ...] = field(default_factory=tuple)

    @property
    def receives(self) -> bool:
        """Live, and a home of it can take its mail."""
        return self.live and self.problem is None


def receptions(table: ProcTable, roles: Sequence[Role], home: Path) -> dict[str, Reception]:
    """Every role's :class:`Reception`, by key: its homes are its bound process, when it
    runs, and the sessions that answer to it (whoami)."""
    homes: dict[str, list[tuple[int, str]]] = {}
    for r in roles:
        if table.alive(r.pid, r.pid_started) and r.pid is not None:
            homes.setdefault(r.key, []).append((r.pid, f"pid {r.pid} runs"))
    for s in table.sessions():
        role, _ = answers_to(table, s.pid, s.cwd, roles)
        if role is not None and all(pid != s.pid for pid, _ in homes.get(role.key, [])):
            homes.setdefault(role.key, []).append((s.pid, f"session {s.pid} answers to it"))
    out: dict[str, Reception] = {}
    for r in roles:
        found = homes.get(r.key)
        if not found:
            out[r.key] = Reception(live=False)
            continue
        problems: list[str] = []
        sessions: list[int] = []
        for pid, _ in found:
            proc = table.procs.get(pid)
            if proc is None or not proc.session:
                problems = []  # not a Claude Code session: it reads its mail its own way
                break
            sessions.append(pid)
            problem = session_problem(pid, proc.cwd, proc.started, home)
            if problem is None:
                problems = []
                break
            problems.append(problem if len(found) == 1 else f"session {pid}: {problem}")
        out[r.key] = Reception(
            live=True, why_live=found[0][1], problem="; ".join(problems) or None, sessions=tuple(sessions)
        )
    return out


def session_problem(pid: int, cwd: Optional[str], started: float, home: Path) -> Optional[str]:
    """Why the Claude Code session ``pid`` (started in ``cwd`` at ``started``) cannot
    receive mail of the fleetrun home ``home``, or None when it can."""
    env, argv = _environ_and_cmdline(pid)
    if not cwd:
        return "its working directory cannot be read, so neither can the settings it started with"
    files = settings_files(cwd, env, argv)
    late: Optional[str] = None
    found = False
    for path, data in _loaded(files, cwd, argv):
        if data.get("disableAllHooks") is True:
            return f"disableAllHooks is set in {path}, so no hook of it runs"
        if has_stop_hook(data, home, env):
            if path != "--settings" and _mtime(path) > started + _START_SLACK_S:
                late = path
            else:
                found = True
    if found:
        return None
    local = os.path.join(cwd, ".claude", "settings.local.json")
    if late is not None:
        return (
            f"fleetrun's Stop hook was written to {late} after the session started, and Claude Code "
            f"reads hooks when a session starts (start the session again)"
        )
    return (
        f"fleetrun's Stop hook is not in {local} nor in the other settings it started with (run fleetrun "
        f"role install-hooks {shlex.quote(cwd)}, then start the session again)"
    )


def settings_files(cwd: str, env: dict[str, str], argv: Sequence[str]) -> list[str]:
    """The settings files a session started in ``cwd`` reads, with ``env`` and ``argv``
    (its environment and command line); ``"--settings"`` stands for that option's JSON."""
    sources = list(SOURCES)
    named = _option(argv, "--setting-sources")
    if named is not None:
        sources = [s.strip() for s in named.split(",") if s.strip() in SOURCES]
    base = env.get("CLAUDE_CONFIG_DIR") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".claude")
    paths = {
        "user": os.path.join(base, "settings.json"),
        "project": os.path.join(cwd, ".claude", "settings.json"),
        "local": os.path.join(cwd, ".claude", "settings.local.json"),
    }
    files = [MANAGED_SETTINGS, *(paths[s] for s in SOURCES if s in sources)]
    if _option(argv, "--settings") is not None:
        files.append("--settings")
    return files


def has_stop_hook(data: dict[str, Any], home: Path, env: dict[str, str]) -> bool:
    """Whether settings ``data`` hold a Stop hook of fleetrun's for ``home``."""
    hooks = data.get("hooks")
    groups = hooks.get("Stop") if isinstance(hooks, dict) else None
    for group in groups if isinstance(groups, list) else []:
        entries = group.get("hooks") if isinstance(group, dict) else None
        for entry in entries if isinstance(entries, list) else []:
            if (
                isinstance(entry, dict)
                and entry.get("type") == "command"
                and isinstance(entry.get("command"), str)
                and is_stop_hook_of(entry["command"], home, env)
            ):
                return True
    return False


def is_stop_hook_of(command: str, home: Path, env: dict[str, str]) -> bool:
    """Whether ``command`` runs ``fleetrun [--home H] mailbox stop-hook`` for ``home``
    (run with the session's environment ``env``)."""
    try:
        words = shlex.split(command)
    except ValueError:
        return False
    if len(words) < 3 or words[-2:] != ["mailbox", "stop-hook"]:
        return False
    head = words[:-2]
    named: Optional[str] = None
    env = dict(env)
    program = False  # a fleetrun runs: `.../fleetrun`, `... -m fleetrun`, behind `env` or `uv run`
    for i, word in enumerate(head):
        if not program and "=" in word and not word.startswith("-"):
            key, _, value = word.partition("=")  # `FLEETRUN_HOME=/x fleetrun ...`, `env FLEETRUN_HOME=/x ...`
            env[key] = value
        elif os.path.basename(word) == "fleetrun":
            program = True
        elif word == "--home" and i + 1 < len(head):
            named = head[i + 1]
        elif word.startswith("--home="):
            named = word[len("--home=") :]
    if not program:
        return False
    theirs = named or env.get("FLEETRUN_HOME") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".fleetrun")
    return os.path.realpath(os.path.expanduser(theirs)) == os.path.realpath(home)


def _option(argv: Sequence[str], name: str) -> Optional[str]:
    """The value of ``name`` on a command line (``--name V`` or ``--name=V``), or None."""
    for i, word in enumerate(argv):
        if word == name and i + 1 < len(argv):
            return argv[i + 1]
        if word.startswith(name + "="):
            return word[len(name) + 1 :]
    return None


def _environ_and_cmdline(pid: int) -> tuple[dict[str, str], list[str]]:
    import psutil

    try:
        p = psutil.Process(pid)
        env = {k: str(v) for k, v in p.environ().items() if k in ("HOME", "CLAUDE_CONFIG_DIR", "FLEETRUN_HOME")}
        argv = [str(w) for w in p.cmdline()]
    except (psutil.Error, OSError):
        return {}, []
    return env, argv


def _loaded(files: list[str], cwd: str, argv: Sequence[str]) -> list[tuple[str, dict[str, Any]]]:
    """(file, its object) of the files that hold one; ``--settings`` is its option's
    JSON, or the file it names (relative to ``cwd``)."""
    out = []
    for path in files:
        if path == "--settings":
            value = (_option(argv, "--settings") or "").strip()
            if not value.startswith("{"):
                path = os.path.join(cwd, value)
                data = _read_settings(path)
            else:
                try:
                    data = json.loads(value)
                except (ValueError, RecursionError):
                    data = None
                data = data if isinstance(data, dict) else None
        else:
            data = _read_settings(path)
        if data is not None:
            out.append((path, data))
    return out


def _read_settings(path: str) -> Optional[dict[str, Any]]:
    """A settings file's object, or None (missing, not a regular file, too large, not a
    JSON object: Claude Code skips such a file too)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO put there must not hang us
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_SETTINGS:
            return None
        with os.fdopen(os.dup(fd), "rb") as f:
            raw = f.read(MAX_SETTINGS + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0

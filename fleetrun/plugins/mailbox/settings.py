"""fleetrun's Claude Code hooks and allow rules, merged into a settings file and taken
out again (``fleetrun role install-hooks [DIR] [--remove] [--user]``, issue 13).

What is added: a ``Stop`` hook running ``<command> mailbox stop-hook`` (it delivers a
role's mail), a ``PostToolUse`` hook on ``Write|Edit|MultiEdit`` running ``<command>
role note-edit`` (it credits the edit to the role, for focus), and the allow rules
``Bash(<command> mailbox done:*)``, ``fail`` and ``read``, so the session can report
back in ``-p`` mode without asking.

Where: ``<DIR>/.claude/settings.local.json``. The hooks name this machine's fleetrun and
home, so they belong to one user on one machine, and that file is Claude Code's per-user,
never-committed one; and, measured with the real CLI (issue 13), a Bash allow rule takes
effect there in ``-p`` mode and not in the project's ``settings.json``. ``--user`` writes
the user's ``settings.json`` instead (every directory).

The role's directory is one the agent writes, so nothing here follows a link out of it:
a symlinked ``.claude/`` or settings file is refused, and every file operation goes
through a descriptor of the folder that was checked.
"""

from __future__ import annotations

import errno
import json
import os
import shlex
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

from fleetrun.exceptions import UsageError
from fleetrun.textutil import LINES, safe_text

from .hookio import check_command

#: The matcher of the PostToolUse hook: the built-in tools that edit a file.
EDIT_MATCHER = "Write|Edit|MultiEdit"
#: Seconds Claude Code gives each hook. Both answer in well under a second; a ledger
#: held locked must cost a turn a few seconds at most, not the CLI's default minute.
HOOK_TIMEOUT = 10
#: The verbs a role's session runs to report back, given allow rules.
REPORT_VERBS = ("done", "fail", "read")
#: A settings file larger than this is refused (Claude Code's are a few KB).
MAX_SETTINGS = 4 * 1024 * 1024

LOCAL_SETTINGS = "settings.local.json"

StrPath = Union[str, "os.PathLike[str]"]


@dataclass
class Change:
    """What :func:`install` did to one settings file.

    :ivar path: the settings file.
    :ivar added: what was added, one line each (``Stop hook: ...``).
    :ivar removed: what was taken out, one line each.
    :ivar remove: True when this was a removal.
    """

    path: Path
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    remove: bool = False

    @property
    def changed(self) -> bool:
        """True when the file was written (or deleted)."""
        return bool(self.added or self.removed)

    def describe(self) -> str:
        """What happened, for the terminal: one line, then one line per item (control
        characters in a path made visible)."""
        if not self.changed:
            if self.remove:
                text = f"{self.path}: no fleetrun hooks or rules there; nothing to remove"
            else:
                text = f"{self.path}: fleetrun's hooks and rules are already installed; nothing changed"
        else:
            verb, items = ("removed from", self.removed) if self.remove else ("added to", self.added)
            text = "\n".join([f"{verb} {self.path}:", *(f"  {item}" for item in items)])
        return safe_text(text, keep=LINES)


def stop_command(command: str) -> str:
    """The Stop hook's command line."""
    return f"{command} mailbox stop-hook"


def edit_command(command: str) -> str:
    """The PostToolUse hook's command line."""
    return f"{command} role note-edit"


def allow_rules(command: str) -> list[str]:
    """The allow rules that let a session run the report verbs without asking."""
    return [f"Bash({command} mailbox {verb}:*)" for verb in REPORT_VERBS]


def default_command(home: Optional[StrPath] = None) -> str:
    """How this machine runs this fleetrun, for a hook to call it back.

    The ``fleetrun`` console script next to the running interpreter (the one pip put in
    this install's ``bin/``), else ``<interpreter> -m fleetrun``: either names this very
    install, whatever a session's ``PATH`` holds, which ``fleetrun`` alone would not. The
    interpreter's path is kept as it is (a venv's ``python`` is a link out of the venv;
    resolving it would leave the venv). ``--home`` is added when ``home`` is not
    ``~/.fleetrun``: a session's environment is not fleetrun's, so ``$FLEETRUN_HOME``
    cannot be counted on there.

    :param home: the fleetrun home the hooks are for (None: the default).
    :return: the command line, words quoted as a shell reads them.
    :raises UsageError: when the paths make a command Claude Code would not run
        without asking (a quote or a ``$(`` in them): pass a command of your own.
    """
    script = Path(sys.executable).parent / "fleetrun"
    if script.is_file() and os.access(script, os.X_OK):
        words = [str(script)]
    else:
        words = [sys.executable, "-m", "fleetrun"]
    if home is not None:
        canonical = os.path.realpath(home)
        if canonical != os.path.realpath(Path.home() / ".fleetrun"):
            words += ["--home", canonical]
    return _checked(" ".join(shlex.quote(w) for w in words))


def _checked(command: str) -> str:
    try:
        return check_command(command)
    except ValueError as e:
        raise UsageError(f"{e}: the hooks and allow rules would name it", key="command") from None


def user_settings_path() -> Path:
    """The user's Claude Code settings: ``$CLAUDE_CONFIG_DIR/settings.json``, else
    ``~/.claude/settings.json`` (where Claude Code reads them)."""
    base = os.environ.get("CLAUDE_CONFIG_DIR")
    return (Path(base) if base else Path.home() / ".claude") / "settings.json"


def install(
    dir: StrPath, command: str, remove: bool = False, user: bool = False, home_settings: Optional[StrPath] = None
) -> Change:
    """Merge fleetrun's hooks and allow rules into a settings file, or take them out.

    Merging keeps everything else as it was (the user's hooks, matchers, rules, unknown
    keys, their order); what is already there is not added twice, so a second install
    changes nothing. Removal takes out exactly the entries that name ``command``
    (another install's, with another command, stays), and the lists, objects and file
    that held only them. A file is written only when it changes: atomically (a temp
    file renamed over it), 0600 when new, with its mode kept when not.

    :param dir: the role's directory (must exist; made canonical): the file is its
        ``.claude/settings.local.json``, and ``.claude/`` is made 0700 when missing.
    :param command: how this machine runs fleetrun (:func:`default_command`).
    :param remove: take fleetrun's entries out instead.
    :param user: write the user's settings instead (``dir`` is then not used).
    :param home_settings: the user's settings file (default :func:`user_settings_path`).
    :return: what changed.
    :raises UsageError: a directory that does not exist, a symlinked ``.claude/`` or
        settings file, a file that is not a JSON object or whose hooks or permissions
        are of the wrong shape (the file is left untouched), or a bad ``command``.
    """
    command = _checked(command)
    if user:
        file = Path(home_settings) if home_settings is not None else user_settings_path()
        # the user's own folder, not one an agent writes: a link to it (dotfiles) is theirs
        folder = Path(os.path.realpath(file.parent))
        base, sub, name = folder.parent, folder.name, file.name
    else:
        root = Path(os.path.realpath(dir))
        if not root.is_dir():
            raise UsageError(f"{dir}: not a directory", key="role install-hooks")
        base, sub, name = root, ".claude", LOCAL_SETTINGS
    path = base / sub / name
    change = Change(path=path, remove=remove)
    base_fd = _open_dir(base, path)
    try:
        folder_fd = _open_sub(base_fd, sub, path, create=not remove)
        if folder_fd is None:
            return change
        try:
            _update(folder_fd, name, path, command, change)
        finally:
            os.close(folder_fd)
    finally:
        os.close(base_fd)
    return change


# --------------------------------------------------------------------------- the folder


def _open_dir(path: Path, what: Path) -> int:
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as e:
        raise UsageError(f"cannot open {path}: {e.strerror}", file=str(what)) from None


def _open_sub(base_fd: int, sub: str, what: Path, create: bool) -> Optional[int]:
    """The settings folder, opened without following a link; made 0700 when missing
    (and ``create``). None when it is missing and not to be made."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    try:
        return os.open(sub, flags, dir_fd=base_fd)
    except FileNotFoundError:
        if not create:
            return None
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            kind = "a symbolic link" if _is_link(base_fd, sub) else "not a directory"
            raise UsageError(f"{what.parent} is {kind}: fleetrun does not follow it", file=str(what)) from None
        raise UsageError(f"cannot open {what.parent}: {e.strerror}", file=str(what)) from None
    os.mkdir(sub, 0o700, dir_fd=base_fd)
    fd = os.open(sub, flags, dir_fd=base_fd)
    os.fchmod(fd, 0o700)  # whatever the umask
    return fd


def _is_link(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


# --------------------------------------------------------------------------- the file


def _update(folder_fd: int, name: str, path: Path, command: str, change: Change) -> None:
    text, mode = _read(folder_fd, name, path)
    if text is None:
        if change.remove:
            return
        data: dict[str, Any] = {}
    else:
        data = _parse(text, path)
    if change.remove:
        change.removed = _remove(data, command)
    else:
        change.added = _add(data, command)
    if not change.changed:
        return
    if not data:  # it held only what fleetrun added
        os.unlink(name, dir_fd=folder_fd)
        return
    try:
        raw = (json.dumps(data, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate ("\\ud800" in the file) stays escaped
        raw = (json.dumps(data, indent=2) + "\n").encode("ascii")
    _write(folder_fd, name, raw, mode)


def _read(folder_fd: int, name: str, path: Path) -> tuple[Optional[str], Optional[int]]:
    """The file's text and mode, or (None, None) when there is none."""
    try:
        # O_NONBLOCK: a FIFO put there must not hang the open; it is refused below
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder_fd)
    except FileNotFoundError:
        return None, None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UsageError(
                f"{path} is a symbolic link: fleetrun does not follow it; put a file there, or use another directory",
                file=str(path),
            ) from None
        raise UsageError(f"cannot read it: {e.strerror}", file=str(path)) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UsageError("not a regular file", file=str(path))
        if st.st_size > MAX_SETTINGS:
            raise UsageError(f"larger than {MAX_SETTINGS} bytes: not a settings file", file=str(path))
        chunks = []
        while True:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(fd)
    try:
        return b"".join(chunks).decode("utf-8"), stat.S_IMODE(st.st_mode)
    except UnicodeDecodeError:
        raise UsageError("is not JSON (not UTF-8): fix or remove it, then install again", file=str(path)) from None


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:  # rewritten, one of the two would be lost
            raise ValueError(f"key {key!r} appears twice")
        out[key] = value
    return out


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _parse(text: str, path: Path) -> dict[str, Any]:
    """The file's object, its hooks and permissions checked for the shape merging needs."""

    def refuse(what: str) -> UsageError:
        return UsageError(f"{what}: fix or remove it, then install again", file=str(path))

    try:
        data = json.loads(text, object_pairs_hook=_pairs, parse_constant=_constant)
    except RecursionError:
        raise refuse("is not JSON (nested too deeply)") from None
    except ValueError as e:
        why = str(e) if "appears twice" in str(e) else f"is not JSON ({e})"
        raise refuse(why) from None
    if not isinstance(data, dict):
        raise refuse("is not a JSON object")
    # a null is the wrong shape too: merging would have to replace it
    hooks = data.get("hooks", {})
    if not isinstance(hooks, dict):
        raise refuse("hooks is not an object")
    for event in ("Stop", "PostToolUse"):
        groups = hooks.get(event, [])
        if not isinstance(groups, list):
            raise refuse(f"hooks.{event} is not a list")
        for i, group in enumerate(groups):
            if not isinstance(group, dict):
                raise refuse(f"hooks.{event}[{i}] is not an object")
            entries = group.get("hooks", [])
            if not isinstance(entries, list):
                raise refuse(f"hooks.{event}[{i}].hooks is not a list")
            for j, entry in enumerate(entries):
                if not isinstance(entry, dict):
                    raise refuse(f"hooks.{event}[{i}].hooks[{j}] is not an object")
    perms = data.get("permissions", {})
    if not isinstance(perms, dict):
        raise refuse("permissions is not an object")
    allow = perms.get("allow", [])
    if not (isinstance(allow, list) and all(isinstance(r, str) for r in allow)):
        raise refuse("permissions.allow is not a list of strings")
    return data


def _ours(command: str) -> list[tuple[str, Optional[str], str]]:
    """fleetrun's hooks: (event, matcher, command line)."""
    return [("Stop", None, stop_command(command)), ("PostToolUse", EDIT_MATCHER, edit_command(command))]


def _has(groups: list[Any], line: str) -> bool:
    return any(entry.get("command") == line for group in groups for entry in group.get("hooks", []))


def _add(data: dict[str, Any], command: str) -> list[str]:
    added: list[str] = []
    for event, matcher, line in _ours(command):
        groups = data.get("hooks", {}).get(event, [])
        if _has(groups, line):
            continue
        group: dict[str, Any] = {} if matcher is None else {"matcher": matcher}
        group["hooks"] = [{"type": "command", "command": line, "timeout": HOOK_TIMEOUT}]
        data.setdefault("hooks", {}).setdefault(event, []).append(group)
        added.append(f"{event} hook{f' ({matcher})' if matcher else ''}: {line}")
    for rule in allow_rules(command):
        allow = data.get("permissions", {}).get("allow", [])
        if rule not in allow:
            data.setdefault("permissions", {}).setdefault("allow", []).append(rule)
            added.append(f"allow rule: {rule}")
    return added


def _remove(data: dict[str, Any], command: str) -> list[str]:
    removed: list[str] = []
    hooks = data.get("hooks")
    for event, _, line in _ours(command):
        if not isinstance(hooks, dict) or event not in hooks:
            continue
        before = len(removed)
        kept_groups = []
        for group in hooks[event]:
            entries = group.get("hooks", [])
            kept = [e for e in entries if e.get("command") != line]
            if len(kept) < len(entries):
                removed.append(f"{event} hook: {line}")
                if not kept:
                    continue  # the group held only fleetrun's hook
                group["hooks"] = kept
            kept_groups.append(group)
        if len(removed) == before:
            continue  # untouched, as it was
        if kept_groups:
            hooks[event] = kept_groups
        else:
            del hooks[event]
    if isinstance(hooks, dict) and not hooks and removed:
        del data["hooks"]  # it held only fleetrun's hooks
    perms = data.get("permissions")
    if isinstance(perms, dict) and isinstance(perms.get("allow"), list):
        rules = allow_rules(command)
        gone = [r for r in perms["allow"] if r in rules]
        if gone:
            removed += [f"allow rule: {r}" for r in gone]
            perms["allow"] = [r for r in perms["allow"] if r not in rules]
            if not perms["allow"]:
                del perms["allow"]
                if not perms:
                    del data["permissions"]
    return removed


def _write(folder_fd: int, name: str, raw: bytes, mode: Optional[int]) -> None:
    """``raw`` into ``name``, atomically: a temp file beside it, renamed over it."""
    tmp = f".{name}.fleetrun-{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=folder_fd)
    try:
        try:
            os.fchmod(fd, 0o600 if mode is None else mode)
            view = memoryview(raw)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=folder_fd)
        except OSError:
            pass
        raise
    os.fsync(folder_fd)

"""Render a command line that is only read, recording what its answer is read from,
and keep the answer in the home's cache (:mod:`fleetrun.helpcache` reads it back).

The recording sees what the run really consulted, not a list kept by hand: every
environment variable read (``os.environ`` watched), every path ``os.stat``/``os.lstat``
looked at (``pathlib``'s ``exists``, ``is_file``, ``resolve`` go through them: the project
files and ``.git`` folders looked for and not there), every file opened and folder listed
(an audit hook: the entry points' ``entry_points.txt`` and the ``sys.path`` folders),
and, once it is done, the source of every module loaded that is not the standard
library's (fleetrun's, pluggy's, the plugins', editable installs' finders), with the
folder each is in and every folder of ``sys.path``. The interpreter's own files are
its version's.

An answer is kept only when nothing else could have shaped it: exit code 0, nothing on
stderr, no built-in loaded beyond those reading a command line needs, and no write,
process, socket or database on the way (the audit hook's events). Writing the cache is
best effort: a home that is not there is not made for it (``--help`` makes none), and
a cache that cannot be written is no error.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Callable, Iterator, MutableMapping, Optional, TextIO, Union

from . import helpcache

#: Kept at most, the last ones written.
MAX_ENTRIES = 32
#: A file or folder changed less than this ago keeps no answer (ns).
RACY_NS = 2_000_000_000
#: Environment variables an answer depends on even when they were not read.
ALWAYS_ENV = (
    "COLUMNS",
    "LINES",
    "HOME",
    "FLEETRUN_HOME",
    "FLEETRUN_PLUGINS",
    "FLEETRUN_DISABLE_PLUGIN_AUTOLOAD",
    "FLEETRUN_ADDOPTS",
    "LANGUAGE",
    "LC_ALL",
    "LC_MESSAGES",
    "LANG",
    "LC_CTYPE",
    "PYTHONIOENCODING",
    "PYTHONUTF8",
    "NO_COLOR",
    "FORCE_COLOR",
    "PYTHON_COLORS",
    "TERM",
)
#: Audit events after which an answer is not kept: it wrote, ran or asked something
#: the recording cannot follow.
UNSAFE_EVENTS = (
    "os.mkdir",
    "os.rename",
    "os.remove",
    "os.rmdir",
    "os.symlink",
    "os.link",
    "os.truncate",
    "os.chmod",
    "os.chown",
    "os.utime",
    "os.chflags",
    "os.posix_spawn",
    "os.spawn",
    "os.exec",
    "os.fork",
    "os.forkpty",
    "os.system",
    "os.kill",
    "os.killpg",
    "os.putenv",
    "os.unsetenv",
    "os.chdir",
    "subprocess.",
    "socket.",
    "sqlite3.",
    "shutil.",
    "pty.",
    "ctypes.",
    "tempfile.",
    "urllib.",
    "http.",
    "ftplib.",
    "smtplib.",
    "webbrowser.",
    "winreg.",
    "glob.",
)
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_STDLIB = os.path.dirname(os.__file__)


class Recording:
    """What one render read; :meth:`watch` installs the watchers, for its duration."""

    def __init__(self) -> None:
        self.env: dict[str, Optional[str]] = {}
        self.sigs: dict[tuple[int, str], Optional[tuple[int, ...]]] = {}
        self.unsafe: list[str] = []
        self.active = False

    def note_env(self, name: object, value: Optional[str]) -> None:
        if self.active and isinstance(name, str):
            self.env.setdefault(name, value)

    def note_path(self, kind: int, path: Any, sig: Optional[tuple[int, ...]]) -> None:
        """``path`` looked at (``kind``: helpcache's ``STAT``, ``LSTAT``, ``LISTED``), what
        it was then. A path that cannot be named (an fd, an odd object) keeps no answer."""
        if not self.active:
            return
        try:
            p = os.path.abspath(os.fsdecode(path))
        except Exception:
            self.unsafe.append(f"cannot name {path!r}")
            return
        self.sigs.setdefault((kind, p), sig)

    def audit(self, event: str, args: tuple[Any, ...]) -> None:
        """An audit event (``sys.addaudithook``) during the render. Never raises: a
        recording that went wrong keeps no answer, and the run goes on as it would."""
        if not self.active:
            return
        try:
            self._audit(event, args)
        except Exception:
            self.unsafe.append(f"cannot record {event}")

    def _audit(self, event: str, args: tuple[Any, ...]) -> None:
        if event == "open":
            path, mode, flags = args
            writes = (
                any(c in mode for c in "wax+")
                if isinstance(mode, str)
                else bool(flags & _WRITE_FLAGS)
            )
            if writes:
                if not _bytecode(path):  # the interpreter caching what it compiled
                    self.unsafe.append(f"open {path!r} for writing")
            elif isinstance(path, (str, bytes)) and not _ignored(os.fsdecode(path)):
                self.note_path(
                    helpcache.STAT, path, helpcache.signature(helpcache.STAT, os.fsdecode(path))
                )
        elif event in ("os.listdir", "os.scandir"):
            path = args[0] if args and args[0] is not None else "."
            if isinstance(path, (str, bytes)):
                self.note_path(
                    helpcache.LISTED, path, helpcache.signature(helpcache.LISTED, os.fsdecode(path))
                )
        elif event.startswith(UNSAFE_EVENTS):
            paths = [a for a in args[:2] if isinstance(a, (str, bytes))]
            if not (event in ("os.mkdir", "os.rename") and paths and all(map(_bytecode, paths))):
                self.unsafe.append(event)

    def _stat(
        self, real: Callable[..., os.stat_result], kind: int
    ) -> Callable[..., os.stat_result]:
        def stat(
            path: Any, *, dir_fd: Optional[int] = None, follow_symlinks: bool = True
        ) -> os.stat_result:
            watched = dir_fd is None and self.active
            k = (
                helpcache.LSTAT
                if kind == helpcache.LSTAT or not follow_symlinks
                else helpcache.STAT
            )
            try:
                st = (
                    real(path, dir_fd=dir_fd, follow_symlinks=follow_symlinks)
                    if kind == helpcache.STAT
                    else real(path, dir_fd=dir_fd)
                )
            except OSError as e:
                if watched:
                    self._note_stat(k, path, e)
                raise
            if watched:
                self._note_stat(k, path, st)
            return st

        return stat

    def _note_stat(self, kind: int, path: Any, got: Union[os.stat_result, OSError]) -> None:
        if isinstance(path, int):  # os.stat(fd): a file opened, seen by the audit hook
            return
        try:
            sig = (
                helpcache.error_signature(got)
                if isinstance(got, OSError)
                else helpcache.stat_signature(got)
            )
            self.note_path(kind, path, sig)
        except Exception:
            self.unsafe.append("cannot record a stat()")

    def watch(self) -> _Watch:
        return _Watch(self)


class _Watch:
    def __init__(self, rec: Recording) -> None:
        self.rec = rec

    def __enter__(self) -> Recording:
        global _CURRENT
        _CURRENT = self.rec
        _install_audit_hook()
        self.saved = (os.stat, os.lstat, os.environ)
        os.stat = self.rec._stat(os.stat, helpcache.STAT)
        os.lstat = self.rec._stat(os.lstat, helpcache.LSTAT)
        # not to change the environment: to see what is read of it (os.getenv reads it too)
        os.environ = _WatchedEnv(os.environ, self.rec)  # type: ignore[assignment]  # noqa: B003
        self.rec.active = True
        return self.rec

    def __exit__(self, *exc: object) -> None:
        self.rec.active = False
        os.stat, os.lstat, os.environ = self.saved


class _WatchedEnv(MutableMapping[str, str]):
    """``os.environ``, noting each variable read; reading them all (a copy, a loop) is
    noted as unsafe: the answer would depend on every one."""

    def __init__(self, real: MutableMapping[str, str], rec: Recording) -> None:
        self._real, self._rec = real, rec

    def __getitem__(self, name: str) -> str:
        value = self._real.get(name)
        self._rec.note_env(name, value)
        if value is None:
            raise KeyError(name)
        return value

    def __setitem__(self, name: str, value: str) -> None:
        self._rec.unsafe.append(f"sets ${name}")
        self._real[name] = value

    def __delitem__(self, name: str) -> None:
        self._rec.unsafe.append(f"unsets ${name}")
        del self._real[name]

    def __iter__(self) -> Iterator[str]:
        if self._rec.active:
            self._rec.unsafe.append("reads the whole environment")
        return iter(self._real)

    def __len__(self) -> int:
        return len(self._real)

    def copy(self) -> dict[str, str]:
        return dict(self)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


_CURRENT: Optional[Recording] = None
_HOOKED = False


def _install_audit_hook() -> None:
    """Once a process: an audit hook cannot be taken out; it asks the current recording."""
    global _HOOKED
    if not _HOOKED:
        sys.addaudithook(
            lambda event, args: _CURRENT.audit(event, args) if _CURRENT is not None else None
        )
        _HOOKED = True


def _ignored(path: str) -> bool:
    """The interpreter's own files (its version stands for them) and byte-code."""
    return "__pycache__" in path or path.endswith(".pyc") or _stdlib(path)


def _bytecode(path: object) -> bool:
    """A path of the byte-code the interpreter writes as it imports (``__pycache__``, or
    below ``sys.pycache_prefix``)."""
    if not isinstance(path, (str, bytes)):
        return False
    p = os.fsdecode(path)
    prefix = sys.pycache_prefix
    return "__pycache__" in p or bool(prefix and p.startswith(prefix.rstrip(os.sep) + os.sep))


def _stdlib(path: str) -> bool:
    return path.startswith(_STDLIB + os.sep) and "-packages" not in path[len(_STDLIB) :]


class _Tee:
    """A stream that keeps what is written and writes it through."""

    def __init__(self, real: TextIO) -> None:
        self.real = real
        self.parts: list[str] = []

    def write(self, text: str) -> int:
        self.parts.append(text)
        return self.real.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def module_sigs() -> list[tuple[int, str, Optional[tuple[int, ...]]]]:
    """The source of every module loaded but the standard library's, and its folder."""
    out: list[tuple[int, str, Optional[tuple[int, ...]]]] = []
    folders: set[str] = set()
    for mod in list(sys.modules.values()):
        f = getattr(mod, "__file__", None)
        if not isinstance(f, str) or _ignored(f):
            continue
        f = os.path.abspath(f)
        out.append((helpcache.STAT, f, helpcache.signature(helpcache.STAT, f)))
        folders.add(os.path.dirname(f))
    for p in sys.path:
        folders.add(os.path.abspath(p or "."))
    out.extend(
        (helpcache.LISTED, d, helpcache.signature(helpcache.LISTED, d)) for d in sorted(folders)
    )
    return out


def _only_reading_builtins() -> bool:
    """Only the built-ins that reading a command line loads were loaded: a help word
    taken as an option's value runs the command, with every plugin."""
    from .pluginmanager import ARGUMENT_PLUGINS, BUILTIN_PLUGINS

    return not any(
        m in sys.modules for n, m in BUILTIN_PLUGINS.items() if n not in ARGUMENT_PLUGINS
    )


def render(argv: list[str]) -> int:
    """Run ``argv`` as the CLI does, and keep its answer if it can be (best effort)."""
    from .cli import main

    try:
        key = helpcache.key(argv)
        interp = helpcache.interpreter()
        width, tty = helpcache.columns(), os.isatty(1)
    except Exception:  # no current folder...: the usual run, whose answer is not kept
        return int(main(argv))
    rec = Recording()
    out, err = _Tee(sys.stdout), _Tee(sys.stderr)
    sys.stdout, sys.stderr = out, err
    try:
        with rec.watch():
            code = int(main(argv))  # an ExitCode: marshal keeps plain ints
    finally:
        sys.stdout, sys.stderr = out.real, err.real
    try:
        if code == 0 and not err.parts and not rec.unsafe and _only_reading_builtins():
            _store(argv, key, interp, width, tty, rec, code, "".join(out.parts))
    except Exception:  # pragma: no cover - a cache that cannot be written is no cache
        pass
    return code


def _store(
    argv: list[str],
    key: Any,
    interp: Any,
    width: int,
    tty: bool,
    rec: Recording,
    code: int,
    text: str,
) -> None:
    import marshal
    import shutil

    if (
        shutil.get_terminal_size().columns != width
    ):  # pragma: no cover - helpcache.columns() is shutil's
        return
    names = sorted(set(ALWAYS_ENV) | set(rec.env))
    env = tuple(
        (n, helpcache.digest(rec.env[n] if n in rec.env else os.environ.get(n))) for n in names
    )
    sigs = {(k, p): s for k, p, s in module_sigs()}
    sigs.update(rec.sigs)  # what was seen during the run wins over what is seen now
    # A file changed a moment ago may change again within its time's granularity (a
    # second on some file systems) keeping its time, size and inode: it is not trusted
    # until that has passed (as git's "racy" entries); a later run keeps the answer.
    recent = time.time_ns() - RACY_NS
    if any(s is not None and len(s) == 4 and s[1] > recent for s in sigs.values()):
        return
    entry = (
        helpcache.FORMAT,
        interp,
        env,
        width,
        tty,
        tuple((k, p, s) for (k, p), s in sigs.items()),
        code,
        text,
    )
    home = helpcache.home_of(argv)
    if not os.path.isdir(home):  # --help makes no home, nor does its cache
        return
    folder = os.path.join(home, helpcache.CACHE)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    path = os.path.join(folder, helpcache.FILE)
    entries = helpcache.read_entries(path)
    entries.pop(key, None)
    entries[key] = entry
    while len(entries) > MAX_ENTRIES:
        entries.pop(next(iter(entries)))
    data = marshal.dumps(entries)
    tmp = f"{path}.{os.getpid()}.tmp"
    if os.path.lexists(tmp):  # left by a process of that pid that was killed
        os.unlink(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(tmp, path)  # whole or not there: a reader never sees half a file
    except BaseException:
        os.unlink(tmp)
        raise

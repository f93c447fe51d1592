"""The cached answer of a command line that is only read (``--help``, ``-h``,
``--version``): looked up before anything of fleetrun is imported.

The first run of such a command line renders it as always, under a recorder
(:mod:`fleetrun.helprecord`), and keeps what it printed, its exit code and everything
the answer was read from: the command line, the folder, the interpreter and
``sys.path``, the terminal's width, every environment variable read (a digest of its
value), and the signature of every file and folder looked at (a source file's time,
size and inode; a project file looked for and not there; a folder of ``sys.path``
listed for plugin distributions, whose time moves when one is installed or removed).
A later run of the same command line compares those with a few ``stat()`` calls and
prints the kept text without importing pluggy, argparse or any plugin; anything that
differs, or a cache that cannot be read, is the usual run.

Standard library only (``os``, ``sys``, ``marshal``; ``_blake2`` for the digests), and
nothing of the package: it runs before ``fleetrun``'s heavy parts.
"""

from __future__ import annotations

import marshal
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Optional

#: Words after which a command line is only read (``cli._READ_ONLY_WORDS``).
READ_ONLY_WORDS = ("-h", "--help", "--version")
#: Set (to anything but empty), the cache is neither read nor written.
NO_CACHE = "FLEETRUN_NO_CACHE"
#: The cache folder in the home (the compiled shepherd's too: ``shepherdrun.CACHE``).
CACHE = "cache"
PREFIX = "answers-"
#: One file per interpreter kind: ``marshal``'s format is the interpreter's.
FILE = f"{PREFIX}{sys.implementation.cache_tag}.marshal"
#: The layout of an entry; another is no entry.
FORMAT = 1
#: Kinds of signature: ``os.stat``, ``os.lstat``, a folder listed (its time counts).
STAT, LSTAT, LISTED = 0, 1, 2

_IFMT, _IFDIR = 0o170000, 0o040000


def only_read(argv: list[str]) -> bool:
    """Whether the command line holds a word of :data:`READ_ONLY_WORDS` (before ``--``)."""
    words = argv[: argv.index("--")] if "--" in argv else argv
    return any(w in READ_ONLY_WORDS for w in words)


def enabled() -> bool:
    return not os.environ.get(NO_CACHE)


def home_of(argv: list[str]) -> str:
    """The home the command line names (the last ``--home``), else ``$FLEETRUN_HOME``,
    else ``~/.fleetrun``: where its cache is (what the answer depends on is recorded
    apart, so a home named another way is only another place)."""
    home = None
    for i, a in enumerate(argv):
        if a == "--home" and i + 1 < len(argv):
            home = argv[i + 1]
        elif a.startswith("--home="):
            home = a[len("--home=") :]
    home = (
        home
        or os.environ.get("FLEETRUN_HOME")
        or os.path.join(os.path.expanduser("~"), ".fleetrun")
    )
    return os.path.abspath(os.path.expanduser(home))


def cache_file(argv: list[str]) -> str:
    return os.path.join(home_of(argv), CACHE, FILE)


def key(argv: list[str]) -> tuple[Any, ...]:
    """What an entry is found by: the program, the command line and the folder."""
    return (sys.argv[0] if sys.argv else "", tuple(argv), os.getcwd())


def interpreter() -> tuple[Any, ...]:
    """The interpreter: its executable's signature, version, flags and ``sys.path``."""
    return (
        sys.executable,
        signature(STAT, sys.executable),
        sys.version,
        tuple(sys.flags),
        tuple(sys.path),
    )


def columns() -> int:
    """The width argparse wraps to: ``shutil.get_terminal_size().columns``, without
    importing shutil (``$COLUMNS``, else the size of the terminal on stdout, else 80)."""
    try:
        width = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        width = 0
    if width > 0:
        return width
    try:
        width = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):
        return 80
    return width or 80


def digest(value: Optional[str]) -> Optional[bytes]:
    """An environment variable's value as kept: a digest (a token read by a plugin is
    not written to disk), None when it is not set."""
    if value is None:
        return None
    from _blake2 import blake2b

    return blake2b(value.encode("utf-8", "surrogateescape"), digest_size=16).digest()


def stat_signature(st: os.stat_result, listed: bool = False) -> tuple[int, ...]:
    """What a ``stat()`` result says of a file: its type, time, size and inode; of a
    folder, that it is one (and its time too when it was listed: an entry made or
    removed moves it)."""
    kind = st.st_mode & _IFMT
    if kind == _IFDIR and not listed:
        return (kind,)
    return (kind, st.st_mtime_ns, st.st_size, st.st_ino)


def error_signature(e: OSError) -> Optional[tuple[int, ...]]:
    """Not there (None), or another error (its errno)."""
    return None if isinstance(e, (FileNotFoundError, NotADirectoryError)) else (-1, e.errno or 0)


def signature(kind: int, path: str) -> Optional[tuple[int, ...]]:
    try:
        st = os.lstat(path) if kind == LSTAT else os.stat(path)
    except OSError as e:
        return error_signature(e)
    return stat_signature(st, listed=kind == LISTED)


def read_entries(path: str) -> dict[Any, Any]:
    """The cache file's entries; ``{}`` when it is not there, not ours or garbled."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return {}
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            return {}
        chunks = []
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
        entries = marshal.loads(b"".join(chunks))
    except Exception:  # garbled: no entries, the usual run
        return {}
    finally:
        os.close(fd)
    return entries if isinstance(entries, dict) else {}


def still_true(entry: Any) -> Optional[tuple[int, str]]:
    """The kept ``(exit code, text)`` of an entry when everything it was read from is
    as it was, else None."""
    fmt, interp, env, width, tty, sigs, code, text = entry
    if fmt != FORMAT or interp != interpreter() or width != columns() or tty != os.isatty(1):
        return None
    for name, value in env:
        if digest(os.environ.get(name)) != value:
            return None
    for kind, path, sig in sigs:
        if signature(kind, path) != sig:
            return None
    if not isinstance(code, int) or not isinstance(text, str):
        return None
    try:  # what stdout cannot print is the usual run's to handle, as it was
        text.encode(sys.stdout.encoding, sys.stdout.errors or "strict")
    except (AttributeError, LookupError, TypeError, UnicodeError):
        return None
    return code, text


def lookup(argv: list[str]) -> Optional[tuple[int, str]]:
    """The cached answer of ``argv``: ``(exit code, text)``, or None (render it)."""
    if not enabled() or not only_read(argv):
        return None
    try:
        entry = read_entries(cache_file(argv)).get(key(argv))
        return None if entry is None else still_true(entry)
    except Exception:  # a garbled entry is no entry
        return None

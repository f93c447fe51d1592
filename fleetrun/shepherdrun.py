"""How a shepherd is started: from byte-code compiled once into the home.

A shepherd starts for every attempt, and a script run by path is compiled each time
(Python caches the byte-code of imported modules only, and ``PYTHONDONTWRITEBYTECODE``
stops even that). So the host compiles ``shepherd.py`` once into ``HOME/cache/`` (0700,
the file 0600) under a name made of the source's hash and the interpreter's magic
number, and runs that ``.pyc`` by path: a changed source, or another interpreter, gets a
file of its own; one that cannot be written is no error, the ``.py`` runs instead.

Standard library only, as the peer's ``host start`` uses it too.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Optional

#: The shepherd's source, run by path (it cannot import the package).
SHEPHERD_PATH = str(Path(__file__).with_name("shepherd.py"))
CACHE = "cache"
PREFIX = "shepherd-"
#: A compiled shepherd older than this is removed when another is compiled (not at once:
#: another install sharing the home may be about to start one from it).
STALE_S = 7 * 86400.0


def shepherd_argv(home: Path, attempt_dir: str, source: str = SHEPHERD_PATH) -> list[str]:
    """The command that starts a shepherd for ``attempt_dir``: this interpreter, ``-I -S``,
    the compiled shepherd (:func:`compiled`), else its source."""
    return [sys.executable, "-I", "-S", compiled(home / CACHE, source) or source, attempt_dir]


def compiled(cache: Path, source: str = SHEPHERD_PATH) -> Optional[str]:
    """The path of ``source``'s byte-code in ``cache``, compiled now if it is not there.

    :return: the ``.pyc`` path; None when it cannot be made (no room, a read-only home, a
        source that does not compile): the caller runs the source.
    """
    import hashlib  # here: `status` makes a LocalHost and starts no shepherd
    from importlib.util import MAGIC_NUMBER

    try:
        with open(source, "rb") as f:
            text = f.read()
        digest = hashlib.sha256(text).digest()
        path = cache / f"{PREFIX}{MAGIC_NUMBER.hex()}-{digest[:12].hex()}.pyc"
        if path.is_file():
            return str(path)
        import marshal

        code = compile(text, source, "exec", dont_inherit=True)
        # the header of PEP 552, unchecked-hash form: the name already says which source
        data = MAGIC_NUMBER + (1).to_bytes(4, "little") + digest[:8] + marshal.dumps(code)
        cache.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = cache / f"{path.name}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.replace(tmp, path)  # whole or not there: a shepherd never runs half a file
    except (OSError, SyntaxError, ValueError):
        return None
    _prune(cache, keep=path.name)
    return str(path)


def _prune(cache: Path, keep: str) -> None:
    """Remove compiled shepherds older than :data:`STALE_S` (older sources, interpreters)."""
    now = time.time()
    try:
        entries = list(os.scandir(cache))
    except OSError:
        return
    for e in entries:
        if e.name == keep or not e.name.startswith(PREFIX):
            continue
        try:
            if now - e.stat().st_mtime > STALE_S:
                os.unlink(e.path)
        except OSError:
            pass

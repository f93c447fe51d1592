"""``python -m fleetrun`` and the ``fleetrun`` console script.

A command line that is only read (``--help``, ``--version``) is first looked up in the
home's cache (:mod:`fleetrun.helpcache`: no pluggy, argparse or plugin imported when
it is still true), else rendered and kept (:mod:`fleetrun.helprecord`); every other one
goes straight to the CLI.
"""

from __future__ import annotations

import os
import sys


def console_main() -> None:
    """The ``fleetrun`` console script."""
    from . import helpcache

    argv = sys.argv[1:]
    cached = helpcache.lookup(argv)
    if cached is None and not (helpcache.enabled() and helpcache.only_read(argv)):
        from .cli import console_main as run

        run()  # raises SystemExit
        return
    if cached is not None:
        code, text = cached
        try:
            sys.stdout.write(text)
        except BrokenPipeError:  # pragma: no cover
            pass
    else:
        from .helprecord import render

        code = render(argv)
    try:
        sys.stdout.flush()
    except BrokenPipeError:  # pragma: no cover - `fleetrun --help | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    raise SystemExit(code)


if __name__ == "__main__":
    console_main()

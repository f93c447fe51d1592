"""``python -m fleetrun`` and the ``fleetrun`` console script."""

from __future__ import annotations


def console_main() -> None:
    """The ``fleetrun`` console script."""
    from .cli import console_main as run

    run()  # raises SystemExit


if __name__ == "__main__":
    console_main()

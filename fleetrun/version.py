"""fleetrun's version, in a module of its own: the CLI, the loop and the peer side print
it without importing the package's public API (which imports the CLI for ``main``)."""

from __future__ import annotations

__version__ = "0.1.0"

"""Test helpers that ship with fleetrun, for fleetrun's own tests and for plugin authors.

:mod:`fleetrun.testing.fake_claude` is a stand-in for the Claude Code CLI (stdlib only):
a package run as a program, ``python -m fleetrun.testing.fake_claude`` or by path
(``python fleetrun/testing/fake_claude``); the ``fake_claude`` fixture of
:mod:`fleetrun.fleeter` puts it on PATH and scripts it.
"""

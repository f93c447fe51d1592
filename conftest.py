"""Root pytest configuration: enables the ``fleeter`` test plugin that ships in the package."""

import os

pytest_plugins = ["fleetrun.fleeter"]

if os.environ.get("PYTEST_XDIST_WORKER"):
    # pytest-xdist's workers start with COLUMNS=80 and LINES set (a serial run has
    # neither when its output is not a terminal); fleetrun's tables fit $COLUMNS, and
    # the tests expect what a pipe gets: every cell whole
    for _name in ("COLUMNS", "LINES"):
        os.environ.pop(_name, None)

"""Root pytest configuration: enables the ``fleeter`` test plugin that ships in the package."""

pytest_plugins = ["fleetrun.fleeter"]

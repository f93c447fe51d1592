"""The built-in plugins. Each module only implements hooks; each is registered under
its short name (``-p no:terminal`` blocks the ``terminal`` plugin)."""

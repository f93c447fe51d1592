"""Config: the parsed command line, the home folder, config.toml, and the option registry."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from .exceptions import UsageError

if TYPE_CHECKING:
    from .pluginmanager import FleetPluginManager

if sys.version_info >= (3, 11):
    pass
else:  # pragma: no cover
    pass

#: Top-level tables ``config.toml`` may have; each is read by the plugin named.
CONFIG_TABLES = {
    "agents": "command_agent: [agents.NAME] command = [...]",
    "brain": "verify_brain: url, model, api (ollama/openai), ollama_endpoint (generate/chat), "
             "api_key_env, timeout_s, max_diff_bytes",
    "relay": "relay: tags = [...], heartbeat_secs",
    "claude": "claude: executable, allowed_tools, permission_mode, resume_session",
    "worktree": "worktree: commit_message",
    "fleetrun": "general settings",
}


def default_home() -> Path:
    env = os.environ.get("FLEETRUN_HOME")
    if env:
        return Path(env).expanduser().resolve()
    return Path.home() / ".fleetrun"


class OptionGroup:
    def __init__(self, name: str, description: str = "") -> None:
        self.name = name
        self.description = description
        self.options: list[tuple[tuple[str, ...], dict[str, Any]]] = []

    def addoption(self, *names: str, **kwargs: Any) -> None:
        """Add an option, with :meth:`argparse.ArgumentParser.add_argument` arguments."""
        self.options.append((names, kwargs))


class Parser:
    """What ``fleetrun_addoption`` gets: plugins add options to the run and work verbs."""

    def __init__(self) -> None:
        self.groups: list[OptionGroup] = []
        self._default = self.getgroup("plugins", "options added by plugins")

    def getgroup(self, name: str, description: str = "") -> OptionGroup:
        for g in self.groups:
            if g.name == name:
                return g
        g = OptionGroup(name, description)
        self.groups.append(g)
        return g

    def addoption(self, *names: str, **kwargs: Any) -> None:
        self._default.addoption(*names, **kwargs)

    def apply(self, argparser: argparse.ArgumentParser) -> None:
        for g in self.groups:
            if not g.options:
                continue
            ag = argparser.add_argument_group(g.name, g.description or None)
            for names, kwargs in g.options:
                ag.add_argument(*names, **kwargs)


class Config:
    """Everything a plugin needs to know about this run.

    :ivar pluginmanager: the run's :class:`~fleetrun.pluginmanager.FleetPluginManager`.
    :ivar hook: ``pluginmanager.hook``, to call hooks.
    :ivar option: the parsed command line (an :class:`argparse.Namespace`).
    :ivar home: the state folder (``$FLEETRUN_HOME``, default ``~/.fleetrun``).
    :ivar stash: a dict plugins may keep run-wide state in, under their own keys.
    """

    def __init__(self, pluginmanager: FleetPluginManager, option: argparse.Namespace, home: Path,
                 invocation_dir: Optional[Path] = None) -> None:
        self.pluginmanager = pluginmanager
        self.hook = pluginmanager.hook
        self.option = option
        self.home = home
        self.invocation_dir = invocation_dir or Path.cwd()
        self.stash: dict[str, Any] = {}
        self._settings: Optional[dict[str, Any]] = None
        self.file_settings: dict[str, Any] = {}
        self.out: Any = sys.stdout
        self.err: Any = sys.stderr

    def getoption(self, name: str, default: Any = None) -> Any:
        return getattr(self.option, name, default)

    def get_plugin(self, name: str) -> Any:
        return self.pluginmanager.get_plugin(name)

    @property
    def verbosity(self) -> int:
        return int(self.getoption("verbose", 0) or 0) - int(self.getoption("quiet", 0) or 0)

    @property
    def settings(self) -> dict[str, Any]:
        """``config.toml`` merged under the tasks files' top-level tables."""
        if self._settings is None:
            self._settings = load_config_toml(self.home / "config.toml")
        merged = {k: dict(v) if isinstance(v, dict) else v for k, v in self._settings.items()}
        for key, table in self.file_settings.items():
            if isinstance(table, dict) and isinstance(merged.get(key), dict):
                merged[key].update(table)
            else:
                merged[key] = table
        return merged

    def setting(self, table: str, key: Optional[str] = None, default: Any = None) -> Any:
        t = self.settings.get(table, {})
        if key is None:
            return t if t else default
        return t.get(key, default) if isinstance(t, dict) else default

    def path(self, *parts: str) -> Path:
        return self.home.joinpath(*parts)


def _describe(value: Any) -> str:
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (int, float)):
        return f"the number {value}"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "a list"
    return type(value).__name__


def _str_list_problem(value: Any) -> Optional[str]:
    """None for a list of strings; else what the value is instead."""
    if not isinstance(value, list):
        return _describe(value)
    for item in value:
        if not isinstance(item, str):
            return f"a list holding {_describe(item)}"
    return None


def load_config_toml(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    from .collect import map_lines, parse_toml_file

    data, text = parse_toml_file(path, str(path))
    lines = map_lines(text)
    import difflib

    errors = []
    for key, value in data.items():
        if key not in CONFIG_TABLES:
            close = difflib.get_close_matches(key, list(CONFIG_TABLES), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            errors.append(UsageError(f"unknown table{hint}", file=str(path), line=lines.get("top", key), key=key))
        elif not isinstance(value, dict):
            errors.append(UsageError("must be a table", file=str(path), line=lines.get("top", key), key=key))
    relay = data.get("relay")
    if isinstance(relay, dict) and "tags" in relay:
        # a string would be read as its letters (`"gpu"` -> g, p, u) by whatever iterates it
        problem = _str_list_problem(relay["tags"])
        if problem:
            errors.append(UsageError(f"expected a list of strings, got {problem}", file=str(path),
                                     line=lines.get("table", "relay", "tags", default=lines.get("top", "relay")),
                                     key="relay.tags"))
    if errors:
        from .exceptions import UsageErrors

        raise UsageErrors(errors)
    return data

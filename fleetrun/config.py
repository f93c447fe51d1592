"""Config: the parsed command line, the home folder, config.toml, and the option registry."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional

from .capped import DEFAULT_MAX_BYTES, MIN_MAX_BYTES
from .exceptions import UsageError
from .home import default_home  # noqa: F401  (its home before home.py: kept importable)
from .stash import Stash
from .tomlfile import describe_value, not_one_of

if TYPE_CHECKING:
    from .pluginmanager import FleetPluginManager
    from .projconf import ProjectConfig


@dataclass(frozen=True)
class ConfigKey:
    """A key of a ``config.toml`` table, declared through ``fleetrun_config_keys`` by the
    plugin that reads it. Anything no loaded plugin declared is an error.

    :ivar table: the table: ``"claude"`` for ``[claude]``; ``"agents.*"`` for every
        ``[agents.NAME]`` (a table of tables, one per name).
    :ivar key: the key inside it; ``""`` declares the table alone (it may appear, empty).
    :ivar types: the Python types the value may have after TOML parsing (a boolean is
        never a number); empty: any, ``check`` looks at it.
    :ivar items: for a list or a table value, the type every item must have.
    :ivar choices: the values allowed, when they are a fixed set.
    :ivar check: an extra check of a value of the right type: a message, or None.
    :ivar required: the table is incomplete without this key.
    :ivar doc: what the key means (for documentation and error hints).
    :ivar machine: a setting of this machine (its tags, where a program is installed):
        it belongs in ``config.toml`` alone, and a project file that sets it is refused.
        On the table's own declaration (``key=""``) it covers the whole table.
    """

    table: str
    key: str
    types: tuple[type, ...] = ()
    items: Optional[type] = None
    choices: tuple[Any, ...] = ()
    check: Optional[Callable[[Any], Optional[str]]] = None
    required: bool = False
    doc: str = ""
    machine: bool = False


def _output_cap_problem(value: int) -> Optional[str]:
    if value < MIN_MAX_BYTES:
        return f"must be at least {MIN_MAX_BYTES} (bytes), got {value}"
    return None


def _positive(v: Any) -> Optional[str]:
    return None if v > 0 else "must be more than 0"


#: What the core itself reads: ``[fleetrun]``, general settings, and ``[output]
#: max_bytes``, the cap of every file written from an untrusted stream.
CORE_CONFIG_KEYS: tuple[ConfigKey, ...] = (
    ConfigKey("fleetrun", "", doc="general settings"),
    ConfigKey(
        "fleetrun",
        "verifier_error_tries",
        types=(int,),
        check=_positive,
        doc="how many times a verifier that could not judge (a transient error) is tried in all",
    ),
    ConfigKey(
        "fleetrun",
        "verifier_error_backoff_s",
        types=(int, float),
        check=_positive,
        doc="the first wait before such a verifier runs again, doubled each time",
    ),
    ConfigKey(
        "output",
        "max_bytes",
        types=(int,),
        check=_output_cap_problem,
        doc=f"the most bytes one file written from an agent's, a verifier's or a setup step's output "
        f"may hold (default {DEFAULT_MAX_BYTES:_}); the head and the tail are kept",
    ),
)


def output_cap(config: Config) -> int:
    """``[output] max_bytes``: what one file written from an untrusted stream may hold."""
    value = config.setting("output", "max_bytes", DEFAULT_MAX_BYTES)
    return value if isinstance(value, int) and not isinstance(value, bool) else DEFAULT_MAX_BYTES


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
    :ivar project: the project file (:class:`~fleetrun.projconf.ProjectConfig`:
        ``[tool.fleetrun]`` or ``fleetrun.toml``, docs/configuration.md), or None.
    :ivar option: the parsed command line (an :class:`argparse.Namespace`).
    :ivar home: the state folder (``$FLEETRUN_HOME``, default ``~/.fleetrun``).
    :ivar stash: the run-wide state plugins and the loop share, a
        :class:`~fleetrun.stash.Stash` of typed :class:`~fleetrun.stash.StashKey` keys.
    """

    def __init__(
        self,
        pluginmanager: FleetPluginManager,
        option: argparse.Namespace,
        home: Path,
        invocation_dir: Optional[Path] = None,
    ) -> None:
        self.pluginmanager = pluginmanager
        self.hook = pluginmanager.hook
        self.option = option
        self.home = home
        self.invocation_dir = invocation_dir or Path.cwd()
        self.stash = Stash()
        self._settings: Optional[dict[str, Any]] = None
        self.file_settings: dict[str, Any] = {}
        self.out: Any = sys.stdout
        self.err: Any = sys.stderr
        self.project: Optional[ProjectConfig] = None

    def getoption(self, name: str, default: Any = None) -> Any:
        return getattr(self.option, name, default)

    def get_plugin(self, name: str) -> Any:
        return self.pluginmanager.get_plugin(name)

    @property
    def verbosity(self) -> int:
        return int(self.getoption("verbose", 0) or 0) - int(self.getoption("quiet", 0) or 0)

    @property
    def settings(self) -> dict[str, Any]:
        """``config.toml``, under the project file's tables, under the tasks files'
        top-level tables: key by key, the later wins (the command line's options win
        over all three where a plugin reads both)."""
        if self._settings is None and self.project is None and not (self.home / "config.toml").exists():
            # nothing to check, so no plugin's keys are asked for: an operator's verb
            # (`cancel` writing its events) keeps to the built-ins it loaded
            self._settings = {}
        if self._settings is None:
            decls, skip = self.config_keys(), self._blocks_a_plugin()
            home = load_config_toml(self.home / "config.toml", decls, skip_unknown_tables=skip)
            project = self.project.tables(decls, skip) if self.project is not None else {}
            self._settings = _merged(home, project)
        return _merged(self._settings, self.file_settings)

    def config_keys(self) -> list[ConfigKey]:
        """The core's ``config.toml`` keys and every loaded plugin's (``fleetrun_config_keys``)."""
        decls = list(CORE_CONFIG_KEYS)
        # an operator's verb (status, cancel...) loaded only the built-ins taking part in
        # it: the others declare keys too, so config.toml reads as it does in any run
        self.pluginmanager.load_deferred()
        for result in self.hook.fleetrun_config_keys(config=self):
            decls.extend(result or ())
        return decls

    def _blocks_a_plugin(self) -> bool:
        # pluggy keeps a blocked name mapped to None
        return any(p is None for _n, p in self.pluginmanager.list_name_plugin())

    def setting(self, table: str, key: Optional[str] = None, default: Any = None) -> Any:
        t = self.settings.get(table, {})
        if key is None:
            return t if t else default
        return t.get(key, default) if isinstance(t, dict) else default

    def path(self, *parts: str) -> Path:
        return self.home.joinpath(*parts)


def _merged(under: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over``'s tables merged into a copy of ``under``'s, key by key (an
    ``[agents.NAME]`` replaces the one of the same name whole)."""
    merged = {k: dict(v) if isinstance(v, dict) else v for k, v in under.items()}
    for key, table in over.items():
        if isinstance(table, dict) and isinstance(merged.get(key), dict):
            merged[key].update(table)
        else:
            merged[key] = table
    return merged


#: Why a project file may not set a machine-level table or key.
MACHINE_LEVEL = "is a setting of this machine: it belongs in $FLEETRUN_HOME/config.toml, not in the project file"


def _type_name(types: tuple[type, ...], items: Optional[type]) -> str:
    if set(types) == {int, float}:
        return "a number"
    names = {
        str: "a string",
        bool: "true or false",
        int: "a whole number",
        float: "a number",
        list: "a list",
        dict: "a table",
    }
    item_names = {str: "strings", bool: "true/false values", int: "whole numbers", float: "numbers"}
    out = []
    for t in types:
        name = names.get(t, t.__name__)
        if items is not None and t in (list, dict):
            name += f" of {item_names.get(items, items.__name__)}"
        out.append(name)
    return " or ".join(out)


def _of_type(value: Any, types: tuple[type, ...]) -> bool:
    # TOML's true is a Python int too: never a number here
    return isinstance(value, types) and not (isinstance(value, bool) and bool not in types)


def _value_problem(decl: ConfigKey, value: Any) -> Optional[str]:
    """What is wrong with ``value`` for ``decl``, or None."""
    import math

    if decl.types and not _of_type(value, decl.types):
        return f"expected {_type_name(decl.types, decl.items)}, got {describe_value(value)}"
    if isinstance(value, float) and not math.isfinite(value):
        return "must be a finite number"
    if decl.items is not None and isinstance(value, (list, dict)):
        for item in value.values() if isinstance(value, dict) else value:
            if not _of_type(item, (decl.items,)):
                kind = "table" if isinstance(value, dict) else "list"
                return f"expected {_type_name((type(value),), decl.items)}, got a {kind} holding {describe_value(item)}"
    if decl.choices and value not in decl.choices:
        return not_one_of(value, decl.choices)
    if decl.check is not None:
        return decl.check(value)
    return None


def _unknown(what: str, name: str, known: list[str], empty: str = "") -> str:
    import difflib

    close = difflib.get_close_matches(name, known, n=1)
    if close:
        return f"unknown {what} (did you mean '{close[0]}'?)"
    if not known:
        return f"unknown {what} ({empty} has no keys yet)"
    return f"unknown {what} (known: {', '.join(known)})"


def check_config(
    data: dict[str, Any],
    lines: Any,
    decls: Iterable[ConfigKey],
    file: str,
    skip_unknown_tables: bool = False,
    machine_ok: bool = True,
) -> list[UsageError]:
    """Every problem of a parsed ``config.toml`` against the declared keys.

    :param lines: the file's :class:`~fleetrun.tomlfile.LineMap`.
    :param skip_unknown_tables: a plugin is blocked (``-p no:NAME``): a table nobody
        declared may be that plugin's, so it is not an error.
    :param machine_ok: False for a project file: a machine-level table or key
        (:attr:`ConfigKey.machine`) is an error there.
    :return: one :class:`UsageError` per problem, in the order of the file.
    """
    tables: dict[str, dict[str, ConfigKey]] = {}
    machine_tables: set[str] = set()
    for d in decls:
        keys = tables.setdefault(d.table, {})
        if d.key:
            keys[d.key] = d
        elif d.machine:
            machine_tables.add(d.table)
    tops = {t.split(".", 1)[0]: t for t in tables}
    errors: list[UsageError] = []

    def err(line: int, key: str, msg: str) -> None:
        errors.append(UsageError(msg, file=file, line=line, key=key))

    def check_table(name: str, table: dict[str, Any], decl_name: str) -> None:
        keys = tables[decl_name]
        head = lines.get("table", name, default=lines.get("top", name.split(".", 1)[0]))
        for k, v in table.items():
            line = lines.get("table", name, k, default=head)
            decl = keys.get(k)
            if decl is None:
                err(line, f"{name}.{k}", _unknown("key", k, sorted(keys), f"[{name}]"))
                continue
            if decl.machine and not machine_ok:
                err(line, f"{name}.{k}", MACHINE_LEVEL)
                continue
            problem = _value_problem(decl, v)
            if problem:
                err(line, f"{name}.{k}", problem)
        for k, decl in keys.items():
            if decl.required and k not in table:
                err(head, name, f"{k} is missing")

    for top, value in data.items():
        line = lines.get("top", top)
        decl_name = tops.get(top)
        if decl_name is None:
            if not skip_unknown_tables:
                err(line, top, _unknown("table", top, sorted(tops)))
            continue
        if not isinstance(value, dict):
            err(line, top, "must be a table")
            continue
        if decl_name in machine_tables and not machine_ok:
            err(line, top, MACHINE_LEVEL)
            continue
        if decl_name.endswith(".*"):  # [agents.NAME]: one table per name
            for sub, table in value.items():
                if not isinstance(table, dict):
                    err(lines.get("table", top, sub, default=line), f"{top}.{sub}", "must be a table")
                else:
                    check_table(f"{top}.{sub}", table, decl_name)
        else:
            check_table(top, value, decl_name)
    errors.sort(key=lambda e: e.line or 0)
    return errors


def load_config_toml(
    path: Path, decls: Iterable[ConfigKey] = CORE_CONFIG_KEYS, skip_unknown_tables: bool = False
) -> dict[str, Any]:
    """Read and check ``config.toml``; without the file, nothing.

    :param decls: every key the loaded plugins declared (``fleetrun_config_keys``).
    :raises UsageError: every problem at once, each with its file, line and key.
    """
    if not path.exists():
        return {}
    from .tomlfile import map_lines, parse_toml_file

    data, text = parse_toml_file(path, str(path))
    errors = check_config(data, map_lines(text), decls, str(path), skip_unknown_tables)
    if errors:
        from .exceptions import UsageErrors

        raise UsageErrors(errors) if len(errors) > 1 else errors[0]
    return data

"""The plugin manager: built-ins by name, ``-p``, entry points, ``fleetconf.py``.

A fresh manager is made for every :func:`fleetrun.main` call; nothing here is global.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Iterable, Optional

import pluggy

from .exceptions import UsageError

PROJECT = "fleetrun"
ENTRY_POINT_GROUP = "fleetrun"

from .builtin_plugins import BUILTIN_PLUGINS  # noqa: E402,F401 - the table of the built-ins, re-exported

#: The built-ins that take part in reading the command line: they declare verbs
#: (``fleetrun_verbs``), options (``fleetrun_addoption``) or hooks (``fleetrun_addhooks``),
#: the only hooks called before it is parsed. ``fleetrun --help`` and ``--version``
#: load only these (tests/test_startup.py checks that no other built-in
#: implements those hooks).
ARGUMENT_PLUGINS = ("relay", "mailbox", "terminal", "events", "junitxml", "htmlreport")
ARGUMENT_HOOKS = ("fleetrun_verbs", "fleetrun_addoption", "fleetrun_addhooks")

#: The operator's verbs that touch no stage of a task (no workspace, agent, prompt,
#: verifier or placement): reading the ledger (``status``, ``logs``), moving tasks in it
#: (``cancel``, ``retry``), ``drain``/``undrain`` and ``gc``. They load only the
#: built-ins taking part in them, :data:`OPERATOR_PLUGINS` (the rest would import git,
#: Claude Code's reader, the loop's placement... for nothing). ``approve`` is not one:
#: it asks for the handoff and the cleanup of a workspace.
OPERATOR_VERBS = ("status", "logs", "cancel", "retry", "drain", "undrain", "gc")
#: The hooks those verbs call: the command line's, the run's start and end, the hosts
#: (a task on a host no plugin provides says so; ``cancel`` stops an attempt on its
#: host), the hosts' own reasons, and every state change.
OPERATOR_HOOKS = (
    *ARGUMENT_HOOKS,
    "fleetrun_configure",
    "fleetrun_unconfigure",
    "fleetrun_hosts",
    "fleetrun_status_reason",
    "fleetrun_status_fields",
    "fleetrun_transition",
)
#: The built-ins implementing a hook of :data:`OPERATOR_HOOKS` (tests/test_startup.py
#: checks the two agree, and that those verbs call no other hook). The others are
#: loaded when ``config.toml`` is read after all (:meth:`FleetPluginManager.load_deferred`),
#: so its tables are checked as in any run.
OPERATOR_PLUGINS = (*ARGUMENT_PLUGINS, "local", "verify_brain", "notify")


def builtins_for(verb: str, only_read: bool = False) -> Optional[tuple[str, ...]]:
    """The built-ins a command line loads: :data:`ARGUMENT_PLUGINS` when it is only read
    (``--help``, ``--version``), :data:`OPERATOR_PLUGINS` for a verb of
    :data:`OPERATOR_VERBS`, else None: every one.

    :param verb: the core's verb the command line names (``run`` for none).
    """
    if only_read:
        return ARGUMENT_PLUGINS
    return OPERATOR_PLUGINS if verb in OPERATOR_VERBS else None


#: Blocking these with ``-p no:NAME`` is a usage error: nothing works without them.
ESSENTIAL_PLUGINS = frozenset({"collect"})

FLEETCONF = "fleetconf.py"

#: Hooks a ``fleetconf.py`` may not implement, with the error that says so: they are
#: called before the command line is parsed, and a fleetconf.py is found only from the
#: tasks files a parsed command line names, so its implementation would never be
#: called. ``(key, message)`` of the :class:`~fleetrun.UsageError`, by hook.
TOO_LATE_FOR_FLEETCONF: dict[str, tuple[Optional[str], str]] = {
    "fleetrun_verbs": (
        None,
        "fleetrun_verbs cannot add a verb from a fleetconf.py (it is loaded after the "
        "command line is parsed); put the verb in a plugin module and load it with "
        "-p MODULE, or install it as a plugin",
    ),
    "fleetrun_addoption": (
        "fleetrun_addoption",
        "a fleetconf.py is loaded after the command line is parsed "
        "and cannot add options; put it in a plugin (-p MODULE or "
        "an installed one)",
    ),
}


class FleetPluginManager(pluggy.PluginManager):
    """pluggy's manager, taking ``fleetrun_*`` functions as hooks even unmarked
    (as pytest does in ``conftest.py``), so a misspelt hook name is caught."""

    def __init__(self) -> None:
        super().__init__(PROJECT)
        # the package exports the marker as ``fleetrun.hookspec``, shadowing the module name
        self.add_hookspecs(importlib.import_module("fleetrun.hookspec"))
        self._fleetconfs: list[Path] = []
        self._deferred: list[tuple[str, str]] = []  # built-ins left out by consider_builtins(only=...)
        # historic: every plugin registered from now on gets it once, as in pytest
        self.hook.fleetrun_addhooks.call_historic(kwargs={"pluginmanager": self})

    def blocked_builtins(self) -> list[str]:
        """The built-in plugins blocked (``-p no:NAME``), by short name, in registration
        order: what they would have declared is missing, and errors can say why."""
        return [name for name in BUILTIN_PLUGINS if self.is_blocked(name)]

    def parse_hookimpl_opts(self, plugin: Any, name: str) -> Optional[pluggy.HookimplOpts]:
        opts = super().parse_hookimpl_opts(plugin, name)
        if opts is None and name.startswith("fleetrun_"):
            method = getattr(plugin, name, None)
            if inspect.isroutine(method):
                return {
                    "wrapper": False,
                    "hookwrapper": False,
                    "optionalhook": False,
                    "tryfirst": False,
                    "trylast": False,
                    "specname": None,
                }
        return opts

    def register(self, plugin: Any, name: Optional[str] = None) -> Optional[str]:
        """Register ``plugin`` under ``name`` (default: its canonical name).

        A plugin already registered is not registered again, under any name: ``-p
        pkg.plugin`` naming the module an entry point (or a built-in) already loaded
        is that plugin, loaded once, as pytest's ``-p`` of a registered plugin does
        nothing.

        :return: the name it is registered under, or None if that name is blocked.
        :raises UsageError: the name is another plugin's, or an implementation does not
            fit its hook.
        """
        if plugin is None:  # pluggy ignores it too
            return None
        if self.is_registered(plugin):
            return self.get_name(plugin)
        plugin_name = name or self.get_canonical_name(plugin)
        taken = self.get_plugin(plugin_name)  # None too for a blocked name: pluggy skips it
        if taken is not None:
            # pluggy's ValueError would print its dict of every plugin, as an internal error
            what = getattr(taken, "__name__", None) or type(taken).__name__
            raise UsageError(
                f"plugin name {plugin_name!r} is taken by {what}; register this plugin under another name",
                file=_plugin_file(plugin),
            )
        try:
            ret = super().register(plugin, name)
        except pluggy.PluginValidationError as e:
            msg = " ".join(str(e).split())
            raise UsageError(f"invalid hook implementation: {msg}", file=_plugin_file(plugin)) from None
        return ret

    def import_plugin(self, modname: str, name: Optional[str] = None) -> Optional[ModuleType]:
        name = name or modname
        if self.is_blocked(name) or self.get_plugin(name) is not None:
            return None
        try:
            __import__(modname)
        except ImportError as e:
            raise UsageError(f"cannot import plugin {modname!r}: {e}", key="-p") from None
        mod = sys.modules[modname]
        self.register(mod, name)
        return mod

    def check_hooks(self) -> None:
        """Every ``fleetrun_*`` implementation must name a declared hook."""
        for hook_name in dir(self.hook):
            if not hook_name.startswith("fleetrun_"):
                continue
            caller = getattr(self.hook, hook_name)
            if caller.spec is not None:
                continue
            for impl in caller.get_hookimpls():
                if impl.opts.get("optionalhook"):
                    continue
                known = [n for n in dir(self.hook) if n.startswith("fleetrun_") and getattr(self.hook, n).spec]
                import difflib

                close = difflib.get_close_matches(hook_name, known, n=1)
                hint = f" (did you mean {close[0]}?)" if close else ""
                raise UsageError(
                    f"unknown hook {hook_name}{hint}",
                    file=_plugin_file(impl.plugin) or impl.plugin_name,
                )

    def consider_builtins(self, blocked: Iterable[str] = (), only: Optional[Iterable[str]] = None) -> None:
        """Load the built-in plugins (but those in ``blocked``); with ``only``, just those
        named there (:data:`ARGUMENT_PLUGINS`: a command line that is only read;
        :data:`OPERATOR_PLUGINS`: an operator's verb), the others kept for
        :meth:`load_deferred`."""
        wanted = set(only) if only is not None else None
        for name, modname in BUILTIN_PLUGINS.items():
            if name in blocked:
                continue
            if wanted is not None and name not in wanted:
                self._deferred.append((name, modname))
                continue
            self.import_plugin(modname, name)

    def load_deferred(self) -> None:
        """Load the built-ins :meth:`consider_builtins` left out (none but blocked ones
        stay out): what needs every plugin's declarations, ``config.toml``'s keys, asks
        for them first."""
        deferred, self._deferred = self._deferred, []
        for name, modname in deferred:
            self.import_plugin(modname, name)

    def consider_entry_points(self) -> None:
        for ep in _entry_points():
            if self.is_blocked(ep.name) or self.get_plugin(ep.name) is not None:
                continue
            try:
                plugin = ep.load()
            except Exception as e:
                raise UsageError(f"cannot load plugin {ep.name!r} ({ep.value}): {e}") from None
            self.register(plugin, ep.name)

    def consider_pluginarg(self, arg: str) -> None:
        """``-p NAME`` loads a module or entry point; ``-p no:NAME`` blocks one."""
        if arg.startswith("no:"):
            name = arg[3:]
            if name in ESSENTIAL_PLUGINS:
                raise UsageError(f"plugin {name!r} cannot be disabled: fleetrun needs it", key="-p")
            self.set_blocked(name)
            if name in BUILTIN_PLUGINS:
                self.set_blocked(BUILTIN_PLUGINS[name])
            return
        if name_is_ep := next((ep for ep in _entry_points(autoload=False) if ep.name == arg), None):
            if not self.is_blocked(arg) and self.get_plugin(arg) is None:
                self.register(name_is_ep.load(), arg)
            return
        modname = BUILTIN_PLUGINS.get(arg, arg)
        # a built-in named by its module is that built-in, whether loaded yet or not
        short = next((n for n, m in BUILTIN_PLUGINS.items() if m == modname), None)
        self.import_plugin(modname, short or modname)

    def load_fleetconfs(self, task_files: Iterable[Path]) -> list[Path]:
        """Import every ``fleetconf.py`` from the repository root (or the tasks file's
        folder outside a repository) down to each tasks file's folder, outermost first.

        :return: every ``fleetconf.py`` loaded so far.
        :raises UsageError: one does not import, or implements a hook it is too late
            for (:data:`TOO_LATE_FOR_FLEETCONF`).
        """
        loaded = []
        for path in fleetconf_paths(task_files):
            if path in self._fleetconfs:
                continue
            self._fleetconfs.append(path)
            mod = _import_fleetconf(path)
            self.register(mod, str(path))
            loaded.append(mod)
        self._refuse_too_late(loaded)
        return list(self._fleetconfs)

    def _refuse_too_late(self, fleetconfs: list[ModuleType]) -> None:
        """An implementation of a hook in :data:`TOO_LATE_FOR_FLEETCONF` in one of
        ``fleetconfs`` is an error: it would be silently ignored."""
        for hook_name, (key, message) in TOO_LATE_FOR_FLEETCONF.items():
            for impl in getattr(self.hook, hook_name).get_hookimpls():
                if any(impl.plugin is mod for mod in fleetconfs):
                    raise UsageError(message, file=impl.plugin_name, key=key)


def _plugin_file(plugin: Any) -> Optional[str]:
    f = getattr(plugin, "__file__", None)
    return str(f) if f else None


def _entry_points(autoload: bool = True) -> list[Any]:
    """Installed plugins; with ``autoload`` the FLEETRUN_DISABLE_PLUGIN_AUTOLOAD switch
    applies (``-p NAME`` still finds an entry point by name, as in pytest)."""
    if autoload and os.environ.get("FLEETRUN_DISABLE_PLUGIN_AUTOLOAD"):
        return []
    from importlib import metadata  # here: a run with autoload off does without it

    if sys.version_info >= (3, 10):
        return list(metadata.entry_points(group=ENTRY_POINT_GROUP))
    return list(metadata.entry_points().get(ENTRY_POINT_GROUP, []))  # pragma: no cover - Python 3.9


def repo_root(start: Path) -> Optional[Path]:
    for d in (start, *start.parents):
        if (d / ".git").exists():
            return d
    return None


def fleetconf_paths(task_files: Iterable[Path]) -> list[Path]:
    out: list[Path] = []
    for f in task_files:
        folder = f.resolve().parent
        root = repo_root(folder) or folder
        chain = [folder, *folder.parents]
        chain = chain[: chain.index(root) + 1] if root in chain else [folder]
        for d in reversed(chain):
            p = d / FLEETCONF
            if p.is_file() and p not in out:
                out.append(p)
    return out


def _import_fleetconf(path: Path) -> ModuleType:
    import hashlib

    modname = "fleetconf_" + hashlib.sha1(str(path).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(modname, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[modname] = mod
    if str(path.parent) not in sys.path:  # like conftest.py: import its neighbours
        sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(mod)
    except SyntaxError as e:
        sys.modules.pop(modname, None)
        raise UsageError(f"syntax error in fleetconf.py: {e.msg}", file=str(path), line=e.lineno) from None
    except Exception as e:
        sys.modules.pop(modname, None)
        tb = e.__traceback__
        line = None
        while tb is not None:
            if tb.tb_frame.f_code.co_filename == str(path):
                line = tb.tb_lineno
            tb = tb.tb_next
        raise UsageError(f"cannot import fleetconf.py: {type(e).__name__}: {e}", file=str(path), line=line) from None
    return mod


def cause_words(pm: Any) -> frozenset[str]:
    """The run's cause vocabulary: the core's (:data:`fleetrun.states.CAUSES`) and each
    loaded plugin's own words, its ``CAUSE_WORDS`` declaration (an agent's ends, a
    mailbox's: the core names none of them)."""
    from .states import CAUSES

    words = set(CAUSES)
    for plugin in pm.get_plugins():
        declared = getattr(plugin, "CAUSE_WORDS", None)
        if isinstance(declared, (frozenset, set, tuple, list)):
            words.update(w for w in declared if isinstance(w, str))
    return frozenset(words)

"""The command line: argument parsing, plugin loading, verbs and exit codes."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional, TextIO, Union

from .builtin_plugins import BLOCKED_PLUGIN_VERBS, FAST_PATHS
from .exceptions import ExitCode, UsageError, UsageErrors, is_space_error
from .version import __version__

# argparse is imported by what builds a parser: `status` may answer without one
# (fleetrun.quickstatus)
if TYPE_CHECKING:
    import argparse

    from .config import Config, Parser
    from .projconf import ProjectConfig
    from .verbs import VerbDecl

#: Verbs a supervisor drives on a peer over SSH: they read no project file and no
#: ``FLEETRUN_ADDOPTS`` (their folder is not the user's checkout).
_NO_PROJECT_VERBS = ("host",)

#: Words after which the command line is only read (argparse prints the help, or the
#: version is printed): the built-ins that do not take part in reading it are not loaded.
_READ_ONLY_WORDS = ("-h", "--help", "--version")

#: Options that take a value, so the verb scan can skip their values.
_VALUE_OPTS = {"-p", "-k", "-m", "--home", "--state", "--max-tasks"}


def console_main() -> None:
    """The ``fleetrun`` console script."""
    code = main()
    try:
        sys.stdout.flush()
    except BrokenPipeError:  # pragma: no cover
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    # the command is over (its hooks unconfigured, the ledger closed, its output
    # flushed): what it holds is the system's to free as the process ends. Frozen, the
    # interpreter's last full collection does not walk it all (after `fleetrun queue`
    # of 100,000 tasks: 0.9 s of CPU, a tenth of the command, to free nothing)
    import gc

    gc.freeze()
    raise SystemExit(code)


def _split_verb(args: list[str], verbs: Iterable[str]) -> tuple[str, list[str]]:
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            break
        if a.startswith("-"):
            if a in _VALUE_OPTS:
                i += 1
            i += 1
            continue
        if a in verbs:
            return a, args[:i] + args[i + 1 :]
        break
    return "run", args


def _prescan(args: list[str], opt: str) -> list[str]:
    out = []
    for i, a in enumerate(args):
        if a == opt and i + 1 < len(args):
            out.append(args[i + 1])
        elif a.startswith(opt) and len(opt) == 2 and len(a) > 2 and not a.startswith("--"):
            out.append(a[2:])
        elif a.startswith(opt + "="):
            out.append(a.split("=", 1)[1])
    return out


def main(
    args: Optional[list[str]] = None,
    plugins: Optional[list[Any]] = None,
    stdout: Optional[TextIO] = None,
    stderr: Optional[TextIO] = None,
) -> int:
    """Run one fleetrun command; return its exit code. Never raises for user errors."""
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    args = list(sys.argv[1:] if args is None else args)
    fast = next((m for v, m in FAST_PATHS.items() if v in args[:3]), None) if plugins is None else None
    if fast is not None:
        import importlib

        code = importlib.import_module(fast).fast_main(args, out, err)
        if code is not None:
            return code
    config: Optional[Config] = None
    try:
        if plugins is None and _split_verb(args, ("status",))[0] == "status":
            # the table of a ledger with no placed task asks no plugin: answered before
            # any is loaded (None: the usual way, every plugin loaded)
            from .quickstatus import fast_main

            code = fast_main(args, out, err)
            if code is not None:
                return code
        configured = _configure(args, plugins, out, err)
        if isinstance(configured, int):
            return configured
        config, run = configured
        return int(run(config, out, err))
    except UsageError as e:
        print(format_usage_error(e), file=err)
        return ExitCode.USAGE_ERROR
    except KeyboardInterrupt:
        print("interrupted", file=err)
        return ExitCode.INTERRUPTED
    except BrokenPipeError:  # `fleetrun logs X | head`: the reader has all it wanted
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return ExitCode.OK
    except OSError as e:
        if not is_space_error(e):
            return _internal_error(config, err)
        return _space_error(config, e, err)
    except SystemExit as e:  # argparse
        code = e.code if isinstance(e.code, int) else ExitCode.USAGE_ERROR
        return ExitCode.USAGE_ERROR if code == 2 else code
    except Exception as e:
        # sqlite3 is imported by what opens the ledger, not here: without it, no such error
        sqlite3 = sys.modules.get("sqlite3")
        if sqlite3 is not None and isinstance(e, sqlite3.DatabaseError):
            return _database_error(config, e, err)
        return _internal_error(config, err)
    finally:
        if config is not None:
            try:
                config.hook.fleetrun_unconfigure(config=config)
            except Exception:  # pragma: no cover
                pass
            from .ledger import LEDGER_KEY

            led = config.stash.pop(LEDGER_KEY, None)
            if led is not None:
                led.close()


def format_usage_error(e: UsageError) -> str:
    """The ``ERROR: ...`` lines of a usage error, with every control character in them
    made visible: a name, path or value quoted in one must not drive the terminal."""
    from .textutil import safe_text

    errors = e.errors if isinstance(e, UsageErrors) else [e]
    # newlines stay: some messages are laid out on lines; what a user or agent wrote
    # (names, values) is escaped where it is quoted, newlines included
    return "\n".join(safe_text(x.format(), keep="\t\n") for x in errors)


def _database_error(config: Optional[Config], e: Exception, err: TextIO) -> int:
    import sqlite3

    if isinstance(e, sqlite3.OperationalError):
        if not is_space_error(e):
            return _internal_error(config, err)
        return _space_error(config, e, err)
    # a ledger damaged after it was opened (opening checks it: ledger.Ledger)
    from .config import default_home

    home = config.home if config is not None else default_home()
    print(
        format_usage_error(
            UsageError(f"the ledger is damaged ({e}); move it aside to start a new one", file=str(home / "state.db"))
        ),
        file=err,
    )
    return ExitCode.USAGE_ERROR


def _space_error(config: Optional[Config], e: BaseException, err: TextIO) -> int:
    from .config import default_home

    home = config.home if config is not None else default_home()
    print(
        f"ERROR: cannot write to {home}: {e} (is the disk full or read-only?). Nothing was "
        "started; run again when there is room.",
        file=err,
    )
    return ExitCode.INTERNAL_ERROR


def _internal_error(config: Optional[Config], err: TextIO) -> int:
    import traceback

    from .config import default_home

    home = config.home if config is not None else default_home()
    text = traceback.format_exc()
    log = home / "internal-error.log"
    try:
        home.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "a") as f:
            f.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} fleetrun {__version__}\n{text}\n")
        where = f"the traceback is in {log}"
    except OSError:
        where = "the traceback follows:\n" + text
    last = text.strip().splitlines()[-1] if text.strip() else "unknown"
    from .textutil import LINES, safe_text

    # an exception's message can quote what an agent or a peer wrote
    print(safe_text(f"INTERNAL ERROR: {safe_text(last)}\n{where}", keep=LINES), file=err)
    return ExitCode.INTERNAL_ERROR


def _build_parser(verb: str, verbs: dict[str, VerbDecl], pluginparser: Parser) -> argparse.ArgumentParser:
    import argparse

    common = argparse.ArgumentParser(add_help=False)
    g = common.add_argument_group("general")
    g.add_argument(
        "-p",
        dest="plugins",
        action="append",
        default=[],
        metavar="NAME",
        help="load a plugin module or entry point; -p no:NAME blocks one",
    )
    g.add_argument("--home", metavar="DIR", help="state folder (default $FLEETRUN_HOME or ~/.fleetrun)")
    g.add_argument("-v", "--verbose", action="count", default=0, help="more output")
    g.add_argument("-q", "--quiet", action="count", default=0, help="less output")
    g.add_argument("--version", action="store_true", help="print the version and the plugins loaded")

    decl = verbs[verb]
    if verb == "run":
        listing = "\n".join(f"  {name:<9} {_help(name, verbs)}" for name in _all_verbs(verbs))
        p = argparse.ArgumentParser(
            prog="fleetrun",
            parents=[common],
            formatter_class=argparse.RawDescriptionHelpFormatter,
            usage="fleetrun [options] [FILE ...]\n       fleetrun VERB [options] ...",
            description="Run a queue of coding-agent tasks unattended, the way pytest runs tests.",
            epilog=f"verbs:\n{listing}\n\n'fleetrun VERB --help' describes a verb. Exit codes: 0 all DONE, "
            "1 some NEEDS_HUMAN or CANCELLED, 2 interrupted, 3 internal error, 4 usage error, "
            "5 no tasks collected, 6 relay add could not pair (docs/cli.md).",
        )
    else:
        p = argparse.ArgumentParser(prog=f"fleetrun {verb}", parents=[common], description=_help(verb, verbs))

    if decl.takes_tasks_files:
        p.add_argument("files", nargs="*", metavar="FILE", help="tasks files (default: tasks.toml)")
        p.add_argument("-k", dest="keyword", metavar="EXPR", help="only tasks whose name matches EXPR")
        p.add_argument("-m", dest="markexpr", metavar="EXPR", help="only tasks whose tags match EXPR")
    if decl.add_arguments is not None:
        decl.add_arguments(p)
    if decl.plugin_options:
        pluginparser.apply(p)
    return p


def _all_verbs(verbs: dict[str, VerbDecl]) -> list[str]:
    """Every verb: the core's first, then the plugins' in the order they declared them."""
    from .commands import BUILTIN_VERBS

    core = [d.name for d in BUILTIN_VERBS]
    return [*core, *(v for v in verbs if v not in core)]


def _help(verb: str, verbs: dict[str, VerbDecl]) -> str:
    return verbs[verb].help


#: The name a folder on the command line stands for, as ``fleetrun`` alone stands for
#: ``./tasks.toml``.
TASKS_FILE = "tasks.toml"


def _tasks_files_below(folder: Path, depth: int = 2) -> list[Path]:
    """``tasks*.toml`` files in ``folder`` and its subfolders (not hidden ones), for a hint."""
    found: list[Path] = []
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        return found
    for e in entries:
        if e.name.startswith("."):
            continue
        if e.is_dir() and not e.is_symlink() and depth > 1:
            found.extend(_tasks_files_below(e, depth - 1))
        elif e.is_file() and e.name.startswith("tasks") and e.suffix == ".toml":
            found.append(e)
    return found


def resolve_files(names: list[str], invocation_dir: Path, verbs: Iterable[str] = ()) -> list[str]:
    """The tasks files the command line names, absolute.

    A folder stands for its ``tasks.toml``, as ``fleetrun`` alone stands for
    ``./tasks.toml``: a tasks file is a queue that costs time and money, so fleetrun
    does not run every ``tasks*.toml`` it can find below a folder (examples, vendored
    repositories), as pytest runs every ``test_*.py``. A word that is no file and
    looks like a misspelt verb says so, instead of "no collector takes this file".

    :param verbs: the verbs of this run, for the hint after a misspelt one.
    :raises UsageError: a folder without ``tasks.toml``, a misspelt verb.
    """
    import difflib

    from .tomlfile import display_path

    out: list[str] = []
    errors: list[UsageError] = []
    for name in names:
        path = (invocation_dir / name).resolve()
        if path.is_dir():
            if (path / TASKS_FILE).is_file():
                out.append(str(path / TASKS_FILE))
                continue
            found = _tasks_files_below(path)
            hint = "; name a file: " + ", ".join(display_path(f, invocation_dir) for f in found[:6]) if found else ""
            errors.append(UsageError(f"no {TASKS_FILE} in this folder{hint}", file=name))
            continue
        if not path.exists() and "." not in name and "/" not in name and os.sep not in name:
            close = difflib.get_close_matches(name, list(verbs), n=1)
            hint = f"did you mean {close[0]}?" if close else "verbs: " + ", ".join(verbs)
            errors.append(UsageError(f"not a file or a verb ({hint})", file=name))
            continue
        out.append(str(path))
    if errors:
        raise UsageErrors(errors) if len(errors) > 1 else errors[0]
    return out


def _configure(
    args: list[str], plugins: Optional[list[Any]], out: TextIO, err: TextIO, all_plugins: bool = False
) -> Union[int, tuple[Config, Callable[[Config, TextIO, TextIO], int]]]:
    """Load the plugins, parse the command line for its verb and build the run's Config.

    A command line that asks for the help or the version (:data:`_READ_ONLY_WORDS`) is
    only read: of the built-in plugins, only those that declare verbs, options or hooks
    are loaded (:data:`~fleetrun.pluginmanager.ARGUMENT_PLUGINS`), so that it answers
    without importing the rest of fleetrun (the ledger, git, Claude Code's reader...).
    An operator's verb that touches no stage of a task (``status``, ``cancel``...) loads
    only the built-ins taking part in it (:func:`~fleetrun.pluginmanager.builtins_for`).

    :param all_plugins: load every plugin, whatever the command line says.
    :return: the config and the verb's ``run``, or an exit code (``--version``).
    """
    from .commands import BUILTIN_VERBS
    from .config import Parser
    from .pluginmanager import FleetPluginManager, builtins_for
    from .verbs import build_registry

    project, addopts = _project_addopts(args)
    pm = FleetPluginManager()
    words = [w for _src, ws in addopts for w in ws] + args
    only_read = not all_plugins and any(
        w in _READ_ONLY_WORDS for w in (words[: words.index("--")] if "--" in words else words)
    )
    pargs = _prescan(words, "-p")
    for a in pargs:
        if a.startswith("no:"):
            pm.consider_pluginarg(a)
    for name in filter(None, (os.environ.get("FLEETRUN_PLUGINS") or "").split(",")):
        pm.consider_pluginarg(name.strip())
    # the first word that is no option, whatever the plugins add (none takes a core verb)
    core_verb = _split_verb(args, [d.name for d in BUILTIN_VERBS])[0]
    pm.consider_builtins(only=None if all_plugins else builtins_for(core_verb, only_read))
    pm.consider_entry_points()
    for a in pargs:
        if not a.startswith("no:"):
            pm.consider_pluginarg(a)
    for plugin in plugins or ():
        if isinstance(plugin, str):
            pm.consider_pluginarg(plugin)
        else:
            pm.register(plugin)

    verbs = build_registry(BUILTIN_VERBS, pm)
    names = _all_verbs(verbs)
    verb, rest = _split_verb(args, names)
    if verb == "run":  # a blocked built-in's verb is not there: say why, not "not a file"
        word, _ = _split_verb(args, [v for vs in BLOCKED_PLUGIN_VERBS.values() for v in vs])
        for plugin, its_verbs in BLOCKED_PLUGIN_VERBS.items():
            if word in its_verbs and pm.is_blocked(plugin):
                raise UsageError(f"the {plugin} plugin is blocked (-p no:{plugin})", key=word)
    pluginparser = Parser()
    pm.hook.fleetrun_addoption(parser=pluginparser, pluginmanager=pm)
    parser = _build_parser(verb, verbs, pluginparser)
    if addopts:
        options = _VerbOptions(verb, verbs, pluginparser, parser)
        addopts = [(src, options.taken(ws)) for src, ws in addopts]
    ns = _parse_args(parser, addopts, rest)
    ns.verb = verb
    if ns.version:
        print(f"fleetrun {__version__}", file=out)
        print(f"plugins: {', '.join(_short(n) for n in _plugin_names(pm))}", file=out)
        return ExitCode.OK
    if only_read:  # a help word taken as a value after all: the command runs, with every plugin
        return _configure(args, plugins, out, err, all_plugins=True)

    from .config import Config, default_home

    home = Path(ns.home).expanduser().resolve() if ns.home else default_home()
    config = Config(pm, ns, home)
    config.project = project
    config.out = out
    config.err = err
    decl = verbs[verb]
    sources: list[Path] = []
    if decl.takes_tasks_files:
        ns.files = resolve_files(ns.files or [TASKS_FILE], config.invocation_dir, names)
        sources.extend(Path(f) for f in ns.files if Path(f).exists())
    if decl.tasks_files is not None:
        sources.extend(decl.tasks_files(config))
    if sources:
        pm.load_fleetconfs(sources)  # refuses the hooks a fleetconf.py is too late for
    pm.check_hooks()
    if decl.reads_config:
        # a mistake in config.toml stops these before anything starts, with its line;
        # checked after the fleetconf.py files, whose plugins may declare tables. The
        # operator's verbs (status, logs, cancel...) still work, and check it only if
        # they read a setting.
        config.settings  # noqa: B018 - loads and checks config.toml
    config.hook.fleetrun_configure.call_historic(kwargs={"config": config})
    return config, decl.run


#: Where a list of addopts came from: the project file, or ``FLEETRUN_ADDOPTS`` (None).
_AddoptsSource = Optional["ProjectConfig"]


def _project_addopts(args: list[str]) -> tuple[Optional[ProjectConfig], list[tuple[_AddoptsSource, list[str]]]]:
    """The project file of a run started here, and the ``addopts`` to put before the
    command line: the file's, then ``FLEETRUN_ADDOPTS`` (as pytest's addopts). Read
    before the plugins load, since addopts may name some (``-p``).

    :raises UsageError: a project file that is no TOML, addopts of the wrong type.
    """
    from .config import default_home
    from .projconf import env_addopts, load_project

    if _split_verb(args, _NO_PROJECT_VERBS)[0] in _NO_PROJECT_VERBS:
        return None, []
    homes = _prescan(args, "--home")
    home = Path(homes[-1]).expanduser().resolve() if homes else default_home()
    project = load_project(Path.cwd(), home)
    out: list[tuple[_AddoptsSource, list[str]]] = []
    if project is not None and "addopts" in project.data:
        out.append((project, project.addopts()))
    env = env_addopts()
    if env:
        out.append((None, env))
    return project, out


#: Options of ``addopts`` that select tasks: they reach the verbs that take tasks files
#: (``run``, ``validate``, ``queue``), never the selection of ``cancel``, ``retry`` or
#: ``approve``, which act on what the operator types and nothing else.
_SELECTION_OPTS = ("-k", "-m")


class _VerbOptions:
    """Which words of ``addopts`` a verb takes. As pytest's addopts are options of a
    test run, fleetrun's are options of whatever verb takes them: an option this verb's
    parser lacks is dropped for it (``-k`` for ``status``, ``--durations`` for
    ``validate``), with its value; an option no verb takes stays, so that the parse
    reports it as the project file's mistake, on every verb. A word that is no option
    (a tasks file) reaches only the verbs that take tasks files.
    """

    def __init__(
        self, verb: str, verbs: dict[str, VerbDecl], pluginparser: Parser, parser: argparse.ArgumentParser
    ) -> None:
        self.verb = verbs[verb]
        self.parser = parser
        self._build = lambda name: _build_parser(name, verbs, pluginparser)
        self._names = [v for v in verbs if v != verb]
        self._others: Optional[list[argparse.ArgumentParser]] = None

    def _elsewhere(self, word: str) -> Optional[argparse.Action]:
        """The option in the parser of another verb (built only when an addopt needs it)."""
        if self._others is None:
            self._others = [self._build(name) for name in self._names]
        for p in self._others:
            action = _option_action(p, word)
            if action is not None:
                return action
        return None

    def taken(self, words: list[str]) -> list[str]:
        out: list[str] = []
        i = 0
        while i < len(words):
            word = words[i]
            if not word.startswith("-") or word == "-":
                if self.verb.takes_tasks_files:
                    out.append(word)
                i += 1
                continue
            own = _option_action(self.parser, word)
            if own is not None and any(word.startswith(o) for o in _SELECTION_OPTS):
                own = own if self.verb.takes_tasks_files else None
            action = own or self._elsewhere(word)
            n = _values_after(action, word, words[i + 1 :])
            if own is not None or action is None:
                out.extend(words[i : i + 1 + n])
            i += 1 + n
        return out


def _option_action(parser: argparse.ArgumentParser, word: str) -> Optional[argparse.Action]:
    """The action of the option ``word`` (``--name``, ``--name=V``, a prefix of one
    long option as argparse takes it, ``-x``, ``-xV``), or None if ``parser`` lacks it."""
    # argparse has no public lookup of an option string; pytest's parser reads this too
    actions: dict[str, argparse.Action] = parser._option_string_actions
    if word.startswith("--"):
        name = word.split("=", 1)[0]
        if name in actions:
            return actions[name]
        found = {id(a): a for o, a in actions.items() if o.startswith(name) and o.startswith("--")}
        return next(iter(found.values())) if len(found) == 1 else None
    return actions.get(word[:2])


def _values_after(action: Optional[argparse.Action], word: str, following: list[str]) -> int:
    """How many of the ``following`` words are the option's values."""
    inline = "=" in word if word.startswith("--") else len(word) > 2
    if inline:
        return 0
    count = 0
    for w in following:
        if w.startswith("-") and w != "-":
            break
        count += 1
    if action is None:  # no verb takes it: an error anyway; its value goes with it
        return min(count, 1)
    if action.nargs is None:
        return 1
    if isinstance(action.nargs, int):
        return action.nargs
    return min(count, 1) if action.nargs == "?" else count


def _try_parse(parser: argparse.ArgumentParser, words: list[str]) -> tuple[Optional[argparse.Namespace], str]:
    """``words`` parsed, or argparse's error message (``""`` when it would have exited
    without one, as ``--help`` does) and nothing printed."""
    import contextlib
    import io

    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors), contextlib.redirect_stdout(io.StringIO()):
            return parser.parse_args(words), ""
    except SystemExit as e:
        if e.code in (0, None):
            return None, ""
        return None, errors.getvalue().rsplit(": error: ", 1)[-1].strip()


def _parse_args(
    parser: argparse.ArgumentParser, addopts: list[tuple[_AddoptsSource, list[str]]], rest: list[str]
) -> argparse.Namespace:
    """The command line with ``addopts`` before it. An error that only the addopts
    make is a usage error naming where they came from, not argparse's usage text.

    :raises UsageError: a bad option in the project file's or the environment's addopts.
    """
    words = [w for _src, ws in addopts for w in ws]
    if not words:
        return parser.parse_args(rest)
    ns, problem = _try_parse(parser, words + rest)
    if ns is not None:
        return ns
    if problem and _try_parse(parser, rest)[0] is not None:
        import shlex

        before: list[str] = []
        for src, ws in addopts:
            before += ws
            problem = _try_parse(parser, before + rest)[1]
            if problem:
                problem += f" (addopts go before every command line: fleetrun {shlex.join(ws)} ...)"
                if src is None:
                    from .projconf import ENV_ADDOPTS

                    raise UsageError(problem, file=ENV_ADDOPTS)
                raise src.error("addopts", problem)
    return parser.parse_args(words + rest)  # the command line's own mistake, or --help


def _plugin_names(pm: Any) -> list[str]:
    """The plugins of this run, as ``--version`` lists them: every built-in not blocked
    (loaded or not: a command line only read loads few), where the built-ins come."""
    from .pluginmanager import BUILTIN_PLUGINS

    loaded = [n for n, p in pm.list_name_plugin() if p is not None and not n.startswith("<")]
    builtins = [n for n in BUILTIN_PLUGINS if not pm.is_blocked(n)]
    out: list[str] = []
    for n in loaded:
        if n not in BUILTIN_PLUGINS:
            out.append(n)
        elif builtins:
            out.extend(builtins)
            builtins = []
    return out + builtins


def _short(name: str) -> str:
    from .pluginmanager import BUILTIN_PLUGINS

    short = next((n for n, m in BUILTIN_PLUGINS.items() if m == name), None)  # a built-in named by its module
    if short is not None:
        return short
    if os.sep in name and name.endswith("fleetconf.py"):
        return "fleetconf:" + name
    return name

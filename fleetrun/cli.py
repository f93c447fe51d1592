"""The command line: argument parsing, plugin loading, verbs and exit codes."""

from __future__ import annotations

import argparse
import hashlib
import os
import sqlite3
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Optional, TextIO

from . import __version__
from .exceptions import ExitCode, UsageError, UsageErrors

VERBS: dict[str, str] = {
    "run": "collect, queue and work the tasks files until nothing is left (the default)",
    "validate": "check tasks files: typos, dangling or cyclic depends_on",
    "queue": "validate and queue tasks files; runs nothing",
    "work": "run the queued tasks (keeps running unless --until-idle)",
    "status": "one line per task (--graph: the depends_on tree and why anything waits)",
    "logs": "every transition and verdict of a task",
    "cancel": "cancel a task; its dependents need a human",
    "retry": "send a NEEDS_HUMAN or CANCELLED task back to the queue",
    "approve": "accept a NEEDS_HUMAN task as DONE",
    "drain": "start nothing new on this machine",
    "undrain": "start work again after drain",
    "gc": "list (and with --yes remove) worktrees and attempt folders no task owns",
    "relay": "peers over SSH: relay add NAME user@host, relay peers, relay remove NAME",
    "host": "the peer side of the relay: fleetrun host VERB --json (run by a supervisor over SSH)",
}

#: Options that take a value, so the verb scan can skip their values.
_VALUE_OPTS = {"-p", "-k", "--home", "--state", "--max-tasks"}
#: Verbs whose own sub-verbs and options follow them (parsed by their module).
_NESTED = {"relay", "host"}


class Session:
    """One invocation's working set: the config, the ledger, and what was collected."""

    def __init__(self, config: Any, ledger: Any = None) -> None:
        self.config = config
        self.ledger = ledger
        self.items: list[Any] = []
        self.files: list[Any] = []
        self.exitstatus: int = 0
        self.started = time.time()
        self.shouldstop: Optional[str] = None
        self.final_notes: list[str] = []
        self.counts: dict[str, int] = {}
        self.cost_usd = 0.0
        self.interrupted = False


def console_main() -> None:
    """The ``fleetrun`` console script."""
    code = main()
    try:
        sys.stdout.flush()
    except BrokenPipeError:  # pragma: no cover
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    raise SystemExit(code)


def _split_verb(args: list[str]) -> tuple[str, list[str]]:
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
        if a in VERBS:
            return a, args[:i] + args[i + 1:]
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


def main(args: Optional[list[str]] = None, plugins: Optional[list[Any]] = None,
         stdout: Optional[TextIO] = None, stderr: Optional[TextIO] = None) -> int:
    """Run one fleetrun command; return its exit code. Never raises for user errors."""
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    args = list(sys.argv[1:] if args is None else args)
    if plugins is None and "host" in args[:3]:
        # `fleetrun host status|log|stop|verify-status|verify-stop|bundle`, which a
        # supervisor polls over SSH, need only the home: answered with no plugin manager
        from .plugins.relay.peer.verbs import fast_main

        code = fast_main(args, out, err)
        if code is not None:
            return code
    config = None
    try:
        config = _configure(args, plugins, out, err)
        if isinstance(config, int):
            return config
        return int(_dispatch(config, out, err))
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
    except sqlite3.DatabaseError as e:
        if isinstance(e, sqlite3.OperationalError):
            if not _is_space(e):
                return _internal_error(config, err)
            return _space_error(config, e, err)
        # a ledger damaged after it was opened (opening checks it: ledger.Ledger)
        from .config import default_home

        home = config.home if config is not None and not isinstance(config, int) else default_home()
        print(format_usage_error(UsageError(
            f"the ledger is damaged ({e}); move it aside to start a new one", file=str(home / "state.db"))), file=err)
        return ExitCode.USAGE_ERROR
    except OSError as e:
        if not _is_space(e):
            return _internal_error(config, err)
        return _space_error(config, e, err)
    except SystemExit as e:  # argparse
        code = e.code if isinstance(e.code, int) else ExitCode.USAGE_ERROR
        return ExitCode.USAGE_ERROR if code == 2 else code
    except Exception:
        return _internal_error(config, err)
    finally:
        if config is not None and not isinstance(config, int):
            try:
                config.hook.fleetrun_unconfigure(config=config)
            except Exception:  # pragma: no cover
                pass
            led = config.stash.pop("ledger", None)
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


def _is_space(e: BaseException) -> bool:
    from .session import is_space_error

    return bool(is_space_error(e))


def _space_error(config: Any, e: BaseException, err: TextIO) -> int:
    from .config import default_home

    home = config.home if config is not None and not isinstance(config, int) else default_home()
    print(f"ERROR: cannot write to {home}: {e} (is the disk full or read-only?). Nothing was "
          "started; run again when there is room.", file=err)
    return ExitCode.INTERNAL_ERROR


def _internal_error(config: Any, err: TextIO) -> int:
    from .config import default_home

    home = config.home if config is not None and not isinstance(config, int) else default_home()
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


def _build_parser(verb: str, pluginparser: Any) -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    g = common.add_argument_group("general")
    g.add_argument("-p", dest="plugins", action="append", default=[], metavar="NAME",
                   help="load a plugin module or entry point; -p no:NAME blocks one")
    g.add_argument("--home", metavar="DIR", help="state folder (default $FLEETRUN_HOME or ~/.fleetrun)")
    g.add_argument("-v", "--verbose", action="count", default=0, help="more output")
    g.add_argument("-q", "--quiet", action="count", default=0, help="less output")
    g.add_argument("--version", action="store_true", help="print the version and the plugins loaded")

    if verb == "run":
        verbs = "\n".join(f"  {name:<9} {text}" for name, text in VERBS.items())
        p = argparse.ArgumentParser(
            prog="fleetrun", parents=[common], formatter_class=argparse.RawDescriptionHelpFormatter,
            usage="fleetrun [options] [FILE ...]\n       fleetrun VERB [options] ...",
            description="Run a queue of coding-agent tasks unattended, the way pytest runs tests.",
            epilog=f"verbs:\n{verbs}\n\n'fleetrun VERB --help' describes a verb. Exit codes: 0 all DONE, "
                   "1 some NEEDS_HUMAN or CANCELLED, 2 interrupted, 3 internal error, 4 usage error, "
                   "5 no tasks collected, 6 relay add could not pair (docs/cli.md).",
        )
    else:
        p = argparse.ArgumentParser(prog=f"fleetrun {verb}", parents=[common], description=VERBS[verb])

    if verb in ("run", "validate", "queue"):
        p.add_argument("files", nargs="*", metavar="FILE", help="tasks files (default: tasks.toml)")
        p.add_argument("-k", dest="keyword", metavar="EXPR", help="only tasks whose name matches EXPR")
    if verb in ("run", "work"):
        p.add_argument("-x", "--exitfirst", action="store_true",
                       help="start no new task after the first NEEDS_HUMAN")
        p.add_argument("--max-tasks", type=_max_tasks, metavar="N", help="override [local] max_tasks")
    if verb == "run":
        p.add_argument("--collect-only", "--co", action="store_true", help="list the tasks; run nothing")
        p.add_argument("--new-queue", action="store_true",
                       help="queue the file anew even if an unchanged copy is still in the ledger")
    if verb == "work":
        p.add_argument("--until-idle", action="store_true", help="exit when nothing is left to do")
    if verb == "status":
        p.add_argument("--state", metavar="S", help="only tasks in this state")
        p.add_argument("--json", action="store_true", help="print JSON")
        p.add_argument("--graph", action="store_true", help="the depends_on tree, and why anything waits")
        p.add_argument("--wide", action="store_true", help="every cell whole, however wide the terminal")
    if verb in ("logs", "cancel", "retry", "approve"):
        p.add_argument("task", metavar="TASK", help="a task id, or a name (the newest task with it)")
    if verb == "logs":
        p.add_argument("--json", action="store_true", help="print JSON")
    if verb == "retry":
        p.add_argument("--elsewhere", action="store_true",
                       help="also for a task running on a peer that stopped answering: give up on that "
                            "machine and place the task again (you vouch the old attempt is gone)")
    if verb == "gc":
        p.add_argument("--yes", action="store_true", help="remove what is listed")
        p.add_argument("--force", action="store_true",
                       help="also remove dirty worktrees and branches with commits found nowhere else")
    if verb == "relay":
        p.add_argument("rest", nargs=argparse.REMAINDER, metavar="add|peers|remove ...",
                       help="'fleetrun relay help' lists them; 'fleetrun relay add --help' describes one")
    if verb == "host":
        p.add_argument("rest", nargs=argparse.REMAINDER, metavar="VERB --json ...",
                       help="probe, prepare, start, status, log, stop, collect, cleanup, verify-start, "
                            "verify-status, verify-stop, bundle (docs/peers.md)")
    if verb in ("run", "work"):
        pluginparser.apply(p)
    return p


def _max_tasks(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:  # 0 or fewer starts nothing and waits forever: never what was meant
        raise argparse.ArgumentTypeError(
            f"{text} is not a whole number of at least 1 (to start nothing, use fleetrun drain)")
    return n


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


def resolve_files(names: list[str], invocation_dir: Path) -> list[str]:
    """The tasks files the command line names, absolute.

    A folder stands for its ``tasks.toml``, as ``fleetrun`` alone stands for
    ``./tasks.toml``: a tasks file is a queue that costs time and money, so fleetrun
    does not run every ``tasks*.toml`` it can find below a folder (examples, vendored
    repositories), as pytest runs every ``test_*.py``. A word that is no file and
    looks like a misspelt verb says so, instead of "no collector takes this file".

    :raises UsageError: a folder without ``tasks.toml``, a misspelt verb.
    """
    import difflib

    from .collect import display_path

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
            close = difflib.get_close_matches(name, list(VERBS), n=1)
            hint = f"did you mean {close[0]}?" if close else "verbs: " + ", ".join(VERBS)
            errors.append(UsageError(f"not a file or a verb ({hint})", file=name))
            continue
        out.append(str(path))
    if errors:
        raise UsageErrors(errors) if len(errors) > 1 else errors[0]
    return out


def _configure(args: list[str], plugins: Optional[list[Any]], out: TextIO, err: TextIO) -> Any:
    from .config import Config, Parser, default_home
    from .pluginmanager import FleetPluginManager

    verb, rest = _split_verb(args)
    pm = FleetPluginManager()
    pargs = _prescan(rest, "-p")
    for a in pargs:
        if a.startswith("no:"):
            pm.consider_pluginarg(a)
    for name in filter(None, (os.environ.get("FLEETRUN_PLUGINS") or "").split(",")):
        pm.consider_pluginarg(name.strip())
    pm.consider_builtins()
    pm.consider_entry_points()
    for a in pargs:
        if not a.startswith("no:"):
            pm.consider_pluginarg(a)
    for plugin in plugins or ():
        if isinstance(plugin, str):
            pm.consider_pluginarg(plugin)
        else:
            pm.register(plugin)

    pluginparser = Parser()
    pm.hook.fleetrun_addoption(parser=pluginparser, pluginmanager=pm)
    parser = _build_parser(verb, pluginparser)
    ns = parser.parse_args(rest)
    ns.verb = verb
    if ns.version:
        names = [n for n, p in pm.list_name_plugin() if p is not None and not n.startswith("<")]
        print(f"fleetrun {__version__}", file=out)
        print(f"plugins: {', '.join(_short(n) for n in names)}", file=out)
        return ExitCode.OK

    home = Path(ns.home).expanduser().resolve() if ns.home else default_home()
    config = Config(pm, ns, home)
    config.out = out
    config.err = err
    if verb in ("run", "validate", "queue"):
        ns.files = resolve_files(ns.files or [TASKS_FILE], config.invocation_dir)
        pm.load_fleetconfs([Path(f) for f in ns.files if Path(f).exists()])
    elif verb == "work":
        # the queued tasks' own fleetconf.py files and [agents]/[brain] tables
        from .ledger import Ledger

        led = config.stash["ledger"] = Ledger(home / "state.db")
        sources: list[Path] = []
        for _qid, files_, settings in led.live_queues():
            sources.extend(Path(f) for f in files_ if Path(f).exists())
            for key, table in settings.items():
                if isinstance(table, dict):
                    config.file_settings.setdefault(key, {}).update(table)
        pm.load_fleetconfs(sources)
    pm.check_hooks()
    if verb in ("run", "validate", "queue", "work", "relay"):
        # a mistake in config.toml stops these before anything starts, with its line;
        # checked after the fleetconf.py files, whose plugins may declare tables. The
        # operator's verbs (status, logs, cancel...) still work, and check it only if
        # they read a setting.
        config.settings  # noqa: B018 - loads and checks config.toml
    config.hook.fleetrun_configure.call_historic(kwargs={"config": config})
    return config


def _short(name: str) -> str:
    for prefix in ("fleetrun.plugins.",):
        if name.startswith(prefix):
            return name[len(prefix):]
    if os.sep in name and name.endswith("fleetconf.py"):
        return "fleetconf:" + name
    return name


def _dispatch(config: Any, out: TextIO, err: TextIO) -> int:
    from . import commands

    verb = config.option.verb
    handler: Callable[..., int] = getattr(commands, f"cmd_{verb}")
    return handler(config, out, err)


def source_hash(path: str) -> str:
    data = Path(path).read_bytes()
    return hashlib.sha256(path.encode() + b"\0" + data).hexdigest()


def _branch_owner(config: Any) -> Optional[Callable[[str, str, str], Optional[str]]]:
    """Who fleetrun created a branch for, from the ledger; None when there is no
    ledger yet (then fleetrun created no branch; ``validate`` makes no ledger)."""
    if not (config.home / "state.db").exists():
        return None
    from .commands import open_ledger

    return open_ledger(config).branch_owner


def collect(config: Any) -> list[Any]:
    """Collect every file named on the command line; raise all usage errors at once."""
    from .collect import KeyTable, check_branches, check_graph, check_refs

    keys = KeyTable.build(config.hook.fleetrun_task_keys(config=config))
    files = []
    graph_only: list[Any] = []
    errors: list[UsageError] = []
    for f in config.option.files:
        try:
            tf = config.hook.fleetrun_collect_file(file_path=f, config=config, keys=keys)
        except UsageErrors as e:
            errors.extend(e.errors)
            partial = getattr(e, "partial", None)
            if partial is not None:
                graph_only.append(partial)
            continue
        except UsageError as e:
            errors.append(e)
            continue
        if tf is None:
            from .collect import display_path

            errors.append(UsageError("no collector takes this kind of file (tasks files are .toml)",
                                     file=display_path(Path(f), config.invocation_dir)))
            continue
        files.append(tf)
    errors.extend(check_graph(files + graph_only, config.invocation_dir))
    repos: dict[str, Any] = {}  # one repository lookup per cwd for both checks
    errors.extend(check_refs(files + graph_only, config.invocation_dir, repos))
    branch_errors, reuse = check_branches(files + graph_only, _branch_owner(config), config.invocation_dir, repos)
    errors.extend(branch_errors)
    config.stash["branch_reuse"] = reuse
    if errors:
        order = {f: i for i, f in enumerate(config.option.files)}
        errors.sort(key=lambda e: (order.get(str(Path(e.file or "").resolve()), 0), e.line or 0))
        raise UsageErrors(errors) if len(errors) > 1 else errors[0]
    for tf in files:
        for key, table in tf.settings.items():
            config.file_settings.setdefault(key, {})
            if isinstance(table, dict):
                config.file_settings[key].update(table)
    return files

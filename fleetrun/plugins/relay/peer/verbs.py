"""``fleetrun host VERB --json``: the peer side of the relay.

A supervisor runs these over SSH; each prints one JSON object on stdout and exits 0,
or prints ``{"error": ...}`` and exits non-zero. A ``start`` the peer will not do
prints ``{"refused": reason}`` and exits 75. Verbs that take a task, an attempt or a
spec read it as JSON on stdin.

The peer keeps its own state in its own ``$FLEETRUN_HOME``: attempt folders (the
same shepherd as a local attempt), worktrees, ``hosted.json``, the attempts it
started for supervisors, and ``prepared.json``, the workspace it made for each task;
both read and written under ``host.lock``. Its own ``[local] max_tasks`` is enforced
under that lock.

What a supervisor sends is not trusted (``docs/security.md``): a peer stays inside its
own home even if the request is wrong. Every task and attempt id is checked against
the one pattern the ledger makes them by (:func:`fleetrun.untrusted.task_id`,
:func:`~fleetrun.untrusted.attempt_id`); ``collect``, ``cleanup``, ``verify-start``
and ``bundle`` act on the workspace this peer recorded for the task at ``prepare``,
never on a path in the request, and git runs in it pinned to the repository it was
made in (a rewritten ``.git`` is refused: ``worktree_tampered: ...``); ``stop``
signals only a shepherd this peer started, identified by the pid and start-time token
it recorded itself. Refusals are JSON errors, never tracebacks.

``bundle`` is the one verb whose reply is not only JSON: a header line
(``{"fleetrun_bundle": 1, "tip": ..., "fork": ..., "bundle": true}``) followed by a git
bundle of the branch (what the supervisor lacks of it), which the supervisor
unbundles into its own repository (fetch-back).

The verbs the supervisor polls (``status``, ``log``, ``stop``, ``verify-status``,
``verify-stop``) and ``bundle`` need nothing but the home: :func:`fast_main` answers
them without loading any plugin or reading any configuration (``fleetrun.cli.main``
hands them over before it builds a plugin manager). That is why this module imports
little at the top.

Test hook: with ``FLEETRUN_FAKE_HEADROOM=/path/file.json`` set, ``probe`` reports the
numbers in that file (``free_mem_mb``, ``load_per_core``, ``free_disk_mb``) instead
of measuring them, so tests can give peers on one kernel different headroom.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import fcntl
import json
import os
import re
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional, TextIO

from .exceptions import UsageError
from .procutil import tail_text
from .wire import TAMPERED

REFUSED_EXIT = 75
HOSTED = "hosted.json"
PREPARED = "prepared.json"
LOCK = "host.lock"
TOOLS_CACHE = "probe-tools.json"
TOOLS_TTL_S = 300.0
LOG_CHUNK = 1 << 20
#: Verbs that need only the home: answered by :func:`fast_main`, with no plugin loaded.
FAST_VERBS = frozenset({"status", "log", "stop", "verify-status", "verify-stop", "bundle"})
BUNDLE_MARK = "fleetrun_bundle"
MAX_HAVES = 64
_SHA = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")


class HostError(Exception):
    """A verb failed; the message goes back to the supervisor."""


class Refused(Exception):
    """``start`` will not start this attempt; the message says why."""


def _check(fn: Any, *args: Any, **kw: Any) -> Any:
    """An untrusted value through its checker; a :class:`Malformed` is a refusal."""
    from .untrusted import Malformed

    try:
        return fn(*args, **kw)
    except Malformed as e:
        raise HostError(str(e)) from None


def _attempt_id(value: Any, task: Optional[str] = None) -> str:
    from .untrusted import attempt_id

    return str(_check(attempt_id, value, task=task))


def _task_id(value: Any) -> str:
    from .untrusted import task_id

    return str(_check(task_id, value))


# ---------------------------------------------------------------------------------


class HomeOnly:
    """What the fast verbs need of a config: the home, nothing else."""

    def __init__(self, home: Path) -> None:
        self.home = home


def fast_main(args: list[str], out: TextIO, err: TextIO) -> Optional[int]:
    """``fleetrun [--home DIR] host VERB ...`` for a verb of :data:`FAST_VERBS`,
    answered without a plugin manager (no plugin, no ``fleetconf.py``, no
    ``config.toml``: these verbs read only files in the home). Returns None for
    anything else (another verb, another option), which the caller runs the usual
    way; so a fast verb answers exactly as it does through the full CLI.
    """
    home: Optional[str] = None
    i = 0
    while i < len(args) and args[i] != "host":
        a = args[i]
        if a == "--home" and i + 1 < len(args):
            home = args[i + 1]
            i += 2
        elif a.startswith("--home="):
            home = a.split("=", 1)[1]
            i += 1
        else:
            return None
    if i + 1 >= len(args) or args[i + 1] not in FAST_VERBS:
        return None
    if home:
        home_path = Path(home).expanduser().resolve()
    else:
        from .config import default_home

        home_path = default_home()
    return main(HomeOnly(home_path), args[i + 1:], out, err)


def main(config: Any, rest: list[str], out: TextIO, err: TextIO) -> int:
    rest = [a for a in rest if a != "--json"]  # every reply is JSON
    parser = _parser()
    try:
        ns = parser.parse_args(rest)
    except SystemExit as e:
        if e.code == 0:  # --help
            return 0
        _reply(out, {"error": f"usage: fleetrun host {{{','.join([*VERBS, 'bundle'])}}} --json ..."})
        return 4
    if not ns.verb:
        parser.print_help(out)
        return 4
    try:
        if ns.verb == "bundle":  # its reply is a header line and a bundle
            return cmd_bundle(config, out)
        reply = VERBS[ns.verb](config, ns)
        code = 0
    except Refused as e:
        reply, code = {"refused": str(e)}, REFUSED_EXIT
    except HostError as e:
        reply, code = {"error": str(e)}, 1
        if isinstance(e, _Unknown):
            reply["unknown"] = True
    except UsageError as e:  # the peer's own config.toml or policy.toml: say which line
        reply, code = {"error": f"this peer's configuration is broken: {e.format()}"}, 4
    except Exception as e:  # an internal error still answers in JSON
        import traceback

        reply = {"error": f"internal error on the peer: {type(e).__name__}: {e}",
                 "traceback": traceback.format_exc()[-4000:]}
        code = 3
    _reply(out, reply)
    return code


def _reply(out: TextIO, obj: dict[str, Any]) -> None:
    out.write(json.dumps(obj, default=str) + "\n")
    out.flush()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fleetrun host", description="the peer side of the relay (JSON replies)")
    sub = p.add_subparsers(dest="verb")
    sub.add_parser("probe", help="headroom, tools, tags, version and features")
    sub.add_parser("prepare", help="make the task's worktree (task and attempt JSON on stdin)")
    sub.add_parser("start", help="start a shepherd (spec JSON on stdin); refuses past [local] max_tasks")
    for verb in ("status", "stop", "log"):
        s = sub.add_parser(verb)
        s.add_argument("--attempt", required=True)
        if verb != "log":
            s.add_argument("--pid", type=int)
            s.add_argument("--token")
        s.add_argument("--offset" if verb == "log" else "--log-offset", dest="offset", type=int, default=None)
    sub.add_parser("collect", help="commit what the attempt left uncommitted (JSON on stdin)")
    sub.add_parser("cleanup", help="remove the task's worktree if clean (JSON on stdin)")
    sub.add_parser("verify-start", help="start a run verifier in the worktree (JSON on stdin)")
    sub.add_parser("bundle", help="a header line, then a git bundle of a branch (JSON on stdin)")
    for verb in ("verify-status", "verify-stop"):
        s = sub.add_parser(verb)
        s.add_argument("--attempt", required=True)
        s.add_argument("--idx", type=int, required=True)
    return p


def _payload() -> dict[str, Any]:
    data = sys.stdin.buffer.read() if sys.stdin is not None else b""
    try:
        obj = json.loads(data or b"{}")
    except (ValueError, RecursionError) as e:
        raise HostError(f"stdin is not JSON: {type(e).__name__}: {str(e)[:200]}") from None
    if not isinstance(obj, dict):
        raise HostError("stdin must hold a JSON object")
    return obj


def _known(cls: Any, data: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def _task(data: Any) -> Any:
    """The request's task, its id checked; a request that does not make one is refused."""
    from .ledger import Task
    from .states import State
    from .taskspec import TaskSpec

    if not isinstance(data, dict):
        raise HostError("the request has no task")
    _task_id(data.get("id"))
    try:
        d = _known(Task, data)
        d["state"] = State(d["state"])
        d["spec"] = TaskSpec.from_json(d["spec"])
        d["host"] = "local"  # here, it is
        task = Task(**d)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise HostError(f"the request's task is not one: {type(e).__name__}: {e}") from None
    if not isinstance(task.spec.cwd, str) or not isinstance(task.name, str):
        raise HostError("the request's task is not one")
    return task


def _attempt(data: Any, task: Any) -> Any:
    """The request's attempt, which must be one of ``task``'s."""
    from .ledger import Attempt

    if not isinstance(data, dict):
        raise HostError("the request has no attempt")
    _attempt_id(data.get("id"), task.id)
    try:
        d = _known(Attempt, data)
        d["host"] = "local"
        att = Attempt(**d)
    except (TypeError, ValueError) as e:
        raise HostError(f"the request's attempt is not one: {e}") from None
    if att.task_id != task.id or not isinstance(att.number, int) or att.id != f"{task.id}_a{att.number}":
        raise HostError(f"attempt {att.id} is not attempt {att.number} of {task.id}")
    return att


def _workspace(data: Any) -> Any:
    from .reports import Workspace

    if not isinstance(data, dict):
        raise HostError("the request has no workspace")
    try:
        return Workspace(**_known(Workspace, data))
    except TypeError as e:
        raise HostError(f"the request's workspace is not one: {e}") from None


# ---------------------------------------------------------------------------------
# what this peer prepared: the one source of the paths collect, cleanup, verify-start
# and bundle act on (a request names a task, never a path)


def _prepared_all(home: Path) -> dict[str, dict[str, Any]]:
    from .shepherd import read_json

    data = read_json(str(home / PREPARED)) or {}
    return {k: v for k, v in data.items() if isinstance(v, dict)} if isinstance(data, dict) else {}


def _record_prepared(home: Path, task_id: str, ws: Any) -> None:
    """Remember the workspace made for a task (call under the lock). Kept after cleanup:
    a fetch-back may still ask for the branch."""
    from .gitutil import common_dir
    from .shepherd import write_json

    rec = dataclasses.asdict(ws)
    rec["common"] = common_dir(ws.repo) if ws.is_worktree and ws.repo else None
    rec["time"] = time.time()
    reg = _prepared_all(home)
    reg[task_id] = rec
    write_json(str(home / PREPARED), reg)


def _prepared(home: Path, task_id: str) -> dict[str, Any]:
    rec = _prepared_all(home).get(task_id)
    if rec is None:
        raise HostError(f"no workspace was prepared on this host for task {task_id}")
    return rec


def _pinned(rec: dict[str, Any]) -> Any:
    """The recorded worktree, pinned to its repository.

    :raises HostError: ``worktree_tampered: ...`` when its ``.git`` no longer leads there.
    """
    from .gitutil import WorktreeTampered, pin_worktree

    root, common = rec.get("root") or rec.get("path"), rec.get("common")
    if not isinstance(root, str) or not isinstance(common, str):
        raise HostError(f"{TAMPERED}the record of this worktree is incomplete")
    try:
        return pin_worktree(root, common)
    except WorktreeTampered as e:
        raise HostError(f"{TAMPERED}{e}") from None


def _recorded_workspace(rec: dict[str, Any]) -> Any:
    from .reports import Workspace

    return Workspace(**_known(Workspace, rec))


@contextmanager
def _host_lock(home: Path) -> Iterator[None]:
    from .ledger import ensure_private_dir

    ensure_private_dir(home)
    fd = os.open(home / LOCK, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _local_host(config: Any) -> Any:
    from .hosts import LocalHost

    return LocalHost(config.home)


# ---------------------------------------------------------------------------------
# probe


def _policy(config: Any) -> tuple[Any, Optional[str]]:
    from .exceptions import UsageError
    from .policy import Policy, load_policy

    try:
        return load_policy(config.home / "policy.toml"), None
    except UsageError as e:
        return Policy(), e.format()


def _drained(config: Any, policy: Any) -> bool:
    if policy.local.drain:
        return True
    db = config.home / "state.db"
    if not db.exists():
        return False
    import sqlite3

    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=2)
        try:
            row = conn.execute("SELECT value FROM meta WHERE key='drain'").fetchone()
        finally:
            conn.close()
    except sqlite3.Error:
        return False
    return bool(row and row[0] == "1")


def _hosted(config: Any) -> dict[str, dict[str, Any]]:
    """Attempts started here for supervisors and still alive (call under the lock)."""
    from .shepherd import read_json, write_json

    path = config.home / HOSTED
    reg = read_json(str(path)) or {}
    host = _local_host(config)
    alive = {}
    for aid, entry in reg.items():
        st = host.status(aid, entry.get("pid"), entry.get("token"))
        if st.get("state") not in ("ended", "died"):
            alive[aid] = entry
    if alive != reg:
        write_json(str(path), alive)
    return alive


def _own_loop_running(config: Any) -> int:
    """Tasks this machine's own ``fleetrun work`` runs, if one runs."""
    from .shepherd import proc_token, read_json

    data = read_json(str(config.home / "supervisor.json")) or {}
    pid = data.get("pid")
    if not pid or proc_token(int(pid)) is None or (data.get("token") and proc_token(int(pid)) != data.get("token")):
        return 0
    return int(data.get("running") or 0)


def _headroom(config: Any) -> dict[str, Optional[float]]:
    fake = os.environ.get("FLEETRUN_FAKE_HEADROOM")
    if fake:  # a test hook: peers on one kernel all measure the same
        with open(fake, encoding="utf-8") as f:
            data = json.load(f)
        return {k: data.get(k) for k in ("free_mem_mb", "load_per_core", "free_disk_mb")}
    plugin = config.get_plugin("placement")
    measure = getattr(plugin, "measure_local", None)
    if measure is not None:
        return dict(measure(str(config.home)))
    import psutil

    return {"free_mem_mb": psutil.virtual_memory().available / 2**20,
            "load_per_core": os.getloadavg()[0] / (os.cpu_count() or 1),
            "free_disk_mb": psutil.disk_usage(str(config.home)).free / 2**20}


def _tools(config: Any) -> tuple[dict[str, Optional[str]], list[str]]:
    """``TOOL --version`` of each probed tool (:mod:`fleetrun.probe`), and which have a
    credential; cached in the home for a few minutes (each probe starts processes)."""
    from .probe import AUTH_CHECKS, probe_versions, tool_names
    from .shepherd import read_json, write_json

    extra = config.setting("relay", "tools", []) or []
    names = tool_names(x for x in extra if isinstance(x, str)) if isinstance(extra, list) else tool_names()
    exes = {n: n for n in names}
    claude = config.setting("claude", "executable")
    if isinstance(claude, str) and claude:
        exes["claude"] = claude
    key = json.dumps([exes, os.environ.get("PATH", "")], sort_keys=True)
    cache_path = config.home / TOOLS_CACHE
    cache = read_json(str(cache_path)) or {}
    if cache.get("key") == key and time.time() - float(cache.get("time") or 0) < TOOLS_TTL_S:
        return dict(cache.get("tools") or {}), list(cache.get("auth") or [])
    tools = probe_versions(exes)
    home = Path(os.path.expanduser("~"))
    auth = sorted(n for n, check in AUTH_CHECKS.items() if n in tools and check(os.environ, home))
    from .ledger import ensure_private_dir

    ensure_private_dir(config.home)
    write_json(str(cache_path), {"key": key, "time": time.time(), "tools": tools, "auth": auth})
    return tools, auth


def _tags(config: Any) -> list[str]:
    """``[relay] tags``: a list of strings (``tags = "gpu"`` is not the tags g, p, u)."""
    tags = config.setting("relay", "tags", [])
    if tags is None:
        return []
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise HostError(f"this peer's configuration is broken: {config.home / 'config.toml'}: [relay] tags must "
                        f'be a list of strings, like tags = ["gpu"], not {json.dumps(tags)[:80]}')
    return tags


def cmd_probe(config: Any, ns: argparse.Namespace) -> dict[str, Any]:
    import platform
    import socket

    from . import __version__
    from .peers import FEATURES

    policy, policy_error = _policy(config)
    with _host_lock(config.home):
        hosted = _hosted(config)
    reply: dict[str, Any] = {
        "fleetrun": __version__,
        "features": list(FEATURES),
        "hostname": socket.gethostname(),
        "os": platform.system().lower(),
        "arch": platform.machine(),
        "python": platform.python_version(),
        "home": str(config.home),
        "time": time.time(),
        "running": len(hosted) + _own_loop_running(config),
        "max_tasks": policy.local.max_tasks,
        "drain": _drained(config, policy),
        "tags": _tags(config),
        "mem_per_task_mb": policy.local.mem_per_task_mb,
    }
    reply["tools"], reply["auth"] = _tools(config)
    reply.update(_headroom(config))
    if policy_error:
        reply["policy_error"] = policy_error
    return reply


# ---------------------------------------------------------------------------------
# attempts


def cmd_prepare(config: Any, ns: argparse.Namespace) -> dict[str, Any]:
    p = _payload()
    task = _task(p.get("task"))
    att = _attempt(p.get("attempt"), task)
    if not os.path.isdir(task.spec.cwd):
        raise HostError("working directory does not exist on this host")
    with _host_lock(config.home):  # refuse now, before a worktree is made for nothing
        _check_room(config, _hosted(config), task.id)
    try:
        ws = config.hook.fleetrun_prepare_workspace(task=task, attempt=att, config=config)
    except Exception as e:
        raise HostError(str(e) or type(e).__name__) from None
    if ws is None:
        raise HostError("no plugin prepared a workspace on the peer")
    with _host_lock(config.home):
        _record_prepared(config.home, task.id, ws)
    return {"workspace": dataclasses.asdict(ws)}


def _check_room(config: Any, hosted: dict[str, dict[str, Any]], task_id: str) -> None:
    """Refuse a task this machine will not start now (call under the lock)."""
    same = [aid for aid, e in hosted.items() if e.get("task_id") == task_id]
    if same:
        raise Refused(f"is still running attempt {same[0]} of this task (a task never runs twice at once)")
    policy, policy_error = _policy(config)
    if policy_error:
        raise Refused(f"has a broken policy.toml: {policy_error}")
    if _drained(config, policy):
        raise Refused("is draining")
    running = len(hosted) + _own_loop_running(config)
    if running >= policy.local.max_tasks:
        raise Refused(f"is running {running} of {policy.local.max_tasks} tasks (its own [local] max_tasks)")


def cmd_start(config: Any, ns: argparse.Namespace) -> dict[str, Any]:
    p = _payload()
    task_id = _task_id(p.get("task_id"))
    attempt_id = _attempt_id(p.get("attempt_id"), task_id)
    spec = p.get("spec")
    if not isinstance(spec, dict) or not isinstance(spec.get("argv"), list) or not spec["argv"]:
        raise HostError("the request has no spec with an argv")
    rec = _prepared_all(config.home).get(task_id)
    if rec is not None and rec.get("is_worktree") and spec.get("cwd") != rec.get("path"):
        raise HostError(f"the attempt would run in {spec.get('cwd')}, not in the worktree prepared here for "
                        f"{task_id} ({rec.get('path')})")
    from .shepherd import write_json

    host = _local_host(config)
    with _host_lock(config.home):
        hosted = _hosted(config)
        if attempt_id in hosted:  # asked again (a lost reply): the same shepherd
            e = hosted[attempt_id]
            return {"pid": e["pid"], "token": e["token"], "dir": str(host.attempt_dir(attempt_id)), "again": True}
        _check_room(config, hosted, task_id)
        if spec.get("cwd") and not os.path.isdir(spec["cwd"]):
            raise HostError("working directory does not exist on this host")
        info = host.start(attempt_id, spec, p.get("prompt"))
        hosted[attempt_id] = {"task_id": task_id, "pid": info["pid"], "token": info["token"], "started": time.time()}
        write_json(str(config.home / HOSTED), hosted)
    return {"pid": info["pid"], "token": info["token"], "dir": info["dir"]}


def _log_chunk(path: Path, offset: int) -> dict[str, Any]:
    try:
        size = path.stat().st_size
    except OSError:
        return {"log": "", "log_offset": offset, "log_size": 0}
    data = b""
    if offset < size:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(LOG_CHUNK)
    return {"log": base64.b64encode(data).decode(), "log_offset": offset, "log_size": size}


def _shepherd(config: Any, attempt_id: str) -> tuple[Optional[int], Optional[str]]:
    """The pid and start-time token of the shepherd this peer started for an attempt,
    from its own records (``hosted.json``, then the shepherd's status file), never from
    the request: a pid a supervisor sends is at most a hint that must match them."""
    from .shepherd import STATUS, read_json

    e = (read_json(str(config.home / HOSTED)) or {}).get(attempt_id)
    if isinstance(e, dict) and isinstance(e.get("pid"), int) and isinstance(e.get("token"), str):
        return e["pid"], e["token"]
    st = read_json(str(config.home / "attempts" / attempt_id / STATUS)) or {}
    pid, token = st.get("shepherd_pid"), st.get("shepherd_token")
    if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 and isinstance(token, str):
        return pid, token
    return None, None


def _status(config: Any, attempt_id: str) -> dict[str, Any]:
    pid, token = _shepherd(config, attempt_id)
    # with no token of its own, the status file alone decides (a live pid is not ours)
    return dict(_local_host(config).status(attempt_id, pid, token or "-"))


def cmd_status(config: Any, ns: argparse.Namespace) -> dict[str, Any]:
    attempt_id = _attempt_id(ns.attempt)
    reply: dict[str, Any] = {"status": _status(config, attempt_id)}
    if ns.offset is not None:  # the log after the status: an ended status means all of it is here
        reply.update(_log_chunk(_local_host(config).log_path(attempt_id), max(0, ns.offset)))
    return reply


def cmd_log(config: Any, ns: argparse.Namespace) -> dict[str, Any]:
    return _log_chunk(_local_host(config).log_path(_attempt_id(ns.attempt)), max(0, ns.offset or 0))


def cmd_stop(config: Any, ns: argparse.Namespace) -> dict[str, Any]:
    """Stop an attempt's shepherd: a cancel file in its folder (a shepherd that has not
    started yet then runs nothing) and SIGTERM to the shepherd this peer recorded, only
    if that process still has the recorded start time."""
    from .shepherd import CANCEL, proc_token

    attempt_id = _attempt_id(ns.attempt)
    adir = _local_host(config).attempt_dir(attempt_id)
    if adir.is_dir() and not adir.is_symlink():
        os.close(os.open(adir / CANCEL, os.O_WRONLY | os.O_CREAT, 0o600))
    pid, token = _shepherd(config, attempt_id)
    signalled = False
    if pid and token and proc_token(pid) == token and (ns.pid in (None, pid)):
        try:
            os.kill(pid, signal.SIGTERM)
            signalled = True
        except ProcessLookupError:
            pass
    return {"signalled": signalled, "status": _status(config, attempt_id)}


def cmd_collect(config: Any, ns: argparse.Namespace) -> dict[str, Any]:
    """Commit what the attempt left uncommitted, in the worktree this peer prepared for
    the task (the request's ``workspace`` is not used: it could name any repository)."""
    from .gitutil import WorktreeTampered, check_pinned

    p = _payload()
    task = _task(p.get("task"))
    att = _attempt(p.get("attempt"), task)
    rec = _prepared(config.home, task.id)
    pinned = _pinned(rec) if rec.get("is_worktree") else None
    try:
        commit = config.hook.fleetrun_collect_work(task=task, attempt=att, workspace=_recorded_workspace(rec),
                                                   config=config)
        if pinned is not None:
            check_pinned(pinned)  # it held all along
    except WorktreeTampered as e:
        raise HostError(f"{TAMPERED}{e}") from None
    except Exception as e:
        raise HostError(str(e) or type(e).__name__) from None
    return {"commit": commit}


def cmd_cleanup(config: Any, ns: argparse.Namespace) -> dict[str, Any]:
    """Remove the worktree this peer prepared for a DONE task, if it is clean (the
    request's ``worktree`` is not used: it could name anyone's worktree)."""
    from .gitutil import WorktreeTampered

    task = _task(_payload().get("task"))
    rec = _prepared(config.home, task.id)
    if not rec.get("is_worktree"):
        return {"worktree": None, "removed": False}
    wt = str(rec.get("root") or rec.get("path"))
    if not os.path.exists(wt):
        return {"worktree": wt, "removed": True}
    _pinned(rec)
    task.worktree = wt
    try:
        config.hook.fleetrun_cleanup_workspace(task=task, config=config)
    except WorktreeTampered as e:
        raise HostError(f"{TAMPERED}{e}") from None
    except Exception as e:
        raise HostError(str(e) or type(e).__name__) from None
    return {"worktree": wt, "removed": not os.path.exists(wt)}


# ---------------------------------------------------------------------------------
# fetch-back: a branch as a git bundle


def _git(repo: str, *args: str, stdin: Optional[str] = None) -> tuple[int, str, str]:
    import subprocess

    proc = subprocess.run(["git", "-C", repo, *args], input=(stdin or "").encode(), capture_output=True,
                          env=dict(os.environ, GIT_TERMINAL_PROMPT="0", LC_ALL="C"), timeout=300)
    return proc.returncode, proc.stdout.decode("utf-8", "replace").strip(), proc.stderr.decode("utf-8", "replace")


def bundle_plan(repo: str, branch: str, git_ref: Optional[str], have: list[str]) -> dict[str, Any]:
    """What ``bundle`` sends: the branch's tip, where it left ``git_ref`` (``fork``: the
    merge base, an ancestor of the tip, so the supervisor has it once it has the tip),
    which of the supervisor's commits ``have`` are here too, and whether a bundle is
    needed at all (not when the tip is one of them or below one of them)."""
    if not os.path.isdir(repo):
        raise HostError(f"{repo} does not exist on this host")
    code, tip, err = _git(repo, "rev-parse", "--verify", "--quiet", "--end-of-options", f"refs/heads/{branch}^{{commit}}")
    if code != 0 or not _SHA.match(tip):
        raise HostError(f"there is no branch {branch} in {repo} on this host")
    fork = None
    if git_ref:
        code, out, _ = _git(repo, "merge-base", "--end-of-options", git_ref, tip)
        fork = out if code == 0 and _SHA.match(out) else None
    have = [h for h in have if isinstance(h, str) and _SHA.match(h)][:MAX_HAVES]
    here: list[str] = []
    if have:
        _, out, _ = _git(repo, "cat-file", "--batch-check=%(objectname) %(objecttype)",
                         stdin="".join(f"{h}^{{commit}}\n" for h in have))
        known = {line.split()[0] for line in out.splitlines() if line.endswith(" commit")}
        here = [h for h in have if h in known]
    covered = tip in here or any(_git(repo, "merge-base", "--is-ancestor", tip, h)[0] == 0 for h in here)
    return {BUNDLE_MARK: 1, "tip": tip, "fork": fork, "have": here, "bundle": not covered}


def cmd_bundle(config: Any, out: TextIO) -> int:
    """``host bundle``: stdin ``{"repo", "branch", "git_ref", "have": [commits]}``;
    stdout one header line (:func:`bundle_plan`), then, if it says ``"bundle": true``,
    ``git bundle create - refs/heads/BRANCH ^HAVE...``: the branch, less what the
    supervisor has. An error before the header is the usual JSON error; after it, a
    message on stderr and a non-zero exit."""
    import subprocess

    p = _payload()
    repo, branch = p.get("repo"), p.get("branch")
    if not isinstance(repo, str) or not isinstance(branch, str) or not repo or not branch or branch.startswith("-"):
        raise HostError("bundle needs a repo and a branch")
    # only a branch of a repository this peer made a worktree in for a task
    if not any(r.get("repo") == repo and r.get("branch") == branch for r in _prepared_all(config.home).values()):
        raise HostError(f"no task prepared on this host has branch {branch} in {repo}")
    plan = bundle_plan(repo, branch, p.get("git_ref") or None, list(p.get("have") or []))
    try:
        fd = out.fileno()
    except (AttributeError, OSError, ValueError):
        raise HostError("bundle writes to a real stdout") from None
    out.write(json.dumps(plan) + "\n")
    out.flush()
    if not plan["bundle"]:
        return 0
    proc = subprocess.run(["git", "-C", repo, "bundle", "create", "-", f"refs/heads/{branch}",
                           *(f"^{h}" for h in plan["have"])],
                          stdin=subprocess.DEVNULL, stdout=fd, stderr=subprocess.PIPE,
                          env=dict(os.environ, GIT_TERMINAL_PROMPT="0", LC_ALL="C"))
    if proc.returncode != 0:
        sys.stderr.write(f"git bundle create failed (exit {proc.returncode}): "
                         f"{proc.stderr.decode('utf-8', 'replace').strip()[-500:]}\n")
        return 1
    return 0


# ---------------------------------------------------------------------------------
# run verifiers, under a detached runner (a verifier may take many minutes; no SSH
# channel waits for it)


def _verify_dir(config: Any, attempt_id: str, idx: int) -> Path:
    _attempt_id(attempt_id)
    if isinstance(idx, bool) or not isinstance(idx, int) or not 0 <= idx < 10_000:
        raise HostError(f"bad verifier index {idx!r}")
    return config.home / "attempts" / attempt_id / f"verify-{idx + 1}"


def _runner_alive(vdir: Path) -> bool:
    from .hosts import shepherd_alive
    from .shepherd import read_json

    r = read_json(str(vdir / "runner.json")) or {}
    # without its start-time token a pid could be anyone's by now
    return isinstance(r.get("token"), str) and isinstance(r.get("pid"), int) and shepherd_alive(r["pid"], r["token"])


def cmd_verify_start(config: Any, ns: argparse.Namespace) -> dict[str, Any]:
    from .ledger import ensure_private_dir
    from .shepherd import proc_token, write_json

    p = _payload()
    task = _task(p.get("task"))
    att = _attempt(p.get("attempt"), task)
    ws = _workspace(p.get("workspace"))
    v, idx = p.get("verifier"), p.get("idx")
    if not isinstance(v, dict) or not isinstance(v.get("text"), str):
        raise HostError("the request has no verifier command")
    timeout_s = v.get("timeout_s") or 900.0
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 < timeout_s < 1e7:
        raise HostError(f"bad verifier timeout {timeout_s!r}")
    vdir = _verify_dir(config, att.id, idx)  # type: ignore[arg-type]
    rec = _prepared_all(config.home).get(task.id)
    if rec is not None:  # in the workspace made here, not wherever the request says
        cwd = str(rec.get("path"))
    elif ws.is_worktree:
        raise HostError(f"no workspace was prepared on this host for task {task.id}")
    else:
        cwd = ws.path
    with _host_lock(config.home):
        if _runner_alive(vdir):
            return {"state": "running", "again": True}
        ensure_private_dir(vdir)
        for name in ("result.json", "out", "child.json"):
            try:
                (vdir / name).unlink()
            except FileNotFoundError:
                pass
        # spec.json holds only what fleetrun sets: the peer's own environment (its API
        # keys...) reaches the verifier through the runner's environment, never a file
        ours = {"FLEETRUN_TASK_ID": task.id, "FLEETRUN_TASK_NAME": task.name, "FLEETRUN_ATTEMPT": str(att.number),
                "FLEETRUN_WORKTREE": cwd}
        write_json(str(vdir / "spec.json"), {"text": v["text"], "cwd": cwd, "env": ours,
                                             "timeout_s": float(timeout_s)})
        pid = os.posix_spawn(
            sys.executable, [sys.executable, "-m", "fleetrun.hostcli", "verify-runner", str(vdir)],
            dict(os.environ, **ours),
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_OPEN, 1, str(vdir / "runner.out"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600),
                (os.POSIX_SPAWN_DUP2, 1, 2),
            ],
            setsid=True,
        )
        write_json(str(vdir / "runner.json"), {"pid": pid, "token": proc_token(pid), "started": time.time()})
    return {"state": "running"}


def cmd_verify_status(config: Any, ns: argparse.Namespace) -> dict[str, Any]:
    from .shepherd import read_json

    vdir = _verify_dir(config, ns.attempt, ns.idx)
    res = read_json(str(vdir / "result.json"))
    if res is not None:
        return dict(res, state="ended")
    if not (vdir / "runner.json").exists():
        raise _Unknown("no such verifier run here")
    if _runner_alive(vdir):
        return {"state": "running"}
    res = read_json(str(vdir / "result.json"))  # it may have just finished
    if res is not None:
        return dict(res, state="ended")
    return {"state": "ended", "passed": False, "reason": "the verifier's runner died on the peer",
            "output": tail_text(vdir / "out"), "duration_s": 0.0}


class _Unknown(HostError):
    pass


def cmd_verify_stop(config: Any, ns: argparse.Namespace) -> dict[str, Any]:
    from .shepherd import read_json

    vdir = _verify_dir(config, ns.attempt, ns.idx)
    r = read_json(str(vdir / "runner.json")) or {}
    if r.get("pid") and _runner_alive(vdir):
        try:
            os.kill(int(r["pid"]), signal.SIGTERM)
            return {"signalled": True}
        except ProcessLookupError:
            pass
    return {"signalled": False}


def verify_runner(vdir: Path) -> int:
    """The detached runner of one ``run`` verifier: the command under ``/bin/sh -c``
    in the worktree, output to a file, the timeout enforced here (so a dropped link
    cannot leave it running), the verdict in ``result.json``."""
    import subprocess

    from .shepherd import read_json, write_json

    spec = read_json(str(vdir / "spec.json"))
    if spec is None:
        return 2
    started = time.monotonic()
    timeout_s = float(spec["timeout_s"])
    stopped: list[str] = []

    def finish(passed: bool, reason: str) -> int:
        write_json(str(vdir / "result.json"), {"passed": passed, "reason": reason, "output": tail_text(vdir / "out"),
                                               "duration_s": time.monotonic() - started, "ended": time.time()})
        return 0

    fd = os.open(vdir / "out", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        proc = subprocess.Popen(["/bin/sh", "-c", spec["text"]], cwd=spec["cwd"],
                                env=dict(os.environ, **(spec.get("env") or {})),
                                stdin=subprocess.DEVNULL, stdout=fd, stderr=fd, start_new_session=True,
                                close_fds=True)
    except OSError as e:
        return finish(False, f"cannot start: {e.strerror or e}")
    finally:
        os.close(fd)

    def kill_group() -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(timeout=2)
                return
            except subprocess.TimeoutExpired:
                continue

    def on_term(signum: int, frame: object) -> None:
        stopped.append("stopped")
        kill_group()

    signal.signal(signal.SIGTERM, on_term)
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_group()
        proc.wait()
        return finish(False, f"timed out after {timeout_s:g}s")
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # leftovers of the group
    except (ProcessLookupError, PermissionError):
        pass
    if stopped:
        return finish(False, "stopped by the supervisor")
    if code == 0:
        return finish(True, "exit code 0")
    if code < 0:
        return finish(False, f"killed by signal {-code}")
    return finish(False, f"exit code {code}")


VERBS = {
    "probe": cmd_probe,
    "prepare": cmd_prepare,
    "start": cmd_start,
    "status": cmd_status,
    "log": cmd_log,
    "stop": cmd_stop,
    "collect": cmd_collect,
    "cleanup": cmd_cleanup,
    "verify-start": cmd_verify_start,
    "verify-status": cmd_verify_status,
    "verify-stop": cmd_verify_stop,
}


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "verify-runner":
        raise SystemExit(verify_runner(Path(sys.argv[2])))
    raise SystemExit("usage: python -m fleetrun.hostcli verify-runner DIR (fleetrun host VERB runs the rest)")

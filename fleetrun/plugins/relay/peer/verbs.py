"""``fleetrun host VERB --json``: the verb CLI of the peer side and its dispatch.

The verbs the supervisor polls (``status``, ``log``, ``stop``, ``verify-status``,
``verify-stop``) and ``bundle`` need nothing but the home: :func:`fast_main` answers
them without loading any plugin or reading any configuration (``fleetrun.cli.main``
hands them over before it builds a plugin manager). That is why this module, and
every module of the peer side, imports little at the top.
"""

from __future__ import annotations

import argparse
import base64
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, TextIO

from fleetrun.exceptions import UsageError

from ..protocol import LOG_CHUNK, MANY_LOG_BUDGET, MAX_POLL, REFUSED_EXIT, TAMPERED, write_reply
from .admission import HOSTED, cmd_prepare, cmd_start
from .bundles import cmd_bundle
from .probe import cmd_probe
from .request import (
    HostError,
    Refused,
    _attempt,
    _attempt_id,
    _local_host,
    _payload,
    _pinned,
    _prepared,
    _recorded_workspace,
    _task,
    _Unknown,
)
from .runner import cmd_verify_start, cmd_verify_status, cmd_verify_stop

if TYPE_CHECKING:
    from fleetrun.config import Config

    from .request import HasHome

#: Verbs that need only the home: answered by :func:`fast_main`, with no plugin loaded.
FAST_VERBS = frozenset({"status", "status-many", "log", "stop", "verify-status", "verify-stop", "bundle"})


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
    from fleetrun.home import default_home, home_prefix

    found = home_prefix(args, "host")
    if found is None:
        return None
    home, i = found
    if i + 1 >= len(args) or args[i + 1] not in FAST_VERBS:
        return None
    if home:
        home_path = Path(home).expanduser().resolve()
    else:
        home_path = default_home()
    return main(HomeOnly(home_path), args[i + 1 :], out, err)


def main(config: HasHome, rest: list[str], out: TextIO, err: TextIO) -> int:
    rest = [a for a in rest if a != "--json"]  # every reply is JSON
    parser = _parser()
    try:
        ns = parser.parse_args(rest)
    except SystemExit as e:
        if e.code == 0:  # --help
            return 0
        write_reply(out, {"error": f"usage: fleetrun host {{{','.join([*VERBS, 'bundle', 'serve'])}}} --json ..."})
        return 4
    if not ns.verb:
        parser.print_help(out)
        return 4
    if ns.verb == "serve":  # `fleetrun host serve` alone is the worker (the relay runs it: .serve)
        write_reply(out, {"error": "usage: fleetrun host serve [--json] (no other arguments)"})
        return 4
    if ns.verb == "bundle":  # its reply is a header line and a bundle
        reply, code = answer(config, ns, lambda: cmd_bundle(config, out))
        if not reply:
            return code
    else:
        reply, code = answer(config, ns)
    write_reply(out, reply)
    return code


def answer(
    config: HasHome, ns: argparse.Namespace, run: Optional[Callable[[], int]] = None
) -> tuple[dict[str, Any], int]:
    """Run one verb: (its JSON reply, its exit code), a refusal or an error as JSON.
    What a one-shot ``fleetrun host VERB`` prints and exits with, and what the worker
    (:mod:`.serve`) answers a request with.

    :param run: ``bundle``'s own writer instead (it prints its reply itself: then the
        reply here is empty unless it failed).
    """
    try:
        if run is not None:
            return {}, run()
        return VERBS[ns.verb](config, ns), 0
    except Refused as e:
        return {"refused": str(e)}, REFUSED_EXIT
    except HostError as e:
        reply: dict[str, Any] = {"error": str(e)}
        if isinstance(e, _Unknown):
            reply["unknown"] = True
        return reply, 1
    except UsageError as e:  # the peer's own config.toml or policy.toml: say which line
        return {"error": f"this peer's configuration is broken: {e.format()}"}, 4
    except Exception as e:  # an internal error still answers in JSON
        return internal_error(e)


def internal_error(e: BaseException) -> tuple[dict[str, Any], int]:
    import traceback

    return {
        "error": f"internal error on the peer: {type(e).__name__}: {e}",
        "traceback": traceback.format_exc()[-4000:],
    }, 3


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
    sub.add_parser("status-many", help="the status (and log) of several attempts in one reply (JSON on stdin)")
    sub.add_parser("collect", help="commit what the attempt left uncommitted (JSON on stdin)")
    sub.add_parser("cleanup", help="remove the task's worktree if clean (JSON on stdin)")
    sub.add_parser("verify-start", help="start a run verifier in the worktree (JSON on stdin)")
    sub.add_parser("bundle", help="a header line, then a git bundle of a branch (JSON on stdin)")
    sub.add_parser("serve", help="the long-lived worker: JSON requests on stdin, replies and events on stdout")
    for verb in ("verify-status", "verify-stop"):
        s = sub.add_parser(verb)
        s.add_argument("--attempt", required=True)
        s.add_argument("--idx", type=int, required=True)
    return p


def _log_chunk(path: Path, offset: int, limit: int = LOG_CHUNK) -> dict[str, Any]:
    try:
        size = path.stat().st_size
    except OSError:
        return {"log": "", "log_offset": offset, "log_size": 0}
    data = b""
    if offset < size and limit > 0:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(min(limit, LOG_CHUNK))
    return {"log": base64.b64encode(data).decode(), "log_offset": offset, "log_size": size}


def _shepherd(config: HasHome, attempt_id: str) -> tuple[Optional[int], Optional[str]]:
    """The pid and start-time token of the shepherd this peer started for an attempt,
    from its own records (``hosted.json``, then the shepherd's status file), never from
    the request: a pid a supervisor sends is at most a hint that must match them."""
    from fleetrun.shepherd import STATUS, read_json

    e = (read_json(str(config.home / HOSTED)) or {}).get(attempt_id)
    if isinstance(e, dict) and isinstance(e.get("pid"), int) and isinstance(e.get("token"), str):
        return e["pid"], e["token"]
    st = read_json(str(config.home / "attempts" / attempt_id / STATUS)) or {}
    pid, token = st.get("shepherd_pid"), st.get("shepherd_token")
    if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 and isinstance(token, str):
        return pid, token
    return None, None


def _status(config: HasHome, attempt_id: str) -> dict[str, Any]:
    pid, token = _shepherd(config, attempt_id)
    # with no token of its own, the status file alone decides (a live pid is not ours)
    return dict(_local_host(config).status(attempt_id, pid, token or "-"))


def cmd_status(config: HasHome, ns: argparse.Namespace) -> dict[str, Any]:
    attempt_id = _attempt_id(ns.attempt)
    reply: dict[str, Any] = {"status": _status(config, attempt_id)}
    if ns.offset is not None:  # the log after the status: an ended status means all of it is here
        reply.update(_log_chunk(_local_host(config).log_path(attempt_id), max(0, ns.offset)))
    return reply


def cmd_status_many(config: HasHome, ns: argparse.Namespace) -> dict[str, Any]:
    """``host status-many``: what ``host status`` answers, for each attempt of the
    payload's ``attempts`` (``[{"attempt": id, "log_offset": n}]``, at most
    :data:`MAX_POLL`), in one reply; the log chunks share :data:`MANY_LOG_BUDGET`."""
    items = _payload().get("attempts")
    if not isinstance(items, list) or len(items) > MAX_POLL:
        raise HostError(f"status-many: attempts must be a list of at most {MAX_POLL}")
    budget = MANY_LOG_BUDGET
    out: dict[str, Any] = {}
    for item in items:
        if not isinstance(item, dict):
            raise HostError("status-many: each attempt must be a table")
        attempt_id = _attempt_id(item.get("attempt"))
        reply: dict[str, Any] = {"status": _status(config, attempt_id)}
        offset = item.get("log_offset")
        if isinstance(offset, int) and not isinstance(offset, bool):
            chunk = _log_chunk(_local_host(config).log_path(attempt_id), max(0, offset), budget)
            budget -= len(chunk["log"]) * 3 // 4  # base64: the bytes it holds
            reply.update(chunk)
        out[attempt_id] = reply
    return {"statuses": out}


def cmd_log(config: HasHome, ns: argparse.Namespace) -> dict[str, Any]:
    return _log_chunk(_local_host(config).log_path(_attempt_id(ns.attempt)), max(0, ns.offset or 0))


def cmd_stop(config: HasHome, ns: argparse.Namespace) -> dict[str, Any]:
    """Stop an attempt's shepherd: a cancel file in its folder (a shepherd that has not
    started yet then runs nothing) and SIGTERM to the shepherd this peer recorded, only
    if that process still has the recorded start time."""
    from fleetrun.shepherd import CANCEL, proc_token

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


def cmd_collect(config: Config, ns: argparse.Namespace) -> dict[str, Any]:
    """Commit what the attempt left uncommitted, in the worktree this peer prepared for
    the task (the request's ``workspace`` is not used: it could name any repository)."""
    from fleetrun.gitutil import WorktreeTampered, check_pinned

    p = _payload()
    task = _task(p.get("task"))
    att = _attempt(p.get("attempt"), task)
    rec = _prepared(config.home, task.id)
    pinned = _pinned(rec) if rec.get("is_worktree") else None
    try:
        commit = config.hook.fleetrun_collect_work(
            task=task, attempt=att, workspace=_recorded_workspace(rec), host=_local_host(config), config=config
        )
        if pinned is not None:
            check_pinned(pinned)  # it held all along
    except WorktreeTampered as e:
        raise HostError(f"{TAMPERED}{e}") from None
    except Exception as e:
        raise HostError(str(e) or type(e).__name__) from None
    return {"commit": commit}


def cmd_cleanup(config: Config, ns: argparse.Namespace) -> dict[str, Any]:
    """Remove the worktree this peer prepared for a DONE task, if it is clean (the
    request's ``worktree`` is not used: it could name anyone's worktree)."""
    from fleetrun.gitutil import WorktreeTampered

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
        config.hook.fleetrun_cleanup_workspace(task=task, host=_local_host(config), config=config)
    except WorktreeTampered as e:
        raise HostError(f"{TAMPERED}{e}") from None
    except Exception as e:
        raise HostError(str(e) or type(e).__name__) from None
    return {"worktree": wt, "removed": not os.path.exists(wt)}


#: Each verb's function. A fast verb (:data:`FAST_VERBS`) may be given a :class:`HomeOnly`
#: (:func:`fast_main`), any other a :class:`~fleetrun.config.Config`: hence ``Any`` here.
VERBS: dict[str, Callable[[Any, argparse.Namespace], dict[str, Any]]] = {
    "probe": cmd_probe,
    "prepare": cmd_prepare,
    "start": cmd_start,
    "status": cmd_status,
    "status-many": cmd_status_many,
    "log": cmd_log,
    "stop": cmd_stop,
    "collect": cmd_collect,
    "cleanup": cmd_cleanup,
    "verify-start": cmd_verify_start,
    "verify-status": cmd_verify_status,
    "verify-stop": cmd_verify_stop,
}

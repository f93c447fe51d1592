"""``run`` verifiers on the peer, under a detached runner: a verifier may take many
minutes, and no SSH channel waits for it (``verify-start`` starts the runner,
``verify-status`` reads its result, ``verify-stop`` ends it).

The runner is :mod:`.verify_runner`, run by path with ``python -I -S`` as the shepherd
is (standard library only).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetrun.config import output_cap
from fleetrun.osutil import spawn_detached
from fleetrun.procutil import CAPPED_PATH, tail_text, task_env

from .admission import _host_lock
from .request import (
    HostError,
    _attempt,
    _attempt_id,
    _payload,
    _prepared_all,
    _task,
    _Unknown,
    _workspace,
)

RUNNER_PATH = str(Path(__file__).with_name("verify_runner.py"))

if TYPE_CHECKING:
    from fleetrun.config import Config

    from .request import HasHome


def _verify_dir(config: HasHome, attempt_id: str, idx: int) -> Path:
    _attempt_id(attempt_id)
    if isinstance(idx, bool) or not isinstance(idx, int) or not 0 <= idx < 10_000:
        raise HostError(f"bad verifier index {idx!r}")
    return config.home / "attempts" / attempt_id / f"verify-{idx + 1}"


def _runner_alive(vdir: Path) -> bool:
    from fleetrun.hosts import shepherd_alive
    from fleetrun.shepherd import read_json

    r = read_json(str(vdir / "runner.json")) or {}
    # without its start-time token a pid could be anyone's by now
    return isinstance(r.get("token"), str) and isinstance(r.get("pid"), int) and shepherd_alive(r["pid"], r["token"])


def cmd_verify_start(config: Config, ns: argparse.Namespace) -> dict[str, Any]:
    from fleetrun.ledger import ensure_private_dir
    from fleetrun.shepherd import proc_token, write_json

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
        for name in ("result.json", "out", "out.cut", "child.json"):
            try:
                (vdir / name).unlink()
            except FileNotFoundError:
                pass
        # spec.json holds only what fleetrun sets: the peer's own environment (its API
        # keys...) reaches the verifier through the runner's environment, never a file
        ours = task_env(task, att, cwd, base={})
        # neither file is fsynced: after a crash of this machine the runner is gone with
        # them, and a verify-status that finds no runner.json says so (the supervisor
        # then starts the verifier again); result.json, the verdict, is
        # the output is written on this machine's disk: this host's [output] max_bytes caps it
        write_json(
            str(vdir / "spec.json"),
            {
                "text": v["text"],
                "cwd": cwd,
                "env": ours,
                "timeout_s": float(timeout_s),
                "max_output": output_cap(config),
                "wrapper": CAPPED_PATH,
            },
            sync=False,
        )
        pid = spawn_detached(
            [sys.executable, "-I", "-S", RUNNER_PATH, str(vdir)], dict(os.environ, **ours), vdir / "runner.out"
        )
        write_json(
            str(vdir / "runner.json"), {"pid": pid, "token": proc_token(pid), "started": time.time()}, sync=False
        )
    return {"state": "running"}


def cmd_verify_status(config: HasHome, ns: argparse.Namespace) -> dict[str, Any]:
    from fleetrun.shepherd import read_json

    vdir = _verify_dir(config, ns.attempt, ns.idx)
    res = read_json(str(vdir / "result.json"))
    if res is not None:
        return _judged(vdir, dict(res, state="ended"))
    if not (vdir / "runner.json").exists():
        raise _Unknown("no such verifier run here")
    if _runner_alive(vdir):
        return {"state": "running"}
    res = read_json(str(vdir / "result.json"))  # it may have just finished
    if res is not None:
        return _judged(vdir, dict(res, state="ended"))
    return {
        "state": "ended",
        "passed": False,
        "reason": "the verifier's runner died on the peer",
        "output": tail_text(vdir / "out"),
        "duration_s": 0.0,
    }


def _judged(vdir: Path, res: dict[str, Any]) -> dict[str, Any]:
    """A verdict that says whether the verifier could not run at all (``error``:
    ``permanent``): it could not start, or /bin/sh's 127/126 for a first word not found
    on this machine (:func:`fleetrun.commandword.not_found_error`); the runner, which
    imports nothing of the package, leaves that to here."""
    from fleetrun.commandword import not_found_error
    from fleetrun.shepherd import read_json

    reason = res.get("reason")
    if res.get("passed") is not False or not isinstance(reason, str):
        return res
    if reason.startswith("cannot start:"):
        return dict(res, error="permanent")
    if reason in ("exit code 126", "exit code 127"):
        spec = read_json(str(vdir / "spec.json")) or {}
        text, cwd = spec.get("text"), spec.get("cwd")
        if isinstance(text, str) and isinstance(cwd, str):
            # the runner's PATH is this process's: both inherit `fleetrun host`'s environment
            why = not_found_error(text, os.environ.get("PATH"), cwd)
            if why:
                return dict(res, reason=why, error="permanent")
    return res


def cmd_verify_stop(config: HasHome, ns: argparse.Namespace) -> dict[str, Any]:
    from fleetrun.shepherd import read_json

    vdir = _verify_dir(config, ns.attempt, ns.idx)
    r = read_json(str(vdir / "runner.json")) or {}
    if r.get("pid") and _runner_alive(vdir):
        try:
            os.kill(int(r["pid"]), signal.SIGTERM)
            return {"signalled": True}
        except ProcessLookupError:
            pass
    return {"signalled": False}

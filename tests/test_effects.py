"""fleetrun/effects.py: effects run on a worker, their completions delivered on the
caller's thread, in the order they ended; and the worktree plugin's add on a worker
taking a worktree an earlier try made, refusing a folder that is not one."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from fleetrun.effects import Effects, run_inline
from fleetrun.liveness import sock_path
from fleetrun.plugins.worktree import WorkspaceError, _add_locked


def test_completions_are_delivered_on_the_loops_thread_and_wake_it(tmp_path: Path) -> None:
    wake = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    wake.bind(sock_path(tmp_path))
    eff = Effects(tmp_path, workers=2)
    gate = threading.Event()
    seen: list[tuple[str, object, bool]] = []

    def on_done(name: str):
        return lambda fut: seen.append(
            (name, fut.exception() or fut.result(), threading.current_thread() is threading.main_thread())
        )

    def boom() -> None:
        raise OSError("disk")

    eff.submit(gate.wait, on_done=on_done("held"))
    eff.submit(lambda: "ok", on_done=on_done("quick"))
    wake.settimeout(30)
    assert wake.recv(64) == b"wake"  # the quick one is over: the loop is woken
    assert eff.pending and eff.deliver() == 1
    assert seen == [("quick", "ok", True)]  # the held one does not hold up the other
    eff.submit(boom, on_done=on_done("boom"))
    gate.set()
    eff.close()  # waits for both, then delivers them here
    assert not eff.pending
    assert sorted(n for n, _, _ in seen) == ["boom", "held", "quick"]
    assert all(main for _, _, main in seen)
    assert isinstance(next(r for n, r, _ in seen if n == "boom"), OSError)
    wake.close()


def test_run_inline() -> None:
    assert run_inline(lambda a: a + 1, 1).result() == 2
    with pytest.raises(ZeroDivisionError):
        run_inline(lambda: 1 / 0).result()


def test_add_on_a_worker_takes_an_earlier_worktree_and_refuses_a_stranger(fleeter) -> None:
    repo = fleeter.make_repo()
    common = str(repo / ".git")
    locks = fleeter.path / "locks"
    path = fleeter.path / "wt" / "t1"
    path.parent.mkdir()
    _add_locked(locks, str(repo), common, "fleetrun/t1", path, "main")
    assert (path / "README.md").exists()
    # a new adoption gave up the attempt whose add ran: the next one finds it made
    _add_locked(locks, str(repo), common, "fleetrun/t1", path, "main")
    stranger = fleeter.path / "wt" / "t2"
    stranger.mkdir()
    (stranger / ".git").write_text(f"gitdir: {common}\n")
    with pytest.raises(WorkspaceError) as e:
        _add_locked(locks, str(repo), common, "fleetrun/t2", stranger, "main")
    assert e.value.permanent

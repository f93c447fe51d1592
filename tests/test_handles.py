"""The handles ``fleetrun_verify`` returns are Protocols: ``VerifyHandle`` (``poll()``)
is all the loop needs; ``cancel()``, ``fileno()`` and ``next_deadline()`` are optional,
each a runtime-checkable Protocol of its own that the loop asks with ``isinstance``."""

from __future__ import annotations

import socket
import time
from typing import Any, Optional

import pytest

import fleetrun
from fleetrun import waiting
from fleetrun.pending import PendingTable
from fleetrun.plugins.relay.host import RemoteRunHandle
from fleetrun.plugins.verify_agent import AgentHandle
from fleetrun.plugins.verify_brain import BrainHandle
from fleetrun.plugins.verify_run import RunHandle
from fleetrun.procutil import ProcessHandle
from fleetrun.reports import Cancellable, HasDeadline, Selectable, Verdict, VerifyHandle
from fleetrun.setupstage import SettingUp, SetupStage
from fleetrun.verifying import Verifying, VerifyStage


class PollOnly:
    """The least a handle may be: ``poll()`` alone."""

    def __init__(self) -> None:
        self.polls = 0

    def poll(self) -> Optional[Verdict]:
        self.polls += 1
        return None


class Full(PollOnly):
    def __init__(self, fd: int = -1, deadline: float = 0.0) -> None:
        super().__init__()
        self.cancelled = 0
        self.fd = fd
        self.deadline = deadline

    def cancel(self) -> None:
        self.cancelled += 1

    def fileno(self) -> int:
        return self.fd

    def next_deadline(self) -> float:
        return self.deadline


ALL = (VerifyHandle, Cancellable, Selectable, HasDeadline)


@pytest.mark.parametrize(
    ("cls", "kinds"),
    [
        (ProcessHandle, ALL),
        (RunHandle, ALL),
        (AgentHandle, ALL),
        (BrainHandle, ALL),
        # a peer's verifier has no descriptor here: it is asked on its own schedule
        (RemoteRunHandle, (VerifyHandle, Cancellable, HasDeadline)),
    ],
)
def test_the_built_in_handles_and_their_optional_methods(cls: type, kinds: tuple[type, ...]) -> None:
    assert {p for p in ALL if issubclass(cls, p)} == set(kinds)


def test_the_protocols_are_public() -> None:
    for name in ("VerifyHandle", "Cancellable", "Selectable", "HasDeadline"):
        assert getattr(fleetrun, name) is not None and name in fleetrun.__all__


def test_a_poll_only_handle_is_a_handle_with_no_optional_method() -> None:
    h = PollOnly()
    assert isinstance(h, VerifyHandle)
    assert not isinstance(h, Cancellable) and not isinstance(h, Selectable) and not isinstance(h, HasDeadline)


class FakeLoop:
    def __init__(self, handles: list[Any]) -> None:
        self.sock, self._peer = socket.socketpair()
        self.config = type("C", (), {"stash": fleetrun.Stash()})()
        self.pending = PendingTable()  # the loop's one table, which each stage sees its kind of
        self.verify = VerifyStage(self)
        self.setup = SetupStage(self)
        for i, h in enumerate(handles):
            self.verify.running[f"v{i}"] = Verifying(attempt=None, workspace=None, idx=0, handle=h)  # type: ignore[arg-type]
            self.setup.running[f"s{i}"] = SettingUp(
                attempt=None,
                workspace=None,
                kind="fresh",
                prev=None,  # type: ignore[arg-type]
                handle=h,
            )

    def close(self) -> None:
        self.sock.close()
        self._peer.close()


def test_stopping_calls_cancel_only_where_there_is_one() -> None:
    """Ctrl-C (``cancel_all``) and a task set aside (``drop``): a handle without
    ``cancel()`` is let go, one with it is cancelled, as before."""
    plain, full = PollOnly(), Full()
    loop = FakeLoop([plain, full])
    try:
        assert loop.verify.cancel_all() == 1  # one handle could be stopped
        assert full.cancelled == 1 and not loop.verify.running
        assert loop.setup.cancel_all() == 2
        assert full.cancelled == 2
        loop2 = FakeLoop([plain, full])
        loop2.verify.drop("v0")
        loop2.verify.drop("v1")
        assert full.cancelled == 3
        loop2.close()
    finally:
        loop.close()


def test_the_wait_selects_on_fileno_and_wakes_at_next_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[list[Any], float]] = []

    def fake_select(r: list[Any], w: list[Any], x: list[Any], timeout: float) -> tuple[list[Any], list[Any], list[Any]]:
        seen.append((list(r), timeout))
        return [], [], []

    monkeypatch.setattr(waiting.select, "select", fake_select)
    r, w = socket.socketpair()
    soon = Full(fd=r.fileno(), deadline=time.monotonic() + 0.25)
    closed = Full(fd=-1, deadline=time.monotonic() + 60)
    plain = PollOnly()
    loop = FakeLoop([plain, soon, closed])
    try:
        waiting.Waits(loop).sleep()
        ((fds, timeout),) = seen
        assert fds.count(soon) == 2 and closed not in fds and plain not in fds  # verifier and setup
        assert 0.0 < timeout <= 0.25
        seen.clear()
        only_plain = FakeLoop([plain])
        waiting.Waits(only_plain).sleep()
        assert seen[0] == ([only_plain.sock], 1.0)  # nothing to select on, no deadline: once a second
        only_plain.close()
    finally:
        loop.close()
        r.close()
        w.close()

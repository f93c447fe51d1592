"""The host status contract (docs/plugins.md), checked by
:mod:`fleetrun.testing.hostconformance` against every built-in host with real
processes: ``LocalHost``, and the relay's ``SSHHost`` against a real sshd. A host that
breaks the contract (an ended status without ``reason: "exited"``) is found by it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import pytest

from fleetrun.hostapi import AttemptRef, poll_statuses
from fleetrun.hosts import LocalHost
from fleetrun.plugins.relay.host import SSHHost
from fleetrun.plugins.relay.peers import load_peers
from fleetrun.testing.hostconformance import HostConformance, Subject, check_exit

pytest_plugins = ["sshd"]


class TestLocalHost(HostConformance):
    @pytest.fixture
    def conformance_host(self, tmp_path: Path) -> Subject:
        home = tmp_path / "home"
        home.mkdir()
        return Subject(LocalHost(home), cwd=str(tmp_path))


class TestSSHHost(HostConformance):
    @pytest.fixture
    def conformance_host(self, fleeter: Any, peer_lab: Any, tmp_path: Path) -> Any:
        m = peer_lab.machine("mini")
        r = fleeter.run("relay", "add", "mini", m.address, "--accept-new", "--command", m.command_line())
        assert r.ret == 0, r.stdout + r.stderr
        host = SSHHost(load_peers(fleeter.home)["mini"], fleeter.home)
        yield Subject(host, cwd=str(tmp_path))
        host.close()


class TestSSHHostThroughItsWorker(HostConformance):
    """The same peer, its verbs through the long-lived worker (``host serve``), which
    pushes each attempt's end."""

    @pytest.fixture
    def conformance_host(self, fleeter: Any, peer_lab: Any, tmp_path: Path) -> Any:
        m = peer_lab.machine("mini")
        r = fleeter.run("relay", "add", "mini", m.address, "--accept-new", "--command", m.command_line())
        assert r.ret == 0, r.stdout + r.stderr
        host = SSHHost(load_peers(fleeter.home)["mini"], fleeter.home, worker=True)
        yield Subject(host, cwd=str(tmp_path))
        host.close()


class NoExitedReason(LocalHost):
    """A host that leaves ``reason`` out of an ended status (what a plugin written
    from the docs alone did): every attempt of it would count as died."""

    def status(self, attempt_id: str, pid: Optional[int], token: Optional[str]) -> dict[str, Any]:
        st = super().status(attempt_id, pid, token)
        return {k: v for k, v in st.items() if k != "reason"}


def test_the_conformance_check_finds_a_host_without_reason_exited(tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match="reason"):
        check_exit(Subject(NoExitedReason(tmp_path / "home"), cwd=str(tmp_path)))


class StatusOnly:
    """A host written before ``poll``: it has ``status`` alone."""

    name = "old"

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers
        self.asked: list[str] = []

    def status(self, attempt_id: str, pid: Optional[int], token: Optional[str]) -> Any:
        self.asked.append(attempt_id)
        return self.answers.get(attempt_id)


def test_poll_statuses_asks_a_host_without_poll_once_per_attempt_and_checks_the_answers() -> None:
    host = StatusOnly({"a": {"state": "running"}, "b": ["not", "a", "table"], "c": {"exit_code": 1}})
    got = poll_statuses(host, [AttemptRef("a"), AttemptRef("b"), AttemptRef("c"), AttemptRef("d")])  # type: ignore[arg-type]
    assert host.asked == ["a", "b", "c", "d"]
    assert got["a"] == {"state": "running"}
    assert got["b"] == {"state": "unreachable", "error": "old: poll gave a status that is not a table (list)"}
    assert got["c"] == {"state": "unreachable", "error": "old: poll gave a status without a state"}
    assert got["d"] == {"state": "unreachable", "error": "old: poll gave no status for it"}

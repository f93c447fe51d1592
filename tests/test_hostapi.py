"""The host API (fleetrun/hostapi.py): the Host protocol, the run's registry of hosts
(asked once, and again only for a name it has not seen), SpawnSpec's dict form."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import fleetrun
from fleetrun.exceptions import UsageError
from fleetrun.hostapi import MissingHost, get_host, missing_host_reason, registry
from fleetrun.hosts import LocalHost


def fake_config(tmp_path: Path, offered: list[Any], calls: list[int]) -> Any:
    def fleetrun_hosts(config: Any) -> list[list[Any]]:
        calls.append(1)
        return [list(offered)]

    pm = SimpleNamespace(get_plugin=lambda name: object(), is_blocked=lambda name: False)
    return SimpleNamespace(
        hook=SimpleNamespace(fleetrun_hosts=fleetrun_hosts),
        stash={},
        home=tmp_path,
        err=io.StringIO(),
        pluginmanager=pm,
    )


def test_the_built_in_hosts_are_hosts(tmp_path: Path) -> None:
    from fleetrun.plugins.relay.host import SSHHost
    from fleetrun.plugins.relay.peers import Peer

    assert isinstance(LocalHost(tmp_path), fleetrun.Host) and LocalHost(tmp_path).local
    assert isinstance(MissingHost("mini", tmp_path, "gone"), fleetrun.Host)
    ssh = SSHHost(Peer(name="mini", address="me@127.0.0.1"), tmp_path)
    assert isinstance(ssh, fleetrun.Host) and not ssh.local and ssh.candidate(None) is None


def test_the_registry_asks_once_and_again_only_for_a_name_it_lacks(tmp_path: Path) -> None:
    calls: list[int] = []
    offered: list[Any] = [LocalHost(tmp_path)]
    config = fake_config(tmp_path, offered, calls)
    assert get_host(config, None) is offered[0] and get_host(config, "local") is offered[0]
    assert registry(config).hosts() == offered and len(calls) == 1
    bay = LocalHost(tmp_path, name="bay", root=tmp_path / "bay")
    offered.append(bay)  # offered late: found when first asked for
    assert get_host(config, "bay") is bay and len(calls) == 2
    assert bay.attempt_dir("a1") == tmp_path / "bay" / "a1"
    for _ in range(3):
        missing = get_host(config, "mini")
    assert isinstance(missing, MissingHost) and len(calls) == 3  # asked once more for it, then kept
    assert missing.status("a1", None, None)["state"] == "unreachable"
    with pytest.raises(fleetrun.StartRefused):
        missing.start("a1", {"argv": ["true"]})
    assert config.err.getvalue().count("host 'mini' is not provided by any loaded plugin") == 1
    assert missing_host_reason(config, "bay") is None and len(calls) == 3
    # the first host offered under a name wins
    offered.insert(0, LocalHost(tmp_path, name="bay", root=tmp_path / "first"))
    registry(config).refresh()
    assert get_host(config, "bay").attempt_dir("a1") == tmp_path / "first" / "a1"


def test_spawn_spec_takes_the_old_dict_and_names_an_unknown_key() -> None:
    spec = fleetrun.SpawnSpec.coerce({"argv": ["a"], "env": {"X": "1"}, "stdin": "prompt", "session_id": "s"})
    assert spec == fleetrun.SpawnSpec(argv=["a"], env={"X": "1"}, stdin="prompt", session_id="s")
    assert fleetrun.SpawnSpec.coerce(spec) is spec
    with pytest.raises(UsageError, match=r"unknown key\(s\) cmd, cwd \(a fleetrun.SpawnSpec has argv, env"):
        fleetrun.SpawnSpec.coerce({"argv": ["a"], "cmd": "x", "cwd": "/"})
    with pytest.raises(UsageError, match="without an argv list"):
        fleetrun.SpawnSpec.coerce({"env": {}})
    started = fleetrun.Started(pid=1, token="t", dir="/d", info={"remote_dir": "/r"})
    assert (started["pid"], started["dir"], started["remote_dir"]) == (1, "/d", "/r")

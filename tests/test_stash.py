"""``fleetrun.Stash`` and ``fleetrun.StashKey``: typed run-wide state, as pytest shares it."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

import pytest

import fleetrun
from fleetrun.config import Config
from fleetrun.pluginmanager import FleetPluginManager
from fleetrun.stash import Stash, StashKey

count_key = StashKey[int]()
names_key = StashKey[list[str]]()


def test_set_get_and_the_mapping_methods() -> None:
    stash = Stash()
    assert len(stash) == 0 and count_key not in stash
    stash[count_key] = 3
    assert stash[count_key] == 3 and count_key in stash and len(stash) == 1
    assert stash.get(names_key) is None
    assert stash.get(names_key, []) == []
    assert names_key not in stash  # get does not set
    names = stash.setdefault(names_key, [])
    names.append("a")
    assert stash.setdefault(names_key, ["other"]) == ["a"]
    assert stash.pop(names_key, None) == ["a"] and names_key not in stash
    assert stash.pop(names_key, None) is None
    del stash[count_key]
    assert len(stash) == 0
    with pytest.raises(KeyError):
        stash[count_key]
    with pytest.raises(KeyError):
        del stash[count_key]
    with pytest.raises(KeyError):
        stash.pop(count_key)


def test_keys_are_compared_by_identity() -> None:
    """Two keys of the same type never meet: a plugin's key is its own."""
    stash = Stash()
    a, b = StashKey[int](), StashKey[int]()
    stash[a] = 1
    assert b not in stash
    stash[b] = 2
    assert (stash[a], stash[b]) == (1, 2)


@pytest.mark.parametrize("op", ["get", "set", "contains", "setdefault", "del", "pop", "getitem"])
def test_a_string_key_is_a_type_error(op: str) -> None:
    """The dict of string keys ``config.stash`` was is gone: an old plugin's
    ``config.stash["mine"]`` says so at once instead of sharing a name by accident."""
    stash = Stash()
    with pytest.raises(TypeError, match="StashKey"):
        if op == "get":
            stash.get("ledger")  # type: ignore[call-overload]
        elif op == "set":
            stash["ledger"] = 1  # type: ignore[index]
        elif op == "contains":
            "ledger" in stash  # type: ignore[operator]  # noqa: B015
        elif op == "setdefault":
            stash.setdefault("ledger", 1)  # type: ignore[call-overload]
        elif op == "del":
            del stash["ledger"]  # type: ignore[arg-type]
        elif op == "pop":
            stash.pop("ledger", None)  # type: ignore[call-overload]
        else:
            stash["ledger"]  # type: ignore[index]  # noqa: B018


def test_config_stash_is_a_stash_and_both_are_public(tmp_path: Path) -> None:
    config = Config(FleetPluginManager(), argparse.Namespace(), tmp_path)
    assert isinstance(config.stash, fleetrun.Stash)
    assert fleetrun.StashKey is StashKey and "Stash" in fleetrun.__all__ and "StashKey" in fleetrun.__all__


def test_the_stash_example_in_plugins_md_runs(fleeter: Any) -> None:
    """docs/plugins.md's "Stateful plugins" example, as a fleetconf.py: its key keeps the
    task that needed a human, and its summary names it."""
    doc = (Path(__file__).resolve().parents[1] / "docs" / "plugins.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", doc, re.S)
    (example,) = [b for b in blocks if "needs_human_key" in b]
    fleeter.write_fleetconf(example)
    fleeter.write_tasks(f"""
        [agents.echo]
        command = ["{sys.executable}", "-c", "print('hi')"]

        [[task]]
        name = "ok"
        prompt = "p"
        cwd = "."
        agent = "echo"

        [[task]]
        name = "bad"
        prompt = "p"
        cwd = "."
        agent = "echo"
        max_retries = 0
          [[task.verify]]
          run = "false"
    """)
    result = fleeter.inline_run("tasks.toml")
    result.assert_outcomes(done=1, needs_human=1)
    result.fnmatch_lines(["look at: bad"])
    result.no_fnmatch_line("look at: ok")

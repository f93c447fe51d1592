"""Unit tests of :mod:`fleetrun.rerun`: which fields are a task's definition."""

from __future__ import annotations

import dataclasses

import pytest

from fleetrun.rerun import definition_digest, files_digest
from fleetrun.taskspec import TaskSpec, VerifySpec


def spec(**kw) -> TaskSpec:
    base = dict(name="a", prompt="do it", cwd="/r", verify=[VerifySpec("run", "make test", line=9)])
    base.update(kw)
    return TaskSpec(**base)


@pytest.mark.parametrize(
    "change",
    [
        {"prompt": "do it twice"},
        {"cwd": "/s"},
        {"git_ref": "dev"},
        {"branch": "b"},
        {"depends_on": ["x"]},
        {"agent": "codex"},
        {"model": "opus"},
        {"permission_mode": "plan"},
        {"allowed_tools": ["Read"]},
        {"role": "r"},
        {"paths": ["src"]},
        {"extra": {"base": "dependencies"}},
        {"verify": [VerifySpec("run", "make check")]},
        {"verify": []},
        {"setup": [VerifySpec("run", "make deps", extra={"setup": 1})]},
    ],
)
def test_what_counts(change):
    assert definition_digest(spec(**change), {}) != definition_digest(spec(), {})


@pytest.mark.parametrize(
    "change",
    [
        {"name": "b"},
        {"line": 40},
        {"source": "/other.toml"},
        {"key_lines": {"prompt": 3}},
        {"tags": ["slow"]},
        {"max_retries": 9},
        {"timeout_min": 1.0},
        {"stall_timeout_min": 1.0},
        {"budget_usd": 1.0},
        {"requires": ["gpu"]},
        {"peer": "mini"},
        {"verify": [VerifySpec("run", "make test", line=30, timeout_s=5.0)]},
    ],
)
def test_what_does_not_count(change):
    assert definition_digest(spec(**change), {}) == definition_digest(spec(), {})


def test_the_agent_table_of_a_command_agent_counts():
    s = spec(agent="demo")
    one = {"agents": {"demo": {"command": ["a"]}, "other": {"command": ["x"]}}}
    two = {"agents": {"demo": {"command": ["b"]}, "other": {"command": ["x"]}}}
    three = {"agents": {"demo": {"command": ["a"]}, "other": {"command": ["y"]}}}
    assert definition_digest(s, one) != definition_digest(s, two)
    assert definition_digest(s, one) == definition_digest(s, three)


def test_files_digest_ignores_order_and_lines_not_limits_or_tags():
    a, b = spec(name="a"), spec(name="b", line=20)
    moved = [dataclasses.replace(b, line=3), dataclasses.replace(a, line=12)]
    assert files_digest([a, b], {}) == files_digest(moved, {})
    assert files_digest([a, b], {}) != files_digest([dataclasses.replace(a, max_retries=7), b], {})
    assert files_digest([a, b], {}) != files_digest([dataclasses.replace(a, tags=["x"]), b], {})

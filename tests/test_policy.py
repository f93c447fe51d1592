"""policy.toml: the keys, their defaults, and every way to get one wrong."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from fleetrun.exceptions import UsageError, UsageErrors
from fleetrun.policy import LocalPolicy, PeerPolicy, Policy, PolicyWatcher, load_policy

SEED = """\
stale_after_secs = 90            # a peer heard from longer ago than this gets nothing

[local]                          # this machine
max_tasks         = 4
min_free_mem_mb   = 2048         # don't start a task below this much free memory
max_load_per_core = 1.5
min_free_disk_mb  = 5120
mem_per_task_mb   = 1024         # what a task is assumed to take until it's measured
drain             = false        # true: start nothing here (same as `supervisor drain`)

[peers]                          # defaults for every peer
max_tasks = 2

[peers.baradas-mac-mini-508f9c0e]
max_tasks = 6
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "policy.toml"
    p.write_text(textwrap.dedent(text).lstrip("\n"))
    return p


def errors_of(path: Path) -> list[str]:
    with pytest.raises(UsageError) as info:
        load_policy(path)
    e = info.value
    return [x.format() for x in (e.errors if isinstance(e, UsageErrors) else [e])]


def test_defaults_without_a_file(tmp_path: Path) -> None:
    pol = load_policy(tmp_path / "policy.toml")
    assert pol == Policy()
    assert (pol.stale_after_secs, pol.auto_route) == (90.0, False)
    assert pol.local == LocalPolicy(
        max_tasks=4,
        min_free_mem_mb=None,
        max_load_per_core=None,
        min_free_disk_mb=None,
        mem_per_task_mb=1024.0,
        drain=False,
    )
    assert pol.for_peer("anyone") == PeerPolicy(max_tasks=2)


def test_an_empty_file_is_the_defaults(tmp_path: Path) -> None:
    assert load_policy(write(tmp_path, "# nothing set\n")) == Policy()


def test_the_seed_example_reads_as_written(tmp_path: Path) -> None:
    pol = load_policy(write(tmp_path, SEED))
    assert pol.stale_after_secs == 90.0 and pol.auto_route is False
    assert pol.local == LocalPolicy(4, 2048.0, 1.5, 5120.0, 1024.0, False)
    assert pol.peers.max_tasks == 2
    assert pol.for_peer("baradas-mac-mini-508f9c0e").max_tasks == 6
    assert pol.for_peer("someone-else").max_tasks == 2


def test_a_peer_table_inherits_the_peers_defaults(tmp_path: Path) -> None:
    pol = load_policy(
        write(
            tmp_path,
            """
        auto_route = true
        [peers]
        max_tasks = 3
        min_free_mem_mb = 512
        [peers.mini]
        drain = true
    """,
        )
    )
    assert pol.auto_route is True
    mini = pol.for_peer("mini")
    assert (mini.max_tasks, mini.min_free_mem_mb, mini.drain) == (3, 512.0, True)
    assert pol.for_peer("other").drain is False


def test_claim_timeout_secs_defaults_to_300_and_is_a_positive_number(tmp_path: Path) -> None:
    assert load_policy(tmp_path / "policy.toml").claim_timeout_secs == 300.0
    pol = load_policy(write(tmp_path, "auto_route = true\nclaim_timeout_secs = 30\n"))
    assert pol.claim_timeout_secs == 30.0 and isinstance(pol.claim_timeout_secs, float)
    path = write(tmp_path, "claim_timeout_secs = 0\n")
    assert errors_of(path) == [f"ERROR: {path}:1: claim_timeout_secs: must be greater than 0"]
    path = write(tmp_path, 'claim_timeout_secs = "5m"\n')
    assert errors_of(path) == [f"ERROR: {path}:1: claim_timeout_secs: must be a number"]
    path = write(tmp_path, "claim_timeout = 30\n")
    assert errors_of(path) == [f"ERROR: {path}:1: claim_timeout: unknown key (did you mean 'claim_timeout_secs'?)"]


def test_numbers_are_floats_and_max_tasks_an_int(tmp_path: Path) -> None:
    pol = load_policy(write(tmp_path, "[local]\nmax_tasks = 0\nmin_free_mem_mb = 0\nmax_load_per_core = 2\n"))
    assert pol.local.max_tasks == 0 and isinstance(pol.local.max_tasks, int)
    assert isinstance(pol.local.min_free_mem_mb, float) and isinstance(pol.local.max_load_per_core, float)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("stale_after_sec = 90\n", ["1: stale_after_sec: unknown key (did you mean 'stale_after_secs'?)"]),
        ("autoroute = true\n", ["1: autoroute: unknown key (did you mean 'auto_route'?)"]),
        (
            'colour = "red"\n',
            ["1: colour: unknown key (known: stale_after_secs, auto_route, claim_timeout_secs, local, peers)"],
        ),
        ("# a comment\n[lcoal]\nmax_tasks = 2\n", ["2: lcoal: unknown key (did you mean 'local'?)"]),
        ("[local]\nmax_tasks = 2\nmax_task = 3\n", ["3: local.max_task: unknown key (did you mean 'max_tasks'?)"]),
        ("[local]\nmin_free_mem = 2048\n", ["2: local.min_free_mem: unknown key (did you mean 'min_free_mem_mb'?)"]),
        (
            "[local]\nstale_after_secs = 5\n",
            [
                "2: local.stale_after_secs: unknown key (known: max_tasks, min_free_mem_mb, max_load_per_core, "
                "min_free_disk_mb, mem_per_task_mb, drain)"
            ],
        ),
        ("[peers]\nmax_taks = 2\n", ["2: peers.max_taks: unknown key (did you mean 'max_tasks'?)"]),
        (
            "[peers]\nmax_tasks = 2\n\n[peers.mini]\nmax_tasks = 6\ndrian = true\n",
            ["6: peers.mini.drian: unknown key (did you mean 'drain'?)"],
        ),
        (
            "[local.extra]\nmax_tasks = 1\n",
            [
                "1: local.extra: unknown key (known: max_tasks, min_free_mem_mb, "
                "max_load_per_core, min_free_disk_mb, mem_per_task_mb, drain)"
            ],
        ),
    ],
)
def test_unknown_and_misspelt_keys(tmp_path: Path, text: str, expected: list[str]) -> None:
    path = write(tmp_path, text)
    assert errors_of(path) == [f"ERROR: {path}:{x}" for x in expected]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('stale_after_secs = "90"\n', "1: stale_after_secs: must be a number"),
        ("stale_after_secs = true\n", "1: stale_after_secs: must be a number"),
        ('auto_route = "yes"\n', "1: auto_route: must be true or false"),
        ("auto_route = 1\n", "1: auto_route: must be true or false"),
        ("local = 3\n", "1: local: must be a table"),
        ("peers = [1, 2]\n", "1: peers: must be a table"),
        ('[local]\nmax_tasks = "4"\n', "2: local.max_tasks: must be a whole number"),
        ("[local]\nmax_tasks = 2.5\n", "2: local.max_tasks: must be a whole number"),
        ("[local]\nmax_tasks = true\n", "2: local.max_tasks: must be a whole number"),
        ('[local]\nmin_free_mem_mb = "2G"\n', "2: local.min_free_mem_mb: must be a number"),
        ("[local]\nmax_load_per_core = false\n", "2: local.max_load_per_core: must be a number"),
        ("[local]\nmin_free_disk_mb = [5120]\n", "2: local.min_free_disk_mb: must be a number"),
        ("[local]\nmem_per_task_mb = {mb = 1}\n", "2: local.mem_per_task_mb: must be a number"),
        ('[local]\ndrain = "false"\n', "2: local.drain: must be true or false"),
        ("[local]\ndrain = 0\n", "2: local.drain: must be true or false"),
        ("[peers.mini]\nmax_tasks = 1.5\n", "2: peers.mini.max_tasks: must be a whole number"),
    ],
)
def test_wrong_types(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    assert errors_of(path) == [f"ERROR: {path}:{expected}"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("stale_after_secs = -1\n", "1: stale_after_secs: must be greater than 0"),
        ("stale_after_secs = 0\n", "1: stale_after_secs: must be greater than 0"),
        ("stale_after_secs = nan\n", "1: stale_after_secs: must be a finite number"),
        ("[local]\nmax_tasks = -1\n", "2: local.max_tasks: must not be negative"),
        ("[local]\nmin_free_mem_mb = -2048\n", "2: local.min_free_mem_mb: must not be negative"),
        ("[local]\nmax_load_per_core = -0.5\n", "2: local.max_load_per_core: must not be negative"),
        ("[local]\nmin_free_disk_mb = -1\n", "2: local.min_free_disk_mb: must not be negative"),
        ("[local]\nmem_per_task_mb = -1024\n", "2: local.mem_per_task_mb: must not be negative"),
        ("[local]\nmin_free_mem_mb = nan\n", "2: local.min_free_mem_mb: must be a finite number"),
        ("[local]\nmin_free_mem_mb = inf\n", "2: local.min_free_mem_mb: must be a finite number"),
        ("[peers]\nmax_tasks = -2\n", "2: peers.max_tasks: must not be negative"),
        ("[peers.mini]\nmin_free_mem_mb = -1\n", "2: peers.mini.min_free_mem_mb: must not be negative"),
    ],
)
def test_negative_and_non_finite_numbers(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    assert errors_of(path) == [f"ERROR: {path}:{expected}"]


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        stale_after_secs = 0
        [local]
        max_task = 3
        min_free_mem_mb = -1
        drain = "no"

        [peers.mini]
        max_tasks = "six"
    """,
    )
    assert errors_of(path) == [
        f"ERROR: {path}:1: stale_after_secs: must be greater than 0",
        f"ERROR: {path}:3: local.max_task: unknown key (did you mean 'max_tasks'?)",
        f"ERROR: {path}:4: local.min_free_mem_mb: must not be negative",
        f"ERROR: {path}:5: local.drain: must be true or false",
        f"ERROR: {path}:8: peers.mini.max_tasks: must be a whole number",
    ]


def test_invalid_toml_names_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, "[local]\nmax_tasks = 4\nmin_free_mem_mb = \n")
    (msg,) = errors_of(path)
    assert msg.startswith(f"ERROR: {path}:3: invalid TOML: ")


# -- PolicyWatcher ------------------------------------------------------------------------


def test_watcher_keeps_the_last_good_policy_and_says_so_once(tmp_path: Path) -> None:
    path = write(tmp_path, "[local]\nmax_tasks = 3\n")
    w = PolicyWatcher(path)
    assert w.load_strict().local.max_tasks == 3
    assert w.refresh() is None  # unchanged

    path.write_text("[local]\nmax_tasks = 1\nmax_task = 2\n")
    msg = w.refresh()
    assert msg == (
        f"{path} changed and is broken; keeping the last good policy until it is fixed:\n"
        f"ERROR: {path}:3: local.max_task: unknown key (did you mean 'max_tasks'?)"
    )
    assert w.policy.local.max_tasks == 3  # the last good one
    assert w.refresh() is None and w.refresh() is None  # said once

    path.write_text("[local]\nmax_tasks = 5\n")
    assert w.refresh() == f"{path} is good again; using it"
    assert w.policy.local.max_tasks == 5 and w.error is None
    assert w.refresh() is None


def test_watcher_sees_an_edit_that_keeps_size_and_mtime(tmp_path: Path) -> None:
    path = write(tmp_path, "[local]\nmax_tasks = 3\n")
    w = PolicyWatcher(path)
    w.load_strict()
    st = path.stat()
    path.write_text("[local]\nmax_tasks = 2\n")
    import os

    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert w.refresh() is None
    assert w.policy.local.max_tasks == 2


def test_watcher_new_and_removed_file(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    w = PolicyWatcher(path)
    assert w.load_strict() == Policy()
    path.write_text("[local]\ndrain = true\n")
    assert w.refresh() is None and w.policy.local.drain is True
    path.unlink()
    assert w.refresh() is None and w.policy == Policy()


def test_watcher_load_strict_raises_on_a_broken_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[local]\nmax_tasks = -4\n")
    with pytest.raises(UsageError, match="must not be negative"):
        PolicyWatcher(path).load_strict()


# -- through the CLI ----------------------------------------------------------------------


def test_work_refuses_to_start_with_a_broken_policy(fleeter: Any) -> None:
    path = fleeter.write_policy("""
        [local]
        max_tasks = 2
        min_free_mem = 2048
    """)
    r = fleeter.run("work", "--until-idle")
    assert r.ret == 4, r.stdout + r.stderr
    assert r.errlines == [f"ERROR: {path}:3: local.min_free_mem: unknown key (did you mean 'min_free_mem_mb'?)"]
    assert not (fleeter.home / "loop.sock").exists()


def test_a_run_refuses_to_start_with_a_broken_policy(fleeter: Any) -> None:
    fleeter.make_repo()
    fleeter.write_tasks('[[task]]\nname = "t1"\ncwd = "repo"\nprompt = "p"\n')
    path = fleeter.write_policy("[local]\nmax_tasks = -1\n")
    r = fleeter.run("tasks.toml")
    assert r.ret == 4
    r.fnmatch_lines([f"ERROR: {path}:2: local.max_tasks: must not be negative"])


def test_a_broken_policy_queues_nothing(fleeter: Any) -> None:
    fleeter.make_repo()
    fleeter.write_tasks('[[task]]\nname = "t1"\ncwd = "repo"\nprompt = "p"\n')
    fleeter.write_policy("[local]\nmax_tasks = -1\n")
    assert fleeter.run("tasks.toml").ret == 4
    assert fleeter.states() == {}


def test_validate_checks_the_policy_with_the_tasks_files(fleeter: Any) -> None:
    # docs/policy.md: the run refuses a broken policy, so validate must not say "valid"
    fleeter.write_tasks('[[task]]\nname = "t1"\nprompt = "p"\n')
    path = fleeter.write_policy('[local]\nmax_tasks = "four"\n')
    r = fleeter.run("validate", "tasks.toml")
    assert "Traceback" not in r.stderr
    assert (r.ret, r.outlines, r.errlines) == (4, [], [f"ERROR: {path}:2: local.max_tasks: must be a whole number"])
    # both at once: the machine's file first, then the tasks file's
    fleeter.write_tasks('[[task]]\nname = "t1"\nprompt = "p"\nretries = 1\n')
    assert fleeter.run("validate", "tasks.toml").errlines == [
        f"ERROR: {path}:2: local.max_tasks: must be a whole number",
        "ERROR: tasks.toml:4: task 't1': retries: unknown key (did you mean 'max_retries'?)",
    ]
    path.write_text("[local]\nmax_tasks = 4\n")
    assert fleeter.run("validate", "tasks.toml").ret == 4
    fleeter.write_tasks('[[task]]\nname = "t1"\nprompt = "p"\n')
    assert fleeter.run("validate", "tasks.toml").ret == 0

"""Placement: the pure filter -> score function over generated fleets, the requires
grammar, backoff timing, and the pieces of the ``placement`` plugin that measure this
machine (tool probes, memory of running attempts)."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from fleetrun.placement import (
    Backoff,
    backoff_delay,
    blocked,
    decide,
    label,
    parse_requirement,
    reason_shape,
    requirement_met,
    why_not,
)
from fleetrun.pluginmanager import FleetPluginManager
from fleetrun.plugins import placement as plugin
from fleetrun.policy import POLICY_KEY, LocalPolicy, Policy
from fleetrun.probe import Prober, claude_auth, parse_version, probe_versions, tool_names
from fleetrun.reports import Candidate, Placement, Wait
from fleetrun.stash import Stash
from fleetrun.waiting import BACKOFF_KEY

# -- generated fleets ------------------------------------------------------------------------

NAMES = ["local", "mini", "studio", "rack7"]  # no name is part of another, or of a reason's words
TAGS = ["docker", "gpu"]
NODE_VERSIONS = [None, "18.19.0", "22.3.0", "v23.1"]

# The meaning of each requirement the generator draws, written out independently of
# requirement_met: what the filter must agree with.
REQ_ORACLE: dict[str, Callable[[Candidate], bool]] = {
    "docker": lambda c: "docker" in c.tags,
    "gpu": lambda c: "gpu" in c.tags,
    "git": lambda c: "git" in c.tools,
    "node": lambda c: "node" in c.tools,
    "node>=22": lambda c: c.tools.get("node") in ("22.3.0", "v23.1"),
    "git>=2.40": lambda c: c.tools.get("git") == "2.43.0",
    "claude:auth": lambda c: "claude" in c.auth,
    "nosuchtool": lambda c: False,
    "node >= 99": lambda c: False,
    "not a requirement!": lambda c: False,
}


def maybe(strategy: Any) -> Any:
    """None (unset, or unknown) a third of the time."""
    return st.one_of(st.none(), strategy, strategy)


def floor(strategy: Any) -> Any:
    """Unset two times in three."""
    return st.one_of(st.none(), st.none(), strategy)


@st.composite
def candidates(draw: Any, name: str) -> Candidate:
    tools: dict[str, Optional[str]] = {}
    if draw(st.booleans()):
        tools["git"] = draw(st.sampled_from([None, "2.39.1", "2.43.0"]))
    if draw(st.booleans()):
        tools["node"] = draw(st.sampled_from(NODE_VERSIONS))
    if draw(st.booleans()):
        tools["claude"] = "2.1.0"
    healthy = draw(st.integers(0, 3)) > 0  # most machines are up; the rest are down in some way
    return Candidate(
        name=name,
        kind="local" if name == "local" else "peer",
        free_mem_mb=draw(
            maybe(
                st.one_of(
                    st.sampled_from([0.0, 2048.0, 8192.0]), st.floats(min_value=0, max_value=65536, allow_nan=False)
                )
            )
        ),
        load_per_core=draw(maybe(st.floats(min_value=0, max_value=4, allow_nan=False))),
        free_disk_mb=draw(maybe(st.floats(min_value=0, max_value=10**6, allow_nan=False))),
        running=draw(st.integers(0, 4)),
        max_tasks=draw(st.integers(0, 8)),
        drain=not healthy and draw(st.booleans()),
        fresh=healthy or draw(st.booleans()),
        status="live" if healthy else draw(st.sampled_from(["live", "stale", "never"])),
        tags=frozenset(draw(st.sets(st.sampled_from(TAGS)))),
        tools=tools,
        auth=frozenset(["claude"]) if "claude" in tools and draw(st.booleans()) else frozenset(),
        mem_per_task_mb=draw(st.one_of(st.just(1024.0), st.floats(min_value=0, max_value=4096, allow_nan=False))),
        min_free_mem_mb=draw(floor(st.floats(min_value=0, max_value=32768, allow_nan=False))),
        max_load_per_core=draw(floor(st.floats(min_value=0, max_value=4, allow_nan=False))),
        min_free_disk_mb=draw(floor(st.floats(min_value=0, max_value=10**5, allow_nan=False))),
        why_not=None if healthy else draw(st.sampled_from([None, "refused the last task: full"])),
        why_not_needs_operator=not healthy and draw(st.booleans()),
    )


@st.composite
def fleets(draw: Any) -> list[Candidate]:
    names = draw(st.lists(st.sampled_from(NAMES), unique=True, max_size=len(NAMES)))
    return [draw(candidates(n)) for n in names]


@st.composite
def backoffs(draw: Any, now: float) -> dict[str, Backoff]:
    names = draw(st.lists(st.sampled_from(NAMES), unique=True, max_size=2))
    out = {}
    for n in names:
        count = draw(st.integers(1, 12))
        out[n] = Backoff(
            count,
            now + draw(st.sampled_from([-10.0, 0.0, 0.5, backoff_delay(count)])),
            draw(st.sampled_from(["peer_refused", "start_failed"])),
        )
    return out


def passes(c: Candidate, requires: list[str], est: float, b: Optional[Backoff], now: float) -> bool:
    """The filter, from the issue's words, written without looking at why_not."""
    return (
        c.why_not is None
        and c.status == "live"
        and c.fresh
        and not c.drain
        and not (b is not None and b.until > now)
        and c.running < c.max_tasks
        and (c.min_free_mem_mb is None or (c.free_mem_mb is not None and c.free_mem_mb - est >= c.min_free_mem_mb))
        and (c.max_load_per_core is None or (c.load_per_core is not None and c.load_per_core <= c.max_load_per_core))
        and (c.min_free_disk_mb is None or (c.free_disk_mb is not None and c.free_disk_mb >= c.min_free_disk_mb))
        and all(REQ_ORACLE[r](c) for r in requires)
    )


def after(c: Candidate, est: float) -> float:
    return c.free_mem_mb - est if c.free_mem_mb is not None else float("-inf")


@settings(max_examples=400)
@given(
    fleet=fleets(),
    requires=st.one_of(st.just([]), st.lists(st.sampled_from(sorted(REQ_ORACLE)), max_size=3, unique=True)),
    pin=st.one_of(st.none(), st.none(), st.none(), st.sampled_from([*NAMES, "elsewhere"])),
    data=st.data(),
)
def test_decide_over_generated_fleets(
    fleet: list[Candidate], requires: list[str], pin: Optional[str], data: Any
) -> None:
    now = 1_000_000.0
    backoff = data.draw(backoffs(now))
    est_map = data.draw(
        st.one_of(
            st.none(),
            st.fixed_dictionaries(
                {}, optional={n: st.floats(min_value=0, max_value=4096, allow_nan=False) for n in NAMES}
            ),
        )
    )
    before = copy.deepcopy(fleet)
    result = decide(requires, fleet, backoff, now, pin=pin, est_mem_mb=est_map)
    assert fleet == before  # pure: the candidates are not touched
    event("placed" if isinstance(result, Placement) else "waits")

    def est(c: Candidate) -> float:
        return (est_map or {}).get(c.name, c.mem_per_task_mb)

    pool = [c for c in fleet if pin is None or c.name == pin]
    ok = [c for c in pool if passes(c, requires, est(c), backoff.get(c.name), now)]
    if isinstance(result, Placement):
        chosen = next(c for c in fleet if c.name == result.host)
        assert pin is None or chosen.name == pin  # a pinned task goes only to its pin
        assert chosen in ok
        assert chosen.running < chosen.max_tasks  # never over max_tasks
        if chosen.min_free_mem_mb is not None:  # never below a set floor; unknown is not room
            assert chosen.free_mem_mb is not None
            assert chosen.free_mem_mb - est(chosen) >= chosen.min_free_mem_mb
        if chosen.max_load_per_core is not None:
            assert chosen.load_per_core is not None and chosen.load_per_core <= chosen.max_load_per_core
        if chosen.min_free_disk_mb is not None:
            assert chosen.free_disk_mb is not None and chosen.free_disk_mb >= chosen.min_free_disk_mb
        for other in ok:  # the most free memory after placing; ties to the fewest running
            assert after(chosen, est(chosen)) >= after(other, est(other))
            if after(chosen, est(chosen)) == after(other, est(other)):
                assert chosen.running <= other.running
    else:
        assert isinstance(result, Wait)
        assert ok == []
        assert result.reason
        if pin is not None and not pool:
            assert result.reason == f"pinned to peer '{pin}', which is not paired (fleetrun relay add {pin} USER@HOST)"
        elif not pool:
            assert result.reason == "no machine can take tasks"
        for c in pool:  # every excluded candidate is named, with its own reason
            assert label(c) in result.reason
            assert why_not(c, requires, est(c), backoff.get(c.name), now) in result.reason
        live_backoffs = [b.until for n, b in backoff.items() if b.until > now and any(c.name == n for c in pool)]
        assert result.until == (min(live_backoffs) if live_backoffs else None)
        # a wait the run may end on: only when no candidate can ever take it without a person
        stuck = [blocked(c, requires) for c in pool]
        assert bool(result.operator) == (not pool or all(stuck))
        if result.operator:
            assert all(why in result.operator for why in stuck if why is not None)
        if result.operator and pool:
            for c in pool:  # each reason a person must clear, from the words
                assert (
                    c.drain
                    or c.max_tasks <= 0
                    or (c.why_not is not None and c.why_not_needs_operator)
                    or (
                        c.status == "live"
                        and c.fresh
                        and c.why_not is None
                        and not all(REQ_ORACLE[r](c) for r in requires)
                    )
                )


@settings(max_examples=200)
@given(fleet=fleets(), tasks=st.integers(0, 40))
def test_placing_many_tasks_never_overcommits(fleet: list[Candidate], tasks: int) -> None:
    """Placing one task after another, updating the chosen candidate as the loop does."""
    start = {c.name: (c.running, c.free_mem_mb) for c in fleet}
    placed = {c.name: 0 for c in fleet}
    for _ in range(tasks):
        result = decide([], fleet, {}, 0.0)
        if isinstance(result, Wait):
            break
        c = next(c for c in fleet if c.name == result.host)
        assert c.running < c.max_tasks
        if c.min_free_mem_mb is not None:
            assert c.free_mem_mb is not None and c.free_mem_mb - c.mem_per_task_mb >= c.min_free_mem_mb
        c.running += 1
        if c.free_mem_mb is not None:
            c.free_mem_mb -= c.mem_per_task_mb
        placed[c.name] += 1
    for c in fleet:
        assert placed[c.name] <= max(0, c.max_tasks - start[c.name][0])


def test_ties_go_to_the_fewest_running_then_the_first() -> None:
    a = Candidate("local", free_mem_mb=4096, running=2, mem_per_task_mb=1024)
    b = Candidate("mini", kind="peer", free_mem_mb=4096, running=1, mem_per_task_mb=1024, max_tasks=2)
    c = Candidate("studio", kind="peer", free_mem_mb=4096, running=1, mem_per_task_mb=1024, max_tasks=2)
    assert decide([], [a, b, c]) == Placement("mini", reason="placed on mini")
    # the estimate counts: a roomier machine that expects a bigger task can lose
    assert decide([], [a, b], est_mem_mb={"mini": 3000}).host == "local"


def test_a_machine_with_unknown_memory_and_no_floor_comes_last() -> None:
    unknown = Candidate("local", free_mem_mb=None)
    known = Candidate("mini", kind="peer", free_mem_mb=10, max_tasks=2)
    assert decide([], [unknown, known]).host == "mini"
    assert decide([], [unknown]).host == "local"


# -- the seed's reasons, word for word -------------------------------------------------------


def test_reasons_in_the_seeds_words() -> None:
    local = Candidate("local", running=4, max_tasks=4)
    mini = Candidate("mini", kind="peer", max_tasks=2, tags=frozenset({"gpu"}))
    assert decide(["docker"], [local, mini]).reason == "this machine is running 4 of 4 tasks; mini lacks `docker`"

    draining = Candidate("local", drain=True)
    stale = Candidate("mini", kind="peer", status="stale", fresh=False)
    assert decide([], [draining, stale]).reason == "this machine is draining; mini has not been heard from recently"

    now = 5000.0
    w = decide([], [draining, Candidate("mini", kind="peer")], {"mini": Backoff(3, now + 7, "peer_refused")}, now)
    assert w == Wait(
        "this machine is draining; mini didn't start the last 3 attempt(s) (peer_refused); backing off 20s",
        until=now + 7,
    )


def test_a_wait_only_a_person_can_clear_is_told_apart() -> None:
    floor = Candidate("local", free_mem_mb=100.0, min_free_mem_mb=4096.0)
    assert decide([], [floor]).operator is None  # free memory changes by itself
    assert decide([], [Candidate("local", running=2, max_tasks=2)]).operator is None  # a slot frees up
    assert decide([], [Candidate("mini", kind="peer", status="stale", fresh=False)]).operator is None
    now = 100.0
    assert decide([], [Candidate("local")], {"local": Backoff(1, now + 5)}, now).operator is None
    assert decide([], [Candidate("local", why_not="is paused: usage limit")]).operator is None
    # a requires no machine meets is said even while a floor would also stop it
    w = decide(["gpu"], [floor])
    assert w.reason.startswith("this machine has 100 MB free")
    assert w.operator == "this machine lacks `gpu`"
    assert decide([], [Candidate("local", drain=True)]).operator == "this machine is draining"
    assert decide([], [Candidate("local", max_tasks=0)]).operator == "this machine is running 0 of 0 tasks"
    assert (
        decide([], [Candidate("local", why_not="has no fleetrun", why_not_needs_operator=True)]).operator
        == "this machine has no fleetrun"
    )
    # a peer not heard from may not have told its tags yet: not a reason to give up
    assert decide(["gpu"], [Candidate("mini", kind="peer", status="never", fresh=False)]).operator is None
    assert (
        decide([], [Candidate("local", drain=True), Candidate("mini", kind="peer", running=1, max_tasks=1)]).operator
        is None
    )
    assert (
        decide([], [Candidate("local")], pin="mini").operator
        == "pinned to peer 'mini', which is not paired (fleetrun relay add mini USER@HOST)"
    )
    assert decide([], []).operator == "no machine can take tasks"


def test_other_reasons() -> None:
    assert (
        why_not(Candidate("mini", kind="peer", status="never", fresh=False), [], 0, None, 0)
        == "mini has never been heard from"
    )
    assert (
        why_not(Candidate("mini", kind="peer", why_not="could not be reached: timed out"), [], 0, None, 0)
        == "mini could not be reached: timed out"
    )
    c = Candidate("local", free_mem_mb=3000.7, min_free_mem_mb=2048, mem_per_task_mb=1024)
    assert (
        why_not(c, [], 1024, None, 0)
        == "this machine has 3000 MB free; a task needs 1024 MB above the floor of 2048 MB"
    )
    assert (
        why_not(Candidate("local", min_free_mem_mb=0), [], 0, None, 0)
        == "this machine has not reported its free memory"
    )
    assert (
        why_not(Candidate("local", load_per_core=2.25, max_load_per_core=1.5), [], 0, None, 0)
        == "this machine is loaded 2.25/core (limit 1.5)"
    )
    assert (
        why_not(Candidate("local", max_load_per_core=1.5), [], 0, None, 0) == "this machine has not reported its load"
    )
    assert (
        why_not(Candidate("local", free_disk_mb=100, min_free_disk_mb=5120), [], 0, None, 0)
        == "this machine has 100 MB of disk free (floor 5120 MB)"
    )
    assert (
        why_not(Candidate("local", min_free_disk_mb=1), [], 0, None, 0) == "this machine has not reported its free disk"
    )
    assert why_not(Candidate("local"), ["docker", "node>=22"], 0, None, 0) == "this machine lacks `docker`, `node>=22`"
    assert why_not(Candidate("local", max_tasks=0), [], 0, None, 0) == "this machine is running 0 of 0 tasks"
    # an expired backoff is no reason
    assert why_not(Candidate("local"), [], 0, Backoff(4, 10.0), 11.0) is None


def test_a_zero_floor_still_needs_a_measurement() -> None:
    c = Candidate("local", free_mem_mb=None, min_free_mem_mb=0.0)
    assert isinstance(decide([], [c]), Wait)


def test_reason_shape_blanks_only_measurements() -> None:
    a = "this machine has 812 MB free; a task needs 1024 MB above the floor of 900 MB; mini is loaded 2.50/core (limit 1.5)"
    b = "this machine has 790 MB free; a task needs 1000 MB above the floor of 900 MB; mini is loaded 2.61/core (limit 1.5)"
    assert reason_shape(a) == reason_shape(b)
    assert reason_shape(a) != reason_shape(a.replace("900", "800"))  # the floor is policy, not a measurement
    assert reason_shape("x has 3 MB of disk free (floor 9 MB)") == "x has # MB of disk free (floor 9 MB)"
    assert reason_shape("mini is running 2 of 2 tasks") == "mini is running 2 of 2 tasks"
    assert reason_shape("mini didn't start the last 3 attempt(s) (peer_refused); backing off 20s") != reason_shape(
        "mini didn't start the last 4 attempt(s) (peer_refused); backing off 40s"
    )


# -- backoff ---------------------------------------------------------------------------------


def test_backoff_delay_sequence() -> None:
    assert [backoff_delay(n) for n in range(1, 9)] == [5, 10, 20, 40, 80, 160, 300, 300]
    assert backoff_delay(0) == 0 and backoff_delay(-1) == 0
    assert backoff_delay(10_000) == 300


def test_backoff_reason_is_steady_while_it_runs_down() -> None:
    c = Candidate("mini", kind="peer")
    b = Backoff(2, 100.0, "start_failed")
    assert (
        why_not(c, [], 0, b, 91.0)
        == why_not(c, [], 0, b, 99.5)
        == "mini didn't start the last 2 attempt(s) (start_failed); backing off 10s"
    )


def test_another_machine_takes_the_task_during_a_backoff() -> None:
    local = Candidate("local", free_mem_mb=100)
    mini = Candidate("mini", kind="peer", free_mem_mb=9000, max_tasks=2)
    assert decide([], [local, mini], {"mini": Backoff(1, 50.0)}, now=10.0).host == "local"
    assert decide([], [local, mini], {"mini": Backoff(1, 50.0)}, now=60.0).host == "mini"


# -- requires --------------------------------------------------------------------------------

MACHINE = Candidate(
    "mini",
    kind="peer",
    tags=frozenset({"docker", "gpu"}),
    tools={"node": "22.3.0", "git": "2.43.0", "cargo": None, "claude": "2.1.301", "python3": "3.9.6"},
    auth=frozenset({"claude"}),
)


@pytest.mark.parametrize(
    ("req", "met"),
    [
        ("docker", True),
        ("gpu", True),
        ("tpu", False),
        ("node", True),
        ("cargo", True),
        ("nosuchtool", False),
        ("node>=22", True),
        ("node>=22.3", True),
        ("node>=22.3.0", True),
        ("node>=22.3.1", False),
        ("node>=23", False),
        ("node >= 18", True),
        ("git>=2", True),
        ("git>=2.44", False),
        ("python3>=3.10", False),
        ("python3>=3.9", True),  # 3.9 < 3.10: compared as numbers
        ("cargo>=1", False),  # present, version unknown: an unknown is never plenty
        ("docker>=1", False),  # a tag has no version
        ("claude:auth", True),
        ("node:auth", False),
        ("docker:auth", False),
        ("", False),
        ("node>=", False),
        (">=22", False),
        ("node>22", False),
        ("node==22", False),
        ("claude: auth", False),
        ("two words", False),
    ],
)
def test_requirement_met(req: str, met: bool) -> None:
    assert requirement_met(req, MACHINE) is met


def test_parse_requirement() -> None:
    assert parse_requirement("docker") is not None and parse_requirement("docker").bare  # type: ignore[union-attr]
    r = parse_requirement("node>=22")
    assert r is not None and (r.name, r.min_version, r.auth, r.bare) == ("node", "22", False, False)
    r = parse_requirement("claude:auth")
    assert r is not None and (r.name, r.auth, r.bare) == ("claude", True, False)
    assert parse_requirement("no good") is None


# -- probing tools ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("git version 2.43.0\n", "2.43.0"),
        ("Python 3.11.7\n", "3.11.7"),
        ("v22.3.0\n", "22.3.0"),
        ("cargo 1.75.0 (1d8b05cdd 2023-11-20)\n", "1.75.0"),
        ("2.1.301 (Claude Code)\n", "2.1.301"),
        ("tool v18\n", "18"),
        ("no version here\n", None),
        ("built for x86_64 1.2\n", "1.2"),
    ],
)
def test_parse_version(text: str, version: Optional[str]) -> None:
    assert parse_version(text) == version


def tool(bindir: Path, name: str, body: str) -> None:
    p = bindir / name
    p.write_text(f"#!/bin/sh\n{body}\n")
    p.chmod(0o755)


@pytest.fixture
def bindir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "bin"
    d.mkdir()
    tool(d, "mytool", 'echo "mytool version 1.2.3"')
    tool(d, "noversion", 'echo "hello"')
    tool(d, "failing", 'echo "1.0"; exit 1')
    tool(d, "slow", "sleep 60; echo 1.0")
    tool(d, "stderrtool", 'echo "stderrtool 4.5" >&2')
    monkeypatch.setenv("PATH", f"{d}{os.pathsep}{os.environ['PATH']}")
    return d


def test_probe_versions(bindir: Path) -> None:
    t0 = time.monotonic()
    found = probe_versions(
        {n: n for n in ["mytool", "noversion", "failing", "slow", "stderrtool", "absent"]}, timeout=3.0
    )
    # the slow one is given up on, not waited for (3 s: a loaded machine may take a second
    # or two to run even the quick ones, which must all be found)
    assert time.monotonic() - t0 < 30
    assert found == {"mytool": "1.2.3", "noversion": None, "stderrtool": "4.5"}
    # an executable named by path, under another tool name
    assert probe_versions({"claude": str(bindir / "mytool")}) == {"claude": "1.2.3"}


def test_probed_tools_and_extra() -> None:
    assert tool_names() == ["claude", "git", "cargo", "python3", "node"]
    assert tool_names(["docker", "git", "", "docker"]) == ["claude", "git", "cargo", "python3", "node", "docker"]


def test_prober_caches_with_a_ttl(bindir: Path) -> None:
    now = [0.0]
    p = Prober(ttl=600, clock=lambda: now[0])
    assert p.get({"mytool": "mytool"}).tools == {"mytool": "1.2.3"}
    tool(bindir, "mytool", 'echo "mytool 9.9"')
    now[0] = 599
    assert p.get({"mytool": "mytool"}).tools == {"mytool": "1.2.3"} and p.runs == 1
    now[0] = 600
    assert p.get({"mytool": "mytool"}).tools == {"mytool": "9.9"} and p.runs == 2
    p.get({"mytool": "mytool", "noversion": "noversion"})  # other tools: probed again
    assert p.runs == 3


def test_claude_auth(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    assert claude_auth({}, home) is False
    assert claude_auth({"ANTHROPIC_API_KEY": "sk-ant-x"}, home) is True
    assert claude_auth({"ANTHROPIC_API_KEY": " "}, home) is False
    assert claude_auth({"CLAUDE_CODE_OAUTH_TOKEN": "t"}, home) is True
    assert claude_auth({"CLAUDE_CODE_USE_BEDROCK": "1"}, home) is True
    assert claude_auth({"CLAUDE_CODE_USE_BEDROCK": "0"}, home) is False
    (home / ".claude.json").write_text('{"numStartups": 3}')
    assert claude_auth({}, home) is False
    (home / ".claude.json").write_text('{"oauthAccount": {"emailAddress": "a@b.c"}}')
    assert claude_auth({}, home) is True
    (home / ".claude.json").unlink()
    (home / ".claude").mkdir()
    (home / ".claude" / ".credentials.json").write_text("not json")
    assert claude_auth({}, home) is False
    (home / ".claude" / ".credentials.json").write_text('{"claudeAiOauth": {"accessToken": "x"}}')
    assert claude_auth({}, home) is True
    # CLAUDE_CONFIG_DIR moves the whole configuration
    other = tmp_path / "cfg"
    other.mkdir()
    assert claude_auth({"CLAUDE_CONFIG_DIR": str(other)}, home) is False
    (other / ".claude.json").write_text('{"oauthAccount": {"x": 1}}')
    assert claude_auth({"CLAUDE_CONFIG_DIR": str(other)}, home) is True


# -- this machine as a candidate -------------------------------------------------------------


def test_tree_rss_counts_the_children() -> None:
    import psutil

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not psutil.Process(child.pid).memory_info().rss:
            time.sleep(0.05)
        own = psutil.Process().memory_info().rss / 2**20
        tree = plugin.tree_rss_mb(os.getpid())
        assert tree is not None and tree > own
        assert plugin.tree_rss_mb(child.pid, token="not-its-token") is None  # a reused pid is not it
    finally:
        child.kill()
        child.wait()
    assert plugin.tree_rss_mb(child.pid) is None


def test_memory_sampler_mean_of_peaks() -> None:
    rss = {101: 300.0, 102: 500.0, 103: 50.0}
    s = plugin.MemorySampler(measure=lambda pid, token: rss.get(pid))
    now = 1000.0
    assert s.estimate() is None
    running = {"state": "running"}
    s.sample(
        [
            ("a1", {**running, "agent_pid": 101, "agent_started": now - 60}),
            ("a2", {**running, "agent_pid": 102, "agent_started": now - 60}),
            ("a3", {**running, "agent_pid": 103, "agent_started": now - 1}),  # too young yet
            ("a4", {"state": "starting", "agent_pid": None}),
            ("a5", {**running, "agent_pid": 104, "agent_started": now - 60}),
        ],  # gone: unmeasured
        now,
    )
    assert s.estimate() == 400.0
    rss[101] = 100.0  # a peak is kept
    rss[102] = 700.0
    s.sample(
        [
            ("a1", {**running, "agent_pid": 101, "agent_started": now - 60}),
            ("a2", {**running, "agent_pid": 102, "agent_started": now - 60}),
        ],
        now + 1,
    )
    assert s.estimate() == 500.0
    for i in range(plugin.KEEP_PEAKS + 5):
        s.sample([(f"b{i}", {**running, "agent_pid": 103, "agent_started": 0})], now)
    assert len(s.peaks) == plugin.KEEP_PEAKS and s.estimate() == 50.0


class FakeConfig:
    def __init__(
        self,
        home: Path,
        settings: Optional[dict[str, Any]] = None,
        policy: Optional[Policy] = None,
        max_tasks: Optional[int] = None,
    ) -> None:
        self.home = home
        self.stash = Stash()
        if policy:
            self.stash[POLICY_KEY] = policy
        self._settings = settings or {}
        self._max_tasks = max_tasks
        self.invocation_dir = home
        # the hooks the place plugin calls (fleetrun_place_filter/_score), with no plugin
        self.pluginmanager = FleetPluginManager()
        self.hook = self.pluginmanager.hook

    def getoption(self, name: str, default: Any = None) -> Any:
        return self._max_tasks if name == "max_tasks" else default

    def setting(self, table: str, key: Optional[str] = None, default: Any = None) -> Any:
        t = self._settings.get(table, {})
        return t.get(key, default) if key else (t or default)


def test_this_machine_as_a_candidate(tmp_path: Path) -> None:
    pol = Policy(
        local=LocalPolicy(
            max_tasks=3,
            min_free_mem_mb=100,
            max_load_per_core=2.0,
            min_free_disk_mb=10,
            mem_per_task_mb=900,
            drain=False,
        )
    )
    cfg = FakeConfig(tmp_path / "not-yet", {"relay": {"tags": ["docker", 7]}}, pol)
    c = plugin.local_candidate(cfg)
    assert (c.name, c.kind, c.max_tasks, c.running, c.drain) == ("local", "local", 3, 0, False)
    assert c.free_mem_mb and c.free_mem_mb > 0 and c.free_disk_mb and c.free_disk_mb > 0
    assert c.load_per_core is not None and c.load_per_core >= 0
    assert c.tags == frozenset({"docker"})
    assert (c.min_free_mem_mb, c.max_load_per_core, c.min_free_disk_mb) == (100, 2.0, 10)
    assert c.mem_per_task_mb == 900 and c.info["mem_estimate"] == "mem_per_task_mb"
    assert c.tools == {}  # nothing waits with requires: nothing probed
    assert plugin.PROBER_KEY not in cfg.stash
    # once measured, the measured mean replaces mem_per_task_mb
    sampler = plugin.MemorySampler(measure=lambda pid, token: 333.0)
    sampler.sample([("a1", {"state": "running", "agent_pid": 1, "agent_started": 0})], 100.0)
    cfg.stash[plugin.MEMORY_KEY] = sampler
    c = plugin.local_candidate(cfg)
    assert c.mem_per_task_mb == 333.0 and c.info["mem_estimate"] == "measured"
    # --max-tasks wins over policy.toml, even 0
    c = plugin.local_candidate(FakeConfig(tmp_path, policy=pol, max_tasks=0))
    assert c.max_tasks == 0
    c = plugin.local_candidate(FakeConfig(tmp_path))
    assert (c.max_tasks, c.mem_per_task_mb, c.min_free_mem_mb) == (4, 1024.0, None)


def test_configured_tools() -> None:
    cfg = FakeConfig(Path("/x"), {"relay": {"tools": ["docker"]}, "claude": {"executable": "/opt/claude"}})
    assert plugin.configured_tools(cfg) == {
        "claude": "/opt/claude",
        "git": "git",
        "cargo": "cargo",
        "python3": "python3",
        "node": "node",
        "docker": "docker",
    }


class FakeTask:
    def __init__(self, tid: str = "task_1", state: Any = None, host: Optional[str] = None, **spec: Any) -> None:
        from fleetrun.states import State
        from fleetrun.taskspec import TaskSpec, VerifySpec

        verify = [VerifySpec(kind=k, text="x") for k in spec.pop("verify", [])]
        self.id = tid
        self.state = state or State.READY
        self.host = host
        self.spec = TaskSpec(name="t", prompt="p", cwd="/", verify=verify, **spec)


def test_place_pins_and_local_only_tasks(tmp_path: Path) -> None:
    from fleetrun.states import State

    cfg = FakeConfig(tmp_path)
    roomy = Candidate("mini", kind="peer", free_mem_mb=9000, max_tasks=2)
    local = Candidate("local", free_mem_mb=100)

    def place(task: FakeTask, cands: list[Candidate]) -> Any:
        return plugin.fleetrun_place(task=task, candidates=cands, policy=Policy(), config=cfg)

    assert place(FakeTask(), [local, roomy]).host == "mini"
    assert place(FakeTask(peer="local"), [local, roomy]).host == "local"
    assert place(FakeTask(role="backend"), [local, roomy]).host == "local"
    assert place(FakeTask(verify=["run", "brain"]), [local, roomy]).host == "local"
    assert place(FakeTask(verify=["agent"]), [local, roomy]).host == "local"
    why = "a task with a role runs on this machine, but it is pinned to mini"
    assert place(FakeTask(role="backend", peer="mini"), [local, roomy]) == Wait(why, operator=why)
    unpaired = "pinned to peer 'nowhere', which is not paired (fleetrun relay add nowhere USER@HOST)"
    assert place(FakeTask(peer="nowhere"), [local, roomy]) == Wait(unpaired, operator=unpaired)
    assert place(FakeTask(state=State.RETRYING, host="local"), [local, roomy]).host == "local"  # same worktree
    cfg.stash[BACKOFF_KEY] = {"task_1": {"mini": Backoff(1, time.time() + 60)}}
    assert place(FakeTask(), [local, roomy]).host == "local"


def test_a_waiting_reason_holds_still_while_memory_moves(tmp_path: Path) -> None:
    cfg = FakeConfig(tmp_path)

    def place(free: float, floor: float = 5000) -> Any:
        c = Candidate("local", free_mem_mb=free, min_free_mem_mb=floor, mem_per_task_mb=1024)
        return plugin.fleetrun_place(task=FakeTask(), candidates=[c], policy=Policy(), config=cfg)

    first = place(3000).reason
    assert first == "this machine has 3000 MB free; a task needs 1024 MB above the floor of 5000 MB"
    assert place(2950).reason == first  # the same reason: shown once
    assert (
        place(2950, floor=4000).reason
        == "this machine has 2950 MB free; a task needs 1024 MB above the floor of 4000 MB"
    )  # policy changed
    assert isinstance(place(9000), Placement)
    assert place(2000).reason.startswith("this machine has 2000 MB free")  # a new wait, fresh figures


@settings(max_examples=200)
@given(
    fleet=fleets(),
    queue=st.lists(
        st.tuples(
            st.one_of(st.just(()), st.lists(st.sampled_from(sorted(REQ_ORACLE)), max_size=2).map(tuple)),
            st.one_of(st.none(), st.none(), st.sampled_from(NAMES)),
            st.booleans(),
        ),
        max_size=25,
    ),
)
def test_one_pass_remembers_nothing_decide_would_not_say(fleet: list[Candidate], queue: list[Any]) -> None:
    """Through the plugin's per-pass memory, a pass places and waits exactly as decide does."""
    direct, memo = copy.deepcopy(fleet), copy.deepcopy(fleet)
    stash = Stash()
    now = time.time()
    for requires, pin, backed_off in queue:
        backoff = {NAMES[1]: Backoff(1, now + 60)} if backed_off else {}
        a = decide(list(requires), direct, backoff, now, pin=pin)
        b = plugin.same_pass(stash, memo, list(requires), pin, backoff)
        assert type(a) is type(b)
        if isinstance(a, Placement):
            assert a.host == b.host  # type: ignore[union-attr]
            for cands in (direct, memo):  # what the loop does after a lease
                c = next(c for c in cands if c.name == a.host)
                c.running += 1
                if c.free_mem_mb is not None:
                    c.free_mem_mb -= c.mem_per_task_mb
        else:
            assert a.reason == b.reason  # type: ignore[union-attr]


def test_a_new_pass_forgets(tmp_path: Path) -> None:
    stash = Stash()
    full = [Candidate("local", running=1, max_tasks=1)]
    assert plugin.same_pass(stash, full, [], None, {}) == Wait("this machine is running 1 of 1 tasks")
    assert plugin.same_pass(stash, full, [], None, {}) == Wait("this machine is running 1 of 1 tasks")
    assert isinstance(plugin.same_pass(stash, [Candidate("local", max_tasks=1)], [], None, {}), Placement)


def test_a_placement_in_the_pass_clears_what_was_remembered() -> None:
    stash = Stash()
    fleet = [Candidate("local", running=3, max_tasks=4)]
    assert plugin.same_pass(stash, fleet, ["docker"], None, {}).reason == "this machine lacks `docker`"  # type: ignore[union-attr]
    assert isinstance(plugin.same_pass(stash, fleet, [], None, {}), Placement)
    fleet[0].running += 1  # as the loop does
    assert plugin.same_pass(stash, fleet, ["docker"], None, {}).reason == "this machine is running 4 of 4 tasks"  # type: ignore[union-attr]


# -- plugin filters and scores (fleetrun_place_filter / fleetrun_place_score) --------------


def test_a_score_changes_which_of_two_candidates_is_chosen() -> None:
    """The built-in score is the free memory after placing, in MB: a plugin's score adds to it."""
    local = Candidate("local", free_mem_mb=5000, mem_per_task_mb=1000)
    mini = Candidate("mini", kind="peer", free_mem_mb=6000, mem_per_task_mb=1000)
    assert decide([], [local, mini]) == Placement("mini", reason="placed on mini")
    prefer_local = {"local": 1500.0}
    got = decide([], [local, mini], extra_score=lambda c: prefer_local.get(c.name, 0.0))
    assert got == Placement("local", reason="placed on this machine")
    # 1000 MB of preference is exactly the 1000 MB that separates them: the tie goes to fewer running
    mini.running = 1
    assert decide([], [local, mini], extra_score=lambda c: 1000.0 if c.name == "local" else 0.0).host == "local"
    # a candidate whose free memory is unknown still ranks below every known one; among
    # unknown ones the plugin's score decides
    a, b = Candidate("a", kind="peer"), Candidate("b", kind="peer")
    assert decide([], [a, b]).host == "a"
    assert decide([], [a, b], extra_score=lambda c: 1.0 if c.name == "b" else 0.0).host == "b"
    assert decide([], [a, local], extra_score=lambda c: 1e9 if c.name == "a" else 0.0).host == "local"


def test_a_filter_excludes_with_its_reason_in_the_built_in_shape() -> None:
    local = Candidate("local", free_mem_mb=9000)
    mini = Candidate("mini", kind="peer", free_mem_mb=100)
    keep_off = lambda c: "is kept free of GPU tasks" if c.name == "local" else None  # noqa: E731
    assert decide([], [local, mini], extra_filter=keep_off).host == "mini"
    got = decide([], [local], extra_filter=keep_off)
    assert isinstance(got, Wait)
    assert got.reason == "this machine is kept free of GPU tasks"
    # no pass clears a plugin's rule by itself: with every candidate held by one, a person must act
    assert got.operator == "this machine is kept free of GPU tasks"
    # an empty string excludes nothing
    assert decide([], [local], extra_filter=lambda c: "").host == "local"
    # a floor that may clear comes first, and the wait is not the operator's
    full = Candidate("local", running=4, max_tasks=4)
    assert decide([], [full], extra_filter=keep_off) == Wait("this machine is running 4 of 4 tasks")


def test_filters_and_scores_keep_every_built_in_check() -> None:
    """requires, floors, backoff and the pin still hold, however a plugin scores."""
    seen: list[str] = []

    def score(c: Candidate) -> float:
        seen.append(c.name)
        return 1e9 if c.name == "local" else 0.0

    local = Candidate("local", free_mem_mb=9000, min_free_mem_mb=100)
    mini = Candidate("mini", kind="peer", free_mem_mb=2000, tags=frozenset({"gpu"}))
    assert decide(["gpu"], [local, mini], extra_score=score).host == "mini"
    assert decide(["no-such-tool"], [local], extra_score=score) == Wait(
        "this machine lacks `no-such-tool`", operator="this machine lacks `no-such-tool`"
    )
    now = time.time()
    assert decide([], [local, mini], {"local": Backoff(1, now + 60)}, now, extra_score=score).host == "mini"
    assert decide([], [local, mini], pin="mini", extra_score=score).host == "mini"
    starved = Candidate("local", free_mem_mb=500, min_free_mem_mb=100, mem_per_task_mb=1024)
    assert isinstance(decide([], [starved], extra_score=score), Wait)
    assert seen == ["mini", "mini", "mini"]  # only candidates that passed every check are scored


def _place_with(cfg: Any, task: Any, cands: list[Candidate]) -> Any:
    return plugin.fleetrun_place(task=task, candidates=cands, policy=Policy(), config=cfg)


def test_the_place_plugin_calls_the_filter_and_score_hooks(tmp_path: Path) -> None:
    calls: list[tuple[str, str, str]] = []

    class Prefs:
        @staticmethod
        def fleetrun_place_filter(task: Any, candidate: Candidate, config: Any) -> Optional[str]:
            calls.append(("filter", task.id, candidate.name))
            return "is kept free of GPU tasks" if "gpu" in task.spec.requires and candidate.kind == "local" else None

        @staticmethod
        def fleetrun_place_score(task: Any, candidate: Candidate, config: Any) -> Optional[float]:
            calls.append(("score", task.id, candidate.name))
            return 5000.0 if candidate.name == "studio" else None

    class Second:
        @staticmethod
        def fleetrun_place_score(task: Any, candidate: Candidate, config: Any) -> Optional[float]:
            return -4000.0 if candidate.name == "studio" else None  # summed with Prefs': +1000 in all

    cfg = FakeConfig(tmp_path)
    cfg.pluginmanager.register(Prefs(), "prefs")
    local = Candidate("local", free_mem_mb=9000, tags=frozenset({"gpu"}))
    studio = Candidate("studio", kind="peer", free_mem_mb=6000)
    assert _place_with(cfg, FakeTask("t1"), [local, studio]).host == "studio"
    cfg.pluginmanager.register(Second(), "second")
    assert _place_with(cfg, FakeTask("t2"), [local, studio]).host == "local"  # 6000 + 1000 < 9000
    cfg.pluginmanager.unregister(name="second")

    # the filter's reason is the task's wait, in why_not's shape; requires still hold
    calls.clear()
    gpu = FakeTask("t3", requires=["gpu"])
    got = _place_with(cfg, gpu, [local])
    assert got == Wait("this machine is kept free of GPU tasks", operator="this machine is kept free of GPU tasks")
    assert (
        _place_with(cfg, FakeTask("t4", requires=["no-such-tool"]), [local, studio]).reason
        == "this machine lacks `no-such-tool`; studio lacks `no-such-tool`"
    )
    # a retry goes back to its machine, whatever the score says
    from fleetrun.states import State

    assert _place_with(cfg, FakeTask("t5", state=State.RETRYING, host="local"), [local, studio]).host == "local"


def test_a_filter_is_called_once_per_task_and_candidate_in_a_pass(tmp_path: Path) -> None:
    calls: list[tuple[str, str]] = []

    class Count:
        @staticmethod
        def fleetrun_place_filter(task: Any, candidate: Candidate, config: Any) -> Optional[str]:
            calls.append((task.id, candidate.name))
            return "says no" if task.id == "t1" else None

    cfg = FakeConfig(tmp_path)
    cfg.pluginmanager.register(Count(), "count")
    full = Candidate("local", running=3, max_tasks=4)
    fleet = [full, Candidate("mini", kind="peer", running=2, max_tasks=2)]
    for _ in range(3):  # the same pass (the same candidates list): asked once
        assert _place_with(cfg, FakeTask("t1"), fleet).reason == "this machine says no; mini is running 2 of 2 tasks"
    assert calls == [("t1", "local")]
    # another task of the same shape is asked about itself: the filter may look at the task
    assert _place_with(cfg, FakeTask("t2"), fleet).host == "local"
    assert calls == [("t1", "local"), ("t2", "local")]
    # a new pass asks again
    fleet2 = [Candidate("local", running=3, max_tasks=4)]
    assert _place_with(cfg, FakeTask("t1"), fleet2).reason == "this machine says no"
    assert calls[-1] == ("t1", "local") and len(calls) == 3


def test_builtin_place_takes_a_filter_and_a_score_of_ones_own(tmp_path: Path) -> None:
    """What a plugin's own fleetrun_place calls to keep every built-in check (docs/plugins.md)."""
    from fleetrun.states import State

    cfg = FakeConfig(tmp_path)
    local = Candidate("local", free_mem_mb=9000)
    studio = Candidate("studio", kind="peer", free_mem_mb=6000)
    fleet = [local, studio]
    prefer = lambda c: 1e9 if c.name == "studio" else 0.0  # noqa: E731
    assert plugin.builtin_place(FakeTask("t1"), fleet, cfg, extra_score=prefer).host == "studio"
    assert plugin.builtin_place(FakeTask("t2"), fleet, cfg).host == "local"
    off = lambda c: "is off limits" if c.name == "studio" else None  # noqa: E731
    assert plugin.builtin_place(FakeTask("t3"), fleet, cfg, extra_filter=off, extra_score=prefer).host == "local"
    # the built-in checks still hold: requires, a retry's machine
    got = plugin.builtin_place(FakeTask("t4", requires=["no-such-tool"]), fleet, cfg, extra_score=prefer)
    assert got.reason == "this machine lacks `no-such-tool`; studio lacks `no-such-tool`"
    retry = FakeTask("t5", state=State.RETRYING, host="local")
    assert plugin.builtin_place(retry, fleet, cfg, extra_score=prefer).host == "local"
    # one task's answer is not another's when a filter may look at the task
    busy = [Candidate("local", running=3, max_tasks=4)]
    only_t6 = lambda c: "says no to t6" if seen_task[0] == "t6" else None  # noqa: E731
    seen_task = ["t6"]
    assert plugin.builtin_place(FakeTask("t6"), busy, cfg, extra_filter=only_t6).reason == "this machine says no to t6"
    seen_task[0] = "t7"
    assert plugin.builtin_place(FakeTask("t7"), busy, cfg, extra_filter=only_t6).host == "local"


def test_a_waiting_tasks_decision_is_kept_only_when_every_place_hook_declares_itself_pure() -> None:
    """Issue 23: the loop keeps a waiting task's placement decision while nothing it
    depends on changed only when each ``fleetrun_place``/filter/score implementation's
    plugin declares ``PURE_PLACEMENT = True`` (the built-in ``placement`` and the relay),
    not when its module's name starts with ``fleetrun.plugins.``."""
    from types import ModuleType, SimpleNamespace

    from fleetrun.pluginmanager import FleetPluginManager
    from fleetrun.starting import Starting

    pm = FleetPluginManager()
    pm.consider_builtins()

    def pure() -> bool:
        return Starting.pure_placement(SimpleNamespace(loop=SimpleNamespace(config=SimpleNamespace(hook=pm.hook))))  # type: ignore[arg-type]

    assert pure()
    mine = ModuleType("fleetrun.plugins.not_declared")  # a built-in's name is no longer enough

    def fleetrun_place_filter(task: Any, candidate: Candidate, config: Any) -> Optional[str]:
        return None

    mine.fleetrun_place_filter = fleetrun_place_filter  # type: ignore[attr-defined]
    pm.register(mine, "not_declared")
    assert not pure()
    mine.PURE_PLACEMENT = True  # type: ignore[attr-defined]
    assert pure()

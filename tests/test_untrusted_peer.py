"""Fuzzing the supervisor's reading of peers (issue 10, item 4): each verb's reply
parser (:mod:`fleetrun.plugins.relay.protocol`), the raw reply reader, the bundle header, and the
cached peer state either return a value or raise only ``Malformed`` (or, where a
reply is read off the wire, ``PeerError`` with a reason); never anything else.

Bounded here (``max_examples=200``); ``bench/fuzz_peer.py --examples N`` runs the same
targets as long as you like and prints the counts.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetrun.plugins.relay import protocol as wire
from fleetrun.plugins.relay.bundle import BundleSink
from fleetrun.plugins.relay.peers import checked_entry
from fleetrun.plugins.relay.protocol import parse_reply
from fleetrun.plugins.relay.transport import PeerError
from fleetrun.untrusted import Malformed

# -- what a peer could send ---------------------------------------------------------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(1 << 70), max_value=1 << 70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.sampled_from(
        [
            "",
            "garbage",
            "big",
            "abc",
            "no",
            "lots",
            "ended",
            "running",
            "!!",
            "=" * 3,
            "aGVsbG8=",
            "0" * 40,
            "f" * 64,
            "../x",
            "\x00",
            "\u202e",
        ]
    ),
)
json_values = st.recursive(
    scalars,
    lambda kids: st.one_of(st.lists(kids, max_size=5), st.dictionaries(st.text(max_size=12), kids, max_size=6)),
    max_leaves=25,
)

SHA = "0123456789abcdef0123456789abcdef01234567"
#: A valid reply of each verb, which the fuzzer then damages.
VALID: dict[str, dict[str, Any]] = {
    "status": {
        "status": {
            "state": "ended",
            "exit_code": 0,
            "reason": "exited",
            "shepherd_pid": 12,
            "shepherd_token": "t",
            "started": 1.0,
            "ended": 2.0,
        },
        "log": "aGVsbG8K",
        "log_offset": 0,
        "log_size": 6,
    },
    "log": {"log": "aGVsbG8K", "log_offset": 0, "log_size": 6},
    "status-many": {
        "statuses": {
            "task_a_1_a1": {"status": {"state": "running", "shepherd_pid": 12}},
            "task_b_1_a1": {
                "status": {"state": "ended", "exit_code": 3, "reason": "exited"},
                "log": "aGVsbG8K",
                "log_offset": 0,
                "log_size": 6,
            },
        }
    },
    "stop": {"signalled": True, "status": {"state": "running"}},
    "start": {"pid": 42, "token": "1234", "dir": "/h/attempts/a"},
    "prepare": {
        "workspace": {
            "path": "/h/w/x",
            "branch": "fleetrun/x",
            "repo": "/r",
            "base_ref": "main",
            "is_worktree": True,
            "root": "/h/w/x",
        }
    },
    "collect": {"commit": SHA},
    "cleanup": {"worktree": "/h/w/x", "removed": True},
    "verify-start": {"state": "running"},
    "verify-status": {"state": "ended", "passed": False, "reason": "exit code 1", "output": "x", "duration_s": 0.5},
    "verify-stop": {"signalled": False},
    "bundle": {"fleetrun_bundle": 1, "tip": SHA, "fork": SHA, "have": [SHA], "bundle": True},
    "probe": {
        "fleetrun": "0.1.0",
        "features": ["supervised-tasks-1"],
        "hostname": "h",
        "os": "linux",
        "arch": "x86_64",
        "python": "3.11",
        "home": "/h",
        "time": 1.0,
        "running": 0,
        "max_tasks": 4,
        "drain": False,
        "tags": ["gpu"],
        "mem_per_task_mb": 1024.0,
        "tools": {"git": "2.4"},
        "auth": [],
        "free_mem_mb": 1.0,
        "load_per_core": 0.1,
        "free_disk_mb": 9.0,
    },
}
VALID["peer-state"] = {
    "last_heard": 1.0,
    "probe": VALID["probe"],
    "error": None,
    "error_at": None,
    "pending_stops": {"a": {"pid": 3, "token": "t", "since": 1.0, "error": "x"}},
}

PARSERS: dict[str, Callable[[Any], Any]] = {
    "status": wire.parse_status_reply,
    "log": wire.parse_log_reply,
    # a poll's one request: only the attempts asked about
    "status-many": lambda reply: wire.parse_status_many_reply(reply, ["task_a_1_a1", "task_b_1_a1"]),
    "stop": wire.parse_stop_reply,
    "start": wire.parse_start_reply,
    "prepare": wire.parse_prepare_reply,
    "collect": wire.parse_collect_reply,
    "cleanup": wire.parse_cleanup_reply,
    "verify-start": wire.parse_verify_start_reply,
    "verify-status": wire.parse_verify_status_reply,
    "verify-stop": wire.parse_verify_stop_reply,
    "bundle": wire.parse_bundle_header,
    "probe": wire.parse_probe_reply,
    "peer-state": wire.parse_peer_entry,
}


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key path into a JSON value (where the fuzzer may put something else)."""
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += paths(v, (*prefix, i))
    return out


def damaged(verb: str) -> st.SearchStrategy[Any]:
    """A valid reply of ``verb`` with one value replaced, one key dropped, or garbage."""
    base = VALID[verb]
    where = paths(base)

    def replace(path: tuple[Any, ...], new: Any) -> Any:
        if not path:
            return new
        root = json.loads(json.dumps(base))
        node = root
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = new
        return root

    def drop(path: tuple[Any, ...]) -> Any:
        root = json.loads(json.dumps(base))
        if not path:
            return root
        node = root
        for k in path[:-1]:
            node = node[k]
        del node[path[-1]]
        return root

    return st.one_of(
        st.builds(replace, st.sampled_from(where), json_values),
        st.builds(drop, st.sampled_from(where)),
        json_values,
    )


def run_parser(verb: str, value: Any) -> str:
    """The property: a value, or :class:`Malformed`; nothing else escapes. :return: which."""
    try:
        PARSERS[verb](value)
    except Malformed:
        return "malformed"
    return "ok"


def run_entry(value: Any) -> str:
    entry, why = checked_entry(value)  # never raises: a bad entry is a reason
    assert isinstance(entry, dict) and (why is None or isinstance(why, str))
    if why is None and entry.get("probe") is not None:  # what placement and `relay peers` then read
        probe = entry["probe"]
        int(probe.get("running") or 0)
        frozenset(probe.get("tags") or ())
        for k in ("free_mem_mb", "load_per_core", "free_disk_mb"):
            assert probe.get(k) is None or math.isfinite(probe[k])
    return "ok" if why is None else "malformed"


def run_raw(data: bytes) -> str:
    """Raw bytes off the wire: the reply reader, then every parser over what it found."""
    reply = parse_reply(data)
    if reply is None:
        return "no reply"
    for verb in PARSERS:
        run_parser(verb, reply)
    return "reply"


def run_bundle_stream(chunks: list[bytes], tmp: Path) -> str:
    sink = BundleSink(tmp / "fuzz.bundle")
    try:
        for c in chunks:
            sink.feed(c)
    except PeerError:
        return "refused"
    finally:
        sink.close()
    return "header" if sink.header is not None else "no header"


def raw_bytes() -> st.SearchStrategy[bytes]:
    as_json = st.builds(lambda v: json.dumps(v, allow_nan=True).encode(), json_values)
    damaged_json = st.builds(lambda v: (json.dumps(v) + "\n").encode(), st.sampled_from(sorted(VALID)).flatmap(damaged))
    deep = st.builds(
        lambda n, close: b'{"a": ' + b"[" * n + (b"]" * n + b"}" if close else b""),
        st.integers(1, 200_000),
        st.booleans(),
    )  # json.loads recurses
    return st.one_of(
        st.binary(max_size=300),
        as_json,
        damaged_json,
        deep,
        st.builds(lambda a, b: a + b"\n" + b, st.binary(max_size=60), as_json),
    )


def bundle_chunks() -> st.SearchStrategy[list[bytes]]:
    header = st.builds(lambda v: (json.dumps(v) + "\n").encode(), damaged("bundle"))
    return st.lists(st.one_of(st.binary(max_size=80), header, st.just(b'{"fleetrun_bundle": 1, "tip": ')), max_size=5)


# -- the bounded fuzzers -------------------------------------------------------------

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("verb", sorted(PARSERS))
def test_each_reply_parser_returns_a_value_or_malformed(verb):
    @FUZZ
    @given(damaged(verb))
    def check(value: Any) -> None:
        run_parser(verb, value)

    check()


def test_the_valid_replies_parse():
    for verb, parser in PARSERS.items():
        parser(VALID[verb])


@FUZZ
@given(st.one_of(damaged("peer-state"), json_values))
def test_the_cached_peer_state_is_an_entry_or_a_reason(value):
    run_entry(value)


@FUZZ
@given(raw_bytes())
def test_raw_reply_bytes_never_raise(data):
    run_raw(data)


@FUZZ
@given(bundle_chunks())
def test_the_bundle_header_stream_is_a_header_or_a_refusal(tmp_path_factory, chunks):
    run_bundle_stream(chunks, tmp_path_factory.mktemp("bundle"))


def test_the_replies_of_the_issue_are_refused():
    """The exact replies of the report, each refused with a reason."""
    cases = [
        ("status", {"status": "garbage"}),
        ("log", {"log": "%%%", "log_offset": 0, "log_size": 3}),
        ("status", dict(VALID["status"], log_size="big")),
        ("verify-status", dict(VALID["verify-status"], duration_s="abc")),
        ("verify-status", dict(VALID["verify-status"], passed="no")),
        ("probe", dict(VALID["probe"], running="lots")),
        ("probe", dict(VALID["probe"], tags="gpu")),
    ]
    for verb, reply in cases:
        with pytest.raises(Malformed):
            PARSERS[verb](reply)
    entry, why = checked_entry({"last_heard": 1.0, "probe": dict(VALID["probe"], running="lots")})
    assert entry == {} and why is not None and "running" in why


# -- and the other way: what a supervisor sends a peer -------------------------------

TASK = {
    "id": "task_m0abc_0",
    "name": "fix",
    "state": "ASSIGNED",
    "source": "",
    "queue_id": "q",
    "created": 0,
    "updated": 0,
    "spec": {"name": "fix", "prompt": "p", "cwd": "/tmp", "git_ref": "main"},
}
ATTEMPT = {
    "id": "task_m0abc_0_a1",
    "task_id": "task_m0abc_0",
    "number": 1,
    "kind": "fresh",
    "host": "mini",
    "state": "leased",
    "created": 0,
}
VALID["request-task"] = TASK
VALID["request-attempt"] = ATTEMPT


@FUZZ
@given(st.one_of(damaged("request-task"), json_values), st.one_of(damaged("request-attempt"), json_values))
def test_a_peer_reads_a_request_into_a_task_and_attempt_or_refuses_it(task, attempt):
    from fleetrun.plugins.relay.peer.request import HostError, _attempt, _task

    try:
        t = _task(task)
    except HostError:
        return
    assert isinstance(t.id, str) and "/" not in t.id and isinstance(t.spec.cwd, str)
    try:
        a = _attempt(attempt, t)
    except HostError:
        return
    assert a.id == f"{t.id}_a{a.number}"

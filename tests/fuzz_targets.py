"""Fuzz targets for the agent side of fleetrun's strict parsing layer (issue 10).

Each target is a hypothesis strategy of untrusted input and a check that feeds it to
a pure parser: the parser returns a value of the promised type and range, or raises
its one reasoned failure (:class:`fleetrun.untrusted.Malformed`, ``BrainError``);
anything else is a bug. ``tests/test_untrusted.py`` runs them bounded in the suite,
``bench/fuzz.py`` runs them long. Needs hypothesis, not pytest.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any, Callable

from hypothesis import strategies as st

from fleetrun import claudecli, untrusted
from fleetrun.hosts import status_from_bytes
from fleetrun.plugins import claude
from fleetrun.plugins.verify_brain import BrainError, parse_brain_reply
from fleetrun.reports import AgentResult

# --------------------------------------------------------------------------- values

NASTY_NUMBERS = st.sampled_from(
    [
        0,
        -1,
        1,
        10**30,
        -(10**30),
        99999999999,
        1e308,
        -0.0,
        0.5,
        float("nan"),
        float("inf"),
        float("-inf"),
        2**63,
        2**22 + 1,
    ]
)
NASTY_TEXT = st.sampled_from(
    [
        "",
        "abc",
        "\ud800",
        "\x00",
        "\x1b[2J",
        "NaN",
        "1e999",
        "x" * 5000,
        "rejected",
        "ended",
        "exited",
        "usage limit reached|99999999999",
    ]
)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | NASTY_NUMBERS
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=30)
    | NASTY_TEXT
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)


def shaped(keys: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Objects with the keys a parser reads, each value either a plausible one or
    anything at all; some keys missing, some extra."""
    fields = {k: (v | JSON) for k, v in keys.items()}
    mixed = st.fixed_dictionaries({}, optional=fields).flatmap(
        lambda d: st.dictionaries(st.text(max_size=8), JSON, max_size=2).map(lambda extra: {**extra, **d})
    )
    plausible = st.fixed_dictionaries({}, optional=dict(keys))  # mostly accepted: the happy path is fuzzed too
    return plausible | mixed


def dumps(value: Any) -> str:
    return json.dumps(value)  # NaN and Infinity stay: a JSON parser in Python reads them


# --------------------------------------------------------------------------- stream-json

RESULT_KEYS: dict[str, Any] = {
    "type": st.just("result"),
    "subtype": st.sampled_from(["success", "error_max_budget_usd", "error_during_execution"]),
    "is_error": st.booleans(),
    "result": st.text(max_size=40) | NASTY_TEXT,
    "session_id": st.uuids().map(str),
    "total_cost_usd": st.floats(0, 10) | NASTY_NUMBERS,
    "num_turns": st.integers(0, 50),
    "permission_denials": st.lists(
        st.fixed_dictionaries({"tool_name": st.just("Bash"), "tool_input": st.dictionaries(st.text(max_size=5), JSON)}),
        max_size=3,
    ),
    "api_error_status": st.sampled_from([None, 429, 529, 500]),
    "errors": st.lists(st.text(max_size=20) | NASTY_TEXT, max_size=3),
}
RATE_KEYS: dict[str, Any] = {
    "type": st.just("rate_limit_event"),
    "session_id": st.uuids().map(str),
    "rate_limit_info": st.fixed_dictionaries(
        {"status": st.sampled_from(["rejected", "allowed"])},
        optional={"resetsAt": NASTY_NUMBERS | st.integers() | JSON},
    ),
}
EVENTS = shaped(RESULT_KEYS) | shaped(RATE_KEYS) | JSON


def _line(ev: Any, cut: int, mode: int) -> str:
    text = dumps(ev)
    if mode == 1:
        return text[:cut]  # truncated
    if mode == 2:
        return text.encode("utf-8", "surrogatepass")[:cut].decode("latin-1")  # binary-ish
    if mode == 3:
        return "[" * cut + "]" * cut  # nested
    return text


LINES = st.builds(_line, EVENTS, st.integers(0, 3000), st.integers(0, 6))
STREAMS = st.lists(LINES | st.text(max_size=50), max_size=6).map("\n".join)


def check_stream(text: str) -> None:
    try:
        parsed = claudecli.read_stream(text)
    except untrusted.Malformed as e:
        assert str(e)
    else:
        res = parsed["result"]
        assert res is None or (math.isfinite(res.cost_usd) and 0 <= res.cost_usd <= untrusted.MAX_COST_USD)
    compat = claudecli.parse_stream(text)  # the dict shape verify_agent reads: never raises
    assert compat["result"] is None or isinstance(compat["result"]["total_cost_usd"], float)
    for code in (0, 1, None):
        out = claude.result_from_log(text, code)
        check_agent_result(out)


def check_agent_result(out: AgentResult) -> None:
    assert isinstance(out, AgentResult)
    assert isinstance(out.ok, bool) and isinstance(out.reason, str)
    assert out.cost_usd is None or (math.isfinite(out.cost_usd) and out.cost_usd >= 0)  # None: unknown
    out.result_text.encode("utf-8")  # what reaches SQLite and a terminal
    out.reason.encode("utf-8")
    assert out.session_id is None or isinstance(out.session_id, str)
    assert out.num_turns is None or isinstance(out.num_turns, int)
    assert isinstance(out.permission_denials, list)
    json.dumps(out.permission_denials)  # it is stored as JSON
    if out.usage_reset_at is not None:
        assert out.usage_reset_at <= time.time() + untrusted.MAX_RESET_HORIZON_S + 60


def check_result_event(ev: Any) -> None:
    try:
        res = claudecli.parse_result_event(ev)
    except untrusted.Malformed as e:
        assert str(e)
        return
    assert isinstance(res.is_error, bool)
    assert 0 <= res.cost_usd <= untrusted.MAX_COST_USD
    res.result.encode("utf-8")
    json.dumps(res.permission_denials)


RESET_TEXT = (
    st.builds(lambda n: f"Claude AI usage limit reached|{n}", st.integers(-1, 10**12))
    | st.builds(
        lambda h, m, ap: f"You've hit your limit · resets {h}:{m:02d}{ap}",
        st.integers(0, 99),
        st.integers(0, 99),
        st.sampled_from(["am", "pm"]),
    )
    | st.builds(
        lambda mon, d, h: f"limit reached · resets {mon} {d}, {h}pm",
        st.sampled_from(["Jan", "Feb", "Xyz", "Dec"]),
        st.integers(0, 99),
        st.integers(0, 99),
    )
    | st.text(max_size=60)
)


def check_reset(text: str) -> None:
    now = time.time()
    at = claudecli.parse_reset(text, now)
    assert at is None or now - 86400 <= at <= now + untrusted.MAX_RESET_HORIZON_S


# --------------------------------------------------------------------------- status.json

STATUS_KEYS: dict[str, Any] = {
    "state": st.sampled_from(["starting", "running", "ended", "died", "garbage"]),
    "shepherd_pid": st.integers(1, 1 << 22),
    "agent_pid": st.integers(1, 1 << 22),
    "shepherd_token": st.text(max_size=20),
    "agent_token": st.text(max_size=20),
    "started": st.floats(0, 2e9),
    "ended": st.floats(0, 2e9),
    "beat": st.floats(0, 2e9),
    "exit_code": st.integers(-300, 300) | st.none(),
    "signal": st.integers(0, 64),
    "reason": st.sampled_from(["exited", "timeout", "stalled", "cancelled", "stopped", "start_failed", "x"]),
    "error": st.text(max_size=30),
    "log_dropped": st.integers(-5, 10**6),
}
STATUS = shaped(STATUS_KEYS) | JSON


def check_status(data: Any) -> None:
    try:
        st_ = untrusted.parse_status(data)
    except untrusted.Malformed as e:
        assert str(e)
        return
    assert st_["state"] in untrusted.STATUS_STATES
    for key in ("shepherd_pid", "agent_pid"):
        assert key not in st_ or (type(st_[key]) is int and 0 < st_[key] <= untrusted.MAX_PID)
    assert st_.get("exit_code") is None or type(st_["exit_code"]) is int
    json.dumps(st_)


STATUS_BYTES = (
    STATUS.map(lambda d: dumps(d).encode("utf-8", "surrogatepass"))
    | st.binary(max_size=200)
    | st.builds(lambda d, n: dumps(d).encode("utf-8", "surrogatepass")[:n], STATUS, st.integers(0, 200))
)


def check_status_bytes(raw: bytes) -> None:
    st_, bad = status_from_bytes(raw)
    assert (st_ == {}) or bad is None
    if bad is not None:
        assert isinstance(bad, str) and bad
    else:
        assert st_ == {} or st_["state"] in untrusted.FILE_STATES


# --------------------------------------------------------------------------- brain replies

TEXT_OR_ANY = st.text(max_size=40) | st.sampled_from(["PASS", "FAIL: no", "\ud800"]) | JSON
BRAIN_BODIES = (
    st.fixed_dictionaries({"response": TEXT_OR_ANY})
    | st.fixed_dictionaries({"message": st.fixed_dictionaries({"content": TEXT_OR_ANY}) | JSON})
    | st.fixed_dictionaries(
        {
            "choices": st.lists(
                st.fixed_dictionaries({"message": st.fixed_dictionaries({"content": TEXT_OR_ANY}) | JSON}) | JSON,
                max_size=2,
            )
            | JSON
        }
    )
    | JSON
)
BRAIN_RAW = (
    BRAIN_BODIES.map(lambda d: dumps(d).encode("utf-8", "surrogatepass"))
    | st.binary(max_size=100)
    | st.builds(lambda d, n: dumps(d).encode("utf-8", "surrogatepass")[:n], BRAIN_BODIES, st.integers(0, 100))
)
BRAIN = st.tuples(st.sampled_from([("ollama", "generate"), ("ollama", "chat"), ("openai", "generate")]), BRAIN_RAW)


def check_brain(case: tuple[tuple[str, str], bytes]) -> None:
    (api, endpoint), raw = case
    try:
        text = parse_brain_reply(api, endpoint, raw)
    except BrainError as e:
        assert str(e)
        str(e).encode("utf-8")
        return
    assert isinstance(text, str)
    text.encode("utf-8")


#: name -> (strategy, check): what ``bench/fuzz.py`` and the suite run.
TARGETS: dict[str, tuple[st.SearchStrategy[Any], Callable[[Any], None]]] = {
    "stream_json": (STREAMS, check_stream),
    "result_event": (shaped(RESULT_KEYS) | JSON, check_result_event),
    "reset_text": (RESET_TEXT, check_reset),
    "status": (STATUS, check_status),
    "status_file": (STATUS_BYTES, check_status_bytes),
    "brain_reply": (BRAIN, check_brain),
}

"""``fleetrun.untrusted`` and the agent-side parsers built on it (stream-json, the
shepherd's status.json, brain replies): unit tests, then the fuzzers of
``tests/fuzz_targets.py``, bounded (``bench/fuzz.py`` runs them long)."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import pytest
from fuzz_targets import TARGETS
from hypothesis import HealthCheck, given, settings

from fleetrun import claudecli, untrusted
from fleetrun.hosts import LocalHost, read_status, status_from_bytes
from fleetrun.plugins import claude
from fleetrun.plugins.verify_brain import BrainError, parse_brain_reply

NOW = 1_750_000_000.0

# --------------------------------------------------------------------------- checkers


def test_cost_is_finite_non_negative_and_bounded() -> None:
    assert untrusted.cost(None, "c") == 0.0
    assert untrusted.cost(0.25, "c") == 0.25
    for bad, why in [
        ("abc", "expected a number, got the string 'abc'"),
        (float("nan"), "not a finite number"),
        (-1, "out of range"),
        (1e300, "out of range"),
        (True, "expected a number, got a boolean"),
    ]:
        with pytest.raises(untrusted.Malformed, match=why):
            untrusted.cost(bad, "c")


def test_reset_time_within_the_horizon_only() -> None:
    assert untrusted.reset_time(NOW + 3600, "r", NOW) == NOW + 3600
    assert untrusted.reset_time((NOW + 60) * 1000, "r", NOW) == pytest.approx(NOW + 60)  # milliseconds
    for bad in (99999999999, NOW + 8 * 86400, NOW - 3 * 86400):
        with pytest.raises(untrusted.Malformed, match="not a reset time within the next 7 days"):
            untrusted.reset_time(bad, "r", NOW)


def test_clean_text_replaces_lone_surrogates() -> None:
    assert untrusted.clean_text("ok", "t") == "ok"
    s = untrusted.clean_text("a\ud800b", "t")
    s.encode("utf-8")
    assert s == "a?b"


def test_reason_of_is_one_printable_line() -> None:
    r = untrusted.reason_of(ValueError("a\nb\x1b[2J" + "x" * 500))
    assert "\n" not in r and "\x1b" not in r and len(r) <= 160


# --------------------------------------------------------------------------- stream-json


def result(**fields: Any) -> str:
    ev: dict[str, Any] = {
        "type": "result",
        "subtype": "success",
        "is_error": False,
        "result": "done",
        "session_id": "s1",
        "total_cost_usd": 0.02,
        "num_turns": 2,
        "permission_denials": [],
    }
    ev.update(fields)
    return json.dumps(ev)


def test_a_healthy_result() -> None:
    init = json.dumps({"type": "system", "subtype": "init", "session_id": "s0"})
    out = claude.result_from_log(f"noise\n{init}\n{result()}\n", 0)
    assert (out.ok, out.reason, out.cost_usd, out.num_turns, out.session_id) == (True, "", 0.02, 2, "s1")


@pytest.mark.parametrize(
    "fields, why",
    [
        ({"total_cost_usd": "abc"}, "result.total_cost_usd: expected a number, got the string 'abc'"),
        ({"total_cost_usd": float("nan")}, "result.total_cost_usd: nan is not a finite number"),
        ({"total_cost_usd": -1}, "result.total_cost_usd: -1 is out of range"),
        ({"total_cost_usd": 1e300}, r"result.total_cost_usd: 1e\+300 is out of range"),
        ({"num_turns": "3"}, "result.num_turns: expected an integer"),
        ({"num_turns": -1}, "result.num_turns: -1 is out of range"),
        ({"permission_denials": 5}, "result.permission_denials: expected a list, got an integer"),
        ({"permission_denials": ["x"]}, r"result.permission_denials\[0\]: expected an object"),
        ({"is_error": "no"}, "result.is_error: expected true or false, got the string 'no'"),
        ({"is_error": 0}, "result.is_error: expected true or false, got an integer"),
        ({"session_id": ["s"]}, "result.session_id: expected a string"),
        ({"result": {"x": 1}}, "result.result: expected a string"),
        ({"errors": "boom"}, "result.errors: expected a list"),
        ({"api_error_status": "429"}, "result.api_error_status: expected an integer"),
    ],
)
def test_a_malformed_result_is_a_died_session_with_its_reason(fields: dict[str, Any], why: str) -> None:
    with pytest.raises(untrusted.Malformed, match=why):
        claudecli.parse_result_event(json.loads(result(**fields)))
    out = claude.result_from_log(result(**fields) + "\n", 0)
    assert not out.ok and out.reason.startswith("malformed_output:result.")
    assert out.cost_usd is None  # unreadable: the cost is unknown, not $0


@pytest.mark.parametrize(
    "info, why",
    [
        ("x", "rate_limit_event.rate_limit_info: expected an object, got the string 'x'"),
        ({"status": "rejected", "resetsAt": "soon"}, "rate_limit_info.resetsAt: expected a number"),
        ({"status": 5}, "rate_limit_info.status: expected a string"),
    ],
)
def test_a_malformed_rate_limit_event(info: Any, why: str) -> None:
    line = json.dumps({"type": "rate_limit_event", "session_id": "s", "rate_limit_info": info})
    out = claude.result_from_log(f"{line}\n{result()}\n", 0)
    assert not out.ok and out.reason.startswith("malformed_output:" + why)


@pytest.mark.parametrize(
    "fields",
    [{"total_cost_usd": "abc"}, {"total_cost_usd": float("nan")}, {"errors": 5, "is_error": True}, {"result": 7}],
)
def test_a_malformed_reviewer_stream_is_a_fail_verdict_with_its_reason(fields: dict[str, Any]) -> None:
    """verify_agent reads the reviewer's stream-json through claudecli.parse_stream."""
    from fleetrun.plugins.verify_agent import verdict_from_stream

    passed, reason, _, cost = verdict_from_stream(result(**fields) + "\n", 0)
    assert (passed, cost) == (False, 0.0)
    assert reason.startswith("no verdict: malformed result event: result."), reason


def test_a_non_string_session_id_in_any_event() -> None:
    out = claude.result_from_log(json.dumps({"type": "assistant", "session_id": 7}) + "\n" + result() + "\n", 0)
    assert out.reason == "malformed_output:assistant.session_id: expected a string, got an integer"


@pytest.mark.parametrize(
    "noise",
    [
        "{not json",
        '{"type": "result", "total_cost_usd": 0.',
        "[1, 2]",
        '"a string"',
        "\x00\xff\xfe binary",
        "[" * 100_000,
        "{" + '"a":' * 50_000 + "1",
        "{" * 20_000,
        "9" * 100_000,
    ],
)
def test_noise_lines_are_skipped_never_raised(noise: str) -> None:
    assert claudecli.parse_line(noise) is None or isinstance(claudecli.parse_line(noise), dict)
    out = claude.result_from_log(noise + "\n" + result() + "\n", 0)
    assert out.ok
    out = claude.result_from_log(noise + "\n", 0)
    assert not out.ok and out.reason == "no_result"


def test_a_huge_log_is_read_head_and_tail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(claude, "MAX_LOG_HEAD", 100)
    monkeypatch.setattr(claude, "MAX_LOG_TAIL", 1000)
    log = tmp_path / "log"
    log.write_text(json.dumps({"type": "system", "session_id": "s0"}) + "\n" + "x" * 10_000 + "\n" + result() + "\n")
    text = claude.read_log(str(log))
    assert len(text) < 1200
    assert claude.result_from_log(text, 0).ok


def test_surrogates_in_the_result_never_reach_sqlite_or_the_terminal() -> None:
    out = claude.result_from_log(result(result="\ud800 done") + "\n", 0)
    assert out.ok
    out.result_text.encode("utf-8")


# --------------------------------------------------------------------------- usage limits


def test_usage_limit_legacy_epoch_past_the_horizon_is_not_believed() -> None:
    assert claudecli.parse_reset("Claude AI usage limit reached|99999999999", NOW) is None
    assert claudecli.parse_reset(f"Claude AI usage limit reached|{int(NOW) + 600}", NOW) == NOW + 600
    assert claudecli.parse_reset("You've hit your limit · resets 5:99pm (UTC)", NOW) is None  # not a time
    assert claudecli.parse_reset("limit reached · resets Feb 31, 2pm", NOW) is None


def test_usage_limit_legacy_through_the_plugin() -> None:
    line = result(is_error=True, result="Claude AI usage limit reached|99999999999", api_error_status=429)
    out = claude.result_from_log(line + "\n", 1)
    assert out.usage_limit and out.reason == "usage_limit"
    assert out.usage_reset_at is None  # the loop backs off 1, 2, 4 ... minutes instead


def test_rate_limit_event_reset_past_the_horizon_is_not_believed() -> None:
    far = json.dumps({"type": "rate_limit_event", "rate_limit_info": {"status": "rejected", "resetsAt": 99999999999}})
    line = result(is_error=True, result="Claude AI usage limit reached", api_error_status=429)
    out = claude.result_from_log(f"{far}\n{line}\n", 1)
    assert out.usage_limit and out.usage_reset_at is None
    soon = time.time() + 600
    near = json.dumps({"type": "rate_limit_event", "rate_limit_info": {"status": "rejected", "resetsAt": soon}})
    assert claude.result_from_log(f"{near}\n{line}\n", 1).usage_reset_at == pytest.approx(soon)


# --------------------------------------------------------------------------- status.json


def good_status(**fields: Any) -> dict[str, Any]:
    st: dict[str, Any] = {
        "state": "ended",
        "attempt": "a1",
        "shepherd_pid": 123,
        "shepherd_token": "linux:1",
        "started": NOW,
        "agent_pid": 124,
        "agent_token": "linux:2",
        "exit_code": 0,
        "signal": None,
        "reason": "exited",
        "ended": NOW + 1,
    }
    st.update(fields)
    return st


def test_parse_status_keeps_what_fleetrun_reads() -> None:
    st = untrusted.parse_status(good_status(extra="x"))
    assert st["state"] == "ended" and st["exit_code"] == 0 and "extra" not in st


@pytest.mark.parametrize(
    "fields, why",
    [
        ({"state": "garbage"}, "status.state: expected one of"),
        ({"exit_code": "abc"}, "status.exit_code: expected an integer"),
        ({"exit_code": 1.5}, "status.exit_code: expected an integer"),
        ({"shepherd_pid": "12"}, "status.shepherd_pid: expected an integer"),
        ({"shepherd_pid": -1}, "status.shepherd_pid: -1 is out of range"),
        ({"agent_pid": True}, "status.agent_pid: expected an integer, got a boolean"),
        ({"shepherd_token": 5}, "status.shepherd_token: expected a string"),
        ({"reason": ["x"]}, "status.reason: expected a string"),
        ({"reason": "owned"}, "status.reason: expected one of"),
        ({"started": "now"}, "status.started: expected a number"),
        ({"ended": float("inf")}, "status.ended: inf is not a finite number"),
    ],
)
def test_parse_status_refuses_wrong_types(fields: dict[str, Any], why: str) -> None:
    with pytest.raises(untrusted.Malformed, match=why):
        untrusted.parse_status(good_status(**fields))


def test_status_file_states_only() -> None:
    assert status_from_bytes(json.dumps(good_status(state="died")).encode())[1].startswith("status.state")
    assert status_from_bytes(b"[1]")[1] == "status: expected an object, got a list"
    assert status_from_bytes(b"\xff\xfe")[1] == "not JSON"
    assert status_from_bytes(b"[" * 100_000)[1] == "not JSON"


def test_a_garbled_status_file_of_a_gone_shepherd_is_a_died_session(tmp_path: Path) -> None:
    host = LocalHost(tmp_path)
    adir = host.attempt_dir("a1")
    adir.mkdir(parents=True)
    (adir / "status.json").write_text(json.dumps(good_status(exit_code="abc")))
    st = host.status("a1", None, None)
    assert st["state"] == "ended" and st["reason"] == "malformed_status" and st["exit_code"] is None
    assert "status.exit_code: expected an integer" in st["error"]
    assert read_status(adir) == ({}, "status.exit_code: expected an integer, got the string 'abc'")
    assert host.give_up("a1") == {}
    assert host.stop("a1", None, None) is False  # no pid from the file is believed


# --------------------------------------------------------------------------- brain replies


@pytest.mark.parametrize(
    "api, endpoint, body, want",
    [
        ("ollama", "generate", {"response": "PASS"}, "PASS"),
        ("ollama", "chat", {"message": {"content": "FAIL: x"}}, "FAIL: x"),
        ("openai", "generate", {"choices": [{"message": {"content": "PASS"}}]}, "PASS"),
        ("ollama", "generate", {"response": None}, ""),
    ],
)
def test_brain_reply_shapes(api: str, endpoint: str, body: Any, want: str) -> None:
    assert parse_brain_reply(api, endpoint, json.dumps(body).encode()) == want


@pytest.mark.parametrize(
    "api, endpoint, raw, why",
    [
        ("ollama", "generate", b"[1]", "brain reply has no answer in it: [1]"),
        ("ollama", "generate", b'"PASS"', "brain reply has no answer in it"),
        ("ollama", "chat", b'{"message": "PASS"}', "brain reply has no answer in it"),
        ("openai", "generate", b'{"choices": "PASS"}', "brain reply has no answer in it"),
        ("openai", "generate", b'{"choices": [5]}', "brain reply has no answer in it"),
        ("openai", "generate", b'{"choices": [{"message": {"content": 5}}]}', "brain reply has no text answer"),
        ("ollama", "generate", b'{"response": ["PASS"]}', "brain reply has no text answer"),
        ("ollama", "generate", b"[" * 100_000, "brain returned malformed JSON"),
        ("ollama", "generate", b"\xff", "brain returned malformed JSON"),
    ],
)
def test_brain_reply_malformed_is_a_reasoned_failure(api: str, endpoint: str, raw: bytes, why: str) -> None:
    with pytest.raises(BrainError, match=why.replace("[", r"\[")):
        parse_brain_reply(api, endpoint, raw)


def test_brain_reply_too_large(monkeypatch: pytest.MonkeyPatch) -> None:
    from fleetrun.plugins import verify_brain

    monkeypatch.setattr(verify_brain, "MAX_REPLY_BYTES", 100)
    with pytest.raises(BrainError, match="larger than 100 bytes"):
        parse_brain_reply("ollama", "generate", json.dumps({"response": "P" * 200}).encode())


def test_brain_reply_surrogates_are_cleaned() -> None:
    text = parse_brain_reply("ollama", "generate", b'{"response": "PASS \\ud800"}')
    text.encode("utf-8")
    assert math.isfinite(len(text))


# --------------------------------------------------------------------------- fuzzing


FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck), database=None)


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_fuzz_never_raises(name: str) -> None:
    """Property: each parser returns a value or its reasoned failure, never raises."""
    strategy, check = TARGETS[name]
    FUZZ(given(strategy)(check))()

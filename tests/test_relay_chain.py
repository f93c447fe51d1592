"""A request that carries the one to run after it (``then``: a collect's verify-start),
and the pushed answer to that one (a ``then`` event), read as strictly as any other
message: only the pairs of ``WORKER_CHAINS`` may chain, and a garbled ``then`` either
way is ``Malformed``."""

from __future__ import annotations

import json

import pytest

from fleetrun.plugins.relay.protocol import (
    WORKER_CHAINS,
    parse_worker_message,
    parse_worker_request,
)
from fleetrun.untrusted import Malformed

THEN = {"verb": "verify-start", "payload": {"idx": 0}}


def test_a_collect_may_carry_its_verifiers_start_and_nothing_else_may():
    assert WORKER_CHAINS == {"collect": ("verify-start",)}
    r = parse_worker_request(json.dumps({"id": 7, "verb": "collect", "payload": {"a": 1}, "then": THEN}).encode())
    assert (r.verb, r.then.verb, r.then.id, r.then.args) == ("collect", "verify-start", 7, [])
    assert json.loads(r.then.payload) == {"idx": 0}
    assert parse_worker_request(b'{"id": 7, "verb": "collect", "then": null}').then is None
    for bad in (
        {"id": 1, "verb": "start", "then": THEN},  # start has no follower
        {"id": 1, "verb": "collect", "then": {"verb": "start"}},
        {"id": 1, "verb": "collect", "then": {"verb": "verify-start", "then": THEN, "args": [1]}},
        {"id": 1, "verb": "collect", "then": {"verb": "verify-start", "payload": [1]}},
        {"id": 1, "verb": "collect", "then": "verify-start"},
    ):
        with pytest.raises(Malformed):
            parse_worker_request(json.dumps(bad).encode())


def test_the_answer_to_the_chained_request_is_pushed_after_the_first_reply():
    m = parse_worker_message(b'{"id": 7, "code": 0, "reply": {"commit": null}}')
    assert (m.kind, m.id, m.code) == ("reply", 7, 0)
    m = parse_worker_message(b'{"event": "then", "id": 7, "code": 0, "reply": {"state": "running"}}')
    assert (m.kind, m.id, m.code, m.reply) == ("then", 7, 0, {"state": "running"})
    for bad, why in (
        (b'{"event": "then", "code": 0, "reply": {}}', "then event.id"),
        (b'{"event": "then", "id": 7, "code": 300, "reply": {}}', "then event.code"),
        (b'{"event": "then", "id": 7, "code": 0, "reply": "ok"}', "then event.reply"),
    ):
        with pytest.raises(Malformed) as e:
            parse_worker_message(bad)
        assert why in str(e.value)
    hello = parse_worker_message(b'{"event": "hello", "protocol": 1, "beats": 1, "chain": 1}')
    assert hello.info["chain"] == 1


def test_a_start_may_carry_its_collect_at_the_end_and_nothing_else_may():
    from fleetrun.plugins.relay.protocol import WORKER_AT_END

    assert WORKER_AT_END == {"start": ("collect",)}
    at_end = {"verb": "collect", "payload": {"attempt": {"id": "x"}}}
    r = parse_worker_request(json.dumps({"id": 3, "verb": "start", "payload": {}, "at_end": at_end}).encode())
    assert (r.verb, r.at_end.verb, r.at_end.id, r.then) == ("start", "collect", 3, None)
    assert json.loads(r.at_end.payload) == {"attempt": {"id": "x"}}
    assert parse_worker_request(b'{"id": 3, "verb": "start", "at_end": null}').at_end is None
    for bad in (
        {"id": 1, "verb": "collect", "at_end": at_end},  # only a start has an end
        {"id": 1, "verb": "start", "at_end": {"verb": "cleanup"}},
        {"id": 1, "verb": "start", "at_end": {"verb": "collect", "payload": "x"}},
        {"id": 1, "verb": "start", "at_end": "collect"},
    ):
        with pytest.raises(Malformed):
            parse_worker_request(json.dumps(bad).encode())


def test_an_end_pushed_with_its_collect_is_read_strictly():
    end = {"event": "ended", "attempt": "task_ab12_0_a1", "status": {"state": "ended", "exit_code": 0}, "log_size": 0}
    assert parse_worker_message(json.dumps(end).encode()).collect is None
    m = parse_worker_message(json.dumps({**end, "collect": {"code": 0, "reply": {"commit": None}}}).encode())
    assert (m.kind, m.collect) == ("ended", (0, {"commit": None}))
    for bad, why in (
        ({"code": 0}, "ended event.collect.reply"),
        ({"code": 256, "reply": {}}, "ended event.collect.code"),
        ({"code": "0", "reply": {}}, "ended event.collect.code"),
        ("done", "ended event.collect"),
    ):
        with pytest.raises(Malformed) as e:
            parse_worker_message(json.dumps({**end, "collect": bad}).encode())
        assert why in str(e.value)
    hello = parse_worker_message(b'{"event": "hello", "protocol": 1, "collects": 1}')
    assert hello.info["collects"] == 1

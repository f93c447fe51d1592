"""What a peer may speak of (:mod:`fleetrun.plugins.relay.placed`): the table is filled
only by this supervisor's requests, and stays bounded however long the run."""

from __future__ import annotations

from fleetrun.plugins.relay.placed import (
    FINISHED_KEPT,
    PeerAttempts,
    asked_about,
    asked_about_all,
    describe,
)

AID = "task_t1_1_a1"


def test_the_requests_that_name_an_attempt_or_a_verifier():
    assert asked_about("start", [], {"attempt_id": AID, "spec": {}}) == AID
    assert asked_about("status", ["--attempt", AID, "--log-offset", "0"], None) == AID
    assert asked_about("log", ["--attempt", AID, "--offset", "9"], None) == AID
    assert asked_about("verify-start", [], {"attempt": {"id": AID}, "idx": 2}) == (AID, 2)
    assert asked_about("verify-status", ["--attempt", AID, "--idx", "1"], None) == (AID, 1)
    assert asked_about("probe", [], None) is None
    assert asked_about("stop", ["--attempt", AID], None) is None  # its events are not asked for
    assert asked_about("verify-status", ["--attempt", AID, "--idx", "x"], None) is None
    # a poll of several attempts in one request asks about each of them
    two = {"attempts": [{"attempt": AID, "log_offset": 0}, {"attempt": "task_t2_1_a1"}, "junk"]}
    assert asked_about_all("status-many", [], two) == [AID, "task_t2_1_a1"]
    assert asked_about_all("status-many", [], {"attempts": "x"}) == []
    assert asked_about_all("status", ["--attempt", AID], None) == [AID] and asked_about_all("probe", [], None) == []


def test_placed_kept_finished_dropped_quietly_others_counted():
    t = PeerAttempts()
    assert t.admits(AID) is None
    t.place(AID)
    assert t.admits(AID) is True
    t.finish(AID)
    assert t.admits(AID) is False  # a late event about it: dropped, not a violation
    assert t.admits((AID, 0)) is False
    t.place(AID)  # asked about again
    assert t.admits(AID) is True
    t.violation("ended", "an ended event for attempt task_x_1_a1")
    t.violation("ended", "an ended event for attempt task_x_2_a1")
    t.violation("log", "a log event")
    assert t.counts == {"ended": 2, "log": 1}
    assert describe(t.counts) == "3 dropped (ended 2, log 1)"
    assert t.take_unflushed()[0] == {"ended": 2, "log": 1}
    t.violation("log", "a log event")
    assert t.take_unflushed() is None  # written at most every few seconds
    assert t.take_unflushed(force=True)[0] == {"log": 1}


def test_the_finished_attempts_remembered_are_the_last_ones_only():
    t = PeerAttempts()
    for i in range(FINISHED_KEPT * 3):
        aid = f"task_t{i}_1_a1"
        t.place(aid)
        t.finish(aid)
    assert t.size() == FINISHED_KEPT
    assert t.admits("task_t0_1_a1") is None and t.admits(f"task_t{FINISHED_KEPT * 3 - 1}_1_a1") is False

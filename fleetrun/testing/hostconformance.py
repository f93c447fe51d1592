"""The host status contract (docs/plugins.md, "The host status contract"), as checks any
host plugin can run against its own :class:`~fleetrun.Host` with real processes.

Two ways to use it. In a pytest module, subclass :class:`HostConformance` and give it a
``conformance_host`` fixture returning a :class:`Subject` (the host, and a folder its
attempts may run in, as the host sees it)::

    from fleetrun.testing.hostconformance import HostConformance, Subject

    class TestMyHost(HostConformance):
        @pytest.fixture
        def conformance_host(self, tmp_path):
            return Subject(MyHost(...), cwd=str(tmp_path))

Or call :func:`check_host` (every check, in turn) or one ``check_*`` function from any
test. Each starts attempts running ``sh -c`` with a trivial command on the host, so the
host must be able to run ``sh``; nothing is timed: a check polls until the condition
holds and gives up after ``deadline_s`` only so that a broken host fails rather than
hangs.

Attempt ids are fresh on each call (``task_c<random>_1_a1``), so a host's home may be
shared by the checks.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ..hostapi import AttemptRef, Host, poll_statuses

#: Every ``state`` a status may have (docs/plugins.md).
STATES = ("starting", "running", "ended", "died", "unreachable")

#: How long a check waits for a condition before it says the host never got there.
DEADLINE_S = 120.0


@dataclass
class Subject:
    """A host under test.

    :ivar host: the host.
    :ivar cwd: a folder that exists where the host runs its attempts (their ``cwd``).
    :ivar deadline_s: how long to wait for an attempt to start or end before failing.
    :ivar env: more environment for the attempts.
    """

    host: Host
    cwd: str
    deadline_s: float = DEADLINE_S
    env: dict[str, str] = field(default_factory=dict)


def new_attempt_id() -> str:
    """A fresh attempt id in the ledger's form (``task_<id>_<n>_a<N>``)."""
    return f"task_c{secrets.token_hex(6)}_1_a1"


def spec_of(subject: Subject, attempt_id: str, script: str) -> dict[str, Any]:
    """The shepherd spec of an attempt running ``sh -c script`` (see
    :func:`fleetrun.starting.shepherd_spec` for the keys)."""
    task_id = attempt_id.rsplit("_a", 1)[0]
    return {
        "argv": ["sh", "-c", script],
        "cwd": subject.cwd,
        "env": {"FLEETRUN_TASK_ID": task_id, **subject.env},
        "stdin": None,
        "timeout_s": 3600.0,
        "stall_s": 3600.0,
        "notify": None,
    }


def start(subject: Subject, script: str) -> AttemptRef:
    """Start an attempt running ``script``; its reference as the ledger would hold it."""
    attempt_id = new_attempt_id()
    started = subject.host.start(attempt_id, spec_of(subject, attempt_id, script), "conformance prompt")
    return AttemptRef(attempt_id, started.pid, started.token)


def check_status(st: Any, where: str) -> dict[str, Any]:
    """A status as the contract has it: a dict whose ``state`` is one of :data:`STATES`;
    an ``ended`` one has a string ``reason`` and an ``exit_code`` that is an int or None;
    an ``unreachable`` one says why in ``error``."""
    assert isinstance(st, dict), f"{where}: a status must be a dict, got {type(st).__name__}"
    assert st.get("state") in STATES, f"{where}: state {st.get('state')!r} is not one of {STATES}"
    if st["state"] == "ended":
        assert isinstance(st.get("reason"), str) and st["reason"], (
            f"{where}: an ended status must say why in `reason` (`exited` when the agent exited by itself: "
            f"without it the loop counts the attempt as died): {st}"
        )
        code = st.get("exit_code")
        assert code is None or (isinstance(code, int) and not isinstance(code, bool)), (
            f"{where}: exit_code must be an int or None: {st}"
        )
    if st["state"] == "unreachable":
        assert isinstance(st.get("error"), str) and st["error"], f"{where}: an unreachable status must say why: {st}"
    return st


def poll_until(
    subject: Subject, refs: list[AttemptRef], done: Callable[[dict[str, Any]], bool], what: str
) -> dict[str, dict[str, Any]]:
    """Poll ``refs`` in one :meth:`~fleetrun.Host.poll` call at a time until ``done``
    holds for each of their statuses. :return: the last poll's answer."""
    deadline = time.monotonic() + subject.deadline_s
    last: dict[str, dict[str, Any]] = {}
    while True:
        last = subject.host.poll(list(refs))
        assert isinstance(last, dict), f"poll must return a dict, got {type(last).__name__}"
        for r in refs:
            assert r.attempt_id in last, f"poll left out {r.attempt_id}: {last}"
            check_status(last[r.attempt_id], f"poll of {r.attempt_id}")
        if all(done(last[r.attempt_id]) for r in refs):
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not after {subject.deadline_s:.0f} s: {last}")
        time.sleep(0.05)


def ended(st: dict[str, Any]) -> bool:
    return st.get("state") in ("ended", "died")


def check_exit(subject: Subject) -> None:
    """An attempt that exits by itself ends with ``reason: "exited"`` and its exit
    code; its output is in :meth:`~fleetrun.Host.log_path` once it has ended."""
    ref = start(subject, "echo conformance-output; exit 3")
    st = poll_until(subject, [ref], ended, f"{ref.attempt_id} to end")[ref.attempt_id]
    assert st["state"] == "ended", f"an attempt that exited must be `ended`, not {st['state']!r}: {st}"
    assert st.get("reason") == "exited", f"an attempt that exited by itself must say reason `exited`: {st}"
    assert st.get("exit_code") == 3, f"its exit code (3) must be in exit_code: {st}"
    log = subject.host.log_path(ref.attempt_id)
    assert "conformance-output" in log.read_text(encoding="utf-8", errors="replace"), (
        f"the attempt's output must be in log_path ({log}) once it has ended"
    )
    assert subject.host.status(ref.attempt_id, ref.pid, ref.token).get("state") == "ended", (
        "status must agree with poll"
    )


def check_poll_many(subject: Subject) -> None:
    """One poll answers for several attempts, each its own status."""
    refs = [start(subject, f"exit {code}") for code in (0, 4, 5)]
    got = poll_until(subject, refs, ended, "three attempts to end")
    assert [got[r.attempt_id].get("exit_code") for r in refs] == [0, 4, 5], got
    assert all(got[r.attempt_id].get("reason") == "exited" for r in refs), got
    assert poll_statuses(subject.host, refs) == subject.host.poll(refs)


def check_stop(subject: Subject) -> None:
    """``stop`` ends a running attempt (it then ends with a reason that is not
    ``exited``, or dies), and is safe to repeat."""
    ref = start(subject, "while :; do sleep 0.05; done")
    # `starting` and `running` are the same to the loop: a host may say `starting` until
    # the end (the relay's worker pushes only the end)
    poll_until(subject, [ref], lambda st: st.get("state") in ("starting", "running"), f"{ref.attempt_id} to run")
    assert subject.host.stop(ref.attempt_id, ref.pid, ref.token) is True, "stop of a running attempt must say True"
    st = poll_until(subject, [ref], ended, f"{ref.attempt_id} to end once stopped")[ref.attempt_id]
    assert st.get("reason") != "exited", f"a stopped attempt did not exit by itself: {st}"
    again = subject.host.stop(ref.attempt_id, ref.pid, ref.token)
    assert again in (True, False), f"stop must say True or False: {again!r}"


def check_unknown(subject: Subject) -> None:
    """An attempt the host never started is answered, not raised: ``died`` (nothing
    runs: the loop counts it as over) or, when the host cannot tell, ``unreachable``;
    never ``starting``, ``running`` or ``ended``."""
    ref = AttemptRef(new_attempt_id())
    for st in (subject.host.poll([ref]).get(ref.attempt_id), subject.host.status(ref.attempt_id, None, None)):
        check_status(st, f"an unknown attempt {ref.attempt_id}")
        assert st is not None and st["state"] in ("died", "unreachable"), (
            f"an attempt never started must be `died` (or `unreachable`), not {st}"
        )


CHECKS: tuple[Callable[[Subject], None], ...] = (check_exit, check_poll_many, check_stop, check_unknown)


def check_host(subject: Subject, checks: Optional[tuple[Callable[[Subject], None], ...]] = None) -> None:
    """Run every check (or ``checks``) against ``subject``, in turn."""
    for check in checks or CHECKS:
        check(subject)


class HostConformance:
    """The checks as a pytest test class: subclass it in a test module and define a
    ``conformance_host`` fixture returning a :class:`Subject`."""

    def test_exit_is_ended_exited_with_its_code_and_log(self, conformance_host: Subject) -> None:
        check_exit(conformance_host)

    def test_poll_answers_for_several_attempts_in_one_call(self, conformance_host: Subject) -> None:
        check_poll_many(conformance_host)

    def test_stop_ends_a_running_attempt_and_is_safe_to_repeat(self, conformance_host: Subject) -> None:
        check_stop(conformance_host)

    def test_an_unknown_attempt_is_answered_not_raised(self, conformance_host: Subject) -> None:
        check_unknown(conformance_host)


__all__ = [
    "CHECKS",
    "DEADLINE_S",
    "STATES",
    "HostConformance",
    "Subject",
    "check_exit",
    "check_host",
    "check_poll_many",
    "check_status",
    "check_stop",
    "check_unknown",
    "new_attempt_id",
    "poll_until",
    "spec_of",
    "start",
]

"""``-p no:relay``: the relay plugin is one package, and blocking it leaves no ``relay``
and no ``host`` verb; a peer task already in the ledger then waits with a reason in
``status``, is cancelled with a word on what could not be stopped, and is left alone
by adoption, never a ``KeyError``."""

from __future__ import annotations

import os
import selectors
import signal
import time
from typing import Any

import pytest

from fleetrun.states import State
from fleetrun.taskspec import TaskSpec

BLOCKED = "host 'mini' is not provided by any loaded plugin: the relay plugin is blocked (-p no:relay)"


def peer_task(fleeter: Any) -> Any:
    """A task RUNNING on the peer ``mini``, as a supervisor with the relay left it:
    written through the ledger, the attempt's shepherd recorded on the peer."""
    repo = fleeter.make_repo()
    led = fleeter.ledger()
    (task,) = led.add_tasks([TaskSpec(name="far", prompt="work there", cwd=str(repo))])
    att = led.lease(task.id, State.READY, "mini", "fresh")
    led.update_attempt(att.id, state="running", shepherd_pid=4242, shepherd_token="peer-token", started=time.time())
    led.transition(task.id, State.ASSIGNED, State.RUNNING, "started", attempt=att.number, host="mini")
    return led.get(task.id)


@pytest.mark.parametrize(
    "args",
    [
        ["relay", "peers"],
        ["relay", "add", "mini", "me@127.0.0.1"],
        ["host", "probe", "--json"],
        ["host", "status", "--attempt", "task_t_1_a1"],
    ],
    ids=" ".join,
)
def test_no_relay_or_host_verb_when_blocked(fleeter: Any, args: list[str]) -> None:
    r = fleeter.run("-p", "no:relay", *args)
    assert r.ret == 4, r.stdout + r.stderr
    assert "the relay plugin is blocked (-p no:relay)" in r.stderr
    assert not (fleeter.home / "peers.toml").exists()


def test_the_fast_path_is_not_a_way_around_the_block(fleeter: Any) -> None:
    """``host status`` is answered before any plugin is loaded, but not with ``-p``."""
    r = fleeter.runsub("--home", str(fleeter.home), "-p", "no:relay", "host", "status", "--attempt", "task_t_1_a1")
    assert r.ret == 4, r.stdout + r.stderr
    assert "the relay plugin is blocked (-p no:relay)" in r.stderr


def test_status_shows_why_a_peer_task_waits(fleeter: Any) -> None:
    task = peer_task(fleeter)
    r = fleeter.run("-p", "no:relay", "status", "--wide")
    assert r.ret == 0, r.stderr
    (line,) = [ln for ln in r.stdout.splitlines() if task.id in ln]
    assert "RUNNING" in line and "mini" in line
    assert f"{BLOCKED}; the attempt may still run there, so the task waits (fleetrun cancel to give up)" in line
    # with the relay loaded but no such peer any more, the reason says that instead
    r = fleeter.run("status", "--wide")
    assert r.ret == 0, r.stderr
    assert "host 'mini' is not provided by any loaded plugin: no peer named 'mini' in peers.toml" in r.stdout
    assert fleeter.run("-p", "no:relay", "status", "--json").ret == 0


def test_cancel_says_the_peer_attempt_could_not_be_stopped(fleeter: Any) -> None:
    task = peer_task(fleeter)
    r = fleeter.run("-p", "no:relay", "cancel", task.id)
    assert r.ret == 0, r.stdout + r.stderr
    assert f"cancelled far {task.id}" in r.stdout
    assert f"could not stop attempt 1 on mini: {BLOCKED}; it may still run there" in r.stderr
    assert fleeter.ledger().get(task.id).state is State.CANCELLED
    r = fleeter.run("-p", "no:relay", "cancel", task.id)  # and again: nothing left to stop
    assert r.ret == 0 and "was already CANCELLED" in r.stdout


def test_adoption_leaves_a_peer_attempt_alone_and_says_why(fleeter: Any) -> None:
    """``work`` adopts what the ledger holds; the peer's attempt is not its to judge:
    the task stays RUNNING (the attempt may still run there), nothing needs a human."""
    task = peer_task(fleeter)
    proc = fleeter.popen("-p", "no:relay", "work", "--until-idle", env={"FLEETRUN_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert proc.stderr is not None
    seen = b""
    want = f"fleetrun: {BLOCKED}; what runs there is left alone, and its tasks wait".encode()
    sel = selectors.DefaultSelector()
    sel.register(proc.stderr, selectors.EVENT_READ)
    deadline = time.monotonic() + 60
    try:
        while want not in seen and time.monotonic() < deadline and proc.poll() is None:
            if sel.select(timeout=1):
                seen += os.read(proc.stderr.fileno(), 65536)
        assert want in seen, seen.decode(errors="replace")
        time.sleep(1.5)  # a few passes of the loop: it keeps waiting, it does not fail the task
        assert proc.poll() is None, seen.decode(errors="replace")
    finally:
        sel.close()
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    seen += err
    assert b"Traceback" not in seen and b"KeyError" not in seen, seen.decode(errors="replace")
    assert b"adopted 1 running attempt(s)" in out, out.decode(errors="replace")
    led = fleeter.ledger()
    now = led.get(task.id)
    assert now.state is State.RUNNING, now.reason
    (att,) = led.attempts(task.id)
    assert (att.state, att.shepherd_pid) == ("running", 4242)
    assert not [n for _, n in led.notes(task.id) if "internal" in n]

"""A start answered after the attempt's end (found by the long soak with peers): a
peer's start is a request the loop does not wait for, and the peer may push the
attempt's end before its reply to the start comes. The end moves the task to RUNNING
(``adopted``, its start unconfirmed); the start's answer that comes after must then
record what it says of the attempt, not move the task again (``RUNNING -> RUNNING``
was an internal error and sent the task and its dependents to a human)."""

from __future__ import annotations

LATE_START = '''
import time

import fleetrun
from fleetrun.plugins.shepherd import fleetrun_start_attempt as start_now


class AnswersAfterTheEnd:
    """A start handle that answers once the loop has recorded the attempt's end."""

    def __init__(self, started, attempt_id, config):
        self.started, self.attempt_id, self.config = started, attempt_id, config

    def poll(self):
        led = fleetrun.open_ledger(self.config)
        att = led.attempt(self.attempt_id)
        return self.started if att is not None and att.state == "ended" else None


@fleetrun.hookimpl(tryfirst=True)
def fleetrun_start_attempt(task, attempt, host, spawn, prompt, config):
    started = start_now(task=task, attempt=attempt, host=host, spawn=spawn, prompt=prompt, config=config)
    # as a peer's poll does before its start answers, this machine's finds the attempt
    # by what its shepherd recorded: wait for that record, then answer late
    status = host.attempt_dir(attempt.id) / "status.json"
    deadline = time.monotonic() + 30
    while not status.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    return AnswersAfterTheEnd(started, attempt.id, config)
'''


def test_a_start_answered_after_the_attempts_end_does_not_move_the_task_again(fleeter, fake_claude):
    fleeter.make_repo()
    fleeter.write_fleetconf(LATE_START)
    fleeter.write_tasks("""
        [[task]]
        name = "api"
        cwd = "repo"
        prompt = "Write api.txt."
        git_ref = "main"
          [[task.verify]]
          run = "test -f api.txt"

        [[task]]
        name = "client"
        cwd = "repo"
        prompt = "Use the API."
        git_ref = "main"
        depends_on = ["api"]
    """)
    fake_claude.script(
        api=[{"actions": [["write", "api.txt", "GET /things"], ["commit", "api"]]}],
        client=[{"actions": [["write", "client.txt", "x"], ["commit", "client"]]}],
    )
    r = fleeter.runsub("tasks.toml", timeout=120)
    assert r.ret == 0, r.stdout + r.stderr
    assert fleeter.states() == {"api": "DONE", "client": "DONE"}
    led = fleeter.ledger()
    api = fleeter.task("api")
    causes = [t.cause for t in led.transitions(api.id)]
    assert "adopted" in causes, causes  # the end came first, and moved it to RUNNING
    assert not any(c.startswith("internal_error") for c in causes), causes
    (att,) = led.attempts(api.id)
    assert att.state == "verified", att  # its end, recorded first, is kept


OUT_OF_REACH_AFTER_A_CRASH = """
import os

import fleetrun
from fleetrun.hosts import LocalHost
from fleetrun.plugins.local import measure

CRASHED = {crashed!r}
ASKED = {asked!r}


class OutOfReachOnce(LocalHost):
    # this machine, as a peer whose link is down when the restart first asks
    def status(self, attempt_id, pid, token):
        if os.path.exists(CRASHED) and not os.path.exists(ASKED):
            open(ASKED, "w").close()
            return {{"state": "unreachable", "reason": "the link is down"}}
        return super().status(attempt_id, pid, token)


@fleetrun.hookimpl(tryfirst=True)
def fleetrun_hosts(config):
    return [OutOfReachOnce(config.home, measure=measure)]


@fleetrun.hookimpl(tryfirst=True)
def fleetrun_start_attempt(task, attempt, host, spawn, prompt, config):
    if not os.path.exists(CRASHED):
        open(CRASHED, "w").close()
        os._exit(86)  # the supervisor dies once `starting` is recorded, before any shepherd starts
    return None
"""


def test_a_start_never_confirmed_whose_host_knows_nothing_of_it_did_not_start(fleeter, fake_claude, tmp_path):
    """Found by the long soak with peers: a supervisor died once an attempt was recorded
    `starting`, before its start was confirmed; at the restart its host was out of reach,
    so the attempt was left for the loop to ask again, and when the host answered it
    knew nothing of it (``died``). That was taken for a session that died (a resume
    spent, ``session_died:died``), though nothing ever ran: it is an attempt that did not
    start, decided as adoption decides one (under the shepherd's start lock)."""
    fleeter.make_repo()
    fleeter.write_fleetconf(
        OUT_OF_REACH_AFTER_A_CRASH.format(crashed=str(tmp_path / "crashed"), asked=str(tmp_path / "asked"))
    )
    fleeter.write_tasks("""
        [[task]]
        name = "api"
        cwd = "repo"
        prompt = "Write api.txt."
        git_ref = "main"
          [[task.verify]]
          run = "test -f api.txt"
    """)
    fake_claude.script(api=[{"actions": [["write", "api.txt", "GET /things"], ["commit", "api"]]}])
    r = fleeter.runsub("tasks.toml", timeout=120)
    assert r.ret == 86, r.stdout + r.stderr
    r = fleeter.runsub("work", "--until-idle", timeout=120)
    assert r.ret == 0, r.stdout + r.stderr
    assert (tmp_path / "asked").exists(), "the restart never found the host out of reach"
    api = fleeter.task("api")
    causes = [t.cause for t in fleeter.ledger().transitions(api.id)]
    assert api.state.value == "DONE", causes
    assert api.resumes == 0 and not any(c.startswith("session_died") for c in causes), causes
    first = fleeter.ledger().attempts(api.id)[0]
    assert (first.state, first.outcome) == ("abandoned", "never_started"), first

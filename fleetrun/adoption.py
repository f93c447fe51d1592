"""Adoption: the loop picks up what the ledger says is in flight, after a restart or a
crash (docs/durability.md).

An attempt whose shepherd runs is watched again; one leased or starting whose shepherd
never started is abandoned and its task goes back (``lease_expired:never started``); an
end that was recorded without the transition after it is decided again without being
recorded twice; a verifier the crash interrupted runs again from the start, or its
recorded failure is acted on; a DONE task whose workspace was not cleaned up is.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any, Optional

from .decide import LeaseFound, StartUnconfirmed
from .ending import END_STATUS
from .hostapi import get_host
from .hosts import kill_recorded_children
from .ledger import Attempt, Task
from .reports import Workspace
from .states import State
from .verifying import REVERIFY, VERIFY_WAIT, Verifying

if TYPE_CHECKING:
    from .loop import Loop


def _is_wait(wait: dict[str, Any]) -> bool:
    return isinstance(wait.get("tries"), int) and isinstance(wait.get("until"), (int, float))


class Adoption:
    """Adopts for the loop. ``loop`` gives the ledger, the hooks and the stages the
    adopted attempts go on in."""

    def __init__(self, loop: Loop) -> None:
        self.loop = loop
        #: the tasks the loop's view saw change since the last :meth:`reverify`
        self._changed: Optional[set[str]] = None

    def adopt(self) -> None:
        """Pick up what the ledger says is in flight (after a restart or a crash)."""
        loop = self.loop
        led = loop.led
        adopted = 0
        for att in loop.active_attempts():
            with loop.isolated(att.task_id):
                task = led.get(att.task_id)
                if task is None:
                    continue
                host = get_host(loop.config, att.host)
                if att.state == "leased" or (att.state == "starting" and not att.shepherd_pid):
                    st = self.starting_status(att) if att.state == "starting" else {}
                    if st.get("state") == "unreachable":  # it may be running there: poll_attempts asks again
                        adopted += 1
                        continue
                    if att.state == "leased" and host.local:
                        kill_recorded_children(host.attempt_dir(att.id))  # a setup command the crash left
                    st = self.settle_unconfirmed(task, att, st)
                    if st.get("shepherd_pid") and st.get("state") in ("starting", "running"):
                        adopted += 1
                    continue
                loop.decide(task, att, StartUnconfirmed())
                st = host.status(att.id, att.shepherd_pid, att.shepherd_token)
                if st.get("state") in ("starting", "running", "unreachable"):
                    adopted += 1  # a dead or finished one is handled by poll_attempts, not announced
        for task in led.tasks({State.ASSIGNED}):
            with loop.isolated(task.id):
                # its attempt was given up as not started, the move back was not recorded
                # (a crash or a full disk between the two commits): without this the task
                # stays ASSIGNED for ever, holding a place on its machine
                last = led.latest_attempt(task.id)
                if last is not None and last.state == "abandoned":
                    loop.ending.not_started(
                        task,
                        last,
                        f"{last.outcome or 'never_started'}:attempt {last.number} "
                        "did not start (its move back was cut off)",
                    )
                elif last is not None and last.state == "ended":
                    # it ran and its end was recorded, but its start never was (a crash
                    # before RUNNING, a peer's reply lost): RUNNING now, and the loop below
                    # decides its end as for any other (found by the soak: stuck for good)
                    loop.decide(task, last, StartUnconfirmed())
        for task in led.tasks({State.RUNNING}):
            with loop.isolated(task.id):
                # the attempt's end was recorded, the transition after it was not (a crash
                # between the two): decide again from the status file, without recording twice
                last = led.latest_attempt(task.id)
                if last is not None and last.state == "ended":
                    # decided from the status its end was recorded from: the host may not
                    # answer now (a peer not connected yet), and "unreachable" is no end
                    # (found by the long soak: attempts that exited 0 counted as died)
                    recorded = last.info.get(END_STATUS)
                    st = recorded if isinstance(recorded, dict) else {}
                    if st.get("state") not in ("ended", "died"):
                        host = get_host(loop.config, last.host)
                        st = host.status(last.id, last.shepherd_pid, last.shepherd_token)
                    if st.get("state") not in ("ended", "died"):
                        continue  # recorded before end_status was kept, and its host is silent
                    loop.ending.finish_attempt(last, st, record=False)
        for task in led.tasks({State.VERIFYING}):
            with loop.isolated(task.id):
                if not loop.in_scope(task) and loop.queue_id is not None:
                    continue
                if task.id in loop.verify.running:
                    continue
                last = led.latest_attempt(task.id)
                if last is None or last.workspace is None:
                    continue
                last_host = get_host(loop.config, last.host)
                if last_host.local:
                    # a verifier the crashed supervisor left running is ended before it runs again
                    kill_recorded_children(last_host.attempt_dir(last.id))
                verdicts = led.verdicts(attempt_id=last.id)
                v = Verifying(last, Workspace(**last.workspace), len(verdicts))
                failed = next((x for x in verdicts if not x.passed), None)
                if failed is not None:  # its failure was recorded, the transition after it was not
                    loop.verify.verdict_failed(task, v, failed.label, failed.output)
                    continue
                wait = last.info.get(VERIFY_WAIT)
                if isinstance(wait, dict) and wait.get("idx") == v.idx and _is_wait(wait):
                    loop.verify.wait(task, v, wait)  # a verifier that could not judge: its backoff goes on
                    continue
                loop.verify.begin(task.id, v)
        for task in led.with_worktree(State.DONE):  # not every DONE task of the ledger's history
            with loop.isolated(task.id):
                # DONE, but the crash came before its workspace was cleaned up: a local
                # one is looked at here; another host's is its plugin's to look at
                # (a worktree recorded as removed is None)
                if task.worktree and (
                    not get_host(loop.config, task.host).local or os.path.exists(os.path.join(task.worktree, ".git"))
                ):
                    loop.finish_terminal(task)
        if adopted:
            loop.config.out.write(f"adopted {adopted} running attempt(s)\n")

    def reverify(self) -> None:
        """Tasks ``fleetrun retry`` sent back to VERIFYING (a verifier could not judge
        their work, since fixed) while this loop runs: verify their kept work again,
        from the verifier that could not judge."""
        loop = self.loop
        led = loop.led
        if self._changed is None:  # the view says what changed: an idle pass reads nothing
            self._changed = loop.view.subscribe()
        changed = [t for t in (loop.view.get(i) for i in self._changed) if t is not None]
        self._changed.clear()
        for task in changed:
            if (
                task.state is not State.VERIFYING
                or task.id in loop.verify.running
                or not task.reason.startswith(REVERIFY)
            ):
                continue
            if not loop.in_scope(task) and loop.queue_id is not None:
                continue
            with loop.isolated(task.id):
                last = led.latest_attempt(task.id)
                if last is None or last.workspace is None:
                    continue
                loop.verify.begin(
                    task.id, Verifying(last, Workspace(**last.workspace), len(led.verdicts(attempt_id=last.id)))
                )

    def settle_unconfirmed(self, task: Task, att: Attempt, st: dict[str, Any]) -> dict[str, Any]:
        """An attempt whose start was never confirmed (``leased``, or ``starting`` with no
        shepherd recorded: a crash, or a start's answer lost with a restart), its host's
        status ``st`` in hand: if no shepherd answers for it, decide under the shepherd's
        start lock that it never started (a late shepherd then runs nothing), so the task
        goes back without spending a resume; if one does, watch it (a dead one is
        resumed). :return: the status decided from."""
        loop, led = self.loop, self.loop.led
        host = get_host(loop.config, att.host)
        if not st.get("shepherd_pid"):
            st = host.give_up(att.id) or st
        if st.get("shepherd_pid"):  # it did start: watch it (a dead one is resumed)
            led.update_attempt(
                att.id,
                state="running",
                shepherd_pid=st["shepherd_pid"],
                shepherd_token=st.get("shepherd_token"),
                started=st.get("started"),
            )
            loop.decide(task, att, StartUnconfirmed())
            return st
        led.update_attempt(att.id, state="abandoned", outcome="never_started", ended=time.time())
        loop.decide(task, att, LeaseFound())
        return st

    def starting_status(self, att: Attempt) -> dict[str, Any]:
        """The status of an attempt whose shepherd may have been started just before a
        crash: give a freshly spawned shepherd a moment to write its first status."""
        host = get_host(self.loop.config, att.host)
        deadline = time.time() + 2.0
        while True:
            st: dict[str, Any] = host.status(att.id, None, None)
            if st.get("shepherd_pid") or time.time() >= deadline:
                return st
            if not host.local or not (host.attempt_dir(att.id) / "spec.json").exists():
                return st
            time.sleep(0.05)

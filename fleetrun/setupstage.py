"""The ``setup`` stage: a task's setup commands, run in its workspace before the agent's
first attempt there, without blocking the loop.

Each command is a step of its own, handed to ``fleetrun_setup_step`` with its number
(not a verifier): it runs where and how a ``run`` verifier would (``/bin/sh -c`` in the
workspace, on the attempt's machine, a peer through the relay plugin, with the
``FLEETRUN_*`` environment, its output in a file, its timeout), and the loop polls its
handle as it polls verifiers'. The baseline steps that follow are verifiers (run on
the base commit), handed to ``fleetrun_verify``.

The task stays ASSIGNED and its attempt ``leased`` while setup runs (the attempt's
``info["setup"]`` says ``running``); no new state is needed. A command that fails
sends the task to NEEDS_HUMAN (``setup_failed:CMD: SUMMARY (exit code N)``, its
output's summary line quoted as a failed verifier's is) without using a
retry: the agent cannot fix the user's environment. Once every command has passed,
``info["setup"]`` is ``passed`` with the workspace it was for, and later attempts in
that same workspace (retries, resumes, a restarted supervisor) skip it. A crash in the
middle of setup leaves the attempt ``leased``: adoption abandons it and the next attempt
runs setup again from the start, so setup commands must be safe to repeat.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional, Union

from . import baseline, crash
from .decide import Drop, RunSetupStep, SetupStepEnded, StartAgent
from .hostapi import Host, get_host
from .ledger import Attempt, Task
from .reports import Cancellable, Verdict, VerifyHandle, Workspace
from .states import State
from .taskspec import VerifySpec

if TYPE_CHECKING:
    from .loop import Loop

#: How much of each command's output is kept in the ledger (``fleetrun logs`` shows it);
#: the whole output stays in the attempt folder.
KEEP_CHARS = 8000


@dataclass
class SettingUp:
    attempt: Attempt
    workspace: Workspace
    kind: str
    prev: Optional[Attempt]
    idx: int = 0
    handle: Optional[VerifyHandle] = None
    steps: list[dict[str, Any]] = field(default_factory=list)
    #: the commands to run: the setup commands (unless passed for this workspace), then
    #: the baseline steps (before the task's first attempt only)
    plan: list[VerifySpec] = field(default_factory=list)


def workspace_identity(att: Attempt, ws: Workspace, host: Host) -> dict[str, Any]:
    """What says "the same workspace" to a later attempt: its path, and on this machine
    the folder's inode too (a worktree removed and made again at the same path is a new
    one, whose environment must be made again)."""
    ident: dict[str, Any] = {"path": ws.path}
    if host.local:
        try:
            st = os.stat(ws.path)
            ident["inode"] = [st.st_dev, st.st_ino]
        except OSError:
            pass
    return ident


class SetupStage:
    """Runs setup for the loop. ``loop`` gives the ledger, the hooks and the way on:
    ``launch(...)`` starts the agent, ``move``/``finish_terminal`` end a task."""

    def __init__(self, loop: Loop) -> None:
        self.loop = loop
        self.running = loop.pending.view(SettingUp)

    def _host(self, s: SettingUp) -> Host:
        return get_host(self.loop.config, s.attempt.host)

    # -- deciding --------------------------------------------------------------------

    def needed(self, task: Task, att: Attempt, ws: Workspace) -> bool:
        return bool(self.plan(task, att, ws))

    def plan(self, task: Task, att: Attempt, ws: Workspace) -> list[VerifySpec]:
        """The setup commands if this workspace needs them, then the baseline steps if
        the task has not had its baseline yet and no agent has run for it."""
        plan = list(task.spec.setup) if self.setup_needed(task, att, ws) else []
        if not self.baseline_needed(task, att):
            return plan
        steps = baseline.steps(task)
        if any((a.info or {}).get("baseline") == "failed" for a in self.loop.led.attempts(task.id)):
            # `fleetrun retry` after baseline_fails: the person fixed something (the
            # machine, the environment), so the base runs again, not its kept failure
            for step in steps:
                step.extra[baseline.FRESH] = True
        return plan + steps

    def baseline_needed(self, task: Task, att: Attempt) -> bool:
        for earlier in self.loop.led.attempts(task.id):
            if earlier.id != att.id and (earlier.started is not None or (earlier.info or {}).get("baseline") == "done"):
                return False  # an agent has run (the worktree is no longer the base), or it was had
        return True

    def setup_needed(self, task: Task, att: Attempt, ws: Workspace) -> bool:
        steps = task.spec.setup
        if not steps:
            return False
        want = {
            **workspace_identity(att, ws, get_host(self.loop.config, att.host)),
            "commands": [s.text for s in steps],
        }
        for earlier in self.loop.led.attempts(task.id):
            info = earlier.info or {}
            if earlier.id != att.id and info.get("setup") == "passed" and info.get("setup_for") == want:
                return False
        return True

    # -- running ---------------------------------------------------------------------

    def begin(self, task: Task, att: Attempt, ws: Workspace, kind: str, prev: Optional[Attempt]) -> None:
        self.running[task.id] = SettingUp(att, ws, kind, prev, plan=self.plan(task, att, ws))
        self.loop.led.update_attempt(att.id, info={**att.info, "setup": "running"})
        self.advance(task.id)

    def advance(self, task_id: str) -> None:
        """Start the next command, or, with none left, the agent."""
        s = self.running.get(task_id)
        if s is None:
            return
        task = self.loop.led.get(task_id)
        if task is None or task.state is not State.ASSIGNED:
            self.drop(task_id, "cancelled")
            return
        steps = s.plan
        while s.idx < len(steps):
            step = steps[s.idx]
            try:
                res = self.run_step(task, s, step)
            except Exception as e:  # a step that cannot be run fails, as a verifier would
                res = Verdict(False, "run", step.label, reason=f"cannot run: {type(e).__name__}: {e}")
            if res is None:
                res = Verdict(
                    False,
                    "run",
                    step.label,
                    reason="no plugin runs `run` commands"
                    if step.kind == baseline.KIND
                    else "no plugin runs setup commands",
                )
            if isinstance(res, Verdict):
                if not self.record(task, s, res):
                    return
                continue
            s.handle = res
            crash.point("mid_setup")
            return
        self.passed(task, s)

    def run_step(self, task: Task, s: SettingUp, step: VerifySpec) -> Optional[Union[Verdict, VerifyHandle]]:
        """Start one step: a setup command (``fleetrun_setup_step``, its number its place
        in ``task.spec.setup``), or a verifier's baseline (``fleetrun_verify``: it is
        that verifier, run on the base commit)."""
        config, host = self.loop.config, self._host(s)
        if step.kind == baseline.KIND:
            got: Optional[Union[Verdict, VerifyHandle]] = self.loop.hook.fleetrun_verify(
                task=task, verifier=step, workspace=s.workspace, attempt=s.attempt, host=host, config=config
            )
            return got
        return self.loop.hook.fleetrun_setup_step(
            task=task, step=step, number=s.idx + 1, workspace=s.workspace, attempt=s.attempt, host=host, config=config
        )

    def poll_one(self, task_id: str, s: SettingUp) -> None:
        """A setup command (an entry of the loop's pending table): record its end and go
        on, or stop it if the task left ASSIGNED. One task's bug (a raising
        ``fleetrun_spawn`` as its agent starts) stops that task: its entry goes."""
        if s.handle is None:
            return
        try:
            self._poll_one(task_id, s)
        except Exception:  # not Ctrl-C: cancel_all still has to stop its command
            self.running.pop(task_id, None)
            raise

    def _poll_one(self, task_id: str, s: SettingUp) -> None:
        task = self.loop.led.get(task_id)
        if task is None or task.state is not State.ASSIGNED:  # cancelled meanwhile
            self.drop(task_id, "cancelled")
            return
        verdict = s.handle.poll() if s.handle is not None else None
        if verdict is None:
            return
        s.handle = None
        if self.record(task, s, verdict):
            self.advance(task_id)

    def record(self, task: Task, s: SettingUp, verdict: Verdict) -> bool:
        """Record one command's end, then decide. :return: True to go on with the next."""
        step = s.plan[s.idx]
        out = verdict.output or ""
        att = self.loop.get_attempt(s.attempt.id)
        where: Optional[str] = None
        if step.kind == baseline.KIND:
            entry: dict[str, Any] = {
                "verifier": step.extra.get(baseline.OF),
                "label": step.label,
                "passed": verdict.passed,
                "reason": verdict.reason,
                "time": time.time(),
            }
            info = {**att.info, "baseline_steps": [*(att.info.get("baseline_steps") or []), entry]}
            if not verdict.passed:
                info["baseline"] = "failed"
        else:
            entry = {
                "n": s.idx + 1,
                "command": step.text,
                "passed": verdict.passed,
                "reason": verdict.reason,
                "duration_s": verdict.duration_s,
                "output": out[-KEEP_CHARS:],
                "time": time.time(),
            }
            host = self._host(s)
            if host.local:
                where = entry["out"] = str(host.attempt_dir(s.attempt.id) / f"setup-{s.idx + 1}.out")
            s.steps.append(entry)
            info = {**att.info, "setup_steps": s.steps}
            if not verdict.passed:
                info["setup"] = "failed"
        obs = SetupStepEnded(
            s.idx,
            len(s.plan),
            verdict.passed,
            baseline=step.kind == baseline.KIND,
            label=step.label,
            reason=verdict.reason,
            output=out,
            out=where,
        )
        if not verdict.passed:
            self.running.pop(task.id, None)
        self.loop.led.update_attempt(att.id, info=info)
        rest = self.loop.decide(task, att, obs)
        if verdict.passed and step.kind == baseline.KIND:
            self.loop.led.add_note(task.id, f"{step.label}: {verdict.reason}")
        if any(isinstance(a, (RunSetupStep, StartAgent)) for a in rest):
            s.idx += 1
            return True
        if any(isinstance(a, Drop) for a in rest):  # the task left ASSIGNED meanwhile (cancelled)
            if verdict.passed:
                self.drop(task.id, "cancelled")
            else:  # the attempt is over all the same
                self.loop.led.update_attempt(
                    att.id,
                    state="abandoned",
                    ended=time.time(),
                    outcome="baseline_fails" if obs.baseline else "setup_failed",
                )
        return False

    def passed(self, task: Task, s: SettingUp) -> None:
        self.running.pop(task.id, None)
        att = self.loop.get_attempt(s.attempt.id)
        setup_for = {
            **workspace_identity(att, s.workspace, self._host(s)),
            "commands": [x.text for x in task.spec.setup],
        }
        info = {**att.info, "setup": "passed", "setup_for": setup_for, "setup_steps": s.steps}
        if any(step.kind == baseline.KIND for step in s.plan):
            info["baseline"] = "done"
        self.loop.led.update_attempt(att.id, info=info)
        crash.point("after_setup")
        task = self.loop.get(task.id)
        if task.state is not State.ASSIGNED:
            self.drop(task.id, "cancelled")
            return
        att = self.loop.get_attempt(att.id)
        self.loop.launch(task, att, s.workspace, s.kind, s.prev)

    def drop(self, task_id: str, outcome: str) -> None:
        """The task left ASSIGNED while it was set up (cancelled): stop, and end the attempt."""
        s = self.running.pop(task_id, None)
        if s is None:
            return
        if isinstance(s.handle, Cancellable):
            s.handle.cancel()
        att = self.loop.led.attempt(s.attempt.id)
        if att is not None and att.state == "leased":
            self.loop.led.update_attempt(att.id, state="abandoned", outcome=outcome, ended=time.time())

    # -- for the loop's wait and its interruptions -----------------------------------

    def handles(self) -> list[VerifyHandle]:
        return [s.handle for s in self.running.values() if s.handle is not None]

    def cancel_all(self) -> int:
        """Stop every command (Ctrl-C, a full disk): the attempts stay ``leased``, so the
        next adoption abandons them and setup runs again from the start.

        :return: how many attempts were setting up."""
        n = len(self.running)
        for s in self.running.values():
            if isinstance(s.handle, Cancellable):
                s.handle.cancel()
        self.running.clear()
        return n

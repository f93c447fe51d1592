"""``run`` verifiers (and ``setup`` commands) of a task placed on the cluster, each a
Slurm job: they run where the task ran, as the seed's ``run`` verifiers do.

A step is a job of its own, named after the attempt and the step
(``fleetrun-<attempt id>-verify-N``, ``...-setup-K``), asking for the task's memory,
CPUs and ``requires``, on the attempt's node when the host is a node (``per_node``),
else wherever Slurm places it. Its files are in the step's folder in the attempt folder
(``verify-N/``, on the shared filesystem). Its script runs the command with
``/bin/sh -c`` in the worktree under fleetrun's wrapper (``fleetrun.CAPPED_PATH``, run
by path as for a local verifier: the output goes to ``out`` capped to ``[output]
max_bytes``, and what the command detaches is ended with it), then writes the exit
code to ``rc``. :class:`VerifyJob`, the handle the loop polls, reads ``rc`` and this
pass's ``squeue`` answer: it never blocks.

- **Timeout**: counted from the job's start (the script writes ``started``; a job
  waiting in the queue is not the command taking long): the handle ``scancel``s it
  and the verdict is a FAIL, as for a local verifier. ``--time`` (the timeout and a
  minute) is a backstop, should no supervisor be left to cancel it.
- **A job gone from the queue without ``rc``** (cancelled by someone, its node lost)
  could not judge the work: a transient ERROR (the verifier runs again after a backoff,
  never the agent's failure).
- **A supervisor restart** adopts a step's job whose result was not taken yet (``taken``
  is written when the handle gives its verdict): by its recorded id and name, or by its
  name alone when the crash came between the submit and its record. So the command runs
  once, and its verdict is recorded once. A second run of the same job script (a
  controller restarted right after the submit) finds ``started`` and runs nothing.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import sys
import time
from pathlib import Path
from typing import Any, Optional, Union

import fleetrun

from .host import JOB_FILE, TAKEN, SlurmHost, read_job, shell_quote, touch, write_file
from .slurmcli import PREFIX, SlurmError

SCRIPT = "job.sh"
OUT = "out"
RC = "rc"
STARTED = "started"
SLURM_OUT = "slurm.out"
#: how often the handle looks for the job's ``rc`` (a file on the shared folder: cheap),
#: and how often at most it asks the queue whether the job is still there (the pass's
#: one ``squeue``, not one per handle: a controller is not to be hammered)
RC_POLL_S, QUEUE_POLL_S = 0.25, 1.0
#: a time as the job script writes it (``date +%s.%N``)
TIME = re.compile(r"[0-9]{1,12}(\.[0-9]{1,9})?")
#: ``--time`` is the verifier's timeout plus this: the handle ends it first
BACKSTOP_S = 60.0


def step_name(task: Any, verifier: Any) -> str:
    """``setup-K`` for setup command K, else ``verify-N`` (its place among the task's
    verifiers, from 1), as the local outputs are named."""
    k = verifier.extra.get("setup") if isinstance(verifier.extra, dict) else None
    if isinstance(k, int) and not isinstance(k, bool) and k >= 1:
        return f"setup-{k}"
    verify = list(task.spec.verify)
    return f"verify-{verify.index(verifier) + 1 if verifier in verify else 1}"


def job_script(vdir: Path, cwd: str, text: str, max_bytes: int) -> str:
    """The step's job script: the command in ``cwd`` under the wrapper, its exit code
    (or ``cannot``: no such folder on the node) and the end time to ``rc``."""
    q = shell_quote
    done = " || ".join(f"[ -e {q(str(vdir / n))} ]" for n in (STARTED, RC, TAKEN))
    return (
        "#!/bin/sh\n"
        'echo "fleetrun-slurm: verifier job $SLURM_JOB_ID on $SLURMD_NODENAME"\n'
        # a second run of this script (a controller restarted right after the
        # submit may make one) runs nothing
        f"if {done}; then echo 'fleetrun-slurm: this step ran already: it is not run twice'; exit 0; fi\n"
        f"date +%s.%N > {q(str(vdir / 'started.tmp'))} && mv -f {q(str(vdir / 'started.tmp'))} "
        f"{q(str(vdir / STARTED))}\n"
        f"if cd {q(cwd)}; then\n"
        f"  {q(sys.executable)} -I -S {q(fleetrun.CAPPED_PATH)} {int(max_bytes)} {q(str(vdir / OUT))} -- "
        f"/bin/sh -c {q(text)}\n"
        "  rc=$?\n"
        "else\n"
        "  rc=cannot\n"
        "fi\n"
        f'echo "$rc $(date +%s.%N)" > {q(str(vdir / "rc.tmp"))} && mv -f {q(str(vdir / "rc.tmp"))} '
        f"{q(str(vdir / RC))}\n"
    )


def read_rc(vdir: Path) -> Optional[tuple[Union[int, str], float]]:
    """(exit code or ``"cannot"``, end time) from ``rc``, or None (none yet, or not of
    that shape: it is in a folder the command could write to)."""
    try:
        with open(vdir / RC, "rb") as f:
            words = f.read(100).decode("ascii", "replace").split()
    except OSError:
        return None
    if len(words) != 2 or not TIME.fullmatch(words[1]):
        return None
    if words[0] == "cannot":
        return "cannot", float(words[1])
    if not words[0].isdigit() or len(words[0]) > 3 or int(words[0]) > 255:
        return None
    return int(words[0]), float(words[1])


def read_started(vdir: Path) -> Optional[float]:
    try:
        text = (vdir / STARTED).read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return None
    return float(text) if TIME.fullmatch(text) else None


def step_key(text: str, cwd: str, timeout_s: float) -> str:
    """What makes a step's job the one to adopt: the same command, in the same folder."""
    return hashlib.sha256(json.dumps([text, cwd, timeout_s]).encode()).hexdigest()[:16]


class VerifyJob:
    """A ``run`` step running as a Slurm job: a :class:`fleetrun.VerifyHandle` with
    ``cancel`` and ``next_deadline``.

    :param host: the cluster (or node) the attempt ran on.
    :param verifier: the step's :class:`fleetrun.VerifySpec`.
    :param vdir: the step's folder.
    :param name: its job name; ``job_id`` its id.
    :param root: the workspace's top (a missing script inside it is the work's fault).
    :param path_var: the ``PATH`` the command runs with.
    """

    def __init__(
        self,
        host: SlurmHost,
        verifier: Any,
        vdir: Path,
        name: str,
        job_id: int,
        cwd: str,
        root: str,
        path_var: Optional[str],
    ) -> None:
        self.host, self.verifier, self.vdir, self.name, self.job_id = host, verifier, vdir, name, job_id
        self.cwd, self.root, self.path_var = cwd, root, path_var
        self.verdict: Optional[fleetrun.Verdict] = None
        self.next_poll = time.monotonic()
        self.next_queue = self.next_poll

    def next_deadline(self) -> float:
        return self.next_poll

    def poll(self) -> Optional[fleetrun.Verdict]:
        if self.verdict is not None:
            return self.verdict
        now = time.monotonic()
        if now < self.next_poll:
            return None
        self.next_poll = now + RC_POLL_S
        verdict = self._look(now)
        if verdict is not None:
            self.verdict = verdict
            touch(self.vdir / TAKEN)  # a restart after this runs the step again, never adopts it
        return verdict

    def cancel(self) -> None:
        if self.verdict is None:
            touch(self.vdir / TAKEN)
            self.host.slurm.cancel(self.name, self.job_id)

    def _over_time(self) -> bool:
        started = read_started(self.vdir)
        return started is not None and time.time() >= started + float(self.verifier.timeout_s)

    def _look(self, now: float) -> Optional[fleetrun.Verdict]:
        got = read_rc(self.vdir)
        if got is not None:
            return self._ended(*got)
        if now < self.next_queue:
            return None
        self.next_queue = now + QUEUE_POLL_S
        queue = self.host.slurm.queue()
        if isinstance(queue, SlurmError):
            return None  # the controller does not answer: the job may still run (--time bounds it)
        job = queue.get(self.name)
        if job is not None and job.job_id == self.job_id:
            if self._over_time():
                self.host.slurm.cancel(self.name, self.job_id)
                return self._timed_out()
            return None
        got = read_rc(self.vdir)  # it may have just ended
        if got is not None:
            return self._ended(*got)
        if self._over_time():  # ended at its time limit while no supervisor was there
            return self._timed_out()
        return self._make(
            False,
            f"its Slurm job {self.job_id} left the queue without a result (cancelled, or its node was lost)",
            output=fleetrun.tail_text(self.vdir / SLURM_OUT),
            error="transient",
        )

    def _make(
        self,
        passed: bool,
        reason: str,
        output: Optional[str] = None,
        error: Optional[str] = None,
        duration_s: float = 0.0,
    ) -> fleetrun.Verdict:
        cut = fleetrun.read_cut(str(self.vdir / OUT))
        if cut:  # the flood is this verifier's to answer for, in its own verdict
            reason = f"{reason}; {fleetrun.cut_note(*cut)}"
        return fleetrun.Verdict(
            passed=passed,
            kind="run",
            label=self.verifier.label,
            reason=reason,
            output=fleetrun.tail_text(self.vdir / OUT) if output is None else output,
            duration_s=duration_s,
            host=self.host.name,
            error=error,
        )

    def _timed_out(self) -> fleetrun.Verdict:
        return self._make(
            False, f"timed out after {float(self.verifier.timeout_s):g}s", duration_s=float(self.verifier.timeout_s)
        )

    def _ended(self, code: Union[int, str], ended: float) -> fleetrun.Verdict:
        started = read_started(self.vdir)
        took = max(0.0, ended - started) if started is not None else 0.0
        if code == "cannot":
            return self._make(False, f"cannot start: no folder {self.cwd} on the node", error="permanent")
        assert isinstance(code, int)
        if code == 0:
            return self._make(True, "exit code 0", duration_s=took)
        if code in (126, 127):
            # the job runs with this process's PATH (--export=ALL)
            why = fleetrun.not_found_error(self.verifier.text, self.path_var, self.root)
            if why:
                return self._make(False, why, error="permanent", duration_s=took)
        return self._make(False, f"exit code {code}", duration_s=took)


def verify_job(
    host: SlurmHost, task: Any, verifier: Any, workspace: Any, attempt: Any, config: Any
) -> Union[VerifyJob, fleetrun.Verdict]:
    """The step's job: adopted when one of this step was submitted and its result not
    taken (a supervisor restart), else a new one."""
    step = step_name(task, verifier)
    vdir = host.attempt_dir(attempt.id) / step
    name = f"{PREFIX}{attempt.id}-{step}"
    cwd = str(workspace.path)
    root = str(getattr(workspace, "root", None) or workspace.path)
    env = fleetrun.task_env(task, attempt, workspace)
    key = step_key(verifier.text, cwd, float(verifier.timeout_s))
    rec = read_job(vdir)
    queue = host.slurm.queue()
    queued = queue.get(name) if not isinstance(queue, SlurmError) else None

    def handle(job_id: int) -> VerifyJob:
        return VerifyJob(host, verifier, vdir, name, job_id, cwd, root, env.get("PATH"))

    if not (vdir / TAKEN).exists() and (rec is None or rec.get("key") == key):
        if queued is not None and (rec is None or queued.job_id == rec["job_id"]):
            if rec is None:  # submitted, and the crash came before its record
                write_file(vdir / JOB_FILE, json.dumps({"job_id": queued.job_id, "name": name, "key": key}))
            return handle(queued.job_id)
        if rec is not None and (read_rc(vdir) is not None or isinstance(queue, SlurmError)):
            return handle(int(rec["job_id"]))  # it ended while no one watched, or cannot be asked now
    if queued is not None:  # a job of this step that is not to be adopted (cancelled, another command)
        host.slurm.cancel(name, queued.job_id)
    # a setup command runs before the attempt's job is submitted: its folder may not exist yet
    vdir.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    vdir.mkdir(exist_ok=True, mode=0o700)
    for stale in (RC, STARTED, TAKEN, OUT, OUT + ".cut", SLURM_OUT, JOB_FILE):
        try:
            (vdir / stale).unlink()
        except FileNotFoundError:
            pass
    write_file(vdir / SCRIPT, job_script(vdir, cwd, verifier.text, fleetrun.output_cap(config)))
    os.chmod(vdir / SCRIPT, 0o700)
    minutes = math.ceil((float(verifier.timeout_s) + BACKSTOP_S) / 60.0)
    argv = [
        f"--job-name={name}",
        "--no-requeue",
        f"--output={vdir / SLURM_OUT}",
        f"--chdir={vdir}",
        f"--time={minutes}",
        *host.resources(task),
        str(vdir / SCRIPT),
    ]
    try:
        job_id = host.slurm.submit(argv, env=env)
    except SlurmError as e:
        # a controller that does not answer may have queued it all the same: the next try
        # (after the backoff of a transient ERROR) adopts it by its name
        transient = "did not answer" in str(e) or "Unable to contact" in str(e)
        return fleetrun.Verdict(
            False,
            "run",
            verifier.label,
            reason=f"cannot start: sbatch: {e}",
            host=host.name,
            error="transient" if transient else "permanent",
        )
    write_file(vdir / JOB_FILE, json.dumps({"job_id": job_id, "name": name, "submitted": time.time(), "key": key}))
    return handle(job_id)

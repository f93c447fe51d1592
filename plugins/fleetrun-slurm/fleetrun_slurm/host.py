"""The Slurm cluster as a fleetrun host: an attempt is a batch job.

The job's script runs the shepherd in the foreground (a production Slurm ends
everything in a job when its main process ends), in the attempt folder on the shared
filesystem (``shared_dir``); the supervisor reads the shepherd's files there as it
reads a local attempt's, and asks the queue (one ``squeue`` per loop pass) whether the
job is still there:

- in the queue, pending: ``starting`` (Slurm has not given it a node yet);
- in the queue, running: what the shepherd's ``status.json`` says;
- gone from the queue with an end recorded: that end; without one: ``died``;
- the controller does not answer: ``unreachable`` (the attempt is not counted dead).

The job is named after the attempt (``fleetrun-<attempt id>``) and its id is recorded
with its submit time in the attempt folder (``slurm_job.json``): a job is believed only
when its id and its name agree, so a reused job id is never taken for the attempt's,
and adoption after a supervisor restart finds the job by either.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import fleetrun

from .slurmcli import PENDING_STATES, PREFIX, Answer, Job, Slurm, SlurmError

STATUS = "status.json"
SPEC = "spec.json"
LOG = "log"
CANCEL = "cancel"
START_LOCK = "start.lock"
JOB_FILE = "slurm_job.json"
SCRIPT = "job.sh"
#: a step's folder in the attempt folder, and the job of the step (a ``run`` verifier or
#: setup command: :mod:`fleetrun_slurm.verifyjob`) is ``fleetrun-<attempt id>-<step>``
STEP = re.compile(r"(verify|setup)-[0-9]{1,5}")
#: in a step's folder: its result was given to the loop (or it was cancelled)
TAKEN = "taken"
STATES = ("starting", "running", "ended")
REASONS = ("exited", "timeout", "stalled", "cancelled", "stopped", "start_failed", "malformed_status")
MAX_STATUS_BYTES = 1 << 20


@dataclass
class Settings:
    """``[slurm]`` in ``config.toml`` (see the plugin's README)."""

    shared_dir: Path
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    time: Optional[str] = None
    mem_mb: int = 1024
    cpus: int = 1
    sbatch_options: list[str] = field(default_factory=list)
    max_jobs: int = 8
    per_node: bool = False
    name: str = "slurm"
    bin_dir: Optional[str] = None


def job_name(attempt_id: str) -> str:
    return f"{PREFIX}{attempt_id}"


def read_status(adir: Path) -> tuple[dict[str, Any], Optional[str]]:
    """The shepherd's ``status.json``, checked: (status, None), ({}, None) when there is
    none, ({}, why) when it is malformed. Only the keys fleetrun reads, each of its type
    (the agent runs as the same user and could write there)."""
    try:
        with open(adir / STATUS, "rb") as f:
            raw = f.read(MAX_STATUS_BYTES + 1)
    except OSError:
        return {}, None
    if len(raw) > MAX_STATUS_BYTES:
        return {}, "too large"
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):
        return {}, "not JSON"
    if not isinstance(data, dict) or data.get("state") not in STATES:
        return {}, "no state"
    out: dict[str, Any] = {"state": data["state"]}
    for key in ("shepherd_pid", "agent_pid", "signal", "log_dropped", "log_cut", "log_cap"):
        v = data.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < (1 << 40):
            out[key] = v
    for key in ("started", "agent_started", "ended", "beat"):
        v = data.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 1e11:
            out[key] = float(v)
    for key in ("shepherd_token", "agent_token", "attempt", "error"):
        v = data.get(key)
        if isinstance(v, str) and v.isprintable():
            out[key] = v[:2000]
    if "exit_code" in data:
        code = data["exit_code"]
        out["exit_code"] = (
            code if isinstance(code, int) and not isinstance(code, bool) and -255 <= code <= 255 else None
        )
    reason = data.get("reason")
    if isinstance(reason, str) and reason.split(":", 1)[0] in REASONS and reason.isprintable():
        out["reason"] = reason[:500]
    elif out["state"] == "ended":
        return {}, "an end without a known reason"
    return out, None


def read_job(adir: Path) -> Optional[dict[str, Any]]:
    """The job recorded for the attempt (``job_id``, ``name``, ``submitted``), or None."""
    try:
        data = json.loads((adir / JOB_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("job_id"), int) or not isinstance(data.get("name"), str):
        return None
    return data


def write_file(path: Path, text: str) -> None:
    """Write a file whole (temp file + rename), readable by us alone."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def touch(path: Path) -> None:
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))


class SlurmHost:
    """The cluster (or one of its nodes, ``node``) as a :class:`fleetrun.Host`.

    :param name: the host's name (``slurm``, or ``slurm-<node>`` per node).
    :param settings: ``[slurm]``.
    :param slurm: the run's :class:`~fleetrun_slurm.slurmcli.Slurm` (shared by every
        host of the cluster, so a pass asks the queue once).
    :param node: the node jobs are pinned to (``-w``), or None: Slurm picks.
    """

    # the worktrees and attempt folders are on the shared filesystem, mounted here too:
    # the worktree plugin makes them and reads them as it does on this machine
    local = True

    def __init__(self, name: str, settings: Settings, slurm: Slurm, node: Optional[str] = None) -> None:
        self.name = name
        self.settings = settings
        self.slurm = slurm
        self.node = node
        self.root = settings.shared_dir / "attempts"
        #: attempt id -> its task, handed over by ``fleetrun_start_attempt`` just before
        #: ``start`` (the task's own memory, CPUs, time and ``requires``)
        self.tasks: dict[str, Any] = {}

    def attempt_dir(self, attempt_id: str) -> Path:
        return self.root / attempt_id

    def log_path(self, attempt_id: str) -> Path:
        return self.attempt_dir(attempt_id) / LOG

    # -- start ---------------------------------------------------------------------

    def sbatch_argv(self, attempt_id: str, task: Any) -> list[str]:
        """sbatch's options for an attempt (the script last)."""
        adir = self.attempt_dir(attempt_id)
        extra = dict(getattr(getattr(task, "spec", None), "extra", None) or {})
        t = extra.get("slurm_time", self.settings.time)
        return [
            f"--job-name={job_name(attempt_id)}",
            "--no-requeue",
            f"--output={adir / 'slurm.out'}",
            f"--chdir={adir}",
            *([f"--time={t}"] if t else []),
            *self.resources(task),
            str(adir / SCRIPT),
        ]

    def resources(self, task: Any) -> list[str]:
        """What a job of ``task`` asks for and where it may run, an attempt's or a
        verifier's: its memory and CPUs, ``--partition``/``--account``/``--qos``, its
        ``requires`` as ``--constraint`` and ``--gres``, the node of a per-node host,
        ``sbatch_options``; and ``--export=ALL``."""
        s = self.settings
        extra = dict(getattr(getattr(task, "spec", None), "extra", None) or {})
        requires = list(getattr(getattr(task, "spec", None), "requires", None) or [])
        argv = [
            f"--mem={extra.get('slurm_mem_mb', s.mem_mb)}M",
            f"--cpus-per-task={extra.get('slurm_cpus', s.cpus)}",
            "--export=ALL",
        ]
        for opt, value in (("partition", s.partition), ("account", s.account), ("qos", s.qos)):
            if value:
                argv.append(f"--{opt}={value}")
        features = [r for r in requires if r != "gpu"]
        if features:
            argv.append("--constraint=" + "&".join(features))
        if "gpu" in requires:
            argv.append("--gres=gpu:1")
        if self.node:
            argv.append(f"--nodelist={self.node}")
        return [*argv, *s.sbatch_options]

    def start(self, attempt_id: str, spec: dict[str, Any], prompt: Optional[str] = None) -> fleetrun.Started:
        """Submit the attempt as a job and return at once (it may wait in the queue).

        :raises fleetrun.StartRefused: sbatch refused it (Slurm's reason: more memory
            than any node has, an unknown feature...) or cannot be run.
        """
        adir = self.attempt_dir(attempt_id)
        adir.mkdir(parents=True, exist_ok=True, mode=0o700)
        spec = dict(spec, attempt_id=attempt_id)
        if prompt is not None:
            write_file(adir / "prompt", prompt)
            if spec.get("stdin") == "prompt":
                spec["stdin_file"] = str(adir / "prompt")
        write_file(adir / SPEC, json.dumps(spec))
        # the shepherd in the foreground: the job lasts as long as it does. Its command
        # line, not its module: the node runs the same install from the shared folder
        write_file(
            adir / SCRIPT,
            "#!/bin/sh\n"
            'echo "fleetrun-slurm: job $SLURM_JOB_ID on $SLURMD_NODENAME"\n'
            f"exec {shell_quote(sys.executable)} -m fleetrun.shepherd {shell_quote(str(adir))}\n",
        )
        os.chmod(adir / SCRIPT, 0o700)
        task = self.tasks.pop(attempt_id, None)
        name = job_name(attempt_id)
        submitted = time.time()
        try:
            job_id = self.slurm.submit(self.sbatch_argv(attempt_id, task))
        except SlurmError as e:
            if "did not answer" in str(e):
                # it may have been queued all the same: status looks it up by its name
                return fleetrun.Started(pid=None, token=None, dir=str(adir), info={"error": str(e)})
            raise fleetrun.StartRefused(f"sbatch: {e}") from None
        write_file(adir / JOB_FILE, json.dumps({"job_id": job_id, "name": name, "submitted": submitted}))
        return fleetrun.Started(pid=job_id, token=token(job_id), dir=str(adir), info={"job_id": job_id})

    # -- status ---------------------------------------------------------------------

    def find_job(
        self, attempt_id: str, pid: Optional[int], queue: Optional[Answer] = None
    ) -> tuple[Optional[Job], Optional[str]]:
        """The attempt's job in this pass's queue (``queue``: an answer already asked
        for): (job or None, None), or (None, why) when the controller does not answer.
        Believed only when its name is the attempt's and its id the recorded one (when
        one is recorded)."""
        if queue is None:
            queue = self.slurm.queue()
        if isinstance(queue, SlurmError):
            return None, f"the Slurm controller does not answer: {queue}"
        job = queue.get(job_name(attempt_id))
        if job is None:
            return None, None
        recorded = read_job(self.attempt_dir(attempt_id))
        want = pid or (recorded or {}).get("job_id")
        if want is not None and job.job_id != want:
            return None, None  # a job of that name that is not this attempt's
        return job, None

    def poll(self, attempts: Sequence[fleetrun.AttemptRef]) -> dict[str, dict[str, Any]]:
        """Every one of ``attempts``' status at once: one ``squeue`` for all of
        fleetrun's jobs (this pass's answer, shared with :meth:`candidate` and every
        host of the cluster), plus each attempt's ``status.json`` on the shared folder."""
        queue = self.slurm.queue()
        return {a.attempt_id: self._status(a.attempt_id, a.pid, queue) for a in attempts}

    def status(self, attempt_id: str, pid: Optional[int], token_: Optional[str]) -> dict[str, Any]:
        return self._status(attempt_id, pid, None)

    def _status(self, attempt_id: str, pid: Optional[int], queue: Optional[Answer]) -> dict[str, Any]:
        adir = self.attempt_dir(attempt_id)
        st, bad = read_status(adir)
        if st.get("state") == "ended":
            return self._ours(st, adir, pid)
        job, unreachable = self.find_job(attempt_id, pid, queue)
        if unreachable is not None:
            return {"state": "unreachable", "error": unreachable}
        if job is not None:
            if job.state in PENDING_STATES or not st:
                # no node yet, or the shepherd has not written its first status
                return self._ours(
                    {"state": "starting", "slurm_state": job.state, "slurm_reason": job.reason}, adir, job.job_id
                )
            return self._ours(dict(st, node=job.node), adir, job.job_id)
        # gone from the queue (or never in it): read once more, it may have just ended
        again, bad = read_status(adir)
        st = again or st
        if st.get("state") == "ended":
            return self._ours(st, adir, pid)
        recorded = read_job(adir)
        if recorded is None and pid is None:
            # nothing was submitted, or sbatch's answer was lost and the queue has no job
            # of its name: nothing of it runs (adoption gives it up under the start lock)
            return {"state": "died", "error": "no Slurm job was submitted for it"}
        if bad is not None:
            return self._ours(
                {
                    "state": "ended",
                    "reason": "malformed_status",
                    "exit_code": None,
                    "error": f"malformed status.json: {bad}",
                },
                adir,
                pid,
            )
        return self._ours(
            dict(st, state="died", error="its Slurm job left the queue without an end recorded"), adir, pid
        )

    def _ours(self, st: dict[str, Any], adir: Path, job_id: Optional[int]) -> dict[str, Any]:
        """The status with the job as the process the ledger follows (its id and token):
        the shepherd's own pid is on a node, meaningless here."""
        if job_id is None:
            recorded = read_job(adir)
            job_id = recorded["job_id"] if recorded else None
        out = dict(st)
        if "shepherd_pid" in out:
            out["node_pid"] = out.pop("shepherd_pid")
        out.pop("shepherd_token", None)
        if job_id is not None:
            out.update(shepherd_pid=job_id, shepherd_token=token(job_id), job_id=job_id)
        return out

    # -- stop, give up -------------------------------------------------------------

    def stop(self, attempt_id: str, pid: Optional[int], token_: Optional[str]) -> bool:
        """The cancel file, then ``scancel``: a pending job is cancelled (it never
        starts); a running one's shepherd alone gets SIGTERM (``--batch``), so that it
        ends its agent with the grace it gives and records why, and the job ends with
        it. Cancelling a running job outright signals the agent too, and the shepherd
        could record a plain exit instead of the stop. Safe to repeat."""
        adir = self.attempt_dir(attempt_id)
        if adir.exists():
            touch(adir / CANCEL)
        steps = self.cancel_steps(attempt_id)
        job, _ = self.find_job(attempt_id, pid)
        if job is None:
            return steps
        if job.state in PENDING_STATES:
            return self.slurm.cancel(job.name, job.job_id) is None
        return self.slurm.cancel(job.name, job.job_id, signal="TERM") is None

    def cancel_steps(self, attempt_id: str) -> bool:
        """Cancel the jobs of the attempt's verifiers and setup commands still in the
        queue (a task cancelled while no supervisor follows them: nothing of it may run
        on), each marked taken so that no restart adopts it. :return: whether there
        were any."""
        queue = self.slurm.queue()
        if isinstance(queue, SlurmError):
            return False
        prefix = job_name(attempt_id) + "-"
        found = False
        for name, job in queue.items():
            step = name[len(prefix) :] if name.startswith(prefix) else ""
            if not STEP.fullmatch(step):
                continue
            sdir = self.attempt_dir(attempt_id) / step
            if sdir.is_dir():
                touch(sdir / TAKEN)
            found = self.slurm.cancel(name, job.job_id) is None or found
        return found

    def give_up(self, attempt_id: str) -> dict[str, Any]:
        """Decide, under the shepherd's start lock, that the attempt never started: a
        cancel file (a job that runs late starts nothing) and ``scancel`` by name."""
        import fcntl

        adir = self.attempt_dir(attempt_id)
        if not adir.exists():
            return {}
        fd = os.open(adir / START_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            st, _ = read_status(adir)
            if st:
                return self._ours(st, adir, None)
            touch(adir / CANCEL)
        finally:
            os.close(fd)
        self.slurm.cancel(job_name(attempt_id))
        return {}

    # -- placement -----------------------------------------------------------------

    def candidate(self, config: Any) -> Optional[fleetrun.Candidate]:
        """The room Slurm reports: the most free memory (RealMemory minus AllocMem) of a
        usable node, its idle CPUs, the nodes' features (and ``gpu`` for a GPU GRES)."""
        # the queue first: when the controller does not answer, squeue says so at once,
        # where scontrol tries again for many seconds
        queue = self.slurm.queue()
        nodes = self.slurm.nodes() if not isinstance(queue, SlurmError) else queue
        s = self.settings
        if isinstance(nodes, SlurmError) or isinstance(queue, SlurmError):
            err = nodes if isinstance(nodes, SlurmError) else queue
            return fleetrun.Candidate(
                name=self.name, kind="peer", why_not=f"does not answer: {err}", max_tasks=s.max_jobs, status="live"
            )
        mine = [
            n
            for n in nodes
            if n.usable
            and (self.node is None or n.name == self.node)
            and (s.partition is None or not n.partitions or s.partition in n.partitions)
        ]
        running = sum(1 for j in queue.values() if self.node is None or j.node == self.node)
        tags: set[str] = set()
        for n in mine:
            tags |= n.features
            if n.gpus:
                tags.add("gpu")
        best = max(mine, key=lambda n: n.free_mem_mb or 0, default=None)
        info: dict[str, Any] = {
            "nodes": {
                n.name: {"free_mem_mb": n.free_mem_mb, "idle_cpus": n.idle_cpus, "features": sorted(n.features)}
                for n in mine
            }
        }
        return fleetrun.Candidate(
            name=self.name,
            kind="peer",
            free_mem_mb=float(best.free_mem_mb) if best and best.free_mem_mb is not None else None,
            running=running,
            max_tasks=s.max_jobs,
            tags=frozenset(tags),
            mem_per_task_mb=float(s.mem_mb),
            why_not=None if mine else "has no node up",
            info=info,
        )


def token(job_id: int) -> str:
    return f"slurm:{job_id}"


def shell_quote(s: str) -> str:
    return "'" + s.replace("'", "'\\''") + "'"

"""Slurm's own commands, run and their answers parsed strictly.

Everything Slurm prints is read as untrusted text: a line that does not have the shape
asked for is skipped (and counted), a number that is not digits is no number, and no
answer ever raises past this module: a command that cannot be run, times out or fails
is a :class:`SlurmError` with Slurm's own words, which the host turns into a reasoned
outcome (an unreachable host, a refused start).

One ``squeue`` and one ``scontrol show node`` per loop pass at most (:class:`Slurm`
keeps each answer until :meth:`Slurm.forget`, which the plugin calls at the end of
every pass, or for :data:`TTL_S` for the commands that run no loop).
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from typing import Optional, Union

#: how long an answer is kept when no loop pass ends it (``fleetrun status``)
TTL_S = 2.0
#: a Slurm command that takes longer has a controller that does not answer
TIMEOUT_S = 30.0
#: the job name of an attempt: the attempt id (``<task-id>_a<N>``) after this prefix
PREFIX = "fleetrun-"
_JOB_ID = re.compile(r"[0-9]{1,12}")
_NAME = re.compile(r"fleetrun-[A-Za-z0-9_.-]{1,200}")
#: job states that mean the batch script may run or runs (anything else in the queue
#: is on its way out: COMPLETING, CANCELLED...)
PENDING_STATES = frozenset(
    {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SUSPENDED"}
)


class SlurmError(Exception):
    """A Slurm command could not be run or said no; the message is its own words."""


@dataclass(frozen=True)
class Job:
    """One of fleetrun's jobs as ``squeue`` lists it."""

    job_id: int
    name: str
    state: str
    node: str
    reason: str


@dataclass(frozen=True)
class Node:
    """One node as ``scontrol show node`` says it."""

    name: str
    state: str
    cpus: Optional[int]
    cpus_alloc: Optional[int]
    real_mem_mb: Optional[int]
    alloc_mem_mb: Optional[int]
    features: frozenset[str]
    gres: str
    partitions: frozenset[str] = field(default_factory=frozenset)

    @property
    def usable(self) -> bool:
        """Up and taking jobs (not down, drained, failing or not responding)."""
        bad = ("DOWN", "DRAIN", "FAIL", "NOT_RESPONDING", "FUTURE", "POWER", "MAINT", "REBOOT", "UNKNOWN")
        return bool(self.state) and not any(b in self.state for b in bad) and not self.state.endswith("*")

    @property
    def free_mem_mb(self) -> Optional[int]:
        """Memory as Slurm accounts it: RealMemory minus AllocMem."""
        if self.real_mem_mb is None or self.alloc_mem_mb is None:
            return None
        return max(0, self.real_mem_mb - self.alloc_mem_mb)

    @property
    def idle_cpus(self) -> Optional[int]:
        if self.cpus is None or self.cpus_alloc is None:
            return None
        return max(0, self.cpus - self.cpus_alloc)

    @property
    def gpus(self) -> int:
        """GPUs in its GRES (``gpu:2``, ``gpu:a100:2(S:0)``)."""
        n = 0
        for item in self.gres.split(","):
            parts = item.split("(")[0].split(":")
            if parts[0] == "gpu":
                n += int(parts[-1]) if parts[-1].isdigit() and len(parts) > 1 else 1
        return n


def run(argv: list[str], env: Optional[dict[str, str]] = None, timeout: float = TIMEOUT_S) -> str:
    """Run a Slurm command; :return: its standard output. :raises SlurmError: it could
    not run, timed out or exited non-zero (with the last line of what it said)."""
    import subprocess  # here: `fleetrun --help` and `status` load this plugin and start nothing

    try:
        r = subprocess.run(
            argv, capture_output=True, text=True, errors="replace", timeout=timeout, stdin=subprocess.DEVNULL, env=env
        )
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{argv[0]} did not answer in {timeout:g} s") from None
    except OSError as e:
        raise SlurmError(f"cannot run {argv[0]}: {e.strerror or e}") from None
    if r.returncode != 0:
        # every line: sbatch says why first ("Memory specification can not be
        # satisfied"), then that the submission failed
        name = os.path.basename(argv[0])
        said = [_unprefixed(line.strip(), name) for line in (r.stderr or r.stdout).splitlines() if line.strip()]
        raise SlurmError("; ".join(said)[:1000] if said else f"{name} exited {r.returncode}")
    return r.stdout


def _unprefixed(line: str, name: str) -> str:
    """A Slurm command's message without its ``sbatch: error: `` prefix."""
    for prefix in (f"{name}: error: ", f"{name}: fatal: ", f"{name}: "):
        if line.startswith(prefix):
            return line[len(prefix) :]
    return line


def parse_squeue(text: str) -> dict[str, Job]:
    """``squeue -h -o %i|%T|%N|%r|%j`` as {job name: job}, fleetrun's jobs only (the name
    last: another user's may hold a ``|``). Of two jobs with one name, the newer id."""
    jobs: dict[str, Job] = {}
    for line in text.splitlines():
        parts = line.split("|", 4)
        if len(parts) != 5 or not _JOB_ID.fullmatch(parts[0]) or not _NAME.fullmatch(parts[4]):
            continue
        job = Job(int(parts[0]), parts[4], parts[1].strip().upper(), parts[2].strip(), parts[3].strip())
        old = jobs.get(job.name)
        if old is None or old.job_id < job.job_id:
            jobs[job.name] = job
    return jobs


def _field(line: str, key: str) -> Optional[str]:
    m = re.search(rf"(?:^|\s){key}=(\S*)", line)
    return m.group(1) if m else None


def _int(v: Optional[str]) -> Optional[int]:
    return int(v) if v is not None and v.isdigit() and len(v) < 16 else None


def parse_nodes(text: str) -> list[Node]:
    """``scontrol show node -o`` (one line per node)."""
    nodes = []
    for line in text.splitlines():
        name = _field(line, "NodeName")
        if not name or not re.fullmatch(r"[A-Za-z0-9_.-]{1,100}", name):
            continue
        feats = _field(line, "ActiveFeatures") or _field(line, "AvailableFeatures") or ""
        gres = _field(line, "Gres") or ""
        parts = _field(line, "Partitions") or ""
        nodes.append(
            Node(
                name=name,
                state=(_field(line, "State") or "").upper(),
                cpus=_int(_field(line, "CPUTot")),
                cpus_alloc=_int(_field(line, "CPUAlloc")),
                real_mem_mb=_int(_field(line, "RealMemory")),
                alloc_mem_mb=_int(_field(line, "AllocMem")),
                features=frozenset(f for f in feats.split(",") if f and f != "(null)"),
                gres="" if gres == "(null)" else gres,
                partitions=frozenset(p for p in parts.split(",") if p and p != "(null)"),
            )
        )
    return nodes


def parse_submitted(text: str) -> Optional[int]:
    """``sbatch --parsable``'s answer: ``JOBID`` or ``JOBID;CLUSTER``."""
    first = text.strip().split(";", 1)[0]
    return int(first) if _JOB_ID.fullmatch(first) else None


Answer = Union[dict[str, Job], SlurmError]


class Slurm:
    """The cluster's commands for one run, with each pass's answers kept.

    :param bin_dir: where the commands are (None: ``PATH``).
    """

    def __init__(self, bin_dir: Optional[str] = None) -> None:
        self.bin_dir = bin_dir
        self._queue: Optional[tuple[float, Answer]] = None
        self._nodes: Optional[tuple[float, Union[list[Node], SlurmError]]] = None
        self.calls = {"squeue": 0, "scontrol": 0, "sbatch": 0, "scancel": 0}

    def cmd(self, name: str) -> str:
        return os.path.join(self.bin_dir, name) if self.bin_dir else name

    def forget(self) -> None:
        """Ask again next time (a loop pass ended, a job was submitted or cancelled)."""
        self._queue = None
        self._nodes = None

    def queue(self) -> Answer:
        """fleetrun's jobs of this user in the queue, one ``squeue`` per pass; or the
        :class:`SlurmError` (the controller does not answer)."""
        now = time.monotonic()
        if self._queue is not None and now - self._queue[0] < TTL_S:
            return self._queue[1]
        self.calls["squeue"] += 1
        answer: Answer
        try:
            answer = parse_squeue(run([self.cmd("squeue"), "-h", f"--user={os.getuid()}", "-o", "%i|%T|%N|%r|%j"]))
        except SlurmError as e:
            answer = e
        self._queue = (now, answer)
        return answer

    def nodes(self) -> Union[list[Node], SlurmError]:
        now = time.monotonic()
        if self._nodes is not None and now - self._nodes[0] < TTL_S:
            return self._nodes[1]
        self.calls["scontrol"] += 1
        answer: Union[list[Node], SlurmError]
        try:
            answer = parse_nodes(run([self.cmd("scontrol"), "show", "node", "-o"]))
        except SlurmError as e:
            answer = e
        self._nodes = (now, answer)
        return answer

    def submit(self, argv: list[str], env: Optional[dict[str, str]] = None) -> int:
        """``sbatch --parsable ARGV`` (in ``env``: what ``--export=ALL`` hands the job;
        None: ours); :return: the job id. :raises SlurmError: refused (Slurm's reason),
        or an answer that is no job id."""
        self.calls["sbatch"] += 1
        try:
            out = run([self.cmd("sbatch"), "--parsable", *argv], env=env)
        finally:
            self.forget()
        job_id = parse_submitted(out)
        if job_id is None:
            raise SlurmError(f"sbatch answered {out.strip()[:200]!r}, not a job id")
        return job_id

    def cancel(self, name: str, job_id: Optional[int] = None, signal: Optional[str] = None) -> Optional[str]:
        """``scancel --name NAME [JOBID]`` (both must match: a reused id is left alone);
        with ``signal``, that signal to the batch script's process only (``--batch``),
        which ends the job when that process ends. :return: None, or why it failed."""
        self.calls["scancel"] += 1
        sig = ["--batch", f"--signal={signal}"] if signal else []
        try:
            run(
                [
                    self.cmd("scancel"),
                    f"--user={os.getuid()}",
                    f"--name={name}",
                    *sig,
                    *([str(job_id)] if job_id else []),
                ]
            )
            return None
        except SlurmError as e:
            return str(e)
        finally:
            self.forget()

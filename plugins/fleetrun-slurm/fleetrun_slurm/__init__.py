"""fleetrun-slurm: attempts run as Slurm jobs, on the scheduler the cluster already has.

Inert unless configured: a ``[slurm]`` table in the home's ``config.toml`` (with
``shared_dir``, a folder every node mounts at the same path) offers the cluster as a
host named ``slurm`` (or ``[slurm] name``), or each node as ``slurm-<node>`` with
``per_node = true``. Placement weighs it with the other hosts by the room Slurm
reports; an attempt placed there is submitted with ``sbatch`` and followed with one
``squeue`` per loop pass (:mod:`fleetrun_slurm.host`).

Only Slurm's own commands are used (``sbatch``, ``squeue``, ``scancel``,
``scontrol``); no Python dependency besides fleetrun.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

import fleetrun
from fleetrun import ConfigKey, KeyDecl, hookimpl

from .host import Settings, SlurmHost
from .slurmcli import Slurm, SlurmError

__version__ = "0.1.0"

#: ``config.stash[SLURM]``: the run's Slurm commands (one queue answer per pass)
SLURM = fleetrun.StashKey[Slurm]()
TABLE = "slurm"

#: A declaration the loop reads (not a hook): :func:`fleetrun_place_filter` decides from
#: the task, the candidate and ``[slurm]`` alone (and where the task's files live, which
#: no pass changes), so the loop may keep a waiting task's decision until one of those
#: changes (:meth:`fleetrun.starting.Starting.pure_placement`); without it, every waiting
#: task was asked again on every pass wherever this plugin is installed, even unconfigured.
PURE_PLACEMENT = True


def _positive(v: Any) -> Optional[str]:
    return None if v > 0 else "must be greater than 0"


def _nonempty(v: Any) -> Optional[str]:
    return None if v.strip() else "must not be empty"


def _absolute(v: Any) -> Optional[str]:
    return None if Path(v).is_absolute() else "must be an absolute path (the same on every node)"


def _options(v: Any) -> Optional[str]:
    bad = [o for o in v if not o.startswith("--")]
    return f"{bad[0]!r} is not a long sbatch option (--name=value)" if bad else None


def _name(v: Any) -> Optional[str]:
    import re

    return None if re.fullmatch(r"[A-Za-z0-9_.-]{1,60}", v) else "letters, digits, '_', '.', '-' only"


@hookimpl
def fleetrun_config_keys(config: Any) -> list[ConfigKey]:
    t = TABLE
    return [
        ConfigKey(t, "", machine=True, doc="run attempts as Slurm jobs (fleetrun-slurm)"),
        ConfigKey(
            t,
            "shared_dir",
            (str,),
            check=_absolute,
            required=True,
            machine=True,
            doc="a folder every node mounts at the same path: attempt folders live there",
        ),
        ConfigKey(t, "partition", (str,), check=_nonempty, machine=True, doc="sbatch --partition"),
        ConfigKey(t, "account", (str,), check=_nonempty, machine=True, doc="sbatch --account"),
        ConfigKey(t, "qos", (str,), check=_nonempty, machine=True, doc="sbatch --qos"),
        ConfigKey(t, "time", (str,), check=_nonempty, machine=True, doc="sbatch --time (a task's slurm_time wins)"),
        ConfigKey(
            t,
            "mem_mb",
            (int,),
            check=_positive,
            machine=True,
            doc="sbatch --mem, in MB (default 1024; a task's slurm_mem_mb wins)",
        ),
        ConfigKey(
            t,
            "cpus",
            (int,),
            check=_positive,
            machine=True,
            doc="sbatch --cpus-per-task (default 1; a task's slurm_cpus wins)",
        ),
        ConfigKey(
            t,
            "sbatch_options",
            (list,),
            items=str,
            check=_options,
            machine=True,
            doc="more sbatch options, as --name=value",
        ),
        ConfigKey(t, "max_jobs", (int,), check=_positive, machine=True, doc="jobs in flight at most (default 8)"),
        ConfigKey(
            t,
            "per_node",
            (bool,),
            machine=True,
            doc="each node its own host, slurm-<node>, pinned with --nodelist (default false)",
        ),
        ConfigKey(t, "name", (str,), check=_name, machine=True, doc="the cluster's host name (default slurm)"),
        ConfigKey(
            t,
            "bin_dir",
            (str,),
            check=_absolute,
            machine=True,
            doc="where sbatch, squeue, scancel and scontrol are (default: PATH)",
        ),
    ]


@hookimpl
def fleetrun_task_keys(config: Any) -> list[KeyDecl]:
    return [
        KeyDecl("slurm_mem_mb", (int,), check=_positive, doc="sbatch --mem for this task, in MB (fleetrun-slurm)"),
        KeyDecl("slurm_cpus", (int,), check=_positive, doc="sbatch --cpus-per-task for this task (fleetrun-slurm)"),
        KeyDecl("slurm_time", (str,), check=_nonempty, doc="sbatch --time for this task (fleetrun-slurm)"),
    ]


def settings(config: Any) -> Optional[Settings]:
    """``[slurm]``, or None when it is not there (the plugin is inert)."""
    table = config.setting(TABLE, None, None)
    if not isinstance(table, dict) or not isinstance(table.get("shared_dir"), str):
        return None
    known = {k: v for k, v in table.items() if k in Settings.__dataclass_fields__ and k != "shared_dir"}
    return Settings(shared_dir=Path(table["shared_dir"]), **known)


def slurm_of(config: Any, s: Settings) -> Slurm:
    found = config.stash.get(SLURM, None)
    if found is None:
        found = config.stash[SLURM] = Slurm(s.bin_dir)
    return found


@hookimpl
def fleetrun_hosts(config: Any) -> list[Any]:
    s = settings(config)
    if s is None:
        return []
    slurm = slurm_of(config, s)
    if not s.per_node:
        return [SlurmHost(s.name, s, slurm)]
    nodes = slurm.nodes()
    if isinstance(nodes, SlurmError):
        # no node list: the hosts the ledger names are still provided when asked again
        return []
    return [SlurmHost(f"{s.name}-{n.name}", s, slurm, node=n.name) for n in nodes]


@hookimpl
def fleetrun_start_attempt(task: Any, attempt: Any, host: Any, spawn: Any, prompt: str, config: Any) -> None:
    # the shepherd plugin (trylast) starts it through host.start, which has no task: hand
    # the task's own sbatch settings (memory, CPUs, time, requires) over first
    if isinstance(host, SlurmHost):
        host.tasks[attempt.id] = task


#: the name :class:`VerifyJobs` is registered under
VERIFY_JOBS = "slurm-verify"


class VerifyJobs:
    """Runs the ``run`` verifiers (and setup commands) of an attempt on the cluster as
    jobs. Registered by :func:`fleetrun_configure` only when ``[slurm]`` is there: the
    plugin installed and not configured implements no ``fleetrun_verify``, so the relay
    still starts a peer's first ``run`` verifier with its collect (it does so only when
    no third-party plugin could answer for it)."""

    @hookimpl
    def fleetrun_verify(self, task: Any, verifier: Any, workspace: Any, attempt: Any, host: Any, config: Any) -> Any:
        """A ``run`` step of an attempt on the cluster runs there, as a job
        (:mod:`fleetrun_slurm.verifyjob`). ``brain`` and ``agent`` verifiers are left to
        their plugins, on this machine (the worktree is on the shared filesystem, mounted
        here too), and so is a ``run`` verifier with ``junit``: its per-test verdict
        against the base is ``verify_run``'s, here."""
        if not isinstance(host, SlurmHost) or verifier.kind != "run":
            return None
        extra = verifier.extra if isinstance(verifier.extra, dict) else {}
        if isinstance(extra.get("junit"), str) and "setup" not in extra:
            return None
        from .verifyjob import verify_job

        return verify_job(host, task, verifier, workspace, attempt, config)

    @hookimpl
    def fleetrun_setup_step(
        self, task: Any, step: Any, number: int, workspace: Any, attempt: Any, host: Any, config: Any
    ) -> Any:
        """A ``setup`` command of an attempt on the cluster runs there too, as a job
        (``...-setup-K``, K its ``number``), before the attempt's own job."""
        if not isinstance(host, SlurmHost):
            return None
        from .verifyjob import verify_job

        return verify_job(host, task, step, workspace, attempt, config)


@hookimpl
def fleetrun_configure(config: Any) -> None:
    if settings(config) is not None and config.pluginmanager.get_plugin(VERIFY_JOBS) is None:
        config.pluginmanager.register(VerifyJobs(), VERIFY_JOBS)


@hookimpl
def fleetrun_loop_pass(config: Any, duration_s: float) -> None:
    slurm = config.stash.get(SLURM, None)
    if slurm is not None:
        slurm.forget()  # one squeue per pass: the next pass asks again


def _device(path: Path) -> Optional[int]:
    try:
        return os.stat(path).st_dev
    except OSError:
        return None


def not_shared(config: Any, s: Settings, cwd: str) -> Optional[str]:
    """Why a task working in ``cwd`` cannot run on the cluster: its repository, or the
    fleetrun home (its worktrees), is not on the filesystem of ``shared_dir`` (the nodes
    would not see them); None when both are."""
    shared = _device(s.shared_dir)
    if shared is None:
        return f"[slurm] shared_dir {s.shared_dir} does not exist"
    path = Path(cwd) if os.path.isabs(cwd) else Path(getattr(config, "invocation_dir", ".")) / cwd
    for what, where in (("its repository", path), ("the fleetrun home", Path(config.home))):
        dev = _device(where)
        if dev is not None and dev != shared:
            return (
                f"{what} ({where}) is not on the filesystem of [slurm] shared_dir ({s.shared_dir}): "
                "the nodes would not see it"
            )
    return None


@hookimpl
def fleetrun_place_filter(task: Any, candidate: Any, config: Any) -> Optional[str]:
    """Keep a task off the cluster when the nodes could not see its files."""
    s = settings(config)
    if s is None or not (candidate.name == s.name or (s.per_node and candidate.name.startswith(s.name + "-"))):
        return None
    return not_shared(config, s, str(task.spec.cwd))


@hookimpl
def fleetrun_collection_modifyitems(config: Any, items: list[Any]) -> None:
    """Refuse at validate a task pinned to the cluster (``peer = "slurm..."``) that it
    could not run: a ``requires`` entry Slurm cannot express (a version or a login,
    ``git>=2.40``, ``claude:max``: Slurm has node features), or files the nodes would
    not see (:func:`not_shared`). An unpinned task is only kept off the cluster by
    placement (``fleetrun_place_filter``)."""
    s = settings(config)
    if s is None:
        return
    problems = []
    for t in items:
        peer = str(getattr(t, "peer", None) or "")
        if not (peer == s.name or (s.per_node and peer.startswith(s.name + "-"))):
            continue
        for r in getattr(t, "requires", None) or []:
            if any(c in r for c in "<>=:!"):
                problems.append(
                    f"task {t.name!r}: requires {r!r}: Slurm has node features, not versions "
                    "or logins; use a feature name"
                )
        why = not_shared(config, s, str(t.cwd))
        if why is not None:
            problems.append(f"task {t.name!r}: pinned to {peer}, but {why}")
    if problems:
        raise fleetrun.UsageError("; ".join(problems))

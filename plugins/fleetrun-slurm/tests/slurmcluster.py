"""A real Slurm cluster for the tests, started from nothing in a folder.

``munged`` with its own key and socket, ``slurmctld``, and three ``slurmd`` (``slurmd
-N n1`` ...), each daemon in a UTS namespace of its own (``unshare --uts`` with its own
hostname) on loopback ports (per node: ``NodeName``, ``NodeHostname``,
``NodeAddr=127.0.0.1``, ``Port``). Every file (config, state, spool, logs, the munge
key and socket) is under the folder; the clients find the cluster through
``SLURM_CONF``. Every daemon is started in the foreground by us, so its pid is ours to
stop at teardown, and nothing else is ever signalled.

The nodes (measured with Slurm 22.05.8 on Debian's ``slurm-wlm``):

===== ============= ========== ==========
node  RealMemory MB Features   GRES
===== ============= ========== ==========
n1    2000          docker
n2    4000          docker,big
n3    1000          gpu        gpu:1 (a stand-in device file)
===== ============= ========== ==========

Settings that work here: ``auth/munge`` with ``AuthInfo=socket=...``,
``ProctrackType=proctrack/linuxproc``, ``TaskPlugin=task/none``,
``SelectType=select/cons_tres`` with ``CR_Core_Memory``, ``GresTypes=gpu`` with
``AutoDetect=off``, ``SlurmdParameters=config_overrides`` (the nodes say more CPUs and
memory than this machine has: they share it).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Optional

import pytest

NODES = {
    "n1": {"mem": 2000, "features": "docker", "gres": None},
    "n2": {"mem": 4000, "features": "docker,big", "gres": None},
    "n3": {"mem": 1000, "features": "gpu", "gres": "gpu:1"},
}
CPUS = 4
TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo", "scontrol", "unshare")
#: what bounds a hang while a daemon comes up (not a timing: each wait ends on its condition)
DEADLINE_S = 120.0


def need_cluster() -> None:
    """Skip (fail under ``CI``, which installs them) without root or the Slurm tools."""
    missing = [t for t in TOOLS if shutil.which(t) is None and not os.path.exists(f"/usr/sbin/{t}")]
    why = None
    if missing:
        why = f"no {', '.join(missing)} here (apt-get install slurm-wlm munge; .ci/run does)"
    elif os.geteuid() != 0:
        why = "a test Slurm cluster needs root (unshare --uts for each node's hostname, slurmd as root)"
    if why is not None:
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)


def exe(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Cluster:
    """The daemons of one test cluster, under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.conf = root / "slurm.conf"
        self.munge_socket = root / "munge" / "munge.socket"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.ctld_port = free_port()
        self.node_ports = {n: free_port() for n in NODES}

    @property
    def env(self) -> dict[str, str]:
        """The environment a Slurm client needs to find this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def write_config(self) -> None:
        r = self.root
        for d in ("state", "spool", "log", "munge", "dev"):
            (r / d).mkdir(parents=True, exist_ok=True)
        os.chmod(r / "munge", 0o700)
        for n in NODES:
            (r / "spool" / n).mkdir(exist_ok=True)
        gpu = r / "dev" / "gpu0"
        gpu.touch()
        nodes = []
        for n, spec in NODES.items():
            line = (
                f"NodeName={n} NodeHostname={n} NodeAddr=127.0.0.1 Port={self.node_ports[n]} "
                f"CPUs={CPUS} RealMemory={spec['mem']} Features={spec['features']} State=UNKNOWN"
            )
            if spec["gres"]:
                line += f" Gres={spec['gres']}"
            nodes.append(line)
        self.conf.write_text(
            "\n".join(
                [
                    "ClusterName=fleettest",
                    "SlurmctldHost=ctl(127.0.0.1)",
                    f"SlurmctldPort={self.ctld_port}",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    "AuthType=auth/munge",
                    "CredType=cred/munge",
                    f"AuthInfo=socket={self.munge_socket}",
                    f"StateSaveLocation={r / 'state'}",
                    f"SlurmdSpoolDir={r / 'spool'}/%n",
                    f"SlurmctldPidFile={r / 'slurmctld.pid'}",
                    f"SlurmdPidFile={r / 'spool'}/slurmd-%n.pid",
                    f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
                    f"SlurmdLogFile={r / 'log'}/slurmd-%n.log",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "JobAcctGatherType=jobacct_gather/none",
                    "AccountingStorageType=accounting_storage/none",
                    "JobCompType=jobcomp/none",
                    "MpiDefault=none",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_Core_Memory",
                    "SchedulerType=sched/backfill",
                    "SlurmdParameters=config_overrides",
                    "ReturnToService=2",
                    "GresTypes=gpu",
                    "MinJobAge=300",
                    "KillWait=5",
                    "InactiveLimit=0",
                    *nodes,
                    "PartitionName=debug Nodes=n1,n2,n3 Default=YES MaxTime=INFINITE State=UP",
                    "",
                ]
            )
        )
        (r / "gres.conf").write_text(f"AutoDetect=off\nNodeName=n3 Name=gpu File={gpu}\n")
        key = r / "munge" / "munge.key"
        if not key.exists():
            fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
            with os.fdopen(fd, "wb") as f:
                f.write(os.urandom(1024))

    def _spawn(self, name: str, hostname: Optional[str], argv: list[str]) -> subprocess.Popen[bytes]:
        if hostname is not None:
            # `unshare --uts` without --fork execs: the pid we hold is the daemon's
            argv = [exe("unshare"), "--uts", "--", "/bin/sh", "-c", f'hostname {hostname} && exec "$@"', "sh", *argv]
        env = dict(os.environ, SLURM_CONF=str(self.conf))
        with open(self.root / "log" / f"{name}.out", "ab") as out:
            p = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        self.procs[name] = p
        return p

    def start_munge(self) -> None:
        r = self.root / "munge"
        self._spawn(
            "munged",
            None,
            [
                exe("munged"),
                "-F",
                "--force",
                f"--socket={self.munge_socket}",
                f"--key-file={r / 'munge.key'}",
                f"--pid-file={r / 'munged.pid'}",
                f"--log-file={r / 'munged.log'}",
                f"--seed-file={r / 'munged.seed'}",
            ],
        )
        self._wait(lambda: self.munge_socket.exists(), "munged's socket")

    def start_ctld(self) -> None:
        self._spawn("slurmctld", "ctl", [exe("slurmctld"), "-D", "-f", str(self.conf)])
        self._wait(
            lambda: (
                self.client(["scontrol", "ping"]).returncode == 0 and "UP" in self.client(["scontrol", "ping"]).stdout
            ),
            "slurmctld to answer",
        )

    def start_node(self, node: str) -> None:
        self._spawn(f"slurmd-{node}", node, [exe("slurmd"), "-D", "-N", node, "-f", str(self.conf)])

    def start(self) -> None:
        self.write_config()
        self.start_munge()
        self.start_ctld()
        for n in NODES:
            self.start_node(n)
        self._wait(self.all_idle, "every node idle")

    def all_idle(self) -> bool:
        r = self.client(["sinfo", "-h", "-N", "-o", "%N %t"])
        states = dict(line.split() for line in r.stdout.splitlines() if len(line.split()) == 2)
        return r.returncode == 0 and all(states.get(n) == "idle" for n in NODES)

    def client(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ, **self.env), timeout=60)

    def _wait(self, cond: object, what: str) -> None:
        deadline = time.monotonic() + DEADLINE_S
        while not cond():  # type: ignore[operator]
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise RuntimeError(
                        f"{name} exited ({p.returncode}) waiting for {what}: "
                        f"{(self.root / 'log' / (name + '.out')).read_text()[-2000:]}"
                    )
            if time.monotonic() > deadline:
                raise RuntimeError(f"no {what} in {DEADLINE_S:.0f} s; logs in {self.root / 'log'}")
            time.sleep(0.05)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Signal one daemon we started, by its pid, and reap it."""
        p = self.procs.pop(name, None)
        if p is None or p.poll() is not None:
            return
        try:
            os.kill(p.pid, sig)
        except ProcessLookupError:
            pass
        try:
            p.wait(timeout=DEADLINE_S)
        except subprocess.TimeoutExpired:
            os.kill(p.pid, signal.SIGKILL)
            p.wait()

    def stop(self) -> None:
        """Stop every daemon this cluster started: nodes first, the controller, munged.
        Jobs are cancelled first: their processes are slurmstepd's, not the daemons'."""
        if "slurmctld" in self.procs:
            try:
                self.cancel_all()
            except (RuntimeError, OSError, subprocess.SubprocessError):
                pass
        for name in [n for n in self.procs if n.startswith("slurmd-")] + ["slurmctld", "munged"]:
            self.kill(name, signal.SIGTERM)

    def cancel_all(self) -> None:
        """Cancel every job (a test's leftovers) and wait until the queue is empty."""
        self.client(["scancel", f"--user={os.getuid()}"])
        self._wait(lambda: self.client(["squeue", "-h"]).stdout.strip() == "", "an empty queue")

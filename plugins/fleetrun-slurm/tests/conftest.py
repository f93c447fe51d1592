"""The plugin from this checkout, and a real Slurm cluster for its tests.

The plugin's folder goes on ``sys.path`` just after the repository's root (as
fleetrun-github's tests do: ahead of the root, this ``tests/`` would shadow fleetrun's
own). ``fleeter`` and ``fake_claude`` come from :mod:`fleetrun.fleeter`.

``cluster`` is one test cluster for the session (:mod:`slurmcluster`: munged,
slurmctld, three slurmd), stopped by pid at the end; ``slurm_fleeter`` is a fleeter
whose home has a ``[slurm]`` table on it and no room on this machine (``[local]
max_tasks = 0``), so every task goes to the cluster; ``slurm_host`` is the cluster as a
:class:`~fleetrun_slurm.host.SlurmHost`, for tests of the host itself.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

HERE = str(Path(__file__).resolve().parents[1])
ROOT = str(Path(__file__).resolve().parents[3])
if HERE not in sys.path:
    sys.path.insert(sys.path.index(ROOT) + 1 if ROOT in sys.path else 0, HERE)
TESTS = str(Path(__file__).resolve().parent)
if TESTS not in sys.path:
    sys.path.append(TESTS)

from fleetrun_slurm.host import Settings, SlurmHost  # noqa: E402
from fleetrun_slurm.slurmcli import Slurm  # noqa: E402
from slurmcluster import Cluster, need_cluster  # noqa: E402


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    need_cluster()
    c = Cluster(tmp_path_factory.mktemp("slurm"))
    try:
        c.start()
        yield c
    finally:
        c.stop()


@pytest.fixture
def slurm_fleeter(fleeter: Any, fake_claude: Any, cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A fleeter on the cluster: ``[slurm] shared_dir`` is the test's folder (every
    "node" is this machine, so it is shared), ``-p fleetrun_slurm`` loads this checkout's
    plugin (``PYTHONPATH`` for a subprocess run). The fake ``claude`` is the agent."""
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([HERE, *filter(None, [os.environ.get("PYTHONPATH")])]))
    shared = fleeter.root / "shared"
    shared.mkdir()
    # after fake_claude's [claude] table, which write_config would replace
    with open(fleeter.home / "config.toml", "a", encoding="utf-8") as f:
        f.write(f'\n[slurm]\nshared_dir = "{shared}"\nmem_mb = 100\n')
    fleeter.write_policy("""
        [local]
        max_tasks = 0
    """)
    fleeter.shared = shared
    fleeter.cluster = cluster
    yield fleeter
    cluster.cancel_all()


@pytest.fixture
def slurm_host(cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SlurmHost]:
    """The cluster as a host, its shared folder this test's tmp folder (every node is
    this machine); the jobs find the cluster through ``SLURM_CONF`` (``--export=ALL``)."""
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    shared = tmp_path / "shared"
    shared.mkdir()
    yield SlurmHost("slurm", Settings(shared_dir=shared, mem_mb=100), Slurm())
    cluster.cancel_all()

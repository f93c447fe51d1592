"""The host status contract (docs/plugins.md), checked by
:mod:`fleetrun.testing.hostconformance` against :class:`~fleetrun_slurm.host.SlurmHost`
on the real test cluster (``conftest.cluster``): each attempt a batch job whose
shepherd runs in the foreground, its status one ``squeue`` per :meth:`poll` plus the
status files on the shared folder."""

from __future__ import annotations

from pathlib import Path

import pytest
from fleetrun_slurm.host import SlurmHost

from fleetrun.testing.hostconformance import HostConformance, Subject, ended, poll_until, start


class TestSlurmHost(HostConformance):
    @pytest.fixture
    def conformance_host(self, slurm_host: SlurmHost, tmp_path: Path) -> Subject:
        return Subject(slurm_host, cwd=str(tmp_path))


def test_poll_asks_the_queue_once_for_every_attempt(slurm_host: SlurmHost, tmp_path: Path) -> None:
    """Three attempts, one :meth:`~SlurmHost.poll`: one ``squeue`` answers for all of
    them (the status files say the rest)."""
    subject = Subject(slurm_host, cwd=str(tmp_path))
    refs = [start(subject, f"exit {code}") for code in (0, 1, 2)]
    poll_until(subject, refs, ended, "three jobs to end")
    slurm_host.slurm.forget()  # a new pass
    before = slurm_host.slurm.calls["squeue"]
    got = slurm_host.poll(refs)
    assert slurm_host.slurm.calls["squeue"] == before + 1
    assert [got[r.attempt_id]["exit_code"] for r in refs] == [0, 1, 2], got
    assert all(got[r.attempt_id]["job_id"] == r.pid for r in refs), got

"""What Slurm prints is parsed strictly: a line of the wrong shape is skipped, a job id
that is not digits is none, a status file an agent garbled is malformed, never an
exception (no cluster needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fleetrun_slurm.host import read_job, read_status
from fleetrun_slurm.slurmcli import Slurm, parse_nodes, parse_squeue, parse_submitted
from fleetrun_slurm.verifyjob import read_rc, read_started


def test_squeue_lines_of_another_shape_or_another_name_are_skipped() -> None:
    text = "\n".join(
        [
            "12|RUNNING|n1|None|fleetrun-task_a_0_a1",
            "13|PENDING||Resources|fleetrun-task_b_0_a1",
            "14|RUNNING|n2|None|someone's job|with a bar",  # not fleetrun's
            "x5|RUNNING|n2|None|fleetrun-task_c_0_a1",  # no job id
            "16|RUNNING|n2|fleetrun-task_d_0_a1",  # a field short
            "17|RUNNING|n2|None|fleetrun-../../etc",  # not a name fleetrun gives
            "18|RUNNING|n3|None|fleetrun-task_a_0_a1",  # the same name again: the newer id
            "garbage",
            "",
        ]
    )
    jobs = parse_squeue(text)
    assert sorted(jobs) == ["fleetrun-task_a_0_a1", "fleetrun-task_b_0_a1"]
    assert jobs["fleetrun-task_a_0_a1"].job_id == 18
    assert jobs["fleetrun-task_b_0_a1"].state == "PENDING" and jobs["fleetrun-task_b_0_a1"].reason == "Resources"


def test_scontrol_nodes_take_only_what_has_the_right_shape() -> None:
    text = (
        "NodeName=n1 Arch=x86_64 CPUAlloc=1 CPUTot=4 AvailableFeatures=docker ActiveFeatures=docker "
        "Gres=(null) RealMemory=2000 AllocMem=500 State=MIXED Partitions=debug OS=Linux 6.1 #1\n"
        "NodeName=n3 CPUAlloc=x CPUTot=4 ActiveFeatures=gpu Gres=gpu:a100:2(S:0) RealMemory=1e9 State=DOWN*\n"
        "NodeName=../x RealMemory=1\n"
        "no node here\n"
    )
    n1, n3 = parse_nodes(text)
    assert (n1.name, n1.free_mem_mb, n1.idle_cpus, n1.features, n1.gpus, n1.usable) == (
        "n1",
        1500,
        3,
        frozenset({"docker"}),
        0,
        True,
    )
    assert (n3.cpus_alloc, n3.real_mem_mb, n3.free_mem_mb, n3.gpus, n3.usable) == (None, None, None, 2, False)


@pytest.mark.parametrize(
    "text,job",
    [("42\n", 42), ("42;cluster\n", 42), ("", None), ("Submitted batch job 4", None), ("-1", None), ("4" * 20, None)],
)
def test_sbatch_answers_a_job_id_or_none(text: str, job: int | None) -> None:
    assert parse_submitted(text) == job


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"not json",
        b"[]",
        b'{"state": "flying"}',
        b'{"state": "ended"}',
        b'{"state": "ended", "reason": "mine"}',
        b"\xff\xfe",
        b"[" * 100000,
    ],
)
def test_a_garbled_status_file_is_malformed_not_an_exception(tmp_path: Path, raw: bytes) -> None:
    (tmp_path / "status.json").write_bytes(raw)
    st, bad = read_status(tmp_path)
    assert st == {} and bad


def test_a_status_keeps_only_fields_of_their_type(tmp_path: Path) -> None:
    (tmp_path / "status.json").write_text(
        json.dumps(
            {
                "state": "ended",
                "reason": "exited",
                "exit_code": "0",
                "agent_pid": True,
                "ended": 12.5,
                "error": "a\x1b[31m",
                "extra": 1,
            }
        )
    )
    st, bad = read_status(tmp_path)
    assert bad is None and st == {"state": "ended", "reason": "exited", "exit_code": None, "ended": 12.5}


def test_a_job_record_of_the_wrong_shape_is_no_job(tmp_path: Path) -> None:
    (tmp_path / "slurm_job.json").write_text('{"job_id": "12", "name": "fleetrun-x"}')
    assert read_job(tmp_path) is None


def test_a_missing_command_is_an_unreachable_answer_not_an_exception(tmp_path: Path) -> None:
    s = Slurm(bin_dir=str(tmp_path))  # no squeue there
    err = s.queue()
    assert isinstance(err, Exception) and "cannot run" in str(err)
    assert s.queue() is err  # one answer per pass
    s.forget()
    assert s.queue() is not err


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"abc 12",
        b"0 12 13",
        b"256 12",
        b"-1 12",
        b"0 x",
        b"0 " + b"9" * 20,
        b"0 1.",
        b"0 1.2.3",
        b"0 nan",
        b"0 1e9",
        b"\xff\xfe 1",
        b"cannot",
    ],
)
def test_a_verifier_jobs_result_of_the_wrong_shape_is_no_result(tmp_path: Path, raw: bytes) -> None:
    """``rc`` and ``started`` are in a folder the verifier's command could write to: a
    result not of the job script's shape is none (the job, gone, could not judge)."""
    (tmp_path / "rc").write_bytes(raw)
    (tmp_path / "started").write_bytes(raw)
    assert read_rc(tmp_path) is None and read_started(tmp_path) is None


def test_a_verifier_jobs_result_is_read() -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "rc").write_text("127 1700000010.250000000\n")
        (Path(d) / "started").write_text("1700000000\n")
        assert read_rc(Path(d)) == (127, 1700000010.25) and read_started(Path(d)) == 1700000000.0
        (Path(d) / "rc").write_text("cannot 1700000010\n")
        assert read_rc(Path(d)) == ("cannot", 1700000010.0)

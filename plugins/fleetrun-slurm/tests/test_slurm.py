"""fleetrun-slurm on a real Slurm cluster (``conftest.cluster``: munged, slurmctld and
three slurmd on loopback), through the real CLI (``python -m fleetrun`` as a
subprocess, the plugin loaded with ``-p fleetrun_slurm``), the fake ``claude`` as the
agent, real git, real shepherds running as the jobs' main processes."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

PLUGIN = ("-p", "fleetrun_slurm")
FAIL_UNLESS_FINAL = (
    "test \"$(cat FIX.txt)\" = final || { echo 'FIX.txt must contain exactly the word final'; exit 1; }"
)


def node_of(fleeter: Any, attempt_id: str) -> str:
    """The node the attempt's job ran on, as its job script said (``slurm.out``)."""
    out = (fleeter.shared / "attempts" / attempt_id / "slurm.out").read_text()
    m = re.search(r"fleetrun-slurm: job \d+ on (\S+)", out)
    assert m, out
    return m.group(1)


def attempts(fleeter: Any, name: str) -> list[Any]:
    return fleeter.ledger().attempts(fleeter.task(name).id)


def test_a_queue_is_spread_over_the_nodes_by_features_and_memory(slurm_fleeter: Any, fake_claude: Any) -> None:
    """Slurm places each job: ``requires = ["gpu"]`` on the GPU node (a GRES), a task
    asking 3000 MB on the only node that has it, a ``big`` feature by ``--constraint``;
    a retry gets its failure in the prompt and runs as a job too."""
    f = slurm_fleeter
    f.make_repo()
    f.write_tasks(f'''
        [[task]]
        name = "train"
        cwd = "repo"
        prompt = "Train it."
        git_ref = "main"
        requires = ["gpu"]

        [[task]]
        name = "bigmem"
        cwd = "repo"
        prompt = "Use memory."
        git_ref = "main"
        slurm_mem_mb = 3000

        [[task]]
        name = "fix-it"
        cwd = "repo"
        prompt = "Write FIX.txt."
        git_ref = "main"
        requires = ["big"]
          [[task.verify]]
          run = {json.dumps(FAIL_UNLESS_FINAL)}
    ''')
    fake_claude.script(**{
        "train": [{"actions": [["write", "model.txt", "w"], ["commit", "train"]]}],
        "bigmem": [{"actions": [["write", "mem.txt", "m"], ["commit", "mem"]]}],
        "fix-it": [{"actions": [["write", "FIX.txt", "draft"], ["commit", "draft"]]},
                   {"actions": [["write", "FIX.txt", "final"], ["commit", "final"]]}],
    })
    r = f.runsub("tasks.toml", *PLUGIN)
    assert r.ret == 0, r.stdout + r.stderr
    assert f.states() == {"train": "DONE", "bigmem": "DONE", "fix-it": "DONE"}, r.stdout
    r.fnmatch_lines(["*train RUNNING (attempt 1) on slurm*", "*fix-it RETRYING*verify_fail:*"])
    (train,) = attempts(f, "train")
    (bigmem,) = attempts(f, "bigmem")
    first, second = attempts(f, "fix-it")
    assert {a.host for a in (train, bigmem, first, second)} == {"slurm"}
    assert node_of(f, train.id) == "n3"
    assert node_of(f, bigmem.id) == "n2"
    assert node_of(f, first.id) == node_of(f, second.id) == "n2"
    one, two = fake_claude.calls("fix-it")
    assert "FIX.txt must contain exactly the word final" in two["prompt"]
    assert one["cwd"] == two["cwd"]
    # the agent ran inside its job (the shepherd is the job's main process)
    assert all(Path(f.shared / "attempts" / a.id / "status.json").exists() for a in (train, bigmem, first, second))

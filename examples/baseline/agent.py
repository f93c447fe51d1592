"""A tiny scripted agent for the baseline example (no model, no network); each run is
logged to agent-runs.log next to this file."""

import os
import subprocess
from pathlib import Path

task = os.environ.get("FLEETRUN_TASK_NAME", "")
with open(Path(__file__).with_name("agent-runs.log"), "a", encoding="utf-8") as log:
    log.write(task + "\n")


def commit(message):
    subprocess.run(["git", "add", "-A"], check=True)
    subprocess.run(
        ["git", "-c", "user.name=demo-agent", "-c", "user.email=demo@example.invalid", "commit", "-q", "-m", message],
        check=True,
    )


if task == "mul":
    with open("calc.py", "a") as f:
        f.write("\n\ndef mul(a, b):\n    return a * b\n")
    with open("tests/test_mul.py", "w") as f:
        f.write("from calc import mul\n\n\ndef test_mul():\n    assert mul(2, 3) == 6\n")
    commit("calc.mul, with a test")
    print("Added calc.mul and tests/test_mul.py.")
else:
    with open("README.md", "a") as f:
        f.write("calc.add(a, b) adds two numbers.\n")
    commit("README: calc.add")
    print(f"did {task!r}")

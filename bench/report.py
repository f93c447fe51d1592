"""How long the HTML report takes: ``fleetrun report --html`` on a ledger of
``--tasks`` tasks (default 1,000), against baselines measured in the same run.

The ledger is built through the ledger's API as a night on four hosts leaves it
(this machine, two peers, a role's mailbox): a third of the tasks retried once, one in
twenty NEEDS_HUMAN, one in fifty CANCELLED, chains of dependencies, a verifier per
attempt with a few kB of output. Each command runs ``--runs`` times (default 5) as
``python -m fleetrun ...``; the medians and the ratios are printed against
``fleetrun status --json`` on the same home and against one task's whole run (a
command agent that prints one line and a ``true`` verifier: the cheapest task there
is). The issue's goal: rendering 1,000 tasks takes well under the time of one task::

    python bench/report.py
    python bench/report.py --tasks 5000 --runs 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def build_home(home: Path, n: int) -> None:
    from fleetrun.ledger import Ledger
    from fleetrun.reports import Verdict
    from fleetrun.states import State
    from fleetrun.taskspec import TaskSpec

    hosts = ("local", "mini", "studio", "mailbox")
    specs = [
        TaskSpec(name=f"task-{i}", prompt=f"do part {i}", cwd="/repo", depends_on=[f"task-{i - 1}"] if i % 10 else [])
        for i in range(n)
    ]
    output = "\n".join(f"line {k} of the verifier's output" for k in range(120))
    with Ledger(home / "state.db") as led:
        tasks = led.add_tasks(specs, source="/repo/tasks.toml")
        for i, t in enumerate(tasks):
            host = hosts[i % len(hosts)]
            state = State.PENDING if t.deps else State.READY
            if t.deps:
                led.transition(t.id, State.PENDING, State.READY, "dependencies_done")
                state = State.READY
            if i % 50 == 49:
                led.transition(t.id, state, State.CANCELLED, "operator_cancel")
                continue
            tries = 2 if i % 3 == 0 else 1
            for k in range(tries):
                att = led.lease(t.id, state, host, "fresh" if k == 0 else "retry")
                led.update_attempt(att.id, started=att.created + 0.2, ended=att.created + 1.0, cost_usd=0.1)
                led.transition(t.id, State.ASSIGNED, State.RUNNING, "started", k + 1, host)
                led.transition(t.id, State.RUNNING, State.VERIFYING, "exited", k + 1, host)
                last = k == tries - 1
                passed = last and i % 20 != 7
                led.add_verdict(
                    t.id,
                    att.id,
                    0,
                    Verdict(
                        passed=passed,
                        kind="run",
                        label="pytest -q",
                        reason="exit code 0" if passed else "exit code 1",
                        output=output,
                        duration_s=0.3,
                        host=host,
                    ),
                )
                if passed:
                    led.transition(t.id, State.VERIFYING, State.DONE, "verify_pass", k + 1, host)
                elif last:
                    led.transition(t.id, State.VERIFYING, State.NEEDS_HUMAN, "retries_exhausted:pytest -q", k + 1, host)
                else:
                    led.transition(t.id, State.VERIFYING, State.RETRYING, "verify_fail:pytest -q", k + 1, host)
                    state = State.RETRYING


def timed(args: list[str], home: Path, cwd: Path, runs: int) -> float:
    env = dict(os.environ, FLEETRUN_HOME=str(home), FLEETRUN_DISABLE_PLUGIN_AUTOLOAD="1")
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "fleetrun", *args],
            env=env,
            cwd=str(cwd),
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
        )
        times.append(time.perf_counter() - start)
        if proc.returncode not in (0, 1):
            raise SystemExit(f"fleetrun {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}")
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=5)
    opts = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        home = root / "home"
        t = time.perf_counter()
        build_home(home, opts.tasks)
        print(f"ledger of {opts.tasks} tasks built in {time.perf_counter() - t:.1f}s")
        from fleetrun.ledger import Ledger
        from fleetrun.plugins.htmlreport import model, render

        inproc = []
        with Ledger(home / "state.db") as led:
            for _ in range(opts.runs):
                start = time.perf_counter()
                render.render(model.build(led, led.tasks(), "bench"))
                inproc.append(time.perf_counter() - start)
        drawn = statistics.median(inproc)
        report = timed(["report", "--html", str(root / "report.html")], home, root, opts.runs)
        size = (root / "report.html").stat().st_size
        status = timed(["status", "--json"], home, root, opts.runs)
        one = root / "one"
        one.mkdir()
        (one / "tasks.toml").write_text(
            '[agents.echo]\ncommand = ["{python}", "-c", "print(1)"]\n'
            '[[task]]\nname = "one"\nprompt = "p"\ncwd = "."\nagent = "echo"\n'
            '  [[task.verify]]\n  run = "true"\n'
        )
        task_times = []
        for k in range(opts.runs):
            task_times.append(timed(["tasks.toml", "--new-queue", "-q"], root / f"onehome{k}", one, 1))
        task = statistics.median(task_times)
    print(
        f"report --html, {opts.tasks} tasks: {report * 1000:7.0f} ms  ({size / 1024:.0f} KiB; of it, reading "
        f"the ledger and drawing the page in process: {drawn * 1000:.0f} ms)"
    )
    print(f"status --json, same home:      {status * 1000:7.0f} ms  report/status = {report / status:.2f}x")
    print(
        f"one task's run (echo agent):   {task * 1000:7.0f} ms  report/one task = {report / task:.2f}x, "
        f"drawing/one task = {drawn / task:.2f}x"
    )
    print("(a task an agent works on takes minutes: the echo agent's run is the cheapest task there is)")


if __name__ == "__main__":
    main()

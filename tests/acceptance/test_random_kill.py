"""SIGKILL the supervisor at random moments of a 20-task queue, 20 times in a row,
restarting ``fleetrun work --until-idle`` each time; then let it finish. The same
invariants as the crash-point tests must hold: nothing lost, nothing run twice,
no two attempts of a task at once, nothing left behind, valid transition logs.

Three seeds by default; ``FLEETRUN_TEST_SEED=N`` runs (or replays) one, and the
figures are printed (``-s``)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import time
from pathlib import Path

import pytest

from fleetrun.loop import Loop

from .test_crash_points import FAIL_UNLESS_FINAL, _no_strays, check_invariants, run_until_done  # noqa: F401
from .test_local_loop import fake_claude_path

KILLS = 20
TASKS = 20


def write_queue(fleeter, fake_claude, rng: random.Random, release: Path) -> tuple[dict[str, str], dict[str, int]]:
    """20 tasks with worktrees: every 4th depends on the one before it (merged into its
    worktree), every 5th fails
    its verifier once, two die on their first attempt; the agents sleep 0.05-0.5 s. The
    last one waits for ``release``, so the queue cannot end before the last kill."""
    fleeter.make_repo()
    fleeter.write_config(f'[claude]\nexecutable = "{fake_claude_path()}"\nallowed_tools = ["Bash"]\n')
    blocks, steps, calls = [], {}, {}
    for i in range(TASKS):
        name = f"t{i:02d}"
        # a dependent merges its dependency's branch (base = "dependencies"): a kill
        # between its worktree and that merge must not give a DONE without it
        deps = f'depends_on = ["t{i - 1:02d}"]\n            base = "dependencies"' if i % 4 == 3 else ""
        fails_once = i % 5 == 1
        dies_once = i in (2, 13)
        verify = FAIL_UNLESS_FINAL if fails_once else f"test -f {name}.txt"
        blocks.append(f'''
            [[task]]
            name = "{name}"
            cwd = "repo"
            prompt = "Do {name}."
            git_ref = "main"
            max_retries = 3
            {deps}
              [[task.verify]]
              run = {json.dumps(verify)}
        ''')

        def nap() -> list:
            return ["sleep", round(rng.uniform(0.05, 0.5), 3)]

        if i == TASKS - 1:
            steps[name] = [
                {"actions": [["bash", f"while [ ! -f {release} ]; do sleep 0.05; done"], ["write", f"{name}.txt", "x"]]}
            ]
            calls[name] = 1
        elif fails_once:
            steps[name] = [
                {"actions": [nap(), ["write", "FIX.txt", "draft"], ["commit", "draft"]]},
                {"actions": [nap(), ["write", "FIX.txt", "final"]]},
            ]
            calls[name] = 2
        elif dies_once:
            steps[name] = [
                {"mode": "die", "actions": [nap()]},
                {"actions": [nap(), ["write", f"{name}.txt", "x"], ["commit", name]]},
            ]
            calls[name] = 2
        else:
            steps[name] = [{"actions": [nap(), ["write", f"{name}.txt", "x"]]}]
            calls[name] = 1
    fleeter.write_tasks("\n".join(blocks))
    fleeter.write_policy("[local]\nmax_tasks = 2\n")
    fake_claude.script(**steps)
    return {f"t{i:02d}": "DONE" for i in range(TASKS)}, calls


#: The crash-point bugs (see test_crash_points.XFAIL) make some random runs fail, not
#: all: a strict xfail would be flaky. It becomes a plain test once adopt() knows how
#: to finish a recorded failure (the fix adds Loop.verdict_failed).
FIXED = hasattr(Loop, "verdict_failed")


@pytest.mark.slow
@pytest.mark.xfail(
    not FIXED,
    strict=False,
    reason=(
        "BUG: kills between an attempt's end and its transition, a failed verdict and its "
        "transition, or DONE and its cleanup, break the invariants (test_crash_points.XFAIL)"
    ),
)
@pytest.mark.parametrize(
    "seed", [int(os.environ["FLEETRUN_TEST_SEED"])] if os.environ.get("FLEETRUN_TEST_SEED") else [1, 2, 3]
)
def test_random_sigkill_of_the_supervisor(fleeter, fake_claude, tmp_path, seed):
    rng = random.Random(seed)
    release = tmp_path / "release"
    expected, calls = write_queue(fleeter, fake_claude, rng, release)
    assert fleeter.runsub("queue", "tasks.toml").ret == 0
    started = time.monotonic()
    kills = 0
    finished_early = 0
    progress: list[int] = []  # tasks DONE when each run started
    while kills < KILLS:
        # random moments, paced so that the kills spread over the whole queue: when the
        # queue runs ahead of them, the next kill comes sooner (often before the loop is up)
        done = sum(1 for s in fleeter.states().values() if s == "DONE") / TASKS
        ahead = done >= (kills + 1) / (KILLS + 2)
        delay = rng.uniform(0.02, 0.15) if ahead else rng.uniform(0.15, 0.9)
        progress.append(round(done * TASKS))
        proc = fleeter.popen("work", "--until-idle")
        try:
            proc.wait(timeout=delay)
        except subprocess.TimeoutExpired:  # still running: the moment has come
            proc.kill()  # SIGKILL, to the supervisor only (shepherds run in their own sessions)
            kills += 1
        else:
            finished_early += 1
        proc.communicate(timeout=10)
        if fleeter.states() == expected:
            break
        assert time.monotonic() - started < 300, "the kills never ended (a deadline that bounds a hang)"
    done_at_last_kill = sum(1 for s in fleeter.states().values() if s == "DONE")
    release.touch()
    run_until_done(fleeter, expected)
    bad = check_invariants(fleeter, fake_claude, expected, calls, root=tmp_path)
    led = fleeter.ledger()
    attempts = len(led.attempts())
    abandoned = len(led.attempts(states={"abandoned"}))
    adopted = sum(1 for r in led.transitions() if r.cause == "adopted")
    print(
        f"\nrandom kill (seed {seed}): {kills} SIGKILLs, {finished_early} runs ended before their kill, "
        f"{TASKS} tasks ({done_at_last_kill} DONE at the last kill), {attempts} attempts ({abandoned} abandoned before starting, "
        f"{adopted} adopted in ASSIGNED), violations found: {len(bad)}, DONE before each run: {progress}, "
        f"{time.monotonic() - started:.1f}s"
    )
    assert kills == KILLS, f"the queue finished after {kills} kills; make it longer"
    assert not bad, f"after {kills} SIGKILLs (seed {seed}):\n" + "\n".join(bad)

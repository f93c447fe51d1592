"""End to end: a verifier's baseline on the task's base commit, and the per-test verdict
of a JUnit report (issue 26), with the real CLI, real git, a real pytest suite in a real
repository and the fake claude acting on it."""

from __future__ import annotations

import json
import sys

import pytest

CALC = "def add(a, b):\n    return a + b\n"
TESTS = """
from calc import add


def test_add():
    assert add(2, 3) == 5


def test_add_zero():
    assert add(0, 7) == 7


def test_old():
    assert add(1, 1) == 3, "already broken on main"
"""
FIXED_OLD = TESTS.replace('assert add(1, 1) == 3, "already broken on main"', "assert add(1, 1) == 2")
BROKEN_CALC = "def add(a, b):\n    return a + b + (1 if a == 0 else 0)\n"
FEATURE = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n"
FEATURE_TEST = "from calc import mul\n\n\ndef test_mul():\n    assert mul(2, 3) == 6\n"
# the runs are counted by the folder they ran in (a base's worktree is under the home's baselines/)
PYTEST = f'echo "$PWD" >> {{runs}} && {sys.executable} -m pytest -q -p no:cacheprovider --junitxml=report.xml tests'


def suite_repo(fleeter) -> None:
    fleeter.make_repo(files={"calc.py": CALC, "tests/test_calc.py": TESTS, ".gitignore": "report.xml\n__pycache__/\n"})


def runs_log(fleeter) -> list[str]:
    p = fleeter.path / "runs.log"
    return p.read_text().splitlines() if p.exists() else []


def base_runs(fleeter) -> int:
    return sum(1 for line in runs_log(fleeter) if f"{fleeter.home}/baselines/" in line)


def task_toml(
    name: str, extra: str = "", verify_extra: str = "", verify: str = "", retries: int = 1, cwd: str = "repo"
) -> str:
    return f'''
        [[task]]
        name = "{name}"
        cwd = "{cwd}"
        prompt = "Work on calc."
        git_ref = "main"
        max_retries = {retries}
        {extra}

          [[task.verify]]
          run = {json.dumps(verify or PYTEST)}
          junit = "report.xml"
          {verify_extra}
    '''


def write(fleeter, *tasks: str) -> None:
    fleeter.write_tasks("\n".join(tasks).replace("{runs}", str(fleeter.path / "runs.log")))


def verdicts(fleeter, name: str) -> list:
    return fleeter.ledger().verdicts(fleeter.task(name).id)


def test_a_feature_that_breaks_nothing_is_done_despite_the_old_failure(fleeter, fake_claude):
    suite_repo(fleeter)
    write(fleeter, task_toml("feature"))
    fake_claude.script(
        feature=[
            {
                "actions": [
                    ["write", "calc.py", FEATURE],
                    ["write", "tests/test_mul.py", FEATURE_TEST],
                    ["commit", "mul"],
                ]
            }
        ]
    )
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    r.fnmatch_lines(["*feature baseline `*`: started (the verifier on the base commit)"])
    (v,) = verdicts(fleeter, "feature")
    assert v.passed
    assert v.reason.startswith("0 new failures (1 already failing on the base); tests: 3 on the base, 4 now"), v.reason
    assert base_runs(fleeter) == 1
    notes = fleeter.run("logs", "feature").stdout
    assert "baseline: 3 tests, 1 failing on the base at" in notes
    st = fleeter.run("status", "--json")
    (row,) = json.loads(st.stdout)
    assert row["tests"] == {
        "verifier": "report",
        "new": 0,
        "removed": 0,
        "already_failing": 1,
        "must_pass_missing": 0,
        "flaky": 0,
        "tests_base": 3,
        "tests_now": 4,
    } | {"verifier": row["tests"]["verifier"]}
    assert row["tests"]["verifier"].startswith("echo")


def test_a_change_that_breaks_a_passing_test_is_retried_with_that_test_named(fleeter, fake_claude):
    suite_repo(fleeter)
    write(fleeter, task_toml("breaks"))
    fake_claude.script(
        breaks=[
            {"actions": [["write", "calc.py", BROKEN_CALC], ["commit", "oops"]]},
            {"actions": [["append", "calc.py", "\n"], ["commit", "still"]]},
        ]
    )
    r = fleeter.run("tasks.toml")
    assert r.ret == 1, r.stdout + r.stderr
    assert fleeter.task("breaks").state.value == "NEEDS_HUMAN"
    first, second = fake_claude.calls("breaks")
    # the retry prompt names the new failure, and not the one the base already had
    assert "new failure: tests.test_calc::test_add_zero" in second["prompt"]
    assert "test_old" not in second["prompt"].split("new failure:", 1)[1].split("\n\n", 1)[0]
    v = verdicts(fleeter, "breaks")[0]
    assert not v.passed
    assert v.reason.startswith("1 new failure (1 already failing on the base)"), v.reason


def test_must_pass_the_old_failure_fixed_is_done_and_not_fixed_is_a_failure(fleeter, fake_claude):
    suite_repo(fleeter)
    must = 'must_pass = ["tests/test_calc.py::test_old"]'
    write(fleeter, task_toml("fixes", verify_extra=must), task_toml("lazy", verify_extra=must, retries=0))
    fake_claude.script(
        fixes=[{"actions": [["write", "tests/test_calc.py", FIXED_OLD], ["commit", "fix"]]}],
        lazy=[{"actions": [["write", "NOTES.md", "looked"], ["commit", "nothing"]]}],
    )
    r = fleeter.run("tasks.toml")
    assert r.ret == 1, r.stdout + r.stderr
    assert fleeter.task("fixes").state.value == "DONE"
    assert fleeter.task("lazy").state.value == "NEEDS_HUMAN"
    (v,) = verdicts(fleeter, "lazy")
    assert "1 of must_pass not passing" in v.reason
    assert "must_pass, not passing: tests/test_calc.py::test_old" in v.output


def test_a_verifier_failing_on_the_base_without_a_report_needs_a_human_before_any_agent_run(fleeter, fake_claude):
    suite_repo(fleeter)
    plain = f'echo "$PWD" >> {{runs}} && {sys.executable} -m pytest -q -p no:cacheprovider tests'
    write(
        fleeter,
        f"""
        [[task]]
        name = "blocked"
        cwd = "repo"
        prompt = "Work on calc."
        git_ref = "main"

          [[task.verify]]
          run = {json.dumps(plain)}
          baseline = true
    """,
    )
    fake_claude.script(blocked=[{"actions": [["write", "calc.py", FEATURE], ["commit", "mul"]]}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 1, r.stdout + r.stderr
    assert fake_claude.calls("blocked") == []
    task = fleeter.task("blocked")
    assert task.state.value == "NEEDS_HUMAN"
    last = fleeter.ledger().transitions(task.id)[-1]
    assert last.cause.startswith("baseline_fails:"), last.cause
    assert "1 failed, 2 passed" in last.cause
    assert base_runs(fleeter) == 1


def test_warn_starts_anyway_and_the_prompt_quotes_the_failure(fleeter, fake_claude):
    suite_repo(fleeter)
    plain = f"{sys.executable} -m pytest -q -p no:cacheprovider tests"
    write(
        fleeter,
        f"""
        [[task]]
        name = "warned"
        cwd = "repo"
        prompt = "Work on calc."
        git_ref = "main"
        max_retries = 0

          [[task.verify]]
          run = {json.dumps(plain)}
          baseline = "warn"
    """,
    )
    fake_claude.script(warned=[{"actions": [["write", "tests/test_calc.py", FIXED_OLD], ["commit", "fix"]]}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    (call,) = fake_claude.calls("warned")
    assert "already fail on the base commit" in call["prompt"]
    assert "1 failed, 2 passed" in call["prompt"]


def test_one_baseline_run_is_shared_by_every_task_on_the_same_base(fleeter, fake_claude):
    suite_repo(fleeter)
    names = [f"t{i}" for i in range(4)]
    write(fleeter, *(task_toml(n) for n in names))
    fake_claude.script(**{n: [{"actions": [["write", f"NOTE{n}.md", n], ["commit", n]]}] for n in names})
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    assert base_runs(fleeter) == 1
    assert len(runs_log(fleeter)) == 1 + len(names)
    # and the base's worktree is gone
    assert not (fleeter.home / "baselines").exists() or not any((fleeter.home / "baselines").iterdir())
    assert "baselines" not in fleeter.git(fleeter.path / "repo", "worktree", "list")
    # a later run on the same base takes the result from the ledger
    fleeter.write_tasks(task_toml("later").replace("{runs}", str(fleeter.path / "runs.log")), name="later.toml")
    fake_claude.script(later=[{"actions": [["write", "LATER.md", "x"], ["commit", "later"]]}])
    r = fleeter.run("later.toml")
    assert r.ret == 0, r.stdout + r.stderr
    assert base_runs(fleeter) == 1
    r.fnmatch_lines(["*later baseline `*`: baseline: 3 tests, 1 failing on the base at *"])


def test_an_agent_that_deletes_a_failing_test_fails_naming_it_removed(fleeter, fake_claude):
    suite_repo(fleeter)
    without_old = TESTS.split("def test_old")[0]
    write(fleeter, task_toml("hides", retries=0))
    fake_claude.script(hides=[{"actions": [["write", "tests/test_calc.py", without_old], ["commit", "green"]]}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 1, r.stdout + r.stderr
    (v,) = verdicts(fleeter, "hides")
    assert not v.passed
    assert "1 removed" in v.reason and "tests: 3 on the base, 2 now" in v.reason, v.reason
    assert "removed (on the base, missing now): tests.test_calc::test_old" in v.output


def test_a_task_that_declares_it_removes_tests_is_not_failed_for_it(fleeter, fake_claude):
    suite_repo(fleeter)
    without_old = TESTS.split("def test_old")[0]
    write(fleeter, task_toml("prunes", extra="removes_tests = true", retries=0))
    fake_claude.script(prunes=[{"actions": [["write", "tests/test_calc.py", without_old], ["commit", "prune"]]}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr


def test_a_malformed_report_is_judged_by_the_exit_code_and_says_why(fleeter, fake_claude):
    suite_repo(fleeter)
    # the agent's own code overwrites the report after pytest wrote it
    garbage = "def pytest_unconfigure(config):\n    open('report.xml', 'w').write('<testsuites><testcase name=')\n"
    write(fleeter, task_toml("garbled", retries=0))
    fake_claude.script(garbled=[{"actions": [["write", "conftest.py", garbage], ["commit", "conf"]]}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 1, r.stdout + r.stderr
    (v,) = verdicts(fleeter, "garbled")
    assert not v.passed
    assert v.reason.startswith("exit code 1; junit: the report is not well-formed XML"), v.reason
    assert "judged by the exit code" in v.reason


def test_a_flaky_test_that_passes_when_run_again_is_done_and_reported_flaky(fleeter, fake_claude):
    # passes on the base (run 1), fails in the task's verifier (run 2), passes re-run by name (run 3)
    count = fleeter.path / "flaky.count"
    flaky = (
        f"from pathlib import Path\n\n\ndef test_flaky():\n    p = Path({str(count)!r})\n"
        "    n = int(p.read_text()) + 1 if p.exists() else 1\n    p.write_text(str(n))\n"
        "    assert n != 2, 'flaked'\n"
    )
    fleeter.make_repo(
        files={
            "calc.py": CALC,
            "tests/test_calc.py": TESTS,
            "tests/test_flaky.py": flaky,
            ".gitignore": "report.xml\n__pycache__/\n",
        }
    )
    write(fleeter, task_toml("flakes", retries=0))
    fake_claude.script(flakes=[{"actions": [["write", "calc.py", FEATURE], ["commit", "mul"]]}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    assert count.read_text() == "3"
    (v,) = verdicts(fleeter, "flakes")
    assert v.passed
    assert "0 new failures (1 already failing on the base); 1 flaky" in v.reason, v.reason


def test_flaky_rerun_false_keeps_the_failure(fleeter, fake_claude):
    count = fleeter.path / "flaky.count"
    flaky = (
        f"from pathlib import Path\n\n\ndef test_flaky():\n    p = Path({str(count)!r})\n"
        "    n = int(p.read_text()) + 1 if p.exists() else 1\n    p.write_text(str(n))\n"
        "    assert n != 2, 'flaked'\n"
    )
    fleeter.make_repo(files={"calc.py": CALC, "tests/test_flaky.py": flaky, ".gitignore": "report.xml\n__pycache__/\n"})
    write(fleeter, task_toml("strict", retries=0, verify_extra="flaky_rerun = false"))
    fake_claude.script(strict=[{"actions": [["write", "calc.py", FEATURE], ["commit", "mul"]]}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 1, r.stdout + r.stderr
    assert count.read_text() == "2"
    (v,) = verdicts(fleeter, "strict")
    assert "new failure: tests.test_flaky::test_flaky: AssertionError: flaked" in v.output, v.output


def test_a_crash_mid_baseline_ends_its_run_and_runs_it_again_once(fleeter, fake_claude):
    from fleetrun.crash import CRASH_EXIT

    from .test_adoption import wait_for
    from .test_setup import alive

    suite_repo(fleeter)
    pidfile, marker = fleeter.path / "sleeper.pid", fleeter.path / "slept"
    slow = f"echo $$ > {pidfile}; test -f {marker} || {{ touch {marker}; exec sleep 60; }}; " + PYTEST
    write(fleeter, task_toml("t1", verify=slow))
    fake_claude.script(t1=[{"actions": [["write", "calc.py", FEATURE], ["commit", "mul"]]}])
    r = fleeter.runsub("tasks.toml", env={"FLEETRUN_CRASH_AT": "mid_baseline"}, timeout=60)
    assert r.ret == CRASH_EXIT, r.stdout + r.stderr
    sleeper = int(wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), what="the base run"))
    r2 = fleeter.runsub("work", "--until-idle", timeout=120)
    assert r2.ret == 0, r2.stdout + r2.stderr
    assert fleeter.task("t1").state.value == "DONE"
    assert not alive(sleeper)
    assert len(fake_claude.calls("t1")) == 1
    assert base_runs(fleeter) == 1  # the killed run slept before its echo
    assert "baselines" not in fleeter.git(fleeter.path / "repo", "worktree", "list")


@pytest.mark.slow
def test_a_peer_tasks_baseline_runs_here_and_a_failing_base_costs_no_agent_run_there(fleeter, fake_claude, peer_lab):
    east = peer_lab.machine("east")
    east.write("config.toml", (fleeter.home / "config.toml").read_text())
    east.fake_headroom(9000)
    r = fleeter.run("relay", "add", "east", east.address, "--accept-new", "--command", east.command_line())
    assert r.ret == 0, r.stdout + r.stderr
    assert fleeter.run("drain").ret == 0  # this machine takes nothing: the task goes to east
    suite_repo(fleeter)
    # a report on the base, but a peer's report is not judged per test: the failing base stops it
    write(fleeter, task_toml("remote"))
    fake_claude.script(remote=[{"actions": [["write", "calc.py", FEATURE], ["commit", "mul"]]}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 1, r.stdout + r.stderr
    task = fleeter.task("remote")
    assert task.host == "east"
    assert task.state.value == "NEEDS_HUMAN"
    assert task.reason.startswith("baseline_fails:"), task.reason
    assert fake_claude.calls("remote") == []
    assert base_runs(fleeter) == 1


pytest_plugins = ["sshd"]


def test_the_retry_prompt_names_the_new_failures_however_long_the_output(fleeter, fake_claude):
    noisy = "from calc import add\n\n\ndef test_noisy():\n    print('noise ' * 40000)\n    assert add(0, 7) == 7\n"
    fleeter.make_repo(
        files={
            "calc.py": CALC,
            "tests/test_calc.py": TESTS,
            "tests/test_noisy.py": noisy,
            ".gitignore": "report.xml\n__pycache__/\n",
        }
    )
    write(fleeter, task_toml("loud", verify_extra="flaky_rerun = false"))
    fake_claude.script(
        loud=[
            {"actions": [["write", "calc.py", BROKEN_CALC], ["commit", "oops"]]},
            {"actions": [["write", "calc.py", CALC], ["commit", "undo"]]},
        ]
    )
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    first, second = fake_claude.calls("loud")
    assert "new failure: tests.test_noisy::test_noisy" in second["prompt"]
    assert "new failure: tests.test_calc::test_add_zero" in second["prompt"]
    assert "whole output is in" in second["prompt"]  # the output itself was cut, as before


def test_retry_after_baseline_fails_runs_the_base_again_not_its_kept_failure(fleeter, fake_claude):
    suite_repo(fleeter)
    ok = fleeter.path / "env-ok"
    write(
        fleeter,
        f"""
        [[task]]
        name = "env"
        cwd = "repo"
        prompt = "Work on calc."
        git_ref = "main"

          [[task.verify]]
          run = "test -f {ok} || {{ echo 'the machine lacks env-ok'; exit 1; }}"
          baseline = true
    """,
    )
    fake_claude.script(env=[{"actions": [["write", "NOTE.md", "x"], ["commit", "note"]]}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 1, r.stdout + r.stderr
    reason = fleeter.task("env").reason
    assert reason.startswith("baseline_fails:test -f ") and reason.endswith(": the machine lacks env-ok"), reason
    assert fake_claude.calls("env") == []
    ok.write_text("fixed")  # the person fixes the machine
    assert fleeter.run("retry", "env").ret == 0
    r2 = fleeter.run("work", "--until-idle")
    assert fleeter.task("env").state.value == "DONE", r2.stdout + r2.stderr
    assert len(fake_claude.calls("env")) == 1


def test_the_example_project_a_broken_main_costs_zero_agent_runs(fleeter, monkeypatch):
    """examples/baseline: main has a failing test; the task judged per test is DONE, the
    one whose plain verifier fails on main is NEEDS_HUMAN and its agent never runs."""
    import os
    import shutil
    from pathlib import Path

    src = Path(__file__).resolve().parents[2] / "examples" / "baseline"
    shutil.copytree(src, fleeter.path / "baseline", ignore=shutil.ignore_patterns("sandbox", "agent-runs.log"))
    monkeypatch.setenv("PATH", f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ['PATH']}")  # pytest's python3
    r = fleeter.run("baseline/tasks.toml")
    assert r.ret == 1, r.stdout + r.stderr
    assert fleeter.task("mul").state.value == "DONE"
    docs = fleeter.task("docs")
    assert docs.state.value == "NEEDS_HUMAN"
    assert docs.reason.startswith("baseline_fails:pytest-plain: 1 failed, 1 passed"), docs.reason
    assert (fleeter.path / "baseline" / "agent-runs.log").read_text().split() == ["mul"]


def test_a_task_in_a_subfolder_reads_the_bases_report_in_that_folder(fleeter, fake_claude):
    fleeter.make_repo(
        files={
            "README.md": "top\n",
            "pkg/calc.py": CALC,
            "pkg/tests/test_calc.py": TESTS,
            ".gitignore": "report.xml\n__pycache__/\n",
        }
    )
    write(fleeter, task_toml("sub", cwd="repo/pkg", retries=0))
    fake_claude.script(sub=[{"actions": [["write", "calc.py", FEATURE], ["commit", "mul"]]}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    (v,) = verdicts(fleeter, "sub")
    assert v.reason.startswith("0 new failures (1 already failing on the base)"), v.reason

"""fleetrun-junitxml, tested the way a third party tests a plugin: real runs of small
queues in a tmp folder, in-process, with the plugin passed explicitly (fleeter turns
entry-point autoload off, so a copy of the plugin installed in the environment is not
loaded a second time under its entry-point name)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Optional

import fleetrun_junitxml
import pytest

import fleetrun
from fleetrun import AgentResult

# Five tasks, one per way a task can end up in the report. Command agents stand in
# for the model; ``gone`` cancels itself through the CLI, as an operator would from
# another shell while the run goes on.
QUEUE = r"""
[agents.echo]
command = ["{python}", "-c", "print('hi')"]

[agents.selfcancel]
command = ["{python}", "-c", "import subprocess, sys, time; subprocess.run([sys.executable, '-m', 'fleetrun', 'cancel', 'gone']); time.sleep(5)"]

[[task]]
name = "ok"
prompt = "do it"
cwd = "."
agent = "echo"
  [[task.verify]]
  run = "true"

[[task]]
name = "flaky"
prompt = "do it"
cwd = "."
agent = "echo"
  [[task.verify]]
  run = "test -f m || { touch m; exit 1; }"

[[task]]
name = "bad"
prompt = "do it"
cwd = "."
agent = "echo"
max_retries = 1
  [[task.verify]]
  run = '''printf 'expected <b> & got \033[31mred\033[0m\n'; exit 3'''

[[task]]
name = "gone"
prompt = "do it"
cwd = "."
agent = "selfcancel"

[[task]]
name = "stuck"
prompt = "do it"
cwd = "."
agent = "echo"
requires = ["no-such-tool-on-any-machine"]
"""


class Costly:
    """Stands in for an agent that reports its cost: $0.25 per attempt."""

    @fleetrun.hookimpl(tryfirst=True)
    def fleetrun_agent_result(self, task: Any, attempt: Any, log_path: str, exit_code: Optional[int],
                              config: Any) -> AgentResult:
        return AgentResult(ok=exit_code == 0, exit_code=exit_code, cost_usd=0.25,
                           reason="" if exit_code == 0 else f"exit:{exit_code}")


def cases(root: ET.Element) -> dict[str, ET.Element]:
    return {tc.get("name", ""): tc for tc in root.iter("testcase")}


def props(el: ET.Element) -> dict[str, str]:
    return {p.get("name", ""): p.get("value", "") for p in el.findall("properties/property")}


def test_one_testcase_per_task(fleeter: Any) -> None:
    fleeter.write_tasks(QUEUE)
    report = fleeter.path / "report.xml"
    result = fleeter.run("tasks.toml", "--junitxml", str(report), plugins=[fleetrun_junitxml, Costly()])
    assert result.ret == 1, result.stdout + result.stderr
    result.assert_outcomes(done=2, needs_human=1, cancelled=1, ready=1)

    root = ET.parse(report).getroot()
    assert root.tag == "testsuites"
    suite = root.find("testsuite")
    assert suite is not None
    assert {k: suite.get(k) for k in ("tests", "failures", "errors", "skipped")} == {
        "tests": "5", "failures": "1", "errors": "1", "skipped": "1"}
    assert props(suite)["exitstatus"] == "1"
    tcs = cases(root)
    assert set(tcs) == {"ok", "flaky", "bad", "gone", "stuck"}
    assert all(tc.get("classname") == "tasks" for tc in tcs.values())

    ok = tcs["ok"]
    assert [child.tag for child in ok] == ["properties", "system-out"]  # passed: no failure
    assert props(ok) == {"task_id": fleeter.task("ok").id, "state": "DONE", "attempts": "1", "retries": "0",
                         "cost_usd": "0.250000"}

    flaky = tcs["flaky"]
    assert flaky.find("failure") is None
    assert props(flaky)["attempts"] == "2" and props(flaky)["cost_usd"] == "0.500000"
    assert (flaky.findtext("system-out") or "").splitlines() == [
        "attempt 1: verify run `test -f m || { touch m; exit 1; }`: FAIL (exit code 1)",
        "attempt 2: verify run `test -f m || { touch m; exit 1; }`: PASS (exit code 0)",
    ]

    bad = tcs["bad"]
    failure = bad.find("failure")
    assert failure is not None
    assert failure.get("type") == "retries_exhausted"
    assert failure.get("message") == fleeter.task("bad").reason
    assert failure.get("message", "").startswith("retries_exhausted:printf")
    text = failure.text or ""
    assert text.startswith("attempt 2: verify run `printf")
    # the verifier's own output, escaped: colour codes cannot go into XML as they are
    assert "expected <b> & got \\x1b[31mred\\x1b[0m" in text
    assert props(bad)["attempts"] == "2" and props(bad)["retries"] == "1"

    gone = tcs["gone"]
    skipped = gone.find("skipped")
    assert skipped is not None and skipped.get("message") == "operator_cancel"
    assert gone.find("failure") is None

    stuck = tcs["stuck"]
    error = stuck.find("error")
    assert error is not None
    assert error.get("type") == "unfinished"
    assert error.get("message") == "not finished: READY: this machine lacks `no-such-tool-on-any-machine`"
    assert props(stuck)["attempts"] == "0"


def test_a_dependent_of_a_failed_task_fails_with_the_cause(fleeter: Any) -> None:
    fleeter.write_tasks("""
        [agents.echo]
        command = ["{python}", "-c", "print('hi')"]

        [[task]]
        name = "base"
        prompt = "p"
        cwd = "."
        agent = "echo"
        max_retries = 0
          [[task.verify]]
          run = "false"

        [[task]]
        name = "top"
        prompt = "p"
        cwd = "."
        agent = "echo"
        depends_on = ["base"]
    """)
    result = fleeter.run("tasks.toml", "--junitxml", "out/nested/r.xml", plugins=[fleetrun_junitxml])
    assert result.ret == 1
    result.assert_outcomes(needs_human=2)
    report = fleeter.path / "out" / "nested" / "r.xml"  # relative to where fleetrun ran; folders made
    tcs = cases(ET.parse(report).getroot())
    failure = tcs["top"].find("failure")
    assert failure is not None
    assert failure.get("message") == "dependency_needs_human:base"
    assert failure.text == "dependency_needs_human:base"  # no verifier ran: the cause is all there is
    assert tcs["top"].find("system-out") is None
    assert props(tcs["top"])["attempts"] == "0"


def test_no_option_no_report(fleeter: Any) -> None:
    fleeter.write_tasks("""
        [agents.echo]
        command = ["{python}", "-c", "print('hi')"]

        [[task]]
        name = "ok"
        prompt = "p"
        cwd = "."
        agent = "echo"
    """)
    result = fleeter.run("tasks.toml", plugins=[fleetrun_junitxml])
    assert result.ret == 0, result.stdout + result.stderr
    result.assert_outcomes(done=1)
    header = next(line for line in result.outlines if line.startswith("fleetrun "))
    assert "fleetrun_junitxml" in header
    assert fleetrun_junitxml.REPORTER not in header
    assert not list(fleeter.path.rglob("*.xml"))


def test_option_is_listed_and_needs_the_plugin(fleeter: Any, capsys: pytest.CaptureFixture[str]) -> None:
    fleeter.write_tasks("""
        [[task]]
        name = "ok"
        prompt = "p"
    """)
    assert fleeter.run("--help", plugins=[fleetrun_junitxml]).ret == 0
    help_text = capsys.readouterr().out
    assert "--junitxml PATH" in help_text
    assert "write a JUnit XML report of the run to PATH" in help_text

    without = fleeter.run("tasks.toml", "--junitxml", "r.xml")
    assert without.ret == 4
    assert "unrecognized arguments: --junitxml" in capsys.readouterr().err


def test_reporter_is_unregistered_after_the_run(fleeter: Any) -> None:
    fleeter.write_tasks("""
        [agents.echo]
        command = ["{python}", "-c", "print('hi')"]

        [[task]]
        name = "ok"
        prompt = "p"
        cwd = "."
        agent = "echo"
    """)
    seen: dict[str, Any] = {}

    class Spy:
        @fleetrun.hookimpl
        def fleetrun_configure(self, config: Any) -> None:
            seen["pm"] = config.pluginmanager

    result = fleeter.run("tasks.toml", "--junitxml", "r.xml", plugins=[fleetrun_junitxml, Spy()])
    assert result.ret == 0
    result.assert_outcomes(done=1)
    assert Path(fleeter.path / "r.xml").exists()
    assert seen["pm"].get_plugin(fleetrun_junitxml.REPORTER) is None


@pytest.mark.parametrize(("text", "expected"), [
    ("plain <text> & more", "plain <text> & more"),
    ("\x1b[31mred\x1b[0m", "\\x1b[31mred\\x1b[0m"),
    ("tab\tand\nnewline\r", "tab\tand\nnewline\r"),
    ("nul\x00", "nul\\x00"),
])
def test_xml_text(text: str, expected: str) -> None:
    assert fleetrun_junitxml.xml_text(text) == expected

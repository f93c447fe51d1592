"""The built-in ``junitxml`` plugin: ``--junitxml PATH``, with nothing installed.

Real runs of small queues in a tmp folder; every report a test here produces is
validated against Jenkins' JUnit schema, ``tests/junit-10.xsd`` (the copy pytest's own
test suite validates its reports against), with xmlschema, before it is read.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Optional

import pytest
import xmlschema

import fleetrun
from fleetrun import AgentResult
from fleetrun.fleeter import ECHO_AGENT, echo_task
from fleetrun.plugins import junitxml

SCHEMA_FILE = Path(__file__).parent / "junit-10.xsd"


@pytest.fixture(scope="module")
def schema() -> xmlschema.XMLSchema:
    return xmlschema.XMLSchema(str(SCHEMA_FILE))


def parse_valid(path: Path, schema: xmlschema.XMLSchema) -> ET.Element:
    """The report's root, once the schema takes it (else the schema's reason)."""
    errors = [f"{e.path}: {e.reason}" for e in schema.iter_errors(str(path))]
    assert not errors, f"{path} is not valid against junit-10.xsd: {errors}"
    return ET.parse(path).getroot()


# Five tasks, one per way a task can end up in the report. Command agents stand in
# for the model; ``gone`` cancels itself through the CLI, as an operator would from
# another shell while the run goes on.
QUEUE = (
    ECHO_AGENT
    + r"""
[agents.selfcancel]
command = ["{python}", "-c", "import subprocess, sys, time; subprocess.run([sys.executable, '-m', 'fleetrun', 'cancel', 'gone']); time.sleep(5)"]
"""
    + "".join(
        [
            echo_task("ok", verify="true # a bell: \u0007", prompt="do it"),
            echo_task("flaky", verify="test -f m || { touch m; exit 1; }", prompt="do it"),
            echo_task(
                "bad", verify=r"printf 'expected <b> & got \033[31mred\033[0m\n'; exit 3", prompt="do it", max_retries=1
            ),
            echo_task("gone", prompt="do it", agent="selfcancel"),
            echo_task("stuck", prompt="do it", requires=["no-such-tool-on-any-machine"]),
        ]
    )
)


class Costly:
    """Stands in for an agent that reports its cost: $0.25 per attempt."""

    @fleetrun.hookimpl(tryfirst=True)
    def fleetrun_agent_result(
        self, task: Any, attempt: Any, log_path: str, exit_code: Optional[int], config: Any
    ) -> AgentResult:
        return AgentResult(
            ok=exit_code == 0, exit_code=exit_code, cost_usd=0.25, reason="" if exit_code == 0 else f"exit:{exit_code}"
        )


def cases(root: ET.Element) -> dict[str, ET.Element]:
    return {tc.get("name", ""): tc for tc in root.iter("testcase")}


def props(el: ET.Element) -> dict[str, str]:
    return {p.get("name", ""): p.get("value", "") for p in el.findall("properties/property")}


def facts(tc: ET.Element) -> dict[str, str]:
    """The task's facts, the ``name: value`` lines that lead its ``<system-out>``."""
    lines = (tc.findtext("system-out") or "").splitlines()
    return dict(line.split(": ", 1) for line in lines[:5])


def verdict_lines(tc: ET.Element) -> list[str]:
    return (tc.findtext("system-out") or "").splitlines()[5:]


def test_one_testcase_per_task(fleeter: Any, schema: xmlschema.XMLSchema) -> None:
    """Passed, failed (NEEDS_HUMAN), skipped (CANCELLED) and unfinished (an error), the
    suite's properties and a control character in a <system-out>, in one valid report."""
    fleeter.write_tasks(QUEUE)
    report = fleeter.path / "report.xml"
    result = fleeter.run("tasks.toml", "--junitxml", str(report), plugins=[Costly()])  # nothing else loaded
    assert result.ret == 1, result.stdout + result.stderr
    result.assert_outcomes(done=2, needs_human=1, cancelled=1, ready=1)

    root = parse_valid(report, schema)
    assert root.tag == "testsuites"
    assert {k: root.get(k) for k in ("tests", "failures", "errors")} == {"tests": "5", "failures": "1", "errors": "1"}
    suite = root.find("testsuite")
    assert suite is not None
    assert {k: suite.get(k) for k in ("tests", "failures", "errors", "skipped")} == {
        "tests": "5",
        "failures": "1",
        "errors": "1",
        "skipped": "1",
    }
    assert props(suite) == {"exitstatus": "1", "fleetrun_version": fleetrun.__version__}
    tcs = cases(root)
    assert set(tcs) == {"ok", "flaky", "bad", "gone", "stuck"}
    assert all(tc.get("classname") == "tasks" for tc in tcs.values())
    assert all(tc.find("properties") is None for tc in tcs.values())  # the schema has none there

    ok = tcs["ok"]
    assert [child.tag for child in ok] == ["system-out"]  # passed: no failure
    assert facts(ok) == {
        "task_id": fleeter.task("ok").id,
        "state": "DONE",
        "attempts": "1",
        "retries": "0",
        "cost_usd": "0.250000",
    }
    # a control character XML cannot hold, escaped (the raw byte would make the file unreadable)
    assert verdict_lines(ok) == ["attempt 1: verify run `true # a bell: \\x07`: PASS (exit code 0)"]

    flaky = tcs["flaky"]
    assert flaky.find("failure") is None
    assert facts(flaky)["attempts"] == "2" and facts(flaky)["cost_usd"] == "0.500000"
    assert verdict_lines(flaky) == [
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
    assert facts(bad)["state"] == "NEEDS_HUMAN"
    assert facts(bad)["attempts"] == "2" and facts(bad)["retries"] == "1"

    gone = tcs["gone"]
    skipped = gone.find("skipped")
    assert skipped is not None and skipped.get("message") == "operator_cancel"
    assert gone.find("failure") is None
    assert facts(gone)["state"] == "CANCELLED"

    stuck = tcs["stuck"]
    error = stuck.find("error")
    assert error is not None
    assert error.get("type") == "unfinished"
    assert error.get("message") == "not finished: READY: this machine lacks `no-such-tool-on-any-machine`"
    assert facts(stuck)["attempts"] == "0" and verdict_lines(stuck) == []


def test_a_dependent_of_a_failed_task_fails_with_the_cause(fleeter: Any, schema: xmlschema.XMLSchema) -> None:
    fleeter.write_tasks(
        ECHO_AGENT + echo_task("base", verify="false", max_retries=0) + echo_task("top", depends_on=["base"])
    )
    result = fleeter.run("tasks.toml", "--junitxml", "out/nested/r.xml")
    assert result.ret == 1
    result.assert_outcomes(needs_human=2)
    report = fleeter.path / "out" / "nested" / "r.xml"  # relative to where fleetrun ran; folders made
    tcs = cases(parse_valid(report, schema))
    failure = tcs["top"].find("failure")
    assert failure is not None
    assert failure.get("message") == "dependency_needs_human:base"
    assert failure.text == "dependency_needs_human:base"  # no verifier ran: the cause is all there is
    assert verdict_lines(tcs["top"]) == []
    assert facts(tcs["top"])["attempts"] == "0"


def test_no_option_no_report(fleeter: Any) -> None:
    fleeter.write_tasks(ECHO_AGENT + echo_task("ok"))
    result = fleeter.run("tasks.toml")
    assert result.ret == 0, result.stdout + result.stderr
    result.assert_outcomes(done=1)
    header = next(line for line in result.outlines if line.startswith("fleetrun "))
    assert "junitxml" in header.split("plugins: ", 1)[1].split(", ")
    assert junitxml.REPORTER not in header
    assert not list(fleeter.path.rglob("*.xml"))


def test_built_in_with_nothing_installed_and_blocked_by_p_no(
    fleeter: Any, capsys: pytest.CaptureFixture[str], schema: xmlschema.XMLSchema
) -> None:
    """``--junitxml`` through the real CLI, in a fresh interpreter with no plugin
    installed or named (fleeter turns entry-point autoload off); ``-p no:junitxml``
    takes the option away with the plugin, as pytest's ``-p no:junitxml`` does."""
    fleeter.write_tasks(ECHO_AGENT + echo_task("ok"))
    result = fleeter.runsub("tasks.toml", "--junitxml", "report.xml")
    assert result.ret == 0, result.stdout + result.stderr
    root = parse_valid(fleeter.path / "report.xml", schema)
    assert [tc.get("name") for tc in root.iter("testcase")] == ["ok"]

    assert fleeter.run("--help").ret == 0
    help_text = capsys.readouterr().out
    assert "--junitxml PATH" in help_text
    assert "write a JUnit XML report of the run to PATH" in help_text

    blocked = fleeter.run("-p", "no:junitxml", "tasks.toml", "--junitxml", "again.xml")
    assert blocked.ret == 4
    assert "unrecognized arguments: --junitxml" in capsys.readouterr().err
    assert not (fleeter.path / "again.xml").exists()


def test_reporter_is_unregistered_after_the_run(fleeter: Any, schema: xmlschema.XMLSchema) -> None:
    fleeter.write_tasks(ECHO_AGENT + echo_task("ok"))
    seen: dict[str, Any] = {}

    class Spy:
        @fleetrun.hookimpl
        def fleetrun_configure(self, config: Any) -> None:
            seen["pm"] = config.pluginmanager

    result = fleeter.run("tasks.toml", "--junitxml", "r.xml", plugins=[Spy()])
    assert result.ret == 0
    result.assert_outcomes(done=1)
    parse_valid(fleeter.path / "r.xml", schema)
    assert seen["pm"].get_plugin(junitxml.REPORTER) is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("plain <text> & more", "plain <text> & more"),
        ("\x1b[31mred\x1b[0m", "\\x1b[31mred\\x1b[0m"),
        ("tab\tand\nnewline\r", "tab\tand\nnewline\r"),
        ("nul\x00", "nul\\x00"),
    ],
)
def test_xml_text(text: str, expected: str) -> None:
    assert junitxml.xml_text(text) == expected


def test_a_long_failure_output_is_cut_at_a_line_boundary(fleeter: Any, schema: xmlschema.XMLSchema) -> None:
    """A failing verifier's output past OUTPUT_LIMIT keeps its last whole lines: the
    first line kept is never cut mid-word (issue 22)."""
    # 1,000 lines of 30 characters (a newline each): 30,000, well past the limit, and
    # its last 8,000 start mid-line
    verify = "python3 -c \"[print(f'line {i:04d} ends here, fine.') for i in range(1000)]\"; exit 1"
    fleeter.write_tasks(ECHO_AGENT + echo_task("long", verify=verify, max_retries=0))
    result = fleeter.run("tasks.toml", "--junitxml", "r.xml")
    assert result.ret == 1, result.stdout + result.stderr
    failure = cases(parse_valid(fleeter.path / "r.xml", schema))["long"].find("failure")
    assert failure is not None
    head, marker, *kept = (failure.text or "").splitlines()
    assert head.startswith("attempt 1: verify run `python3") and marker == "[... earlier output cut ...]"
    assert kept and all(line.startswith("line ") and line.endswith(" ends here, fine.") for line in kept), kept[:2]
    assert kept[-1] == "line 0999 ends here, fine." and len("\n".join(kept)) <= junitxml.OUTPUT_LIMIT


def test_a_testcase_time_is_the_tasks_run_not_its_wait_for_a_slot(fleeter: Any, schema: xmlschema.XMLSchema) -> None:
    """Two tasks, one slot: the second waits for the first's whole run, and its
    testcase's time is its own run, from its placement to its end, as the ledger's
    transitions have them (issue 22)."""
    fleeter.write_tasks(ECHO_AGENT + echo_task("first", verify="true") + echo_task("second", verify="true"))
    result = fleeter.run("tasks.toml", "--max-tasks", "1", "--junitxml", "r.xml")
    assert result.ret == 0, result.stdout + result.stderr
    tcs = cases(parse_valid(fleeter.path / "r.xml", schema))
    led = fleeter.ledger()
    for name in ("first", "second"):
        rows = led.transitions(fleeter.task(name).id)
        placed = next(r.time for r in rows if r.to_state == "ASSIGNED")
        assert tcs[name].get("time") == f"{rows[-1].time - placed:.3f}", (name, [r.__dict__ for r in rows])
    # the second did wait for the first's run: the test asks what it is meant to
    second = led.transitions(fleeter.task("second").id)
    first_ran = next(r.time for r in led.transitions(fleeter.task("first").id) if r.to_state == "RUNNING")
    assert next(r.time for r in second if r.to_state == "ASSIGNED") > first_ran

"""The JUnit report reader (untrusted input: strict) and the per-test judgement."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetrun.junitreport import (
    FAILED,
    MAX_REPORT_BYTES,
    PASSED,
    Report,
    ReportError,
    judge,
    key_of_node,
    node_id,
    parse,
    read,
)

GOOD = b"""<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="3">
<testcase classname="tests.test_x" name="test_a" />
<testcase classname="tests.test_x.TestB" name="test_b[1]"><failure message="assert 1 == 2">trace</failure></testcase>
<testcase classname="tests.test_x" name="test_s"><skipped /></testcase>
</testsuite></testsuites>"""


def test_a_pytest_report_is_read_per_test() -> None:
    r = parse(GOOD)
    assert r.outcomes == {
        "tests.test_x::test_a": PASSED,
        "tests.test_x.TestB::test_b[1]": FAILED,
        "tests.test_x::test_s": "skipped",
    }
    assert r.messages == {"tests.test_x.TestB::test_b[1]": "assert 1 == 2"}
    assert Report.from_json(r.to_json()) == r


@pytest.mark.parametrize(
    "data, why",
    [
        (
            b'<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "aaaa">]><testsuite><testcase name="&a;"/></testsuite>',
            "DOCTYPE or an ENTITY",
        ),
        (b'<testsuite><!ENTITY a SYSTEM "file:///etc/passwd"><testcase name="x"/></testsuite>', "DOCTYPE or an ENTITY"),
        (b"<testsuites><testcase name=", "not well-formed XML"),
        (b"<html><testcase name='x'/></html>", "not <testsuites> or <testsuite>"),
        (b"<testsuites><testsuite/></testsuites>", "names no tests"),
        (b"<testsuite><testcase classname='a'/></testsuite>", "has no name"),
        (b"", "not well-formed XML"),
    ],
)
def test_a_report_that_cannot_be_used_says_why(data: bytes, why: str) -> None:
    with pytest.raises(ReportError, match=why):
        parse(data)


def test_a_report_over_the_cap_is_not_read(tmp_path: Path) -> None:
    big = tmp_path / "r.xml"
    with open(big, "wb") as f:
        f.write(b"<testsuite>")
        f.seek(MAX_REPORT_BYTES + 10)
        f.write(b"</testsuite>")
    with pytest.raises(ReportError, match="larger than"):
        read(big)


def test_a_missing_report_or_a_symlink_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ReportError, match="no report at r.xml"):
        read(tmp_path / "r.xml")
    (tmp_path / "secret").write_bytes(GOOD)
    (tmp_path / "r.xml").symlink_to(tmp_path / "secret")
    with pytest.raises(ReportError, match="not a regular file"):
        read(tmp_path / "r.xml")


def test_node_ids_and_keys(tmp_path: Path) -> None:
    assert key_of_node("tests/test_x.py::TestB::test_b[1]") == "tests.test_x.TestB::test_b[1]"
    assert key_of_node("tests.test_x::test_a") == "tests.test_x::test_a"
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text("")
    assert node_id("tests.test_x.TestB::test_b[1]", tmp_path) == "tests/test_x.py::TestB::test_b[1]"
    assert node_id("tests.test_y::test_a", tmp_path) is None
    assert node_id("..::x", tmp_path) is None


def report(**outcomes: str) -> Report:
    return Report(
        {k.replace("__", "::"): v for k, v in outcomes.items()},
        {k.replace("__", "::"): "boom" for k, v in outcomes.items() if v == FAILED},
    )


def test_judge_new_old_removed_and_must_pass() -> None:
    base = report(m__a=PASSED, m__b=PASSED, m__old=FAILED, m__gone=PASSED, m__fix=FAILED)
    now = report(m__a=PASSED, m__b=FAILED, m__old=FAILED, m__fix=FAILED, m__new=PASSED)
    j = judge(base, now, ["m.py::fix"])
    assert j.new == {"m::b": "boom"}
    assert j.old == ["m::fix", "m::old"]
    assert j.removed == ["m::gone"]
    assert j.must_pass == ["m.py::fix"]
    assert not j.passed
    assert (
        j.summary() == "2 new failures (2 already failing on the base); 1 removed; 1 of must_pass not passing; "
        "tests: 5 on the base, 5 now"
    )
    assert "already failing" not in j.details_for_retry()
    assert judge(base, now, [], removes_tests=True).removed == []


def test_judge_passes_with_only_old_failures() -> None:
    base = report(m__a=PASSED, m__old=FAILED)
    j = judge(base, report(m__a=PASSED, m__old=FAILED, m__c=PASSED), [])
    assert j.passed
    assert j.summary() == "0 new failures (1 already failing on the base); tests: 2 on the base, 3 now"

"""The summary line of a verifier's output and the cause it goes into (issue 14)."""

from __future__ import annotations

import pytest

from fleetrun.states import is_valid_cause
from fleetrun.verdicttext import SUMMARY_LIMIT, failed_cause, summary_line


@pytest.mark.parametrize(
    "output, line",
    [
        # pytest, with its decoration, colour, and lines after the summary
        (
            "..F\nFAILED t.py::x - assert 1\n\x1b[31m==== 54 failed, 12 passed in 3.21s ====\x1b[0m\n",
            "54 failed, 12 passed in 3.21s",
        ),
        (
            "1 failed, 2 warnings in 65.03s (0:01:05)\nsome plugin says bye\n",
            "1 failed, 2 warnings in 65.03s (0:01:05)",
        ),
        ("no tests ran in 0.01s\n", "no tests ran in 0.01s"),
        # cargo: the summary, not the "to rerun" line after it
        (
            "test a ... FAILED\ntest result: FAILED. 3 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; "
            "finished in 0.00s\n\nerror: test failed, to rerun pass `--lib`\n",
            "test result: FAILED. 3 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.00s",
        ),
        # go
        ("--- FAIL: TestGet (0.00s)\nFAIL\nFAIL\texample.com/api\t0.012s\nFAIL\n", "FAIL example.com/api 0.012s"),
        ("FAIL\texample.com/api [build failed]\n", "FAIL example.com/api [build failed]"),
        # unittest
        ("Ran 3 tests in 0.001s\n\nFAILED (failures=2, errors=1)\n", "FAILED (failures=2, errors=1)"),
        # no known shape: the last non-empty line; nothing: nothing
        ("first\nno such file: x.txt\n\n   \n", "no such file: x.txt"),
        ("", ""),
        ("\n\n", ""),
    ],
)
def test_summary_line(output, line):
    assert summary_line(output) == line


def test_a_long_summary_line_is_cut():
    line = summary_line("y" * 1000)
    assert len(line) == SUMMARY_LIMIT and line.endswith("…")


def test_failed_cause_keeps_the_vocabulary():
    assert (
        failed_cause("retries_exhausted", "unit", "== 54 failed, 12 passed in 3.21s ==\n")
        == "retries_exhausted:unit: 54 failed, 12 passed in 3.21s"
    )
    assert failed_cause("verify_fail", "make test", "") == "verify_fail:make test"
    assert is_valid_cause(failed_cause("verify_fail", "a\nb", "x\ny\n"))
    assert "\n" not in failed_cause("verify_fail", "a\nb", "x\ny\n")

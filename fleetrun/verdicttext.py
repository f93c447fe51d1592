"""What a failed verifier says in one line: the summary line of its output, and the
cause of the transition it leads to.

``retries_exhausted:unit: 54 failed, 12 passed in 3.21s`` tells one failed task from
another at a glance in ``status``; ``retries_exhausted:PYTHONPATH=src python -m pytest
-q`` on every row does not. The summary line is the last line of the output that has
the shape of pytest's, cargo's or go's summary (or unittest's), else its last non-empty
line. Pure functions of text: the verify stage and the terminal's summary use them.
"""

from __future__ import annotations

import re

from .states import cause

#: How long the quoted summary line may be, in a cause and in the run's summary.
SUMMARY_LIMIT = 160

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
#: The summary lines of the test runners people use most, decoration (``===``) taken off:
_SHAPES = (
    # pytest: "54 failed, 12 passed in 3.21s", "1 passed, 2 warnings in 65.03s (0:01:05)"
    re.compile(r"^(?:\d+ [a-z]+(?:, \d+ [a-z]+)*|no tests ran) in \d+(?:\.\d+)?s\b.*$"),
    # cargo: "test result: FAILED. 3 passed; 1 failed; 0 ignored; ..."
    re.compile(r"^test result: \S+\. .*$"),
    # go: "FAIL\texample.com/api\t0.012s", "FAIL\texample.com/api [build failed]"
    re.compile(r"^(?:FAIL|ok)\s+\S+\s+(?:\d+(?:\.\d+)?s|\[.*\]|\(cached\)).*$"),
    # unittest: "FAILED (failures=2, errors=1)"
    re.compile(r"^FAILED \([a-z]+=\d+(?:, [a-z]+=\d+)*\)$"),
)


def _clean(line: str) -> str:
    line = _ANSI.sub("", line)
    return " ".join(line.split()).strip("= ")


def summary_line(output: str) -> str:
    """The line of ``output`` that sums it up, one line, at most :data:`SUMMARY_LIMIT`
    characters (``…`` at the end of a longer one).

    :param output: what a verifier printed (or a model answered).
    :return: the last line shaped like a test runner's summary, else the last non-empty
        line, else ``""``.
    """
    lines = [c for c in (_clean(raw) for raw in output.splitlines()) if c]
    found = next((c for c in reversed(lines) if any(s.match(c) for s in _SHAPES)), None)
    line = found if found is not None else (lines[-1] if lines else "")
    return line if len(line) <= SUMMARY_LIMIT else line[: SUMMARY_LIMIT - 1] + "…"


def failed_cause(word: str, label: str, output: str) -> str:
    """The cause of a task's move after a failed verifier.

    :param word: ``verify_fail`` (it is retried) or ``retries_exhausted``.
    :param label: the verifier's label (its ``name``, else its cut command).
    :param output: what the verifier printed.
    :return: ``word:label``, then ``: SUMMARY`` when the output has a line to quote.
    """
    detail = label.replace("\n", " ")
    line = summary_line(output)
    return cause(word, f"{detail}: {line}" if line else detail)


def setup_failed_cause(label: str, reason: str, output: str) -> str:
    """The cause of a task's move after a failed setup command: ``setup_failed:LABEL:
    SUMMARY (REASON)``, quoting the command's own summary line as a failed verifier's
    cause does (``no such option: --group``, not only ``exit code 2``), else
    ``setup_failed:LABEL: REASON``.

    :param label: the command's label.
    :param reason: the verdict's reason (``exit code 2``, ``timed out after 60s``).
    :param output: what the command printed.
    """
    line = summary_line(output)
    text = f"{label}: {line} ({reason})" if line and reason else f"{label}: {line or reason}"
    detail = " ".join(text.split())
    return cause("setup_failed", detail)


def baseline_fails_cause(label: str, reason: str, output: str) -> str:
    """The cause of a task sent to a human because its ``run`` verifier already fails on
    the base commit (no JUnit report to judge finer): ``baseline_fails:LABEL: SUMMARY``,
    the output's summary line, else the reason (``exit code 1``)."""
    line = summary_line(output) or reason
    return cause("baseline_fails", " ".join(f"{label}: {line}".split()))

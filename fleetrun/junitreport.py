"""A JUnit XML report, read strictly, and the per-test verdict against a baseline's.

The report is written by code the agent controls (the test suite in its worktree), so
it is untrusted: it is read only up to :data:`MAX_REPORT_BYTES`, a DOCTYPE or ENTITY
declaration is refused before the XML parser sees it (no entity expansion, no external
entity), and it must be a ``<testsuites>`` or ``<testsuite>`` naming at least one
``<testcase>``. Anything else is a :class:`ReportError` whose message says why; the
caller then judges by the exit code alone and says so (docs/verifiers.md).

Tests are named ``classname::name`` as the report writes them; a pytest node id
(``tests/test_x.py::TestA::test_y``, as ``must_pass`` lists them) is turned into that
form by :func:`key_of_node`, the way pytest's junitxml writes its ``classname``.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

#: A bigger report is not read (a suite of 100,000 tests writes about 20 MB).
MAX_REPORT_BYTES = 32 * 1024 * 1024
#: How much of a failure's message is kept per test.
MESSAGE_CHARS = 300
#: Outcomes of one test case.
PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"

_DECL = re.compile(rb"<!\s*(DOCTYPE|ENTITY)", re.IGNORECASE)


#: The line that ends the per-test verdict put before a verifier's output (the retry
#: prompt shows it whole, however long the output it precedes).
DETAILS_END = "(the tests above are judged against the base commit; the command's output follows)"


def with_details(details: str, output: str) -> str:
    return f"{details}\n{DETAILS_END}\n\n{output}" if details else output


def split_details(output: str) -> tuple[str, str]:
    """(the per-test verdict, the command's output) of a verdict's output; ``("",
    output)`` when it has none."""
    head, sep, rest = output.partition(f"\n{DETAILS_END}\n")
    if not sep or "\n\n" in head:
        return "", output
    return head, rest.lstrip("\n")


class ReportError(Exception):
    """The report cannot be used; the message says why (one line)."""


@dataclass
class Report:
    """Every test case of one report: ``classname::name`` → outcome, and the message
    of each that failed."""

    outcomes: dict[str, str] = field(default_factory=dict)
    messages: dict[str, str] = field(default_factory=dict)

    def failing(self) -> set[str]:
        return {k for k, o in self.outcomes.items() if o == FAILED}

    def passing(self) -> set[str]:
        return {k for k, o in self.outcomes.items() if o == PASSED}

    def to_json(self) -> dict[str, object]:
        return {"outcomes": self.outcomes, "messages": self.messages}

    @classmethod
    def from_json(cls, data: object) -> Optional[Report]:
        """A report kept in the ledger, or None if ``data`` is not one."""
        if not isinstance(data, dict):
            return None
        outcomes, messages = data.get("outcomes"), data.get("messages") or {}
        if not isinstance(outcomes, dict) or not isinstance(messages, dict):
            return None
        return cls({str(k): str(v) for k, v in outcomes.items()}, {str(k): str(v) for k, v in messages.items()})


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= MESSAGE_CHARS else line[: MESSAGE_CHARS - 3] + "..."


def parse(data: bytes) -> Report:
    """The test cases of a report's bytes.

    :raises ReportError: too big, a DOCTYPE/ENTITY declaration, not XML, not JUnit, no tests.
    """
    if len(data) > MAX_REPORT_BYTES:
        raise ReportError(f"the report is larger than {MAX_REPORT_BYTES} bytes")
    if _DECL.search(data):
        raise ReportError("the report declares a DOCTYPE or an ENTITY (refused)")
    try:
        root = ET.fromstring(data)
    except ET.ParseError as e:
        raise ReportError(f"the report is not well-formed XML ({e})") from None
    if root.tag not in ("testsuites", "testsuite"):
        raise ReportError(f"the report's root is <{root.tag[:40]}>, not <testsuites> or <testsuite>")
    report = Report()
    for case in root.iter("testcase"):
        name = case.get("name")
        if not name:
            raise ReportError("a <testcase> has no name")
        key = f"{case.get('classname') or ''}::{name}"
        outcome, message = PASSED, ""
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = FAILED
                text_lines = (child.text or "").strip().splitlines()
                message = child.get("message") or (text_lines[-1] if text_lines else child.tag)
                break
            if child.tag == "skipped":
                outcome = SKIPPED
        if report.outcomes.get(key) == FAILED:
            continue  # a test's failure and its teardown's error: one failure, the first message
        report.outcomes[key] = outcome
        if outcome == FAILED:
            report.messages[key] = _one_line(message)
    if not report.outcomes:
        raise ReportError("the report names no tests")
    return report


def read(path: Path) -> Report:
    """The report at ``path`` (a regular file, read up to the cap).

    :raises ReportError: missing, not a regular file, or :func:`parse`'s reasons."""
    try:
        if path.is_symlink() or not path.is_file():
            raise ReportError(
                f"no report at {path.name}" if not path.exists() else f"{path.name} is not a regular file"
            )
        with open(path, "rb") as f:
            data = f.read(MAX_REPORT_BYTES + 1)
    except OSError as e:
        raise ReportError(f"cannot read {path.name}: {e.strerror or e}") from None
    return parse(data)


def key_of_node(node_id: str) -> str:
    """``tests/test_x.py::TestA::test_y`` → ``tests.test_x.TestA::test_y`` (pytest's
    junitxml classname and name); a key already in that form is returned as it is."""
    parts = node_id.split("::")
    if len(parts) < 2 or not parts[0].endswith(".py"):
        return node_id
    module = parts[0][: -len(".py")].replace("/", ".")
    return "::".join([".".join([module, *parts[1:-1]]), parts[-1]])


def node_id(key: str, root: Path) -> Optional[str]:
    """The pytest node id of ``classname::name`` in the worktree ``root``: the longest
    leading part of the classname that is a ``.py`` file there is the module, the rest
    its classes. None if no such file (the test cannot be re-run by name)."""
    classname, _, name = key.rpartition("::")
    if not classname or not name:
        return None
    parts = classname.split(".")
    for n in range(len(parts), 0, -1):
        rel = "/".join(parts[:n]) + ".py"
        if ".." in parts[:n] or not (root / rel).is_file():
            continue
        return "::".join([rel, *parts[n:], name])
    return None


@dataclass
class Judgement:
    """A report judged against the baseline's.

    :ivar new: tests that passed on the base and fail now (each with its message).
    :ivar removed: tests the base ran (passing or failing) that are missing now.
    :ivar old: tests failing on the base and now (reported, not the task's failure).
    :ivar must_pass: ``must_pass`` tests that do not pass now.
    :ivar flaky: tests that failed now, passed on the base and passed when re-run.
    """

    base_total: int
    now_total: int
    new: dict[str, str] = field(default_factory=dict)
    removed: list[str] = field(default_factory=list)
    old: list[str] = field(default_factory=list)
    must_pass: list[str] = field(default_factory=list)
    flaky: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.new and not self.removed and not self.must_pass

    def summary(self) -> str:
        """``2 new failures (1 already failing on the base); tests: 12 on the base, 11 now``."""
        parts = [
            f"{len(self.new) + len(self.removed)} new failure{'s' if len(self.new) + len(self.removed) != 1 else ''}"
            f" ({len(self.old)} already failing on the base)"
        ]
        if self.removed:
            parts.append(f"{len(self.removed)} removed")
        if self.must_pass:
            parts.append(f"{len(self.must_pass)} of must_pass not passing")
        if self.flaky:
            parts.append(f"{len(self.flaky)} flaky")
        parts.append(f"tests: {self.base_total} on the base, {self.now_total} now")
        return "; ".join(parts)

    def details(self) -> str:
        """One line per test the task is failed for, then the others: the retry prompt's text."""
        lines = [f"new failure: {k}: {m}" for k, m in sorted(self.new.items())]
        lines += [f"removed (on the base, missing now): {k}" for k in self.removed]
        lines += [f"must_pass, not passing: {k}" for k in self.must_pass]
        lines += [f"flaky (failed, passed when re-run): {k}" for k in self.flaky]
        lines += [f"already failing on the base (not this task's): {k}" for k in self.old]
        return "\n".join(lines)

    def details_for_retry(self) -> str:
        """Only what the task is failed for (the retry prompt lists no old failure)."""
        lines = [f"new failure: {k}: {m}" for k, m in sorted(self.new.items())]
        lines += [f"removed (on the base, missing now): {k}" for k in self.removed]
        lines += [f"must_pass, not passing: {k}" for k in self.must_pass]
        return "\n".join(lines)

    def to_json(self) -> dict[str, object]:
        return {
            "new": len(self.new) + len(self.removed),
            "removed": len(self.removed),
            "already_failing": len(self.old),
            "must_pass_missing": len(self.must_pass),
            "flaky": len(self.flaky),
            "tests_base": self.base_total,
            "tests_now": self.now_total,
        }


def judge(base: Report, now: Report, must_pass: list[str], removes_tests: bool = False) -> Judgement:
    """The per-test verdict: new failures are tests that passed on the base and fail
    now; a test that passed on the base and is missing now is one too (``removed``),
    unless the task declares it removes tests; each ``must_pass`` test must pass now."""
    j = Judgement(base_total=len(base.outcomes), now_total=len(now.outcomes))
    base_pass = base.passing()
    for key in sorted(now.failing()):
        if key in base_pass:
            j.new[key] = now.messages.get(key, "")
        else:
            j.old.append(key)
    if not removes_tests:
        # a test failing on the base and deleted now hides that failure: as weakening as
        # a passing one deleted, so both count (a skipped one is not judged either way)
        j.removed = sorted(k for k, o in base.outcomes.items() if o != SKIPPED and k not in now.outcomes)
    j.must_pass = [t for t in must_pass if now.outcomes.get(key_of_node(t)) != PASSED]
    return j

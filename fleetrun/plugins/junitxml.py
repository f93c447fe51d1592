"""Built-in ``junitxml`` plugin: a JUnit XML report of a run, as pytest's ``--junitxml``.

``fleetrun tasks.toml --junitxml report.xml`` writes one ``<testcase>`` per task the
run moved: ``<failure>`` for NEEDS_HUMAN (its last cause, and the output of the
verifier that failed last), ``<error>`` for one a verifier could not judge
(``verifier_error:...``: nothing is known of the work), ``<skipped>`` for CANCELLED,
``<error>`` for a task the run left unfinished (interrupted, or still waiting). The file is valid against the
JUnit schema CI systems read (Jenkins' ``junit-10.xsd``, the one pytest validates its
own reports against), so a testcase holds no ``<properties>``: the task's id, final
state, attempts, retries and cost are the first lines of its ``<system-out>``.

The module only adds the option (``-p no:junitxml`` removes both); when it is given,
``fleetrun_configure`` registers a :class:`JunitXmlReporter` under the name
``junitxml-reporter``. The reporter keeps books in ``fleetrun_transition``,
``fleetrun_verdict`` and ``fleetrun_task_waiting``, and writes the file in
``fleetrun_sessionfinish``, reading each task's final state, cost and counters from
the ledger then (so a task cancelled from another shell is reported as cancelled),
and each testcase's time, the task's run without its waits for a slot (:func:`run_time`).
Tasks the run did not move (finished in an earlier run) are not reported.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from ..hookimpl import hookimpl
from ..version import __version__
from ..whereis import ran_on_peer, where_text

if TYPE_CHECKING:
    import xml.etree.ElementTree as ET

    from ..config import Config

#: The name the reporter object is registered under while a run writes a report.
REPORTER = "junitxml-reporter"

#: Characters XML 1.0 cannot hold at all (a verifier's colour codes, for one).
_ILLEGAL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff\ufffe\uffff]")

#: How much of a failing verifier's output goes into ``<failure>``.
OUTPUT_LIMIT = 8000


def tail_lines(text: str, limit: int) -> str:
    """The last whole lines of ``text`` that fit in ``limit`` characters (a reader of a
    report sees no line cut mid-word); the last ``limit`` characters of a last line
    longer than that (nothing whole fits)."""
    tail = text[-limit:]
    if len(text) > limit and text[-limit - 1] != "\n":
        cut = tail.find("\n")
        if cut >= 0:
            tail = tail[cut + 1 :]
    return tail


def _word(verdict: Any) -> str:
    """PASS, FAIL or ERROR (a verifier that could not judge)."""
    return "ERROR" if getattr(verdict, "error", None) else ("PASS" if verdict.passed else "FAIL")


def xml_text(text: str) -> str:
    """``text`` with the characters XML cannot hold written as ``\\xNN``."""
    return _ILLEGAL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


@hookimpl
def fleetrun_addoption(parser: Any, pluginmanager: Any) -> None:
    group = parser.getgroup("junitxml", "JUnit XML report")
    group.addoption(
        "--junitxml", dest="junitxml", metavar="PATH", default=None, help="write a JUnit XML report of the run to PATH"
    )


@hookimpl
def fleetrun_configure(config: Config) -> None:
    path = config.getoption("junitxml")
    if not path or config.pluginmanager.get_plugin(REPORTER) is not None:
        return
    path = os.path.join(str(config.invocation_dir), os.path.expanduser(path))
    config.pluginmanager.register(JunitXmlReporter(os.path.abspath(path), config), REPORTER)


@hookimpl
def fleetrun_unconfigure(config: Config) -> None:
    reporter = config.pluginmanager.get_plugin(REPORTER)
    if reporter is not None:
        config.pluginmanager.unregister(reporter)


@dataclass
class Case:
    """What the run saw of one task."""

    task: Any  # the newest fleetrun.ledger.Task passed to a hook
    first_seen: float
    last_seen: float
    verdicts: list[tuple[int, Any]] = field(default_factory=list)  # (attempt number, Verdict)
    waiting: str = ""  # why it could not be placed, the last time it could not
    run_time: Optional[float] = None  # from the ledger at the end (:func:`run_time`)
    setup_failure: str = ""  # its failed setup command and output (:func:`setup_failure`)


def setup_failure(attempts: list[Any]) -> str:
    """The last failed setup command of a task's attempts, as a failed verifier is
    shown in ``<failure>``: ``attempt N: setup `CMD` failed: REASON`` and its output."""
    for att in reversed(attempts):
        steps = [s for s in (att.info or {}).get("setup_steps") or [] if isinstance(s, dict)]
        failed = [s for s in steps if not s.get("passed")]
        if failed:
            step = failed[-1]
            command = " ".join(str(step.get("command") or "").split())
            head = f"attempt {att.number}: setup `{command}` failed: {step.get('reason') or ''}"
            return _with_output(head, str(step.get("output") or ""))
    return ""


def _with_output(head: str, output: str) -> str:
    output = output.rstrip()
    if len(output) > OUTPUT_LIMIT:
        output = "[... earlier output cut ...]\n" + tail_lines(output, OUTPUT_LIMIT)
    return head + ("\n" + output if output else "")


#: The states in which a task holds its place (its attempt starts, runs or is verified).
_PLACED = frozenset({"ASSIGNED", "RUNNING", "VERIFYING"})


def run_time(transitions: list[Any], since: float) -> float:
    """How long a task was placed during the run (in ASSIGNED, RUNNING or VERIFYING,
    from the ledger's transitions at or after ``since``): its run, without its waits for
    a slot, before its first attempt or between two."""
    total, entered = 0.0, None
    for row in transitions:
        if row.time < since:  # placed before the run (an attempt it adopted): counted from its start
            entered = since if row.to_state in _PLACED else None
            continue
        if entered is not None:
            total += row.time - entered
        entered = row.time if row.to_state in _PLACED else None
    return total


class JunitXmlReporter:
    """Keeps books on the tasks a run moves; writes the report when the run ends."""

    def __init__(self, path: str, config: Config) -> None:
        self.path = path
        self.config = config
        self.cases: dict[str, Case] = {}
        self.started = time.time()

    def _case(self, task: Any) -> Case:
        now = time.time()
        case = self.cases.get(task.id)
        if case is None:
            case = self.cases[task.id] = Case(task, now, now)
        case.task = task
        case.last_seen = now
        return case

    @hookimpl
    def fleetrun_transition(
        self, task: Any, from_state: str, to_state: str, cause: str, attempt: Optional[int], config: Config
    ) -> None:
        self._case(task)

    @hookimpl
    def fleetrun_verdict(self, task: Any, verdict: Any, attempt: Any, config: Config) -> None:
        self._case(task).verdicts.append((attempt.number, verdict))

    @hookimpl
    def fleetrun_task_waiting(self, task: Any, reason: str, config: Config) -> None:
        self._case(task).waiting = reason

    @hookimpl
    def fleetrun_sessionfinish(self, session: Any, exitstatus: int) -> None:
        ledger = getattr(session, "ledger", None)
        for case in self.cases.values():
            fresh = ledger.get(case.task.id) if ledger is not None else None
            if fresh is not None:  # cost and counters as the ledger has them now
                case.task = fresh
            if ledger is not None:
                case.run_time = run_time(ledger.transitions(case.task.id), self.started)
                if (case.task.reason or "").startswith("setup_failed:"):
                    case.setup_failure = setup_failure(ledger.attempts(case.task.id))
        self.write(self.build(exitstatus))

    # -- the document ------------------------------------------------------------------

    def build(self, exitstatus: int) -> ET.Element:
        """The report: ``<testsuites>`` holding one ``<testsuite name="fleetrun">``."""
        import socket
        import xml.etree.ElementTree as ET

        suite = ET.Element("testsuite", name="fleetrun")
        props = ET.SubElement(suite, "properties")
        ET.SubElement(props, "property", name="exitstatus", value=str(int(exitstatus)))
        ET.SubElement(props, "property", name="fleetrun_version", value=__version__)
        counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        for case in sorted(self.cases.values(), key=lambda c: (c.first_seen, c.task.name)):
            counts["tests"] += 1
            kind = self._testcase(suite, case)
            if kind:
                counts[kind] += 1
        for key, n in counts.items():
            suite.set(key, str(n))
        suite.set("time", f"{time.time() - self.started:.3f}")
        suite.set("timestamp", time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(self.started)))
        suite.set("hostname", socket.gethostname())
        root = ET.Element("testsuites", name="fleetrun")
        # the schema's <testsuites> has no `skipped`: the suite's own says it
        for key in ("tests", "failures", "errors", "time"):
            root.set(key, suite.get(key, ""))
        root.append(suite)
        return root

    def _classname(self, task: Any) -> str:
        source = getattr(task.spec, "source", "") or getattr(task, "source", "") or "tasks"
        try:
            rel = os.path.relpath(source, str(self.config.invocation_dir))
        except ValueError:
            rel = source
        if rel.startswith(".."):
            rel = os.path.basename(source)
        return os.path.splitext(rel)[0].replace(os.sep, ".")

    def _testcase(self, suite: ET.Element, case: Case) -> Optional[str]:
        import xml.etree.ElementTree as ET

        task = case.task
        state = task.state.value if hasattr(task.state, "value") else str(task.state)
        tc = ET.SubElement(
            suite,
            "testcase",
            classname=self._classname(task),
            name=xml_text(task.name),
            time=f"{case.run_time if case.run_time is not None else case.last_seen - case.first_seen:.3f}",
        )
        reason = xml_text(task.reason or "")
        kind: Optional[str] = None
        if state == "NEEDS_HUMAN" and reason.startswith("verifier_error:"):
            # a verifier could not judge: nothing is known of the work (pytest's error vs failure)
            el = ET.SubElement(tc, "error", message=reason, type="verifier_error")
            el.text = xml_text(self._failure_text(case))
            kind = "errors"
        elif state == "NEEDS_HUMAN":
            el = ET.SubElement(tc, "failure", message=reason, type=reason.split(":", 1)[0] or "needs_human")
            el.text = xml_text(self._failure_text(case))
            kind = "failures"
        elif state == "CANCELLED":
            ET.SubElement(tc, "skipped", message=reason, type="cancelled")
            kind = "skipped"
        elif state != "DONE":
            why = xml_text(case.waiting) if case.waiting else reason
            ET.SubElement(
                tc, "error", message=f"not finished: {state}" + (f": {why}" if why else ""), type="unfinished"
            )
            kind = "errors"
        # Jenkins' schema (junit-10.xsd) has no <properties> in a <testcase>, and CI
        # systems that read it drop or refuse them: the task's facts lead its output
        facts = "".join(
            f"{name}: {value}\n"
            for name, value in (
                ("task_id", task.id),
                ("state", state),
                ("attempts", task.attempts),
                ("retries", task.retries),
                ("cost_usd", f"{task.cost_usd:.6f}"),
            )
        )
        verdicts = "".join(
            f"attempt {n}: verify {v.kind} `{v.label}`: {_word(v)}{f' ({v.reason})' if v.reason else ''}\n"
            for n, v in case.verdicts
        )
        # a peer task's: where it ran and where its branch is, after its verdicts
        where = where_text(task) if ran_on_peer(task) else ""
        ET.SubElement(tc, "system-out").text = xml_text(facts + verdicts + (f"where: {where}\n" if where else ""))
        return kind

    @staticmethod
    def _failure_text(case: Case) -> str:
        if case.setup_failure:
            return case.setup_failure
        failed = [(n, v) for n, v in case.verdicts if not v.passed]
        if not failed:
            return case.task.reason or "needs a human"
        n, v = failed[-1]
        did = "could not judge" if getattr(v, "error", None) else "failed"
        head = f"attempt {n}: verify {v.kind} `{v.label}` {did}" + (f": {v.reason}" if v.reason else "")
        return _with_output(head, v.output or "")

    def write(self, root: ET.Element) -> None:
        """Write the report atomically (temp file + rename), making its folder."""
        import xml.etree.ElementTree as ET

        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        ET.indent(root)
        tmp = f"{self.path}.{os.getpid()}.tmp"
        ET.ElementTree(root).write(tmp, encoding="utf-8", xml_declaration=True)
        os.replace(tmp, self.path)

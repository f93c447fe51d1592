"""The baseline of a task's ``run`` verifiers: what each says on the task's base commit,
before any agent has touched it (docs/verifiers.md, "What was already broken").

This module holds the data side: which verifiers have a baseline (:func:`steps`), the
key a result is shared under (:func:`key`: repository, base commit, command, setup
commands, folder and JUnit path; 50 tasks on one base run it once), and the result
kept in the ledger's ``meta`` table (``baseline:<key>``; which result a task's verifier
is judged against: ``baseline_task:<task id>:<verifier index>``; the counts of a task's
latest per-test verdict: ``tests:<task id>``, which ``status --json`` shows). Running it is the
``verify_run`` plugin's business (a step of kind ``baseline`` handed to
``fleetrun_verify`` by :mod:`fleetrun.setupstage`, after the task's setup and before
its first attempt).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, Optional, Union

from .junitreport import Report
from .taskspec import VerifySpec

#: The kind of the setup stage's baseline steps (no ``[[task.verify]]`` table has it).
KIND = "baseline"
#: The step's ``extra`` key: the index of the ``run`` verifier it is the baseline of.
OF = "baseline_of"
#: The step's ``extra`` key that asks for a new run, not the ledger's result.
FRESH = "baseline_fresh"
#: How much of the base run's output is kept in the ledger.
KEEP_CHARS = 8000


def mode(task: Any, verifier: VerifySpec) -> Union[bool, str]:
    """The verifier's ``baseline`` (true, false or ``"warn"``): its own key, else the
    task's (or its default), else true for a verifier with ``junit`` and false for one
    without: a plain verifier often checks the task's own goal (``test -f out.txt``),
    which fails on the base by design, so a whole-run baseline is asked for, not assumed."""
    for where in (verifier.extra, task.spec.extra):
        value = where.get("baseline") if isinstance(where, dict) else None
        if isinstance(value, bool) or value == "warn":
            return value
    return isinstance(verifier.extra.get("junit"), str)


def steps(task: Any) -> list[VerifySpec]:
    """One baseline step per ``run`` verifier whose baseline is not off."""
    out = []
    for idx, v in enumerate(task.spec.verify):
        if v.kind == "run" and mode(task, v) is not False:
            out.append(
                VerifySpec(
                    kind=KIND, text=v.text, timeout_s=v.timeout_s, extra={**v.extra, OF: idx}, line=v.line, name=v.name
                )
            )
    return out


def key(repo: str, commit: str, step: VerifySpec, setup: list[str], subdir: str) -> str:
    """What a baseline result is shared under. The task's own environment variables
    (``FLEETRUN_TASK``...) differ from task to task and are left out; the environment
    the user gave (the supervisor's) is the same for all."""
    import hashlib  # not at the top: ``status`` reads this module's rows and starts fast

    what = [repo, commit, step.text, setup, subdir, step.extra.get("junit")]
    return hashlib.sha256(json.dumps(what).encode()).hexdigest()[:32]


@dataclass
class Result:
    """A verifier's run on a base commit.

    :ivar passed: its exit code said PASS.
    :ivar reason: one line (``exit code 1``).
    :ivar summary: its output's summary line (pytest's ``1 failed, 12 passed``).
    :ivar report: its JUnit report's tests, or None (no ``junit``, or unusable:
        ``report_error`` says why).
    """

    commit: str
    label: str
    passed: bool
    reason: str
    summary: str = ""
    output: str = ""
    report: Optional[dict[str, Any]] = None
    report_error: Optional[str] = None
    error: Optional[str] = None
    runs: int = 1

    def junit(self) -> Optional[Report]:
        return Report.from_json(self.report) if self.report is not None else None

    def describe(self) -> str:
        """``baseline: 14 tests, 1 failing on the base at c1dc5dc`` or ``... exit code 1 at ...``."""
        rep = self.junit()
        at = f"at {self.commit[:7]}"
        if rep is not None:
            return f"baseline: {len(rep.outcomes)} tests, {len(rep.failing())} failing on the base {at}"
        return f"baseline: {'passes' if self.passed else 'fails (' + (self.summary or self.reason) + ')'} {at}"


def store(led: Any, k: str, result: Result) -> None:
    led.set_meta(f"baseline:{k}", json.dumps(asdict(result)))


def load(led: Any, k: str) -> Optional[Result]:
    raw = led.get_meta(f"baseline:{k}")
    if raw is None:
        return None
    try:
        data = json.loads(raw)
        return Result(**{f: data[f] for f in data if f in Result.__dataclass_fields__})
    except (ValueError, TypeError):
        return None  # a row of another version: run it again


def bind(led: Any, task_id: str, idx: int, k: str) -> None:
    """The task's verifier ``idx`` is judged against the result under ``k``."""
    led.set_meta(f"baseline_task:{task_id}:{idx}", k)


def of_task(led: Any, task_id: str, idx: int) -> Optional[Result]:
    k = led.get_meta(f"baseline_task:{task_id}:{idx}")
    return load(led, k) if k else None


def warnings(led: Any, task: Any) -> list[tuple[str, str]]:
    """(label, summary) of each ``baseline = "warn"`` verifier of the task that fails on
    its base with no report to judge by: the prompt says so."""
    out = []
    for idx, v in enumerate(task.spec.verify):
        if v.kind != "run" or mode(task, v) != "warn":
            continue
        r = of_task(led, task.id, idx)
        if r is not None and not r.passed and r.junit() is None:
            out.append((v.label, r.summary or r.reason))
    return out


def store_tests(led: Any, task_id: str, counts: dict[str, object]) -> None:
    """The task's latest per-test judgement's counts (``status --json``'s ``tests``)."""
    led.set_meta(f"tests:{task_id}", json.dumps(counts))


def all_tests(led: Any) -> dict[str, dict[str, Any]]:
    """Every task's latest counts, in one read: task id -> counts."""
    out: dict[str, dict[str, Any]] = {}
    for k, v in led.conn.execute("SELECT key, value FROM meta WHERE key LIKE 'tests:%'"):
        try:
            data = json.loads(v)
        except ValueError:
            continue
        if isinstance(data, dict):
            out[k[len("tests:") :]] = data
    return out

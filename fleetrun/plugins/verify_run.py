"""Built-in ``verify_run`` plugin: ``run = "cmd"`` verifiers.

The command runs with ``/bin/sh -c`` in the attempt's workspace (it is the user's own
command line; names and prompts never reach it). Its output goes to a file in the
attempt folder while it runs (so a large output can never fill a pipe and deadlock),
cut to ``[output] max_bytes`` (head and tail kept; the verdict says ``output cut``),
and the last 64 KiB is kept with the verdict; what the command detaches ends with it
(:mod:`fleetrun.capped`). The exit code is the verdict; a timeout
is a FAIL with that reason (most often the code under test hangs). The verifier could
not judge (an ERROR, never the agent's failure) when its command cannot start, or when
/bin/sh says 127/126 and the command's first word is a name not on PATH, or a path
outside the workspace that is missing or not executable (:func:`not_found_error`): a
script of the worktree's own that is missing or not executable is the work's, a FAIL.
A task's ``setup`` commands run through here too (see :mod:`fleetrun.setupstage`).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Union

from .. import baseline, crash
from ..commandword import SHELL_WORDS as _SHELL_WORDS
from ..commandword import is_assignment as _is_assignment
from ..commandword import not_found_error
from ..config import output_cap
from ..hookimpl import hookimpl
from ..hostapi import Host
from ..junitreport import Judgement, with_details
from ..procutil import CappedStart, ProcessHandle, tail_text, task_env
from ..reports import PERMANENT, Verdict
from ..stash import StashKey
from ..taskspec import DEFAULT_SETUP_TIMEOUT_S, VerifySpec, step_index
from ..verdicttext import summary_line

if TYPE_CHECKING:
    from ..config import Config


class RunHandle(ProcessHandle):
    """A running ``run`` verifier; ``poll()`` gives the Verdict once it has ended."""

    def __init__(
        self,
        verifier: Any,
        cwd: str,
        out_path: Path,
        env: dict[str, str],
        host: str = "local",
        root: Optional[str] = None,
        max_bytes: Optional[int] = None,
        start: Optional[CappedStart] = None,
    ) -> None:
        #: for :func:`not_found_error`: the PATH the command ran with, and the folder
        #: whose files are the work's (a script of its own that is gone is the work's fault)
        self.path_var = env.get("PATH")
        self.root = root or cwd
        # what a re-run of its flaky-looking failures needs (TestJudge)
        self.cwd, self.env, self.start = cwd, env, start
        self.rerun: Optional[RunHandle] = None
        super().__init__(
            verifier, ["/bin/sh", "-c", verifier.text], cwd, env, out_path, host=host, max_bytes=max_bytes, start=start
        )

    def _make(self, passed: bool, reason: str, error: Optional[str] = None) -> Verdict:
        cut = self.output_cut()
        if cut:  # the flood is this verifier's to answer for, in its own verdict
            reason = f"{reason}; {cut}"
        return Verdict(
            passed=passed,
            kind="run",
            label=self.verifier.label,
            reason=reason,
            output=tail_text(self.out_path),
            duration_s=time.monotonic() - self.started,
            host=self.host,
            error=error,
        )

    def cannot_start(self, error: str) -> Verdict:
        return self._make(False, f"cannot start: {error}", error=PERMANENT)

    def timed_out(self) -> Verdict:
        return self._make(False, f"timed out after {self.verifier.timeout_s:g}s")

    #: set for a verifier with ``junit``: the per-test verdict against its baseline
    judge: Optional[TestJudge] = None

    def poll(self) -> Optional[Verdict]:
        if self.rerun is not None:  # its new failures, once more by name
            if self.rerun.poll() is None:
                return None
            self.rerun = None
            assert self.judge is not None
            self.verdict = self.judge.after_rerun(self._make)
            return self.verdict
        verdict = super().poll()
        if verdict is not None and self.judge is not None and self.judge.pending is not None:
            self.rerun = self.judge.start_rerun(self)
            if self.rerun is not None:
                return None
        return verdict

    def fileno(self) -> int:
        return self.rerun.fileno() if self.rerun is not None else super().fileno()

    def next_deadline(self) -> float:
        return self.rerun.next_deadline() if self.rerun is not None else super().next_deadline()

    def cancel(self) -> None:
        if self.rerun is not None:
            self.rerun.cancel()
            self.rerun = None
        super().cancel()

    def ended(self, code: int) -> Verdict:
        plain = self._ended(code)
        if self.judge is None or plain.error or code < 0 or code in (126, 127):
            return plain
        return self.judge.verdict(plain, self._make)

    def _ended(self, code: int) -> Verdict:
        if code == 0:
            return self._make(True, "exit code 0")
        if code < 0:
            return self._make(False, f"killed by signal {-code}")
        if code in (126, 127):
            why = not_found_error(self.verifier.text, self.path_var, self.root)
            if why:
                return self._make(False, why, error=PERMANENT)
        return self._make(False, f"exit code {code}")


def verifier_env(task: Any, attempt: Any, workspace: Any) -> dict[str, str]:
    return task_env(task, attempt, workspace.path)


@hookimpl
def fleetrun_task_keys(config: Config) -> list[Any]:
    """The verifier kind "run" this plugin runs: in the attempt's workspace, on the
    host it ran on (a peer runs it there). Without this plugin
    (``-p no:verify_run``) a tasks file that uses it does not validate."""
    from ..taskkeys import kind_text_check
    from ..taskspec import KeyDecl

    return [
        KeyDecl(
            "run",
            (str,),
            where="verify_kind",
            doc="shell command; exit code is the verdict",
            check=kind_text_check,
            runs="host",
        )
    ]


@hookimpl(trylast=True)
def fleetrun_verify(
    task: Any, verifier: Any, workspace: Any, attempt: Any, host: Host, config: Config
) -> Optional[Union[RunHandle, BaselineStep, Verdict]]:
    if verifier.kind == baseline.KIND:
        # on this machine whatever the host (a peer's baseline is a known gap, docs/verifiers.md)
        return baseline_step(task, verifier, workspace, attempt, config, local=host.local)
    if verifier.kind != "run" or not host.local:
        return None  # a host whose folders are elsewhere runs its own (the relay's on a peer)
    idx = step_index(task, verifier)
    handle = _run_handle(task, verifier, workspace, attempt, host, config, f"verify-{idx + 1}.out")
    if isinstance(verifier.extra.get("junit"), str):
        handle.judge = TestJudge(task, verifier, idx, workspace, config)
    return handle


@hookimpl(trylast=True)
def fleetrun_setup_step(
    task: Any, step: Any, number: int, workspace: Any, attempt: Any, host: Host, config: Config
) -> Optional[RunHandle]:
    """Setup command ``number`` on a ``host.local`` host, as a ``run`` verifier runs; its
    output in ``setup-N.out`` beside the verifiers' outputs."""
    if not host.local:
        return None  # a host whose folders are elsewhere runs its own (the relay's on a peer)
    return _run_handle(task, step, workspace, attempt, host, config, f"setup-{number}.out")


def _run_handle(task: Any, spec: Any, workspace: Any, attempt: Any, host: Host, config: Config, name: str) -> RunHandle:
    adir = host.attempt_dir(attempt.id)
    adir.mkdir(parents=True, exist_ok=True, mode=0o700)
    return RunHandle(
        spec,
        workspace.path,
        adir / name,
        verifier_env(task, attempt, workspace),
        root=getattr(workspace, "root", None) or workspace.path,
        max_bytes=output_cap(config),
        # this machine's host forks the wrapper from its starter (LocalHost.start_capped)
        start=getattr(host, "start_capped", None),
    )


# ---------------------------------------------------------------------------------
# A command that is not there: the verifier would fail every attempt with "command not
# found", and the agent be retried for it.


def missing_command(text: str, cwd: str, has_setup: bool) -> Optional[str]:
    """Why the first command of a ``run`` verifier is not found, or None (found, a
    shell word, or nothing sure to say: a variable, a command that does not split as
    the shell's words, a relative path a ``setup`` step may make)."""
    import os
    import shlex
    import shutil

    try:
        words = shlex.split(text, comments=True)
    except ValueError:
        return None
    first = next((w for w in words if not _is_assignment(w)), "")
    if not first or first in _SHELL_WORDS or any(c in first for c in "$`*?~;&|<>()"):
        return None
    if "/" not in first:
        return None if shutil.which(first) else f"{first} is not on PATH"
    if os.path.isabs(first):
        return None if os.path.exists(first) else f"{first} does not exist"
    if has_setup or os.path.exists(os.path.join(cwd, first)):
        return None
    return f"{first} is not in the task's cwd"


def missing_command_warnings(config: Config, items: list[Any]) -> None:
    from ..queueing import warn_tasks

    known: dict[tuple[str, str, bool], Optional[str]] = {}  # 100,000 tasks share a few commands
    # one warning a missing command (and verifier number), at its first task, with the
    # count of the tasks that run it
    found: dict[tuple[int, str, str, bool], tuple[Any, Any, int, str]] = {}
    for t in items:
        for i, v in enumerate(t.verify):
            if v.kind != "run":
                continue
            key = (v.text, t.cwd, bool(t.setup))
            if key not in known:
                known[key] = missing_command(*key)
            problem = known[key]
            if problem:
                first, step, count, _ = found.get((i, *key), (t, v, 0, problem))
                found[(i, *key)] = (first, step, count + 1, problem)
    for (i, *_), (first, step, count, problem) in found.items():
        warn_tasks(
            config,
            first,
            count,
            f"verify #{i + 1}",
            f"{problem} (the verifier would fail, command not found)",
            line=step.line or first.line,
        )


# ---------------------------------------------------------------------------------
# The editable-install trap: a `run` verifier whose interpreter imports the project
# from the user's checkout (``pip install -e .``), so it tests that, not the worktree.


@hookimpl(trylast=True)
def fleetrun_collection_modifyitems(config: Config, items: list[Any]) -> None:
    """Warn about every ``run`` verifier whose command is not found on this machine
    (:func:`missing_command`), and every one of a worktree task whose interpreter has an
    editable install of a package from the task's own repository checkout. Nothing is
    run: PATH, the task's cwd and the interpreter's site-packages are read."""
    from ..editable import checkout_of, editable_trap
    from ..queueing import warn_tasks

    missing_command_warnings(config, items)
    tops: dict[str, Optional[str]] = {}
    seen: dict[Any, Any] = {}
    traps: dict[tuple[str, str, str], Any] = {}
    trapped: dict[tuple[str, str, str], tuple[Any, Any, int]] = {}  # by cause: its first task and step, how many
    for t in items:
        if not t.git_ref:
            continue  # it works in the checkout itself: an install of it is the right one
        if t.cwd not in tops:
            tops[t.cwd] = checkout_of(t.cwd)
        top = tops[t.cwd]
        if top is None:
            continue
        for v in t.verify:
            if v.kind != "run":
                continue
            key = (v.text, top, t.cwd)
            if key not in traps:  # each command of each folder once, however many tasks run it
                traps[key] = editable_trap(v.text, top, t.cwd, seen)
            if traps[key] is not None:
                first, step, count = trapped.get(key, (t, v, 0))
                trapped[key] = (first, step, count + 1)
    for key, (first, step, count) in trapped.items():
        trap = traps[key]
        warn_tasks(
            config,
            first,
            count,
            "verify",
            f"{trap.interpreter} imports {trap.package} from {trap.project} (an editable install of the main "
            f"checkout), not from the worktree; add PYTHONPATH={trap.pythonpath} or a setup step (docs/verifiers.md)",
            line=step.line or first.line,
        )


# ---------------------------------------------------------------------------------
# What was already broken: a verifier's baseline run on the task's base commit, and the
# per-test verdict of a verifier with a JUnit report (docs/verifiers.md).

#: The runs in flight, by :func:`fleetrun.baseline.key`: tasks on one base share one.
BASELINE_RUNS = StashKey[dict[str, "BaselineRun"]]()


def _git(cwd: str, *args: str) -> Optional[str]:
    try:
        done = subprocess.run(["git", "-C", cwd, *args], capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


class BaselineRun:
    """One run of a verifier on a base commit, in a detached worktree of its own under
    the home (``baselines/KEY/base-KEY``), after the task's setup commands; the worktree is
    removed once it has ended. Its result goes to the ledger; every task whose baseline
    step has this key waits on this one run."""

    def __init__(
        self,
        k: str,
        step: Any,
        repo: str,
        commit: str,
        subdir: str,
        setup: list[Any],
        env: dict[str, str],
        config: Config,
    ) -> None:
        from ..ledger import open_ledger

        self.k, self.step, self.repo, self.commit = k, step, repo, commit
        self.led = open_ledger(config)
        self.holders = 0
        self.result: Optional[baseline.Result] = None
        self.dir = config.home / "baselines" / k
        # git names a worktree's admin folder (.git/worktrees/NAME) after its last part:
        # two base runs named alike, started together, would race for one name
        self.tree = self.dir / f"base-{k[:16]}"
        self.handle: Optional[RunHandle] = None
        self.max_bytes, self.env = output_cap(config), env
        if self.dir.exists():  # a run a crash left: its commands end before its worktree goes
            from ..hosts import kill_recorded_children

            kill_recorded_children(self.dir)
        self._remove_tree()
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.cwd = str(self.tree / subdir) if subdir not in ("", ".") else str(self.tree)
        self.env = {**env, "FLEETRUN_WORKTREE": str(self.tree)} if "FLEETRUN_WORKTREE" in env else env
        # the checkout is a step too (a large repository takes a while): the loop polls it
        make = VerifySpec(
            kind="run",
            text=shlex.join(
                ["git", "-C", repo, "worktree", "add", "--force", "--detach", "-q", str(self.tree), commit]
            ),
            timeout_s=DEFAULT_SETUP_TIMEOUT_S,
            name="the base's worktree",
        )
        self.queue: list[tuple[str, Any]] = [
            ("make", make),
            *((f"setup-{i + 1}", c) for i, c in enumerate(setup)),
            ("verify", step),
        ]
        self._next()

    def _next(self) -> None:
        name, spec = self.queue[0]
        cwd = str(self.dir) if name == "make" else self.cwd
        self.handle = RunHandle(
            spec, cwd, self.dir / f"{name}.out", self.env, root=str(self.tree), max_bytes=self.max_bytes
        )
        if name == "verify":
            crash.point("mid_baseline")

    def poll(self) -> Optional[baseline.Result]:
        if self.result is not None or self.handle is None:
            return self.result
        v = self.handle.poll()
        if v is None:
            return None
        name, spec = self.queue.pop(0)
        if name == "make" and not v.passed:
            self._finish(
                False,
                f"cannot make a worktree at {self.commit[:12]}: {summary_line(v.output) or v.reason}",
                error=PERMANENT,
            )
        elif name != "verify" and not v.passed:
            self._finish(False, f"setup command {spec.label!r} failed on the base: {v.reason}", output=v.output)
        elif name != "verify":
            self._next()
        else:
            self._finish(v.passed, v.reason, output=v.output, error=v.error)
        return self.result

    def _finish(self, passed: bool, reason: str, output: str = "", error: Optional[str] = None) -> None:
        from ..junitreport import ReportError, read

        report, report_error = None, None
        junit = self.step.extra.get("junit")
        if isinstance(junit, str) and error is None:
            try:
                report = read(Path(self.cwd) / junit).to_json()
            except ReportError as e:
                report_error = str(e)
        self.result = baseline.Result(
            commit=self.commit,
            label=self.step.label,
            passed=passed,
            reason=reason,
            summary=summary_line(output),
            output=output[-baseline.KEEP_CHARS :],
            report=report,
            report_error=report_error,
            error=error,
        )
        baseline.store(self.led, self.k, self.result)
        self.handle = None
        self._remove_tree()

    def _remove_tree(self) -> None:
        import shutil

        if self.tree.exists():
            _git(self.repo, "worktree", "remove", "--force", str(self.tree))
        shutil.rmtree(self.dir, ignore_errors=True)
        # no `git worktree prune`: it would race with a worktree another task's or base
        # run is making in the same repository (its admin folder not complete yet); a
        # registration a crash left is overridden by the next `add --force`

    def cancel(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
        self._remove_tree()


class BaselineStep:
    """One task's baseline step: waits on the shared :class:`BaselineRun` and says what
    its result means for this task (a :class:`~fleetrun.reports.VerifyHandle`)."""

    def __init__(
        self, run: BaselineRun, task: Any, step: Any, config: Config, runs: dict[str, BaselineRun], local: bool = True
    ) -> None:
        self.run, self.task, self.step, self.config, self.runs, self.local = run, task, step, config, runs, local
        run.holders += 1

    def poll(self) -> Optional[Verdict]:
        result = self.run.poll()
        if result is None:
            return None
        if self.runs.get(self.run.k) is self.run:
            del self.runs[self.run.k]
        return step_verdict(self.run.led, self.task, self.step, self.run.k, result, self.local)

    def fileno(self) -> int:
        return self.run.handle.fileno() if self.run.handle is not None else -1

    def next_deadline(self) -> float:
        return self.run.handle.next_deadline() if self.run.handle is not None else time.monotonic()

    def cancel(self) -> None:
        self.run.holders -= 1
        if self.run.holders <= 0 and self.run.result is None:
            self.run.cancel()
            if self.runs.get(self.run.k) is self.run:
                del self.runs[self.run.k]


def step_verdict(led: Any, task: Any, step: Any, k: str, result: baseline.Result, local: bool = True) -> Verdict:
    """What the base's result means for the task: go on (it passed, or a JUnit report
    lets each test be judged, or ``baseline = "warn"``), or stop (a FAIL: the setup stage
    sends the task to a human, ``baseline_fails``). On a peer the verifier's report
    stays there and is not judged per test, so a failing base stops the task there even
    with a report."""
    idx = step.extra[baseline.OF]
    baseline.bind(led, task.id, idx, k)
    what = result.describe()
    if result.passed or (local and result.junit() is not None):
        return Verdict(True, baseline.KIND, step.label, reason=what)
    if result.error is None and baseline.mode(task, step) == "warn":
        return Verdict(True, baseline.KIND, step.label, reason=f'{what}; baseline = "warn": starting anyway')
    reason = result.reason if not result.report_error else f"{result.reason}; {result.report_error}"
    return Verdict(False, baseline.KIND, step.label, reason=reason, output=result.output)


def baseline_step(
    task: Any, step: Any, workspace: Any, attempt: Any, config: Config, local: bool = True
) -> Union[Verdict, BaselineStep]:
    """The baseline of one of the task's ``run`` verifiers: its result from the ledger,
    the run in flight for the same key, or a new run. ``workspace`` is at the base commit
    (no agent has run in it yet). For a task placed on a peer the base runs here, from
    the task's own repository at its ``git_ref`` (a known gap: docs/verifiers.md)."""
    if local:
        path, rev = workspace.path, "HEAD"
    elif task.spec.git_ref and not task.spec.merges_dependencies:
        path, rev = task.spec.cwd, task.spec.git_ref
    else:  # the base is made on the peer (a merge of its dependencies, or its checkout)
        return Verdict(True, baseline.KIND, step.label, reason="the base is on the peer: no baseline")
    commit = _git(path, "rev-parse", "--verify", f"{rev}^{{commit}}")
    top = _git(path, "rev-parse", "--show-toplevel")
    common = _git(path, "rev-parse", "--path-format=absolute", "--git-common-dir")
    if not commit or not top or not common:
        return Verdict(True, baseline.KIND, step.label, reason="not a git repository: no baseline")
    subdir = os.path.relpath(path, top)
    setup = [s.text for s in task.spec.setup]
    k = baseline.key(common, commit, step, setup, subdir)
    from ..ledger import open_ledger

    led = open_ledger(config)
    known = None if step.extra.get(baseline.FRESH) else baseline.load(led, k)
    if known is not None:
        return step_verdict(led, task, step, k, known, local)
    runs = config.stash.setdefault(BASELINE_RUNS, {})
    run = runs.get(k)
    if run is None:
        env = {**verifier_env(task, attempt, workspace)}
        run = runs[k] = BaselineRun(k, step, top, commit, subdir, list(task.spec.setup), env, config)
    return BaselineStep(run, task, step, config, runs, local)


class TestJudge:
    """The per-test verdict of a ``run`` verifier with ``junit``: its report against the
    one its baseline wrote (:func:`fleetrun.junitreport.judge`)."""

    def __init__(self, task: Any, verifier: Any, idx: int, workspace: Any, config: Config) -> None:
        self.task, self.verifier, self.idx, self.config = task, verifier, idx, config
        self.root = Path(getattr(workspace, "root", None) or workspace.path)
        self.report_path = Path(workspace.path) / verifier.extra["junit"]
        self.cwd = Path(workspace.path)
        #: the judgement waiting on a re-run of its new failures, the exit code's
        #: verdict, and the failures' node ids
        self.pending: Optional[tuple[Judgement, Verdict, dict[str, str]]] = None
        self.rerun_xml = Path()

    def verdict(self, plain: Verdict, make: Any) -> Verdict:
        """``plain`` is the exit code's verdict; ``make(passed, reason)`` a verdict with
        the command's output."""
        from ..junitreport import ReportError, judge, read
        from ..ledger import open_ledger

        base = baseline.of_task(open_ledger(self.config), self.task.id, self.idx)
        base_report = base.junit() if base is not None else None
        if base_report is None:
            why = "no baseline" if base is None else f"no report on the base ({base.report_error or 'none'})"
            return replace(plain, reason=f"{plain.reason}; junit: {why}, judged by the exit code")
        try:
            now = read(self.report_path)
        except ReportError as e:
            return replace(plain, reason=f"{plain.reason}; junit: {e}, judged by the exit code")
        must = self.verifier.extra.get("must_pass") or []
        j = judge(
            base_report, now, [str(t) for t in must], removes_tests=self.task.spec.extra.get("removes_tests") is True
        )
        ids = self.rerun_ids(j)
        if ids:
            self.pending = (j, plain, ids)
        return self.finish(j, plain, make)

    def finish(self, j: Judgement, plain: Verdict, make: Any, note: str = "") -> Verdict:
        from ..ledger import open_ledger

        baseline.store_tests(open_ledger(self.config), self.task.id, {"verifier": self.verifier.label, **j.to_json()})
        verdict = make(j.passed, f"{j.summary()} ({plain.reason}{note})")
        details = j.details_for_retry()
        if details:
            verdict = replace(verdict, output=with_details(details, verdict.output))
        return verdict

    # -- flaky tests: a new failure is run once more, by name (pytest's node id) ------

    def rerun_ids(self, j: Judgement) -> dict[str, str]:
        """Each new failure's pytest node id, when the verifier runs pytest and may
        re-run (``flaky_rerun``, default true); a test with no file found is left out."""
        from ..junitreport import node_id

        if self.verifier.extra.get("flaky_rerun") is False or not j.new or rerun_command(self.verifier.text) is None:
            return {}
        found = {k: node_id(k, self.cwd) for k in j.new}
        return {k: nid for k, nid in found.items() if nid is not None}

    def start_rerun(self, handle: RunHandle) -> Optional[RunHandle]:
        assert self.pending is not None
        cmd = rerun_command(self.verifier.text)
        if cmd is None:
            self.pending = None
            return None
        self.rerun_xml = handle.out_path.with_name(f"{handle.out_path.stem}-rerun.xml")
        ids = sorted(self.pending[2].values())
        text = shlex.join([*cmd, "-q", "-p", "no:cacheprovider", f"--junitxml={self.rerun_xml}", *ids])
        spec = VerifySpec(
            kind="run", text=text, timeout_s=self.verifier.timeout_s, name=f"{self.verifier.label} (re-run)"
        )
        return RunHandle(
            spec,
            handle.cwd,
            handle.out_path.with_name(f"{handle.out_path.stem}-rerun.out"),
            handle.env,
            root=handle.root,
            max_bytes=handle.max_bytes,
            start=handle.start,
        )

    def after_rerun(self, make: Any) -> Verdict:
        """The verdict once the re-run has ended: a new failure that passed when run
        again is flaky, not the task's failure."""
        from ..junitreport import PASSED, ReportError, read

        assert self.pending is not None
        j, plain, _ids = self.pending
        self.pending = None
        note = ""
        try:
            again = read(self.rerun_xml)
        except ReportError as e:
            again, note = None, f"; the re-run's report: {e}"
        if again is not None:
            for k in list(j.new):
                if again.outcomes.get(k) == PASSED:
                    j.flaky.append(k)
                    del j.new[k]
        return self.finish(j, plain, make, note)


def rerun_command(text: str) -> Optional[list[str]]:
    """How to run the verifier's pytest again by node id: ``PY -m pytest`` or
    ``pytest`` as its command says it (after a ``&&``, a ``cd``...), or None when it
    runs no pytest that can be named (another runner: no re-run)."""
    try:
        words = shlex.split(text)
    except ValueError:
        return None
    for i, w in enumerate(words):
        if w == "pytest" and i >= 2 and words[i - 1] == "-m" and not any(c in words[i - 2] for c in "$`;&|"):
            return [words[i - 2], "-m", "pytest"]
        if os.path.basename(w) in ("pytest", "py.test") and (i == 0 or words[i - 1] in ("&&", ";", "||")):
            return [w]
    return None

"""``fleeter``: a pytest plugin for testing fleetrun and fleetrun plugins.

Like pytest's ``pytester``: enable it with ``pytest_plugins = ["fleetrun.fleeter"]`` in
a ``conftest.py``, then use the ``fleeter`` fixture to make a tmp git repository,
write a tasks file and a ``fleetconf.py``, run fleetrun in-process (``run``) or as
a subprocess (``runsub``) or on a terminal (``spawn``), and assert on exit codes,
printed lines, the hooks called and the outcomes in the ledger::

    def test_my_plugin(fleeter, fake_claude):
        fleeter.make_repo()
        fleeter.write_tasks('''
            [[task]]
            name = "a"
            cwd = "repo"
            prompt = "..."
        ''')
        fake_claude.script(a=[{"actions": [["write", "a.txt", "a"], ["commit", "a"]]}])
        result = fleeter.inline_run("tasks.toml", plugins=[MyPlugin()])
        result.assert_outcomes(done=1)
        last = result.hooks.getcalls("fleetrun_transition")[-1]
        assert (last.task.name, last.to_state) == ("a", "DONE")

What pytester does for pytest, fleeter does for fleetrun: every in-process run puts
``sys.modules`` and ``sys.path`` back as they were (a ``fleetconf.py`` and its
neighbours do not leak into the next run), installed plugins are not autoloaded unless
the test says so (:meth:`Fleeter.enable_plugin_autoload`), and the ``fake_claude``
fixture stands in for the Claude Code CLI.
"""

from __future__ import annotations

import fnmatch
import io
import json
import os
import shlex
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Sequence

import pytest

from .testing.recorder import HookRecorder, RecorderPlugin, SysModulesSnapshot, SysPathsSnapshot

if TYPE_CHECKING:
    import pexpect

GIT_ENV = {
    "GIT_AUTHOR_NAME": "fleeter",
    "GIT_AUTHOR_EMAIL": "fleeter@example.invalid",
    "GIT_COMMITTER_NAME": "fleeter",
    "GIT_COMMITTER_EMAIL": "fleeter@example.invalid",
    "GIT_CONFIG_NOSYSTEM": "1",
}


#: The outcomes ``assert_outcomes`` always compares (0 unless given), as pytester
#: always compares passed/failed/skipped; the other states only when given.
MAIN_OUTCOMES = ("done", "needs_human", "cancelled")
STATES = ("pending", "ready", "assigned", "running", "verifying", "retrying", "resuming", *MAIN_OUTCOMES)


class RunResult:
    """What a fleetrun run returned and printed, the tasks in the ledger when it
    ended and, for :meth:`Fleeter.inline_run`, the hooks it called.

    :ivar ret: the exit code.
    :ivar tasks: ``(name, state, reason)`` of every task in the ledger when the run
        ended, in the order they were queued (a fleeter's ledger starts empty for
        each test).
    :ivar hooks: a :class:`~fleetrun.testing.recorder.HookRecorder` (empty unless the
        run recorded).
    """

    def __init__(
        self,
        ret: int,
        stdout: str,
        stderr: str,
        duration: float,
        tasks: Optional[list[tuple[str, str, str]]] = None,
        ledger_error: str = "",
        hooks: Optional[HookRecorder] = None,
    ) -> None:
        self.ret = ret
        self.stdout = stdout
        self.stderr = stderr
        self.outlines = stdout.splitlines()
        self.errlines = stderr.splitlines()
        self.duration = duration
        self.tasks = tasks or []
        self._ledger_error = ledger_error
        self.hooks = hooks if hooks is not None else HookRecorder()

    def outcomes(self) -> dict[str, int]:
        """How many tasks ended the run in each state: ``{"done": 2, "needs_human":
        1}`` (lower-case state names; states with no task are left out).

        :raises AssertionError: the ledger could not be read.
        """
        if self._ledger_error:
            raise AssertionError(f"cannot read the ledger after the run: {self._ledger_error}")
        out: dict[str, int] = {}
        for _name, state, _reason in self.tasks:
            out[state.lower()] = out.get(state.lower(), 0) + 1
        return out

    def assert_outcomes(self, done: int = 0, needs_human: int = 0, cancelled: int = 0, **states: int) -> None:
        """Assert how many tasks ended the run DONE, NEEDS_HUMAN and CANCELLED (each 0
        unless given) and, when given, in any other state (``ready=1``, ``pending=0``).

        :raises AssertionError: with each count that differs and every task's state and
            reason.
        """
        unknown = sorted(set(states) - set(STATES))
        if unknown:
            raise TypeError(f"assert_outcomes: no such state: {', '.join(unknown)} (states: {', '.join(STATES)})")
        expected = {"done": done, "needs_human": needs_human, "cancelled": cancelled, **states}
        got = self.outcomes()
        diff = [f"  {k}: expected {v}, got {got.get(k, 0)}" for k, v in expected.items() if got.get(k, 0) != v]
        if diff:
            tasks = [f"  {name} {state}" + (f" ({reason})" if reason else "") for name, state, reason in self.tasks]
            raise AssertionError(
                "outcomes differ:\n"
                + "\n".join(diff)
                + "\ntasks in the ledger:\n"
                + ("\n".join(tasks) or "  (none)")
                + f"\nexit code {self.ret}"
            )

    def __repr__(self) -> str:
        return f"<RunResult ret={self.ret} stdout={len(self.outlines)} lines stderr={len(self.errlines)} lines>"

    def fnmatch_lines(self, patterns: Sequence[str], stream: str = "any") -> None:
        """Each pattern (fnmatch) must match a line, in order, in stdout and/or stderr."""
        lines = {"out": self.outlines, "err": self.errlines, "any": self.outlines + self.errlines}[stream]
        i = 0
        for pat in patterns:
            while i < len(lines) and not fnmatch.fnmatch(lines[i], pat):
                i += 1
            if i == len(lines):
                raise AssertionError(f"no line matches {pat!r} (in order); output was:\n" + "\n".join(lines))
            i += 1

    def no_fnmatch_line(self, pattern: str) -> None:
        for line in self.outlines + self.errlines:
            if fnmatch.fnmatch(line, pattern):
                raise AssertionError(f"line {line!r} matches {pattern!r}")


#: A command agent, ``echo``, for tasks that need no model: it prints ``hi`` and exits 0
#: (``{python}`` is this interpreter, as in any tasks file). Put it before the tasks of
#: :func:`echo_task` in a tasks file.
ECHO_AGENT = """
[agents.echo]
command = ["{python}", "-c", "print('hi')"]
"""


def echo_task(name: str, verify: Optional[str] = None, **keys: Any) -> str:
    """A ``[[task]]`` table done by :data:`ECHO_AGENT`'s ``echo`` agent in the tasks file's
    folder (``prompt = "p"``, ``cwd = "."``): the smallest task that runs to an end,
    with no model and no git repository.

    :param name: the task's name.
    :param verify: a ``run`` verifier's command, if any.
    :param keys: more keys of the task (or others for ``prompt``, ``cwd``, ``agent``),
        as Python values: strings, numbers, booleans and lists of them.
    :return: the table's TOML text, to follow :data:`ECHO_AGENT`::

        fleeter.write_tasks(ECHO_AGENT + echo_task("ok", verify="true") + echo_task("bad", max_retries=0))
    """
    fields = {"name": name, "prompt": "p", "cwd": ".", "agent": "echo", **keys}
    text = "\n[[task]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in fields.items())
    if verify is not None:
        text += f"  [[task.verify]]\n  run = {json.dumps(verify)}\n"
    return text


def read_tasks(db: Path) -> tuple[list[tuple[str, str, str]], str]:
    """``(name, state, reason)`` of each task in the ledger ``db`` (none if it does not
    exist), read-only, and an error text if it cannot be read.

    :param db: the ledger's ``state.db``.
    """
    if not db.exists():
        return [], ""
    try:
        # read-only and without fleetrun's Ledger: looking must not migrate or repair
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
        try:
            rows = conn.execute("SELECT name, state, reason FROM tasks ORDER BY created, seq").fetchall()
        finally:
            conn.close()
    except sqlite3.Error as e:
        return [], f"{db}: {e}"
    return [(str(n), str(s), str(r or "")) for n, s, r in rows], ""


class Fleeter:
    """A tmp workspace for one test: ``path`` (files), ``home`` (FLEETRUN_HOME).

    Installed plugins are not autoloaded (``FLEETRUN_DISABLE_PLUGIN_AUTOLOAD=1``), so
    what is pip-installed on the machine running the tests does not change them; a
    test of autoloading calls :meth:`enable_plugin_autoload`.
    """

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.root = tmp_path
        self.path = tmp_path / "w"
        self.path.mkdir()
        self.home = tmp_path / "h"
        self.monkeypatch = monkeypatch
        monkeypatch.setenv("FLEETRUN_HOME", str(self.home))
        monkeypatch.delenv("FLEETRUN_PLUGINS", raising=False)
        monkeypatch.setenv("FLEETRUN_DISABLE_PLUGIN_AUTOLOAD", "1")
        for k, v in GIT_ENV.items():
            monkeypatch.setenv(k, v)
        monkeypatch.chdir(self.path)
        self._ledgers: list[Any] = []
        self._children: list[Any] = []
        self._logfiles: list[Any] = []
        # what the test itself imports from its tmp folder is forgotten at teardown too
        self._paths = SysPathsSnapshot()
        self._modules = SysModulesSnapshot(self._keeper(self._paths))

    def enable_plugin_autoload(self) -> None:
        """Load installed plugins (entry-point group ``fleetrun``) in this test's runs,
        as fleetrun does outside tests."""
        self.monkeypatch.delenv("FLEETRUN_DISABLE_PLUGIN_AUTOLOAD", raising=False)

    # -- files -------------------------------------------------------------------------

    def git(self, cwd: Path, *args: str) -> str:
        proc = subprocess.run(
            ["git", "-C", str(cwd), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, **GIT_ENV),
            check=False,
        )
        if proc.returncode != 0:
            raise AssertionError(f"git {' '.join(args)} failed: {proc.stdout.decode()}")
        return proc.stdout.decode()

    def make_repo(self, name: str = "repo", files: Optional[dict[str, str]] = None, branch: str = "main") -> Path:
        """A git repository with one commit on ``branch``."""
        repo = self.path / name
        repo.mkdir(parents=True, exist_ok=True)
        self.git(repo, "init", "-q")
        self.git(repo, "symbolic-ref", "HEAD", f"refs/heads/{branch}")
        for rel, text in (files or {"README.md": "hello\n"}).items():
            p = repo / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
        self.git(repo, "add", "-A")
        self.git(repo, "commit", "-q", "-m", "initial")
        return repo

    def git_first_on_path(self, script: str) -> Path:
        """Put first on PATH, for the rest of the test, a ``git`` made from ``script``: a
        shell script in which ``{flags}`` is a folder the script and the test share and
        ``{git}`` the real git (a wrapper that fails, waits or kills at a chosen
        command, then runs the real one). Every ``git`` fleetrun runs, and this
        fixture's own, goes through it. :return: the flags folder."""
        flags = self.path / "flags"
        flags.mkdir(exist_ok=True)
        bindir = self.path / "bin"
        bindir.mkdir(exist_ok=True)
        real = shutil.which("git")
        assert real, "git is not on PATH"
        wrapper = bindir / "git"
        wrapper.write_text(script.format(flags=flags, git=real))
        wrapper.chmod(0o755)
        self.monkeypatch.setenv("PATH", f"{bindir}:{Path(real).parent}:{os.environ['PATH']}")
        return flags

    def write(self, rel: str, text: str) -> Path:
        p = self.path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text).lstrip("\n"))
        return p

    def write_tasks(self, text: str, name: str = "tasks.toml") -> Path:
        return self.write(name, text)

    def write_fleetconf(self, text: str, folder: str = ".") -> Path:
        return self.write(os.path.join(folder, "fleetconf.py"), text)

    def write_config(self, text: str) -> Path:
        self.home.mkdir(parents=True, exist_ok=True)
        p = self.home / "config.toml"
        p.write_text(textwrap.dedent(text).lstrip("\n"))
        return p

    def write_policy(self, text: str) -> Path:
        self.home.mkdir(parents=True, exist_ok=True)
        p = self.home / "policy.toml"
        p.write_text(textwrap.dedent(text).lstrip("\n"))
        return p

    # -- running -------------------------------------------------------------------------

    def _keeper(self, paths: SysPathsSnapshot) -> Callable[[str, Any], bool]:
        """Which modules imported since ``paths`` was taken stay imported: fleetrun's own
        lazy imports, the stdlib's and installed packages' do; a ``fleetconf.py``, the
        modules it imports from its folder (which it puts on ``sys.path``) and anything
        else from this test's tmp folder do not."""

        def keep(name: str, mod: Any) -> bool:
            if name.startswith("fleetconf_"):
                return False
            added = [p for p in sys.path if p not in paths.path]
            roots = [str(self.root), *(os.path.abspath(p or os.curdir) for p in added)]
            files = [getattr(mod, "__file__", None), *(getattr(mod, "__path__", None) or [])]
            return not any(str(f).startswith(r.rstrip(os.sep) + os.sep) for f in files if f for r in roots)

        return keep

    def run(self, *args: str, plugins: Optional[list[Any]] = None, record: bool = False) -> RunResult:
        """Run fleetrun in this process (a fresh plugin manager, as always).

        ``sys.modules`` and ``sys.path`` are put back afterwards, as pytester does: a
        ``fleetconf.py`` imported in one run is imported afresh by the next.

        :param args: the command line, without ``fleetrun``.
        :param plugins: plugin objects or ``-p`` names to register, as
            :func:`fleetrun.main` takes them.
        :param record: record every hook call from ``fleetrun_configure`` on into
            ``result.hooks`` (:meth:`inline_run` is ``run(..., record=True)``).
        """
        from fleetrun.cli import main

        recorder = HookRecorder()
        if record:
            plugins = [*(plugins or ()), RecorderPlugin(recorder)]
        out, err = io.StringIO(), io.StringIO()
        paths = SysPathsSnapshot()
        modules = SysModulesSnapshot(self._keeper(paths))
        start = time.time()
        try:
            ret = main(list(args), plugins=plugins, stdout=out, stderr=err)
        finally:
            recorder.finish_recording()
            modules.restore()
            paths.restore()
        duration = time.time() - start
        return RunResult(int(ret), out.getvalue(), err.getvalue(), duration, *self._tasks(), hooks=recorder)

    def inline_run(self, *args: str, plugins: Optional[list[Any]] = None) -> RunResult:
        """:meth:`run` with the hook calls recorded: ``result.hooks.getcalls(...)``."""
        return self.run(*args, plugins=plugins, record=True)

    def _tasks(self) -> tuple[list[tuple[str, str, str]], str]:
        return read_tasks(self.home / "state.db")

    def runsub(
        self, *args: str, timeout: float = 120, env: Optional[dict[str, str]] = None, input: Optional[str] = None
    ) -> RunResult:
        """Run ``python -m fleetrun`` as a subprocess."""
        start = time.time()
        proc = subprocess.run(
            [sys.executable, "-m", "fleetrun", *args],
            capture_output=True,
            env=dict(os.environ, **(env or {})),
            timeout=timeout,
            input=input.encode() if input is not None else None,
            stdin=None if input is not None else subprocess.DEVNULL,
        )
        return RunResult(
            proc.returncode,
            proc.stdout.decode(errors="replace"),
            proc.stderr.decode(errors="replace"),
            time.time() - start,
            *self._tasks(),
        )

    def spawn(
        self,
        *args: str,
        env: Optional[dict[str, str]] = None,
        timeout: float = 60.0,
        dimensions: tuple[int, int] = (24, 200),
    ) -> pexpect.spawn:
        """Start ``python -m fleetrun`` on a real terminal (a pty), through pexpect, as
        pytester's ``spawn`` does: for what only a terminal shows (colour, live lines).

        The child's output also goes to ``spawn.out`` beside :attr:`path`; a child
        still running at the end of the test is killed.

        :param env: variables to add to the environment.
        :param timeout: pexpect's default timeout for ``expect``, seconds.
        :param dimensions: the terminal's (rows, columns).
        :return: a ``pexpect.spawn`` (bytes): ``child.expect(pexpect.EOF)``,
            ``child.before``, ``child.wait()`` or ``child.close()`` then ``child.exitstatus``.
        """
        pexpect = pytest.importorskip("pexpect")
        logfile = open(self.root / "spawn.out", "ab")  # noqa: SIM115 - closed at teardown
        self._logfiles.append(logfile)
        child = pexpect.spawn(
            sys.executable,
            ["-m", "fleetrun", *args],
            cwd=str(self.path),
            env=dict(os.environ, **(env or {})),
            timeout=timeout,
            logfile=logfile,
            dimensions=dimensions,
        )
        self._children.append(child)
        return child

    def popen(self, *args: str, env: Optional[dict[str, str]] = None) -> subprocess.Popen[bytes]:
        """Start ``python -m fleetrun`` in the background (the caller waits or kills it)."""
        return subprocess.Popen(
            [sys.executable, "-m", "fleetrun", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            env=dict(os.environ, **(env or {})),
        )

    # -- the ledger ----------------------------------------------------------------------

    def ledger(self) -> Any:
        from fleetrun.ledger import Ledger

        led = Ledger(self.home / "state.db")
        self._ledgers.append(led)
        return led

    def task(self, name: str) -> Any:
        t = self.ledger().find(name)
        assert t is not None, f"no task {name!r} in the ledger"
        return t

    def states(self) -> dict[str, str]:
        return {t.name: t.state.value for t in self.ledger().tasks()}

    def close(self) -> None:
        for led in self._ledgers:
            led.close()
        self._ledgers.clear()
        for child in self._children:
            if child.isalive():
                child.terminate(force=True)
            child.close()
        self._children.clear()
        for f in self._logfiles:
            f.close()
        self._logfiles.clear()
        self._modules.restore()
        self._paths.restore()


def whole_call(line: str) -> Optional[dict[str, Any]]:
    """One line of the fake's log, or None for one it could not finish: a fake killed,
    or a full disk, part-way through its append leaves a cut-short line that the next
    fake's line follows (the soak does both)."""
    try:
        call = json.loads(line)
    except ValueError:
        return None
    return call if isinstance(call, dict) else None


class FakeClaude:
    """Points fleetrun at the fake Claude Code CLI (:mod:`fleetrun.testing.fake_claude`)
    and scripts what it does, step by step, per task.

    The fake is put first on PATH as ``claude`` and named in ``config.toml``
    (``[claude] executable``); a test that writes its own ``config.toml`` names
    :attr:`executable` itself. See the fake's docstring for the steps it acts out.

    :ivar executable: the ``claude`` launcher this fixture wrote.
    :ivar log_path: the fake's log, one JSON line per invocation.
    """

    def __init__(self, fleeter: Fleeter, monkeypatch: pytest.MonkeyPatch) -> None:
        from .testing import fake_claude

        self.dir = fleeter.path.parent / "fake"
        self.dir.mkdir(exist_ok=True)
        self.scenario_path = self.dir / "scenario.json"
        self.log_path = self.dir / "calls.ndjson"
        self.scenario_path.write_text("{}")
        # a launcher, not the module file itself: a package's files need not keep their
        # executable bit when installed, and this interpreter is the one with fleetrun
        bindir = self.dir / "bin"
        bindir.mkdir(exist_ok=True)
        self.executable = bindir / "claude"
        # the package's folder, run by path (its __main__.py): fleetrun need not be importable
        self.executable.write_text(
            f"#!/bin/sh\nexec {shlex.quote(sys.executable)} "
            f'{shlex.quote(str(Path(fake_claude.__file__).parent))} "$@"\n'
        )
        self.executable.chmod(0o755)
        monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
        monkeypatch.setenv("FAKE_CLAUDE_SCENARIO", str(self.scenario_path))
        monkeypatch.setenv("FAKE_CLAUDE_STATE", str(self.dir))
        monkeypatch.setenv("FAKE_CLAUDE_LOG", str(self.log_path))
        # the fake reads user settings (and their hooks) like the real CLI: never the developer's own
        (self.dir / "claude-config").mkdir(exist_ok=True)
        monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(self.dir / "claude-config"))
        # a deliberate sandbox, as the real CLI knows one: run as root (tests often are),
        # it would refuse bypassPermissions otherwise (a test of that refusal unsets it)
        monkeypatch.setenv("IS_SANDBOX", "1")
        fleeter.write_config(f'[claude]\nexecutable = "{self.executable}"\n')

    def script(self, **steps: list[dict[str, Any]]) -> None:
        """``script(**{"task-name": [step1, step2]})``: attempt n acts out step n; the
        key ``"default"`` is for tasks with no key of their own, ``"NAME:review"`` for
        an agent verifier of task NAME."""
        data = json.loads(self.scenario_path.read_text())
        data.update(steps)
        self.scenario_path.write_text(json.dumps(data))

    def _log(self) -> list[dict[str, Any]]:
        if not self.log_path.exists():
            return []
        # whole lines only: the fake may be half-way through appending one while a test polls
        text = self.log_path.read_text(errors="replace")
        return [c for c in map(whole_call, text[: text.rfind("\n") + 1].splitlines()) if c is not None]

    def calls(self, key: Optional[str] = None) -> list[dict[str, Any]]:
        """The agent sessions started (reviewers aside: :meth:`review_calls`), of task
        ``key`` or of all tasks: argv, prompt, cwd, FLEETRUN_* env..."""
        calls = [c for c in self._log() if "FLEETRUN_VERIFIER" not in c.get("env", {})]
        return [c for c in calls if key is None or c.get("env", {}).get("FLEETRUN_TASK_NAME") == key]

    def review_calls(self, key: Optional[str] = None) -> list[dict[str, Any]]:
        """The agent verifiers' sessions, of task ``key`` or of all tasks."""
        return [
            c
            for c in self._log()
            if "FLEETRUN_VERIFIER" in c.get("env", {}) and (key is None or c["env"].get("FLEETRUN_TASK_NAME") == key)
        ]


@pytest.fixture
def fleeter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Fleeter]:
    """A :class:`Fleeter` for this test."""
    f = Fleeter(tmp_path, monkeypatch)
    yield f
    f.close()


@pytest.fixture
def fake_claude(fleeter: Fleeter, monkeypatch: pytest.MonkeyPatch) -> FakeClaude:
    """A :class:`FakeClaude`: ``claude`` is the fake, scripted with ``script(...)``."""
    return FakeClaude(fleeter, monkeypatch)

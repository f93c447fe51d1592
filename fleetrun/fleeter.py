"""``fleeter``: a pytest plugin for testing fleetrun and fleetrun plugins.

Like pytest's ``pytester``: enable it with ``pytest_plugins = ["fleetrun.fleeter"]`` in
a ``conftest.py``, then use the ``fleeter`` fixture to make a tmp git repository,
write a tasks file and a ``fleetconf.py``, run fleetrun in-process (``run``) or as
a subprocess (``runsub``), and assert on exit codes, printed lines and the ledger::

    def test_my_plugin(fleeter):
        repo = fleeter.make_repo()
        fleeter.write_tasks('''
            [[task]]
            name = "a"
            cwd = "repo"
            prompt = "..."
        ''')
        result = fleeter.run("validate")
        assert result.ret == 0
        result.fnmatch_lines(["*1 task, valid*"])
"""

from __future__ import annotations

import fnmatch
import io
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import pytest

GIT_ENV = {
    "GIT_AUTHOR_NAME": "fleeter",
    "GIT_AUTHOR_EMAIL": "fleeter@example.invalid",
    "GIT_COMMITTER_NAME": "fleeter",
    "GIT_COMMITTER_EMAIL": "fleeter@example.invalid",
    "GIT_CONFIG_NOSYSTEM": "1",
}


class RunResult:
    """What a fleetrun run returned and printed."""

    def __init__(self, ret: int, stdout: str, stderr: str, duration: float) -> None:
        self.ret = ret
        self.stdout = stdout
        self.stderr = stderr
        self.outlines = stdout.splitlines()
        self.errlines = stderr.splitlines()
        self.duration = duration

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
                raise AssertionError(f"no line matches {pat!r} (in order); output was:\n"
                                     + "\n".join(lines))
            i += 1

    def no_fnmatch_line(self, pattern: str) -> None:
        for line in self.outlines + self.errlines:
            if fnmatch.fnmatch(line, pattern):
                raise AssertionError(f"line {line!r} matches {pattern!r}")


class Fleeter:
    """A tmp workspace for one test: ``path`` (files), ``home`` (FLEETRUN_HOME)."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.path = tmp_path / "w"
        self.path.mkdir()
        self.home = tmp_path / "h"
        self.monkeypatch = monkeypatch
        monkeypatch.setenv("FLEETRUN_HOME", str(self.home))
        monkeypatch.delenv("FLEETRUN_PLUGINS", raising=False)
        for k, v in GIT_ENV.items():
            monkeypatch.setenv(k, v)
        monkeypatch.chdir(self.path)
        self._ledgers: list[Any] = []

    # -- files -------------------------------------------------------------------------

    def git(self, cwd: Path, *args: str) -> str:
        proc = subprocess.run(["git", "-C", str(cwd), *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              env=dict(os.environ, **GIT_ENV), check=False)
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

    def run(self, *args: str, plugins: Optional[list[Any]] = None) -> RunResult:
        """Run fleetrun in this process (a fresh plugin manager, as always)."""
        from fleetrun.cli import main

        out, err = io.StringIO(), io.StringIO()
        start = time.time()
        ret = main(list(args), plugins=plugins, stdout=out, stderr=err)
        return RunResult(int(ret), out.getvalue(), err.getvalue(), time.time() - start)

    def runsub(self, *args: str, timeout: float = 120, env: Optional[dict[str, str]] = None,
               input: Optional[str] = None) -> RunResult:
        """Run ``python -m fleetrun`` as a subprocess."""
        start = time.time()
        proc = subprocess.run([sys.executable, "-m", "fleetrun", *args], capture_output=True,
                              env=dict(os.environ, **(env or {})), timeout=timeout,
                              input=input.encode() if input is not None else None,
                              stdin=None if input is not None else subprocess.DEVNULL)
        return RunResult(proc.returncode, proc.stdout.decode(errors="replace"),
                         proc.stderr.decode(errors="replace"), time.time() - start)

    def popen(self, *args: str, env: Optional[dict[str, str]] = None) -> subprocess.Popen[bytes]:
        """Start ``python -m fleetrun`` in the background (the caller waits or kills it)."""
        return subprocess.Popen([sys.executable, "-m", "fleetrun", *args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                env=dict(os.environ, **(env or {})))

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


@pytest.fixture
def fleeter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A :class:`Fleeter` for this test."""
    f = Fleeter(tmp_path, monkeypatch)
    yield f
    f.close()

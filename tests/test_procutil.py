"""The public helpers a command verifier needs: ``fleetrun.task_env`` and
``fleetrun.ProcessHandle``, as docs/plugins.md ("Running processes from a plugin") shows."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional

import pytest

import fleetrun
from fleetrun import ProcessHandle, Verdict, Workspace, task_env
from fleetrun.hosts import LocalHost, child_record
from fleetrun.osutil import proc_token
from fleetrun.procutil import CappedStart, ForkedWrapper

TASK = SimpleNamespace(id="task_1", name="schema")
ATTEMPT = SimpleNamespace(number=3)


def test_they_are_public() -> None:
    assert {"ProcessHandle", "task_env"} <= set(fleetrun.__all__)


def test_task_env_adds_fleetruns_variables_to_its_own_environment() -> None:
    env = task_env(TASK, ATTEMPT, Workspace(path="/w"), FLEETRUN_VERIFIER="agent")  # type: ignore[arg-type]
    assert env["PATH"] == os.environ["PATH"]
    assert {k: env[k] for k in env if k.startswith("FLEETRUN_")}.items() >= {
        "FLEETRUN_TASK_ID": "task_1",
        "FLEETRUN_TASK_NAME": "schema",
        "FLEETRUN_ATTEMPT": "3",
        "FLEETRUN_WORKTREE": "/w",
        "FLEETRUN_VERIFIER": "agent",
    }.items()


def test_task_env_alone_for_a_spec_file() -> None:
    """``base={}``: only fleetrun's variables (a spec file's; the rest is inherited where
    the process runs). A path does for the workspace."""
    assert task_env(TASK, ATTEMPT, "/w", base={}) == {  # type: ignore[arg-type]
        "FLEETRUN_TASK_ID": "task_1",
        "FLEETRUN_TASK_NAME": "schema",
        "FLEETRUN_ATTEMPT": "3",
        "FLEETRUN_WORKTREE": "/w",
    }
    assert task_env(TASK, ATTEMPT, "/w", base={"A": "1"}, FLEETRUN_WORKTREE="/x")["FLEETRUN_WORKTREE"] == "/x"  # type: ignore[arg-type]


class Handle(ProcessHandle):
    def cannot_start(self, error: str) -> Verdict:
        return Verdict(passed=False, kind="run", label="t", reason=f"cannot start: {error}")

    def timed_out(self) -> Verdict:
        return Verdict(passed=False, kind="run", label="t", reason="timed out")

    def ended(self, code: int) -> Verdict:
        return Verdict(passed=code == 0, kind="run", label="t", reason=f"exit code {code}")


def wait(handle: ProcessHandle, limit: float = 120.0) -> Verdict:
    end = time.monotonic() + limit
    while time.monotonic() < end:
        v: Optional[Verdict] = handle.poll()
        if v is not None:
            return v
        fd = handle.fileno()
        select.select([fd] if fd >= 0 else [], [], [], max(0.01, min(0.2, handle.next_deadline() - time.monotonic())))
    raise AssertionError("no verdict")


@pytest.fixture(params=["by path", "forked"])
def start(request: Any, tmp_path: Path) -> Iterator[Optional[CappedStart]]:
    """How the wrapper starts: by path (``python -I -S capped.py``, our child), or
    forked by a host's starter (``LocalHost.start_capped``, as the supervisor's verifiers
    are): every guarantee of the wrapper holds both ways."""
    if request.param == "by path":
        yield None
        return
    home = tmp_path / "home"
    home.mkdir()
    host = LocalHost(home, starter=True)
    yield host.start_capped
    host.close()


def started_as(h: ProcessHandle, start: Optional[CappedStart]) -> None:
    assert isinstance(h.proc, ForkedWrapper if start is not None else subprocess.Popen), h.proc


def test_a_process_handle_ends_its_whole_group_on_timeout(tmp_path: Path, start: Optional[CappedStart]) -> None:
    # the child's pid is written to a temporary name and renamed (never read half-written);
    # the timeout, far longer than the shell needs, lets it write that even on a loaded machine
    spec = SimpleNamespace(timeout_s=5.0)
    script = (
        f"sleep 60 & echo $! > {tmp_path / 'child.tmp'}; mv {tmp_path / 'child.tmp'} {tmp_path / 'child'}; "
        "trap '' TERM; sleep 60"
    )
    h = Handle(spec, ["/bin/sh", "-c", script], str(tmp_path), dict(os.environ), tmp_path / "v1.out", start=start)
    started_as(h, start)
    assert child_record(tmp_path, "v1").exists()  # recorded for a restarted loop
    v = None
    while not (tmp_path / "child").exists() and v is None:  # the timeout bounds this wait
        v = h.poll()
        time.sleep(0.02)
    assert v is None, f"timed out before the shell started its child: {v}"
    child = int((tmp_path / "child").read_text())
    v = wait(h)
    assert v.reason == "timed out"
    assert h.proc is not None and h.proc.returncode is not None  # reaped
    assert not child_record(tmp_path, "v1").exists()
    deadline = time.monotonic() + 60
    while proc_token(child) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc_token(child) is None


def test_a_process_handle_reports_its_exit(tmp_path: Path, start: Optional[CappedStart]) -> None:
    spec = SimpleNamespace(timeout_s=30)
    h = Handle(
        spec,
        [sys.executable, "-c", "print('hi'); raise SystemExit(3)"],
        str(tmp_path),
        dict(os.environ),
        tmp_path / "v1.out",
        start=start,
    )
    started_as(h, start)
    assert wait(h).reason == "exit code 3"
    assert (tmp_path / "v1.out").read_text() == "hi\n"
    h2 = Handle(spec, [str(tmp_path / "nothing")], str(tmp_path), dict(os.environ), tmp_path / "v2.out", start=start)
    assert wait(h2).reason.startswith("cannot start: ")
    # a folder that is not there: the wrapper never starts, as Popen(cwd=...) refuses
    h3 = Handle(spec, ["/bin/true"], str(tmp_path / "gone"), dict(os.environ), tmp_path / "v3.out", start=start)
    assert wait(h3).reason == "cannot start: No such file or directory"
    # ended by a signal: minus its number, whichever way the wrapper started
    h4 = Handle(
        spec, ["/bin/sh", "-c", "kill -TERM $$"], str(tmp_path), dict(os.environ), tmp_path / "v4.out", start=start
    )
    assert wait(h4).reason == "exit code -15"


def test_a_process_handle_runs_its_command_in_its_folder_with_its_input_and_nothing_of_ours_open(
    tmp_path: Path, start: Optional[CappedStart]
) -> None:
    (tmp_path / "in").write_text("the prompt")
    work = tmp_path / "work"
    work.mkdir()
    script = (
        "import os, sys; print(os.getcwd(), sys.stdin.read(), os.environ['X'], sorted(os.listdir('/proc/self/fd')))"
    )
    h = Handle(
        SimpleNamespace(timeout_s=60),
        [sys.executable, "-c", script],
        str(work),
        dict(os.environ, X="y"),
        tmp_path / "v1.out",
        stdin_path=tmp_path / "in",
        start=start,
    )
    started_as(h, start)
    assert wait(h).reason == "exit code 0"
    # 0, 1, 2 and the listing's own: not the wrapper's exit-code pipe, nor the starter's socket
    assert (tmp_path / "v1.out").read_text() == f"{work} the prompt y ['0', '1', '2', '3']\n"


def test_a_process_handle_cuts_a_flood_to_its_cap(tmp_path: Path, start: Optional[CappedStart]) -> None:
    from fleetrun.capped import read_cut

    h = Handle(
        SimpleNamespace(timeout_s=60),
        ["/bin/sh", "-c", "head -c 1000000 /dev/zero; echo THE END"],
        str(tmp_path),
        dict(os.environ),
        tmp_path / "v1.out",
        max_bytes=8192,
        start=start,
    )
    started_as(h, start)
    assert wait(h).reason == "exit code 0"
    data = (tmp_path / "v1.out").read_bytes()
    assert len(data) < 8192 + 100 and data.endswith(b"THE END\n")
    assert read_cut(str(tmp_path / "v1.out")) == (1_000_008 - 8192, 8192)
    assert h.output_cut() is not None


def test_a_wrapper_killed_before_it_could_say_how_its_command_ended_is_killed_by_sigkill(
    tmp_path: Path, start: Optional[CappedStart]
) -> None:
    # the command SIGKILLs its wrapper (as the OOM killer would): a forked one writes no
    # exit code, and the pipe's end reads as what Popen would report, -9
    h = Handle(
        SimpleNamespace(timeout_s=60),
        ["/bin/sh", "-c", "kill -KILL $PPID"],
        str(tmp_path),
        dict(os.environ),
        tmp_path / "v1.out",
        start=start,
    )
    started_as(h, start)
    assert wait(h).reason == "exit code -9"


def test_a_verifier_keeps_its_exit_code_when_the_starter_that_forked_it_dies(tmp_path: Path) -> None:
    # the command SIGKILLs the starter (its wrapper's parent) and exits 3: its exit code
    # still comes, through the pipe only its wrapper held; the next one starts by path
    home = tmp_path / "home"
    home.mkdir()
    err = tmp_path / "err"
    with open(err, "w") as f:
        host = LocalHost(home, starter=True, err=f)
        try:
            spec = SimpleNamespace(timeout_s=60)
            script = 'kill -KILL "$(cut -d" " -f4 /proc/$PPID/stat)"; exit 3'
            h = Handle(
                spec,
                ["/bin/sh", "-c", script],
                str(tmp_path),
                dict(os.environ),
                tmp_path / "v1.out",
                start=host.start_capped,
            )
            starter = host._starter
            assert isinstance(h.proc, ForkedWrapper) and starter is not None
            assert wait(h).reason == "exit code 3"
            deadline = time.monotonic() + 120  # a SIGKILL is sent at once, not its end
            while proc_token(starter.pid) is not None and time.monotonic() < deadline:
                time.sleep(0.01)
            assert proc_token(starter.pid) is None  # it was the starter that died
            for name in ("v2", "v3"):
                h2 = Handle(
                    spec,
                    ["/bin/true"],
                    str(tmp_path),
                    dict(os.environ),
                    tmp_path / f"{name}.out",
                    start=host.start_capped,
                )
                assert isinstance(h2.proc, subprocess.Popen)
                assert wait(h2).reason == "exit code 0"
        finally:
            host.close()
    assert err.read_text().count("the shepherd starter is gone") == 1, err.read_text()


def docs_example(name: str) -> str:
    """The python block of docs/plugins.md that starts with ``# NAME``."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "plugins.md").read_text()
    start = text.index(f"```python\n# {name}\n") + len("```python\n")
    return text[start : text.index("```", start)]


def test_the_docs_lint_verifier_runs(fleeter: Any, fake_claude: Any, monkeypatch: Any) -> None:
    """docs/plugins.md's "Running processes from a plugin" example, as a fleetconf.py."""
    bin_dir = fleeter.path / "bin"
    bin_dir.mkdir()
    ruff = bin_dir / "ruff"
    ruff.write_text(
        '#!/bin/sh\necho "$FLEETRUN_VERIFIER $FLEETRUN_TASK_NAME $FLEETRUN_ATTEMPT $*"\n'
        '[ -f "$FLEETRUN_WORKTREE/ok" ]\n'
    )
    ruff.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    fleeter.make_repo()
    fleeter.write_fleetconf(docs_example("fleetrun_lint.py"))
    fleeter.write_tasks("""
        [[task]]
        name = "a"
        cwd = "repo"
        prompt = "make it lint"
        max_retries = 1

        [[task.verify]]
        lint = "src tests"
    """)
    fake_claude.script(
        a=[
            {"actions": [["write", "x.txt", "x"], ["commit", "x"]]},
            {"actions": [["write", "ok", ""], ["commit", "ok"]]},
        ]
    )
    result = fleeter.inline_run("tasks.toml")
    result.assert_outcomes(done=1)
    verdicts = [c.verdict for c in result.hooks.getcalls("fleetrun_verdict")]
    assert [(v.kind, v.passed, v.reason) for v in verdicts] == [
        ("lint", False, "exit code 1"),
        ("lint", True, "exit code 0"),
    ]
    assert verdicts[0].output == "lint a 1 check src tests\n"
    assert verdicts[1].output == "lint a 2 check src tests\n"


def test_a_verifier_started_but_not_yet_recorded_is_still_ended_after_a_crash(tmp_path: Path) -> None:
    """The supervisor is SIGKILLed after starting a verifier and before recording its pid:
    the record written before the start names a marker in the verifier's environment,
    and a restarted supervisor finds the process by it (the orphan ran on next to its
    rerun: test_adoption's orphaned verifier test, under load)."""
    from fleetrun.hosts import kill_recorded_children, record_child_intent

    marker = record_child_intent(tmp_path, "v1")
    env = dict(os.environ, FLEETRUN_CHILD=marker)
    stray = subprocess.Popen(["/bin/sh", "-c", "sleep 60 & sleep 60"], env=env, start_new_session=True)
    other = subprocess.Popen(["sleep", "60"], start_new_session=True)  # not ours: left alone
    try:
        assert kill_recorded_children(tmp_path) == 1
        assert stray.wait(10) == -9
        assert other.poll() is None
        assert not child_record(tmp_path, "v1").exists()
    finally:
        for p in (stray, other):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_a_process_handle_records_its_intent_before_it_starts(tmp_path: Path) -> None:
    spec = SimpleNamespace(timeout_s=30)
    h = Handle(
        spec, ["/bin/sh", "-c", 'printf %s "$FLEETRUN_CHILD"'], str(tmp_path), dict(os.environ), tmp_path / "v1.out"
    )
    wait(h)
    assert (tmp_path / "v1.out").read_text().startswith("v1-")  # the marker the record names


@pytest.mark.parametrize(
    "written, code",
    [(b"0\n", 0), (b"3\n", 3), (b"-15\n", -15), (b"", -9), (b"3", -9), (b"--5\n", -9), (b"999\n", -9), (b"x\n", -9)],
)
def test_a_forked_wrappers_exit_code_is_read_strictly(written: bytes, code: int) -> None:
    # the line the wrapper writes before the pipe's end; anything else (nothing, half a
    # line, not a code) reads as a wrapper killed, never an exception
    r, w = os.pipe()
    os.write(w, written)
    os.close(w)
    forked = ForkedWrapper(os.getpid(), r)
    try:
        assert forked.poll() == code
    finally:
        forked.close()


def test_a_childs_record_is_one_file_written_in_place(tmp_path: Path) -> None:
    # its intent and its pid are two lines of one file beside its output, not a folder
    # and two files renamed into place: each file made costs an inode (issue 24)
    from fleetrun.hosts import read_child_record, record_child, record_child_intent

    marker = record_child_intent(tmp_path, "v1")
    path = child_record(tmp_path, "v1")
    inode = path.stat().st_ino
    record_child(tmp_path, "v1", os.getpid(), marker)
    assert path.stat().st_ino == inode
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v1.child"]
    info = read_child_record(path)
    assert info == {"marker": marker, "pid": os.getpid(), "token": proc_token(os.getpid())}
    # a pid line cut short by a crash: the intent's marker still holds
    path.write_text(path.read_text().splitlines()[0] + '\n{"pid": 12')
    assert read_child_record(path) == {"marker": marker}
    # the intent written again (the verifier run again after a crash) starts a new record
    again = record_child_intent(tmp_path, "v1")
    assert read_child_record(path) == {"marker": again}


def test_a_child_recorded_by_an_older_version_is_still_ended(tmp_path: Path) -> None:
    # before issue 24 each record was children/NAME.json: a crash left by an older
    # version is still cleaned up by a restart of this one
    import json

    from fleetrun.hosts import CHILDREN, kill_recorded_children

    stray = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        old = tmp_path / CHILDREN
        old.mkdir()
        (old / "v1.json").write_text(json.dumps({"pid": stray.pid, "token": proc_token(stray.pid), "marker": None}))
        assert kill_recorded_children(tmp_path) == 1
        assert stray.wait(10) == -9
        assert not (old / "v1.json").exists()
    finally:
        if stray.poll() is None:
            stray.kill()
            stray.wait()

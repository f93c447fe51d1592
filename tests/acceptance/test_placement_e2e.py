"""End to end: policy.toml floors, a policy edited or broken while `fleetrun work`
runs, `requires` against this machine's tags and probed tools, and the measured
memory of running attempts, with the fake claude, real git and real shepherds."""

from __future__ import annotations

import fnmatch
import json
import os
import signal
import subprocess
import threading
import time
from typing import Any, Callable

import pytest

from tests.conftest import FAKE_CLAUDE

FLOOR = 100_000_000  # MB: above any machine's free memory


def tasks(fleeter: Any, *names: str, extra: str = "") -> None:
    fleeter.make_repo()
    fleeter.write_tasks(
        "\n".join(
            f'''
        [[task]]
        name = "{n}"
        cwd = "repo"
        prompt = "Write {n}.txt."
        git_ref = "main"
        {extra}
    '''
            for n in names
        )
    )


class Live:
    """``fleetrun work`` running in the background, its output read as it comes."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.lines: dict[str, list[str]] = {"out": [], "err": []}
        self.threads = [
            threading.Thread(target=self._read, args=(s, getattr(proc, f"std{s}")), daemon=True) for s in ("out", "err")
        ]
        for t in self.threads:
            t.start()

    def _read(self, stream: str, pipe: Any) -> None:
        for raw in iter(pipe.readline, b""):
            self.lines[stream].append(raw.decode(errors="replace").rstrip("\n"))

    def matching(self, pattern: str, stream: str = "out") -> list[str]:
        return [x for x in list(self.lines[stream]) if fnmatch.fnmatch(x, pattern)]

    def wait_for(self, pattern: str, stream: str = "out", timeout: float = 120) -> str:
        return until(
            lambda: (self.matching(pattern, stream) or [None])[0],
            timeout,
            f"no {stream} line matches {pattern!r}; {self.dump()}",
        )

    def dump(self) -> str:
        return "stdout:\n" + "\n".join(self.lines["out"]) + "\nstderr:\n" + "\n".join(self.lines["err"])

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            code = self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        for t in self.threads:
            t.join(timeout=5)
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()
        return code


def until(check: Callable[[], Any], timeout: float, message: str) -> Any:
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(message)


def passes(n: int = 2) -> None:
    """Let the loop run a few passes (it takes one at least every second)."""
    time.sleep(n * 1.0 + 0.2)


@pytest.fixture
def live(fleeter: Any) -> Any:
    started: list[Live] = []

    def start(*args: str) -> Live:
        lv = Live(fleeter.popen("work", *args, env={"PYTHONUNBUFFERED": "1"}))
        started.append(lv)
        return lv

    yield start
    for lv in started:
        lv.stop()


def test_memory_floor_waits_then_lowering_it_starts_the_tasks(fleeter: Any, fake_claude: Any, live: Any) -> None:
    tasks(fleeter, "t1", "t2")
    fake_claude.script(default=[{"actions": [["write", "out.txt", "x"], ["commit", "add out"]]}])
    fleeter.write_policy(f"[local]\nmin_free_mem_mb = {FLOOR}\n")
    assert fleeter.run("queue", "tasks.toml").ret == 0
    work = live()
    reason = f"this machine has * MB free; a task needs 1024 MB above the floor of {FLOOR} MB"
    work.wait_for(f"waiting: task_* (t1): {reason}")
    work.wait_for(f"waiting: task_* (t2): {reason}")
    passes()
    # said once, though free memory moves on every pass
    assert len(work.matching("waiting: *(t1)*")) == 1, work.dump()
    assert len(work.matching("waiting: *(t2)*")) == 1, work.dump()
    assert fake_claude.calls() == []
    fleeter.run("status", "--graph").fnmatch_lines([f"t1 [[]READY] task_*  {reason}"])

    fleeter.write_policy("[local]\nmin_free_mem_mb = 0\n")  # no restart
    until(lambda: fleeter.states() == {"t1": "DONE", "t2": "DONE"}, 120, f"not done: {fleeter.states()}; {work.dump()}")
    assert len(fake_claude.calls()) == 2
    assert work.stop() == 2
    assert work.lines["err"] == []


def test_a_policy_broken_while_running_keeps_the_last_good_one(fleeter: Any, fake_claude: Any, live: Any) -> None:
    tasks(fleeter, "t1")
    fake_claude.script(default=[{"actions": [["write", "out.txt", "x"], ["commit", "add out"]]}])
    policy = fleeter.write_policy(f"[local]\nmin_free_mem_mb = {FLOOR}\n")
    assert fleeter.run("queue", "tasks.toml").ret == 0
    work = live()
    work.wait_for("waiting: task_* (t1): this machine has * MB free*")

    # lowered, but with a misspelt key: the whole file is refused, the floor stays
    fleeter.write_policy("[local]\nmin_free_mem_mb = 0\nmax_taks = 2\n")
    work.wait_for("*changed and is broken; keeping the last good policy*", stream="err")
    passes()
    assert work.lines["err"] == [
        f"{policy} changed and is broken; keeping the last good policy until it is fixed:",
        f"ERROR: {policy}:3: local.max_taks: unknown key (did you mean 'max_tasks'?)",
    ]  # said once
    assert fake_claude.calls() == [] and fleeter.states() == {"t1": "READY"}

    fleeter.write_policy("[local]\nmin_free_mem_mb = 0\nmax_tasks = 2\n")
    work.wait_for("*is good again; using it", stream="err")
    until(lambda: fleeter.states() == {"t1": "DONE"}, 120, f"not done: {fleeter.states()}; {work.dump()}")
    assert work.stop() == 2
    assert len(work.lines["err"]) == 3, work.dump()


def test_requires_tags_and_probed_tools(fleeter: Any, fake_claude: Any, monkeypatch: Any) -> None:
    fleeter.make_repo()
    fleeter.write_config(f'[claude]\nexecutable = "{FAKE_CLAUDE}"\n\n[relay]\ntags = ["gpu"]\n')
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test-not-a-real-key")
    fleeter.write_tasks("""
        [[task]]
        name = "needs-nosuchtool"
        cwd = "repo"
        prompt = "p"
        git_ref = "main"
        requires = ["nosuchtool"]

        [[task]]
        name = "needs-git"
        cwd = "repo"
        prompt = "p"
        git_ref = "main"
        requires = ["git>=2", "gpu", "claude:auth", "python3"]

        [[task]]
        name = "needs-new-git"
        cwd = "repo"
        prompt = "p"
        git_ref = "main"
        requires = ["git>=999", "python>=3.11"]
    """)
    fake_claude.script(default=[{"actions": [["write", "out.txt", "x"], ["commit", "add out"]]}])

    v = fleeter.run("validate")
    assert v.ret == 0
    assert v.outlines == ["tasks.toml: 3 tasks, valid"]
    assert v.errlines == [
        "warning: tasks.toml:6: task 'needs-nosuchtool': requires: `nosuchtool` is neither a tag of this "
        "machine ([relay] tags in config.toml) nor a probed tool (claude, git, cargo, python3, node); "
        "it is never met",
        "warning: tasks.toml:20: task 'needs-new-git': requires: `python>=3.11`: `python` is neither a tag "
        "of this machine ([relay] tags in config.toml) nor a probed tool (claude, git, cargo, python3, node); "
        "it is never met",
    ]  # git>=999 may be met some day; gpu is a tag here

    r = fleeter.run("tasks.toml")
    assert r.ret == 1, r.stdout + r.stderr
    r.fnmatch_lines(["waiting: task_* (needs-nosuchtool): this machine lacks `nosuchtool`"])
    r.fnmatch_lines(["waiting: task_* (needs-new-git): this machine lacks `git>=999`, `python>=3.11`"])
    assert fleeter.states() == {"needs-nosuchtool": "READY", "needs-git": "DONE", "needs-new-git": "READY"}
    assert [c["env"]["FLEETRUN_TASK_NAME"] for c in fake_claude.calls()] == ["needs-git"]


def test_extra_tools_are_probed_and_known_to_validate(
    fleeter: Any, fake_claude: Any, tmp_path: Any, monkeypatch: Any
) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "mytool").write_text('#!/bin/sh\necho "mytool 3.1.4"\n')
    (bindir / "mytool").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    fleeter.write_config(f'[claude]\nexecutable = "{FAKE_CLAUDE}"\n\n[relay]\ntools = ["mytool"]\n')
    tasks(fleeter, "t1", extra='requires = ["mytool>=3.1"]')
    fake_claude.script(default=[{"actions": [["write", "out.txt", "x"], ["commit", "add out"]]}])
    v = fleeter.run("validate")
    assert (v.ret, v.errlines) == (0, [])
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr


def test_measured_memory_replaces_mem_per_task_mb(fleeter: Any, fake_claude: Any, monkeypatch: Any) -> None:
    """While one attempt runs, the next task's estimate is its agent's measured memory."""
    monkeypatch.setattr("fleetrun.plugins.placement.SETTLE_S", 0.0)
    record = fleeter.path / "estimates.ndjson"
    fleeter.write_fleetconf(f"""
        import json
        import fleetrun

        @fleetrun.hookimpl(tryfirst=True)
        def fleetrun_place(task, candidates, policy, config):
            with open({str(record)!r}, "a") as f:
                for c in candidates:
                    f.write(json.dumps([task.name, c.mem_per_task_mb, c.info.get("mem_estimate")]) + "\\n")
    """)
    fleeter.write_policy("[local]\nmax_tasks = 1\nmem_per_task_mb = 4321\n")
    tasks(fleeter, "t1", "t2")
    fake_claude.script(default=[{"actions": [["sleep", 1.5], ["write", "out.txt", "x"], ["commit", "add out"]]}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    seen = [json.loads(x) for x in record.read_text().splitlines()]
    assert seen[0][1:] == [4321, "mem_per_task_mb"]  # nothing measured yet
    measured = [mb for _, mb, how in seen if how == "measured"]
    assert measured, seen
    assert all(0 < mb < 4321 for mb in measured)  # the fake agent is a small python process


# -- plugin filters and scores: the built-in checks still hold -------------------------------

PREFS = """
    import json
    import fleetrun

    def note(*what):
        with open({log!r}, "a") as f:
            f.write(json.dumps(what) + "\\n")

    @fleetrun.hookimpl
    def fleetrun_place_filter(task, candidate, config):
        note("filter", task.name, candidate.name)
        if task.name == "gpu-train" and candidate.name == "local":
            return "keeps GPU tasks off (fleetconf.py)"
        return None

    @fleetrun.hookimpl
    def fleetrun_place_score(task, candidate, config):
        note("score", task.name, candidate.name)
        return 1e9  # no score makes up for a requirement that is not met
"""


def test_requires_still_hold_with_a_filter_and_a_score_loaded(fleeter: Any, fake_claude: Any) -> None:
    """Issue 12: a tagged task with ``requires = ["no-such-tool"]`` waits with the built-in
    reason even with placement plugins loaded; an untagged one is scored and runs."""
    log = fleeter.path / "place.ndjson"
    fleeter.write_fleetconf(PREFS.format(log=str(log)))
    tasks(fleeter, "plain")
    fleeter.write_tasks(
        fleeter.path.joinpath("tasks.toml").read_text()
        + """
[[task]]
name = "tagged"
cwd = "repo"
prompt = "p"
git_ref = "main"
requires = ["no-such-tool"]
"""
    )
    fake_claude.script(default=[{"actions": [["write", "out.txt", "x"], ["commit", "add out"]]}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 1, r.stdout + r.stderr
    r.fnmatch_lines(["waiting: task_* (tagged): this machine lacks `no-such-tool`"])
    r.fnmatch_lines(["cannot place: tagged: this machine lacks `no-such-tool`"])
    assert fleeter.states() == {"plain": "DONE", "tagged": "READY"}
    assert [c["env"]["FLEETRUN_TASK_NAME"] for c in fake_claude.calls()] == ["plain"]
    calls = [tuple(json.loads(x)) for x in log.read_text().splitlines()]
    assert ("filter", "plain", "local") in calls and ("score", "plain", "local") in calls
    assert not [c for c in calls if c[1] == "tagged"]  # the built-in checks come first


def test_a_filters_reason_is_the_tasks_wait(fleeter: Any, fake_claude: Any) -> None:
    log = fleeter.path / "place.ndjson"
    fleeter.write_fleetconf(PREFS.format(log=str(log)))
    tasks(fleeter, "gpu-train", "docs")
    fake_claude.script(default=[{"actions": [["write", "out.txt", "x"], ["commit", "add out"]]}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 1, r.stdout + r.stderr
    reason = "this machine keeps GPU tasks off (fleetconf.py)"
    r.fnmatch_lines([f"waiting: task_* (gpu-train): {reason}"])
    r.fnmatch_lines([f"cannot place: gpu-train: {reason}"])
    assert fleeter.states() == {"gpu-train": "READY", "docs": "DONE"}
    assert [c["env"]["FLEETRUN_TASK_NAME"] for c in fake_claude.calls()] == ["docs"]
    fleeter.run("status", "--graph").fnmatch_lines([f"gpu-train [[]READY] task_*  {reason}"])
    fleeter.run("status").fnmatch_lines([f"*gpu-train*{reason}*"])

"""A start that can never succeed goes to NEEDS_HUMAN at once, with the reason; one
that can clear by itself still backs off and tries again.

The backoff base is made tiny (a fake clock for the wait), so that on a fleetrun that
retries a permanent failure the run ends at ``never_started`` quickly and the test
fails on its assertions about the ledger, never on time.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import FAKE_CLAUDE


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("fleetrun.placement.BACKOFF_BASE_S", 0.01)


def one_task(fleeter: Any, extra: str = "") -> None:
    fleeter.make_repo()
    fleeter.write_tasks(f"""
        [[task]]
        name = "t1"
        cwd = "repo"
        prompt = "Write out.txt."
        git_ref = "main"
        {extra}
    """)


def path_between(fleeter: Any, task: Any) -> list[tuple[str, str, str]]:
    return [(tr.from_state, tr.to_state, tr.cause) for tr in fleeter.ledger().transitions(task.id)]


def assert_needs_human_at_once(fleeter: Any, r: Any, cause: str) -> Any:
    assert r.ret == 1, r.stdout + r.stderr
    task = fleeter.task("t1")
    assert (task.state.value, task.reason) == ("NEEDS_HUMAN", cause)
    # exactly one attempt: no retry, no backoff, no second placement
    assert len(fleeter.ledger().attempts(task.id)) == 1
    assert path_between(fleeter, task)[-2:] == [
        ("READY", "ASSIGNED", "placed"),
        ("ASSIGNED", "NEEDS_HUMAN", cause),
    ] or path_between(fleeter, task)[-3:] == [
        ("READY", "ASSIGNED", "placed"),
        ("ASSIGNED", "RUNNING", "started"),
        ("RUNNING", "NEEDS_HUMAN", cause),
    ]
    assert "Traceback" not in r.stderr
    return task


def test_claude_not_on_path(fleeter: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # the default executable, with a PATH that has git and python but no claude
    bin_dir = fleeter.path.parent / "bin"
    bin_dir.mkdir()
    for tool in ("git", "sh"):
        found = next(Path(d) / tool for d in os.environ["PATH"].split(os.pathsep) if (Path(d) / tool).exists())
        (bin_dir / tool).symlink_to(found)
    monkeypatch.setenv("PATH", str(bin_dir))
    one_task(fleeter)
    r = fleeter.run("tasks.toml")
    task = assert_needs_human_at_once(fleeter, r, "agent_not_found:claude is not on PATH")
    r.fnmatch_lines(["*t1 NEEDS_HUMAN*agent_not_found:claude is not on PATH*"])
    assert fleeter.ledger().attempts(task.id)[0].state == "abandoned"


def test_configured_executable_missing(fleeter: Any) -> None:
    fleeter.write_config('[claude]\nexecutable = "/nonexistent/claude"\n')
    one_task(fleeter)
    r = fleeter.run("tasks.toml")
    assert_needs_human_at_once(fleeter, r, "agent_not_found:/nonexistent/claude does not exist")


def test_configured_executable_not_executable(fleeter: Any) -> None:
    exe = fleeter.write("bin/claude", "#!/bin/sh\nexit 0\n")
    exe.chmod(0o644)
    fleeter.write_config(f'[claude]\nexecutable = "{exe}"\n')
    one_task(fleeter)
    r = fleeter.run("tasks.toml")
    assert_needs_human_at_once(fleeter, r, f"agent_not_found:{exe} is not executable")


def test_exec_failure_reported_by_the_shepherd(fleeter: Any) -> None:
    """What the supervisor cannot see beforehand (an executable file the kernel will not
    run) the shepherd reports with its errno: as a peer's would be."""
    exe = fleeter.write("bin/claude", "\x7fELF not really\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    fleeter.write_config(f'[claude]\nexecutable = "{exe}"\n')
    one_task(fleeter)
    r = fleeter.run("tasks.toml")
    assert_needs_human_at_once(fleeter, r, f"agent_not_found:{exe} is not executable (Exec format error)")


def test_missing_interpreter_reported_by_the_shepherd(fleeter: Any) -> None:
    exe = fleeter.write("bin/claude", "#!/nonexistent/node\n")
    exe.chmod(0o755)
    fleeter.write_config(f'[claude]\nexecutable = "{exe}"\n')
    one_task(fleeter)
    r = fleeter.run("tasks.toml")
    assert_needs_human_at_once(
        fleeter, r, f"agent_not_found:{exe} cannot be run: No such file or directory (is its #! interpreter installed?)"
    )


def test_command_agent_not_on_path(fleeter: Any) -> None:
    one_task(fleeter, extra='agent = "codex"\n\n[agents.codex]\ncommand = ["fleetrun-test-no-codex", "{prompt}"]')
    r = fleeter.run("tasks.toml")
    assert_needs_human_at_once(fleeter, r, "agent_not_found:fleetrun-test-no-codex is not on PATH")


def test_agent_rejects_its_arguments(fleeter: Any, fake_claude: Any) -> None:
    """The fake, like the real CLI, exits 1 with commander's `error: option ...` line."""
    wrapper = fleeter.write(
        "bin/claude", f'#!/bin/sh\nexec {sys.executable} {FAKE_CLAUDE} "$@" --permission-mode yolo\n'
    )
    wrapper.chmod(0o755)
    fleeter.write_config(f'[claude]\nexecutable = "{wrapper}"\n')
    one_task(fleeter)
    r = fleeter.run("tasks.toml")
    assert_needs_human_at_once(
        fleeter,
        r,
        "agent_rejected_arguments:error: option '--permission-mode <mode>' argument 'yolo' is invalid. "
        "Allowed choices are acceptEdits, auto, bypassPermissions, manual, dontAsk, plan.",
    )  # 2.1.332's words
    assert len(fake_claude.calls("t1")) == 1


def test_branch_checked_out_elsewhere(fleeter: Any, fake_claude: Any) -> None:
    """A `branch =` fleetrun made for this task before, now checked out in the user's
    checkout: git refuses the worktree, and waiting will not change that."""
    repo = fleeter.make_repo()
    tasks = '[[task]]\nname = "t1"\ncwd = "repo"\nprompt = "p"\ngit_ref = "main"\nbranch = "feat"\n'
    fake_claude.script(t1=[{"actions": [["write", "one.txt", "1"]]}])
    fleeter.write_tasks(tasks)
    assert fleeter.run("tasks.toml").ret == 0
    fleeter.git(repo, "checkout", "-q", "feat")
    fleeter.write_tasks(tasks + "# again\n")
    r = fleeter.run("tasks.toml", "--new-queue")  # a comment alone re-runs nothing (issue 14)
    assert_needs_human_at_once(
        fleeter, r, f"workspace_failed:fatal: 'feat' is already checked out at '{os.path.realpath(repo)}'"
    )
    assert len(fake_claude.calls("t1")) == 1  # the first run's only


def test_transient_start_failure_still_backs_off(fleeter: Any, fake_claude: Any) -> None:
    """Fork failing for a moment (EAGAIN) can clear by itself: back off, try again."""
    one_task(fleeter)
    flag = fleeter.path.parent / "failed-once"
    fleeter.write_fleetconf(
        f"""
        import errno, os
        import fleetrun

        @fleetrun.hookimpl(tryfirst=True)
        def fleetrun_prepare_workspace(task, attempt, config):
            if not os.path.exists({str(flag)!r}):
                open({str(flag)!r}, "w").close()
                raise OSError(errno.EAGAIN, "Resource temporarily unavailable")
    """,
        folder=".",
    )
    fake_claude.script(t1=[{"actions": [["write", "out.txt", "x"]]}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    task = fleeter.task("t1")
    assert task.state.value == "DONE"
    causes = [c for _, _, c in path_between(fleeter, task)]
    assert "start_failed:[Errno 11] Resource temporarily unavailable" in causes
    assert [a.state for a in fleeter.ledger().attempts(task.id)][0] == "abandoned"
    assert len(fleeter.ledger().attempts(task.id)) == 2


def test_transient_workspace_failure_still_backs_off(fleeter: Any, fake_claude: Any) -> None:
    """A git ref lock held by another process clears by itself: not a NEEDS_HUMAN."""
    repo = fleeter.make_repo()
    fleeter.write_tasks('[[task]]\nname = "t1"\ncwd = "repo"\nprompt = "p"\ngit_ref = "main"\nbranch = "feat"\n')
    flag = fleeter.path.parent / "locked-once"
    lock = repo / ".git" / "refs" / "heads" / "feat.lock"
    fleeter.write_fleetconf(
        f"""
        import os
        import fleetrun

        @fleetrun.hookimpl(tryfirst=True)
        def fleetrun_prepare_workspace(task, attempt, config):
            # another git holds the branch's ref lock for the first try only
            if not os.path.exists({str(flag)!r}):
                open({str(flag)!r}, "w").close()
                open({str(lock)!r}, "w").close()
            elif os.path.exists({str(lock)!r}):
                os.unlink({str(lock)!r})
    """,
        folder=".",
    )
    fake_claude.script(t1=[{"actions": [["write", "out.txt", "x"]]}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    task = fleeter.task("t1")
    assert task.state.value == "DONE"
    failed = [c for _, _, c in path_between(fleeter, task) if c.startswith("start_failed:")]
    assert len(failed) == 1 and "feat.lock" in failed[0], path_between(fleeter, task)
    assert len(fleeter.ledger().attempts(task.id)) == 2


def test_a_peer_reports_a_missing_agent_in_its_status(tmp_path: Path) -> None:
    """On a peer the supervisor cannot look at PATH: the peer's shepherd says why the
    exec failed, in the status the supervisor reads over `fleetrun host status`."""
    import json
    import subprocess
    import time

    home = tmp_path / "peerhome"
    home.mkdir(mode=0o700)
    env = dict(os.environ, FLEETRUN_HOME=str(home), FLEETRUN_DISABLE_PLUGIN_AUTOLOAD="1")

    def host(*args: str, stdin: Any = None) -> dict[str, Any]:
        proc = subprocess.run(
            [sys.executable, "-m", "fleetrun", "host", *args, "--json"],
            capture_output=True,
            input=json.dumps(stdin).encode() if stdin is not None else b"",
            env=env,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()
        return json.loads(proc.stdout)

    spec = {"argv": ["fleetrun-test-no-claude", "-p"], "cwd": "/", "env": {}, "timeout_s": 60, "stall_s": 60}
    host("start", stdin={"attempt_id": "task_t1_1_a1", "task_id": "task_t1_1", "spec": spec, "prompt": "p"})
    deadline = time.time() + 120
    while True:
        st = host("status", "--attempt", "task_t1_1_a1")["status"]
        if st.get("state") == "ended" or time.time() > deadline:
            break
        time.sleep(0.05)
    assert (st.get("state"), st.get("reason"), st.get("error")) == (
        "ended",
        "start_failed:agent_not_found",
        "fleetrun-test-no-claude is not on PATH",
    )


@pytest.mark.parametrize(
    ("log", "code", "expect"),
    [
        ("error: unknown option '--yolo'\n", 1, "rejected_arguments:error: unknown option '--yolo'"),
        (
            "\x1b[31mError: When using --print, --output-format=stream-json requires --verbose\x1b[0m\n",
            1,
            "rejected_arguments:Error: When using --print, --output-format=stream-json requires --verbose",
        ),
        # it started (its init event) and then died: a session that died, resumed as before
        ('{"type":"system","subtype":"init","session_id":"s"}\nerror: something broke\n', 1, "no_result"),
        ("error: unknown option '--yolo'\n", 0, "no_result"),  # exit 0 is not a refusal
        ("error: unknown option '--yolo'\n", None, "no_result"),  # killed: not a refusal either
        ("Segmentation fault\n", 139, "no_result"),
    ],
)
def test_rejected_arguments_are_told_from_a_session_that_died(log: str, code: Any, expect: str) -> None:
    from fleetrun.plugins.claude import result_from_log

    assert result_from_log(log, code).reason == expect


@pytest.mark.parametrize(
    "blocked, cause",
    [
        ("claude", "plugin_missing:no plugin spawns agent 'claude' (is its plugin blocked? see -p no:NAME)"),
        ("worktree", "plugin_missing:no plugin prepared a workspace (is its plugin blocked? see -p no:NAME)"),
    ],
)
def test_a_blocked_builtin_plugin_is_needs_human_at_once(
    fleeter: Any, fake_claude: Any, blocked: str, cause: str
) -> None:
    """`-p no:claude` / `-p no:worktree`: no plugin will ever start the attempt, so
    waiting cannot help (it used to back off on start_failed ten times)."""
    one_task(fleeter)
    r = fleeter.run("-p", f"no:{blocked}", "tasks.toml")
    assert_needs_human_at_once(fleeter, r, cause)

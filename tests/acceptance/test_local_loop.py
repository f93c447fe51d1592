"""End to end: `fleetrun tasks.toml` on one machine, with the fake claude, real git,
real shepherd processes and the real ledger."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

FAIL_UNLESS_FINAL = "test \"$(cat FIX.txt)\" = final || { echo 'FIX.txt must contain exactly the word final'; exit 1; }"


def one_task(fleeter, extra: str = "", verify: str = 'run = "test -f out.txt"', name: str = "t1") -> None:
    fleeter.make_repo()
    fleeter.write_tasks(f'''
        [[task]]
        name = "{name}"
        cwd = "repo"
        prompt = "Write out.txt."
        git_ref = "main"
        {extra}

          [[task.verify]]
          {verify}
    ''')


def branch_files(fleeter, branch: str) -> list[str]:
    return fleeter.git(fleeter.path / "repo", "ls-tree", "-r", "--name-only", branch).split()


def test_done_worktree_removed_branch_kept(fleeter, fake_claude):
    one_task(fleeter)
    fake_claude.script(
        t1=[
            {"actions": [["write", "out.txt", "hello"], ["commit", "add out"]], "result": "Wrote out.txt", "cost": 0.05}
        ]
    )
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    r.fnmatch_lines(
        [
            "fleetrun * -- home *",
            "collected 1 task",
            "*t1 RUNNING (attempt 1) on local*",
            "*t1 DONE (attempt 1)*verify_pass",
            "=== 1 done in *, $0.05 ===",
        ]
    )
    task = fleeter.task("t1")
    assert task.state.value == "DONE"
    assert task.cost_usd == pytest.approx(0.05)
    assert task.branch == f"fleetrun/t1-{task.id}"
    # the user's checkout is untouched; the work is on the branch; the clean worktree is gone
    assert not (fleeter.path / "repo" / "out.txt").exists()
    assert "out.txt" in branch_files(fleeter, task.branch)
    assert not Path(task.worktree).exists()
    assert task.worktree.startswith(str(fleeter.home / "worktrees"))
    # the contract fleetrun keeps with claude
    (call,) = fake_claude.calls("t1")
    argv = call["argv"]
    assert argv[0] == "-p" and "--verbose" in argv
    assert argv[argv.index("--output-format") + 1] == "stream-json"
    assert argv[argv.index("--permission-mode") + 1] == "acceptEdits"
    assert "Bash(git commit:*)" in argv
    assert call["prompt"].startswith("Write out.txt.")
    assert call["env"]["FLEETRUN_TASK_ID"] == task.id
    assert call["env"]["FLEETRUN_TASK_NAME"] == "t1"
    assert call["env"]["FLEETRUN_ATTEMPT"] == "1"
    assert call["cwd"] == call["env"]["FLEETRUN_WORKTREE"]
    att = fleeter.ledger().attempts(task.id)[0]
    assert att.session_id == argv[argv.index("--session-id") + 1]
    # state files are private
    assert (fleeter.home.stat().st_mode & 0o777) == 0o700
    assert ((fleeter.home / "state.db").stat().st_mode & 0o777) == 0o600


def test_retry_gets_the_failure_in_its_prompt(fleeter, fake_claude):
    one_task(fleeter, verify=f"run = {json.dumps(FAIL_UNLESS_FINAL)}", name="fix-it")
    fake_claude.script(
        **{
            "fix-it": [
                {"actions": [["write", "FIX.txt", "draft"], ["commit", "draft"]], "cost": 0.32},
                {"actions": [["write", "FIX.txt", "final"], ["commit", "final"]], "cost": 0.33},
            ]
        }
    )
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    r.fnmatch_lines(["*fix-it RETRYING*verify_fail:*", "*fix-it DONE (attempt 2)*", "=== 1 done in *, $0.65 ==="])
    first, second = fake_claude.calls("fix-it")
    assert "previous attempt did not pass" not in first["prompt"]
    assert second["prompt"].startswith("Write out.txt.")
    assert "FIX.txt must contain exactly the word final" in second["prompt"]
    assert "exit code 1" in second["prompt"]
    assert second["cwd"] == first["cwd"]  # same worktree
    task = fleeter.task("fix-it")
    assert [a.kind for a in fleeter.ledger().attempts(task.id)] == ["fresh", "retry"]
    log = fleeter.git(fleeter.path / "repo", "log", "--format=%s", task.branch).split("\n")
    assert log[:2] == ["final", "draft"]


def test_needs_human_after_max_retries(fleeter, fake_claude):
    one_task(fleeter, extra="max_retries = 1", verify='run = "echo nope; exit 3"')
    fake_claude.script(t1=[{"actions": [["write", "out.txt", "x"]]}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 1
    assert len(fake_claude.calls("t1")) == 2
    task = fleeter.task("t1")
    assert task.state.value == "NEEDS_HUMAN"
    assert task.reason.startswith("retries_exhausted:")
    r.fnmatch_lines(["=== 1 needs_human in * ==="])
    logs = fleeter.run("logs", "t1")
    logs.fnmatch_lines(
        [
            "*FAIL verifier 1 (run: echo nope; exit 3) attempt 1: exit code 3*",
            "*| nope",
            "*VERIFYING -> NEEDS_HUMAN*retries_exhausted*",
        ]
    )


def test_dependency_waits_and_gets_the_handoff(fleeter, fake_claude):
    fleeter.make_repo()
    fleeter.write_tasks("""
        [[task]]
        name = "user-api"
        cwd = "repo"
        prompt = "Add CRUD endpoints."
        git_ref = "main"
        depends_on = ["user-schema"]

        [[task]]
        name = "user-schema"
        cwd = "repo"
        prompt = "Add a users table."
        git_ref = "main"
    """)
    fake_claude.script(
        **{
            "user-schema": [
                {
                    "actions": [["sleep", 0.5], ["write", "schema.sql", "CREATE TABLE users"]],
                    "result": "Added the users table in schema.sql",
                }
            ],
            "user-api": [{"actions": [["write", "api.py", "# api"]], "result": "Added api.py"}],
        }
    )
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    schema, api = fleeter.task("user-schema"), fleeter.task("user-api")
    led = fleeter.ledger()
    done_at = next(t.time for t in led.transitions(schema.id) if t.to_state == "DONE")
    started_at = next(t.time for t in led.transitions(api.id) if t.to_state == "RUNNING")
    assert started_at >= done_at
    (call,) = fake_claude.calls("user-api")
    assert "user-schema is DONE on branch " + schema.branch in call["prompt"]
    assert "Added the users table in schema.sql" in call["prompt"]
    # uncommitted work was committed by fleetrun on the branch before verifying
    log = fleeter.git(fleeter.path / "repo", "log", "--format=%s", "-1", schema.branch).strip()
    assert log == "fleetrun: uncommitted work of attempt 1"
    assert "schema.sql" in branch_files(fleeter, schema.branch)


def test_cancel_cascades_down_the_chain(fleeter):
    fleeter.write_tasks("""
        [[task]]
        name = "a"
        prompt = "a"

        [[task]]
        name = "b"
        prompt = "b"
        depends_on = ["a"]

        [[task]]
        name = "c"
        prompt = "c"
        depends_on = ["b"]
    """)
    assert fleeter.run("queue", "tasks.toml").ret == 0
    r = fleeter.run("cancel", "a")
    assert r.ret == 0
    r.fnmatch_lines(
        [
            "cancelled a *",
            "  b * -> NEEDS_HUMAN (dependency_cancelled:a)",
            "  c * -> NEEDS_HUMAN (dependency_needs_human:b)",
        ]
    )
    assert fleeter.states() == {"a": "CANCELLED", "b": "NEEDS_HUMAN", "c": "NEEDS_HUMAN"}
    assert fleeter.run("cancel", "a").outlines[0].endswith("was already CANCELLED")
    # retry brings the chain back
    assert fleeter.run("retry", "a").ret == 0
    assert fleeter.states() == {"a": "READY", "b": "PENDING", "c": "PENDING"}


def test_timeout_ends_the_attempt_and_resumes_with_assess_prompt(fleeter, fake_claude):
    one_task(fleeter, extra="timeout_min = 0.02")
    fake_claude.script(t1=[{"mode": "hang"}, {"actions": [["write", "out.txt", "x"]]}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    r.fnmatch_lines(["*t1 RESUMING (attempt 1)*timeout", "*t1 DONE (attempt 2)*"])
    first, second = fake_claude.calls("t1")
    assert "interrupted" in second["prompt"] and "git status" in second["prompt"]
    assert "Write out.txt." in second["prompt"]
    # the hung agent is gone
    with pytest.raises(ProcessLookupError):
        os.kill(first["pid"], 0)


@pytest.mark.parametrize("mode", ["die", "no_result", "is_error", "exit_code"])
def test_dead_session_is_resumed(fleeter, fake_claude, mode):
    """Killed, exit 0 without a result, a result with is_error, a good result with a bad
    exit code: none of them is a success."""
    one_task(fleeter)
    fake_claude.script(
        t1=[
            {"mode": mode, "exit": 2, "actions": [["write", "half.txt", "x"]]},
            {"actions": [["write", "out.txt", "x"]]},
        ]
    )
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    r.fnmatch_lines(["*t1 RESUMING (attempt 1)*session_died*", "*t1 DONE (attempt 2)*"])
    second = fake_claude.calls("t1")[1]
    assert "assess the working directory" in second["prompt"]
    assert fleeter.task("t1").retries == 0  # a resume is not a retry


def test_resume_cap(fleeter, fake_claude):
    one_task(fleeter)
    fake_claude.script(t1=[{"mode": "no_result"}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 1
    task = fleeter.task("t1")
    assert task.state.value == "NEEDS_HUMAN" and task.reason.startswith("resume_cap:")
    assert len(fake_claude.calls("t1")) == 4


def test_dirty_worktree_is_kept_after_done(fleeter, fake_claude):
    one_task(fleeter, verify='run = "test -f out.txt && touch build.out"')
    fake_claude.script(t1=[{"actions": [["write", "out.txt", "x"]]}])
    assert fleeter.run("tasks.toml").ret == 0
    task = fleeter.task("t1")
    assert Path(task.worktree).exists()
    logs = fleeter.run("logs", "t1")
    logs.fnmatch_lines(["*note: kept worktree * it has uncommitted changes"])


def test_exitfirst_starts_nothing_after_first_needs_human(fleeter, fake_claude):
    fleeter.make_repo()
    fleeter.write_policy("[local]\nmax_tasks = 1\n")
    fleeter.write_tasks("""
        [[task]]
        name = "bad"
        cwd = "repo"
        prompt = "x"
        max_retries = 0
          [[task.verify]]
          run = "false"

        [[task]]
        name = "later"
        cwd = "repo"
        prompt = "y"
    """)
    r = fleeter.run("tasks.toml", "-x")
    assert r.ret == 1, r.stdout + r.stderr
    assert fleeter.states() == {"bad": "NEEDS_HUMAN", "later": "READY"}, r.stdout
    assert fake_claude.calls("later") == []
    r.fnmatch_lines(["*stopping after the first NEEDS_HUMAN (bad)*"])


def test_same_unchanged_file_resumes_its_queue(fleeter, fake_claude):
    one_task(fleeter)
    fake_claude.script(t1=[{"actions": [["write", "out.txt", "x"]]}])
    assert fleeter.run("tasks.toml").ret == 0
    r = fleeter.run("tasks.toml")
    assert r.ret == 0
    r.fnmatch_lines(["resuming queue * from an unchanged file (1 done)*"])
    assert len(fake_claude.calls("t1")) == 1
    assert len(fleeter.ledger().tasks()) == 1
    r = fleeter.run("tasks.toml", "--new-queue")
    assert r.ret == 0 and len(fake_claude.calls("t1")) == 2


def test_queue_then_work_until_idle(fleeter, fake_claude):
    one_task(fleeter)
    fake_claude.script(t1=[{"actions": [["write", "out.txt", "x"]]}])
    q = fleeter.run("queue", "tasks.toml")
    assert q.ret == 0
    q.fnmatch_lines(["queued task_*  t1  [[]READY]"])
    assert fake_claude.calls() == []
    r = fleeter.run("work", "--until-idle")
    assert r.ret == 0, r.stdout + r.stderr
    assert fleeter.states() == {"t1": "DONE"}
    st = json.loads(fleeter.run("status", "--json").stdout)
    assert st[0]["name"] == "t1" and st[0]["state"] == "DONE" and st[0]["attempts"] == 1
    assert st[0]["branch"].startswith("fleetrun/t1-") and st[0]["host"] == "local"
    assert {"id", "cost_usd"} <= set(st[0])


def test_max_tasks_is_respected(fleeter, fake_claude):
    fleeter.make_repo()
    fleeter.write_policy("[local]\nmax_tasks = 2\n")
    fleeter.write_tasks(
        "\n".join(
            f"""
        [[task]]
        name = "t{i}"
        cwd = "repo"
        prompt = "p"
        git_ref = "main"
    """
            for i in range(5)
        )
    )
    fake_claude.script(default=[{"actions": [["sleep", 0.3], ["write", "f.txt", "x"]]}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    led = fleeter.ledger()
    spans = [(a.started, a.ended) for a in led.attempts()]
    assert len(spans) == 5
    for t, _ in spans:
        overlapping = sum(1 for s, e in spans if s <= t < e)
        assert overlapping <= 2


def test_second_work_loop_is_refused(fleeter, fake_claude):
    one_task(fleeter)
    fake_claude.script(t1=[{"actions": [["sleep", 30]]}])
    fleeter.run("queue", "tasks.toml")
    proc = fleeter.popen("work")
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not fake_claude.calls("t1"):
            time.sleep(0.1)
        r = fleeter.run("work", "--until-idle")
        assert r.ret == 4
        r.fnmatch_lines(["ERROR: work: another work loop runs on * (pid *)*"])
        assert fleeter.run("status").outlines[0].startswith("supervisor: running (pid ")
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 2
    assert b"interrupted: 1 running attempt goes on and will be adopted by the next `fleetrun work`" in out
    fleeter.run("cancel", "t1")


def test_task_names_and_prompts_never_reach_a_shell(fleeter):
    fleeter.make_repo()
    evil = "x; touch pwned-name $(touch pwned-sub)"
    prompt = 'it\'s "quoted"; rm -rf / `touch pwned-prompt` $(touch pwned-prompt2)'
    fleeter.write_tasks(f"""
        [agents.echo]
        command = ["{{python}}", "-c", "import sys; open('argv.json','w').write(__import__('json').dumps(sys.argv[1:]))", "{{prompt}}", "{{attempt}}"]

        [[task]]
        name = {json.dumps(evil)}
        cwd = "repo"
        agent = "echo"
        git_ref = "main"
        prompt = {json.dumps(prompt)}
          [[task.verify]]
          run = "test -f argv.json"
    """)
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    task = fleeter.task(evil)
    assert task.branch == f"fleetrun/x-touch-pwned-name-touch-pwned-sub-{task.id}"
    assert list(fleeter.path.rglob("pwned*")) == [] and list(fleeter.home.rglob("pwned*")) == []
    argv = json.loads(fleeter.git(fleeter.path / "repo", "show", f"{task.branch}:argv.json"))
    assert argv == [prompt, "1"]


def test_missing_agent_executable_never_starts(fleeter, monkeypatch):
    fleeter.make_repo()
    fleeter.write_config('[claude]\nexecutable = "/nonexistent/claude"\n')
    fleeter.write_tasks("""
        [[task]]
        name = "t1"
        cwd = "repo"
        prompt = "p"
    """)
    monkeypatch.setattr("fleetrun.placement.BACKOFF_BASE_S", 0.05)
    r = fleeter.run("tasks.toml")
    assert r.ret == 1
    task = fleeter.task("t1")
    assert task.state.value == "NEEDS_HUMAN"
    # it can never start: a human is asked at once (tests/acceptance/test_fail_fast.py has the rest)
    assert task.reason == "agent_not_found:/nonexistent/claude does not exist"
    assert len(fleeter.ledger().attempts(task.id)) == 1


def test_drain_makes_tasks_wait(fleeter, fake_claude):
    one_task(fleeter)
    fake_claude.script(t1=[{"actions": [["write", "out.txt", "x"]]}])
    assert fleeter.run("drain").ret == 0
    assert fleeter.run("status").outlines[0].startswith("this machine is draining")
    r = fleeter.run("tasks.toml")
    assert r.ret == 1
    r.fnmatch_lines(["waiting: task_* (t1): this machine is draining", "cannot place: t1: this machine is draining"])
    assert fake_claude.calls() == []
    assert fleeter.run("undrain").ret == 0
    assert fleeter.run("tasks.toml").ret == 0


def test_status_graph_says_why(fleeter):
    fleeter.write_tasks("""
        [[task]]
        name = "user-schema"
        prompt = "a"

        [[task]]
        name = "user-api"
        prompt = "b"
        depends_on = ["user-schema"]
    """)
    fleeter.run("queue", "tasks.toml")
    r = fleeter.run("status", "--graph")
    r.fnmatch_lines(["user-schema [[]READY] task_*", "  user-api [[]PENDING] task_*  waiting for user-schema (READY)"])


def test_no_tasks_collected(fleeter):
    fleeter.write_tasks("# nothing yet\n")
    assert fleeter.run("tasks.toml").ret == 5


def test_shepherd_survives_subprocess_tree(fleeter, fake_claude):
    """The agent's process tree is ended with the attempt: nothing is left behind."""
    one_task(fleeter, extra="timeout_min = 0.02")
    fake_claude.script(
        t1=[{"mode": "hang", "actions": [["bash", "sleep 313.7 &"]]}, {"actions": [["write", "out.txt", "x"]]}]
    )
    fleeter.write_config(f'[claude]\nexecutable = "{fake_claude_path()}"\nallowed_tools = ["Bash"]\n')
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert "sleep 313.7" not in ps


def fake_claude_path() -> str:
    from tests.conftest import FAKE_CLAUDE

    return str(FAKE_CLAUDE)


def test_retry_elsewhere_frees_a_task_from_its_machine(fleeter):
    fleeter.write_tasks("""
        [[task]]
        name = "a"
        prompt = "a"
    """)
    fleeter.run("queue", "tasks.toml")
    led = fleeter.ledger()
    task = fleeter.task("a")
    from fleetrun.states import State

    att = led.lease(task.id, State.READY, "mini", "fresh")
    led.transition(task.id, State.ASSIGNED, State.RUNNING, "started", attempt=1, host="mini")
    r = fleeter.run("retry", "a")
    assert r.ret == 4  # a running task needs --elsewhere
    r = fleeter.run("retry", "--elsewhere", "a")
    assert r.ret == 0, r.stderr
    task = fleeter.task("a")
    assert task.state.value == "RESUMING" and task.host is None
    assert led.attempt(att.id).state == "abandoned"


def test_sigterm_stops_work_like_ctrl_c(fleeter, fake_claude):
    one_task(fleeter)
    fake_claude.script(t1=[{"actions": [["sleep", 30]]}])
    fleeter.run("queue", "tasks.toml")
    proc = fleeter.popen("work")
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not fake_claude.calls("t1"):
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    # a service manager's stop of `fleetrun work` is its normal end: 0 (docs/cli.md, exit codes)
    assert proc.returncode == 0, err
    assert b"interrupted: 1 running attempt goes on and will be adopted by the next `fleetrun work`" in out
    fleeter.run("cancel", "t1")


def test_broken_pipe_is_not_an_internal_error(fleeter):
    fleeter.write_tasks("\n".join(f'[[task]]\nname = "t{i}"\nprompt = "p"\n' for i in range(1500)))
    fleeter.run("queue", "tasks.toml")
    proc = subprocess.Popen(
        f"{sys.executable} -m fleetrun status | head -1", shell=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    out, err = proc.communicate(timeout=60)
    assert b"INTERNAL ERROR" not in err and b"Traceback" not in err
    assert not (fleeter.home / "internal-error.log").exists()


def test_state_files_are_private(fleeter, fake_claude):
    """Everything fleetrun writes under its home is 0600 (files) or 0700 (folders);
    the worktrees' own contents are git checkouts and keep git's modes."""
    one_task(fleeter, verify='run = "false"', extra="max_retries = 0")
    fake_claude.script(t1=[{"actions": [["write", "out.txt", "x"]]}])
    fleeter.run("tasks.toml")
    fleeter.run("status")
    loose = []
    for path in [fleeter.home, *fleeter.home.rglob("*")]:
        rel = path.relative_to(fleeter.home).parts
        if len(rel) >= 2 and rel[0] == "worktrees":
            continue  # a git checkout, inside the private worktrees folder
        if rel in (("config.toml",), ("policy.toml",)):
            continue  # written by the user (here, the test)
        if path.is_symlink() or path.is_socket():
            continue
        mode = path.stat().st_mode & 0o777
        if mode != (0o700 if path.is_dir() else 0o600):
            loose.append(f"{oct(mode)} {path}")
    assert loose == [], "\n".join(loose)


def test_defaults_of_the_project_and_the_tasks_file_reach_the_agent(fleeter, fake_claude):
    # the task's own key > the tasks file's top level > the project file's [task]
    fleeter.make_repo()
    (fleeter.path / "fleetrun.toml").write_text(
        '[task]\nmodel = "opus"\nmax_retries = 0\nallowed_tools = ["Read", "Edit"]\ngit_ref = "main"\n'
    )
    fleeter.write_tasks("""
        model = "sonnet"

        [[task]]
        name = "t1"
        cwd = "repo"
        prompt = "Write out.txt."

          [[task.verify]]
          run = "echo nope; exit 3"

        [[task]]
        name = "t2"
        cwd = "repo"
        prompt = "Write out.txt."
        model = "haiku"
        allowed_tools = ["Bash(make:*)"]

          [[task.verify]]
          run = "test -f out.txt"
    """)
    fake_claude.script(
        t1=[{"actions": [["write", "out.txt", "x"]]}],
        t2=[{"actions": [["write", "out.txt", "x"], ["commit", "add out"]]}],
    )
    r = fleeter.run("tasks.toml")
    assert r.ret == 1, r.stdout + r.stderr
    (one,) = fake_claude.calls("t1")  # max_retries = 0 from the project file: no retry
    assert fleeter.task("t1").reason.startswith("retries_exhausted:")
    (two,) = fake_claude.calls("t2")
    assert fleeter.task("t2").state.value == "DONE"
    assert one["argv"][one["argv"].index("--model") + 1] == "sonnet"
    assert two["argv"][two["argv"].index("--model") + 1] == "haiku"
    tools = one["argv"][one["argv"].index("--allowedTools") + 1 :]
    assert tools[:2] == ["Read", "Edit"] and "Bash(git commit:*)" not in one["argv"]
    # a task's own list replaces the default's: nothing of it is merged in
    assert "Read" not in two["argv"] and "Bash(make:*)" in two["argv"]
    # git_ref = "main" from the project file: each task in its own worktree
    assert one["cwd"] != str(fleeter.path / "repo") and fleeter.task("t2").branch.startswith("fleetrun/t2-")


def test_a_file_queued_while_work_runs_brings_its_agents_and_fleetconf(fleeter):
    """A running `fleetrun work` learns the ``[agents]`` tables and the ``fleetconf.py``
    of a tasks file queued after it started (it read the queues only as it started: the
    task went NEEDS_HUMAN with "no plugin spawns agent")."""
    fleeter.make_repo()
    fleeter.write_tasks("""
        [[task]]
        name = "first"
        cwd = "repo"
        agent = "sh"
        git_ref = "main"
        prompt = "p"

        [agents.sh]
        command = ["/bin/sh", "-c", "sleep 30"]
    """)
    assert fleeter.run("queue", "tasks.toml").ret == 0
    proc = fleeter.popen("work")
    try:
        deadline = time.time() + 120
        while time.time() < deadline and fleeter.states().get("first") != "RUNNING":
            time.sleep(0.1)
        later = fleeter.path / "later"
        later.mkdir()
        (later / "fleetconf.py").write_text(
            "import fleetrun\n\n@fleetrun.hookimpl\ndef fleetrun_build_prompt(task, attempt, config, context):\n"
            "    return 'from the fleetconf of the later file'\n"
        )
        (later / "tasks.toml").write_text(f"""
[agents.echo]
command = ["{sys.executable}", "-c", "import sys; open('prompt.txt', 'w').write(sys.argv[1])", "{{prompt}}"]

[[task]]
name = "second"
cwd = "../repo"
agent = "echo"
git_ref = "main"
prompt = "p"
""")
        assert fleeter.run("queue", "later/tasks.toml").ret == 0
        deadline = time.time() + 60
        while time.time() < deadline and fleeter.states().get("second") not in ("DONE", "NEEDS_HUMAN"):
            time.sleep(0.1)
        assert fleeter.states()["second"] == "DONE", fleeter.run("logs", "second").stdout
        branch = fleeter.ledger().find("second").branch
        shown = subprocess.run(
            ["git", "-C", str(fleeter.path / "repo"), "show", f"{branch}:prompt.txt"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert shown == "from the fleetconf of the later file"
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=20)
        fleeter.run("cancel", "first")

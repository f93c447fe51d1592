"""Hosts come from plugins (issue 12): a test plugin offers a second host, ``bay``,
through ``fleetrun_hosts``; a task pinned to it runs there end to end. Without the
plugin a task the ledger has on ``bay`` waits with the reason, and ``cancel`` works.
A ``fleetrun_place`` that names a host nobody offers makes the task wait, never a
``KeyError``; a ``fleetconf.py`` prepare hook wins for a non-local host."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from fleetrun.states import State
from fleetrun.taskspec import TaskSpec

pytest_plugins = ["sshd"]

PLUGINS = Path(__file__).resolve().parents[1] / "plugins"

PINNED = """
[[task]]
name = "docked"
cwd = "repo"
prompt = "Write out.txt."
git_ref = "main"
peer = "bay"

  [[task.verify]]
  run = "test -f out.txt"
"""


@pytest.fixture
def secondhost(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.syspath_prepend(str(PLUGINS))
    return "secondhost"


def test_a_task_pinned_to_a_plugins_host_runs_there(fleeter: Any, fake_claude: Any, secondhost: str) -> None:
    fleeter.make_repo()
    fleeter.write_tasks(PINNED)
    fake_claude.script(docked=[{"actions": [["write", "out.txt", "hi"], ["commit", "add out"]], "cost": 0.01}])
    r = fleeter.run("-p", secondhost, "tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    r.fnmatch_lines(["*docked RUNNING (attempt 1) on bay*", "*docked DONE (attempt 1)*"])
    task = fleeter.task("docked")
    assert (task.state, task.host) == (State.DONE, "bay")
    (att,) = fleeter.ledger().attempts(task.id)
    assert att.host == "bay"
    bay = fleeter.home / "bay" / att.id
    assert att.dir == str(bay)
    assert (bay / "status.json").exists() and (bay / "log").exists()
    assert (bay / "verify-1.out").exists()  # its run verifier's output is in bay's folder too
    assert not (fleeter.home / "attempts" / att.id).exists()
    r = fleeter.run("-p", secondhost, "status", "--wide")
    assert r.ret == 0, r.stderr
    (line,) = [ln for ln in r.stdout.splitlines() if task.id in ln]
    assert "DONE" in line and "bay" in line


def on_bay(fleeter: Any) -> Any:
    """A task RUNNING on ``bay``, as a run with the plugin left it."""
    repo = fleeter.make_repo()
    led = fleeter.ledger()
    (task,) = led.add_tasks([TaskSpec(name="docked", prompt="work there", cwd=str(repo))])
    att = led.lease(task.id, State.READY, "bay", "fresh")
    led.update_attempt(att.id, state="running", shepherd_pid=4242, shepherd_token="bay-token", started=time.time())
    led.transition(task.id, State.ASSIGNED, State.RUNNING, "started", attempt=att.number, host="bay")
    return led.get(task.id)


def test_without_the_plugin_its_task_waits_with_the_reason_and_cancel_works(fleeter: Any) -> None:
    task = on_bay(fleeter)
    missing = "host 'bay' is not provided by any loaded plugin"
    r = fleeter.run("-p", "no:secondhost", "status", "--wide")
    assert r.ret == 0, r.stderr
    (line,) = [ln for ln in r.stdout.splitlines() if task.id in ln]
    assert "RUNNING" in line and missing in line and "the task waits" in line
    r = fleeter.run("-p", "no:secondhost", "cancel", task.id)
    assert r.ret == 0, r.stdout + r.stderr
    assert f"cancelled docked {task.id}" in r.stdout
    assert f"could not stop attempt 1 on bay: {missing}" in r.stderr
    assert "KeyError" not in r.stderr and "Traceback" not in r.stderr
    assert fleeter.ledger().get(task.id).state is State.CANCELLED


def test_a_placement_on_a_host_nobody_offers_waits_with_the_reason(fleeter: Any, fake_claude: Any) -> None:
    fleeter.make_repo()
    fleeter.write_tasks(PINNED.replace('peer = "bay"\n', ""))
    fleeter.write_fleetconf("""
import fleetrun

@fleetrun.hookimpl(tryfirst=True)
def fleetrun_place(task, candidates, policy, config):
    return fleetrun.Placement("elsewhere")
""")
    r = fleeter.run("tasks.toml")
    assert r.ret == 1, r.stdout + r.stderr
    assert "KeyError" not in r.stdout + r.stderr and "INTERNAL ERROR" not in r.stdout + r.stderr
    reason = "host 'elsewhere' is not provided by any loaded plugin"
    assert reason in r.stdout + r.stderr
    task = fleeter.task("docked")
    assert task.state is State.READY and task.attempts == 0  # nothing was leased
    r = fleeter.run("status", "--wide")
    assert r.ret == 0 and reason in r.stdout, r.stdout + r.stderr
    assert fleeter.run("cancel", task.id).ret == 0
    assert fleeter.task("docked").state is State.CANCELLED


@pytest.mark.parametrize("marker", ["(tryfirst=True)", ""])
def test_a_fleetconf_prepare_hook_wins_for_a_host_that_is_not_local(
    fleeter: Any, fake_claude: Any, secondhost: str, marker: str, tmp_path: Path
) -> None:
    """``bay`` made not local (as a peer is): the ``worktree`` plugin leaves it alone,
    and a ``fleetconf.py`` hook, plain or ``tryfirst``, prepares its workspace."""
    custom = tmp_path / "custom"
    custom.mkdir()
    fleeter.make_repo()
    fleeter.write_tasks(PINNED.replace('run = "test -f out.txt"', 'run = "true"'))
    fleeter.write_fleetconf(f"""
import fleetrun, secondhost

secondhost.Bay.local = False

@fleetrun.hookimpl{marker}
def fleetrun_prepare_workspace(task, attempt, host, config):
    if host.name == "bay":
        return fleetrun.Workspace(path={str(custom)!r})
    return None

@fleetrun.hookimpl{marker}
def fleetrun_verify(task, verifier, workspace, attempt, host, config):
    if host.name == "bay":
        return fleetrun.Verdict(True, verifier.kind, verifier.label, reason="bay says yes", host=host.name)
    return None
""")
    fake_claude.script(docked=[{"actions": [["write", "out.txt", "hi"]], "cost": 0.01}])
    try:
        r = fleeter.run("-p", secondhost, "tasks.toml")
    finally:
        import secondhost as mod

        mod.Bay.local = True
    assert r.ret == 0, r.stdout + r.stderr
    task = fleeter.task("docked")
    (att,) = fleeter.ledger().attempts(task.id)
    assert (att.host, att.workspace["path"], att.workspace["is_worktree"]) == ("bay", str(custom), False)
    assert (custom / "out.txt").read_text() == "hi"
    assert [v.reason for v in fleeter.ledger().verdicts(attempt_id=att.id)] == ["bay says yes"]


def test_a_start_attempt_hook_starts_the_attempt_its_own_way(fleeter: Any) -> None:
    """``fleetrun_start_attempt`` from a fleetconf.py gets the host and a typed
    SpawnSpec, and starts the attempt itself (here: the host's shepherd, with a
    variable of its own); the loop follows it to DONE as any other."""
    fleeter.make_repo()
    fleeter.write_tasks("""
[agents.sh]
command = ["sh", "-c", "echo $HOW > how.txt"]

[[task]]
name = "own-way"
cwd = "repo"
prompt = "p"
agent = "sh"
  [[task.verify]]
  run = "grep -q by-the-hook how.txt"
""")
    fleeter.write_fleetconf("""
import json, os
import fleetrun
from fleetrun.starting import shepherd_spec

@fleetrun.hookimpl
def fleetrun_start_attempt(task, attempt, host, spawn, prompt, config):
    assert isinstance(spawn, fleetrun.SpawnSpec) and isinstance(host, fleetrun.Host)
    with open(os.path.join(os.path.dirname(__file__), "started.json"), "w") as f:
        json.dump({"host": host.name, "local": host.local, "argv0": spawn.argv[0]}, f)
    spec = shepherd_spec(task, attempt, spawn, config)
    spec["env"]["HOW"] = "by-the-hook"
    started = host.start(attempt.id, spec, prompt)
    assert isinstance(started, fleetrun.Started)
    return started
""")
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    import json

    assert json.loads((fleeter.path / "started.json").read_text()) == {"host": "local", "local": True, "argv0": "sh"}
    assert fleeter.task("own-way").state is State.DONE


@pytest.mark.parametrize("marker", ["(tryfirst=True)", ""])
def test_a_fleetconf_prepare_hook_wins_over_the_relay_for_a_peer(
    fleeter: Any, fake_claude: Any, peer_lab: Any, marker: str, tmp_path: Path
) -> None:
    """The relay's stage hooks are ``trylast`` and answer for their own hosts: a
    ``fleetconf.py`` ``fleetrun_prepare_workspace``, plain or ``tryfirst``, is asked
    first for a peer's attempt too, and what it returns is where the attempt runs."""
    mini = peer_lab.machine("mini")
    mini.write("config.toml", (fleeter.home / "config.toml").read_text())
    r = fleeter.run("relay", "add", "mini", mini.address, "--accept-new", "--command", mini.command_line())
    assert r.ret == 0, r.stdout + r.stderr
    custom = tmp_path / "custom"
    custom.mkdir()
    fleeter.make_repo()
    fleeter.write_tasks(PINNED.replace('peer = "bay"', 'peer = "mini"').split("  [[task.verify]]")[0])
    fleeter.write_fleetconf(f"""
import fleetrun

@fleetrun.hookimpl{marker}
def fleetrun_prepare_workspace(task, attempt, host, config):
    assert host.name == "mini" and not host.local
    return fleetrun.Workspace(path={str(custom)!r})
""")
    fake_claude.script(docked=[{"actions": [["write", "out.txt", "hi"]], "cost": 0.01}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    task = fleeter.task("docked")
    (att,) = fleeter.ledger().attempts(task.id)
    assert (task.state, att.host, att.workspace["path"]) == (State.DONE, "mini", str(custom))
    assert (custom / "out.txt").read_text() == "hi"  # the agent ran there, not in a worktree of mini's
    assert not (mini.home / "worktrees").exists() or not list((mini.home / "worktrees").iterdir())


def test_status_shows_what_the_hosts_plugin_says_about_its_task(fleeter: Any, secondhost: str) -> None:
    """``fleetrun_status_reason``: the plugin of the host a task runs on says why it is
    stuck there; ``status`` shows that instead of the ledger's reason."""
    task = on_bay(fleeter)
    r = fleeter.run("-p", secondhost, "status", "--wide")
    assert r.ret == 0 and "bay is closed" not in r.stdout, r.stdout + r.stderr
    (fleeter.home / "bay").mkdir(parents=True, exist_ok=True)
    (fleeter.home / "bay" / "closed").write_text("")
    r = fleeter.run("-p", secondhost, "status", "--wide")
    assert r.ret == 0, r.stderr
    (line,) = [ln for ln in r.stdout.splitlines() if task.id in ln]
    assert "RUNNING" in line and "bay is closed (secondhost)" in line


def test_the_relay_says_a_silent_peer_has_not_answered(tmp_path: Path) -> None:
    """The relay's ``fleetrun_status_reason`` reads its cached peer state: an error newer
    than the last answer is a peer that has not answered."""
    import json
    from types import SimpleNamespace

    from fleetrun.plugins import relay
    from fleetrun.plugins.relay.peers import STATE_FILE
    from fleetrun.stash import Stash

    now = time.time()
    (tmp_path / STATE_FILE).write_text(
        json.dumps(
            {
                "mini": {"last_heard": now - 300, "error": "timed out", "error_at": now - 5},
                "maxi": {"last_heard": now - 1, "error": "timed out", "error_at": now - 300},
            }
        )
    )
    config = SimpleNamespace(home=tmp_path, stash=Stash())
    said = relay.fleetrun_status_reason(task=SimpleNamespace(host="mini"), config=config)
    assert said is not None and said.startswith("mini has not answered for 5m;") and "fleetrun cancel" in said
    assert relay.fleetrun_status_reason(task=SimpleNamespace(host="maxi"), config=config) is None
    assert relay.fleetrun_status_reason(task=SimpleNamespace(host="local"), config=config) is None


def test_the_loop_polls_a_hosts_running_attempts_in_one_call(fleeter: Any) -> None:
    """Issue 23: each pass asks a host once for all its live attempts (``Host.poll``),
    not ``status`` once per attempt. Two attempts run at once on ``local`` (each waits
    for the other to have started): some poll asks for both."""
    fleeter.make_repo()
    fleeter.write_policy("[local]\nmax_tasks = 2\n")
    marks = fleeter.path / "started"
    marks.mkdir()
    # each waits until both have started (at most ~120 s: a bound on a hang, not a timing)
    wait_both = (
        f"touch {marks}/$FLEETRUN_TASK_ID; n=0; "
        f"while [ $(ls {marks} | wc -l) -lt 2 ] && [ $n -lt 2400 ]; do n=$((n+1)); sleep 0.05; done"
    )
    fleeter.write_tasks(f'''
[agents.sh]
command = ["sh", "-c", "{wait_both}"]

[[task]]
name = "one"
cwd = "repo"
git_ref = "main"
prompt = "p"
agent = "sh"

[[task]]
name = "two"
cwd = "repo"
git_ref = "main"
prompt = "p"
agent = "sh"
''')
    fleeter.write_fleetconf("""
import json, os
import fleetrun
from fleetrun.hosts import LocalHost
from fleetrun.plugins.local import measure

POLLS = os.path.join(os.path.dirname(__file__), "polls.jsonl")

class Counted(LocalHost):
    def poll(self, attempts):
        with open(POLLS, "a") as f:
            f.write(json.dumps([a.attempt_id for a in attempts]) + "\\n")
        return super().poll(attempts)

@fleetrun.hookimpl(tryfirst=True)
def fleetrun_hosts(config):
    return [Counted(config.home, measure=measure)]
""")
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    import json

    polls = [json.loads(line) for line in (fleeter.path / "polls.jsonl").read_text().splitlines()]
    ids = {a.id for t in ("one", "two") for a in fleeter.ledger().attempts(fleeter.task(t).id)}
    assert any(set(p) == ids for p in polls), polls


def test_a_transition_another_process_made_is_in_the_event_log_once(fleeter: Any) -> None:
    """Issue 23: the loop shows a transition another process made (a ``fleetrun
    cancel`` from another shell; here the agent runs it) without replaying it to a
    plugin that declares its log shared (``SHARED_TRANSITION_LOG``, the ``events``
    plugin): the loop no longer looks that plugin up by name, and the cancel is in
    ``events.ndjson`` once."""
    import json
    import shlex
    import sys

    fleeter.make_repo()
    cancel = shlex.join([sys.executable, "-m", "fleetrun", "cancel"])
    fleeter.write_tasks(f'''
[agents.sh]
command = ["sh", "-c", "{cancel} $FLEETRUN_TASK_ID; n=0; while [ $n -lt 2400 ]; do n=$((n+1)); sleep 0.05; done"]

[[task]]
name = "self-cancel"
cwd = "repo"
git_ref = "main"
prompt = "p"
agent = "sh"
''')
    r = fleeter.run("tasks.toml")
    task = fleeter.task("self-cancel")
    assert task.state is State.CANCELLED, r.stdout + r.stderr
    lines = [json.loads(ln) for ln in (fleeter.home / "events.ndjson").read_text().splitlines()]
    cancels = [e for e in lines if e.get("type") == "transition" and e.get("to") == "CANCELLED"]
    assert len(cancels) == 1, cancels


def test_a_host_whose_poll_raises_stops_its_tasks_not_the_fleet(fleeter: Any) -> None:
    """A bug in a host plugin's ``poll`` is each of its tasks' ``internal_error`` (as a
    bug while handling one task is), not a crash of the loop."""
    fleeter.make_repo()
    fleeter.write_tasks("""
[agents.sh]
command = ["sh", "-c", "exit 0"]

[[task]]
name = "polled"
cwd = "repo"
git_ref = "main"
prompt = "p"
agent = "sh"
""")
    fleeter.write_fleetconf("""
import fleetrun
from fleetrun.hosts import LocalHost
from fleetrun.plugins.local import measure

class Broken(LocalHost):
    def poll(self, attempts):
        raise RuntimeError("poll is broken")

@fleetrun.hookimpl(tryfirst=True)
def fleetrun_hosts(config):
    return [Broken(config.home, measure=measure)]
""")
    r = fleeter.run("tasks.toml")
    task = fleeter.task("polled")
    assert task.state is State.NEEDS_HUMAN, r.stdout + r.stderr
    assert fleeter.ledger().transitions(task.id)[-1].cause == "internal_error:RuntimeError: poll is broken"

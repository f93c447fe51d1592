"""Every per-task hook, overridden from a fleetconf.py and driven through the real loop."""

from __future__ import annotations

import json

RECORDER = """
import json, os
import fleetrun

LOG = os.path.join(os.path.dirname(__file__), "hooks.ndjson")

def note(**kw):
    with open(LOG, "a") as f:
        f.write(json.dumps(kw) + "\\n")

@fleetrun.hookimpl
def fleetrun_transition(task, from_state, to_state, cause, attempt, config):
    note(hook="transition", task=task.name, to=to_state, cause=cause)

@fleetrun.hookimpl
def fleetrun_verdict(task, verdict, attempt, config):
    note(hook="verdict", task=task.name, passed=verdict.passed, reason=verdict.reason)

@fleetrun.hookimpl
def fleetrun_task_waiting(task, reason, config):
    note(hook="waiting", task=task.name, reason=reason)

@fleetrun.hookimpl
def fleetrun_cleanup_workspace(task, config):
    note(hook="cleanup", task=task.name, state=task.state.value)
"""

TASKS = """
[agents.sh]
command = ["{python}", "-c", "import os; open('made-by-agent.txt','w').write(os.environ.get('EXTRA', ''))"]

[[task]]
name = "first"
prompt = "p"
agent = "sh"
  [[task.verify]]
  run = "test -f made-by-agent.txt"

[[task]]
name = "second"
prompt = "p"
agent = "sh"
depends_on = ["first"]
  [[task.verify]]
  run = "true"
"""


def calls(fleeter):
    path = fleeter.path / "hooks.ndjson"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_reporting_hooks_are_called(fleeter):
    fleeter.write_tasks(TASKS)
    fleeter.write_fleetconf(RECORDER)
    assert fleeter.run("tasks.toml").ret == 0
    seen = calls(fleeter)
    firsts = [c["to"] for c in seen if c["hook"] == "transition" and c["task"] == "first"]
    assert firsts == ["READY", "ASSIGNED", "RUNNING", "VERIFYING", "DONE"]
    assert {"hook": "verdict", "task": "first", "passed": True, "reason": "exit code 0"} in seen
    assert {"hook": "cleanup", "task": "second", "state": "DONE"} in seen


def test_place_candidates_and_waiting_hooks(fleeter):
    fleeter.write_tasks(TASKS)
    fleeter.write_fleetconf(
        RECORDER
        + """
import time

@fleetrun.hookimpl
def fleetrun_candidates(config):
    return [fleetrun.Candidate(name="elsewhere", kind="peer", status="never")]

@fleetrun.hookimpl(tryfirst=True)
def fleetrun_place(task, candidates, policy, config):
    names = sorted(c.name for c in candidates)
    note(hook="place", task=task.name, candidates=names)
    if task.name == "first" and not os.path.exists(LOG + ".go"):
        open(LOG + ".go", "w").close()
        return fleetrun.Wait("the custom placer says not yet", until=time.time() + 0.2)
    return fleetrun.Placement("local")
"""
    )
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    r.fnmatch_lines(["waiting: * (first): the custom placer says not yet"])
    seen = calls(fleeter)
    place = [c for c in seen if c["hook"] == "place"]
    assert place[0]["candidates"] == ["elsewhere", "local"]
    assert {"hook": "waiting", "task": "first", "reason": "the custom placer says not yet"} in seen


def test_prepare_spawn_agent_result_and_handoff_hooks(fleeter, tmp_path):
    custom = tmp_path / "custom-workspace"
    custom.mkdir()
    fleeter.write_tasks(TASKS)
    fleeter.write_fleetconf(f"""
import fleetrun, sys

@fleetrun.hookimpl(tryfirst=True)
def fleetrun_prepare_workspace(task, attempt, config):
    return fleetrun.Workspace(path={str(custom)!r})

@fleetrun.hookimpl(tryfirst=True)
def fleetrun_spawn(task, attempt, workspace, prompt, config):
    code = "import os; open('made-by-agent.txt','w').write(os.environ['EXTRA'] + ' ' + os.environ['FLEETRUN_TASK_NAME'])"
    return {{"argv": [sys.executable, "-c", code], "env": {{"EXTRA": "custom-spawn"}}}}

@fleetrun.hookimpl(tryfirst=True)
def fleetrun_agent_result(task, attempt, log_path, exit_code, config):
    return fleetrun.AgentResult(ok=exit_code == 0, exit_code=exit_code, result_text="summary from the hook",
                                cost_usd=0.25)

@fleetrun.hookimpl(tryfirst=True)
def fleetrun_handoff(task, attempt, config):
    return fleetrun.Handoff(task_name=task.name, branch=None, summary="handed off by the hook: " + attempt.result_text)

@fleetrun.hookimpl(tryfirst=True)
def fleetrun_build_prompt(task, attempt, config, context):
    import json, os
    with open(os.path.join({str(custom)!r}, task.name + ".prompt"), "w") as f:
        f.write(json.dumps([h.summary for h in context["handoffs"]]))
    return None  # the default builds the prompt
""")
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    assert (custom / "made-by-agent.txt").read_text() in ("custom-spawn first", "custom-spawn second")
    assert json.loads((custom / "second.prompt").read_text()) == ["handed off by the hook: summary from the hook"]
    r.fnmatch_lines(["=== 2 done in *, $0.50 ==="])


def test_collect_work_hook_runs_before_the_verifiers(fleeter):
    fleeter.write_tasks(TASKS)
    fleeter.write_fleetconf("""
import fleetrun, os

@fleetrun.hookimpl(tryfirst=True)
def fleetrun_collect_work(task, attempt, workspace, config):
    # gather the work: here, leave a file the verifier insists on
    with open(os.path.join(workspace.path, "collected-" + task.name), "w") as f:
        f.write(str(attempt.number))
    return "collected"
""")
    text = (fleeter.path / "tasks.toml").read_text().replace('run = "true"', 'run = "test -f collected-second"')
    (fleeter.path / "tasks.toml").write_text(text)
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    assert (fleeter.path / "collected-first").read_text() == "1"

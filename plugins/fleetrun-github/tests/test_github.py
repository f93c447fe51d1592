"""fleetrun-github, tested the way a third party tests a plugin: real runs of small
queues in a tmp folder, in-process, with the plugin passed explicitly (fleeter turns
entry-point autoload off). The remote is a real bare repository (a real ``git push``,
refused by a real pre-receive hook for one branch); ``gh`` is the stand-in of
``ghstub.py``, named by the ``[github] gh`` key, which records each call."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

import fleetrun_github
import pytest
from fleetrun_github import body as bodymod
from fleetrun_github.ghcli import existing_from_error, parse_created, parse_list
from ghstub import write_gh

import fleetrun
from fleetrun import AgentResult

TOKEN = "ghp_fleeterTestToken0123456789"

# Every task writes a file (the worktree plugin commits it on the task's branch) and a
# summary; "api" fails its verifier once. "ui" depends on "api" and opts out.
QUEUE = r"""
[agents.work]
command = ["{python}", "-c", "import os; open('work.txt', 'w').write('done'); open(os.environ['FLEETRUN_SUMMARY_FILE'], 'w').write('Added work.txt for ' + os.environ['FLEETRUN_TASK_NAME'] + '.')"]

[[task]]
name = "api"
prompt = "Add the users API\nwith tests, please."
cwd = "repo"
git_ref = "main"
agent = "work"
  [[task.verify]]
  run = "test -f ../m || { touch ../m; exit 1; }"
  [[task.verify]]
  name = "has work"
  run = "test -f work.txt"

[[task]]
name = "ui"
prompt = "Use the API"
cwd = "repo"
git_ref = "main"
agent = "work"
depends_on = ["api"]
pr = false

[[task]]
name = "bad-push"
prompt = "Push me"
cwd = "repo"
git_ref = "main"
agent = "work"

[[task]]
name = "junk"
prompt = "Talk to a proxy"
cwd = "repo"
git_ref = "main"
agent = "work"

[[task]]
name = "signed-out"
prompt = "Nobody logged in"
cwd = "repo"
git_ref = "main"
agent = "work"

[[task]]
name = "approved"
prompt = "Needs a person"
cwd = "repo"
git_ref = "main"
agent = "work"
max_retries = 0
  [[task.verify]]
  run = "false"
"""


class Costly:
    """Stands in for an agent that reports its cost: $0.25 per attempt."""

    @fleetrun.hookimpl(tryfirst=True)
    def fleetrun_agent_result(
        self, task: Any, attempt: Any, log_path: str, exit_code: Optional[int], config: Any
    ) -> AgentResult:
        return AgentResult(ok=exit_code == 0, exit_code=exit_code, cost_usd=0.25)


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def setup_remote(fleeter: Any) -> tuple[Path, Path]:
    repo = fleeter.make_repo()
    remote = fleeter.path / "remote.git"
    git(fleeter.path, "init", "-q", "--bare", str(remote))
    hook = remote / "hooks" / "pre-receive"
    hook.write_text(
        '#!/bin/sh\nwhile read old new ref; do case "$ref" in *bad-push*)'
        ' echo "push declined: $ref is protected"; exit 1;; esac; done\n'
    )
    hook.chmod(0o755)
    git(repo, "remote", "add", "origin", str(remote))
    git(repo, "push", "-q", "origin", "main")
    return repo, remote


def calls(gh: Path) -> list[dict[str, Any]]:
    path = gh.parent / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def heads(cs: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(c["argv"][1], c["argv"][c["argv"].index("--head") + 1]) for c in cs]


def notes(fleeter: Any, name: str) -> list[str]:
    return [text for _, text in fleeter.ledger().notes(fleeter.task(name).id) if text.startswith("github:")]


def test_done_tasks_get_pull_requests_and_failures_are_notes(fleeter: Any, monkeypatch: Any) -> None:
    monkeypatch.setenv("GH_TOKEN", TOKEN)
    repo, remote = setup_remote(fleeter)
    gh = write_gh(fleeter.path / "bin")
    fleeter.write_config(f'[github]\ngh = "{gh}"\n')
    fleeter.write_tasks(QUEUE)
    result = fleeter.run("tasks.toml", plugins=[fleetrun_github, Costly()])
    # a failed push and gh's errors do not undo DONE
    result.assert_outcomes(done=5, needs_human=1)
    api, ui = fleeter.task("api"), fleeter.task("ui")
    url = "https://github.com/acme/widgets/pull/1"

    # api: pushed (a real push: the remote's branch is the local one), listed, then created
    assert git(remote, "rev-parse", api.branch) == git(repo, "rev-parse", api.branch)
    by_branch: dict[str, list[dict[str, Any]]] = {}
    for c in calls(gh):
        by_branch.setdefault(c["argv"][c["argv"].index("--head") + 1], []).append(c)
    listed, created = by_branch[api.branch]
    assert listed["argv"] == ["pr", "list", "--head", api.branch, "--json", "url"]
    assert created["argv"] == [
        "pr",
        "create",
        "--head",
        api.branch,
        "--base",
        "main",
        "--title",
        "api: Add the users API",
        "--body-file",
        "-",
        "--draft",
    ]
    assert os.path.realpath(created["cwd"]) == os.path.realpath(repo) and created["gh_token"]
    body = created["stdin"]
    assert body.startswith(f"fleetrun task `api` (`{api.id}`) is DONE (verify_pass) after 2 attempts (1 retry).\n")
    for part in (
        "> Add the users API\n> with tests, please.\n",
        "- attempt 1: **FAIL** run `test -f ../m || { touch ../m; exit 1; }`: `exit code 1`\n",
        "- attempt 2: **PASS** run `has work`: `exit code 0`\n",
        "$0.50 over 2 attempts (1 retry).\n",
        "## Summary\n\n```\nAdded work.txt for api.\n```\n",
        f"Branch `{api.branch}` from `main`. Opened by fleetrun-github 0.1.0;",
    ):
        assert part in body, body

    # ui opted out (pr = false): no call for its branch; its prompt has api's pull request
    assert ui.branch not in by_branch
    (ui_att,) = fleeter.ledger().attempts(ui.id)
    prompt = (fleeter.home / "attempts" / ui_att.id / "prompt").read_text()
    assert f"- api is DONE on branch {api.branch}.\n  Its pull request: {url}\n  Its summary: Added work.txt" in prompt

    # the push refused by the remote's hook: a note with git's reason, no gh call
    bad = fleeter.task("bad-push")
    assert bad.branch not in by_branch
    (note,) = notes(fleeter, "bad-push")
    assert note.startswith(f"github: no pull request: git push origin {bad.branch} failed: exit code 1: ")
    assert "push declined: refs/heads/" in note and "pre-receive hook declined" in note
    # gh's garbage: a reason, and the token it echoed is not in it
    junk = fleeter.task("junk")
    assert heads(by_branch[junk.branch]) == [("list", junk.branch)]
    (note,) = notes(fleeter, "junk")
    assert note == (
        f"github: pushed {junk.branch} to origin; no pull request: gh pr list printed something that "
        "is not JSON: <html><body>Something went wrong (token ***)</body></html>"
    )
    (note,) = notes(fleeter, "signed-out")
    assert note.endswith(
        "no pull request: gh pr list: exit code 4: To get started with GitHub CLI, please run: "
        "gh auth login Alternatively, populate the GH_TOKEN environment variable with a GitHub "
        "API authentication token."
    )
    assert notes(fleeter, "api") == [f"github: pushed {api.branch} to origin; opened draft pull request {url}"]
    result.fnmatch_lines(
        [
            "github: bad-push: no pull request: git push origin * failed: *",
            f"github: api: pushed {api.branch} to origin; opened draft pull request {url}",
        ],
        stream="out",
    )

    # a task a person approves is DONE too: fleetrun approve opens its pull request
    assert "approved" not in {
        c["argv"][c["argv"].index("--head") + 1].split("/")[1].rsplit("-task", 1)[0] for c in calls(gh)
    }
    approve = fleeter.run("approve", "approved", plugins=[fleetrun_github])
    assert approve.ret == 0, approve.stdout + approve.stderr
    assert fleetrun.task_links(fleeter.ledger(), fleeter.task("approved").id) == {
        "pull_request": "https://github.com/acme/widgets/pull/2"
    }
    assert heads(calls(gh)[-2:]) == [
        ("list", fleeter.task("approved").branch),
        ("create", fleeter.task("approved").branch),
    ]

    # status --json and logs show the link
    rows = {r["name"]: r for r in json.loads(fleeter.run("status", "--json", plugins=[fleetrun_github]).stdout)}
    assert rows["api"]["links"] == {"pull_request": url}
    assert rows["junk"]["links"] == rows["ui"]["links"] == {}
    fleeter.run("logs", "api", plugins=[fleetrun_github]).fnmatch_lines([f"*  link: pull request: {url}"])

    # again, by hand: the open pull request is found, none is created
    before = len(calls(gh))
    again = fleeter.run("github", "pr", "api", plugins=[fleetrun_github])
    assert again.ret == 0, again.stdout + again.stderr
    assert again.outlines == [f"api {api.id}: pushed {api.branch} to origin; its pull request is open already: {url}"]
    assert heads(calls(gh)[before:]) == [("list", api.branch)]
    # the refused push, once the remote takes it: opened; a task not DONE is refused
    (remote / "hooks" / "pre-receive").unlink()
    fixed = fleeter.run("github", "pr", "bad-push", plugins=[fleetrun_github])
    assert (
        fixed.ret == 0
        and fleeter.ledger().links(bad.id)[bad.id]["pull_request"][1] == "https://github.com/acme/widgets/pull/3"
    ), fixed.stdout
    # a branch that is not here (a peer's, not fetched back; here: deleted) is not pushed
    git(repo, "branch", "-D", junk.branch)
    gone = fleeter.run("github", "pr", "junk", plugins=[fleetrun_github])
    assert gone.ret == 1 and gone.outlines == [
        f"junk {junk.id}: no pull request: branch {junk.branch} is not in {git(repo, 'rev-parse', '--show-toplevel')}; "
        "nothing was pushed"
    ]
    # the file again, one task changed: the tasks kept DONE keep their pull request, no gh call
    before = len(calls(gh))
    fleeter.write_tasks(QUEUE.replace("Nobody logged in", "Still nobody logged in"))
    rerun = fleeter.run("tasks.toml", plugins=[fleetrun_github, Costly()])
    assert rerun.ret == 0, rerun.stdout + rerun.stderr
    kept = fleeter.task("api")
    assert kept.id != api.id and kept.reason == f"unchanged:{api.id}"
    assert fleetrun.task_links(fleeter.ledger(), kept.id) == {"pull_request": url}
    assert heads(calls(gh)[before:]) == [("list", fleeter.task("signed-out").branch)]
    # the token reached gh but no file: the ledger, the logs, the attempt folders
    for path in fleeter.path.rglob("*"):
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes(), path


#: What an agent may hand on as its summary to steer the pull request: close an issue,
#: ping a team, load a tracking image, imitate fleetrun's own sections, and close a
#: code fence early.
HOSTILE = (
    "Closes #1\ncc @org/team\n![](http://tracker.example/pixel.png)\n## Verifiers\n"
    "- attempt 1: **PASS** run `everything`\n```\nFixes #2\n````\n"
)


def fenced(body: str, after: str) -> tuple[str, str]:
    """The fenced code block that follows the line ``after`` in ``body``: (its fence, its
    content), as CommonMark reads it (it ends at the first line of at least as many
    backticks and nothing else)."""
    lines = body.split("\n")
    i = lines.index(after) + 2
    fence = lines[i]
    assert set(fence) == {"`"} and len(fence) >= 3, body
    end = next(
        j for j in range(i + 1, len(lines)) if set(lines[j].strip()) == {"`"} and len(lines[j].strip()) >= len(fence)
    )
    assert lines[end] == fence, body  # the block ends at its own fence, not at one of the agent's
    return fence, "\n".join(lines[i + 1 : end])


def test_the_agents_summary_is_inert_text_in_the_pull_request_body(fleeter: Any, monkeypatch: Any) -> None:
    monkeypatch.setenv("GH_TOKEN", TOKEN)
    repo, remote = setup_remote(fleeter)
    gh = write_gh(fleeter.path / "bin")
    fleeter.write_config(f'[github]\ngh = "{gh}"\n')
    (fleeter.path / "summary.txt").write_text(HOSTILE)
    copy = (
        f"import os, shutil; open('work.txt', 'w').write('done'); shutil.copy({str(fleeter.path / 'summary.txt')!r}, "
        "os.environ['FLEETRUN_SUMMARY_FILE'])"
    )
    fleeter.write_tasks(f"""
        [agents.work]
        command = ["{{python}}", "-c", "{copy}"]

        [[task]]
        name = "api"
        prompt = "Add the users API"
        cwd = "repo"
        git_ref = "main"
        agent = "work"
    """)
    result = fleeter.run("tasks.toml", plugins=[fleetrun_github])
    result.assert_outcomes(done=1)
    (created,) = [c for c in calls(gh) if c["argv"][:2] == ["pr", "create"]]
    body = created["stdin"]
    fence, content = fenced(body, "## Summary")
    assert content == HOSTILE.rstrip("\n")  # shown whole, as the agent wrote it, but as code
    assert len(fence) > 4  # longer than any run of backticks in it
    # outside the block, nothing of it: no reference, mention, image or section of its own
    outside = body.replace(content, "")
    for live in ("#1", "#2", "@org", "![](", "**PASS** run `everything`"):
        assert live not in outside, body
    assert [line for line in outside.split("\n") if line.startswith("## ")] == [
        "## Task",
        "## Verifiers",
        "## Cost",
        "## Summary",
    ]


def test_inert_unless_configured_and_mistakes_are_usage_errors(fleeter: Any) -> None:
    repo, remote = setup_remote(fleeter)
    gh = write_gh(fleeter.path / "bin")
    fleeter.write_tasks("""
        [agents.work]
        command = ["{python}", "-c", "open('work.txt', 'w').write('done')"]

        [[task]]
        name = "api"
        prompt = "Add it"
        cwd = "repo"
        git_ref = "main"
        agent = "work"
    """)
    result = fleeter.run("tasks.toml", plugins=[fleetrun_github])
    result.assert_outcomes(done=1)
    assert calls(gh) == [] and git(remote, "branch", "--list") == "main"  # no [github], no pr = true: nothing
    assert fleeter.ledger().links() == {}

    cfg = fleeter.write_config(f'[github]\ngh = "{gh}"\ndraft = "yes"\n')
    bad = fleeter.run("tasks.toml", plugins=[fleetrun_github])
    assert bad.ret == 4 and f"ERROR: {cfg}:3: github.draft:" in bad.stderr, bad.stderr
    fleeter.write_config("[github]\ntimeout_s = 0\n")
    bad = fleeter.run("tasks.toml", plugins=[fleetrun_github])
    assert bad.ret == 4 and "github.timeout_s: must be greater than 0" in bad.stderr, bad.stderr
    fleeter.write_config("")
    fleeter.write_tasks('[[task]]\nname = "x"\nprompt = "p"\ncwd = "repo"\npr = "yes"\n', name="bad.toml")
    bad = fleeter.run("validate", "bad.toml", plugins=[fleetrun_github])
    assert (bad.ret, bad.stderr) == (4, "ERROR: bad.toml:5: task 'x': pr: must be true or false, not a string\n")


def test_a_queue_of_new_tasks_makes_no_task_object_for_the_plugin(fleeter: Any, monkeypatch: Any) -> None:
    """The plugin takes a queue's tasks in one ``fleetrun_queued`` call and acts only on
    one entered DONE (a kept task, above): ``fleetrun queue`` of new tasks makes no
    :class:`~fleetrun.ledger.Task` for it (its per-task ``fleetrun_transition`` made one
    a task, 100,000 for a queue of 100,000)."""
    from fleetrun.ledger import Task

    fleeter.make_repo()
    fleeter.write_config("[github]\n")
    fleeter.write_tasks("".join(f'[[task]]\nname = "t{i}"\nprompt = "p"\ncwd = "repo"\n' for i in range(50)))
    made: list[int] = []
    real_init = Task.__init__

    def init(self: Task, *args: Any, **kwargs: Any) -> None:
        made.append(1)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(Task, "__init__", init)
    result = fleeter.run("queue", "tasks.toml", plugins=[fleetrun_github])
    assert result.ret == 0, result.stderr
    assert len(result.outlines) == 50 and made == []


def test_the_installed_distribution_loads_through_its_entry_point(fleeter: Any) -> None:
    # asked of a fresh interpreter: this one has the source folder on sys.path, where
    # pip's build leaves a fleetrun_github.egg-info that is no installed distribution
    probe = subprocess.run(
        [sys.executable, "-c", "import importlib.metadata as m; m.distribution('fleetrun-github')"],
        cwd=fleeter.path,
        capture_output=True,
    )
    if probe.returncode != 0:
        if os.environ.get("CI"):
            raise AssertionError("CI installs plugins/fleetrun-github (.ci/run); it is not installed") from None
        pytest.skip("fleetrun-github is not installed (pip install ./plugins/fleetrun-github)")
    fleeter.enable_plugin_autoload()

    def loaded(*args: str) -> list[str]:
        shown = fleeter.runsub(*args, "--version")
        assert shown.ret == 0, shown.stdout + shown.stderr
        return [name.strip() for name in shown.stdout.split("plugins:", 1)[1].split(",")]

    assert "github" in loaded()
    assert "github" not in loaded("-p", "no:github")
    # its verb, from the entry point: a task it does not know is the user's mistake
    verb = fleeter.runsub("github", "pr", "nosuch")
    assert (verb.ret, verb.stderr) == (
        4,
        "ERROR: TASK: no task with id or name 'nosuch' (fleetrun status lists them)\n",
    )


def test_what_gh_prints_is_read_strictly() -> None:
    assert parse_list('[{"url": "https://github.com/o/r/pull/3"}]') == ("found", "https://github.com/o/r/pull/3")
    assert parse_list("[]\n") == ("none", None)
    assert (
        parse_list('{"url": "https://x"}') == 'printed JSON that is not a list of pull requests: {"url": "https://x"}'
    )
    assert parse_list('[{"url": "http://github.com/o/r/pull/3"}]') == (
        "printed a pull request whose url is not an https URL: http://github.com/o/r/pull/3"
    )
    assert parse_list('[{"url": 3}]').startswith("printed a pull request whose url is not an https URL")
    assert parse_created("https://github.com/o/r/pull/4\n") == ("https://github.com/o/r/pull/4",)
    assert parse_created("Warning: 2 uncommitted changes\nhttps://github.com/o/r/pull/4\n") == (
        "https://github.com/o/r/pull/4",
    )
    assert parse_created("") == "printed no https URL of a pull request: (nothing)"
    # a last line with more than the URL on it is not one: nothing is guessed out of it
    assert parse_created("https://github.com/o/r/pull/4 \x1b[31m") == (
        "printed no https URL of a pull request: https://github.com/o/r/pull/4 ?[31m"
    )
    assert isinstance(parse_created("pull/4 opened"), str)
    err = 'a pull request for branch "fleetrun/a-1" into branch "main" already exists:\nhttps://github.com/o/r/pull/9\n'
    assert existing_from_error(err) == "https://github.com/o/r/pull/9"
    assert existing_from_error("already exists: javascript:x") is None


def test_title_and_body_quote_untrusted_text_as_text() -> None:
    assert bodymod.title("api", "\n\n  Add\tthe API  \nmore") == "api: Add the API"
    assert len(bodymod.title("x", "y" * 500)) == bodymod.TITLE_CHARS
    f = bodymod.Facts(
        name="a`b",
        task_id="t1",
        prompt="p",
        cause="exited",
        branch="fleetrun/a",
        base=None,
        attempts=1,
        retries=0,
        resumes=0,
        cost_usd=0.0,
        cost_known=False,
        summary="x\x1b[2Jy",
        verdicts=[],
    )
    text = bodymod.body(f, "0.1.0")
    assert text.startswith("fleetrun task ``a`b`` (`t1`) is DONE (exited) after 1 attempt.\n")
    assert "- none: the task is DONE when its session ended well" in text
    assert "$0.00 (at least: an attempt's cost is unknown) over 1 attempt." in text
    assert "x[2Jy" in text and "\x1b" not in text
    # a brain's or a reviewer's reason is a model's words: a code span, never Markdown
    f.verdicts = [bodymod.Verdict(attempt=1, kind="brain", label="review", passed=True, reason="Closes #3 `@team`")]
    assert "- attempt 1: **PASS** brain `review`: `` Closes #3 `@team` ``\n" in bodymod.body(f, "0.1.0")


def test_loading_the_plugin_imports_no_subprocess() -> None:
    """``fleetrun --help`` loads every installed plugin to read its verbs and options:
    importing this one must stay light (tests/test_startup.py's budget for --help)."""
    here = Path(__file__).resolve().parents[1]
    probe = "import sys, fleetrun_github; print(sorted({'subprocess', 'threading'} & set(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        env=dict(os.environ, PYTHONPATH=str(here)),
    ).stdout.strip()
    assert out == "[]", out

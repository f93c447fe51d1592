"""fleetrun-github: a DONE task's branch pushed and a pull request opened with ``gh``.

Inert unless configured: a ``[github]`` table (``config.toml``, the project file or a
tasks file) turns it on for every task with a branch, ``pr = true`` on a task for that
one, ``pr = false`` off for that one, ``enabled = false`` off for all.

When a task moves to DONE (``fleetrun_transition``, so after the move is committed: a
failure here never undoes it, and the body can say how it ended), in the process that
moved it (the loop, or ``fleetrun approve``):

1. ``git push REMOTE refs/heads/BRANCH:refs/heads/BRANCH`` from the repository that
   holds the task's ``cwd`` (a peer's task once its branch was fetched back);
2. ``gh pr list --head BRANCH --json url``: an open pull request for the branch is
   reused (retries and second runs open none);
3. else ``gh pr create --head BRANCH --base GIT_REF --title ... --body-file - [--draft]``,
   the body on standard input;
4. the URL becomes the task's link ``pull_request`` (``fleetrun.add_link``): its
   dependents' prompts, ``fleetrun logs`` and ``status --json`` show it.

Each failure is a note on the task with its reason (``fleetrun logs``) and a line in
the run's summary; the task stays DONE. ``fleetrun github pr TASK...`` does it again
for DONE tasks (after fixing what the note said).
"""

from __future__ import annotations

import argparse
from typing import Any, Optional, TextIO

import fleetrun
from fleetrun import ConfigKey, KeyDecl, hookimpl

from . import body as bodymod
from .ghcli import existing_from_error, failure, parse_created, parse_list, run, tail

__version__ = "0.1.0"

LINK = "pull_request"
DEFAULTS: dict[str, Any] = {
    "enabled": True,
    "remote": "origin",
    "draft": True,
    "gh": "gh",
    "git": "git",
    "repo": None,
    "base": None,
    "timeout_s": 120.0,
}
#: what this run did, for the terminal summary: (task name, line)
SUMMARY_KEY = fleetrun.StashKey[list[tuple[str, str]]]()


def _nonempty(v: Any) -> Optional[str]:
    return None if v.strip() else "must not be empty"


def _positive(v: Any) -> Optional[str]:
    return None if v > 0 else "must be greater than 0"


@hookimpl
def fleetrun_config_keys(config: Any) -> list[ConfigKey]:
    t = "github"
    return [
        ConfigKey(t, "enabled", (bool,), doc="false: open no pull request (default true once [github] exists)"),
        ConfigKey(t, "remote", (str,), check=_nonempty, doc="the git remote to push to (default origin)"),
        ConfigKey(t, "draft", (bool,), doc="open draft pull requests (default true)"),
        ConfigKey(t, "gh", (str,), check=_nonempty, doc="the gh executable (default gh, on PATH)"),
        ConfigKey(t, "git", (str,), check=_nonempty, doc="the git executable (default git, on PATH)"),
        ConfigKey(t, "repo", (str,), check=_nonempty, doc="gh's --repo [HOST/]OWNER/NAME (default: gh's choice)"),
        ConfigKey(
            t,
            "base",
            (str,),
            check=_nonempty,
            doc="--base when the task's git_ref is not a branch here (default: gh's, the default branch)",
        ),
        ConfigKey(t, "timeout_s", (int, float), check=_positive, doc="for each git or gh call (default 120)"),
    ]


@hookimpl
def fleetrun_task_keys(config: Any) -> list[KeyDecl]:
    return [KeyDecl("pr", (bool,), doc="open a pull request when DONE (fleetrun-github); overrides [github]")]


def settings(config: Any) -> dict[str, Any]:
    table = config.setting("github", None, None)
    return {**DEFAULTS, **(table if isinstance(table, dict) else {})}


def wanted(config: Any, task: Any) -> bool:
    """The task is one this plugin opens a pull request for."""
    own = task.spec.extra.get("pr")
    if isinstance(own, bool):
        return own
    table = config.setting("github", None, None)
    return isinstance(table, dict) and table.get("enabled", True) is not False


@hookimpl(optionalhook=True)  # a fleetrun without the hook calls fleetrun_transition for each instead
def fleetrun_queued(tasks: Any, config: Any) -> None:
    # a queue's tasks in one call: only one kept DONE from the file's last run is of
    # interest, and a queue of 100,000 new tasks makes no Task for this plugin
    for i, (_id, _name, state, cause) in enumerate(tasks.entered()):
        if state.value == "DONE":
            fleetrun_transition(task=tasks[i], from_state="", to_state="DONE", cause=cause, attempt=None, config=config)


@hookimpl
def fleetrun_transition(task: Any, from_state: str, to_state: str, cause: str, attempt: Any, config: Any) -> None:
    if to_state != "DONE" or not wanted(config, task):
        return
    if from_state == "":  # kept DONE from the file's last run: that task's pull request is this one's
        old = cause.split(":", 1)[1] if cause.startswith("unchanged:") else ""
        url = fleetrun.task_links(config, old).get(LINK) if old else None
        if url:
            fleetrun.add_link(config, task.id, LINK, url)
        return
    if fleetrun.task_links(config, task.id).get(LINK):
        return  # another process (fleetrun approve) did it: this is its transition, replayed
    said = open_pr(config, task)
    config.stash.setdefault(SUMMARY_KEY, []).append((task.name, said))


@hookimpl
def fleetrun_terminal_summary(config: Any, exitstatus: int, counts: Any) -> None:
    lines = config.stash.get(SUMMARY_KEY, [])
    reporter = config.get_plugin("terminalreporter")
    if not lines or reporter is None:
        return
    for name, said in lines:
        reporter.write_line(f"github: {bodymod.one_line(name)}: {said}")


def open_pr(config: Any, task: Any) -> str:
    """Push the DONE task's branch and find or open its pull request; note what happened.

    :return: one line saying so (the URL, or why there is none).
    """
    try:
        url, said = _open_pr(config, fleetrun.open_ledger(config).get(task.id) or task)
    except Exception as e:  # a bug here must not stop the loop: the task is DONE already
        url, said = None, f"no pull request: internal error: {type(e).__name__}: {tail(str(e))}"
    fleetrun.add_note(config, task.id, f"github: {said}")
    if url is not None:
        fleetrun.add_link(config, task.id, LINK, url)
    return said


def _open_pr(config: Any, task: Any) -> tuple[Optional[str], str]:
    s = settings(config)
    timeout = float(s["timeout_s"])
    handoff = task.handoff or {}
    branch = handoff.get("branch") or task.branch  # a peer's, fetched back, may be named -from-PEER here
    if not branch:
        return None, "no pull request: the task has no branch (it has no git_ref)"
    top = run([s["git"], "rev-parse", "--show-toplevel"], str(task.spec.cwd), timeout)
    if not top.ok:
        return None, "no pull request: " + failure(f"{task.spec.cwd} is not in a git repository here", top)
    repo = top.out.strip()
    has = run([s["git"], "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}^{{commit}}"], repo, timeout)
    if not has.ok:
        where = (
            f" (it ran on {task.host} and its branch was not fetched back)" if task.host not in (None, "local") else ""
        )
        return None, f"no pull request: branch {branch} is not in {repo}{where}; nothing was pushed"
    remote = s["remote"]
    pushed = run([s["git"], "push", remote, f"refs/heads/{branch}:refs/heads/{branch}"], repo, timeout)
    if not pushed.ok:
        return None, "no pull request: " + failure(f"git push {remote} {branch} failed", pushed)
    repo_arg = ["--repo", s["repo"]] if s["repo"] else []
    listed = run([s["gh"], "pr", "list", "--head", branch, "--json", "url", *repo_arg], repo, timeout)
    if not listed.ok:
        return None, f"pushed {branch} to {remote}; no pull request: " + failure("gh pr list", listed)
    found = parse_list(listed.out)
    if isinstance(found, str):
        return None, f"pushed {branch} to {remote}; no pull request: gh pr list {found}"
    if found[1] is not None:
        return found[1], f"pushed {branch} to {remote}; its pull request is open already: {found[1]}"
    base = _base(s, repo, task.spec.git_ref or "", timeout)
    argv = [
        s["gh"],
        "pr",
        "create",
        "--head",
        branch,
        *(["--base", base] if base else []),
        "--title",
        bodymod.title(task.name, task.spec.prompt or ""),
        "--body-file",
        "-",
        *(["--draft"] if s["draft"] else []),
        *repo_arg,
    ]
    made = run(argv, repo, timeout, stdin=bodymod.body(facts(config, task, branch, base), __version__))
    if not made.ok:
        again = existing_from_error(made.err) if made.code is not None else None
        if again is not None:  # opened meanwhile by another process
            return again, f"pushed {branch} to {remote}; its pull request is open already: {again}"
        return None, f"pushed {branch} to {remote}; no pull request: " + failure("gh pr create", made)
    url = parse_created(made.out)
    if isinstance(url, str):
        return None, f"pushed {branch} to {remote}; no pull request: gh pr create {url}"
    return url[0], f"pushed {branch} to {remote}; opened {'draft ' if s['draft'] else ''}pull request {url[0]}"


def _base(s: dict[str, Any], repo: str, git_ref: str, timeout: float) -> Optional[str]:
    """The task's ``git_ref`` when it names a branch here (``main``, or ``origin/main``
    of the remote), else ``[github] base``, else None (gh's default: the repository's
    default branch)."""
    if git_ref and run([s["git"], "show-ref", "--verify", "--quiet", f"refs/heads/{git_ref}"], repo, timeout).ok:
        return git_ref
    prefix = f"{s['remote']}/"
    if (
        git_ref.startswith(prefix)
        and run([s["git"], "show-ref", "--verify", "--quiet", f"refs/remotes/{git_ref}"], repo, timeout).ok
    ):
        return git_ref[len(prefix) :]
    return s["base"]


def facts(config: Any, task: Any, branch: str, base: Optional[str]) -> bodymod.Facts:
    """What the body says, from the ledger."""
    led = fleetrun.open_ledger(config)
    attempts = led.attempts(task.id)
    numbers = {a.id: a.number for a in attempts}
    verdicts = [
        bodymod.Verdict(numbers.get(v.attempt_id, 0), v.kind, v.label, v.passed, v.reason)
        for v in led.verdicts(task.id)
    ]
    return bodymod.Facts(
        name=task.name,
        task_id=task.id,
        prompt=task.spec.prompt or "",
        cause=task.reason,
        branch=branch,
        base=base,
        attempts=task.attempts,
        retries=task.retries,
        resumes=task.resumes,
        cost_usd=task.cost_usd,
        cost_known=all(a.cost_usd is not None for a in attempts),
        summary=(task.handoff or {}).get("summary") or "",
        host=task.host or "local",
        verdicts=verdicts,
    )


# -- the verb: fleetrun github pr TASK... --------------------------------------------------


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["pr"], help="pr: push and open (or find) the pull request again")
    parser.add_argument("tasks", nargs="+", metavar="TASK", help="a DONE task's id or name")


def _verb(config: Any, out: TextIO, err: TextIO) -> int:
    led = fleetrun.open_ledger(config)
    code = fleetrun.ExitCode.OK
    for ref in config.option.tasks:
        task = led.find(ref)
        if task is None:
            raise fleetrun.UsageError(f"no task with id or name {ref!r} (fleetrun status lists them)", key="TASK")
        if task.state is not fleetrun.State.DONE:
            print(f"{task.name} {task.id}: {task.state}; pull requests are for DONE tasks", file=out)
            code = fleetrun.ExitCode.TASKS_FAILED
            continue
        said = open_pr(config, task)
        print(f"{task.name} {task.id}: {said}", file=out)
        if fleetrun.task_links(led, task.id).get(LINK) is None:
            code = fleetrun.ExitCode.TASKS_FAILED
    return int(code)


@hookimpl
def fleetrun_verbs(pluginmanager: Any) -> list[fleetrun.VerbDecl]:
    return [
        fleetrun.VerbDecl(
            "github", "push a DONE task's branch and open its pull request (fleetrun-github)", _verb, _arguments
        )
    ]

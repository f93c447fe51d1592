"""``fleetrun gc --branches``: the branches fleetrun created for tasks that have ended.

A branch can go when every task of the ledger that worked on it (in that repository)
has ended, no task that depends on one of them is still to run (its prompt names the
branch, and ``base = "dependencies"`` merges it), it is checked out nowhere that
stays, and either it is merged into the task's ``git_ref`` or the task was never DONE
(a DONE task's unmerged branch is the work to merge: always kept). Listed first;
deleted with ``--yes``, only if its tip is still the one listed (``git update-ref -d``
with the old value), under the lock a new attempt takes to make a worktree.

Only a branch the ledger shows fleetrun made for the task is considered: the task's
``branch`` column (set only from the workspace fleetrun prepared, on a branch
collection checked was new or fleetrun's) equal to the name fleetrun gives that task
(``branch =``, else ``fleetrun/<name>-<id>``), in a worktree workspace. A user's
branch, and a branch with fleetrun's prefix that no task of the ledger worked on,
are never looked at. git runs only in the repository recorded at prepare, never in
a worktree.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional, TextIO

from .gitutil import GitError, common_dir, git, repo_lock, repo_toplevel
from .states import State
from .taskspec import safe_slug
from .textutil import safe_name, safe_text

if TYPE_CHECKING:
    from .config import Config
    from .ledger import Ledger, Task


@dataclass
class Case:
    """One branch of ended tasks in one repository, and what gc does with it."""

    branch: str
    top: str
    common: str
    tasks: list[Task] = field(default_factory=list)  # newest first
    tip: str = ""
    why: str = ""  # why it can go (merged into main / never DONE...)
    keep: str = ""  # why it stays; "" when it can go
    in_worktree: str = ""  # the task's own worktree it is checked out in, if gc removes that one

    @property
    def task(self) -> Task:
        return self.tasks[0]

    def title(self) -> str:
        t = self.task
        return f"branch {safe_text(self.branch)} of {t.state.value.lower()} task {safe_name(t.name)} {t.id}"


def fleetrun_branch(t: Task) -> str:
    """The branch fleetrun gives a task (the worktree plugin's rule)."""
    return t.spec.branch or f"fleetrun/{safe_slug(t.name)}-{t.id}"


def _repo_of(led: Ledger, t: Task) -> Optional[str]:
    """The repository fleetrun made the task's worktree in, from its newest attempt
    that prepared a worktree on the task's branch; None if it never did."""
    for a in reversed(led.attempts(t.id)):
        ws = a.workspace or {}
        if ws.get("is_worktree") and ws.get("branch") == t.branch and ws.get("repo"):
            return str(ws["repo"])
    return None


def _rev(top: str, ref: str) -> str:
    return git(top, "rev-parse", "--verify", "--quiet", "--end-of-options", ref, check=False).strip()


def _count(top: str, tip: str, base: str) -> int:
    try:
        return int(git(top, "rev-list", "--count", tip, "--not", base, "--").strip() or 0)
    except (GitError, ValueError):
        return -1


def _checked_out(top: str) -> dict[str, tuple[str, str]]:
    """branch -> (the worktree it is checked out in, that place in words), for every
    worktree of the repository; the words say when the worktree is gone but still
    listed (gc never runs ``git worktree prune`` in a user's repository: it forgets
    every missing worktree, one on an unplugged drive too)."""
    found: dict[str, tuple[str, str]] = {}
    path, branch = "", ""
    for line in [*git(top, "worktree", "list", "--porcelain", check=False).splitlines(), ""]:
        if line.startswith("worktree "):
            path = line[len("worktree ") :]
        elif line.startswith("branch refs/heads/"):
            branch = line[len("branch refs/heads/") :]
            found[branch] = (path, safe_text(path))
        elif line.startswith("prunable") and branch:
            found[branch] = (
                path,
                f"{safe_text(path)}, a worktree that is gone but still listed "
                f"(`git -C {safe_text(top)} worktree prune` forgets it)",
            )
        elif not line:
            path, branch = "", ""
    return found


def plan(config: Config, led: Ledger, freed: set[str]) -> tuple[list[Case], list[Task]]:
    """What ``--branches`` would do. :param freed: the real paths of the worktrees gc
    removes (or, listing, would remove) in this run: a branch checked out only there
    is free. :return: (the cases, the ended peer tasks whose branch is on the peer)."""
    tasks = led.tasks()
    live_deps: dict[str, str] = {}  # task id -> a dependent that has not ended
    for t in tasks:
        if not t.state.terminal:
            for d in t.deps:
                live_deps.setdefault(d, t.name)
    repos: dict[str, Optional[tuple[str, str]]] = {}
    groups: dict[tuple[str, str], Case] = {}
    peers: list[Task] = []
    for t in sorted(tasks, key=lambda t: t.created, reverse=True):
        if not t.branch or t.branch != fleetrun_branch(t):
            continue
        if t.host not in (None, "local"):
            if t.state.terminal:
                peers.append(t)
            continue
        repo = _repo_of(led, t)
        if repo is None:
            continue
        if repo not in repos:
            top = repo_toplevel(repo) if os.path.isdir(repo) else None
            repos[repo] = (top, common_dir(top)) if top else None
        found = repos[repo]
        if found is None:
            continue
        key = (found[1], t.branch)
        case = groups.setdefault(key, Case(t.branch, found[0], found[1]))
        case.tasks.append(t)
    cases: list[Case] = []
    worktrees: dict[str, dict[str, tuple[str, str]]] = {}
    for case in sorted(groups.values(), key=lambda c: (c.task.created, c.task.id)):
        if any(not t.state.terminal for t in case.tasks):
            continue  # in use: not listed
        case.tip = _rev(case.top, f"refs/heads/{case.branch}")
        if not case.tip:
            continue  # already gone
        cases.append(case)
        refs = {t.spec.git_ref for t in case.tasks if t.spec.git_ref}
        dependent = next((live_deps[t.id] for t in case.tasks if t.id in live_deps), None)
        if dependent is not None:
            case.keep = f"task {safe_name(dependent)} depends on it and has not ended"
            continue
        if case.branch in refs or not refs:
            case.keep = "it is the tasks' git_ref"
            continue
        done = [t for t in case.tasks if any(r.to_state == State.DONE.value for r in led.transitions(t.id))]
        base = case.task.spec.git_ref or ""
        if done:
            base = done[0].spec.git_ref or ""
            n = _count(case.top, case.tip, base)
            if n != 0:
                what = f"{n} commit(s)" if n > 0 else "commits"
                case.keep = f"DONE with {what} not in {safe_text(base)} (merge it, or delete it by hand)"
                continue
            case.why = f"merged into {safe_text(base)}"
        else:
            n = _count(case.top, case.tip, base)
            case.why = "never DONE" + (f", {n} commit(s) not in {safe_text(base)}" if n > 0 else "")
        if case.top not in worktrees:
            worktrees[case.top] = _checked_out(case.top)
        found = worktrees[case.top].get(case.branch)
        if found is not None:
            path, where = found
            own = {os.path.realpath(t.worktree) for t in case.tasks if t.worktree}
            real = os.path.realpath(path)
            if real in freed and os.path.lexists(path):  # listing: --yes removes it first
                case.in_worktree = where
            elif real in own and os.path.lexists(path):
                case.keep = f"checked out in its worktree {where}"
            else:
                case.keep = f"checked out in {where}"
    return cases, peers


def deletable(cases: list[Case]) -> int:
    return sum(1 for c in cases if not c.keep)


def _delete(config: Config, led: Ledger, case: Case) -> str:
    """Delete the branch if nothing changed since it was listed; what happened, in words."""
    with repo_lock(config.home / "locks", case.top, common=case.common):
        for t in case.tasks:
            now = led.get(t.id)
            if now is None or not now.state.terminal or now.branch != case.branch:
                return f"kept branch {safe_text(case.branch)}: task {safe_name(t.name)} {t.id} is in use again"
            if any(a.state in ("leased", "starting", "running") for a in led.attempts(t.id)):
                return f"kept branch {safe_text(case.branch)}: an attempt of task {safe_name(t.name)} is ending"
        found = _checked_out(case.top).get(case.branch)
        if found is not None:
            return f"kept branch {safe_text(case.branch)}: checked out in {found[1]}"
        try:
            # compare-and-delete: a branch moved since it was listed stays
            git(case.top, "update-ref", "-d", f"refs/heads/{case.branch}", case.tip)
        except GitError:
            return f"kept branch {safe_text(case.branch)}: it moved since it was listed"
        git(case.top, "config", "--remove-section", f"branch.{case.branch}", check=False)
        short = case.tip[:12]
        for t in case.tasks:
            led.update_task(t.id, branch=None)  # status and a retry see it is gone
            led.add_note(
                t.id,
                f"gc deleted branch {case.branch} (was {short}; "
                f"`git branch {case.branch} {short}` brings it back while git keeps the commit)",
            )
    return (
        f"deleted branch {safe_text(case.branch)} (was {short}; `git branch {safe_text(case.branch)} {short}` "
        "brings it back while git keeps the commit)"
    )


def run(config: Config, led: Ledger, out: TextIO, yes: bool, force: bool, freed: set[str]) -> None:
    """List (and with ``yes`` delete) the branches of ended tasks."""
    cases, peers = plan(config, led, freed)
    for t in peers:
        print(
            f"branch {safe_text(t.branch)} of {t.state.value.lower()} task {safe_name(t.name)} {t.id}: on "
            f"{safe_text(t.host)}, not touched here",
            file=out,
        )
    if not cases:
        return
    kept_worktree = False
    for case in cases:
        if yes:
            if case.keep:
                print(f"kept {case.title()}: {case.keep}", file=out)
            else:
                print(_delete(config, led, case), file=out)
            continue
        if case.keep.startswith("checked out in its worktree"):
            kept_worktree = True
            print(
                f"{case.title()}: {case.why}, {case.keep}: --yes keeps it (the worktree stays), --force removes both",
                file=out,
            )
        elif case.keep:
            print(f"{case.title()}: kept, {case.keep}", file=out)
        else:
            after = f" (after its worktree {safe_text(case.in_worktree)})" if case.in_worktree else ""
            print(f"{case.title()}: {case.why}{after}", file=out)
    if not yes:
        n, gone = len(cases), deletable(cases)
        what = "1 branch of an ended task" if n == 1 else f"{n} branches of ended tasks"
        extra = "; --force also removes the worktrees gc keeps, and their branches" if kept_worktree else ""
        print(f"{what}: `fleetrun gc --branches --yes` deletes {gone} and keeps {n - gone}{extra}", file=out)

"""Built-in ``worktree`` plugin: a git worktree and branch per task.

A task with ``git_ref`` runs in ``$FLEETRUN_HOME/worktrees/<name>-<id>`` on branch
``fleetrun/<name>-<id>`` (or ``branch =``), made from ``git_ref`` in the repository
that holds ``cwd``; the user's checkout is never touched. Retries and resumes reuse
it. After DONE a clean worktree is removed and the branch stays; a dirty one is kept.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

from ..gitutil import GitError, common_dir, git, has_identity, is_dirty, repo_lock, repo_toplevel
from ..hookimpl import hookimpl
from ..reports import Handoff, Workspace
from ..states import State
from ..taskspec import safe_slug

DEFAULT_COMMIT_MESSAGE = "fleetrun: uncommitted work of attempt {attempt}"
SUMMARY_LIMIT = 2000


class WorkspaceError(Exception):
    """The workspace could not be made; the attempt does not start."""


def names_for(task: Any) -> tuple[str, str]:
    """(folder name, branch) for a task: both built from a sanitised name and the id."""
    slug = f"{safe_slug(task.name)}-{task.id}"
    branch = task.spec.branch or f"fleetrun/{slug}"
    return slug, branch


def _identity_args(path: str) -> list[str]:
    if has_identity(path):
        return []
    return ["-c", "user.name=fleetrun", "-c", "user.email=fleetrun@localhost"]


def _repo_of(config: Any, cwd: str) -> Optional[tuple[str, str]]:
    cache = config.stash.setdefault("worktree_repos", {})
    if cwd not in cache:
        top = repo_toplevel(cwd)
        cache[cwd] = (top, common_dir(top)) if top else None
    return cache[cwd]


@hookimpl(trylast=True)
def fleetrun_prepare_workspace(task: Any, attempt: Any, config: Any) -> Optional[Workspace]:
    spec = task.spec
    if not os.path.isdir(spec.cwd):
        raise WorkspaceError("working directory does not exist on this host")
    if not spec.git_ref:
        return Workspace(path=spec.cwd)
    found = _repo_of(config, spec.cwd)
    if found is None:
        raise WorkspaceError(f"{spec.cwd} is not in a git repository (git_ref needs one)")
    repo, common = found
    slug, branch = names_for(task)
    root = config.home / "worktrees"
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = root / slug
    sub = os.path.relpath(os.path.realpath(spec.cwd), os.path.realpath(repo))
    with repo_lock(config.home / "locks", repo, common=common):
        if not (path / ".git").exists():
            if path.exists() and any(path.iterdir()):
                raise WorkspaceError(f"{path} exists and is not a worktree; remove it or fleetrun gc")
            try:
                git(repo, "worktree", "add", "-b", branch, "--", str(path), spec.git_ref)
            except GitError:
                if git(repo, "branch", "--list", "--", branch).strip():
                    git(repo, "worktree", "add", "--", str(path), branch)
                else:
                    try:
                        git(repo, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{spec.git_ref}^{{commit}}")
                    except GitError:
                        raise WorkspaceError(f"git_ref {spec.git_ref!r} is not a commit in {repo}") from None
                    raise
    wpath = path / sub if sub != "." else path
    return Workspace(path=str(wpath), branch=branch, repo=repo, base_ref=spec.git_ref, is_worktree=True,
                     root=str(path))


def worktree_root(ws: Workspace) -> str:
    """The top of the worktree (a task's cwd may be a subfolder of its repository)."""
    return git(ws.path, "rev-parse", "--show-toplevel").strip()


@hookimpl(trylast=True)
def fleetrun_collect_work(task: Any, attempt: Any, workspace: Workspace, config: Any) -> Optional[str]:
    """Commit what the attempt left uncommitted, so verifiers, handoffs and dependents
    see exactly what is on the branch."""
    if not workspace.is_worktree:
        return None
    top = workspace.root or worktree_root(workspace)
    if not is_dirty(top):
        return None
    template = config.setting("worktree", "commit_message", DEFAULT_COMMIT_MESSAGE)
    message = str(template).replace("{attempt}", str(attempt.number)).replace("{task}", task.name)
    git(top, "add", "-A")
    git(top, *_identity_args(top), "commit", "-q", "--no-verify", "-m", message)
    return git(top, "rev-parse", "HEAD").strip()


@hookimpl(trylast=True)
def fleetrun_handoff(task: Any, attempt: Any, config: Any) -> Optional[Handoff]:
    summary = (attempt.result_text or "").strip() if attempt is not None else ""
    if len(summary) > SUMMARY_LIMIT:
        summary = summary[:SUMMARY_LIMIT] + " [...]"
    return Handoff(task_name=task.name, branch=task.branch, summary=summary, host=task.host or "local")


@hookimpl(trylast=True)
def fleetrun_cleanup_workspace(task: Any, config: Any) -> None:
    if task.state is not State.DONE or not task.worktree or task.host not in (None, "local"):
        return
    path = Path(task.worktree)
    led = config.stash.get("ledger")
    if not (path / ".git").exists():
        return
    att = led.latest_attempt(task.id) if led is not None else None
    repo = (att.workspace or {}).get("repo") if att is not None else None
    found = _repo_of(config, repo) if repo else None
    if found is None:
        top = git(path, "rev-parse", "--show-toplevel").strip()
        cd = (Path(top) / git(top, "rev-parse", "--git-common-dir").strip()).resolve()
        found = (str(cd.parent), str(cd))
    repo_dir, common = found
    with repo_lock(config.home / "locks", repo_dir, common=common):
        try:
            git(repo_dir, "worktree", "remove", "--", str(path))
        except GitError as e:
            why = ("it has uncommitted changes" if "modified or untracked" in e.output else str(e))
            note = f"kept worktree {path}: {why}"
            if led is not None and note not in (text for _, text in led.notes(task.id)):
                led.add_note(task.id, note)
            return
    if led is not None:
        led.add_note(task.id, f"removed clean worktree {path}; branch {task.branch} stays")

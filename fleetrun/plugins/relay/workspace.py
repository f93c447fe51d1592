"""What a peer's ``prepare`` reply is held to: the workspace asked for, on the branch this
supervisor chose for the task (:func:`chosen_branch`, the only branch a fetch-back
writes), checked by :func:`check_workspace` (pure: paths and names only)."""

from __future__ import annotations

import os
from typing import Any

from ...reports import Workspace
from ...taskspec import safe_slug
from .transport import PeerError


class WrongWorkspace(PeerError):
    """A peer's ``prepare`` named a workspace other than the one asked for."""

    def __init__(self, message: str) -> None:
        super().__init__(message, 0)


def chosen_branch(task: Any) -> str:
    """The branch this supervisor gives the task: ``branch =``, or
    ``fleetrun/<name>-<id>`` (as the ``worktree`` plugin names it). The only branch a
    fetch-back ever writes for the task."""
    return task.spec.branch or f"fleetrun/{safe_slug(task.name)}-{task.id}"


def _inside(path: str, top: str) -> bool:
    path, top = os.path.normpath(path), os.path.normpath(top)
    return path == top or path.startswith(top.rstrip("/") + "/")


def check_workspace(task: Any, ws: dict[str, Any], peer: str) -> Workspace:
    """The workspace a peer's ``prepare`` reply names, held to what was asked: for a
    task with ``git_ref``, a worktree on :func:`chosen_branch` made from ``git_ref``,
    in a repository that holds the task's ``cwd``, the path inside the worktree and the
    worktree not the repository itself; for one without, the task's ``cwd`` itself.

    :raises WrongWorkspace: saying what differs.
    """
    spec = task.spec
    bad = f"{peer} answered prepare with a workspace that is not the one asked for:"
    if not spec.git_ref:
        if ws.get("is_worktree") or ws.get("path") != spec.cwd or ws.get("branch"):
            raise WrongWorkspace(f"{bad} {ws.get('path')} (branch {ws.get('branch')}), not the task's cwd {spec.cwd}")
        return Workspace(path=spec.cwd)
    want = chosen_branch(task)
    if ws.get("branch") != want:
        raise WrongWorkspace(f"{bad} branch {ws.get('branch')!r}, not {want!r}, the branch chosen for this task")
    if not ws.get("is_worktree") or ws.get("base_ref") != spec.git_ref:
        raise WrongWorkspace(f"{bad} not a worktree made from git_ref {spec.git_ref!r}")
    repo, root, path = ws.get("repo"), ws.get("root") or ws.get("path"), ws.get("path")
    if not (
        isinstance(repo, str)
        and isinstance(root, str)
        and isinstance(path, str)
        and all(os.path.isabs(p) and ".." not in p.split("/") for p in (repo, root, path))
    ):
        raise WrongWorkspace(f"{bad} its repo, root and path must be absolute paths")
    if not (_inside(spec.cwd, repo) or _inside(os.path.realpath(spec.cwd), repo)):
        raise WrongWorkspace(f"{bad} repository {repo} does not hold the task's cwd {spec.cwd}")
    if not _inside(path, root) or _inside(root, repo):
        raise WrongWorkspace(f"{bad} worktree {root} with path {path}")
    return Workspace(path=path, branch=want, repo=repo, base_ref=spec.git_ref, is_worktree=True, root=root)

"""The ``worktree`` plugin's pins: a worktree is known from its repository's side (its
``worktrees/*`` folders), never from the worktree's ``.git``, which the agent can
rewrite; each pin is cached for the run and checked again before every use."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from ...gitutil import (
    Pinned,
    WorktreeTampered,
    check_pinned,
    common_dir,
    pin_worktree,
    repo_toplevel,
    worktree_gitdirs,
    wt_git,
)
from ...reports import Workspace
from ...stash import StashKey

if TYPE_CHECKING:
    from ...config import Config

#: cwd -> (repository top, its git folder), or None outside a repository: found once
#: per run (a ``git rev-parse`` per task and pass would be slow).
REPOS_KEY = StashKey[dict[str, Optional[tuple[str, str]]]]()
#: (worktree root, git folder) -> its pin, checked again before every use.
PINS_KEY = StashKey[dict[tuple[str, str], Pinned]]()
#: (root, git folder) as given -> as real paths: resolved once a run, not on every look
#: at a pin (a collect, a cleanup, each pass of a worktree being added).
REAL_KEY = StashKey[dict[tuple[str, str], tuple[str, str]]]()


def identity_args(p: Pinned) -> list[str]:
    """``-c`` options giving a commit an author when the repository names none."""
    if wt_git(p, "config", "user.email", check=False).strip():
        return []
    return ["-c", "user.name=fleetrun", "-c", "user.email=fleetrun@localhost"]


def repo_of(config: Config, cwd: str) -> Optional[tuple[str, str]]:
    """(top, git folder) of the repository holding ``cwd``, or None; found once a run."""
    cache = config.stash.setdefault(REPOS_KEY, {})
    if cwd not in cache:
        top = repo_toplevel(cwd)
        cache[cwd] = (top, common_dir(top)) if top else None
    return cache[cwd]


def pinned(config: Config, root: str, common: str) -> Pinned:
    """The worktree at ``root`` pinned to the repository whose git folder is ``common``,
    checked now. The pin is found from the repository's side (its ``worktrees/*``
    folders), never from the worktree's ``.git``, which the agent can rewrite; it is
    cached per worktree for the run, and checked again before every use.

    :raises WorktreeTampered: when ``root`` is not, or no longer, that worktree.
    """
    cache: dict[tuple[str, str], Pinned] = config.stash.setdefault(PINS_KEY, {})
    key = _real(config, root, common)
    p = cache.get(key)
    if p is not None:
        try:
            check_pinned(p)
            return p
        except WorktreeTampered as e:
            # a worktree removed and made again at the same place has a new admin
            # folder: look again from the repository's side before calling it tampered
            del cache[key]
            try:
                p = pin_worktree(root, common)
            except WorktreeTampered:
                raise e from None  # what the known pin found wrong says more
            cache[key] = p
            return p
    p = pin_worktree(root, common)
    cache[key] = p
    return p


def forget_pin(config: Config, root: str, common: str) -> None:
    key = config.stash.setdefault(REAL_KEY, {}).pop((root, common), None)
    config.stash.setdefault(PINS_KEY, {}).pop(key or (os.path.realpath(root), os.path.realpath(common)), None)


def _real(config: Config, root: str, common: str) -> tuple[str, str]:
    """``(root, common)`` as real paths, resolved once (until :func:`forget_pin`). The
    pin found for them is checked before every use all the same, from the real paths
    it holds, so a worktree moved or replaced since is not followed."""
    known = config.stash.setdefault(REAL_KEY, {})
    got = known.get((root, common))
    if got is None:
        got = known[(root, common)] = (os.path.realpath(root), os.path.realpath(common))
    return got


def worktree_root(ws: Workspace, common: str) -> str:
    """The top of the worktree holding ``ws.path`` (a task's cwd may be a subfolder of its
    repository), found among the repository's worktrees (``<common>/worktrees/*/gitdir``),
    not by asking git inside the worktree.

    :raises WorktreeTampered: when no worktree of that repository holds it.
    """
    if ws.root:
        return ws.root
    real = os.path.realpath(ws.path)
    best = ""
    for _, target in worktree_gitdirs(Path(common) / "worktrees"):
        top = os.path.dirname(os.path.realpath(target))
        if (real == top or real.startswith(top + os.sep)) and len(top) > len(best):
            best = top
    if not best:
        raise WorktreeTampered(f"{ws.path} is in no worktree of {common}")
    return best


def workspace_pin(config: Config, ws: Workspace) -> Pinned:
    """The pin of a prepared worktree workspace (``ws.repo`` is the repository fleetrun
    made it in, recorded at prepare).

    :raises WorktreeTampered: when it cannot be pinned.
    """
    found = repo_of(config, ws.repo) if ws.repo else None
    if found is None:
        raise WorktreeTampered(f"the repository of the worktree at {ws.path} ({ws.repo}) is not a git repository")
    _, common = found
    return pinned(config, worktree_root(ws, common), common)

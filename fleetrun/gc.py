"""``fleetrun gc``: find worktrees and attempt folders that no task in the ledger owns.

Lists them; with ``--yes`` removes them. A dirty worktree, or one whose branch holds
commits found on no other branch, is kept unless ``--force``. Branches are never
deleted: the work on them is yours.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Optional, TextIO

from .exceptions import ExitCode
from .gitutil import GitError, git, is_dirty, repo_lock
from .taskspec import safe_slug


def _worktree_facts(path: Path) -> tuple[Optional[str], Optional[str], bool, int]:
    """(repo folder, branch, dirty, commits only on this branch) of a worktree."""
    try:
        top = git(path, "rev-parse", "--show-toplevel").strip()
        common = git(top, "rev-parse", "--git-common-dir").strip()
        repo = str((Path(top) / common).resolve().parent)
        branch = git(top, "rev-parse", "--abbrev-ref", "HEAD").strip()
        dirty = is_dirty(top)
        # commits reachable from HEAD and from no other branch or tag (a detached HEAD's
        # commits are on no branch at all). --exclude patterns for --branches have no
        # refs/heads/ prefix.
        other = [f"--exclude={branch}"] if branch and branch != "HEAD" else []
        out = git(top, "rev-list", "--count", "HEAD", "--not", *other, "--branches", "--tags")
        unique = int(out.strip() or 0)
        return repo, (branch if branch != "HEAD" else None), dirty, unique
    except (GitError, ValueError, OSError):
        return None, None, False, 0


def main(config: Any, out: TextIO, err: TextIO) -> int:
    from .commands import open_ledger

    led = open_ledger(config)
    owned_wt = {str(Path(t.worktree)) for t in led.tasks() if t.worktree}
    # a peer task's branch fetched back here for its brain/agent verifiers (relay plugin)
    owned_wt |= {str(config.home / "worktrees" / f"{safe_slug(t.name)}-{t.id}-fetched")
                 for t in led.tasks() if t.host not in (None, "local") and not t.state.terminal}
    owned_att = {a.id for a in led.attempts()}
    yes = bool(config.getoption("yes"))
    force = bool(config.getoption("force"))
    found = 0

    wroot = config.home / "worktrees"
    for path in sorted(wroot.iterdir()) if wroot.is_dir() else []:
        if str(path) in owned_wt:
            continue
        found += 1
        repo, branch, dirty, unique = _worktree_facts(path)
        why = []
        if repo is None:
            why.append("not a git worktree fleetrun can read")
        if dirty:
            why.append("uncommitted changes")
        if unique:
            where = f"on {branch}" if branch else "on a detached HEAD"
            why.append(f"{unique} commit(s) {where} found on no other branch")
        facts = ", ".join(why) or "clean"
        if not yes:
            print(f"orphan worktree {path} ({facts})", file=out)
            continue
        if why and not force:
            print(f"kept {path}: {facts} (--force removes the worktree; the branch stays)", file=out)
            continue
        if repo is not None:
            with repo_lock(config.home / "locks", repo):
                git(repo, "worktree", "remove", "--force", "--", str(path), check=False)
                if path.exists():
                    shutil.rmtree(path)
                git(repo, "worktree", "prune", check=False)
        else:
            shutil.rmtree(path)
        print(f"removed worktree {path}" + (f" (branch {branch} stays)" if branch else ""), file=out)

    aroot = config.home / "attempts"
    for path in sorted(aroot.iterdir()) if aroot.is_dir() else []:
        if path.name in owned_att:
            continue
        found += 1
        if yes:
            shutil.rmtree(path)
            print(f"removed attempt folder {path}", file=out)
        else:
            print(f"orphan attempt folder {path}", file=out)

    if not found:
        print("nothing to collect: every worktree and attempt folder belongs to a task", file=out)
    elif not yes:
        print(f"{found} orphan(s); `fleetrun gc --yes` removes them", file=out)
    return ExitCode.OK

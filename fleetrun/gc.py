"""``fleetrun gc``: find worktrees and attempt folders that no task in the ledger owns,
and the worktrees of tasks that have ended (DONE, NEEDS_HUMAN, CANCELLED).

Lists them; with ``--yes`` removes them. A dirty worktree, or one whose branch holds
commits found on no other branch, is kept unless ``--force``. A task that has not
ended keeps its worktree, and a peer task's worktree is on the peer: said, not
touched. Branches stay, unless ``--branches`` (:mod:`fleetrun.gc_branches`), which
deletes only branches fleetrun created for ended tasks.

What lies in ``worktrees/`` and ``attempts/`` is not trusted to be what fleetrun put
there: gc never follows a symlink (it removes the link itself), never removes
anything that does not resolve inside the home, and runs git for a worktree only
once the repository's side confirms it (:func:`~fleetrun.gitutil.pin_worktree`): a
folder whose ``.git`` names anything else is "not a git worktree fleetrun can read",
and ``--force`` removes only that folder, with no git run in whatever it names.
"""

from __future__ import annotations

import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, TextIO

from .exceptions import ExitCode
from .gitutil import GitError, Pinned, WorktreeTampered, git, pin_worktree, repo_lock, wt_git
from .states import TERMINAL
from .taskspec import safe_slug
from .textutil import safe_name, safe_text

if TYPE_CHECKING:
    from .config import Config


@dataclass
class Facts:
    """What gc knows about a folder in ``worktrees/``."""

    pinned: Optional[Pinned] = None
    branch: Optional[str] = None
    dirty: bool = False
    unique: int = 0


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _pin(path: Path) -> Optional[Pinned]:
    """The worktree at ``path`` pinned to its repository, or None when its ``.git`` is not
    a plain file naming a ``<common>/worktrees/<name>`` folder whose repository confirms
    the worktree (a ``.git`` pointing at a repository itself, or anywhere else, is not
    followed)."""
    dotgit = path / ".git"
    try:
        st = os.lstat(dotgit)
        if not stat.S_ISREG(st.st_mode) or st.st_size > 4096:
            return None
        text = dotgit.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None
    if not text.startswith("gitdir:"):
        return None
    target = text[len("gitdir:") :].strip()
    admin = os.path.realpath(target if os.path.isabs(target) else os.path.join(path, target))
    if os.path.basename(os.path.dirname(admin)) != "worktrees":
        return None
    try:
        back = (Path(admin) / "commondir").read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None
    common = os.path.realpath(back if os.path.isabs(back) else os.path.join(admin, back))
    if common != os.path.dirname(os.path.dirname(admin)):
        return None
    try:
        return pin_worktree(path, common)
    except WorktreeTampered:
        return None


def _worktree_facts(path: Path) -> Facts:
    """Branch, dirty, and commits only on this branch, of a worktree git is run for
    only once it is pinned."""
    pinned = _pin(path)
    if pinned is None:
        return Facts()
    try:
        branch = wt_git(pinned, "rev-parse", "--abbrev-ref", "HEAD").strip()
        dirty = bool(wt_git(pinned, "status", "--porcelain", "--untracked-files=all").strip())
        # commits reachable from HEAD and from no other branch or tag (a detached HEAD's
        # commits are on no branch at all). --exclude patterns for --branches have no
        # refs/heads/ prefix.
        other = [f"--exclude={branch}"] if branch and branch != "HEAD" else []
        out = wt_git(pinned, "rev-list", "--count", "HEAD", "--not", *other, "--branches", "--tags")
        unique = int(out.strip() or 0)
    except (GitError, WorktreeTampered, ValueError, OSError):
        return Facts()
    return Facts(pinned, branch if branch != "HEAD" else None, dirty, unique)


def _remove_entry(path: Path, home_real: str) -> Optional[str]:
    """Remove a link or a plain file (never what a link points at). Returns what was
    removed (``link``/``file``), or None if it is neither."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISDIR(st.st_mode):
        return None
    if not _inside(os.path.realpath(path.parent), home_real):
        return None
    os.unlink(path)
    return "link" if stat.S_ISLNK(st.st_mode) else "file"


def _rmtree_inside(path: Path, home_real: str) -> bool:
    """``shutil.rmtree`` for a real folder that resolves inside the home (rmtree itself
    removes links inside it without following them)."""
    if os.path.islink(path) or not path.is_dir():
        return False
    if not _inside(os.path.realpath(path), home_real) or os.path.realpath(path) == home_real:
        return False
    shutil.rmtree(path)
    return True


def _scan_root(root: Path, home_real: str, out: TextIO) -> list[Path]:
    """The entries of ``worktrees/`` or ``attempts/``; none when that folder is itself
    a link or resolves outside the home (its entries are not fleetrun's)."""
    if os.path.islink(root):
        print(
            f"{safe_text(root)} is a link to {safe_text(os.path.realpath(root))}: not followed, nothing in it "
            "was looked at (remove the link by hand if it is not yours)",
            file=out,
        )
        return []
    if not root.is_dir():
        return []
    if not _inside(os.path.realpath(root), home_real):  # pragma: no cover - a link is caught above
        return []
    return sorted(root.iterdir())


def _link_text(path: Path) -> str:
    try:
        return os.readlink(path)
    except OSError:  # pragma: no cover
        return "?"


def _ended_worktrees(led: Any) -> dict[str, Any]:
    """The worktrees of ended tasks (DONE, NEEDS_HUMAN, CANCELLED) on this machine, by
    path: collectable like orphans (a retry makes the worktree again from the branch,
    which stays). One whose attempt is still ending (a cancel's grace period) is not."""
    busy = {a.task_id for a in led.attempts(states={"leased", "starting", "running"})}
    return {
        str(Path(t.worktree)): t
        for t in led.tasks(set(TERMINAL))
        if t.worktree and t.host in (None, "local") and t.id not in busy
    }


def _still_ended(led: Any, task: Any) -> bool:
    """Checked again just before removing: retried meanwhile, its worktree is in use."""
    now = led.get(task.id)
    return (
        now is not None
        and now.state is task.state
        and now.worktree == task.worktree
        and not [a for a in led.attempts(task.id) if a.state in ("leased", "starting", "running")]
    )


def main(config: Config, out: TextIO, err: TextIO) -> int:
    from .ledger import open_ledger

    led = open_ledger(config)
    ended = _ended_worktrees(led)
    owned_wt = {str(Path(t.worktree)) for t in led.tasks() if t.worktree} - set(ended)
    # a peer task's branch fetched back here for its brain/agent verifiers (relay plugin)
    owned_wt |= {
        str(config.home / "worktrees" / f"{safe_slug(t.name)}-{t.id}-fetched")
        for t in led.tasks()
        if t.host not in (None, "local") and not t.state.terminal
    }
    owned_att = {a.id for a in led.attempts()}
    yes = bool(config.getoption("yes"))
    force = bool(config.getoption("force"))
    with_branches = bool(config.getoption("branches"))
    home_real = os.path.realpath(config.home)
    found = 0
    # what --yes would keep, and why: said before anything is removed
    n_kept = 0
    kept_why: set[str] = set()
    # the worktrees this run removes (or, listing, would): a branch checked out only
    # there can go with --branches
    freed: set[str] = set()

    for t in led.tasks(set(TERMINAL)):
        if t.worktree and t.host not in (None, "local"):
            print(
                f"worktree of {t.state.value.lower()} task {safe_name(t.name)} {t.id}: {safe_text(t.worktree)} "
                f"on {safe_text(t.host)} (on the peer: not touched here)",
                file=out,
            )

    for path in _scan_root(config.home / "worktrees", home_real, out):
        if str(path) in owned_wt:
            continue
        found += 1
        shown = safe_text(path)
        task = ended.get(str(path))
        what = (
            f"worktree of {task.state.value.lower()} task {safe_name(task.name)} {task.id}: {shown}"
            if task is not None
            else f"orphan worktree {shown}"
        )
        if os.path.islink(path) or not path.is_dir():
            kind = "link" if os.path.islink(path) else "file"
            if not yes:
                extra = f" -> {safe_text(_link_text(path))}" if kind == "link" else ""
                print(f"orphan {kind} {shown}{extra}", file=out)
                continue
            done = _remove_entry(path, home_real)
            if done:
                tail = " (what it points at is not touched)" if done == "link" else ""
                print(f"removed {done} {shown}{tail}", file=out)
            continue
        facts = _worktree_facts(path)
        why = []
        if facts.pinned is None:
            why.append("not a git worktree fleetrun can read")
        if facts.dirty:
            why.append("uncommitted changes")
        if facts.unique:
            where = f"on {safe_text(facts.branch)}" if facts.branch else "on a detached HEAD"
            why.append(f"{facts.unique} commit(s) {where} found on no other branch")
        text = ", ".join(why) or "clean"
        if not yes:
            if why and not force:
                n_kept += 1
                kept_why.update(w if "found on no other branch" not in w else "commits on no other branch" for w in why)
                print(f"{what} ({text}): --yes keeps it, --force removes it", file=out)
            else:
                freed.add(os.path.realpath(path))
                print(f"{what} ({text})", file=out)
            continue
        if why and not force:
            print(f"kept {shown}: {text} (--force removes the worktree; the branch stays)", file=out)
            continue
        retried = f"kept {shown}: task {safe_name(task.name)} {task.id} is no longer {task.state.value}" if task else ""
        if facts.pinned is not None:
            p = facts.pinned
            with repo_lock(config.home / "locks", os.path.dirname(p.common), common=p.common):
                # checked under the lock a new attempt takes to reuse the worktree
                if task is not None and not _still_ended(led, task):
                    print(retried, file=out)
                    continue
                # git runs in the repository the pin confirmed, naming that repository's
                # git folder, never from inside the worktree
                git(p.common, "worktree", "remove", "--force", "--", str(path), check=False)
                if path.exists():
                    _rmtree_inside(path, home_real)
                    git(p.common, "worktree", "prune", check=False)
            branch = f" (branch {safe_text(facts.branch)} stays)" if facts.branch else ""
            print(f"removed worktree {shown}{branch}", file=out)
        elif task is not None and not _still_ended(led, task):
            print(retried, file=out)
            continue
        elif _rmtree_inside(path, home_real):
            print(f"removed folder {shown} (no git was run for it)", file=out)
        if not os.path.lexists(path):
            freed.add(os.path.realpath(path))
            if task is not None:
                led.update_task(task.id, worktree=None)  # status and a retry see it is gone

    for path in _scan_root(config.home / "attempts", home_real, out):
        if path.name in owned_att:
            continue
        found += 1
        shown = safe_text(path)
        is_dir = not os.path.islink(path) and path.is_dir()
        if not yes:
            if is_dir:
                print(f"orphan attempt folder {shown}", file=out)
            else:
                kind = "link" if os.path.islink(path) else "file"
                extra = f" -> {safe_text(_link_text(path))}" if kind == "link" else ""
                print(f"orphan {kind} {shown}{extra}", file=out)
            continue
        if is_dir:
            if _rmtree_inside(path, home_real):
                print(f"removed attempt folder {shown}", file=out)
            continue
        done = _remove_entry(path, home_real)
        if done:
            tail = " (what it points at is not touched)" if done == "link" else ""
            print(f"removed {done} {shown}{tail}", file=out)

    stay = "branches: below" if with_branches else "branches always stay"
    if not found:
        print("nothing to collect: every worktree and attempt folder belongs to a task", file=out)
    elif not yes and n_kept:
        reasons = [
            r
            for r in ("uncommitted changes", "commits on no other branch", "not a git worktree fleetrun can read")
            if r in kept_why
        ]
        print(
            f"{found} to collect: `fleetrun gc --yes` removes {found - n_kept} and keeps {n_kept} "
            f"({' or '.join(reasons)}; `fleetrun gc --yes --force` removes "
            f"{'it' if n_kept == 1 else 'those'} too; {stay})",
            file=out,
        )
    elif not yes:
        print(
            f"{found} to collect; `fleetrun gc --yes` removes them "
            f"({'branches: below' if with_branches else 'branches stay'})",
            file=out,
        )
    from . import gc_branches

    if with_branches:
        gc_branches.run(config, led, out, yes, force, freed)
    else:  # said, so that they are found: what --branches would delete
        n = gc_branches.deletable(gc_branches.plan(config, led, freed)[0])
        if n:
            print(
                "1 branch of an ended task can go: `fleetrun gc --branches` lists it"
                if n == 1
                else f"{n} branches of ended tasks can go: `fleetrun gc --branches` lists them",
                file=out,
            )
    return ExitCode.OK

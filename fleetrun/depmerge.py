"""``base = "dependencies"``: a task's worktree gets each dependency's branch merged
in, in ``depends_on`` order, before its agent starts (the ``worktree`` plugin's prepare
calls :func:`merge_dependencies` with those :func:`missing_dependencies` finds not in
its branch yet: all of them for a new worktree, what a crash or a stopped merge left for
a reused one).

The branches are fleetrun's own, from the ledger (the dependency's branch, or the name
its fetch-back from a peer gave it here), never a name an agent wrote. Each merge is
``--no-ff --no-edit`` with fleetrun's identity and no hooks (:func:`~fleetrun.gitutil.wt_merge`).
A conflict stops the merging: what is left is described by a *conflict record*
(``{"task", "branch", "files", "pending"}``), which the workspace carries
(:attr:`~fleetrun.reports.Workspace.conflict`) so the prompt can name it, or which asks
a human (:func:`conflict_cause`).

A merge git could not write (a full disk) leaves what it wrote of the dependency's files
in the worktree, untracked, the last one cut short; git would refuse the next merge for
them. They are the merge's own, and nothing else writes there while it runs: they are
removed at once (:func:`_undo_unwritten_merge`), or, when the supervisor died first, by
the next merge of that dependency, from the record the merge left
(:data:`MERGE_RECORD`). An untracked file byte for byte the dependency's is its copy
too (:func:`_drop_dependency_copies`). Any other file in the merge's way is someone's
work and stays: the merge is refused and a human asked.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
from typing import Any, Optional

from . import crash
from .exceptions import SPACE_ERROR_TEXTS
from .gitutil import GitError, Pinned, git, merge_in_progress, unmerged_files, wt_git, wt_merge
from .taskspec import ref_problem
from .textutil import safe_text

#: The most files a ``merge_conflict:`` cause names; the note names them all.
CAUSE_FILES = 10


#: What git says when it could not write, which clears by itself: a full disk, a quota,
#: a read-only filesystem, a lock another git holds (lower case). On a full disk git
#: often names only the file it could not write (seen: "error: unable to write file
#: a.txt", "fatal: update_ref failed ...: couldn't write '.git/ORIG_HEAD.lock'"); a
#: failure that stays (a folder made read-only) ends with the start's own back-off rule.
TRANSIENT_GIT = (
    *SPACE_ERROR_TEXTS,
    ".lock': file exists",
    "unable to write",
    "couldn't write",
    "could not write",
    "unable to create temporary",
)


class DependencyError(Exception):
    """A dependency's branch cannot be merged (it has none, it is not in the repository,
    git refused the merge): trying again cannot help until someone acts, unless
    ``permanent`` is false (git could not write: a full disk waits, it asks nobody)."""

    def __init__(self, message: str, permanent: bool = True) -> None:
        super().__init__(message)
        self.permanent = permanent


def dependency_branch(dep: Any) -> Optional[str]:
    """The branch of a DONE dependency, as this machine's repository has it: the one its
    handoff names when that is its ledger branch or the name a fetch-back from a peer
    gives a diverged one (``<branch>-from-<peer>``), else its ledger branch."""
    own = dep.branch
    if not own:
        return None
    handed = (dep.handoff or {}).get("branch")
    if isinstance(handed, str) and handed != own and handed.startswith(f"{own}-from-") and not ref_problem(handed):
        return handed
    return own


def dependency_branches(led: Any, task: Any, repo: str) -> list[tuple[str, str]]:
    """(dependency name, branch) of each of ``task``'s dependencies, in ``depends_on``
    order, each checked to be a branch of ``repo``.

    :raises DependencyError: a dependency with no branch, or whose branch is not here.
    """
    by_name = {d.name: d for d in (led.get(i) for i in task.deps) if d is not None}
    out: list[tuple[str, str]] = []
    for name in task.spec.depends_on:
        dep = by_name.get(name)
        if dep is None:
            raise DependencyError(f"dependency {name} is not in the ledger")
        branch = dependency_branch(dep)
        if not branch or ref_problem(branch):
            why = "it has no git_ref" if not dep.spec.git_ref else "no attempt of it made one"
            raise DependencyError(f"dependency {name} has no branch to merge ({why})")
        ref = f"refs/heads/{branch}"
        if not git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", check=False).strip():
            raise DependencyError(
                f"the branch {branch} of dependency {name} is not in {repo} (a dependency that "
                "ran on a peer has its branch fetched back when it ends)"
            )
        out.append((name, branch))
    return out


def merge_dependencies(
    p: Pinned, task: Any, branches: list[tuple[str, str]]
) -> tuple[list[dict[str, Any]], Optional[dict[str, Any]]]:
    """Merge ``branches`` into the pinned worktree, in order, stopping at the first
    conflict.

    :return: (the merges made, each ``{"task", "branch", "commit"}``; the conflict
        record, or None when every branch merged).
    :raises DependencyError: git refused a merge for another reason than a conflict.
    """
    merged: list[dict[str, Any]] = []
    for k, (name, branch) in enumerate(branches):
        # the worktree made, this dependency (and those after it) not merged yet: the
        # restart finds it by missing_dependencies() and merges the rest
        crash.point("before_dependency_merge")
        ref = f"refs/heads/{branch}"
        before: Optional[set[str]] = None
        try:
            earlier = _read_record(p, ref)
            if earlier is not None:  # this merge was cut short and the supervisor died
                _undo_unwritten_merge(p, ref, earlier)
            before = _untracked(p)
            if before:
                _drop_dependency_copies(p, ref, before)
            try:
                _write_record(p, ref, before)
            except OSError as e:  # nothing was merged: it waits like the merge would
                raise DependencyError(
                    f"merging {name} ({branch}) failed: cannot write {MERGE_RECORD}: {e.strerror}", permanent=False
                ) from None
            res = wt_merge(p, ref, f"fleetrun: merge {name} ({branch}) into {task.name}")
        except GitError as e:
            lines = [ln.strip() for ln in e.output.splitlines() if ln.strip()]
            transient = next((ln for ln in lines if any(t in ln.lower() for t in TRANSIENT_GIT)), None)
            why = transient or next(
                (ln for ln in lines if ln.startswith(("fatal:", "error:"))), lines[-1] if lines else str(e)
            )
            if transient is not None and before is not None:
                _undo_unwritten_merge(p, ref, before)
            _drop_record(p)
            raise DependencyError(
                f"merging {name} ({branch}) failed: {' '.join(why.split())}", permanent=transient is None
            ) from None
        _drop_record(p)
        if res.conflicts:
            pending = [{"task": n, "branch": b} for n, b in branches[k + 1 :]]
            return merged, {"task": name, "branch": branch, "files": res.conflicts, "pending": pending}
        merged.append({"task": name, "branch": branch, "commit": res.commit})
    return merged, None


#: In the worktree's administrative folder (``<common>/worktrees/<name>``, which git
#: removes with the worktree) while fleetrun merges a dependency: the dependency's ref and
#: the untracked files before the merge, so that what a merge cut short wrote is known
#: even when the supervisor died before taking it out.
MERGE_RECORD = "fleetrun-merging.json"


def _write_record(p: Pinned, ref: str, untracked: set[str]) -> None:
    """:raises OSError: it could not be written (a full disk)."""
    path = os.path.join(p.gitdir, MERGE_RECORD)
    try:
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump({"ref": ref, "untracked": sorted(untracked)}, f)
        os.replace(path + ".tmp", path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(path + ".tmp")
        raise


def _read_record(p: Pinned, ref: str) -> Optional[set[str]]:
    """The untracked files before a merge of ``ref`` whose record is still there (the
    merge was cut short and nobody took its files out), else None. A record that does not
    parse as one is no record."""
    try:
        with open(os.path.join(p.gitdir, MERGE_RECORD), encoding="utf-8") as f:
            rec = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(rec, dict) or rec.get("ref") != ref or not isinstance(rec.get("untracked"), list):
        return None
    if not all(isinstance(u, str) for u in rec["untracked"]):
        return None
    return set(rec["untracked"])


def _drop_record(p: Pinned) -> None:
    # none, or it stays: only a merge of the same dependency reads it, and it goes once
    # a merge of fleetrun's ends (a merge stopped on a conflict: stopped_merge())
    with contextlib.suppress(OSError):
        os.unlink(os.path.join(p.gitdir, MERGE_RECORD))


def _untracked(p: Pinned) -> set[str]:
    """The untracked files of the pinned worktree (ignored ones aside: a merge overwrites
    them)."""
    out = wt_git(p, "ls-files", "-z", "--others", "--exclude-standard")
    return {f for f in out.split("\0") if f}


def _incoming(p: Pinned, ref: str) -> set[str]:
    """The files merging ``ref`` writes into the worktree: those its side changed since
    the merge base (added, changed or removed)."""
    out = wt_git(p, "diff", "--name-only", "-z", "--no-renames", "--no-ext-diff", f"HEAD...{ref}", "--")
    return {f for f in out.split("\0") if f}


def _inside(p: Pinned, rel: str) -> Optional[str]:
    """The full path of ``rel`` (a path git gave) in the worktree, or None when a folder
    on the way is not the worktree's own (a link out of it): nothing outside is touched."""
    if os.path.isabs(rel) or ".." in rel.split("/"):
        return None
    full = os.path.join(p.root, rel)
    parent = os.path.dirname(full)
    return full if os.path.realpath(parent) == os.path.normpath(parent) else None


def _undo_unwritten_merge(p: Pinned, ref: str, before: set[str]) -> None:
    """After a merge of ``ref`` git could not write (a full disk): take out what it wrote,
    so that the next try merges from where this one began. Git leaves the files it wrote
    untracked, the index and HEAD as they were, the last file cut short (so no content
    check could know it; seen with git 2.39, which writes the files a merge adds before
    it rewrites any it tracks): the files of ``ref``'s side that were not untracked
    before (``before``) and are now are the merge's, removed. A merge state it left is
    aborted. Best effort: what cannot be taken out now blocks the next merge, which
    names it."""
    try:
        if merge_in_progress(p) and not unmerged_files(p):
            wt_git(p, "merge", "--abort", check=False)
        written = (_untracked(p) - before) & _incoming(p, ref)
    except GitError:
        return  # git cannot tell what the merge wrote: the next merge names what is in its way
    for rel in sorted(written):
        full = _inside(p, rel)
        try:
            if full is not None:
                os.unlink(full)
        except OSError:
            continue


def _blob_id(data: bytes, oid: str) -> str:
    """git's id of a blob holding ``data``, in the object format of ``oid``."""
    algo = hashlib.sha256 if len(oid) == 64 else hashlib.sha1
    return algo(b"blob %d\0" % len(data) + data).hexdigest()


def _same_as(full: str, mode: str, oid: str) -> bool:
    """``full`` holds, byte for byte, the blob ``oid`` of mode ``mode`` (a link, its target)."""
    st = os.lstat(full)
    if mode == "120000" and stat.S_ISLNK(st.st_mode):
        data = os.fsencode(os.readlink(full))
    elif mode in ("100644", "100755") and stat.S_ISREG(st.st_mode):
        with open(full, "rb") as f:
            data = f.read()
    else:
        return False
    return _blob_id(data, oid) == oid


def _drop_dependency_copies(p: Pinned, ref: str, untracked: set[str]) -> None:
    """Remove the untracked files of the worktree that merging ``ref`` would write and
    that are byte for byte the ones of ``ref``'s tree: a copy of the dependency's own
    (a merge git could not write left it, its clean-up cut short), which git would refuse
    to overwrite. Any other content is someone's work, kept; ``untracked`` loses those
    removed.

    :raises GitError: git refused.
    """
    wanted = untracked & _incoming(p, ref)
    if not wanted:
        return
    out = wt_git(p, "ls-tree", "-r", "-z", "--full-tree", ref)
    for entry in out.split("\0"):
        meta, _, rel = entry.partition("\t")
        parts = meta.split()
        if rel not in wanted or len(parts) != 3 or parts[1] != "blob":
            continue
        full = _inside(p, rel)
        try:
            if full is not None and _same_as(full, parts[0], parts[2]):
                os.unlink(full)
                untracked.discard(rel)
        except OSError:
            continue  # gone meanwhile, or unreadable: the merge says what is in its way


def missing_dependencies(p: Pinned, repo: str, branches: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The dependencies of ``branches`` whose branch head is not (yet) an ancestor of
    the pinned worktree's HEAD: those a preparation cut short, by a crash or by a merge
    stopped on a conflict, has not merged. In ``depends_on`` order.

    :raises DependencyError: git cannot say (a branch gone meanwhile, a broken repository).
    """
    try:
        head = wt_git(p, "rev-parse", "--verify", "HEAD^{commit}").strip()
        out = []
        for name, branch in branches:
            tip = git(repo, "rev-parse", "--verify", "--end-of-options", f"refs/heads/{branch}^{{commit}}").strip()
            # empty when every commit of the dependency's branch is in HEAD's history
            if git(repo, "rev-list", "-n1", tip, f"^{head}", "--").strip():
                out.append((name, branch))
        return out
    except GitError as e:
        raise DependencyError(
            f"cannot tell which dependencies are merged: {' '.join(e.output.split())[:300]}"
        ) from None


def stopped_merge(p: Pinned, repo: str, missing: list[tuple[str, str]]) -> Optional[dict[str, Any]]:
    """A reused worktree: the conflict record of a merge that stopped on a conflict and
    is still neither concluded nor aborted (its files as they are now), or None.

    Built from the worktree, not from a record: the dependency being merged is the one
    of ``missing`` whose head is ``MERGE_HEAD``, the rest of ``missing`` is pending (a
    crash may have come before the attempt that stopped recorded its conflict).

    :param missing: :func:`missing_dependencies` of the worktree.
    """
    if not merge_in_progress(p):
        return None
    # the merge wrote all it could: its record (when a crash kept it) says nothing of
    # the files someone writes while resolving it
    _drop_record(p)
    merging = wt_git(p, "rev-parse", "-q", "--verify", "MERGE_HEAD", check=False).strip()
    which: Optional[tuple[str, str]] = None
    for name, branch in missing:
        tip = git(
            repo, "rev-parse", "-q", "--verify", "--end-of-options", f"refs/heads/{branch}^{{commit}}", check=False
        ).strip()
        if tip and tip == merging:
            which = (name, branch)
            break
    return {
        "task": which[0] if which else None,
        "branch": which[1] if which else None,
        "files": unmerged_files(p),
        "pending": [{"task": n, "branch": b} for n, b in missing if (n, b) != which],
    }


def _files(files: list[str], limit: Optional[int] = None) -> str:
    shown = [safe_text(f, limit=200) for f in files[:limit] if f]
    more = len(files) - len(shown)
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "") if shown else "no file left unmerged"


def conflict_cause(rec: dict[str, Any]) -> str:
    """``merge_conflict:schema.sql, api.py``: the cause of the move to NEEDS_HUMAN."""
    return "merge_conflict:" + _files(list(rec.get("files") or []), CAUSE_FILES)


def conflict_note(rec: dict[str, Any], root: str, task_name: str) -> str:
    """The ledger note that says where the stopped merge is and what to do about it."""
    which = f"merging {rec['task']} (branch {rec['branch']})" if rec.get("task") else "a merge"
    text = (
        f"{which} into the worktree {root} stopped on a conflict in {_files(list(rec.get('files') or []))}; "
        "the agent was not started"
    )
    pending = rec.get("pending") or []
    if pending:
        text += "; not merged yet: " + ", ".join(f"{d['task']} ({d['branch']})" for d in pending)
    return text + f". Resolve it there and commit, then `fleetrun retry {task_name}`"


def conflict_prompt(rec: dict[str, Any], git_ref: Optional[str]) -> str:
    """The section an agent started on a conflicted tree reads first."""
    which = f"Merging {rec['task']} (branch {rec['branch']})" if rec.get("task") else "A merge of a dependency's branch"
    text = (
        "## A merge conflict to resolve first\n"
        f"This worktree was made from {git_ref or 'its git_ref'} with the branches of the tasks it depends on "
        f"merged in, in order. {which} stopped on a conflict in: {_files(list(rec.get('files') or []))}. "
        "Resolve the conflict in those files (the <<<<<<< ======= >>>>>>> markers), `git add` them and "
        "`git commit` to conclude the merge before you do anything else."
    )
    pending = rec.get("pending") or []
    if pending:
        text += (
            " Then merge the branches not merged yet, in this order: "
            + ", ".join(f"`git merge --no-ff {d['branch']}` ({d['task']})" for d in pending)
            + "."
        )
    return text

"""Checks of the collected tasks against their git repositories: a ``git_ref`` names a
commit, a ``branch`` is one fleetrun may create (or reuse), and a task without a
``git_ref`` works in the user's checkout itself (a warning).

They run across every collected file at once (one repository lookup per ``cwd``), after
each file was collected on its own by :mod:`fleetrun.collect`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional

from .collect import TaskFile, display_path, tasks_warning
from .exceptions import UsageError
from .gitutil import GitError, git, repo_toplevel
from .taskspec import TaskSpec
from .textutil import safe_name

# Branches: fleetrun works only on branches it creates.

#: ``owner(task name, branch, repository) -> id of the task fleetrun created that
#: branch for``, or None (the ledger answers it).
BranchOwner = Callable[[str, str, str], Optional[str]]


@dataclass
class BranchReuse:
    """A task names a branch fleetrun created for an earlier task of the same name."""

    task_name: str
    branch: str
    owner_id: str

    @property
    def note(self) -> str:
        return f"reusing branch {self.branch} that fleetrun created for task {self.task_name} ({self.owner_id})"


def _branch_exists(repo: str, branch: str) -> bool:
    try:
        git(repo, "rev-parse", "--verify", "--quiet", "--end-of-options", f"refs/heads/{branch}")
        return True
    except GitError:
        return False


#: ``cwd -> (top level, real common git folder)`` of its repository, or None: shared by
#: :func:`check_branches` and :func:`check_refs` for one collection.
RepoCache = dict[str, Optional[tuple[str, str]]]


def _repo_of(cwd: str, cache: RepoCache) -> Optional[tuple[str, str]]:
    """(top level, real common git folder) of the repository holding ``cwd``, or None."""
    if cwd not in cache:
        top = repo_toplevel(cwd)
        try:
            common = git(top, "rev-parse", "--git-common-dir").strip() if top else ""
        except GitError:
            common = ""
        cache[cwd] = (top, os.path.realpath(os.path.join(top, common))) if top and common else None
    return cache[cwd]


class _Named:
    """A task that sets ``key``, with the repository of its cwd; where it set it (its
    file, line and label) is worked out when an error or a note names it (a 100,000-task
    file with a ``git_ref`` each has none to report)."""

    __slots__ = ("spec", "value", "_file", "_invocation_dir", "key_name", "repo")

    def __init__(
        self,
        spec: TaskSpec,
        value: str,
        file: str,
        invocation_dir: Optional[Path],
        key_name: str,
        repo: Optional[tuple[str, str]],
    ) -> None:
        self.spec = spec
        self.value = value
        self._file = file
        self._invocation_dir = invocation_dir
        self.key_name = key_name
        self.repo = repo

    @property
    def file(self) -> str:
        # a default's file is where it was written (the project file, say)
        return display_path(Path(self.spec.file_of(self.key_name) or self._file), self._invocation_dir)

    @property
    def line(self) -> int:
        return self.spec.key_lines.get(self.key_name, self.spec.line)

    @property
    def key(self) -> str:
        return f"task '{safe_name(self.spec.name)}': {self.key_name}"


def _tasks_naming(
    files: list[TaskFile], key: str, invocation_dir: Optional[Path], repos: RepoCache
) -> Iterator[_Named]:
    """Every task of ``files`` that sets ``key`` (``branch``, ``git_ref``), in file order."""
    for f in files:
        for spec in f.tasks:
            value = getattr(spec, key)
            if value:
                yield _Named(spec, value, f.path, invocation_dir, key, _repo_of(spec.cwd, repos))


def check_branches(
    files: list[TaskFile],
    owner: Optional[BranchOwner] = None,
    invocation_dir: Optional[Path] = None,
    repos: Optional[RepoCache] = None,
) -> tuple[list[UsageError], list[BranchReuse]]:
    """Every ``branch =`` across all collected files: one task per branch of a
    repository, and no branch that already exists there unless the ledger shows
    fleetrun created it for a task of the same name (then it is reused, and said so).

    ``branch = "main"`` would otherwise commit the agent's work straight onto the
    user's main, and two tasks naming one branch would stack their commits on it.
    """
    errors: list[UsageError] = []
    reuse: list[BranchReuse] = []
    seen: dict[tuple[str, str], _Named] = {}
    for t in _tasks_naming(files, "branch", invocation_dir, {} if repos is None else repos):
        if t.repo is None:
            continue  # not in a repository: check_refs reports that if git_ref needs one
        top, common = t.repo
        first = seen.get((common, t.value))
        if first is not None:
            errors.append(
                UsageError(
                    f"branch '{safe_name(t.value)}' is also named by task '{safe_name(first.spec.name)}' "
                    f"({first.file}:{first.line}); each task needs a branch of its own",
                    file=t.file,
                    line=t.line,
                    key=t.key,
                )
            )
            continue
        seen[(common, t.value)] = t
        if not _branch_exists(top, t.value):
            continue
        owner_id = owner(t.spec.name, t.value, top) if owner is not None else None
        if owner_id is not None:
            reuse.append(BranchReuse(t.spec.name, t.value, owner_id))
            continue
        errors.append(
            UsageError(
                f"branch '{safe_name(t.value)}' already exists in {top}; fleetrun only works on branches "
                "it creates (leave branch out, or name a new one)",
                file=t.file,
                line=t.line,
                key=t.key,
            )
        )
    return errors, reuse


# ---------------------------------------------------------------------------------
# Refs: a git_ref that names nothing, or a cwd in no repository, can never start.


def check_refs(
    files: list[TaskFile], invocation_dir: Optional[Path] = None, repos: Optional[RepoCache] = None
) -> list[UsageError]:
    """Every ``git_ref =``: the task's ``cwd`` is in a git repository and the ref
    names a commit there (a branch, a tag or a commit id). One git call per distinct
    (repository, ref).

    Either mistake would otherwise only show when the attempt starts, as a failed
    workspace, after the whole queue was collected and the run begun.
    """
    errors: list[UsageError] = []
    resolved: dict[tuple[str, str], bool] = {}
    for t in _tasks_naming(files, "git_ref", invocation_dir, {} if repos is None else repos):
        if t.repo is None:
            errors.append(UsageError(f"{t.spec.cwd} is not in a git repository", file=t.file, line=t.line, key=t.key))
            continue
        top, common = t.repo
        if (common, t.value) not in resolved:
            try:
                git(top, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{t.value}^{{commit}}")
                resolved[(common, t.value)] = True
            except GitError:
                resolved[(common, t.value)] = False
        if not resolved[(common, t.value)]:
            errors.append(
                UsageError(
                    f"no branch, tag or commit '{safe_name(t.value)}' in {top}", file=t.file, line=t.line, key=t.key
                )
            )
    return errors


def checkout_warnings(specs: Iterable[TaskSpec], invocation_dir: Optional[Path] = None) -> list[str]:
    """One warning per checkout that tasks without ``git_ref`` (a role aside) have their
    ``cwd`` in, at the first of them, with how many: its agent works in the user's
    checkout itself, on whatever branch is checked out there, and commits onto it."""
    tops: dict[str, Optional[str]] = {}
    found: dict[str, tuple[TaskSpec, int]] = {}  # by checkout: its first task, how many
    for spec in specs:
        if spec.git_ref or spec.role:
            continue
        if spec.cwd not in tops:
            tops[spec.cwd] = repo_toplevel(spec.cwd)
        top = tops[spec.cwd]
        if top is None:
            continue
        first, count = found.get(top, (spec, 0))
        found[top] = (first, count + 1)
    return [
        tasks_warning(
            first, count, "no git_ref", f"the agent works in your checkout {top} itself", invocation_dir, first.line
        )
        for top, (first, count) in found.items()
    ]

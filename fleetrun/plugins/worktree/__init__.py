"""Built-in ``worktree`` plugin: a git worktree and branch per task.

A task with ``git_ref`` runs in ``$FLEETRUN_HOME/worktrees/<name>-<id>`` on branch
``fleetrun/<name>-<id>`` (or ``branch =``), made from ``git_ref`` in the repository
that holds ``cwd``; the user's checkout is never touched. Retries and resumes reuse
it, once each step of its preparation is checked and the missing ones done
(:func:`_complete_preparation`: a crash between two steps is completed, never taken as
it is). After DONE a clean worktree is removed and the branch stays; a dirty one is kept.

With ``base = "dependencies"`` the branch gets each dependency's branch merged in, in
``depends_on`` order (:mod:`fleetrun.depmerge`), before the agent starts; a conflict
asks a human (``merge_conflict:<files>``, the worktree kept mid-merge) or, with
``on_conflict = "agent"``, is left for the agent, named in the workspace's ``conflict``.

The agent owns the worktree's files, its ``.git`` file included, so every git command
run for a worktree is pinned (``gitutil.wt_git``: ``--git-dir``/``--work-tree``) to the
administrative folder found from the repository's side; a worktree whose ``.git`` was
rewritten, replaced or removed raises ``WorktreeTampered`` and nothing runs in it.
"""

from __future__ import annotations

import os
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Union

from ... import crash
from ...depmerge import (
    DependencyError,
    conflict_cause,
    conflict_note,
    dependency_branches,
    merge_dependencies,
    missing_dependencies,
    stopped_merge,
)
from ...effects import effects_of, run_inline
from ...gitutil import (
    GitError,
    Pinned,
    WorktreeTampered,
    check_pinned,
    embedded_repositories,
    git,
    pin_worktree,
    repo_lock,
    wt_git,
    wt_head_is,
)
from ...hookimpl import hookimpl
from ...hostapi import Host
from ...ledger import LEDGER_KEY
from ...reports import CollectHandle, Handoff, HandoffHandle, Workspace, WorkspaceHandle
from ...stash import StashKey
from ...states import State
from ...summary import clean, commit_subjects, first_summary, read_summary, summary_path
from ...taskspec import safe_slug
from .pins import forget_pin, identity_args, pinned, repo_of, workspace_pin

if TYPE_CHECKING:
    from ...config import Config

DEFAULT_COMMIT_MESSAGE = "fleetrun: uncommitted work of attempt {attempt}"

#: Worktrees being removed on the effects' worker (their notes come when it is over).
REMOVING_KEY = StashKey[set[str]]()
#: A command that only reads the worktree writes no index back (git's optional locks).
NO_OPTIONAL_LOCKS = {"GIT_OPTIONAL_LOCKS": "0"}


@hookimpl(trylast=True)
def fleetrun_config_keys(config: Config) -> list[Any]:
    """``[worktree]`` of config.toml."""
    from ...config import ConfigKey

    return [ConfigKey("worktree", "commit_message", (str,), doc="message of the commit of uncommitted work")]


class WorkspaceError(Exception):
    """The workspace could not be made; the attempt does not start.

    ``permanent``: trying again cannot help until someone changes something (a ref
    that names nothing, a cwd in no repository, a branch checked out elsewhere, a
    folder in the way): the loop asks a human at once (``workspace_failed:...``)
    instead of backing off. Otherwise (a full disk, a lock another git holds) it
    backs off and tries again.

    ``cause``: the ledger cause of the move to NEEDS_HUMAN, when it is not
    ``workspace_failed:...`` (``merge_conflict:...``); ``workspace``: the workspace
    that was made, when there is one for a human to look at.
    """

    def __init__(
        self, message: str, permanent: bool = False, cause: Optional[str] = None, workspace: Optional[Workspace] = None
    ) -> None:
        super().__init__(message)
        self.permanent = permanent
        self.cause = cause
        self.workspace = workspace


# What git says when a worktree cannot be added and waiting will not change it. What
# it says of locks ("Unable to create '....lock': File exists"), a full disk or memory
# may clear by itself, and is not here.
_PERMANENT_GIT = (
    "is already checked out at",
    "is already used by worktree at",
    "already exists",  # the worktree's folder (a branch that exists is handled before)
    "not a valid object name",
    "invalid reference",
    "is not a commit",
    "not a git repository",
)


def _git_failure(e: GitError) -> WorkspaceError:
    """A failed ``git worktree add`` as a WorkspaceError: git's own ``fatal:`` line (on
    one line), permanent when it names something waiting cannot fix."""
    lines = [ln.strip() for ln in e.output.splitlines() if ln.strip()]
    fatal = next((ln for ln in lines if ln.startswith(("fatal:", "error:"))), lines[-1] if lines else str(e))
    lock = ".lock" in fatal and "File exists" in fatal
    permanent = not lock and any(p in fatal for p in _PERMANENT_GIT)
    return WorkspaceError(" ".join(fatal.split()), permanent=permanent)


def names_for(task: Any) -> tuple[str, str]:
    """(folder name, branch) for a task: both built from a sanitised name and the id."""
    slug = f"{safe_slug(task.name)}-{task.id}"
    branch = task.spec.branch or f"fleetrun/{slug}"
    return slug, branch


def _reuse(config: Config, task: Any, path: Path, repo: str, common: str) -> Optional[Pinned]:
    """The worktree a previous attempt left at ``path``, checked before it is reused;
    None when there is none and one is to be made.

    :raises WorktreeTampered: when fleetrun made it for this task and it no longer pins.
    :raises WorkspaceError: when something else is there.
    """
    if not os.path.lexists(path):
        return None
    # the ledger says fleetrun made this worktree for this task: an attempt ran in it
    ours = bool(task.worktree) and os.path.realpath(task.worktree) == os.path.realpath(path)
    if not ours and not os.path.lexists(path / ".git"):
        if path.is_dir() and not any(path.iterdir()):
            return None
        raise WorkspaceError(f"{path} exists and is not a worktree; remove it or fleetrun gc", permanent=True)
    try:
        return pinned(config, str(path), common)
    except WorktreeTampered:
        if ours:
            raise
        raise WorkspaceError(
            f"{path} exists and is not a worktree of {repo}; remove it or fleetrun gc", permanent=True
        ) from None


@hookimpl(trylast=True)
def fleetrun_prepare_workspace(
    task: Any, attempt: Any, host: Host, config: Config
) -> Union[Workspace, WorkspaceHandle, None]:
    if not host.local:
        return None  # its folders are not here: the plugin that provides it prepares it
    spec = task.spec
    if not os.path.isdir(spec.cwd):
        raise WorkspaceError("working directory does not exist on this host")
    if not spec.git_ref:
        return Workspace(path=spec.cwd)
    found = repo_of(config, spec.cwd)
    if found is None:
        raise WorkspaceError(f"{spec.cwd} is not in a git repository (git_ref needs one)", permanent=True)
    repo, common = found
    slug, branch = names_for(task)
    root = config.home / "worktrees"
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = root / slug
    sub = os.path.relpath(os.path.realpath(spec.cwd), os.path.realpath(repo))
    effects = effects_of(config)
    if effects is not None and not spec.merges_dependencies and not os.path.lexists(path):
        # a new worktree: git's ~25 ms run on the effects' worker, under the repository's
        # lock, while the loop handles other tasks; a reused one is checked here, as before
        forget_pin(config, str(path), common)
        fut = effects.submit(_add_locked, config.home / "locks", repo, common, branch, path, spec.git_ref)
        return _Adding(
            config,
            fut,
            path,
            common,
            Workspace(
                path=str(path / sub if sub != "." else path),
                branch=branch,
                repo=repo,
                base_ref=spec.git_ref,
                is_worktree=True,
                root=str(path),
            ),
        )
    with repo_lock(config.home / "locks", repo, common=common):
        # checked before anything is made: a dependency with no branch makes nothing
        branches = _dependency_branches(config, task, repo) if spec.merges_dependencies else []
        made = new_branch = False
        if _reuse(config, task, path, repo, common) is None:
            forget_pin(config, str(path), common)
            new_branch = _add(repo, branch, path, spec.git_ref)
            made = True
        p = pinned(config, str(path), common)
        wpath = path / sub if sub != "." else path
        ws = Workspace(
            path=str(wpath), branch=branch, repo=repo, base_ref=spec.git_ref, is_worktree=True, root=str(path)
        )
        _complete_preparation(config, task, attempt, p, ws, branches, made, new_branch)
    return ws


def _complete_preparation(
    config: Config,
    task: Any,
    attempt: Any,
    p: Pinned,
    ws: Workspace,
    branches: list[tuple[str, str]],
    made: bool,
    new_branch: bool,
) -> None:
    """Check each step of a worktree's preparation and do the ones not done, in order,
    so that a preparation cut short (a supervisor killed between two steps, a merge
    stopped on a conflict) is completed by the next attempt, never taken as it is:

    1. the worktree is there and pins to the repository (done: ``p``);
    2. its HEAD is the task's branch (a reused worktree; a new one is made on it);
    3. ``base = "dependencies"``: each dependency's branch head is an ancestor of HEAD;
       the missing ones are merged, in ``depends_on`` order, with the conflict handling
       of a first preparation (:func:`_merge_dependencies`);
    4. setup: not here; the setup stage runs it unless the ledger records it passed
       for this very worktree (``info["setup"]``, :mod:`fleetrun.setupstage`).

    Call under the repository's lock.

    :raises WorktreeTampered: a reused worktree whose HEAD left the task's branch.
    :raises WorkspaceError: as :func:`_merge_dependencies`.
    """
    if not made:
        head = wt_git(p, "symbolic-ref", "-q", "HEAD", check=False).strip()
        if head != f"refs/heads/{ws.branch}":
            raise WorktreeTampered(f"its HEAD is {head or 'detached'}, not the task's branch {ws.branch}")
    if task.spec.merges_dependencies:
        _merge_dependencies(config, task, attempt, p, ws, branches, new_branch)


def _add(repo: str, branch: str, path: Path, ref: str) -> bool:
    """``git worktree add`` of a task's worktree on its branch, made from ``ref`` (or the
    branch as it is, when it exists already). Call under the repository's lock.

    :return: True when the branch was made now.
    :raises WorkspaceError: git refused (permanent when waiting cannot help).
    """
    try:
        git(repo, "worktree", "add", "-b", branch, "--", str(path), ref)
        return True
    except GitError as first:
        if git(repo, "branch", "--list", "--", branch).strip():
            try:
                git(repo, "worktree", "add", "--", str(path), branch)
            except GitError as e:  # checked out elsewhere, say
                raise _git_failure(e) from None
            return False
        try:
            git(repo, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}")
        except GitError:
            raise WorkspaceError(f"git_ref {ref!r} is not a commit in {repo}", permanent=True) from None
        raise _git_failure(first) from None


def _add_locked(locks: Path, repo: str, common: str, branch: str, path: Path, ref: str) -> None:
    """:func:`_add` on an effects worker: it reads no stash and writes no ledger. A
    worktree already there (an earlier try whose end this loop never saw: a new adoption
    abandoned it) is taken when it pins to the repository."""
    with repo_lock(locks, repo, common=common):
        if os.path.lexists(path):
            try:
                pin_worktree(str(path), common)
                return
            except WorktreeTampered:
                raise WorkspaceError(
                    f"{path} exists and is not a worktree of {repo}; remove it or fleetrun gc", permanent=True
                ) from None
        _add(repo, branch, path, ref)


class _Adding:
    """The :class:`~fleetrun.reports.WorkspaceHandle` of a worktree being added on the
    effects' worker; once it is there it is pinned here, on the loop's thread."""

    def __init__(self, config: Config, fut: Future[None], path: Path, common: str, ws: Workspace) -> None:
        self.config, self.fut, self.path, self.common, self.ws = config, fut, path, common, ws

    def poll(self) -> Optional[Workspace]:
        if not self.fut.done():
            return None
        self.fut.result()  # raises the worker's WorkspaceError
        pinned(self.config, str(self.path), self.common)
        return self.ws


def _dependency_branches(config: Config, task: Any, repo: str) -> list[tuple[str, str]]:
    try:
        return dependency_branches(config.stash[LEDGER_KEY], task, repo)
    except DependencyError as e:
        raise WorkspaceError(str(e), permanent=e.permanent) from None


def _merge_dependencies(
    config: Config, task: Any, attempt: Any, p: Pinned, ws: Workspace, branches: list[tuple[str, str]], new_branch: bool
) -> None:
    """``base = "dependencies"``: every dependency of ``branches`` whose head is not in
    the worktree's branch yet is merged in (:mod:`fleetrun.depmerge`), in order; those
    merged already (a reused worktree) are not merged again. A merge still stopped on a
    conflict is taken as it is, with what it leaves pending. Fills ``ws.merged`` and
    ``ws.conflict``. Call under the repository's lock.

    :raises WorkspaceError: git refused a merge (a branch made now is removed with its
        worktree, so the next try merges afresh; a reused one, which may hold work, is
        kept); or a conflict, when the task does not give it to its agent
        (``merge_conflict:<files>``; the worktree stays, mid-merge).
    """
    led = config.stash[LEDGER_KEY]
    repo = ws.repo or ""
    before = (
        next((a.workspace for a in reversed(led.attempts(task.id)) if a.id != attempt.id and a.workspace), None) or {}
    )
    earlier = {m.get("task"): m for m in before.get("merged") or [] if isinstance(m, dict)}
    try:
        missing = missing_dependencies(p, repo, branches)
        ws.merged = [
            earlier.get(name) or {"task": name, "branch": branch, "commit": None}
            for name, branch in branches
            if (name, branch) not in missing
        ]
        ws.conflict = stopped_merge(p, repo, missing)
        if ws.conflict is None and missing:
            merged, ws.conflict = merge_dependencies(p, task, missing)
            ws.merged += merged
    except DependencyError as e:
        if new_branch:
            git(repo, "worktree", "remove", "--force", "--", p.root, check=False)
            git(repo, "branch", "-D", "--", str(ws.branch), check=False)
            forget_pin(config, p.root, p.common)
        raise WorkspaceError(str(e), permanent=e.permanent) from None
    if ws.conflict is not None and task.spec.on_conflict != "agent":
        _note_once(led, task.id, conflict_note(ws.conflict, str(ws.root), task.name))
        raise WorkspaceError(
            conflict_cause(ws.conflict), permanent=True, cause=conflict_cause(ws.conflict), workspace=ws
        )


@hookimpl(trylast=True)
def fleetrun_collect_work(
    task: Any, attempt: Any, workspace: Workspace, host: Host, config: Config
) -> Union[str, CollectHandle, None]:
    """Commit what the attempt left uncommitted, so verifiers, handoffs and dependents
    see exactly what is on the branch. Every git command is pinned to the worktree
    fleetrun made (the agent may have rewritten its ``.git``), and the commit goes only
    onto the task's own branch.

    In a work loop the git commands (the embedded-repository ``ls-files``, ``status``
    unless that listing found an untracked file, the HEAD check (read from the worktree's
    administrative ``HEAD`` file; git only when that does not name the branch), ``add``, ``commit``,
    ``rev-parse``: two commands when there is nothing to commit) run on the effects' worker and
    a :class:`~fleetrun.reports.CollectHandle` is returned; elsewhere (a peer's ``host
    collect``) they run here, and None says there was nothing to commit.

    :raises WorktreeTampered: when the worktree no longer pins, or its HEAD left the
        task's branch; nothing is committed then (from the handle's ``poll()`` when the
        pin broke while the worker ran).
    """
    if not host.local or not workspace.is_worktree:
        return None
    p = workspace_pin(config, workspace)  # here: the pins are the stash's
    template = config.setting("worktree", "commit_message", DEFAULT_COMMIT_MESSAGE)
    message = str(template).replace("{attempt}", str(attempt.number)).replace("{task}", task.name)
    effects = effects_of(config)
    if effects is None:
        return _commit_work(p, workspace.branch, message) or None
    # not under the repository's lock: a commit touches only this worktree's index and
    # its task's branch, which nothing else changes meanwhile (placement waits for it)
    return _Collecting(effects.submit(_commit_work, p, workspace.branch, message))


def _commit_work(p: Pinned, branch: Optional[str], message: str) -> str:
    """The commit of what is uncommitted in the pinned worktree (on an effects worker: it
    reads no stash and writes no ledger; every command checks the pin again).

    :return: the commit made, or ``""`` when there was nothing to commit.
    :raises WorktreeTampered: the pin broke, or HEAD is not on ``branch``.
    :raises GitError: git refused.
    """
    untracked: list[str] = []
    embedded = embedded_repositories(p, untracked)
    if embedded:
        # git would record it as a gitlink, and a repository the agent made names its own
        # config (core.fsmonitor, hooks...): refused, like any other tampering
        # the names are the agent's: a few are enough to say what happened
        more = f" and {len(embedded) - 5} more" if len(embedded) > 5 else ""
        raise WorktreeTampered(f"embedded repository {', '.join(embedded[:5])}{more}")
    # an untracked file is work to commit: git status would only say so again
    # GIT_OPTIONAL_LOCKS=0: git status refreshes the index and writes it back when it can
    # (an index.lock made and renamed: a new inode, ~0.4 ms of CPU on a busy disk); the
    # answer is the same without, and `git worktree remove` refreshes it anyway
    if not untracked and not wt_git(p, "status", "--porcelain", "--untracked-files=all", env=NO_OPTIONAL_LOCKS).strip():
        return ""
    if branch:
        head = wt_head_is(p, f"refs/heads/{branch}")  # from its HEAD file, git only if not
        if head != f"refs/heads/{branch}":
            raise WorktreeTampered(f"its HEAD is {head or 'detached'}, not the task's branch {branch}")
    wt_git(p, "add", "-A")
    crash.point("mid_collect")  # staged, not committed: the restart collects again
    wt_git(p, *identity_args(p), "commit", "-q", "--no-verify", "-m", message)
    return wt_git(p, "rev-parse", "HEAD").strip()


class _Collecting:
    """The :class:`~fleetrun.reports.CollectHandle` of an attempt's work being committed
    on the effects' worker."""

    def __init__(self, fut: Future[str]) -> None:
        self.fut = fut

    def poll(self) -> Optional[str]:
        if not self.fut.done():
            return None
        return self.fut.result()  # raises the worker's WorktreeTampered or GitError


@hookimpl(trylast=True)
def fleetrun_handoff(task: Any, attempt: Any, host: Host, config: Config) -> Union[Handoff, HandoffHandle, None]:
    """The summary handed on: the agent's summary file, else its own result text
    (Claude Code's), else the subjects of the commits on the task's branch and on
    neither its ``git_ref`` nor its dependencies' branches (:mod:`fleetrun.summary`).
    In a work loop that ``git log`` runs on the effects' worker (a
    :class:`~fleetrun.reports.HandoffHandle`); elsewhere (``fleetrun approve``) here."""
    if not host.local:
        return None
    written = read_summary(summary_path(attempt.dir)) if attempt is not None and attempt.dir else ""
    said = clean(attempt.result_text or "") if attempt is not None else ""
    text = first_summary(written, said)
    handoff = Handoff(task_name=task.name, branch=task.branch, summary=text, host=task.host or "local")
    if text or not task.branch:
        return handoff
    led = config.stash.get(LEDGER_KEY)
    ws = (attempt.workspace or {}) if attempt is not None else {}
    repo = str(ws.get("repo") or task.spec.cwd)
    deps = [d.branch for d in (led.get(i) for i in task.deps) if d is not None and d.branch] if led else []
    exclude = [task.spec.git_ref or "", *deps]
    effects = effects_of(config)
    if effects is None:
        handoff.summary = commit_subjects(repo, task.branch, exclude)
        return handoff
    return _HandingOff(effects.submit(commit_subjects, repo, task.branch, exclude), handoff)


class _HandingOff:
    """The :class:`~fleetrun.reports.HandoffHandle` of a handoff whose summary, its
    branch's commit subjects, is read on the effects' worker (``commit_subjects`` reads
    no stash, writes no ledger, and answers "" when git fails)."""

    def __init__(self, fut: Future[str], handoff: Handoff) -> None:
        self.fut, self.handoff = fut, handoff

    def poll(self) -> Optional[Handoff]:
        if not self.fut.done():
            return None
        self.handoff.summary = self.fut.result()
        return self.handoff


def _note_once(led: Any, task_id: str, note: str) -> None:
    if led is not None and note not in (text for _, text in led.notes(task_id)):
        led.add_note(task_id, note)


@hookimpl(trylast=True)
def fleetrun_cleanup_workspace(task: Any, host: Host, config: Config) -> None:
    if task.state is not State.DONE or not task.worktree or not host.local:
        return
    path = Path(task.worktree)
    led = config.stash.get(LEDGER_KEY)
    if not os.path.lexists(path):
        return
    att = led.latest_attempt(task.id) if led is not None else None
    # the repository is the one recorded at prepare (or the task's cwd, as prepare found
    # it), never one the worktree's .git names
    repo = ((att.workspace or {}).get("repo") if att is not None else None) or task.spec.cwd
    found = repo_of(config, repo) if repo else None
    if found is None:
        _note_once(led, task.id, f"kept worktree {path}: its repository {repo} is not a git repository")
        return
    repo_dir, common = found
    removing = config.stash.setdefault(REMOVING_KEY, set())
    if str(path) in removing:
        return  # asked again (a new adoption) while the worker removes it
    try:
        p = pinned(config, str(path), common)
    except WorktreeTampered as e:
        _note_once(led, task.id, f"kept worktree {path}: it was tampered with ({e}); fleetrun ran no git command in it")
        return

    def done(fut: Future[Optional[str]]) -> None:  # on the loop's thread: the note, as before
        removing.discard(str(path))
        try:
            kept = fut.result()
        except (GitError, OSError) as e:
            kept = f"kept worktree {path}: {e}"
        if kept is not None:
            _note_once(led, task.id, kept)
            return
        forget_pin(config, str(path), common)
        if led is not None:
            led.add_note(task.id, f"removed clean worktree {path}; branch {task.branch} stays")

    effects = effects_of(config)
    if effects is None:  # no loop (`fleetrun approve`): here and now
        done(run_inline(_remove_locked, config.home / "locks", repo_dir, p, path))
        return
    removing.add(str(path))  # git's ~9 ms on the worker; the task is DONE already
    effects.submit(_remove_locked, config.home / "locks", repo_dir, p, path, on_done=done)


def _remove_locked(locks: Path, repo_dir: str, p: Pinned, path: Path) -> Optional[str]:
    """``git worktree remove`` of a clean worktree, under the repository's lock, its pin
    checked again there (on an effects worker: no stash, no ledger).

    :return: None once removed, else the note that says why it was kept.
    """
    with repo_lock(locks, repo_dir, common=p.common):
        try:
            check_pinned(p)
        except WorktreeTampered as e:
            return f"kept worktree {path}: it was tampered with ({e}); fleetrun ran no git command in it"
        try:
            git(repo_dir, "worktree", "remove", "--", str(path))
        except GitError as e:
            why = "it has uncommitted changes" if "modified or untracked" in e.output else str(e)
            return f"kept worktree {path}: {why}"
    return None

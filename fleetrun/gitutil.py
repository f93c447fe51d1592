"""Small helpers to run git without a shell, and a per-repository lock.

Every git command fleetrun runs is built here (:func:`git_argv`, :func:`git_env`): with
settings no file in a worktree can override (:data:`SAFE_CONFIG`) and without the
variables that would send it to another repository (:data:`DROPPED_ENV`).

Git's worktree and branch commands are not safe to run concurrently on one
repository (``could not lock config file``), so they run under ``repo_lock``.
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from .osutil import FileLock


class GitError(Exception):
    def __init__(self, args: list[str], code: int, output: str) -> None:
        super().__init__(f"git {' '.join(args)} failed (exit {code}): {output.strip()[-500:]}")
        self.code = code
        self.output = output


_ENV = {"GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"}

#: Settings of every git command fleetrun runs, given with ``-c`` so that they win over
#: every config file, and passed on (through ``GIT_CONFIG_PARAMETERS``) to any git a
#: command starts in a submodule. A worktree can hold a repository of its own
#: (``sub/.git/config`` is a file the agent writes); these keep git from running anything
#: it names: no fsmonitor command, no hooks, no recursion into submodules (status and
#: diff do not look inside them at all), no pager. An external diff or textconv is a
#: diff option (``--no-ext-diff --no-textconv``, :mod:`fleetrun.diffutil`); an empty
#: ``diff.external`` would be run as a command.
SAFE_CONFIG: tuple[str, ...] = (
    "core.fsmonitor=false",
    "core.hooksPath=/dev/null",
    "core.pager=cat",
    "core.untrackedCache=false",
    "submodule.recurse=false",
    "diff.ignoreSubmodules=all",
    "status.submoduleSummary=false",
)

#: Variables of fleetrun's own environment that are not passed to git: the ones that
#: choose which repository, index, objects or worktree a command acts on (fleetrun
#: started from a git hook or alias has ``GIT_DIR`` set), and the ones that name
#: commands git would run. The user's identity and config-file choices are kept.
DROPPED_ENV: frozenset[str] = frozenset(
    {
        "GIT_DIR",
        "GIT_WORK_TREE",
        "GIT_INDEX_FILE",
        "GIT_OBJECT_DIRECTORY",
        "GIT_ALTERNATE_OBJECT_DIRECTORIES",
        "GIT_COMMON_DIR",
        "GIT_NAMESPACE",
        "GIT_PREFIX",
        "GIT_CEILING_DIRECTORIES",
        "GIT_DISCOVERY_ACROSS_FILESYSTEM",
        "GIT_REPLACE_REF_BASE",
        "GIT_NO_REPLACE_OBJECTS",
        "GIT_GRAFT_FILE",
        "GIT_SHALLOW_FILE",
        "GIT_QUARANTINE_PATH",
        "GIT_EXTERNAL_DIFF",
        "GIT_DIFF_OPTS",
        "GIT_PAGER",
        "GIT_EDITOR",
        "GIT_SEQUENCE_EDITOR",
        "GIT_ATTR_SOURCE",
        "GIT_ATTR_NOSYSTEM",
        "GIT_INTERNAL_SUPER_PREFIX",
        "GIT_LITERAL_PATHSPECS",
        "GIT_GLOB_PATHSPECS",
        "GIT_NOGLOB_PATHSPECS",
        "GIT_ICASE_PATHSPECS",
    }
)


def git_argv(cwd: str | Path, *args: str) -> list[str]:
    """The argv of ``git -C cwd args...`` as fleetrun runs every git command: no pager,
    and :data:`SAFE_CONFIG` before ``args``."""
    safe = [opt for kv in SAFE_CONFIG for opt in ("-c", kv)]
    return ["git", "--no-pager", "-C", str(cwd), *safe, *args]


def git_env(env: Optional[dict[str, str]] = None) -> dict[str, str]:
    """The environment of a git command: fleetrun's own without :data:`DROPPED_ENV`, no
    prompt, the C locale, then ``env``."""
    base = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV}
    return dict(base, **_ENV, **(env or {}))


def git(
    cwd: str | Path, *args: str, check: bool = True, timeout: float = 120, env: Optional[dict[str, str]] = None
) -> str:
    """Run ``git -C cwd args...`` (argv, never a shell, :func:`git_argv`); return stdout.

    :param env: variables set for this command, over the process's own (:func:`git_env`).
    """
    proc = subprocess.run(
        git_argv(cwd, *args),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=git_env(env),
        timeout=timeout,
    )
    out = proc.stdout.decode("utf-8", "replace")
    if check and proc.returncode != 0:
        raise GitError(list(args), proc.returncode, out)
    return out


def repo_toplevel(path: str | Path) -> Optional[str]:
    try:
        return git(path, "rev-parse", "--show-toplevel").strip() or None
    except (GitError, FileNotFoundError, NotADirectoryError):
        return None


def common_dir(path: str | Path) -> str:
    out = git(path, "rev-parse", "--git-common-dir").strip()
    return str((Path(path) / out).resolve())


@contextmanager
def repo_lock(lock_dir: Path, repo: str, common: Optional[str] = None) -> Iterator[None]:
    """Hold an exclusive lock for one repository (across processes) while git
    changes its worktrees or branches. Keep it short."""
    lock_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = hashlib.sha1((common or common_dir(repo)).encode()).hexdigest()[:16]
    with FileLock(lock_dir / f"git-{key}.lock"):
        yield


def is_dirty(path: str | Path) -> bool:
    return bool(git(path, "status", "--porcelain", "--untracked-files=all").strip())


def has_identity(path: str | Path) -> bool:
    return bool(git(path, "config", "user.email", check=False).strip())


class WorktreeTampered(Exception):
    """A worktree fleetrun made no longer belongs to the repository it was made in
    (its ``.git`` file was rewritten, replaced or removed). Nothing is run in it."""


@dataclass(frozen=True)
class Pinned:
    """A linked worktree pinned to the repository fleetrun made it in.

    :ivar root: the worktree's top folder.
    :ivar gitdir: its administrative folder, ``<common>/worktrees/<name>``.
    :ivar common: the repository's common git folder.
    """

    root: str
    gitdir: str
    common: str

    # all three are real paths (resolved once, by :func:`pin_worktree`, the only maker):
    # :func:`check_pinned`, which runs before every git command, resolves only what the
    # worktree's files name


def worktree_gitdirs(admin_root: str | Path) -> Iterator[tuple[Path, str]]:
    """``(admin folder, the path its gitdir file names)`` for each worktree a repository
    records in ``admin_root`` (its ``<common>/worktrees``), in name order; the
    unreadable ones are left out."""
    try:
        entries = sorted(Path(admin_root).iterdir())
    except OSError:
        return
    for entry in entries:
        try:
            yield entry, (entry / "gitdir").read_text(encoding="utf-8", errors="replace").strip()
        except OSError:
            continue


def pin_worktree(root: str | Path, common: str | Path) -> Pinned:
    """Find the administrative folder of the worktree at ``root`` from the trusted side:
    the repository's ``<common>/worktrees/*/gitdir`` files (the worktree's own ``.git``
    file is what an agent can rewrite, so it is only checked, never followed).

    :raises WorktreeTampered: when no worktree of that repository is at ``root``, or
        its ``.git`` file does not point back at it.
    """
    real_root = os.path.realpath(root)
    common_real = os.path.realpath(common)
    admin_root = Path(common_real) / "worktrees"
    want = os.path.join(real_root, ".git")
    found = _admin_folder(admin_root, os.path.basename(real_root), want)
    if found is None:
        raise WorktreeTampered(f"{real_root} is not a worktree of {common_real}")
    pinned = Pinned(root=real_root, gitdir=os.path.realpath(found), common=common_real)
    check_pinned(pinned)
    return pinned


def _admin_folder(admin_root: Path, name: str, want: str) -> Optional[str]:
    """The folder of ``admin_root`` whose ``gitdir`` names ``want``. git names a
    worktree's folder after the worktree's own (``name``, or ``name1``, ``name2``... when
    that is taken), so that one is read first; the others only when it is not the one
    (a repository with many worktrees is not read through for every pin)."""
    first = admin_root / name
    try:
        target = (first / "gitdir").read_text(encoding="utf-8", errors="replace").strip()
        if os.path.realpath(target) == want:
            return str(first)
    except OSError:
        pass
    return next(
        (str(entry) for entry, target in worktree_gitdirs(admin_root) if os.path.realpath(target) == want), None
    )


def check_pinned(p: Pinned) -> None:
    """Check that the worktree's ``.git`` is still the plain file git wrote, naming the
    administrative folder fleetrun found for it.

    :raises WorktreeTampered: with what is wrong.
    """
    dotgit = os.path.join(p.root, ".git")
    try:
        st = os.lstat(dotgit)
    except FileNotFoundError:
        raise WorktreeTampered(f"{dotgit} is missing") from None
    except OSError as e:
        raise WorktreeTampered(f"{dotgit} cannot be read: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a regular file"
        raise WorktreeTampered(f"{dotgit} is {kind} (it was replaced)")
    if st.st_size > 4096:
        raise WorktreeTampered(f"{dotgit} was rewritten")
    with open(dotgit, "rb") as f:
        text = f.read(4097).decode("utf-8", "replace").strip()
    if not text.startswith("gitdir:"):
        raise WorktreeTampered(f"{dotgit} was rewritten")
    target = text[len("gitdir:") :].strip()
    if not os.path.isabs(target):
        target = os.path.join(p.root, target)
    # p.gitdir is real (pin_worktree resolved it); the file naming it as git wrote it
    # (absolute, resolved) needs no resolving. A folder swapped for a link on the way to
    # it is the commondir check's to find, as it was when both sides were resolved.
    if target != p.gitdir and os.path.realpath(target) != p.gitdir:
        raise WorktreeTampered(f"{dotgit} was rewritten to point at {target}")
    try:
        back = (Path(p.gitdir) / "commondir").read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        raise WorktreeTampered(f"{p.gitdir} has no commondir file") from None
    back_path = back if os.path.isabs(back) else os.path.join(p.gitdir, back)
    if os.path.realpath(back_path) != p.common:
        raise WorktreeTampered(f"{p.gitdir} no longer belongs to {p.common}")


def wt_git(
    p: Pinned, *args: str, check: bool = True, timeout: float = 120, env: Optional[dict[str, str]] = None
) -> str:
    """Run git for a pinned worktree: ``--git-dir`` and ``--work-tree`` are given, so
    nothing the worktree holds can send the command to another repository. The pin is
    checked first.

    :raises WorktreeTampered: when the pin no longer holds.
    """
    check_pinned(p)
    return git(p.root, f"--git-dir={p.gitdir}", f"--work-tree={p.root}", *args, check=check, timeout=timeout, env=env)


def wt_head_is(p: Pinned, ref: str) -> str:
    """The ref the pinned worktree's HEAD names (``refs/heads/...``; ``""`` detached), as
    ``git symbolic-ref -q HEAD`` says it, for a check that it is ``ref``. Its
    administrative folder's ``HEAD`` file, which git itself reads, answers when it names
    ``ref`` (a task's collect and a retry's preparation, every time but a tampered one):
    no git is started for it. Anything else (another branch, a detached HEAD, a ref
    backend that keeps HEAD elsewhere and leaves a placeholder in the file) is asked of
    git, whose answer is the one compared. The pin is checked first.

    :raises WorktreeTampered: when the pin no longer holds.
    """
    check_pinned(p)
    try:
        with open(os.path.join(p.gitdir, "HEAD"), "rb") as f:
            text = f.read(4097)
    except OSError:
        text = b""
    if text.rstrip(b"\n") == f"ref: {ref}".encode():
        return ref
    return wt_git(p, "symbolic-ref", "-q", "HEAD", check=False).strip()


def filters_off(config_z: str) -> list[str]:
    """``-c`` options that switch off every filter driver named in ``config_z`` (the
    output of ``git config -z --get-regexp ^filter\\.``): an empty ``clean``, ``smudge``
    and ``process`` is no command at all. A worktree's ``.gitattributes`` can name any
    driver the repository's config defines (``filter=lfs``); what only reads a
    worktree, as the diff a reviewer is shown, has no need to run one on the agent's
    files."""
    names = set()
    for item in config_z.split("\0"):
        key = item.partition("\n")[0]
        if key.startswith("filter.") and key.count(".") >= 2:
            names.add(key[len("filter.") : key.rindex(".")])
    return [
        opt
        for name in sorted(names)
        for kv in (
            f"filter.{name}.clean=",
            f"filter.{name}.smudge=",
            f"filter.{name}.process=",
            f"filter.{name}.required=false",
        )
        for opt in ("-c", kv)
    ]


def embedded_repositories(p: Pinned, untracked: Optional[list[str]] = None) -> list[str]:
    """The repositories inside the pinned worktree that its branch would record as
    gitlinks, each as ``path/``: a new folder holding a ``.git`` that ``git add -A``
    would add (git lists it as ``path/`` among the untracked files), and a gitlink
    already in the index (the agent's own ``git add``, or its commits) whose folder holds
    a ``.git``. A ``.git`` git itself never sees (in an ignored folder, in a folder that
    has tracked files) is not one: git records nothing of it and runs nothing in it.

    One ``git ls-files`` lists both (``-t``: each entry tagged, ``? path`` for an
    untracked one, ``H mode object stage\tpath`` and the like for the index's), not one
    for each: it runs for every attempt's collect.

    :param untracked: filled with the untracked files the listing found (what ``git
        status --untracked-files=all`` would list as ``??``): a collect that sees one
        knows there is work to commit without asking ``git status``.
    :raises WorktreeTampered: when the pin no longer holds.
    :raises GitError: git refused.
    """
    found = set()
    out = wt_git(p, "ls-files", "-z", "-t", "--stage", "--others", "--exclude-standard")
    for entry in out.split("\0"):
        tag, _, rest = entry.partition(" ")
        if tag == "?":  # untracked: the path as it is (a name may hold a tab)
            if rest.endswith("/"):
                found.add(rest)
            if untracked is not None:
                untracked.append(rest)
            continue
        meta, _, path = rest.partition("\t")
        if meta.startswith("160000 ") and os.path.lexists(os.path.join(p.root, path, ".git")):
            found.add(path.rstrip("/") + "/")
    return sorted(found)


#: The identity of the merges fleetrun makes, whatever the user's or the repository's
#: settings (which may have none): the variables win over any ``user.*`` setting.
MERGE_IDENTITY = {
    "GIT_AUTHOR_NAME": "fleetrun",
    "GIT_AUTHOR_EMAIL": "fleetrun@localhost",
    "GIT_COMMITTER_NAME": "fleetrun",
    "GIT_COMMITTER_EMAIL": "fleetrun@localhost",
}
#: Settings of every merge fleetrun makes: no hooks (the repository's hooks are not
#: fleetrun's to run, and a worktree's agent may have written them), no editor, no
#: signing that would ask for a passphrase, no recorded resolutions replayed.
MERGE_CONFIG = (
    "-c",
    "core.hooksPath=/dev/null",
    "-c",
    "commit.gpgSign=false",
    "-c",
    "rerere.enabled=false",
    "-c",
    "core.editor=true",
)


@dataclass(frozen=True)
class MergeResult:
    """What :func:`wt_merge` did.

    :ivar commit: the merge commit, or None when it stopped on a conflict.
    :ivar conflicts: the files left unmerged (empty when it merged).
    """

    commit: Optional[str]
    conflicts: list[str]


def unmerged_files(p: Pinned) -> list[str]:
    """The files a stopped merge left unmerged in the pinned worktree."""
    out = wt_git(p, "diff", "--name-only", "--diff-filter=U", "-z", check=False)
    return sorted({f for f in out.split("\0") if f})


def merge_in_progress(p: Pinned) -> bool:
    """A merge stopped on a conflict and was neither concluded nor aborted."""
    return bool(wt_git(p, "rev-parse", "-q", "--verify", "MERGE_HEAD", check=False).strip())


def wt_merge(p: Pinned, ref: str, message: str, timeout: float = 600) -> MergeResult:
    """Merge ``ref`` into the pinned worktree's branch: ``--no-ff --no-edit``, with
    fleetrun's identity (:data:`MERGE_IDENTITY`), no hooks (:data:`MERGE_CONFIG`). A
    conflict leaves the merge stopped, the tree with its markers, for whoever resolves it.

    :param ref: a full ref (``refs/heads/...``) or a commit; never an option.
    :raises GitError: when git refused for another reason than a conflict (unrelated
        histories, an untracked file in the way...).
    :raises WorktreeTampered: when the pin no longer holds.
    """
    if ref.startswith("-"):
        raise ValueError(f"not a ref: {ref!r}")
    try:
        wt_git(
            p,
            *MERGE_CONFIG,
            "merge",
            "--no-ff",
            "--no-edit",
            "-q",
            "-m",
            message,
            ref,
            timeout=timeout,
            env=MERGE_IDENTITY,
        )
    except GitError:
        files = unmerged_files(p) if merge_in_progress(p) else []
        if not files:
            raise
        return MergeResult(None, files)
    return MergeResult(wt_git(p, "rev-parse", "HEAD").strip(), [])

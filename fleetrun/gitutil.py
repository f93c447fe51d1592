"""Small helpers to run git without a shell, and a per-repository lock.

Git's worktree and branch commands are not safe to run concurrently on one
repository (``could not lock config file``), so they run under ``repo_lock``.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Optional


class GitError(Exception):
    def __init__(self, args: list[str], code: int, output: str) -> None:
        super().__init__(f"git {' '.join(args)} failed (exit {code}): {output.strip()[-500:]}")
        self.code = code
        self.output = output


_ENV = {"GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"}


def git(cwd: str | Path, *args: str, check: bool = True, timeout: float = 120) -> str:
    """Run ``git -C cwd args...`` (argv, never a shell); return stdout."""
    env = dict(os.environ, **_ENV)
    proc = subprocess.run(["git", "-C", str(cwd), *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          stdin=subprocess.DEVNULL, env=env, timeout=timeout)
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
    fd = os.open(lock_dir / f"git-{key}.lock", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def is_dirty(path: str | Path) -> bool:
    return bool(git(path, "status", "--porcelain", "--untracked-files=all").strip())


def has_identity(path: str | Path) -> bool:
    return bool(git(path, "config", "user.email", check=False).strip())

"""The summary a DONE task hands to the tasks that depend on it.

Every agent is started (by its shepherd) with ``FLEETRUN_SUMMARY_FILE`` in its
environment: a file in its attempt folder (``attempts/<attempt-id>/summary``, on the
machine it runs on) where it may write, in plain
words, what it did. The handoff uses, first that is not empty: that file; the agent's
own result text (Claude Code's final ``result``; a command agent has none but the
file); the subjects of the commits on the task's branch. An agent's raw output is
never handed on (it held debug lines, progress bars and escape sequences).

The file is written by the agent, so it is read as untrusted input: never through a
link, only a regular file with one name, at most :data:`SUMMARY_LIMIT` characters
kept, control characters (escape sequences, bidi overrides) dropped.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Optional

from .gitutil import GitError, git
from .shepherd import SUMMARY, SUMMARY_ENV

#: C0 and C1 controls, DEL, bidi overrides and isolates (the set ``textutil.safe_text``
#: makes visible): dropped from a summary, which goes into a prompt and onto terminals.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")

#: The environment variable naming the file, and the file's name in the attempt
#: folder: the shepherd sets it for the agent, on the machine it runs on.
ENV_VAR = SUMMARY_ENV
FILE_NAME = SUMMARY
#: Characters kept of a summary; a longer one ends with `` [...]``.
SUMMARY_LIMIT = 2000
#: Commit subjects listed at most (the newest ones), and the characters kept of each.
MAX_SUBJECTS = 20
SUBJECT_LIMIT = 200


def summary_path(attempt_dir: str | Path) -> Path:
    return Path(attempt_dir) / FILE_NAME


def clean(text: str, limit: int = SUMMARY_LIMIT) -> str:
    """``text`` with control characters dropped (tabs become spaces; lines stay lines),
    blank lines at either end removed, cut to ``limit`` characters."""
    text = text.replace("\r\n", "\n").replace("\t", " ")
    lines = [_CONTROL.sub("", line).rstrip() for line in text.split("\n")]
    out = "\n".join(lines).strip("\n").strip()
    return out if len(out) <= limit else out[:limit].rstrip() + " [...]"


def read_summary(path: str | Path, limit: int = SUMMARY_LIMIT) -> str:
    """The summary an agent wrote at ``path``, cleaned (:func:`clean`); "" when there
    is none, or it is a link, not a regular file, a file with more than one name (a
    hard link to someone else's file), or unreadable."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)  # a FIFO opens at once (O_NONBLOCK), and is refused below
    except OSError:
        return ""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            return ""
        # a UTF-8 character is at most 4 bytes: enough to fill the limit, and a sign of more
        data = os.read(fd, 4 * limit + 4)
    except OSError:
        return ""
    finally:
        os.close(fd)
    return clean(data.decode("utf-8", "replace"), limit)


def commit_subjects(repo: str, branch: str, exclude: list[str]) -> str:
    """The subjects of the commits on ``branch`` and on none of ``exclude`` (the task's
    ``git_ref``, its dependencies' branches), oldest first, the newest
    :data:`MAX_SUBJECTS` at most, as a summary; "" when there are none. git runs in
    the repository (trusted), never in the worktree; merges are left out."""
    refs = [f"^{r}" for r in exclude if r]
    try:
        out = git(
            repo,
            "log",
            "--no-merges",
            "--reverse",
            f"--max-count={MAX_SUBJECTS}",
            "--format=%s",
            "--end-of-options",
            f"refs/heads/{branch}",
            *refs,
            "--",
            check=True,
        )
    except (GitError, OSError):
        return ""
    subjects = [clean(s, SUBJECT_LIMIT) for s in out.splitlines()]
    subjects = [s for s in subjects if s]
    if not subjects:
        return ""
    return clean("(no summary written) the commits on its branch:\n" + "\n".join(f"- {s}" for s in subjects))


def first_summary(*candidates: Optional[str]) -> str:
    """The first candidate that is not empty once stripped."""
    for c in candidates:
        if c and c.strip():
            return c.strip()
    return ""

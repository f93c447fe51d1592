"""What a reviewer (the ``brain`` and ``agent`` verifiers) is shown, and how its answer is read.

- :func:`task_diff`: a task's changes, ``git diff <git_ref>...HEAD`` plus what is not
  committed yet, trimmed to a size with a note saying so;
- :func:`review_prompt`: the prompt both reviewers get (task, diff, question, and the
  answer format);
- :func:`parse_reply`: the strict verdict rule. PASS only when the first word of the
  reply is exactly ``PASS``; anything else fails, with the reply's first line as the
  reason when it starts with ``FAIL``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Union

from .gitutil import GitError, Pinned, common_dir, filters_off, git, pin_worktree, wt_git
from .reports import Verdict, Workspace

if TYPE_CHECKING:
    from .config import Config

DEFAULT_MAX_DIFF_BYTES = 60000
#: New files not yet added are shown as diffs up to this many; the rest are named.
MAX_UNTRACKED_SHOWN = 200
#: The last line of every review prompt.
ANSWER_FORMAT = (
    "Answer with a first line of exactly `PASS` or `FAIL: reason` (the word PASS or FAIL in "
    "capitals, nothing before it, no markdown), then explain briefly."
)
NO_VERDICT = "no verdict: reply did not start with PASS"

_THINK = re.compile(r"\A\s*<think>.*?</think>", re.S)
_FAIL = re.compile(r"FAIL\b:?\s*(.*)")


@dataclass
class TaskDiff:
    """A task's changes, ready to show a reviewer.

    :ivar text: the diff, cut to the limit (without the note).
    :ivar stat: ``git diff --stat`` of the same changes.
    :ivar size: the whole diff's size in bytes.
    :ivar shown: how many of those bytes ``text`` holds.
    :ivar untracked: new files past ``MAX_UNTRACKED_SHOWN`` (named, not shown).
    :ivar error: why no diff could be made (not a git repository...), or "".
    """

    text: str = ""
    stat: str = ""
    size: int = 0
    shown: int = 0
    untracked: tuple[str, ...] = ()
    error: str = ""
    base: Optional[str] = None

    @property
    def trimmed(self) -> bool:
        return self.shown < self.size

    @property
    def note(self) -> str:
        """``[diff trimmed: showed N of M bytes]`` when trimmed, else ""."""
        return f"[diff trimmed: showed {self.shown} of {self.size} bytes]" if self.trimmed else ""

    def render(self) -> str:
        """The diff as a prompt shows it: stat, fenced diff, trim note, untracked files."""
        if self.error:
            return f"(no diff: {self.error})"
        if not self.size and not self.untracked:
            return "(no changes)"
        parts = []
        if self.stat.strip():
            parts.append(self.stat.rstrip())
        if self.size:
            parts.append("```diff\n" + self.text.rstrip("\n") + "\n```")
        if self.note:
            parts.append(self.note)
        if self.untracked:
            parts.append("Untracked files (not shown): " + ", ".join(self.untracked))
        return "\n\n".join(parts)


def cut_utf8(data: bytes, limit: int) -> bytes:
    """The first ``limit`` bytes of ``data``, not splitting a UTF-8 character."""
    if len(data) <= limit:
        return data
    end = max(0, limit)
    while end > 0 and (data[end] & 0xC0) == 0x80:
        end -= 1
    return data[:end]


def task_diff(
    where: Union[str, Workspace], git_ref: Optional[str], max_bytes: int = DEFAULT_MAX_DIFF_BYTES
) -> TaskDiff:
    """The changes in the git checkout at ``where``: ``git diff <git_ref>...HEAD`` (what
    was committed since the branch left ``git_ref``) followed by ``git diff HEAD`` and
    new files not added yet (what is not committed yet). Without ``git_ref``, only the
    uncommitted changes.

    ``where`` is a path, or a :class:`Workspace`: a worktree fleetrun made (with its
    ``repo`` and ``root`` recorded) is pinned to that repository (``gitutil.wt_git``), so
    a ``.git`` the agent rewrote cannot show the reviewer another repository's changes.

    Never raises for git problems: :attr:`TaskDiff.error` says what went wrong.

    :raises WorktreeTampered: when the worktree no longer belongs to its repository (a
        reviewer must not reach a verdict on it).
    """
    opts = ["--no-color", "--no-ext-diff", "--no-textconv"]
    pin: Optional[Pinned] = None
    if isinstance(where, str):
        path = where
    else:
        path = where.path
        if where.is_worktree and where.repo and where.root:
            try:
                common = common_dir(where.repo)
            except (GitError, OSError) as e:
                return TaskDiff(error=f"cannot find the repository {where.repo}: {e}", base=git_ref)
            pin = pin_worktree(where.root, common)

    def run(*args: str, check: bool = True) -> str:
        return wt_git(pin, *args, check=check) if pin is not None else git(path, *args, check=check)

    try:
        # no filter the repository defines runs on the agent's files for a diff (its
        # .gitattributes can name any of them); no textconv or external diff either (opts)
        off = filters_off(run("config", "-z", "--get-regexp", r"^filter\.", check=False))
        committed = run(*off, "diff", *opts, f"{git_ref}...HEAD", "--") if git_ref else ""
        stat = run(*off, "diff", "--stat", *opts, f"{git_ref}...HEAD", "--") if git_ref else ""
        pending = run(*off, "diff", *opts, "HEAD", "--")
        pending_stat = run(*off, "diff", "--stat", *opts, "HEAD", "--")
        untracked = run("ls-files", "--others", "--exclude-standard", "-z").split("\0")
    except GitError as e:
        return TaskDiff(error=str(e), base=git_ref)
    except (OSError, ValueError) as e:
        return TaskDiff(error=f"cannot run git: {e}", base=git_ref)
    new_files = [u for u in untracked if u]
    for rel in new_files[:MAX_UNTRACKED_SHOWN]:
        # exit code 1 means "differs": not an error here
        pending += run(*off, "diff", *opts, "--no-index", "--", "/dev/null", rel, check=False)
        pending_stat += f" {rel} (new, not added)\n"
    if pending.strip():
        committed += ("\n" if committed and not committed.endswith("\n") else "") + pending
        stat = (stat.rstrip() + "\nnot committed yet:\n" + pending_stat).strip() + "\n"
    data = committed.encode("utf-8", "replace")
    shown = cut_utf8(data, max_bytes)
    return TaskDiff(
        text=shown.decode("utf-8", "replace"),
        stat=stat,
        size=len(data),
        shown=len(shown),
        untracked=tuple(new_files[MAX_UNTRACKED_SHOWN:]),
        base=git_ref,
    )


def review_prompt(task_prompt: str, diff: TaskDiff, question: str, intro: str) -> str:
    """The prompt a reviewer gets: ``intro``, the task, the diff, the question, the format."""
    what = f"git diff {diff.base}...HEAD, plus changes not committed yet" if diff.base else "changes not committed yet"
    return (
        f"{intro.strip()}\n\n"
        f"## The task the agent was given\n{task_prompt.strip()}\n\n"
        f"## What the agent changed ({what})\n{diff.render()}\n\n"
        f"## The question\n{question.strip()}\n\n"
        f"## How to answer\n{ANSWER_FORMAT}\n"
    )


def parse_reply(reply: str) -> tuple[bool, str]:
    """Read a reviewer's reply strictly. :return: (passed, reason).

    The verdict is the first word, after leading whitespace (and a leading
    ``<think>...</think>`` block, which reasoning models emit before their answer),
    read the same way for both answers: without markdown emphasis around it (``**PASS**``,
    ``_FAIL_``, `` `PASS` ``) and without punctuation after it (``PASS.``, ``PASS:``,
    ``FAIL -``). PASS only when that word is exactly ``PASS`` (``Pass``, ``PASSED`` and
    ``I think this is a PASS`` fail); ``FAIL`` gives the reason after it on its line;
    anything else is ``no verdict``.
    """
    text = _THINK.sub("", reply or "", count=1).lstrip()
    if not text:
        return False, "empty reply"
    first_line = text.splitlines()[0].strip()
    m = _VERDICT.match(first_line)
    if m and m.group(1) == "PASS":
        return True, first_line
    if m:
        return False, (m.group(2) or "").lstrip("-\u2013\u2014: ").strip() or "FAIL (no reason given)"
    m = _FAIL.match(first_line)  # FAIL glued to its reason ("FAIL:no space") is still a FAIL
    if m:
        return False, m.group(1).strip() or "FAIL (no reason given)"
    return False, NO_VERDICT


#: The first word of a reply: PASS or FAIL, emphasis around it and punctuation after it
#: allowed, then the end of the line or a space; group 2 is the rest of the line.
_VERDICT = re.compile(r"[*_`]*(PASS|FAIL)[*_`]*[.:!,;\-\u2013\u2014]*[*_`]*(?:\s+(.*)|$)")


def fetched_workspace(config: Config, task: Any, attempt: Any, workspace: Any, kind: str) -> Union[Workspace, str]:
    """For an attempt that ran on a peer: a workspace on this machine holding its branch,
    as the plugin that provides its host fetches it back (``fleetrun_fetch_workspace``;
    the ``relay`` plugin for its peers); or, as a string, why there is none."""
    host = attempt.host
    what = f"{'an' if kind == 'agent' else 'a'} {kind} verifier runs on this machine"
    if config is None:
        return f"{what}; the task's workspace is on {host}"
    try:
        local = config.hook.fleetrun_fetch_workspace(task=task, attempt=attempt, workspace=workspace, config=config)
    except Exception as e:  # anything that stops a verdict is a FAIL
        return f"{what}, and the task's branch could not be fetched from {host}: {e}"
    return local if isinstance(local, Workspace) else f"{what}; the task's workspace is on {host}"


def _is_local(config: Config, name: str) -> bool:
    from .hostapi import get_host

    return bool(get_host(config, name).local)


def local_workspace(
    config: Config, task: Any, attempt: Any, workspace: Any, verifier: Any
) -> Union[Workspace, Verdict]:
    """The workspace a verifier that runs on this machine (brain, agent) reads: the
    attempt's own, or, for an attempt that ran on a peer, its branch fetched back
    from there; a FAIL verdict saying why when there is none."""
    host = getattr(attempt, "host", None) or "local"
    if host == "local" or (config is not None and _is_local(config, host)):
        return workspace  # its workspace is a folder here (this machine, or a host like it)
    local = fetched_workspace(config, task, attempt, workspace, verifier.kind)
    if isinstance(local, str):
        return Verdict(passed=False, kind=verifier.kind, label=verifier.label, host=host, reason=local)
    return local

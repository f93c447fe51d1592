"""Who owns a task's paths: the seed's routing rule, as pure functions (no process, no
ledger: ``tests/test_mailbox_owner.py`` checks them over generated folder trees).

- The paths are relative to the task's cwd and must stay inside it; none means the
  cwd itself. (``role owner`` also takes an absolute path, as it is.)
- The owner is the live role whose folder most specifically covers every path: the
  deepest folder among those holding all of them. Several paths need one role that
  covers them all.
- Two or more live roles on that same folder are told apart by focus: the deepest
  focus that holds every path wins; a tie, or no focus that holds them, means no owner
  (the task is spawned).
- A role's focus is the deepest folder holding at least half of its recent edits.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Optional

from .store import Role


def _covers(directory: str, path: str) -> bool:
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


def _depth(path: str) -> int:
    return len([p for p in path.split(os.sep) if p])


def focus(edited: Sequence[str]) -> Optional[str]:
    """The deepest folder holding at least half of ``edited`` (canonical file paths), or
    None without edits.

    Every folder that holds at least half the edits lies on one line from ``/`` down
    (two disjoint folders cannot both hold more than half, and at exactly half each the
    deeper of the two ancestors they share is taken), so the deepest is well defined.
    """
    if not edited:
        return None
    need = (len(edited) + 1) // 2
    counts: dict[str, int] = {}
    for path in edited:
        d = os.path.dirname(path)
        seen: set[str] = set()
        while d not in seen:
            seen.add(d)
            counts[d] = counts.get(d, 0) + 1
            parent = os.path.dirname(d)
            if parent == d:
                break
            d = parent
    held = [d for d, n in counts.items() if n >= need]
    # at exactly half, two sibling folders can both qualify: the deepest folder then is
    # the deepest one that every other qualifying folder is on the way to, or covers
    best: Optional[str] = None
    for d in sorted(held, key=_depth, reverse=True):
        if all(_covers(o, d) or _covers(d, o) for o in held):
            best = d
            break
    return best or os.sep


def targets(paths: Sequence[str], cwd: str) -> tuple[Optional[list[str]], str]:
    """The canonical paths a task is about: each of ``paths`` under ``cwd`` (an absolute
    one as it is), or ``cwd`` itself. :return: (the paths, "") or (None, why not)."""
    base = os.path.realpath(cwd)
    if not paths:
        return [base], ""
    out = []
    for p in paths:
        if not os.path.isabs(p) and os.path.normpath(p).split(os.sep)[0] == "..":
            return None, f"{p!r} escapes the cwd {base}"
        real = os.path.realpath(os.path.join(base, p))
        if not os.path.isabs(p) and not _covers(base, real):
            return None, f"{p!r} resolves to {real}, outside the cwd {base}"
        out.append(real)
    return out, ""


def owner(
    paths: Sequence[str], cwd: str, live: Sequence[Role], foci: Mapping[str, Optional[str]]
) -> tuple[Optional[Role], str]:
    """The live role that owns ``paths`` (relative to ``cwd``), by the rule above.

    :param live: the live roles (their folders canonical).
    :param foci: each role's focus, by role key (None or missing: no focus).
    :return: (the role, why: ``relay owns src/relay/peer.rs``), or (None, why none does).
    """
    found, problem = targets(paths, cwd)
    if found is None:
        return None, problem
    what = ", ".join(paths) if paths else os.path.realpath(cwd)
    covering = [r for r in live if all(_covers(r.dir, t) for t in found)]
    if not covering:
        if not live:
            return None, "no role is live"
        return None, f"no live role covers {what}"
    deepest = max(_depth(r.dir) for r in covering)
    top = [r for r in covering if _depth(r.dir) == deepest]
    if len(top) == 1:
        return top[0], f"{top[0].name} owns {what}"
    # two or more live roles on one folder: their focus decides
    held = [(r, f) for r in top if (f := foci.get(r.key)) and all(_covers(f, t) for t in found)]
    names = ", ".join(r.name for r in top)
    if not held:
        return None, f"{names} are all on {top[0].dir} and no focus of theirs holds {what}"
    best = max(_depth(f) for _, f in held)
    winners = [(r, f) for r, f in held if _depth(f) == best]
    if len(winners) > 1:
        return None, f"{names} are all on {top[0].dir} and their foci tie ({winners[0][1]})"
    role, f = winners[0]
    return role, f"{role.name} owns {what} (its focus {f})"

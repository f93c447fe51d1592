"""The status table: rows of cells fitted to the terminal's width, cutting the widest
cells first (never an id, which must stay whole to be typed back) and then leaving
out the least needed columns."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Optional, TextIO


def terminal_width(out: TextIO) -> Optional[int]:
    """The width to fit: ``$COLUMNS``, else the terminal's; None (no limit) when
    ``out`` is not a terminal, so a pipe or a file gets every cell whole."""
    env = os.environ.get("COLUMNS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    try:
        if not out.isatty():
            return None
    except (AttributeError, ValueError):
        return None
    import shutil  # here: its archive modules are a tenth of a piped `status`'s start-up

    return shutil.get_terminal_size().columns


def cut(text: str, width: int) -> str:
    """``text``, or its first ``width - 1`` characters and ``…`` when it is longer."""
    return text if len(text) <= width else (text[: max(0, width - 1)] + "…")


def cut_left(text: str, width: int) -> str:
    """``text``, or ``…`` and its last ``width - 1`` characters when it is longer (a
    path's end is what tells it apart)."""
    return text if len(text) <= width else ("…" + text[len(text) - max(0, width - 1) :])


#: status columns: header, right-aligned, the narrowest it is cut to (None: never cut,
#: an id must stay whole to be typed back).
_COLUMNS = [
    ("NAME", False, 10),
    ("STATE", False, None),
    ("ATT", True, None),
    ("WHERE", False, 5),
    ("AGE", True, None),
    ("COST", True, None),
    ("ID", False, None),
    ("BRANCH", False, 10),
    ("WORKTREE", False, 24),
    ("REASON", False, 16),
]
#: Columns cut on the left: a worktree's folder name (the task's name and id) is at its end.
_CUT_LEFT = {"WORKTREE"}
#: When a row is too wide: cells are cut in this order, and if that is not enough,
#: whole columns are left out in this one.
_CUT_ORDER = ["REASON", "WORKTREE", "BRANCH", "NAME", "WHERE"]
_DROP_ORDER = ["AGE", "COST", "ATT", "WORKTREE", "WHERE"]


def _fit_widths(cols: list[int], natural: list[int], width: int) -> Optional[list[int]]:
    """Widths for ``cols`` within ``width``, cutting the widest cuttable cell a
    character at a time (so no one column pays for all); None if it cannot fit."""
    widths = [natural[i] for i in cols]
    least = [max(_COLUMNS[c][2] or natural[c], len(_COLUMNS[c][0])) for c in cols]
    rank = {name: n for n, name in enumerate(_CUT_ORDER)}
    order = [k for k in range(len(cols)) if _COLUMNS[cols[k]][0] in rank]
    over = sum(widths) + 2 * (len(widths) - 1) - width
    while over > 0:
        room = [k for k in order if widths[k] > least[k]]
        if not room:
            return None
        k = max(room, key=lambda k: (widths[k], -rank[_COLUMNS[cols[k]][0]]))
        widths[k] -= 1
        over -= 1
    return widths


def fit_table(rows: Sequence[Sequence[str]], width: Optional[int]) -> tuple[list[str], list[str], bool]:
    """The header and ``rows`` as aligned lines no wider than ``width`` (None: no
    limit): the widest cells are cut with ``…`` (REASON first, never an ID), then
    the least needed columns are left out. :return: (lines, columns left out, whether
    a cell was cut)."""
    heads = [c[0] for c in _COLUMNS]
    # by column, not by cell: with 10,000 rows each cell's own Python was the table's time
    columns = [[h, *col] for h, col in zip(heads, zip(*rows))] if rows else [[h] for h in heads]
    natural = [max(map(len, col)) for col in columns]
    cols = list(range(len(heads)))
    widths: Optional[list[int]] = natural
    if width is not None:
        widths = _fit_widths(cols, natural, width)
        for name in _DROP_ORDER:
            if widths is not None:
                break
            cols.remove(heads.index(name))
            widths = _fit_widths(cols, natural, width)
        if widths is None:  # too narrow for anything: the narrowest there is
            widths = [max(_COLUMNS[c][2] or natural[c], len(heads[c])) for c in cols]
    assert widths is not None
    was_cut = False
    shown = []
    spec = []
    for k, c in enumerate(cols):
        w, cells = widths[k], columns[c]
        if natural[c] > w:
            how = cut_left if heads[c] in _CUT_LEFT else cut
            cells = [text if len(text) <= w else how(text, w) for text in cells]
            was_cut = True
        shown.append(cells)
        # the last column is not padded; "%-Ns" and "%Ns" pad as str.ljust and str.rjust do
        spec.append("%s" if k == len(cols) - 1 else f"%{'' if _COLUMNS[c][1] else '-'}{w}s")
    # a row's cells as a tuple, for one %: a third quicker than str.format of each row's cells
    lines = list(map(str.rstrip, map("  ".join(spec).__mod__, zip(*shown))))
    return lines, [h for i, h in enumerate(heads) if i not in cols], was_cut

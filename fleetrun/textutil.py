"""Text that reaches a terminal: names, paths, reasons and agent output made visible.

A task name, a verifier's output or an agent's reply can hold terminal escape
sequences (``ESC [2J`` clears the screen, ``ESC ]0;...BEL`` sets the window title,
and a C1 ``CSI`` byte does the same on some terminals). Everything fleetrun prints
that it did not write itself goes through :func:`safe_text`, which shows such
characters as visible ``\\x1b``-style escapes instead of sending them.
"""

from __future__ import annotations

import re
import time
from typing import Optional

#: C0 controls, DEL, C1 controls, and the bidirectional overrides and isolates that
#: reorder what a reader sees ("Trojan Source").
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")

ELLIPSIS = "\u2026"


def _escape(m: re.Match[str]) -> str:
    c = m.group(0)
    n = ord(c)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}"


def safe_text(s: object, limit: Optional[int] = None, keep: str = "\t") -> str:
    """``s`` as text that cannot control the terminal it is printed on.

    :param s: any value; it is turned into a string first.
    :param limit: cap on the length of the result; a longer one ends with ``…``.
        None: no cap (for messages, whose end says what to do).
    :param keep: control characters printed as they are (tab by default; pass
        ``"\\t\\n"`` for text whose lines are meant to be lines).
    :return: the text with every other control character shown as ``\\x1b``,
        ``\\x9b``, ``\\u202e``...
    """
    text = s if isinstance(s, str) else str(s)
    if text.isprintable():  # every character _CONTROL matches is unprintable (C0, C1: Cc; the bidi ones: Cf)
        out = text
    elif keep:
        out = _CONTROL.sub(lambda m: m.group(0) if m.group(0) in keep else _escape(m), text)
    else:
        out = _CONTROL.sub(_escape, text)
    if limit is not None and len(out) > limit:
        out = out[: max(0, limit - 1)] + ELLIPSIS
    return out


#: ``keep=`` for text whose lines are meant to be lines.
LINES = "\t\n"


def strip_control(s: str, keep: str = LINES) -> str:
    """``s`` without its control characters (those of ``keep`` aside): for text an agent
    is given to read (a mailbox message), where an escape shown as ``\\x1b`` would only
    be noise.

    :param keep: control characters kept (tab and newline by default).
    """
    return _CONTROL.sub(lambda m: m.group(0) if m.group(0) in keep else "", s)


#: How long a task name may be when printed inside another line.
NAME_LIMIT = 80


def safe_name(s: object) -> str:
    """A task name (or another short label) for one line of output: escaped and capped."""
    return safe_text(s, limit=NAME_LIMIT)


def ago(t: Optional[float], now: Optional[float] = None) -> str:
    """How long ago ``t`` (a ``time.time()``) was, in the fewest characters: ``5s``,
    ``12m``, ``3h05m``, ``2d``; ``-`` for never."""
    if not t:
        return "-"
    s = max(0, int((now or time.time()) - t))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d"

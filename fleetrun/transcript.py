"""An attempt's agent log read as it grows, for people: the last tool call (what the
live view shows a running agent doing) and the transcript ``fleetrun logs -f`` prints
(assistant text, tool calls and their results, cost), never the raw JSON.

The log is the agent's: untrusted. It is read in bounded slices from where the last
read stopped, a line longer than :data:`MAX_LINE` is skipped, each line is parsed by
:func:`fleetrun.claudecli.parse_line` (noise is skipped, nothing raises), and every
piece of text shown goes through :func:`~fleetrun.textutil.safe_text` with a cap.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

from .claudecli import parse_line
from .textutil import safe_text

MAX_READ = 256 << 10  # bytes read per poll; a log that grew more is read from its newest part
MAX_LINE = 1 << 20  # a stream-json line longer than this is not one a person needs to see
TOOL_LIMIT = 80  # characters of a tool call's summary
TEXT_LIMIT = 400  # characters of one line of assistant text or tool result shown
TEXT_LINES = 6  # lines of one assistant message or tool result shown

#: The input key that says what a tool call is about, per Claude Code tool.
_TOOL_KEYS = {
    "Bash": "command",
    "Edit": "file_path",
    "MultiEdit": "file_path",
    "Write": "file_path",
    "Read": "file_path",
    "NotebookEdit": "notebook_path",
    "Grep": "pattern",
    "Glob": "pattern",
    "WebFetch": "url",
    "WebSearch": "query",
    "Task": "description",
    "Agent": "description",
}


class LogTail:
    """The complete lines appended to a file since the last :meth:`read`.

    :param path: the attempt's log.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""
        self.skipping = False  # inside a line too long to keep: drop up to its newline

    def read(self) -> list[str]:
        """:return: the new complete lines (decoded, invalid UTF-8 replaced); [] when
        the file is missing or did not grow. A file that shrank is read again from its
        start; of one that grew by more than :data:`MAX_READ`, only the newest part."""
        try:
            size = os.stat(self.path).st_size
        except OSError:
            return []
        if size < self.offset:
            self.offset, self.partial, self.skipping = 0, b"", False
        if size == self.offset:
            return []
        if size - self.offset > MAX_READ:  # fell behind: what it does now matters, not all it did
            self.offset, self.partial, self.skipping = size - MAX_READ, b"", True
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read(MAX_READ)
        except OSError:
            return []
        self.offset += len(data)
        chunks = (self.partial + data).split(b"\n")
        self.partial = chunks.pop()
        if self.skipping and chunks:
            chunks.pop(0)
            self.skipping = False
        if len(self.partial) > MAX_LINE:
            self.partial, self.skipping = b"", True
        return [c.decode("utf-8", "replace") for c in chunks if len(c) <= MAX_LINE]


def tool_call(name: Any, tool_input: Any, cwd: Optional[str] = None) -> str:
    """A tool call in a few words: ``Edit src/api.py``, ``Bash cargo test``.

    :param cwd: the worktree: a file path inside it is shown relative to it.
    """
    shown = safe_text(name if isinstance(name, str) else "?", limit=40)
    arg = tool_input.get(_TOOL_KEYS.get(shown, ""), "") if isinstance(tool_input, dict) else ""
    if not isinstance(arg, str) or not arg:
        return shown
    if cwd and arg.startswith(cwd.rstrip("/") + "/"):
        arg = arg[len(cwd.rstrip("/")) + 1 :]
    arg = " ".join(arg.split())  # a multi-line command on one line
    return safe_text(f"{shown} {arg}", limit=TOOL_LIMIT)


def _blocks(ev: dict[str, Any]) -> list[dict[str, Any]]:
    msg = ev.get("message")
    content = msg.get("content") if isinstance(msg, dict) else None
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def _cost(ev: dict[str, Any]) -> Optional[float]:
    v = ev.get("total_cost_usd")
    if isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 1e6:
        return float(v)
    return None


def _lines(text: Any, prefix: str) -> list[str]:
    if not isinstance(text, str):
        return []
    lines = [ln for ln in text.splitlines() if ln.strip()]
    shown = [prefix + safe_text(ln, limit=TEXT_LIMIT) for ln in lines[:TEXT_LINES]]
    if len(lines) > TEXT_LINES:
        shown.append(f"{prefix}… ({len(lines) - TEXT_LINES} more lines)")
    return shown


class Activity:
    """What an agent's stream-json says it does, event by event.

    :ivar doing: the last tool call (``Edit src/api.py``), or ``thinking`` after
        assistant text, or "" before anything.
    :ivar cost_usd: the cost its ``result`` event reported, or None before one.
    """

    def __init__(self, path: Path, cwd: Optional[str] = None) -> None:
        self.tail = LogTail(path)
        self.cwd = cwd
        self.doing = ""
        self.cost_usd: Optional[float] = None

    def poll(self) -> list[str]:
        """Read what the log gained. :return: those events rendered for people."""
        out: list[str] = []
        for line in self.tail.read():
            ev = parse_line(line)
            if ev is not None:
                out.extend(self.feed(ev))
        return out

    def feed(self, ev: dict[str, Any]) -> list[str]:
        """One event: update :attr:`doing` and :attr:`cost_usd`. :return: its lines."""
        kind = ev.get("type")
        out: list[str] = []
        if kind == "system" and ev.get("subtype") == "init":
            model = ev.get("model")
            out.append("session started" + (f" ({safe_text(model, limit=60)})" if isinstance(model, str) else ""))
        elif kind == "assistant":
            for b in _blocks(ev):
                if b.get("type") == "text":
                    out.extend(_lines(b.get("text"), "  "))
                    self.doing = self.doing if self.doing.startswith("thinking") else "thinking"
                elif b.get("type") == "tool_use":
                    self.doing = tool_call(b.get("name"), b.get("input"), self.cwd)
                    out.append(f"  → {self.doing}")
        elif kind == "user":
            for b in _blocks(ev):
                if b.get("type") != "tool_result":
                    continue
                content = b.get("content")
                if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
                    content = "\n".join(str(c.get("text", "")) for c in content if isinstance(c, dict))
                word = "error" if b.get("is_error") is True else "result"
                lines = _lines(content, "      ")
                out.append(f"    ← {word}" + (":" if lines else ""))
                out.extend(lines[:3])
        elif kind == "result":
            self.cost_usd = _cost(ev)
            turns = ev.get("num_turns")
            parts = [safe_text(ev.get("subtype") or "result", limit=40)]
            if ev.get("is_error") is True:
                parts.append("is_error")
            if self.cost_usd is not None:
                parts.append(f"${self.cost_usd:.2f}")
            if isinstance(turns, int) and not isinstance(turns, bool):
                parts.append(f"{turns} turn{'s' if turns != 1 else ''}")
            out.append("result: " + ", ".join(parts))
            out.extend(_lines(ev.get("result"), "  "))
            self.doing = "ended"
        return out

"""policy.toml: limits per machine. Re-read on every pass of the loop."""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from .exceptions import UsageError, UsageErrors


@dataclass
class LocalPolicy:
    max_tasks: int = 4
    min_free_mem_mb: Optional[float] = None
    max_load_per_core: Optional[float] = None
    min_free_disk_mb: Optional[float] = None
    mem_per_task_mb: float = 1024.0
    drain: bool = False


@dataclass
class PeerPolicy:
    max_tasks: int = 2
    min_free_mem_mb: Optional[float] = None
    max_load_per_core: Optional[float] = None
    min_free_disk_mb: Optional[float] = None
    mem_per_task_mb: Optional[float] = None
    drain: bool = False


@dataclass
class Policy:
    stale_after_secs: float = 90.0
    auto_route: bool = False
    local: LocalPolicy = field(default_factory=LocalPolicy)
    peers: PeerPolicy = field(default_factory=PeerPolicy)
    peer: dict[str, PeerPolicy] = field(default_factory=dict)

    def for_peer(self, name: str) -> PeerPolicy:
        return self.peer.get(name, self.peers)


_NUM = (int, float)
_TOP = {"stale_after_secs": _NUM, "auto_route": (bool,), "local": (dict,), "peers": (dict,)}
_MACHINE = {
    "max_tasks": (int,),
    "min_free_mem_mb": _NUM,
    "max_load_per_core": _NUM,
    "min_free_disk_mb": _NUM,
    "mem_per_task_mb": _NUM,
    "drain": (bool,),
}


def _type_ok(v: Any, types: tuple[type, ...]) -> bool:
    return isinstance(v, types) and not (isinstance(v, bool) and bool not in types)


def _tname(types: tuple[type, ...]) -> str:
    names: dict[tuple[type, ...], str] = {(bool,): "true or false", (int,): "a whole number", (dict,): "a table"}
    return names.get(types, "a number")


def load_policy(path: Path) -> Policy:
    """Read and check ``policy.toml``; without the file, the defaults.

    :raises UsageErrors: every problem, each naming the file, line and key.
    """
    if not path.exists():
        return Policy()
    from .collect import map_lines, parse_toml_file

    disp = str(path)
    data, text = parse_toml_file(path, disp)
    lines = map_lines(text)
    errors: list[UsageError] = []

    def err(line: int, key: str, msg: str) -> None:
        errors.append(UsageError(msg, file=disp, line=line, key=key))

    def check_machine(table: dict[str, Any], where: tuple[Any, ...], label: str, target: Any,
                      allow_subtables: bool = False) -> None:
        for k, v in table.items():
            line = lines.get(*where, k)
            if isinstance(v, dict) and allow_subtables:
                continue
            types = _MACHINE.get(k)
            if types is None:
                close = difflib.get_close_matches(k, list(_MACHINE), n=1)
                err(line, f"{label}{k}", "unknown key" + (f" (did you mean '{close[0]}'?)" if close else ""))
                continue
            if not _type_ok(v, types):
                err(line, f"{label}{k}", f"must be {_tname(types)}")
                continue
            if not isinstance(v, bool) and v < 0:
                err(line, f"{label}{k}", "must not be negative")
                continue
            setattr(target, k, v)

    pol = Policy()
    for k, v in data.items():
        line = lines.get("top", k)
        if k not in _TOP:
            close = difflib.get_close_matches(k, list(_TOP), n=1)
            err(line, k, "unknown key" + (f" (did you mean '{close[0]}'?)" if close else ""))
            continue
        if not _type_ok(v, _TOP[k]):
            err(line, k, f"must be {_tname(_TOP[k])}")
            continue
        if k == "stale_after_secs":
            if v <= 0:
                err(line, k, "must be greater than 0")
            else:
                pol.stale_after_secs = float(v)
        elif k == "auto_route":
            pol.auto_route = v
        elif k == "local":
            check_machine(v, ("table", "local"), "local.", pol.local)
        elif k == "peers":
            check_machine(v, ("table", "peers"), "peers.", pol.peers, allow_subtables=True)
            for name, sub in v.items():
                if isinstance(sub, dict):
                    pp = PeerPolicy(**{f: getattr(pol.peers, f) for f in _MACHINE})
                    check_machine(sub, ("table", f"peers.{name}"), f"peers.{name}.", pp)
                    pol.peer[name] = pp
    if errors:
        raise UsageErrors(errors) if len(errors) > 1 else errors[0]
    return pol


class PolicyWatcher:
    """Re-reads policy.toml when it changes; a broken file keeps the last good one."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: Optional[tuple[float, int]] = None
        self.policy = Policy()
        self.error: Optional[str] = None

    def _stat(self) -> Optional[tuple[float, int]]:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return (st.st_mtime, st.st_size)

    def load_strict(self) -> Policy:
        """First load: a broken policy is an error (``fleetrun work`` will not start)."""
        self._stamp = self._stat()
        self.policy = load_policy(self.path)
        return self.policy

    def refresh(self) -> Optional[str]:
        """Reload if changed. :return: a message to show once when the file broke."""
        stamp = self._stat()
        if stamp == self._stamp:
            return None
        self._stamp = stamp
        try:
            self.policy = load_policy(self.path)
        except UsageError as e:
            self.error = e.format()
            return f"policy.toml is broken; keeping the last good policy:\n{self.error}"
        self.error = None
        return None

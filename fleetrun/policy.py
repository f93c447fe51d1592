"""policy.toml: limits per machine. Re-read on every pass of the loop.

``$FLEETRUN_HOME/policy.toml``; without it, this machine runs four tasks at a time.
Every key is listed in ``docs/policy.md``. A misspelt or unknown key, a wrong type or
a negative number is a :class:`~fleetrun.UsageError` naming the file, line and key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Optional

from .exceptions import UsageError, UsageErrors
from .stash import StashKey


@dataclass
class LocalPolicy:
    """``[local]``: this machine. A floor left unset (None) is not checked."""

    max_tasks: int = 4
    min_free_mem_mb: Optional[float] = None
    max_load_per_core: Optional[float] = None
    min_free_disk_mb: Optional[float] = None
    mem_per_task_mb: float = 1024.0
    drain: bool = False


@dataclass
class PeerPolicy:
    """``[peers]`` (defaults for every peer) and ``[peers.NAME]`` (one peer).

    A peer also enforces its own ``[local]`` limits and refuses work past them; these
    are the supervisor's limits for it, on top. ``mem_per_task_mb`` None: the peer's
    own estimate.
    """

    max_tasks: int = 2
    min_free_mem_mb: Optional[float] = None
    max_load_per_core: Optional[float] = None
    min_free_disk_mb: Optional[float] = None
    mem_per_task_mb: Optional[float] = None
    drain: bool = False


@dataclass
class Policy:
    """The whole of ``policy.toml``."""

    stale_after_secs: float = 90.0
    auto_route: bool = False
    #: seconds a task waits, unclaimed, in the mailbox of a role no session answers to
    #: before it is withdrawn and spawned (the ``mailbox`` plugin; docs/mailbox.md)
    claim_timeout_secs: float = 300.0
    local: LocalPolicy = field(default_factory=LocalPolicy)
    peers: PeerPolicy = field(default_factory=PeerPolicy)
    peer: dict[str, PeerPolicy] = field(default_factory=dict)

    def for_peer(self, name: str) -> PeerPolicy:
        """``[peers.NAME]`` if there is one, else the ``[peers]`` defaults."""
        return self.peer.get(name, self.peers)


_NUM = (int, float)
_TOP: dict[str, tuple[type, ...]] = {
    "stale_after_secs": _NUM,
    "auto_route": (bool,),
    "claim_timeout_secs": _NUM,
    "local": (dict,),
    "peers": (dict,),
}
_MACHINE: dict[str, tuple[type, ...]] = {
    "max_tasks": (int,),
    "min_free_mem_mb": _NUM,
    "max_load_per_core": _NUM,
    "min_free_disk_mb": _NUM,
    "mem_per_task_mb": _NUM,
    "drain": (bool,),
}


#: The policy the loop last read (it re-reads policy.toml on every pass), for the
#: plugins that place and admit tasks; unset outside a work loop.
POLICY_KEY = StashKey[Policy]()


def _type_ok(v: Any, types: tuple[type, ...]) -> bool:
    return isinstance(v, types) and not (isinstance(v, bool) and bool not in types)


def _tname(types: tuple[type, ...]) -> str:
    names: dict[tuple[type, ...], str] = {
        (bool,): "true or false",
        (int,): "a whole number",
        (dict,): "a table",
    }
    return names.get(types, "a number")


def _unknown(key: str, known: list[str]) -> str:
    import difflib  # only for a misspelt key

    close = difflib.get_close_matches(key, known, n=1)
    if close:
        return f"unknown key (did you mean '{close[0]}'?)"
    return "unknown key (known: " + ", ".join(known) + ")"


def _value_error(v: Any, types: tuple[type, ...], positive: bool = False) -> Optional[str]:
    if not _type_ok(v, types):
        return f"must be {_tname(types)}"
    if isinstance(v, float) and not math.isfinite(v):
        return "must be a finite number"
    if positive and not isinstance(v, bool) and v <= 0:
        return "must be greater than 0"
    if not isinstance(v, bool) and isinstance(v, _NUM) and v < 0:
        return "must not be negative"
    return None


def load_policy(path: Path) -> Policy:
    """Read and check ``policy.toml``; without the file, the defaults.

    :raises UsageError: a problem, naming the file, line and key
        (:class:`~fleetrun.exceptions.UsageErrors` when there are several).
    """
    if not path.exists():
        return Policy()
    from .tomlfile import map_lines, parse_toml_file

    disp = str(path)
    data, text = parse_toml_file(path, disp)
    lines = map_lines(text)
    errors: list[UsageError] = []

    def err(line: int, key: str, msg: str) -> None:
        errors.append(UsageError(msg, file=disp, line=line, key=key))

    def check_machine(
        table: dict[str, Any], where: tuple[str, ...], prefix: str, target: Any, subtables: bool = False
    ) -> None:
        for k, v in table.items():
            line = lines.get(*where, k)
            if subtables and isinstance(v, dict):
                continue  # [peers.NAME], checked by the caller
            types = _MACHINE.get(k)
            if types is None:
                err(line, f"{prefix}{k}", _unknown(k, list(_MACHINE)))
                continue
            problem = _value_error(v, types)
            if problem:
                err(line, f"{prefix}{k}", problem)
                continue
            setattr(target, k, float(v) if types is _NUM else v)

    pol = Policy()
    for k, v in data.items():
        line = lines.get("top", k)
        if k not in _TOP:
            err(line, k, _unknown(k, list(_TOP)))
            continue
        problem = _value_error(v, _TOP[k], positive=(k in ("stale_after_secs", "claim_timeout_secs")))
        if problem:
            err(line, k, problem)
            continue
        if k == "stale_after_secs":
            pol.stale_after_secs = float(v)
        elif k == "auto_route":
            pol.auto_route = v
        elif k == "claim_timeout_secs":
            pol.claim_timeout_secs = float(v)
        elif k == "local":
            check_machine(v, ("table", "local"), "local.", pol.local)
        elif k == "peers":
            check_machine(v, ("table", "peers"), "peers.", pol.peers, subtables=True)
            for name, sub in v.items():
                if isinstance(sub, dict):
                    pp = PeerPolicy(**{f.name: getattr(pol.peers, f.name) for f in fields(PeerPolicy)})
                    check_machine(sub, ("table", f"peers.{name}"), f"peers.{name}.", pp)
                    pol.peer[name] = pp
    if errors:
        raise UsageErrors(errors) if len(errors) > 1 else errors[0]
    return pol


class PolicyWatcher:
    """Re-reads policy.toml when it changes; a broken file keeps the last good one.

    The loop calls :meth:`load_strict` once before it starts (a broken policy stops
    it) and :meth:`refresh` on every pass, printing what it returns.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen: Optional[bytes] = None
        self.policy = Policy()
        self.error: Optional[str] = None

    def _read(self) -> Optional[bytes]:
        # The content, not the mtime: two edits within one mtime tick stay distinct,
        # and the file is small.
        try:
            return self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            return f"\0unreadable: {e}".encode()

    def load_strict(self) -> Policy:
        """First load: a broken policy is an error (``fleetrun work`` will not start).

        :raises UsageError: what is wrong, with file and line.
        """
        self._seen = self._read()
        self.policy = load_policy(self.path)
        self.error = None
        return self.policy

    def refresh(self) -> Optional[str]:
        """Reload if the file changed.

        :return: a message to show once: the file broke (the last good policy is
            kept), or it is good again after having been broken; else None.
        """
        seen = self._read()
        if seen == self._seen:
            return None
        self._seen = seen
        try:
            pol = load_policy(self.path)
        except UsageError as e:
            self.error = e.format()
            return f"{self.path} changed and is broken; keeping the last good policy until it is fixed:\n{self.error}"
        self.policy = pol
        if self.error is not None:
            self.error = None
            return f"{self.path} is good again; using it"
        return None


def local_drain_source(path: Path) -> Optional[str]:
    """``PATH:LINE`` of a ``[local] drain = true`` in policy.toml, or None when the file
    does not drain this machine: what ``undrain`` cannot clear, named where it is said."""
    try:
        pol = load_policy(path)
    except UsageError:  # a broken file says nothing sure; the loop reports it itself
        return None
    if not pol.local.drain:
        return None
    from .tomlfile import map_lines

    try:
        line = map_lines(path.read_text(encoding="utf-8")).get("table", "local", "drain")
    except (OSError, UnicodeDecodeError):
        return str(path)
    return f"{path}:{line}"

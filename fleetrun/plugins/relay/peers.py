"""Peers: ``peers.toml`` (the machines this supervisor sends work to), what it last
heard from each (``peers-state.json``), and how it finds and trusts them over SSH
(``~/.ssh/config``, both ``known_hosts`` files).

Nothing here imports paramiko at module level: the ``relay`` plugin reads this
module on every ``fleetrun`` invocation, and ``fleetrun status`` must stay fast.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ...exceptions import UsageError
from ...osutil import FileLock

# the wire (protocol), SSH's config and key fingerprints are imported where they are
# used: `status` reads peers.toml and the cached state only

PEERS_FILE = "peers.toml"
STATE_FILE = "peers-state.json"
KNOWN_HOSTS = "known_hosts"
MIN_PEER_VERSION = "0.1.0"
DEFAULT_COMMAND = ("fleetrun",)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_PEER_KEYS: dict[str, Any] = {"address": str, "key": str, "command": list, "added": (int, float)}


# ---------------------------------------------------------------------------------
# peers.toml


@dataclass
class Peer:
    """One ``[peers.NAME]`` table of ``peers.toml``.

    :ivar address: ``[user@]host[:port]`` as given; ``host`` may be an alias of
        ``~/.ssh/config``, resolved on every connection.
    :ivar key: a private key file to offer first (``relay add --key``).
    :ivar command: how to run fleetrun on the peer (``["fleetrun"]``, or
        ``["/opt/venv/bin/python", "-m", "fleetrun"]``).
    """

    name: str
    address: str
    key: Optional[str] = None
    command: list[str] = field(default_factory=lambda: list(DEFAULT_COMMAND))
    added: float = 0.0

    @property
    def user(self) -> Optional[str]:
        return split_address(self.address)[0]

    @property
    def host(self) -> str:
        return split_address(self.address)[1]

    @property
    def port(self) -> Optional[int]:
        return split_address(self.address)[2]


def check_name(name: str) -> str:
    if not _NAME.match(name) or name == "local":
        raise UsageError(
            f"{name!r} is not a usable peer name: letters, digits, '.', '_' and '-', "
            "starting with a letter or digit, and not 'local'",
            key="relay add",
        )
    return name


def split_address(address: str) -> tuple[Optional[str], str, Optional[int]]:
    """``user@host:port`` -> (user, host, port); each part but the host is optional.

    An IPv6 address goes in brackets: ``user@[::1]:2222``.
    """
    user: Optional[str] = None
    rest = address.strip()
    if "@" in rest:
        user, rest = rest.rsplit("@", 1)
        user = user or None
    port: Optional[int] = None
    if rest.startswith("["):
        end = rest.find("]")
        if end < 0:
            raise UsageError(f"{address!r}: an IPv6 address needs a closing ']'", key="address")
        host, tail = rest[1:end], rest[end + 1 :]
        if tail:
            if not tail.startswith(":"):
                raise UsageError(f"{address!r}: expected ':PORT' after ']'", key="address")
            port = _port(tail[1:], address)
    elif rest.count(":") == 1:
        host, p = rest.split(":")
        port = _port(p, address)
    else:
        host = rest
    if not host or any(c.isspace() for c in host):
        raise UsageError(f"{address!r} is not user@host[:port]", key="address")
    return user, host, port


def _port(text: str, address: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise UsageError(f"{address!r}: the port must be a number from 1 to 65535", key="address")
    return int(text)


def peers_path(home: Path) -> Path:
    return home / PEERS_FILE


def load_peers(home: Path) -> dict[str, Peer]:
    """Read ``peers.toml``; without the file, no peers.

    :raises UsageError: a broken file, naming the line and key.
    """
    path = peers_path(home)
    if not path.exists():
        return {}
    from ...tomlfile import map_lines, parse_toml_file

    data, text = parse_toml_file(path, str(path))
    lines = map_lines(text)
    out: dict[str, Peer] = {}
    for top, value in data.items():
        if top != "peers" or not isinstance(value, dict):
            raise UsageError(
                "unknown key: peers.toml holds only [peers.NAME] tables",
                file=str(path),
                line=lines.get("top", top),
                key=top,
            )
        for name, table in value.items():
            where = f"peers.{name}"
            if not isinstance(table, dict):
                raise UsageError("must be a table", file=str(path), line=lines.get("table", "peers", name), key=where)
            for k, v in table.items():
                types = _PEER_KEYS.get(k)
                line = lines.get("table", where, k)
                if types is None:
                    raise UsageError(
                        f"unknown key (one of {', '.join(_PEER_KEYS)})", file=str(path), line=line, key=f"{where}.{k}"
                    )
                if not isinstance(v, types) or isinstance(v, bool):
                    raise UsageError("has the wrong type", file=str(path), line=line, key=f"{where}.{k}")
            if "address" not in table:
                raise UsageError(
                    'missing key: address = "user@host[:port]"',
                    file=str(path),
                    line=lines.get("table", where),
                    key=where,
                )
            command = table.get("command", list(DEFAULT_COMMAND))
            if not command or not all(isinstance(a, str) and a for a in command):
                raise UsageError(
                    "must be a non-empty list of strings",
                    file=str(path),
                    line=lines.get("table", where, "command"),
                    key=f"{where}.command",
                )
            split_address(table["address"])
            out[name] = Peer(
                name=name,
                address=table["address"],
                key=table.get("key"),
                command=list(command),
                added=float(table.get("added", 0.0)),
            )
    return out


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a valid TOML basic string
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def save_peers(home: Path, peers: dict[str, Peer]) -> Path:
    """Write ``peers.toml`` (0600, atomically)."""
    from ...ledger import ensure_private_dir

    ensure_private_dir(home)
    parts = [
        "# fleetrun peers: written by `fleetrun relay add`/`remove`; safe to edit.\n"
        '# command = how to run fleetrun there, e.g. ["/opt/venv/bin/python", "-m", "fleetrun"]\n'
    ]
    for p in sorted(peers.values(), key=lambda p: p.name):
        key = p.name if _NAME.match(p.name) else json.dumps(p.name)
        parts.append(f"\n[peers.{key}]\n")
        parts.append(f"address = {_toml_value(p.address)}\n")
        if p.key:
            parts.append(f"key = {_toml_value(p.key)}\n")
        parts.append(f"command = {_toml_value(list(p.command))}\n")
        parts.append(f"added = {_toml_value(round(p.added, 3))}\n")
    path = peers_path(home)
    _write_private(path, "".join(parts))
    return path


def _write_private(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------
# peers-state.json: the last probe of each peer (written by heartbeats and the CLI)


@contextmanager
def _state_lock(home: Path) -> Iterator[None]:
    from ...ledger import ensure_private_dir

    ensure_private_dir(home)
    with FileLock(home / (STATE_FILE + ".lock")):
        yield


def load_state(home: Path) -> dict[str, dict[str, Any]]:
    """``{name: {"last_heard": t, "probe": {...}, "error": str, "error_at": t}}``."""
    try:
        with open(home / STATE_FILE, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError, RecursionError):  # unreadable: as if nothing was heard
        return {}
    return data if isinstance(data, dict) else {}


def checked_entry(entry: Any) -> tuple[dict[str, Any], Optional[str]]:
    """A peer's cached entry read strictly (:func:`fleetrun.plugins.relay.protocol.parse_peer_entry`):
    ``(entry, None)``, or ``({}, why)`` when it is malformed; such a peer counts as never
    heard from, with that reason, until its next probe replaces the entry."""
    from .protocol import Malformed, parse_peer_entry

    try:
        return parse_peer_entry(entry if entry is not None else {}), None
    except Malformed as e:
        return {}, f"has a malformed entry in {STATE_FILE} ({e}); its next probe replaces it"


def record_probe(
    home: Path, name: str, probe: Optional[dict[str, Any]], error: Optional[str] = None, now: Optional[float] = None
) -> dict[str, Any]:
    """Record a probe's reply (``probe``) or its failure (``error``); a failure keeps
    the last reply and its time, so the peer turns stale when it should. A malformed
    entry on record is dropped, not merged into."""
    now = time.time() if now is None else now
    with _state_lock(home):
        state = load_state(home)
        entry, _ = checked_entry(state.get(name))
        if probe is not None:
            entry.update(last_heard=now, probe=probe, error=None, error_at=None)
        else:
            entry.update(error=error or "no reply", error_at=now)
        state[name] = entry
        _write_private(home / STATE_FILE, json.dumps(state, indent=1, sort_keys=True))
    return entry


def forget_state(home: Path, name: str) -> None:
    with _state_lock(home):
        state = load_state(home)
        if state.pop(name, None) is not None:
            _write_private(home / STATE_FILE, json.dumps(state, indent=1, sort_keys=True))


def add_pending_stop(
    home: Path, name: str, attempt_id: str, pid: Optional[int], token: Optional[str], error: str
) -> None:
    """Remember to stop an attempt on a peer that could not be asked to (the link was
    down when ``fleetrun cancel`` ran); the next heartbeat that reaches it does it."""
    with _state_lock(home):
        state = load_state(home)
        entry, _ = checked_entry(state.get(name))
        stops = dict(entry.get("pending_stops") or {})
        stops[attempt_id] = {"pid": pid, "token": token, "since": time.time(), "error": error}
        entry["pending_stops"] = stops
        state[name] = entry
        _write_private(home / STATE_FILE, json.dumps(state, indent=1, sort_keys=True))


def clear_pending_stop(home: Path, name: str, attempt_id: str) -> None:
    with _state_lock(home):
        state = load_state(home)
        entry, _ = checked_entry(state.get(name))
        stops = dict(entry.get("pending_stops") or {})
        if stops.pop(attempt_id, None) is None:
            return
        entry["pending_stops"] = stops
        state[name] = entry
        _write_private(home / STATE_FILE, json.dumps(state, indent=1, sort_keys=True))


def record_violations(
    home: Path, name: str, counts: dict[str, int], last: Optional[str], last_at: Optional[float]
) -> None:
    """Add ``counts`` (protocol violations per kind, :mod:`.placed`) to the peer's entry,
    with the newest one said plainly, for ``relay peers``: the totals since the peer
    was added (``relay remove`` forgets them)."""
    with _state_lock(home):
        state = load_state(home)
        entry, _ = checked_entry(state.get(name))
        old = entry.get("violations") or {}
        total = dict(old.get("counts") or {})
        for kind, n in counts.items():
            total[kind] = total.get(kind, 0) + n
        entry["violations"] = {
            "counts": total,
            "last": last if last is not None else old.get("last"),
            "last_at": last_at if last_at is not None else old.get("last_at"),
        }
        state[name] = entry
        _write_private(home / STATE_FILE, json.dumps(state, indent=1, sort_keys=True))


def status_of(entry: Optional[dict[str, Any]], stale_after_secs: float, now: Optional[float] = None) -> str:
    """``live``, ``stale`` (heard from longer ago than ``stale_after_secs``) or ``never``."""
    heard = (entry or {}).get("last_heard")
    if not heard or isinstance(heard, bool) or not isinstance(heard, (int, float)):
        return "never"
    now = time.time() if now is None else now
    return "live" if now - float(heard) <= stale_after_secs else "stale"


def _version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])


def unusable_reason(probe: Optional[dict[str, Any]]) -> Optional[str]:
    """Why a peer that answered ``probe`` gets no tasks (fleetrun too old, a feature
    missing), or None. A peer that never answered is judged by its status instead."""
    if not probe:
        return None
    version = str(probe.get("fleetrun") or "")
    if not version:
        return "did not say which fleetrun it runs"
    if _version_tuple(version) < _version_tuple(MIN_PEER_VERSION):
        return f"runs fleetrun {version}; a peer needs {MIN_PEER_VERSION} or later"
    from .protocol import REQUIRED_FEATURES

    missing = [f for f in REQUIRED_FEATURES if f not in (probe.get("features") or [])]
    if missing:
        return (
            f"runs fleetrun {version} without {', '.join(missing)}; upgrade fleetrun there "
            "(a peer that cannot run the verifiers gets no tasks)"
        )
    return None


# ---------------------------------------------------------------------------------
# ~/.ssh/config


@dataclass
class Target:
    """Where and as whom to connect, after ``~/.ssh/config``."""

    alias: str
    hostname: str
    port: int
    user: str
    identity_files: list[str]
    key_name: str  # the name looked up in known_hosts: host, or [host]:port

    @property
    def address(self) -> str:
        host = f"[{self.hostname}]" if ":" in self.hostname else self.hostname
        return f"{self.user}@{host}:{self.port}"


def ssh_config_path() -> Path:
    return Path(os.path.expanduser("~")) / ".ssh" / "config"


def resolve(address: str, key: Optional[str] = None, config_path: Optional[Path] = None) -> Target:
    """Apply ``~/.ssh/config`` (``Host`` aliases, ``HostName``, ``User``, ``Port``,
    ``IdentityFile``, ``HostKeyAlias``) to ``[user@]host[:port]``; what the address
    says explicitly wins, as with ``ssh``."""
    user, host, port = split_address(address)
    path = config_path or ssh_config_path()
    opts: dict[str, Any] = {}
    if path.is_file():
        import paramiko

        opts = dict(paramiko.SSHConfig.from_path(str(path)).lookup(host))
    hostname = str(opts.get("hostname") or host)
    port = port or int(opts.get("port") or 22)
    user = user or opts.get("user")
    if not user:
        import getpass

        user = getpass.getuser()
    ids = [os.path.expanduser(key)] if key else []
    ids += [os.path.expanduser(str(p)) for p in opts.get("identityfile") or []]
    alias = str(opts.get("hostkeyalias") or hostname)
    return Target(
        alias=host,
        hostname=hostname,
        port=int(port),
        user=str(user),
        identity_files=ids,
        key_name=known_host_name(alias, int(port)),
    )


# ---------------------------------------------------------------------------------
# known_hosts


def known_host_name(host: str, port: int) -> str:
    """The name ``ssh`` files a host key under: ``host``, or ``[host]:port``."""
    return host if port == 22 else f"[{host}]:{port}"


def fingerprint(key: Any) -> str:
    """OpenSSH's ``SHA256:...`` fingerprint of a paramiko key."""
    import base64
    import hashlib

    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def known_hosts_files(home: Path) -> list[Path]:
    """The user's ``~/.ssh/known_hosts``, then fleetrun's own."""
    return [Path(os.path.expanduser("~")) / ".ssh" / "known_hosts", home / KNOWN_HOSTS]


class HostKeyRefused(Exception):
    """The peer's host key is unknown or has changed; nothing was sent to it."""


class UnknownHostKey(HostKeyRefused):
    def __init__(self, name: str, keytype: str, fp: str, accept_hint: str) -> None:
        self.name, self.keytype, self.fingerprint = name, keytype, fp
        super().__init__(
            f"the host key of {name} is not known: {keytype} {fp}\n"
            "If that is the key of the machine you mean (on that machine, "
            "`ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub` lists its fingerprints), "
            f"accept it once with:\n  {accept_hint}"
        )


class ChangedHostKey(HostKeyRefused):
    def __init__(self, name: str, keytype: str, fp: str, known: list[tuple[str, str, str]]) -> None:
        self.name, self.keytype, self.fingerprint = name, keytype, fp
        listed = "\n".join(f"  {t} {f}  (in {where})" for t, f, where in known)
        files = sorted({where.rsplit(":", 1)[0] for _, _, where in known})
        removes = "\n".join(f"  ssh-keygen -R '{name}' -f {f}" for f in files)
        super().__init__(
            f"@@@ THE HOST KEY OF {name} HAS CHANGED @@@\n"
            f"It now offers {keytype} {fp}; the key on record is:\n{listed}\n"
            "Someone could be intercepting the connection, or the machine was reinstalled. "
            "fleetrun refuses to connect, and --accept-new does not change that. If you know why "
            f"the key changed, remove the old one and add the peer again:\n{removes}"
        )


def _load_known(path: Path) -> list[tuple[int, Any]]:
    """(line number, paramiko HostKeyEntry) of each usable line of a known_hosts file."""
    import paramiko

    out: list[tuple[int, Any]] = []
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.readlines()
    except OSError:
        return out
    for n, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#") or line.startswith("@"):
            continue
        try:
            entry = paramiko.hostkeys.HostKeyEntry.from_line(line, n)
        except Exception:  # an unreadable line is skipped, as ssh does
            continue
        if entry is not None:
            out.append((n, entry))
    return out


def _matches(pattern_host: str, name: str) -> bool:
    import paramiko

    if pattern_host.startswith("|1|"):
        return paramiko.HostKeys.hash_host(name, pattern_host) == pattern_host
    return pattern_host == name


def known_keys(name: str, files: list[Path]) -> list[tuple[Any, str]]:
    """Every key on record for ``name``: (paramiko key, ``file:line``)."""
    out = []
    for path in files:
        for n, entry in _load_known(path):
            if any(_matches(h, name) for h in entry.hostnames):
                out.append((entry.key, f"{path}:{n}"))
    return out


def check_host_key(name: str, key: Any, files: list[Path], accept_hint: str) -> str:
    """Return where ``key`` is on record for ``name``.

    :raises ChangedHostKey: another key is on record for ``name`` (always refused).
    :raises UnknownHostKey: nothing is on record for ``name``.
    """
    known = known_keys(name, files)
    for k, where in known:
        if k.get_name() == key.get_name() and k.asbytes() == key.asbytes():
            return where
    if known:
        raise ChangedHostKey(
            name, key.get_name(), fingerprint(key), [(k.get_name(), fingerprint(k), where) for k, where in known]
        )
    raise UnknownHostKey(name, key.get_name(), fingerprint(key), accept_hint)


def record_host_key(path: Path, name: str, key: Any) -> None:
    """Append ``name keytype base64`` to fleetrun's own known_hosts (0600)."""
    from ...ledger import ensure_private_dir

    ensure_private_dir(path.parent)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a", encoding="utf-8") as f:
        f.write(f"{name} {key.get_name()} {key.get_base64()}\n")

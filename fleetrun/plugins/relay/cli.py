"""``fleetrun relay add|peers|remove``: pair with peers over SSH and see how they are.

``relay add NAME [user@]host[:port]`` connects (``~/.ssh/config`` and ssh-agent
honoured), checks the host key against ``~/.ssh/known_hosts`` and fleetrun's own
``known_hosts`` (an unknown key is refused unless ``--accept-new``; a changed key
always is), asks the peer's fleetrun what it is (``fleetrun host probe``) and
records the peer in ``$FLEETRUN_HOME/peers.toml``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import threading
import time
from typing import TYPE_CHECKING, Any, Optional, TextIO

from ...exceptions import ExitCode, UsageError
from ...textutil import LINES, safe_text
from .peers import (
    DEFAULT_COMMAND,
    HostKeyRefused,
    Peer,
    check_name,
    checked_entry,
    forget_state,
    load_peers,
    load_state,
    peers_path,
    record_probe,
    save_peers,
    split_address,
    status_of,
    unusable_reason,
)
from .placed import describe as describe_violations

if TYPE_CHECKING:
    from ...config import Config

RULE = "─" * 74
#: ``relay add`` could not pair: the host key was refused, the peer could not be reached
#: or logged into, or it answered that it cannot take work (then it is recorded and
#: ``relay peers`` says why). Not 1 (that is tasks needing a human) nor 4 (the command
#: line is fine: what needs fixing is on the peer's side, or a trust decision).
NOT_PAIRED = 6
PROBE_TIMEOUT_S = 15.0


def main(config: Config, rest: list[str], out: TextIO, err: TextIO) -> int:
    parser = argparse.ArgumentParser(prog="fleetrun relay", description="peers over SSH")
    sub = parser.add_subparsers(dest="verb", metavar="{add,peers,remove}")
    a = sub.add_parser("add", help="pair with a peer: NAME [user@]host[:port]")
    a.add_argument("name", metavar="NAME")
    a.add_argument("address", metavar="[user@]host[:port]", help="a Host alias of ~/.ssh/config works too")
    a.add_argument("--key", metavar="PATH", help="a private key to offer first")
    a.add_argument(
        "--accept-new",
        action="store_true",
        help="trust an unknown host key once and record it in fleetrun's known_hosts",
    )
    a.add_argument(
        "--command",
        metavar="CMD",
        help="how to run fleetrun there (default: fleetrun), e.g. '/opt/venv/bin/python -m fleetrun'",
    )
    p = sub.add_parser("peers", help="every peer: status, last heard, versions, headroom")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--cached", action="store_true", help="do not probe; show what was last heard")
    r = sub.add_parser("remove", help="forget a peer")
    r.add_argument("name", metavar="NAME")
    if rest[:1] == ["help"]:  # named by `fleetrun relay --help`
        parser.print_help(out)
        return ExitCode.OK
    try:
        ns = parser.parse_args(rest)
    except SystemExit as e:
        return ExitCode.OK if e.code == 0 else ExitCode.USAGE_ERROR
    if ns.verb == "add":
        return cmd_add(config, ns, out, err)
    if ns.verb == "peers":
        return cmd_peers(config, ns, out, err)
    if ns.verb == "remove":
        return cmd_remove(config, ns, out, err)
    parser.print_help(out)
    return ExitCode.USAGE_ERROR


def describe_versions(probe: dict[str, Any]) -> str:
    """``fleetrun 0.1.0 · claude 2.1.0, git 2.43.0, python 3.11.7 (linux/x86_64)``."""
    tools = probe.get("tools") or {}
    shown = [
        f"{label} {tools[key]}"
        for key, label in (
            ("claude", "claude"),
            ("git", "git"),
            ("python3", "python"),
            ("node", "node"),
            ("cargo", "cargo"),
        )
        if tools.get(key)
    ]
    return (
        f"fleetrun {probe.get('fleetrun', '?')} · {', '.join(shown) or 'no tools found'} "
        f"({probe.get('os', '?')}/{probe.get('arch', '?')})"
    )


def _num(v: Any, fmt: str) -> str:
    return format(float(v), fmt) if isinstance(v, (int, float)) else "?"


def describe_headroom(probe: dict[str, Any], heard: Optional[float], now: float) -> str:
    from ...textutil import ago

    return (
        f"{_num(probe.get('free_mem_mb'), '.0f')} MB free · load {_num(probe.get('load_per_core'), '.2f')}/core · "
        f"{_num(probe.get('free_disk_mb'), '.0f')} MB disk · {int(probe.get('running') or 0)} running"
        f" ({ago(heard, now)} ago)"
    )


# ---------------------------------------------------------------------------------


def cmd_add(config: Config, ns: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from .host import SSHHost
    from .transport import PeerError, PeerUnreachable, connect

    home = config.home
    name = check_name(ns.name)
    split_address(ns.address)
    peers = load_peers(home)
    old = peers.get(name)
    command = shlex.split(ns.command) if ns.command else (old.command if old else list(DEFAULT_COMMAND))
    if not command:
        raise UsageError("--command must name a program", key="relay add")
    key = os.path.abspath(os.path.expanduser(ns.key)) if ns.key else None
    if key and not os.path.isfile(key):
        raise UsageError(f"{key}: no such key file", key="--key")
    peer = Peer(name=name, address=ns.address, key=key, command=command, added=time.time())
    notes: list[str] = []
    start = time.monotonic()
    try:
        t = connect(peer, home, accept_new=ns.accept_new, notes=notes)
    except HostKeyRefused as e:
        print(f"ERROR: relay add {safe_text(name)}: {safe_text(e, keep=LINES)}", file=err)
        return NOT_PAIRED
    except PeerUnreachable as e:
        print(f"ERROR: relay add {safe_text(name)}: {safe_text(e, keep=LINES)}", file=err)
        return NOT_PAIRED
    connect_ms = (time.monotonic() - start) * 1000
    for note in notes:
        print(safe_text(note), file=out)
    print(f"connected to {safe_text(ns.address)} in {connect_ms:.0f} ms", file=out)
    host = SSHHost(peer, home)
    host._transport = t
    probe: Optional[dict[str, Any]] = None
    problem: Optional[str] = None
    try:
        probe = host.probe(timeout=PROBE_TIMEOUT_S)
    except (PeerError, PeerUnreachable) as e:
        problem = str(e)
    finally:
        host.close()
    peers[name] = peer
    path = save_peers(home, peers)
    record_probe(home, name, probe, error=problem)
    verb = "updated" if old else "added"
    if probe is not None:
        features = ", ".join(str(f) for f in probe.get("features") or []) or "none"
        print(safe_text(f"{name}: {describe_versions(probe)}; features: {features}"), file=out)
        problem = unusable_reason(probe)
    if problem:
        print(
            safe_text(f"{verb} peer {name} ({ns.address}) in {path}, but it gets no tasks: {name} {problem}"), file=err
        )
        return NOT_PAIRED
    print(safe_text(f"{verb} peer {name} ({ns.address}) in {path}"), file=out)
    return ExitCode.OK


def cmd_remove(config: Config, ns: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    peers = load_peers(config.home)
    if ns.name not in peers:
        known = ", ".join(sorted(peers)) or "none"
        raise UsageError(f"no peer named {ns.name!r} (peers: {known})", key="relay remove")
    del peers[ns.name]
    save_peers(config.home, peers)
    forget_state(config.home, ns.name)
    print(f"removed peer {safe_text(ns.name)}; known_hosts keeps its host key", file=out)
    return ExitCode.OK


def probe_all(config: Config, peers: dict[str, Peer]) -> None:
    """Probe every peer at once (one thread each); record what each said."""
    from .host import SSHHost
    from .transport import PeerError, PeerUnreachable

    def one(peer: Peer) -> None:
        host = SSHHost(peer, config.home)
        try:
            record_probe(config.home, peer.name, host.probe(timeout=PROBE_TIMEOUT_S))
        except (PeerError, PeerUnreachable) as e:
            record_probe(config.home, peer.name, None, error=str(e))
        finally:
            host.close()

    threads = [threading.Thread(target=one, args=(p,), name=f"probe-{p.name}") for p in peers.values()]
    for th in threads:
        th.start()
    for th in threads:
        th.join()


def peer_rows(config: Config, peers: dict[str, Peer], now: float) -> list[dict[str, Any]]:
    from ...policy import Policy, load_policy

    try:
        policy = load_policy(config.home / "policy.toml")
    except UsageError:
        policy = Policy()
    state = load_state(config.home)
    rows = []
    for name in sorted(peers):
        entry, malformed = checked_entry(state.get(name))  # the cache is read as strictly as a reply
        probe = entry.get("probe")
        status = status_of(entry, policy.stale_after_secs, now)
        why = malformed or (unusable_reason(probe) if probe else None)
        if why is None and entry.get("error") and (entry.get("error_at") or 0) >= (entry.get("last_heard") or 0):
            why = f"did not answer the last probe: {entry['error']}" if probe else entry["error"]
        rows.append(
            {
                "name": name,
                "status": status,
                "last_heard": entry.get("last_heard"),
                "address": peers[name].address,
                "command": peers[name].command,
                "probe": probe,
                "error": entry.get("error"),
                "error_at": entry.get("error_at"),
                "gets_tasks": status == "live" and why is None,
                "why_not": why,
                "pending_stops": sorted((entry.get("pending_stops") or {}).keys()),
                "violations": entry.get("violations") or {"counts": {}, "last": None, "last_at": None},
            }
        )
    return rows


def cmd_peers(config: Config, ns: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from ...textutil import ago

    peers = load_peers(config.home)
    if peers and not ns.cached:
        probe_all(config, peers)
    now = time.time()
    rows = peer_rows(config, peers, now)
    if ns.json:
        print(json.dumps(rows, indent=2), file=out)
        return ExitCode.OK
    if not rows:
        print(f"no peers ({peers_path(config.home)}); add one with fleetrun relay add NAME user@host", file=out)
        return ExitCode.OK
    width = max(26, *(len(safe_text(r["name"])) for r in rows))
    print(f"{'PEER':<{width}} {'STATUS':<7} {'LAST HEARD':<17} ADDRESS", file=out)
    print(RULE, file=out)
    for r in rows:
        heard = f"{ago(r['last_heard'], now)} ago" if r["last_heard"] else "never"
        # a peer's replies are untrusted: what they hold is shown, not sent to the terminal
        print(
            f"{safe_text(r['name']):<{width}} {safe_text(r['status']):<7} {heard:<17} {safe_text(r['address'])}",
            file=out,
        )
        if r["probe"]:
            print(f"  └ {safe_text(describe_versions(r['probe']))}", file=out)
            print(f"  └ {safe_text(describe_headroom(r['probe'], r['last_heard'], now))}", file=out)
        if r["why_not"]:
            print(f"  └ gets no tasks: {safe_text(r['why_not'])}", file=out)
        if r["pending_stops"]:
            print(f"  └ to stop when it answers: {safe_text(', '.join(map(str, r['pending_stops'])))}", file=out)
        v = r["violations"]
        if v["counts"]:
            last = f", the last {ago(v['last_at'], now)} ago: {v['last']}" if v["last"] and v["last_at"] else ""
            print(f"  └ protocol violations: {safe_text(describe_violations(v['counts']) + last)}", file=out)
    return ExitCode.OK

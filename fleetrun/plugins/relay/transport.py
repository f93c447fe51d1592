"""The SSH transport to a peer: a tuned TCP socket, host-key trust, authentication,
and running one command on a channel with every step under a timeout.

The transport sits on a socket of our own, because paramiko sets neither option that
matters here: ``TCP_NODELAY`` (without it a verb waits out Nagle and delayed ACK) and
``TCP_USER_TIMEOUT`` (without it a silently dead link is noticed only after the
kernel's retransmissions give up, minutes later). An SSH keepalive every few seconds
makes sure there is unacknowledged data to time out on.

paramiko is imported inside the functions that connect, never at import time.
"""

from __future__ import annotations

import os
import select
import shlex
import socket
import time
from pathlib import Path
from typing import Any, Callable, Optional

from .peers import (
    Peer,
    Target,
    UnknownHostKey,
    check_host_key,
    fingerprint,
    known_hosts_files,
    known_keys,
    record_host_key,
    resolve,
)

CONNECT_TIMEOUT_S = 8.0
USER_TIMEOUT_MS = 6000  # unacknowledged data older than this kills the connection
KEEPALIVE_S = 5  # an SSH ignore packet after this much quiet
VERB_TIMEOUT_S = 30.0
DEFAULT_KEYS = ("id_ed25519", "id_ecdsa", "id_rsa")


class PeerUnreachable(Exception):
    """The peer could not be reached: connection, authentication, host key, or a
    link that dropped mid-verb.

    :ivar delivered: the request may have reached the peer (the link dropped after
        it was sent), so the peer may have acted on it.
    """

    def __init__(self, message: str, delivered: bool = False) -> None:
        super().__init__(message)
        self.delivered = delivered


class PeerError(Exception):
    """The peer answered, with an error (its message is the exception's)."""

    def __init__(self, message: str, code: int, reply: Optional[dict[str, Any]] = None) -> None:
        super().__init__(message)
        self.code = code
        self.reply = reply or {}


# ---------------------------------------------------------------------------------
# Connecting


def open_socket(hostname: str, port: int, timeout: float = CONNECT_TIMEOUT_S) -> socket.socket:
    """A connected TCP socket with ``TCP_NODELAY``, ``TCP_USER_TIMEOUT`` and TCP keepalive."""
    last: Optional[OSError] = None
    for family, kind, proto, _, addr in socket.getaddrinfo(hostname, port, type=socket.SOCK_STREAM):
        s = socket.socket(family, kind, proto)
        try:
            s.settimeout(timeout)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            for opt, value in (
                ("TCP_USER_TIMEOUT", USER_TIMEOUT_MS),
                ("TCP_KEEPIDLE", KEEPALIVE_S),
                ("TCP_KEEPINTVL", 1),
                ("TCP_KEEPCNT", 3),
            ):
                if hasattr(socket, opt):
                    s.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), value)
            s.connect(addr)
            return s
        except OSError as e:
            s.close()
            last = e
    raise last or OSError(f"cannot resolve {hostname}")


def accept_hint(peer: Peer, home: Optional[Path] = None) -> str:
    """The exact command that accepts this peer's new host key."""
    from ...config import default_home

    argv = ["fleetrun"]
    if home is not None and home != default_home():
        argv += ["--home", str(home)]
    argv += ["relay", "add", peer.name, peer.address]
    if peer.key:
        argv += ["--key", peer.key]
    if list(peer.command) != ["fleetrun"]:
        argv += ["--command", shlex.join(peer.command)]
    argv.append("--accept-new")
    return shlex.join(argv)


def connect(
    peer: Peer,
    home: Path,
    accept_new: bool = False,
    timeout: float = CONNECT_TIMEOUT_S,
    notes: Optional[list[str]] = None,
) -> Any:
    """Open, check and authenticate a transport to ``peer``.

    The host key must be on record in ``~/.ssh/known_hosts`` or fleetrun's own
    ``known_hosts``; with ``accept_new`` an unknown key is recorded in fleetrun's
    (and said so in ``notes``). A changed key is always refused.

    :raises PeerUnreachable: anything that stops the connection, with the reason.
    """
    import paramiko

    target = resolve(peer.address, peer.key)
    files = known_hosts_files(home)
    try:
        sock = open_socket(target.hostname, target.port, timeout)
    except OSError as e:
        raise PeerUnreachable(f"cannot connect to {target.hostname}:{target.port}: {e.strerror or e}") from None
    t = paramiko.Transport(sock)
    try:
        t.banner_timeout = timeout
        t.handshake_timeout = timeout
        t.auth_timeout = timeout
        t.set_keepalive(KEEPALIVE_S)
        # offer first the key types already on record, as ssh does, so a machine with
        # several host keys shows the one we know
        known_types = [k.get_name() for k, _ in known_keys(target.key_name, files)]
        if known_types:
            opts = t.get_security_options()
            pref = [k for k in known_types if k in opts.key_types]
            opts.key_types = tuple(dict.fromkeys(pref + list(opts.key_types)))
        try:
            t.start_client(timeout=timeout)
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise PeerUnreachable(f"SSH handshake with {target.hostname}:{target.port} failed: {e}") from None
        key = t.get_remote_server_key()
        try:
            where = check_host_key(target.key_name, key, files, accept_hint(peer, home))
            if notes is not None:
                notes.append(
                    f"host key of {target.key_name}: {key.get_name()} {fingerprint(key)} (on record in {where})"
                )
        except UnknownHostKey:
            if not accept_new:
                raise
            record_host_key(files[-1], target.key_name, key)
            if notes is not None:
                notes.append(
                    f"accepted the new host key of {target.key_name}: {key.get_name()} "
                    f"{fingerprint(key)}, recorded in {files[-1]} (trust on first use)"
                )
        authenticate(t, target, timeout)
    except BaseException:
        t.close()
        raise
    return t


def authenticate(t: Any, target: Target, timeout: float) -> None:
    """Public keys only: ssh-agent's first, then ``--key``, ``IdentityFile`` and the
    default ``~/.ssh/id_*`` files."""
    import paramiko

    tried: list[str] = []
    agent = paramiko.Agent()
    try:
        for k in agent.get_keys():
            try:
                t.auth_publickey(target.user, k)
                return
            except paramiko.AuthenticationException:
                tried.append(f"agent key {k.get_name()}")
            except (paramiko.SSHException, OSError, EOFError) as e:
                raise PeerUnreachable(f"authentication with {target.address} failed: {e}") from None
    finally:
        agent.close()
    sshdir = Path(os.path.expanduser("~")) / ".ssh"
    files = list(dict.fromkeys(target.identity_files + [str(sshdir / n) for n in DEFAULT_KEYS]))
    for path in files:
        if not os.path.isfile(path):
            if path in target.identity_files:
                tried.append(f"{path} (missing)")
            continue
        try:
            pkey = _load_key(path)
        except paramiko.PasswordRequiredException:
            tried.append(f"{path} (encrypted: add it to ssh-agent)")
            continue
        except (paramiko.SSHException, OSError, ValueError) as e:
            tried.append(f"{path} (unreadable: {e})")
            continue
        try:
            t.auth_publickey(target.user, pkey)
            return
        except paramiko.AuthenticationException:
            tried.append(path)
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise PeerUnreachable(f"authentication with {target.address} failed: {e}") from None
    raise PeerUnreachable(
        f"no key was accepted for {target.address} (tried: {', '.join(tried) or 'nothing'}); "
        "pass --key, set IdentityFile in ~/.ssh/config, or add the key to ssh-agent"
    )


def _load_key(path: str) -> Any:
    import paramiko

    if hasattr(paramiko.PKey, "from_path"):  # paramiko >= 3.2
        return paramiko.PKey.from_path(path)
    last: Exception = paramiko.SSHException(f"{path}: not a private key paramiko reads")
    for cls in (paramiko.Ed25519Key, paramiko.ECDSAKey, paramiko.RSAKey):
        try:
            return cls.from_private_key_file(path)
        except paramiko.PasswordRequiredException:
            raise
        except paramiko.SSHException as e:
            last = e
    raise last


def run_command(
    t: Any, command: str, stdin: Optional[bytes] = None, timeout: float = VERB_TIMEOUT_S
) -> tuple[int, bytes, bytes]:
    """Run ``command`` on an open transport; every step under ``timeout``.

    ``recv_exit_status`` has no timeout, so this polls the channel instead.

    :raises PeerUnreachable: the link failed (``delivered`` once the command was sent).
    """
    out: list[bytes] = []
    code, err = stream_command(t, command, stdin, out.append, timeout)
    return code, b"".join(out), err


def stream_command(
    t: Any,
    command: str,
    stdin: Optional[bytes],
    sink: Callable[[bytes], None],
    timeout: float = VERB_TIMEOUT_S,
    idle_timeout: Optional[float] = None,
    max_err: int = 1 << 20,
) -> tuple[int, bytes]:
    """Run ``command`` on an open transport, handing its stdout to ``sink`` as it comes
    (a bundle may be large); return (exit status, stderr, at most ``max_err`` bytes).

    :param timeout: for the whole command.
    :param idle_timeout: at most this long without a byte from the peer.
    :raises PeerUnreachable: the link failed, or a timeout passed (``delivered`` once
        the command was sent).
    """
    import paramiko

    start = time.monotonic()
    deadline = start + timeout
    try:
        ch = t.open_session(timeout=timeout)
    except (paramiko.SSHException, OSError, EOFError) as e:
        raise PeerUnreachable(f"cannot open a channel: {e}") from None
    delivered = False
    try:
        ch.settimeout(timeout)
        ch.exec_command(command)
        delivered = True
        if stdin:
            ch.sendall(stdin)
        ch.shutdown_write()
        err: list[bytes] = []
        err_size = 0
        heard = time.monotonic()
        while True:
            while ch.recv_ready():
                sink(ch.recv(65536))
                heard = time.monotonic()
            while ch.recv_stderr_ready():
                chunk = ch.recv_stderr(65536)
                heard = time.monotonic()
                if err_size < max_err:
                    err.append(chunk)
                    err_size += len(chunk)
            if (
                ch.exit_status_ready()
                and not ch.recv_ready()
                and not ch.recv_stderr_ready()
                and (ch.eof_received or ch.closed)
            ):
                break
            if ch.closed and not ch.exit_status_ready():
                raise PeerUnreachable("the channel closed without an exit status", delivered=True)
            if not t.is_active():
                raise PeerUnreachable("the connection dropped", delivered=True)
            now = time.monotonic()
            left = deadline - now
            if left <= 0:
                raise PeerUnreachable(f"no reply within {timeout:g}s", delivered=True)
            if idle_timeout is not None and now - heard > idle_timeout:
                raise PeerUnreachable(f"nothing heard for {idle_timeout:g}s", delivered=True)
            select.select([ch], [], [], min(left, 0.02))
        return ch.recv_exit_status(), b"".join(err)
    except (paramiko.SSHException, OSError, EOFError) as e:
        raise PeerUnreachable(f"the connection failed: {e}", delivered=delivered) from None
    finally:
        ch.close()

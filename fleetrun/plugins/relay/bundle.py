"""Fetch-back, the supervisor's side: a peer's branch brought into this machine's
repository over the SSH transport.

``fleetrun host bundle`` (:mod:`.peer.bundles`) prints a header line and then a git
bundle of what this repository lacks of the branch; :class:`BundleSink` reads that
stream, the functions below turn it into a local branch (:func:`adopt_branch`) and a
detached worktree for the verifiers that run here (:func:`checkout_fetched`).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Optional

from ...gitutil import GitError, common_dir, git, is_dirty
from ...taskspec import safe_slug
from . import protocol
from .peers import Peer
from .protocol import parse_reply, remote_command
from .transport import PeerError, PeerUnreachable, stream_command

UNBUNDLE_TIMEOUT_S = 1800.0
MAX_NAME_TRIES = 9
#: What was fetched for an attempt, in its (local) attempt folder.
FETCH_RECORD = "fetchback.json"
FETCHED_SUFFIX = "-fetched"


class FetchError(Exception):
    """A peer's branch could not be brought to this machine; the message says why.
    ``transient``: it may come next time (the peer could not be reached, a full disk)."""

    def __init__(self, message: str, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


class BundleWriteError(Exception):
    """The bundle could not be written here (disk full...)."""


class BundleSink:
    """Receives ``host bundle``'s stdout: skips whatever a login shell printed before
    the header line, keeps the header, writes the bundle after it to ``path``."""

    MARK = b'{"' + protocol.BUNDLE_MARK.encode() + b'"'
    MAX_PREFIX = 1 << 20

    def __init__(self, path: Path) -> None:
        self.path = path
        self.prefix = bytearray()
        self.header: Optional[dict[str, Any]] = None
        self.size = 0
        self._fd: Optional[int] = None

    def feed(self, data: bytes) -> None:
        if self.header is not None:
            self._write(data)
            return
        self.prefix += data
        i = self.prefix.find(self.MARK)
        j = self.prefix.find(b"\n", i) if i >= 0 else -1
        if j < 0:
            if len(self.prefix) > self.MAX_PREFIX:
                raise PeerError("`host bundle` printed no header", 0)
            return
        try:
            header = protocol.parse_bundle_header(json.loads(bytes(self.prefix[i:j])))
        except (ValueError, RecursionError) as e:  # Malformed is a ValueError
            raise PeerError(f"`host bundle` printed a broken header: {e}", 0) from None
        self.header = header
        rest = bytes(self.prefix[j + 1 :])
        del self.prefix[i:]
        if rest:
            self._write(rest)

    def _write(self, data: bytes) -> None:
        try:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            view = memoryview(data)
            while view:
                n = os.write(self._fd, view)
                view = view[n:]
        except OSError as e:  # not the link's fault: not PeerUnreachable
            raise BundleWriteError(f"cannot write the bundle to {self.path}: {e.strerror or e}") from None
        self.size += len(data)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def fetch_url(peer: Peer, repo: str) -> str:
    """``ssh://user@host:port/path``: what ``git fetch`` needs to reach the peer's repo."""
    return f"ssh://{peer.address}{repo if repo.startswith('/') else '/' + repo}"


def fetched_worktree(home: Path, task: Any) -> Path:
    """Where the branch fetched back from a peer is checked out for the verifiers here."""
    return home / "worktrees" / f"{safe_slug(task.name)}-{task.id}{FETCHED_SUFFIX}"


def local_haves(repo: str, git_ref: Optional[str], branch: str, peer: str) -> list[str]:
    """Commits this repository has that the peer's branch may build on: ``git_ref``,
    ``HEAD``, and what an earlier fetch of the branch left (the peer sends only what
    is not below those it has too)."""
    out = git(
        repo,
        "for-each-ref",
        "--format=%(objectname)",
        f"refs/heads/{branch}",
        f"refs/heads/{branch}-from-{peer}",
        f"refs/heads/{branch}-from-{peer}-*",
        check=False,
    )
    found = out.split()
    for ref in (git_ref, "HEAD"):
        if ref:
            sha = git(
                repo, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}", check=False
            ).strip()
            if sha:
                found.append(sha)
    return [h for h in dict.fromkeys(found) if len(h) in (40, 64)][:32]


def _is_ancestor(repo: str, old: str, new: str) -> bool:
    try:
        git(repo, "merge-base", "--is-ancestor", old, new)
        return True
    except GitError as e:
        if e.code == 1:
            return False
        raise


def _checked_out(repo: str) -> dict[str, str]:
    """Branch ref -> the worktree that has it checked out."""
    out: dict[str, str] = {}
    path = ""
    for line in git(repo, "worktree", "list", "--porcelain").splitlines():
        if line.startswith("worktree "):
            path = line[len("worktree ") :]
        elif line.startswith("branch "):
            out[line[len("branch ") :]] = path
    return out


def adopt_branch(repo: str, name: str, tip: str, peer: str) -> tuple[str, str, bool]:
    """Point a local branch at the fetched ``tip`` (call under ``repo_lock``): ``name``
    itself when it is new, already there, or behind ``tip`` and not checked out;
    otherwise it is left alone and ``<name>-from-<peer>`` (then ``-2``, ``-3``...) is
    used. :return: (the local branch, why it is not ``name`` or "", whether it moved)."""
    checked = _checked_out(repo)
    why = ""
    for n in range(MAX_NAME_TRIES):
        cand = name if n == 0 else f"{name}-from-{peer}" + (f"-{n}" if n > 1 else "")
        ref = f"refs/heads/{cand}"
        cur = git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", check=False).strip()
        if not cur:
            git(repo, "update-ref", "-m", f"fleetrun: fetched from {peer}", ref, tip, "")
            return cand, why, True
        if cur == tip:
            return cand, why, False
        behind = _is_ancestor(repo, cur, tip)
        if behind and ref not in checked:
            git(repo, "update-ref", "-m", f"fleetrun: fetched from {peer}", ref, tip, cur)
            return cand, why, True
        if not why:
            why = (
                f"this machine's {cand} is checked out in {checked[ref]}"
                if behind
                else f"this machine's {cand} has diverged from {peer}'s"
            )
    raise FetchError(f"{why}, and so have {name}-from-{peer} and -from-{peer}-2 to -{MAX_NAME_TRIES - 1}")


def checkout_fetched(path: Path, repo: str, tip: str) -> None:
    """A worktree at ``path``, detached at ``tip``, clean (call under ``repo_lock``).
    Detached, so the branch stays free to check out anywhere else."""
    if (path / ".git").exists():
        try:
            if common_dir(path) == common_dir(repo):
                head = git(path, "rev-parse", "HEAD").strip()
                if head != tip or is_dirty(path):
                    git(path, "checkout", "-q", "--detach", "--force", tip)
                    git(path, "clean", "-ffdq")
                return
        except GitError:
            pass
        git(repo, "worktree", "remove", "--force", "--", str(path), check=False)
    if path.exists():
        shutil.rmtree(path)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    git(repo, "worktree", "add", "--force", "--detach", "--", str(path), tip)


def fetch_note(rec: dict[str, Any]) -> str:
    """The ledger note of a fetch-back."""
    tip = rec["commit"][:12]
    if not rec["moved"] and not rec["bytes"]:
        text = (
            f"branch {rec['peer_branch']} of {rec['peer']} (commit {tip}) was already in {rec['repo']} "
            f"as {rec['branch']}; nothing to fetch"
        )
    else:
        size = f"{rec['bytes'] / 1024:.1f} KiB" if rec["bytes"] else "its commits were already here"
        text = (
            f"fetched branch {rec['peer_branch']} from {rec['peer']} into {rec['repo']}"
            + (f" as {rec['branch']}" if rec["branch"] != rec["peer_branch"] else "")
            + f": commit {tip} ({size}, {rec['seconds']:.2f}s)"
        )
    if rec["renamed"]:
        text += f"; not as {rec['peer_branch']}: {rec['renamed']}, which is left as it is"
    return text


BUNDLE_IDLE_S = 120.0  # git may think a while before the first byte of a big pack


def fetch_bundle(
    host: Any, repo: str, branch: str, git_ref: Optional[str], have: list[str], dest: Path, timeout: float
) -> dict[str, Any]:
    """Have the peer send ``branch`` of its ``repo`` as a git bundle, over the open
    transport of ``host`` (an :class:`~.host.SSHHost`; ``fleetrun host bundle``): only what is not below ``have`` (commits
    this machine has). The bundle goes to ``dest`` (0600), if one was needed.

    :return: the peer's header: ``tip``, ``fork`` (where the branch left
        ``git_ref``), ``have`` (those of ours it has too), ``bundle`` (whether one
        came), plus ``bytes`` (its size).
    :raises PeerUnreachable: the link failed.
    :raises PeerError: the peer could not (no such branch, an old fleetrun...).
    """
    t = host.transport(True)
    payload = json.dumps({"repo": repo, "branch": branch, "git_ref": git_ref, "have": have}).encode()
    sink = BundleSink(dest)
    try:
        code, err = stream_command(
            t, remote_command(host.peer.command, "bundle", []), payload, sink.feed, timeout, idle_timeout=BUNDLE_IDLE_S
        )
    except PeerUnreachable as e:
        host.drop()
        host.last_error = str(e)
        raise
    finally:
        sink.close()
    if sink.header is None:
        reply = parse_reply(bytes(sink.prefix)) or {}
        detail = str(reply.get("error") or "").strip()
        if not detail:
            lines = (err or bytes(sink.prefix)).decode("utf-8", "replace").strip().splitlines()
            detail = lines[-1] if lines else f"no reply (exit {code})"
        if code in (2, 4) or detail.startswith("usage:"):
            raise PeerError(
                "its fleetrun is too old to send branches back (it has no `fleetrun host "
                "bundle`): upgrade fleetrun there",
                code,
                reply,
            )
        raise PeerError(detail, code, reply)
    if code != 0:
        tail = err.decode("utf-8", "replace").strip().splitlines()
        raise PeerError(tail[-1] if tail else f"`host bundle` failed (exit {code})", code)
    if sink.header.get("bundle") and not sink.size:
        raise PeerError("the peer sent an empty bundle", code)
    return dict(sink.header, bytes=sink.size)

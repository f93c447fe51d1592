"""The relay's supervisor side: the ``relay-peers`` object registered by
``fleetrun_configure`` (see the package docstring for the hooks it implements), the
heartbeat thread of each peer, and the checks a peer's ``prepare`` reply is held to.
"""

from __future__ import annotations

import os
import threading
import time
import types
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generator, Optional, Union

from ...config import output_cap
from ...effects import effects_of
from ...exceptions import says_space_error
from ...gitutil import GitError, common_dir, git, repo_lock, repo_toplevel
from ...hookimpl import hookimpl
from ...ledger import LEDGER_KEY, ensure_private_dir
from ...reports import Candidate, CollectHandle, Handoff, Placement, Verdict, Wait, Workspace
from ...shepherd import read_json, write_json
from ...states import ACTIVE, State
from ...taskspec import step_index
from ...taskview import tasks_in
from ...textutil import safe_text
from ...untrusted import Malformed
from .bundle import (
    FETCH_RECORD,
    UNBUNDLE_TIMEOUT_S,
    BundleWriteError,
    FetchError,
    adopt_branch,
    checkout_fetched,
    fetch_note,
    fetch_url,
    fetched_worktree,
    local_haves,
)
from .collecting import PeerCollect
from .heartbeat import Heartbeat
from .host import PREPARE_TIMEOUT_S, RemoteRunHandle, SSHHost
from .logmirror import mirror_cap
from .peers import (
    Peer,
    checked_entry,
    load_state,
    status_of,
    unusable_reason,
)
from .placed import describe
from .protocol import parse_cleanup_reply, task_payload
from .starts import PeerPrepare
from .transport import PeerError, PeerUnreachable
from .worker import TIMING_ENV, Pending, time_line
from .workspace import WrongWorkspace, check_workspace, chosen_branch  # noqa: F401 - their home was here

if TYPE_CHECKING:
    from ...config import Config

HEARTBEAT_S = 5.0
CLEANUP_TIMEOUT_S = 120.0
SUMMARY_LIMIT = 2000
#: A DONE peer task's fetch-back that a full disk refused (:class:`FetchRetry`): the
#: delays between tries, the last one repeated, and how many tries in all (~27 min).
FETCH_DELAYS_S = (2.0, 5.0, 10.0, 30.0, 60.0)
FETCH_RETRIES = 30
#: Setup command N runs on the peer as runner ``SETUP_RUNNER_BASE + N - 1`` of its
#: attempt, so its folder and its output never share a name with verifier N's there.
SETUP_RUNNER_BASE = 9000


def runs_here(config: Any, kind: str) -> bool:
    """Whether verifiers of ``kind`` run on this machine, on the branch fetched back from
    the peer: what the plugin that declares the kind says (``KeyDecl.runs == "here"``)."""
    from ...taskkeys import key_table

    return key_table(config).runs_here(kind)


#: A peer's why-not while its first heartbeat round (connect, worker, probe) runs.
CONNECTING = "is being connected to (its first heartbeat)"
#: How long placement waits for the peers' first rounds as the loop starts: a peer on
#: a LAN answers in well under a second; one that does not answer (its first round
#: waits out the connect timeout, 8 s) does not hold every task back for that long.
FIRST_ROUND_WAIT_S = 3.0


def _only_builtin(hook: Any) -> bool:
    """Whether only fleetrun's own plugins implement ``hook``."""
    for impl in hook.get_hookimpls():
        plugin = impl.plugin
        where = plugin.__name__ if isinstance(plugin, types.ModuleType) else type(plugin).__module__
        if not str(where).startswith("fleetrun.plugins."):
            return False
    return True


class Relay:
    """The peers of this run and their heartbeats."""

    #: its ``fleetrun_place`` wrapper decides from the candidates it is given (and its
    #: own first heartbeats, which end in a wait with a time): the loop may keep a
    #: waiting task's decision (:meth:`fleetrun.starting.Starting.pure_placement`)
    PURE_PLACEMENT = True

    def __init__(self, config: Config, peers: dict[str, Peer]) -> None:
        self.config = config
        self.peers = peers
        self.hosts = {name: SSHHost(p, config.home, relay=self) for name, p in peers.items()}
        for host in self.hosts.values():
            host.mirror_cap = mirror_cap(output_cap(config))
        self.beats: dict[str, Heartbeat] = {}
        self._cleanups: list[tuple[Any, SSHHost, Any]] = []  # (task, host, Pending cleanup request)
        self._to_clean: list[tuple[Any, SSHHost]] = []  # DONE this pass: sent as it ends
        self._in_session = False  # a loop runs: its passes end with fleetrun_loop_pass
        self._loop_thread = 0  # the work loop's thread (fleetrun_sessionstart)
        self.collects: set[PeerCollect] = set()  # collect requests whose reply the loop has not read
        self.interval = float(config.setting("relay", "heartbeat_secs", HEARTBEAT_S))
        # where the work is in the morning: a DONE peer task's branch is brought home
        # (config.toml's [relay] fetch_back = false leaves it on the peer)
        self.fetch_done = config.setting("relay", "fetch_back", True) is not False
        self.timing = os.environ.get(TIMING_ENV)  # bench/fleet.py --timing

    def holds(self) -> bool:
        """Whether a request not waited for is held until the pass ends
        (:meth:`.worker.Worker.submit`'s ``hold``): made by the work loop's pass, on its
        thread. The pass's ends record their moves without the sends of the verifiers they
        start (paramiko's, Python's) taking the GIL from it one end after another; the
        sends go together as it ends (``fleetrun_loop_pass``)."""
        return self._in_session and threading.get_ident() == self._loop_thread

    def release_held(self) -> None:
        """Every worker's held requests to its sender (a pass ends, or the run)."""
        for host in self.hosts.values():
            w = host.live_worker()
            if w is not None:
                w.release()

    @property
    def in_session(self) -> bool:
        """Whether a work loop runs (its passes end with ``fleetrun_loop_pass``)."""
        return self._in_session

    def close(self) -> None:
        for b in self.beats.values():
            b.halt()
        for h in self.hosts.values():
            h.close()
        for b in self.beats.values():
            b.join(timeout=10)
        for h in self.hosts.values():
            h.close()  # a probe may have connected again meanwhile
        self.beats.clear()

    @hookimpl
    def fleetrun_sessionstart(self, session: Any) -> None:
        """A work loop is about to run: hear from every peer now, so that each worker
        starts (a Python process loading fleetrun there: ~0.5 s) while this side queues
        its tasks, not on the first task's path."""
        from ... import heartbeats

        heartbeats.install(self.config)  # the first rounds' heartbeats reach the hook too
        self._in_session = True
        self._loop_thread = threading.get_ident()  # what holds its requests to a pass's end
        self.start_heartbeats()

    def start_heartbeats(self) -> None:
        for name, host in self.hosts.items():
            if name not in self.beats:
                b = self.beats[name] = Heartbeat(host, self.config.home, self.interval)
                host.passive = True  # from now on the heartbeat reconnects, not the loop
                b.start()

    def entry(self, name: str) -> dict[str, Any]:
        b = self.beats.get(name)
        if b is not None:
            return b.entry
        return load_state(self.config.home).get(name) or {}

    def first_probe_pending(self) -> bool:
        return any(not b.first_done.is_set() for b in self.beats.values())

    def _note(self, task_id: str, text: str) -> None:
        led = self.config.stash.get(LEDGER_KEY)
        if led is not None:
            led.add_note(task_id, text)

    # -- placement -----------------------------------------------------------------

    @hookimpl(trylast=True)
    def fleetrun_hosts(self, config: Config) -> list[Any]:
        """One :class:`~.host.SSHHost` per peer of ``peers.toml``."""
        return list(self.hosts.values())

    def owns(self, host: Any) -> Optional[SSHHost]:
        """``host`` if it is one of this relay's peers, else None (the stage hooks
        answer only for those)."""
        mine = self.hosts.get(getattr(host, "name", None) or "")
        return mine if mine is not None and mine is host else None

    def candidate(self, name: str, config: Config) -> Candidate:
        """The peer ``name`` as a placement candidate, with the headroom of its last
        heartbeat (``SSHHost.candidate`` asks here); the first call starts the
        heartbeats."""
        from ...policy import POLICY_KEY, Policy

        self.start_heartbeats()
        policy = config.stash.get(POLICY_KEY) or Policy()
        # the loop's tasks in memory (no query for each peer on every pass)
        active = sum(1 for t in tasks_in(config, ACTIVE) if (t.host or "local") == name)
        now = time.time()
        entry, malformed = checked_entry(self.entry(name))  # a cache is read as strictly as a reply
        probe = entry.get("probe") or {}
        pp = policy.for_peer(name)
        status = status_of(entry, policy.stale_after_secs, now)
        why = malformed or (unusable_reason(probe) if probe else None)
        needs_operator = why is not None and not malformed  # fleetrun there too old: a person upgrades it
        beat = self.beats.get(name)
        if why is None and beat is not None and not beat.first_done.is_set():
            # the first round starts its worker: a task sent now would wait for that on
            # the loop's thread, and every other task with it (fleetrun_place waits a second)
            why = CONNECTING
        if why is None and entry.get("error") and (entry.get("error_at") or 0) >= (entry.get("last_heard") or 0):
            why = str(entry["error"])
            needs_operator = why.startswith("has no fleetrun")  # unreachable may clear; this does not
        reported = int(probe.get("running") or 0) if status == "live" else 0
        own_max = probe.get("max_tasks")
        if why is None and isinstance(own_max, int) and reported >= own_max:
            why = f"is running {reported} of {own_max} tasks (its own [local] max_tasks)"
        return Candidate(
            name=name,
            kind="peer",
            free_mem_mb=probe.get("free_mem_mb"),
            load_per_core=probe.get("load_per_core"),
            free_disk_mb=probe.get("free_disk_mb"),
            running=max(active, reported),
            max_tasks=int(pp.max_tasks),
            drain=bool(pp.drain or probe.get("drain")),
            status=status,
            tags=frozenset(probe.get("tags") or ()),
            tools=dict(probe.get("tools") or {}),
            auth=frozenset(probe.get("auth") or ()),
            mem_per_task_mb=float(
                pp.mem_per_task_mb if pp.mem_per_task_mb is not None else probe.get("mem_per_task_mb") or 1024.0
            ),
            min_free_mem_mb=pp.min_free_mem_mb,
            max_load_per_core=pp.max_load_per_core,
            min_free_disk_mb=pp.min_free_disk_mb,
            why_not=why,
            why_not_needs_operator=needs_operator,
            info={"address": self.peers[name].address, "last_heard": entry.get("last_heard")},
        )

    @hookimpl(wrapper=True)
    def fleetrun_place(self, task: Any, candidates: list[Candidate], policy: Any, config: Config) -> Any:
        result = yield
        if not self.first_probe_pending():
            return result
        now = time.monotonic()
        connecting = sorted(
            c.name
            for c in candidates
            if c.kind == "peer"
            and c.why_not == CONNECTING
            and c.name in self.beats
            and now - self.beats[c.name].started_at < FIRST_ROUND_WAIT_S
        )
        if isinstance(result, Placement) and connecting:
            # the peers that have not reported in yet may have the most room: a task placed
            # now would go to whoever answered first (as the loop starts: the first rounds
            # take about a second; one that fails ends the wait)
            return Wait(reason=f"waiting for the first heartbeat of {', '.join(connecting)}", until=time.time() + 1.0)
        if isinstance(result, Wait) and result.until is None:
            result.until = time.time() + 1.0  # a peer is about to report in: this is not idle yet
        return result

    # -- an attempt on a peer --------------------------------------------------------

    @hookimpl(trylast=True)
    def fleetrun_prepare_workspace(
        self, task: Any, attempt: Any, host: Any, config: Config
    ) -> Union[Workspace, PeerPrepare, None]:
        host = self.owns(host)
        if host is None:
            return None
        if host.in_loop() is not None:
            # inside a work loop, through a live worker: sent, not waited for (the loop
            # sends the prepares of every peer in its pass; each reply wakes it)
            return PeerPrepare(
                host, task, attempt.id, lambda: host.prepare(task, attempt, wait=False), PREPARE_TIMEOUT_S
            )
        try:
            ws = host.prepare(task, attempt)
        except PeerUnreachable as e:
            raise PeerUnreachable(f"{host.name} could not be reached: {e}", e.delivered) from None
        return check_workspace(task, ws, host.name)

    @hookimpl(trylast=True)
    def fleetrun_collect_work(
        self, task: Any, attempt: Any, workspace: Any, host: Any, config: Config
    ) -> Union[str, CollectHandle, None]:
        """Commit the attempt's work on its peer. Through a live worker inside a work loop
        the request is sent and a :class:`~fleetrun.reports.CollectHandle` returned (its
        reply wakes the loop): the loop goes on with other tasks meanwhile."""
        host = self.owns(host)
        if host is None:
            return None
        fetch = self.fetches_after_collect(task)  # decided once: the verifier's start goes with it
        pushed = host.pushed_collect(attempt.id)
        if pushed is not None:
            # the worker collected as the attempt ended (its start asked it to), and pushed
            # the answer with the end: no request; the verifier's start is the verify stage's
            if fetch:
                return PeerCollect(self, task, attempt, workspace, host, pushed, None, fetch)
            try:  # raises WorktreeTampered as the collect request's reply does
                commit = host.collected(pushed, None, 0)
            except (PeerUnreachable, PeerError) as e:
                return self._not_collected(task, host, e)
            return self.collected(task, attempt, workspace, host, commit)
        verify = self.first_run_verifier(task, config)
        if fetch:
            # its VERIFYING waits for the branch (a later pass): a verifier started with the
            # collect would be untaken at this pass's end, and stopped (stop_untaken)
            verify = None
        try:
            sent = host.collect(task, attempt, workspace, verify, wait=not self._in_session)
        except (PeerUnreachable, PeerError) as e:
            return self._not_collected(task, host, e)
        if isinstance(sent, Pending):
            return PeerCollect(self, task, attempt, workspace, host, sent, verify, fetch)
        return self.collected(task, attempt, workspace, host, sent)

    def collects_at_end(self) -> bool:
        """Whether a peer's start asks its worker to collect the attempt's work as soon as
        its agent exits 0 (:data:`~.protocol.WORKER_AT_END`): inside a work loop, when no
        plugin of a third party implements ``fleetrun_collect_work`` (one could answer
        for a peer's attempt before this relay does)."""
        return self._in_session and self.collects_its_work(self.config)

    @staticmethod
    def collects_its_work(config: Config) -> bool:
        """Whether no plugin of a third party implements ``fleetrun_collect_work``."""
        return _only_builtin(config.hook.fleetrun_collect_work)

    def fetches_after_collect(self, task: Any) -> bool:
        """Whether a collected task's branch is fetched back off the loop's thread before
        it goes on (:class:`~.collecting.PeerCollect`): inside a work loop, for a task
        whose branch something here needs (:meth:`wants_fetch`)."""
        return (
            self._in_session
            and effects_of(self.config) is not None
            and bool(task.spec.git_ref)
            and self.wants_fetch(task)
        )

    def _not_collected(self, task: Any, host: SSHHost, e: Exception) -> str:
        self._note(task.id, f"could not commit the attempt's work on {host.name}: {e}")
        return ""  # not None: handled (the work stays on the peer, committed or not)

    def collected(self, task: Any, attempt: Any, workspace: Any, host: SSHHost, commit: Optional[str]) -> str:
        """The attempt's work is committed on the peer: its branch fetched back here when
        something here needs it. :return: the commit, or ""."""
        commit = commit or ""
        if task.spec.git_ref and self.wants_fetch(task):
            try:
                self.fetch_back(task, attempt, workspace)
            except FetchError as e:
                self._note(
                    task.id,
                    f"could not fetch branch {getattr(workspace, 'branch', None) or task.branch} from {host.name}: {e}",
                )
        return commit

    @staticmethod
    def first_run_verifier(task: Any, config: Config) -> Optional[tuple[Any, int]]:
        """(verifier, step) of the task's first verifier when it is a ``run`` one that
        this relay will run on the peer (no plugin of a third party implements
        ``fleetrun_verify``, which could answer for it instead): the collect request
        then starts it too, and the verify stage finds it started
        (:meth:`.host.SSHHost.take_prestarted`). None: the two go apart."""
        verify = task.spec.verify
        if not verify or verify[0].kind != "run" or not Relay.runs_its_verifiers(config):
            return None
        return verify[0], step_index(task, verify[0])

    @staticmethod
    def runs_its_verifiers(config: Config) -> bool:
        """Whether no plugin of a third party implements ``fleetrun_verify`` (one could
        answer for a peer's ``run`` verifier before this relay does)."""
        return _only_builtin(config.hook.fleetrun_verify)

    def verifies_without_waiting(self, host: SSHHost, kind: str) -> bool:
        """:meth:`.host.SSHHost.verifies_without_waiting`: a ``run`` verifier this relay
        starts on the peer through its live worker, inside a work loop, is sent and not
        waited for (:class:`~.host.RemoteRunHandle`); any other may wait on the peer (a
        ``brain`` verifier's fetch-back) or is a third party's."""
        return (
            kind == "run"
            and self._in_session
            and host.live_worker() is not None
            and not runs_here(self.config, kind)
            and self.runs_its_verifiers(self.config)
        )

    def hands_off_without_waiting(self) -> bool:
        """:meth:`.host.SSHHost.hands_off_without_waiting`: inside a work loop the
        handoff's fetch-back runs on a worker of :mod:`fleetrun.effects`
        (:class:`FetchBack`); else it is waited for."""
        return self._in_session and effects_of(self.config) is not None

    # -- fetch-back ------------------------------------------------------------------

    def wants_fetch(self, task: Any) -> bool:
        """A task whose branch comes back here: one with a verifier whose kind runs here
        (``brain``, ``agent``: ``KeyDecl.runs``) or with dependents (they may run here)."""
        if any(runs_here(self.config, v.kind) for v in task.spec.verify):
            return True
        led = self.config.stash.get(LEDGER_KEY)
        return led is not None and bool(led.dependents(task.id))

    def fetched(self, attempt_id: str) -> Optional[dict[str, Any]]:
        """What was fetched back for an attempt, if anything."""
        return read_json(str(self.config.home / "attempts" / attempt_id / FETCH_RECORD))

    def fetch_back(self, task: Any, attempt: Any, workspace: Any, note: bool = True) -> dict[str, Any]:
        """Bring the attempt's branch from its peer into the local repository that holds
        the task's ``cwd``, and check it out (detached) in the fetched worktree.

        Over the peer's open transport: the peer sends a git bundle of the branch less
        what this repository has (``host bundle``), which is unbundled here. The local
        branch is the peer's name unless that one has diverged (:func:`adopt_branch`).
        The result is recorded in the attempt folder (:data:`FETCH_RECORD`) and in a
        ledger note (``note``; False: off the loop's thread, where the ledger is not
        written: :class:`FetchBack` writes it).

        :raises FetchError: with the reason.
        """
        host = self.hosts.get(attempt.host)
        if host is None:
            raise FetchError(f"{attempt.host} is not a peer of this run")
        if not task.spec.git_ref:
            raise FetchError(f"the task has no git_ref, so its work on {host.name} is not on a branch")
        peer_branch = chosen_branch(task)  # never a name from the peer (or from what it once said)
        named = getattr(workspace, "branch", None)
        if named and named != peer_branch:
            raise FetchError(
                f"the attempt's workspace names branch {named!r}, not {peer_branch!r}, the branch "
                "chosen for this task: nothing is fetched"
            )
        repo = repo_toplevel(task.spec.cwd)
        if repo is None:
            raise FetchError(f"{task.spec.cwd} is not in a git repository on this machine")
        adir = ensure_private_dir(self.config.home / "attempts" / attempt.id)
        bundle = adir / "fetch.bundle"
        started = time.monotonic()
        try:
            have = local_haves(repo, task.spec.git_ref, peer_branch, host.name)
            head = host.fetch_bundle(
                getattr(workspace, "repo", None) or repo, peer_branch, task.spec.git_ref, have, bundle
            )
            if head.get("bundle"):
                git(repo, "bundle", "unbundle", str(bundle), timeout=UNBUNDLE_TIMEOUT_S)
        except PeerUnreachable as e:
            raise FetchError(f"{host.name} could not be reached: {e}", transient=True) from None
        except (PeerError, BundleWriteError, GitError) as e:
            raise FetchError(str(e)) from None
        finally:
            try:
                bundle.unlink()
            except FileNotFoundError:
                pass
        tip = str(head["tip"])
        if not git(repo, "cat-file", "-t", f"{tip}^{{commit}}", check=False).strip() == "commit":
            raise FetchError(f"commit {tip[:12]} of {peer_branch} did not arrive from {host.name}")
        path = fetched_worktree(self.config.home, task)
        sub = os.path.relpath(os.path.realpath(task.spec.cwd), os.path.realpath(repo))
        try:
            with repo_lock(self.config.home / "locks", repo):
                branch, renamed, moved = adopt_branch(repo, peer_branch, tip, host.name)
                checkout_fetched(path, repo, tip)
        except GitError as e:
            raise FetchError(str(e)) from None
        fork = head.get("fork")
        rec = {
            "peer": host.name,
            "peer_branch": peer_branch,
            "branch": branch,
            "commit": tip,
            "base": fork if isinstance(fork, str) and fork else None,
            "repo": repo,
            "worktree": str(path),
            "path": str(path / sub) if sub != "." else str(path),
            "bytes": int(head.get("bytes") or 0),
            "seconds": round(time.monotonic() - started, 3),
            "renamed": renamed,
            "moved": moved,
            "time": time.time(),
        }
        write_json(str(adir / FETCH_RECORD), rec)
        if note:
            self._note(task.id, fetch_note(rec))
        return rec

    @hookimpl(trylast=True)
    def fleetrun_fetch_workspace(self, task: Any, attempt: Any, workspace: Any, config: Config) -> Optional[Workspace]:
        """An attempt on one of this relay's peers: its branch fetched back here
        (:meth:`local_workspace`); None for any other host."""
        if attempt.host not in self.hosts:
            return None
        return self.local_workspace(task, attempt, workspace)

    def local_workspace(self, task: Any, attempt: Any, workspace: Any) -> Workspace:
        """For an attempt on a peer: a workspace on this machine holding its branch (the
        fetched worktree), fetching it first if that has not happened (a supervisor that
        restarted mid-verification). What ``brain`` and ``agent`` verifiers run in.

        :raises FetchError: the branch cannot be brought here.
        """
        rec = self.fetched(attempt.id)
        if rec is None:
            rec = self.fetch_back(task, attempt, workspace)
        else:  # still there, at that commit (gc may have removed it)
            try:
                with repo_lock(self.config.home / "locks", rec["repo"]):
                    checkout_fetched(Path(rec["worktree"]), rec["repo"], rec["commit"])
            except GitError as e:
                raise FetchError(f"cannot check out the fetched branch {rec['branch']}: {e}") from None
        return Workspace(
            path=rec["path"],
            branch=rec["branch"],
            repo=rec["repo"],
            base_ref=rec.get("base") or task.spec.git_ref,
            is_worktree=True,
            root=rec["worktree"],
        )

    def _remove_fetched(self, task: Any) -> None:
        """Remove a finished task's fetched worktree: inside a work loop on a worker thread
        of :mod:`fleetrun.effects` (a hundred peers' tasks end together: the loop goes
        on), its note written on the loop's thread."""
        path = fetched_worktree(self.config.home, task)
        if not path.exists():
            return
        effects = effects_of(self.config) if self._in_session else None
        if effects is not None:
            effects.submit(
                self._remove_worktree, path, on_done=lambda fut: self._removed_fetched(task.id, path, fut.exception())
            )
            return
        try:
            self._remove_worktree(path)
        except (GitError, OSError) as e:
            self._removed_fetched(task.id, path, e)
            return
        self._removed_fetched(task.id, path, None)

    def _remove_worktree(self, path: Path) -> None:
        """The effect: ``git worktree remove`` under the repository's lock (no ledger)."""
        repo = str(Path(common_dir(path)).parent)
        with repo_lock(self.config.home / "locks", repo):
            git(repo, "worktree", "remove", "--force", "--", str(path))

    def _removed_fetched(self, task_id: str, path: Path, e: Optional[BaseException]) -> None:
        self._note(
            task_id,
            f"could not remove the fetched worktree {path}: {e}"
            if e is not None
            else f"removed the fetched worktree {path}",
        )

    @hookimpl(trylast=True)
    def fleetrun_verify(self, task: Any, verifier: Any, workspace: Any, attempt: Any, host: Any, config: Config) -> Any:
        host = self.owns(host)
        if host is None:
            return None
        if runs_here(config, verifier.kind):
            return None  # run here, on the fetched branch: their plugins ask local_workspace()
        if verifier.kind == "baseline":
            return None  # a run verifier's baseline runs here for now (verify_run; docs/verifiers.md)
        if verifier.kind != "run":
            return Verdict(
                False,
                verifier.kind,
                verifier.label,
                host=host.name,
                reason=f"{verifier.kind} verifiers run only on the supervising machine, and this "
                f"attempt ran on {host.name}",
            )
        return RemoteRunHandle(host, task, attempt, verifier, step_index(task, verifier), workspace)

    @hookimpl(trylast=True)
    def fleetrun_setup_step(
        self, task: Any, step: Any, number: int, workspace: Any, attempt: Any, host: Any, config: Config
    ) -> Any:
        host = self.owns(host)
        if host is None:
            return None
        # the peer's runner of setup command N: a number of its own, apart from the verifiers'
        return RemoteRunHandle(host, task, attempt, step, SETUP_RUNNER_BASE + number - 1, workspace)

    @hookimpl(trylast=True)
    def fleetrun_handoff(
        self, task: Any, attempt: Any, host: Any, config: Config
    ) -> Union[Handoff, FetchRetry, FetchBack, None]:
        mine = self.owns(host)
        peer = self.peers.get(mine.name) if mine is not None else None
        if peer is None:
            return None
        summary = (attempt.result_text or "").strip() if attempt is not None else ""
        if len(summary) > SUMMARY_LIMIT:
            summary = summary[:SUMMARY_LIMIT] + " [...]"
        repo = ((attempt.workspace or {}).get("repo") if attempt is not None else None) or None
        rec = self.fetched(attempt.id) if attempt is not None else None
        if rec is None and attempt is not None and task.branch and (self.fetch_done or self.wants_fetch(task)):
            ws = (
                Workspace(**attempt.workspace)
                if attempt.workspace
                else Workspace(path=task.spec.cwd, branch=task.branch)
            )
            effects = effects_of(config) if self._in_session else None
            if effects is not None:  # off the loop's thread: the ends of other tasks are not held up by it
                return FetchBack(
                    self, task, attempt, peer, summary, repo, effects.submit(self.fetch_back, task, attempt, ws, False)
                )
            try:  # the fetch after the attempt failed, or a restart skipped it: once more
                rec = self.fetch_back(task, attempt, ws)
            except FetchError as e:
                if e.transient or says_space_error(str(e)):  # it clears by itself: the task waits for its branch
                    return FetchRetry(self, task, attempt, peer, summary, repo, str(e))
                self._note(task.id, f"could not fetch branch {task.branch} from {peer.name}: {e}")
        return self.handoff_of(task, peer, summary, repo, rec)

    def handoff_of(
        self, task: Any, peer: Peer, summary: str, repo: Optional[str], rec: Optional[dict[str, Any]]
    ) -> Handoff:
        """The handoff of a DONE peer task, saying where its branch is (``rec``: what was
        fetched back, or None when it stays on the peer)."""
        remote = f"`git fetch {fetch_url(peer, repo)} {task.branch}`" if task.branch and repo else ""
        if rec is not None:
            name = rec["branch"]
            hint = (
                f"It ran on {peer.name}, and its branch was fetched from {peer.name} into this machine's "
                f"repository {rec['repo']}"
                + (f" as {name}" if name != rec["peer_branch"] else "")
                + f" (commit {rec['commit'][:12]})."
            )
            if name != rec["peer_branch"]:
                hint += f" On {peer.name} the branch is {rec['peer_branch']}"
                hint += f" ({rec['renamed']}, which is left as it is)." if rec["renamed"] else "."
            if remote:
                hint += f" To fetch it from {peer.name} again: {remote}."
            return Handoff(
                task_name=task.name,
                branch=name,
                summary=summary,
                host=peer.name,
                fetch_hint=hint,
                repo=str(rec["repo"]),
            )
        hint = f"The branch is on {peer.name}; fetch it with {remote}." if remote else ""
        return Handoff(task_name=task.name, branch=task.branch, summary=summary, host=peer.name, fetch_hint=hint)

    @hookimpl(trylast=True)
    def fleetrun_cleanup_workspace(self, task: Any, host: Any, config: Config) -> None:
        host = self.owns(host)
        if host is None:
            return
        if task.state.terminal:
            self._remove_fetched(task)  # the branch stays
        if task.state is not State.DONE or not task.worktree:
            return
        if self._in_session and host.live_worker() is not None:
            # sent as this pass ends (fleetrun_loop_pass), after the prepare of a task placed
            # in it: on the peer, `git worktree remove` holds the repository's lock, which
            # that prepare's `git worktree add` would wait for
            self._to_clean.append((task, host))
            return
        self._send_cleanup(task, host)

    def _send_cleanup(self, task: Any, host: SSHHost) -> None:
        try:
            if host.live_worker() is None:
                return self._cleaned(task, host, host.cleanup(task))
            # through the worker, not waited for: the loop goes on with other tasks; the
            # note is written by a later pass (fleetrun_loop_pass), or as the run ends
            self._cleanups.append((task, host, host.call("cleanup", payload={"task": task_payload(task)}, wait=False)))
        except (PeerUnreachable, PeerError, Malformed) as e:
            self._note(task.id, f"could not clean up worktree {task.worktree} on {host.name}: {e}")

    def _send_cleanups(self, all_of_them: bool = True) -> None:
        """:param all_of_them: False: not yet to a peer making an attempt's start (its
        ``git worktree add`` would wait for the removal's lock of the repository)."""
        sending, self._to_clean = self._to_clean, []
        for task, host in sending:
            if all_of_them or host.launch.attempt is None:
                self._send_cleanup(task, host)
            else:
                self._to_clean.append((task, host))

    def _cleaned(self, task: Any, host: SSHHost, r: dict[str, Any]) -> None:
        if r.get("removed"):
            self._note(task.id, f"removed clean worktree {task.worktree} on {host.name}; branch {task.branch} stays")
            led = self.config.stash.get(LEDGER_KEY)
            if led is not None:  # shown as removed (status `-`, logs `removed (was PATH on PEER)`), as a local one
                led.update_task(task.id, worktree=None)
        else:
            kept = f"kept worktree {task.worktree} on {host.name}"
            led = self.config.stash.get(LEDGER_KEY)
            if led is None or kept not in [n for _, n in led.notes(task.id)]:  # said once, not at each restart
                self._note(task.id, kept)

    def _reap_cleanups(self, wait: bool) -> None:
        """Note the cleanups whose reply came (``wait``: every one, waiting for each)."""
        left = []
        for task, host, p in self._cleanups:
            if not (wait or p.done()):
                left.append((task, host, p))
                continue
            try:
                code, answer = p.wait(max(0.0, CLEANUP_TIMEOUT_S - (time.monotonic() - p.began)))
                self._cleaned(task, host, parse_cleanup_reply(host._checked("cleanup", code, answer)))
            except (PeerUnreachable, PeerError, Malformed) as e:
                self._note(task.id, f"could not clean up worktree {task.worktree} on {host.name}: {e}")
        self._cleanups = left

    @hookimpl(wrapper=True)
    def fleetrun_loop_pass(self, config: Config, duration_s: float) -> Generator[None, Any, Any]:
        self.release_held()  # the pass's requests go before any plugin hears of its end
        got = yield
        if self.timing:  # bench/fleet.py --timing: how long each pass took, how many commits so far
            led = config.stash.get(LEDGER_KEY)
            time_line(self.timing, what="pass", dur=duration_s, commits=getattr(led, "commits", None))
        for host in self.hosts.values():
            host.stop_untaken(wait=False)
            host.flush_violations()  # what was counted since the last write (at most every few seconds)
            host.launch.pass_ended(host.starting)
        if self._to_clean:
            self._send_cleanups(all_of_them=False)
        if self._cleanups:
            self._reap_cleanups(wait=False)
        return got

    @hookimpl
    def fleetrun_terminal_summary(self, config: Config, exitstatus: int, counts: dict[str, int]) -> None:
        """Say once, as the run ends, which peers sent what they had no business to (events
        about attempts not placed there, replies to requests never sent): dropped, counted."""
        tr = config.get_plugin("terminalreporter")
        for name, host in sorted(self.hosts.items()):
            if host.attempts.counts and tr is not None:
                total, what = describe(host.attempts.counts).split(" ", 1)
                tr.write_line(f"peer {safe_text(name)}: {total} protocol violations {what}; see fleetrun relay peers")

    @hookimpl(tryfirst=True)
    def fleetrun_sessionfinish(self, session: Any, exitstatus: int) -> None:
        """The run ends: its peers' cleanups are sent and waited for (the worker ends with
        the run)."""
        self._in_session = False
        self.release_held()
        for c in list(self.collects):
            c.settle()
        for host in self.hosts.values():
            host.stop_untaken(wait=True)
        self._send_cleanups()
        self._reap_cleanups(wait=True)


class FetchBack:
    """The handoff of a DONE peer task whose branch is being fetched back on a worker
    thread of :mod:`fleetrun.effects` (a :class:`~fleetrun.reports.HandoffHandle`): a
    hundred peers' fetch-backs hold no pass up. Its note is written here, on the loop's
    thread; a fetch that fails as :meth:`Relay.fleetrun_handoff` would retry goes on as a
    :class:`FetchRetry`."""

    def __init__(
        self,
        relay: Relay,
        task: Any,
        attempt: Any,
        peer: Peer,
        summary: str,
        repo: Optional[str],
        fut: Future[dict[str, Any]],
    ) -> None:
        self.relay, self.task, self.attempt, self.peer = relay, task, attempt, peer
        self.summary, self.repo, self.fut = summary, repo, fut
        self.answer: Optional[Handoff] = None
        self.retry: Optional[FetchRetry] = None

    def poll(self) -> Optional[Handoff]:
        if self.retry is not None:
            return self.retry.poll()
        if self.answer is not None or not self.fut.done():
            return self.answer
        relay, task = self.relay, self.task
        rec: Optional[dict[str, Any]] = None
        try:
            rec = self.fut.result()
        except FetchError as e:
            if e.transient or says_space_error(str(e)):  # it clears by itself: the task waits for its branch
                self.retry = FetchRetry(relay, task, self.attempt, self.peer, self.summary, self.repo, str(e))
                return None
            relay._note(task.id, f"could not fetch branch {task.branch} from {self.peer.name}: {e}")
        else:
            relay._note(task.id, fetch_note(rec))
        self.answer = relay.handoff_of(task, self.peer, self.summary, self.repo, rec)
        return self.answer


class FetchRetry:
    """The handoff of a peer task whose branch a full disk (or a peer out of reach) kept
    from being fetched
    (found by the soak: the task went DONE with its branch only on the peer, and its
    dependents that merge it asked a human). A :class:`~fleetrun.reports.HandoffHandle`:
    the loop polls it each pass and the task stays VERIFYING while it tries again, with
    a growing delay, :data:`FETCH_RETRIES` times at most; then its handoff is made as it
    is (the branch stays on the peer, and the note says so)."""

    def __init__(
        self, relay: Relay, task: Any, attempt: Any, peer: Peer, summary: str, repo: Optional[str], error: str
    ) -> None:
        self.relay, self.task, self.attempt, self.peer = relay, task, attempt, peer
        self.summary, self.repo = summary, repo
        self.tries = 1
        self.answer: Optional[Handoff] = None
        self.next_at = time.monotonic() + FETCH_DELAYS_S[0]
        relay._note(
            task.id,
            f"could not fetch branch {task.branch} from {peer.name}: {error}; trying again in "
            f"{FETCH_DELAYS_S[0]:g}s, up to {FETCH_RETRIES} times (DONE once the branch is here)",
        )

    def poll(self) -> Optional[Handoff]:
        if self.answer is not None or time.monotonic() < self.next_at:
            return self.answer
        att = self.attempt
        rec = None
        try:
            rec = self.relay.fetch_back(
                self.task,
                att,
                Workspace(**att.workspace)
                if att.workspace
                else Workspace(path=self.task.spec.cwd, branch=self.task.branch),
            )
        except FetchError as e:
            self.tries += 1
            if (e.transient or says_space_error(str(e))) and self.tries < FETCH_RETRIES:
                self.next_at = time.monotonic() + FETCH_DELAYS_S[min(self.tries, len(FETCH_DELAYS_S)) - 1]
                return None
            self.relay._note(
                self.task.id,
                f"could not fetch branch {self.task.branch} from {self.peer.name} "
                f"after {self.tries} tries: {e}; it stays there",
            )
        self.answer = self.relay.handoff_of(self.task, self.peer, self.summary, self.repo, rec)
        return self.answer

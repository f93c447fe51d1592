"""The small data objects that hooks pass and return."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Protocol, runtime_checkable

#: The smallest budget an agent session is given: fleetrun passes ``--max-budget-usd``
#: with 4 decimals and Claude Code rejects ``0.0000`` (``error: --max-budget-usd must be
#: a positive number greater than 0``). With less than this left, a task's budget is
#: exhausted before anything starts (the task agent's and the reviewer's alike).
MIN_BUDGET_USD = 0.0001

#: :attr:`Verdict.error`: the verifier could not judge, and trying it again cannot
#: change that until someone fixes it (command not found, a missing model, a CLI that
#: refuses its arguments): the task goes to NEEDS_HUMAN at once.
PERMANENT = "permanent"
#: :attr:`Verdict.error`: the verifier could not judge this time (connection refused,
#: an HTTP 5xx, a timeout, an answer without a verdict): it runs again, alone, after a
#: backoff, a bounded number of times.
TRANSIENT = "transient"


@dataclass
class Verdict:
    """What one verifier concluded: PASS, FAIL (the work failed) or ERROR (the verifier
    could not judge, :attr:`error` set). A verifier that cannot reach a verdict never
    passes; an ERROR never sends the agent back to work (docs/verifiers.md).

    :ivar passed: True only for an explicit pass.
    :ivar reason: one line saying why (``exit code 1``, ``timed out after 900s``).
    :ivar output: what the verifier printed or answered (the last 64 KiB); it goes
        into the retry prompt.
    :ivar error: None for a verdict on the work (PASS or FAIL); :data:`PERMANENT` or
        :data:`TRANSIENT` when the verifier could not judge (``passed`` is False).
    """

    passed: bool
    kind: str
    label: str
    reason: str = ""
    output: str = ""
    cost_usd: float = 0.0
    duration_s: float = 0.0
    host: str = "local"
    error: Optional[str] = None

    @property
    def word(self) -> str:
        """``PASS``, ``FAIL`` or ``ERROR``: what reports print."""
        return "ERROR" if self.error else ("PASS" if self.passed else "FAIL")


@runtime_checkable
class VerifyHandle(Protocol):
    """A verifier (or a setup command) still running, as ``fleetrun_verify`` returns it
    instead of a :class:`Verdict`; the loop polls it on every pass, on its main thread.

    :meth:`poll` is all a handle must have. Three more methods are optional, each a
    Protocol of its own, and the loop calls one only where the handle has it (it asks
    ``isinstance(handle, Cancellable)``; the Protocols are runtime-checkable, so a
    method of that name, defined on the handle's class, is enough):

    - ``cancel()`` (:class:`Cancellable`): stop, and let go of what it holds. Called
      when the task is cancelled or set aside, and on Ctrl-C; without it, the handle is
      dropped and what it runs goes on to its end.
    - ``fileno()`` (:class:`Selectable`): a file descriptor that turns readable when
      :meth:`poll` has news (a pidfd, a pipe), so the loop wakes at once; a negative
      number means "none now".
    - ``next_deadline()`` (:class:`HasDeadline`): the :func:`time.monotonic` time by
      which :meth:`poll` should be called again (a timeout, a poll interval).

    Without ``fileno()`` and ``next_deadline()`` the loop polls the handle once a
    second. :class:`~fleetrun.procutil.ProcessHandle`, the built-in one for a verifier
    that runs as a child process, has all three.
    """

    def poll(self) -> Optional[Verdict]:
        """:return: None while the verifier runs; then its Verdict (again on every later call)."""
        ...


class WorkspaceHandle(Protocol):
    """A workspace still being made (off the loop's thread), as ``fleetrun_prepare_workspace``
    may return it instead of a :class:`Workspace`; the loop polls it on every pass, on its
    main thread, and is woken when it may have news (an effect of :mod:`fleetrun.effects`
    wakes the loop when it is over)."""

    def poll(self) -> Optional[Workspace]:
        """:return: None while it is being made; then the Workspace. Raises what
        ``fleetrun_prepare_workspace`` would have raised (a ``permanent`` error...)."""
        ...


class CollectHandle(Protocol):
    """An ended attempt's work being collected (off the loop's thread), as
    ``fleetrun_collect_work`` may return it instead of its answer; the loop polls it on
    every pass, on its main thread, and is woken when it may have news (an effect of
    :mod:`fleetrun.effects` wakes the loop when it is over). The task stays RUNNING, its
    attempt ``ended``, until it has an answer."""

    def poll(self) -> Optional[str]:
        """:return: None while it runs; then the commit made, or ``""`` when nothing was
        (again on every later call). Raises what ``fleetrun_collect_work`` would have
        raised (``WorktreeTampered``, ``GitError``...)."""
        ...


class StartHandle(Protocol):
    """An attempt being started (its host's reply not in yet), as
    ``fleetrun_start_attempt`` may return it instead of a :class:`Started` (a peer's
    ``start`` request, sent without waiting: the loop starts a hundred peers' attempts in
    one pass). The loop polls it on every pass, on its main thread, and is woken when its
    reply comes; the attempt stays ``starting`` meanwhile, as a crash leaves it."""

    def poll(self) -> Optional[Started]:
        """:return: None while the start is under way; then the Started. Raises what
        ``fleetrun_start_attempt`` would have raised (``StartRefused``...)."""
        ...


class HandoffHandle(Protocol):
    """A finished task's handoff being made (off the loop's thread), as
    ``fleetrun_handoff`` may return it instead of a :class:`Handoff`; the loop polls it on
    every pass, on its main thread, and is woken when it may have news (an effect of
    :mod:`fleetrun.effects` wakes the loop when it is over). The task stays VERIFYING,
    every verdict recorded, until it has an answer."""

    def poll(self) -> Optional[Handoff]:
        """:return: None while it is being made; then the Handoff (again on every later
        call). Raises what ``fleetrun_handoff`` would have raised."""
        ...


@runtime_checkable
class Cancellable(Protocol):
    """A :class:`VerifyHandle` that can be stopped early (optional)."""

    def cancel(self) -> None:
        """Stop the verifier and release what it holds; its verdict is never asked for."""
        ...


@runtime_checkable
class Selectable(Protocol):
    """A :class:`VerifyHandle` the loop can ``select`` on (optional)."""

    def fileno(self) -> int:
        """:return: a descriptor readable once :meth:`VerifyHandle.poll` has news, or -1."""
        ...


@runtime_checkable
class HasDeadline(Protocol):
    """A :class:`VerifyHandle` that says when to poll it next (optional)."""

    def next_deadline(self) -> float:
        """:return: the :func:`time.monotonic` time to poll by."""
        ...


@dataclass
class Candidate:
    """A place an attempt can run, with its measured headroom.

    A measurement that is None is unknown, and an unknown is never plenty.
    """

    name: str
    kind: str = "local"  # "local" or "peer"
    free_mem_mb: Optional[float] = None
    load_per_core: Optional[float] = None
    free_disk_mb: Optional[float] = None
    running: int = 0
    max_tasks: int = 4
    drain: bool = False
    fresh: bool = True
    status: str = "live"  # live / stale / never
    tags: frozenset[str] = frozenset()
    tools: dict[str, Optional[str]] = field(default_factory=dict)  # name -> version
    auth: frozenset[str] = frozenset()
    mem_per_task_mb: float = 1024.0
    min_free_mem_mb: Optional[float] = None
    max_load_per_core: Optional[float] = None
    min_free_disk_mb: Optional[float] = None
    why_not: Optional[str] = None  # a reason it can take nothing (refused, unreachable...)
    #: ``why_not`` lasts until a person acts (no fleetrun installed there, one too old);
    #: else it may clear by itself (unreachable for now, a pause, its own slots full)
    why_not_needs_operator: bool = False
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Placement:
    """``fleetrun_place`` chose ``host`` for the next attempt."""

    host: str
    reason: str = ""


@dataclass
class Wait:
    """``fleetrun_place`` found no place; ``reason`` is shown to the operator.

    :ivar until: a wall-clock time worth waking up at (the end of a backoff).
    :ivar operator: set when only a person can clear the wait (a pin to a peer that
        is not paired, a ``requires`` no machine meets, every machine draining): what
        they must change, in words (``reason`` may name a figure that moves first).
        No pass of the loop changes it by itself, so a run (``fleetrun FILE``, ``work
        --until-idle``) whose only tasks left wait like this ends and prints it. None:
        the wait may clear by itself or by a live policy edit (free memory, load, disk,
        slots, a stale peer, a backoff, a usage-limit pause), and the run waits on.
    """

    reason: str
    until: Optional[float] = None
    operator: Optional[str] = None


@dataclass
class Workspace:
    """Where an attempt runs: a worktree on its own branch, or the task's cwd."""

    path: str
    branch: Optional[str] = None
    repo: Optional[str] = None
    base_ref: Optional[str] = None
    is_worktree: bool = False
    root: Optional[str] = None  # the worktree's top folder (``path`` may be below it)
    #: ``base = "dependencies"``: the dependencies' branches merged in when the worktree
    #: was made, in ``depends_on`` order, each ``{"task", "branch", "commit"}``
    merged: list[dict[str, Any]] = field(default_factory=list)
    #: the merge that stopped on a conflict (``on_conflict = "agent"``), while it is not
    #: concluded: ``{"task", "branch", "files", "pending"}`` (``pending``: the
    #: dependencies after it, not merged yet, each ``{"task", "branch"}``)
    conflict: Optional[dict[str, Any]] = None

    @property
    def task_worktree(self) -> Optional[str]:
        """What the task's ``worktree`` column holds for it (None: no worktree)."""
        return self.root or (self.path if self.is_worktree else None)


@dataclass
class Handoff:
    """What a DONE task hands to the tasks that depend on it."""

    task_name: str
    branch: Optional[str]
    summary: str
    host: str = "local"
    fetch_hint: str = ""
    #: the repository on this machine that holds ``branch`` when the task ran on a peer
    #: and its branch was fetched home; ``""`` when it is on ``host`` only (or the task
    #: ran here, where its branch is in the repository of its ``cwd``)
    repo: str = ""
    #: name -> URL: the links plugins attached to the task (``fleetrun.add_link``: its
    #: pull request...), filled from the ledger when a dependent's prompt is built
    links: dict[str, str] = field(default_factory=dict)

    def render(self) -> str:
        where = f" on branch {self.branch}" if self.branch else ""
        text = f"- {self.task_name} is DONE{where}."
        if self.fetch_hint:
            text += f" {self.fetch_hint}"
        for name, url in self.links.items():
            text += f"\n  Its {name.replace('_', ' ')}: {url}"
        if self.summary:
            text += "\n  Its summary: " + self.summary.replace("\n", "\n  ")
        return text


#: The ``reason`` of an :class:`AgentResult` whose agent was asked to resume a session it
#: cannot find (Claude Code: "No conversation found with session ID", a session killed
#: before its first request was saved): the next attempt is not offered that session
#: (``attempt.info["resume_session"]``) and starts a fresh one.
SESSION_NOT_FOUND = "session_not_found"


#: The kinds of :class:`AgentEnd`, the core's small vocabulary of how a session ended.
END_KINDS = ("ok", "resume", "give_up", "pause_host", "back_off", "not_started")


@dataclass(frozen=True)
class AgentEnd:
    """How an agent's plugin classifies its session's end, in the core's words: the
    plugin reads its agent's output (its limits, caps, errors) and says what the loop
    does; the core names no agent's reasons (docs/plugins.md, "An agent's end").

    :ivar kind: ``ok`` (verify the work), ``resume`` (a new session goes on, told to
        assess first), ``give_up`` (a human looks), ``pause_host`` (a usage limit:
        nothing starts on that machine before ``until``), ``back_off`` (this task waits
        before it runs on that machine again, 1, 2, 4 ... 30 minutes), ``not_started``
        (the agent never began: back off, no resume used).
    :ivar cause: the transition's cause, ``word:detail`` (the word one the plugin
        declares in its ``CAUSE_WORDS``); for ``pause_host`` the core says it.
    :ivar until: ``pause_host``: when the limit resets (None: not said).
    :ivar ran: the agent ran (its machine is good for this task again).
    :ivar counted: ``resume``: it uses one of the task's resumes (False: the session
        never saw the task, as a message nobody claimed).
    """

    kind: str
    cause: str = ""
    until: Optional[float] = None
    ran: bool = True
    counted: bool = True

    def __post_init__(self) -> None:
        if self.kind not in END_KINDS:
            raise ValueError(f"AgentEnd.kind must be one of {', '.join(END_KINDS)}: {self.kind!r}")

    @classmethod
    def ok(cls) -> AgentEnd:
        return cls("ok")

    @classmethod
    def resume(cls, cause: str, counted: bool = True, ran: bool = True) -> AgentEnd:
        return cls("resume", cause, counted=counted, ran=ran)

    @classmethod
    def give_up(cls, cause: str, ran: bool = True) -> AgentEnd:
        return cls("give_up", cause, ran=ran)

    @classmethod
    def pause_host(cls, until: Optional[float]) -> AgentEnd:
        return cls("pause_host", "usage_limit", until=until)

    @classmethod
    def back_off(cls, cause: str) -> AgentEnd:
        return cls("back_off", cause)

    @classmethod
    def not_started(cls, cause: str) -> AgentEnd:
        return cls("not_started", cause, ran=False)


@dataclass
class AgentResult:
    """What an agent session reported when it ended (read from its output).

    ``end`` is the plugin's classification of it (:class:`AgentEnd`); None leaves the
    end to what its host said (``exited``: verified if ``ok``, else resumed).
    """

    ok: bool
    reason: str = ""  # "" / no_result / is_error / timeout / stalled / killed / exit:N
    exit_code: Optional[int] = None
    session_id: Optional[str] = None
    cost_usd: Optional[float] = 0.0  # None: unknown (the agent never reported it)
    result_text: str = ""
    num_turns: Optional[int] = None
    permission_denials: list[Any] = field(default_factory=list)
    usage_limit: bool = False
    usage_reset_at: Optional[float] = None
    end: Optional[AgentEnd] = None


@dataclass
class SpawnSpec:
    """How to start an agent: what ``fleetrun_spawn`` returns.

    :ivar argv: the command, never run through a shell (``argv[0]`` is looked up on
        ``PATH``).
    :ivar env: variables added to the agent's environment (after fleetrun's own
        ``FLEETRUN_TASK_ID``, ``FLEETRUN_TASK_NAME``, ``FLEETRUN_ATTEMPT``,
        ``FLEETRUN_WORKTREE``).
    :ivar stdin: ``"prompt"`` to feed the prompt file on standard input; None for
        none.
    :ivar parser: the name of the plugin whose ``fleetrun_agent_result`` reads the
        output (informational: every plugin's ``fleetrun_agent_result`` is asked).
    :ivar session_id: the agent's session id, when it is chosen before it starts
        (recorded with the attempt, so a resume can name it).
    """

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    stdin: Optional[str] = None
    parser: Optional[str] = None
    session_id: Optional[str] = None

    @classmethod
    def coerce(cls, value: Any) -> SpawnSpec:
        """``value`` as a SpawnSpec: one as it is, or a dict with its field names (what
        ``fleetrun_spawn`` returned before SpawnSpec existed; still accepted).

        :raises UsageError: a dict with another key, or without ``argv``, or
            something else altogether; the message names what is wrong.
        """
        from .exceptions import UsageError

        if isinstance(value, cls):
            return value
        names = ("argv", "env", "stdin", "parser", "session_id")
        if not isinstance(value, dict):
            raise UsageError(f"fleetrun_spawn returned a {type(value).__name__}, not a fleetrun.SpawnSpec")
        unknown = sorted(str(k) for k in value if k not in names)
        if unknown:
            raise UsageError(
                f"fleetrun_spawn returned a dict with unknown key(s) {', '.join(unknown)} "
                f"(a fleetrun.SpawnSpec has {', '.join(names)})"
            )
        if not isinstance(value.get("argv"), list):
            raise UsageError("fleetrun_spawn returned a dict without an argv list")
        return cls(
            argv=list(value["argv"]),
            env=dict(value.get("env") or {}),
            stdin=value.get("stdin"),
            parser=value.get("parser"),
            session_id=value.get("session_id"),
        )


@dataclass
class Started:
    """An attempt that started: what ``fleetrun_start_attempt`` and ``Host.start``
    return.

    :ivar pid: the shepherd's (or whatever runs the attempt's) process id on its
        host; None when it may have started but that is not known yet (the host's
        ``status`` finds out).
    :ivar token: the process's identity token (its start time), so a reused pid is
        never taken for it; None if unknown.
    :ivar dir: the attempt folder on this machine.
    :ivar info: anything else the host wants said (the relay: the folder on the
        peer); not read by the loop.
    :ivar host: the name of the host the attempt actually runs on, when it is not the
        one it was placed on (the ``mailbox`` plugin's ``mailbox`` host, for a task it
        delivered to a role instead of spawning): the loop records it on the attempt,
        so polling, stopping and adoption ask that host; the task's own ``host`` stays
        the placed machine (a retry goes back there). None: the placed host.
    :ivar cause: the cause of the task's move to RUNNING (``started`` when None), as
        ``assigned_via_mailbox:relay owns src/relay/peer.rs``: who took the attempt and why.
    """

    pid: Optional[int]
    token: Optional[str]
    dir: str
    info: dict[str, Any] = field(default_factory=dict)
    host: Optional[str] = None
    cause: Optional[str] = None

    def __getitem__(self, key: str) -> Any:
        """``started["pid"]``, as on the dict ``Host.start`` returned before this class
        (``info``'s keys too)."""
        if key in ("pid", "token", "dir"):
            return getattr(self, key)
        return self.info[key]

"""The wire between a supervisor and its peers, the one module both sides import: the
constants of the protocol, the codecs (how a verb is invoked, how a task travels, how
a reply is found in what a login shell printed), each reply of ``fleetrun host VERB``
and what ``peers-state.json`` caches of them, read strictly.

A peer's reply is untrusted (``docs/security.md``): a ``parse_<verb>_reply`` here
returns the reply's values with their types and ranges checked, or raises
:class:`~fleetrun.untrusted.Malformed` with what is wrong. They are pure functions
(no I/O), so they are fuzzed (``tests/test_untrusted_peer.py``,
``bench/fuzz_peer.py``). :mod:`fleetrun.plugins.relay.host` turns a :class:`Malformed` into the
outcome that fits the verb: a status it cannot read is an unreachable peer (wait and
say why: the attempt may still run there, it must not run twice), a verifier status a
FAIL verdict, a probe a peer that gets no tasks, with the reason.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import shlex
from dataclasses import dataclass
from typing import Any, Optional, TextIO

from ...untrusted import (
    Malformed,
    boolean,
    integer,
    obj,
    one_of,
    opt_boolean,
    opt_integer,
    opt_number,
    opt_obj,
    opt_str_list,
    opt_text,
    sha,
    text,
)

#: The exit code of a ``host start`` the peer refused (at its limit, draining...), with
#: ``{"refused": reason}``: EX_TEMPFAIL, a refusal uses up no retry.
REFUSED_EXIT = 75
#: The most log bytes a peer sends in one ``status``/``log`` reply.
LOG_CHUNK = 1 << 20
#: The most attempts one ``host status-many`` request asks about (a peer runs at most
#: its ``max_tasks``; a supervisor asks in batches of this many).
MAX_POLL = 256
#: The most log bytes one ``host status-many`` reply carries, all its attempts together
#: (each attempt's chunk is cut to what is left; the rest comes with the next poll, or
#: through ``host log`` once the attempt has ended).
MANY_LOG_BUDGET = LOG_CHUNK
#: The first key of ``host bundle``'s header line (the bundle follows that line).
BUNDLE_MARK = "fleetrun_bundle"
#: The most commits a ``host bundle`` request's ``have`` (and its header's) names.
MAX_HAVES = 64
#: What this build of fleetrun can do as a peer; sent in every ``host probe`` reply.
#: (``host bundle``, which fetch-back needs, is found out by using it: a peer too old
#: for it answers with a usage error, and fetch-back says to upgrade it.)
FEATURES = ("supervised-tasks-1",)
#: The version of the worker's messages (``fleetrun host serve``): in every ``host
#: probe`` reply (``"worker": 1``; a peer without the key runs no worker) and in the
#: worker's hello; a supervisor that meets another version uses the one-shot verbs.
WORKER_PROTOCOL = 1
#: The verbs a worker answers (``bundle`` streams a git bundle: it stays a one-shot verb).
WORKER_VERBS = (
    "probe",
    "prepare",
    "start",
    "status",
    "status-many",
    "log",
    "stop",
    "collect",
    "cleanup",
    "verify-start",
    "verify-status",
    "verify-stop",
)
#: The events a worker pushes.
WORKER_EVENTS = ("hello", "log", "ended", "verified", "probe", "then")
#: What a worker can send out of turn (an event about an attempt not placed there, a
#: reply to a request never sent), as the supervisor counts it (:mod:`.placed`).
VIOLATION_KINDS = ("log", "ended", "verified", "reply", "then")
#: A worker's hello says ``"many": 1`` when it answers ``status-many`` (an older worker
#: drops a request whose verb it does not know, unanswered: it is not sent one).
#: A worker's hello says ``"chain": 1`` when a request may carry a second one to run
#: right after it (``then``: a verb, its arguments, its payload), whose answer is pushed
#: once it is done, after the first one's reply (a ``then`` event: ``id``, ``code``,
#: ``reply``): which verb may follow which. One round trip instead of two for a task
#: whose first verifier is ``run``: its collect, then its verifier's start. A worker
#: without the key is sent the two apart.
WORKER_CHAINS = {"collect": ("verify-start",)}
#: A worker's hello says ``"collects": 1`` when a ``start`` request may carry the
#: ``collect`` of its attempt (``at_end``: a verb, its arguments, its payload), which the
#: worker runs as soon as the attempt's agent exits 0, before it pushes the ``ended``
#: event: the event then carries the collect's answer (``collect``: ``code``,
#: ``reply``), as its reply would have. The supervisor sends no collect request for that
#: end: one round trip less between an end and VERIFYING. A worker without the key is
#: sent no ``at_end`` (and collects when asked, as before).
WORKER_AT_END = {"start": ("collect",)}
#: A worker's hello says ``"beats": 1`` when it pushes its headroom: a ``probe`` request
#: whose payload has ``beat_secs`` then has a ``probe`` event pushed that often.
BEAT_KEY = "beat_secs"
MIN_BEAT_S, MAX_BEAT_S = 0.05, 3600.0
#: The longest message line either side of a worker reads (a start's prompt, a log chunk).
MAX_WORKER_LINE = 16 << 20
MAX_REQUEST_ID = 1 << 53
#: What a supervisor needs from a peer before it sends it a task: a peer that
#: cannot run verifiers where the work is would skip them.
REQUIRED_FEATURES = ("supervised-tasks-1",)
#: How a peer's error reply starts when it refused a worktree whose ``.git`` was
#: rewritten; the supervisor raises ``gitutil.WorktreeTampered`` for it.
TAMPERED = "worktree_tampered: "
#: The states of a shepherd's status (``unreachable`` is the supervisor's own word).
STATUS_STATES = ("starting", "running", "ended", "died")
MAX_LOG_CHUNK = 4 << 20  # a peer sends 1 MiB chunks; base64 of that is below this
MAX_PID = 1 << 32
MAX_SIZE = 1 << 50
#: The workspace fields a ``prepare`` reply may carry (those of ``reports.Workspace``).
WORKSPACE_TEXT = ("path", "branch", "repo", "base_ref", "root")


# ---------------------------------------------------------------------------------
# codecs


def write_reply(out: TextIO, obj: dict[str, Any]) -> None:
    """A peer's reply: one JSON object on one line (what :func:`parse_reply` finds)."""
    out.write(json.dumps(obj, default=str) + "\n")
    out.flush()


def parse_reply(data: bytes) -> Optional[dict[str, Any]]:
    """The JSON object a ``fleetrun host`` verb printed. Tolerates lines before it (a
    login shell's ``.bashrc`` that prints): the reply is the last line that parses."""
    text = data.decode("utf-8", "replace").strip()
    try:
        obj = json.loads(text)
        return obj if isinstance(obj, dict) else None
    except (ValueError, RecursionError):  # deep nesting makes json recurse past the limit
        pass
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError):
                continue
            if isinstance(obj, dict):
                return obj
    return None


def remote_command(command: list[str], verb: str, args: list[str]) -> str:
    return shlex.join([*command, "host", verb, "--json", *args])


def task_payload(task: Any) -> dict[str, Any]:
    """A ledger ``Task`` as JSON, for the peer to rebuild."""
    from dataclasses import asdict

    d = asdict(task)
    d["state"] = task.state.value
    return d


# ---------------------------------------------------------------------------------
# replies, read strictly


@dataclass(frozen=True)
class LogChunk:
    """Bytes of an attempt's log from ``offset``; the log there is ``size`` bytes."""

    data: bytes
    offset: int
    size: int


@dataclass(frozen=True)
class StatusReply:
    status: dict[str, Any]
    chunk: Optional[LogChunk]


@dataclass(frozen=True)
class VerifyStatus:
    """A ``run`` verifier on the peer: ``running``, or ``ended`` with its verdict."""

    state: str
    passed: bool = False
    reason: str = ""
    output: str = ""
    duration_s: float = 0.0
    #: ``permanent``: the verifier could not run at all (an ERROR, not the work's FAIL);
    #: None from a peer too old to say
    error: Optional[str] = None


def parse_error_reply(reply: Any) -> tuple[str, bool]:
    """An error reply (``{"error": text, "unknown": bool}``): (its text, whether the
    peer said it knows no such thing). Never raises: a garbled error is still an error."""
    if not isinstance(reply, dict):
        return "an error reply that is not an object", False
    err = reply.get("error")
    msg = err[:2000] if isinstance(err, str) and err else "an error without a message"
    return msg, reply.get("unknown") is True


def parse_shepherd_status(value: Any, what: str = "status") -> dict[str, Any]:
    """A shepherd's status as a peer reports it: only the keys fleetrun reads (a key it
    does not know is left out, so a pushed end a supervisor keeps holds nothing else)."""
    d = obj(value, what)
    one_of(d.get("state"), f"{what}.state", STATUS_STATES)
    opt_integer(d, "exit_code", what, -(1 << 16), 1 << 16)
    for key in ("shepherd_pid", "agent_pid"):
        opt_integer(d, key, what, 1, MAX_PID)
    for key in ("reason", "error", "shepherd_token", "agent_token"):
        opt_text(d, key, what, 4000)
    opt_text(d, "attempt", what, 200)
    for key in ("started", "ended", "agent_started", "beat"):
        opt_number(d, key, what)
    for key in ("signal", "log_dropped"):
        opt_integer(d, key, what, 0)
    return {k: v for k, v in d.items() if k in SHEPHERD_STATUS_KEYS}


#: The keys of a shepherd's status a peer's reply keeps (:func:`parse_shepherd_status`).
SHEPHERD_STATUS_KEYS = frozenset(
    {
        "state",
        "exit_code",
        "shepherd_pid",
        "agent_pid",
        "reason",
        "error",
        "shepherd_token",
        "agent_token",
        "attempt",
        "started",
        "ended",
        "agent_started",
        "beat",
        "signal",
        "log_dropped",
    }
)


def _chunk(reply: dict[str, Any], what: str) -> Optional[LogChunk]:
    if "log" not in reply and "log_offset" not in reply and "log_size" not in reply:
        return None
    raw = text(reply.get("log", ""), f"{what}.log", MAX_LOG_CHUNK)
    try:
        data = base64.b64decode(raw.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise Malformed(f"{what}.log: not base64") from None
    offset = integer(reply.get("log_offset"), f"{what}.log_offset", 0, MAX_SIZE)
    size = integer(reply.get("log_size"), f"{what}.log_size", 0, MAX_SIZE)
    return LogChunk(data, offset, size)


def parse_status_reply(reply: Any) -> StatusReply:
    """``host status``: ``{"status": {...}}`` and, when asked with an offset, a log chunk."""
    d = obj(reply, "status reply")
    return StatusReply(parse_shepherd_status(d.get("status"), "status reply.status"), _chunk(d, "status reply"))


def parse_status_many_reply(reply: Any, asked: list[str]) -> dict[str, StatusReply]:
    """``host status-many``: ``{"statuses": {attempt id: a status reply}}``, for
    attempts of ``asked`` only (a peer speaks only of what it was asked about); each
    checked as :func:`parse_status_reply` does. An attempt it left out is not in the
    result (the caller counts it as unreachable)."""
    d = obj(obj(reply, "status-many reply").get("statuses"), "status-many reply.statuses")
    extra = [k for k in d if k not in asked]
    if extra:
        raise Malformed(f"status-many reply.statuses: attempts not asked about: {', '.join(map(str, extra[:5]))}")
    return {aid: parse_status_reply(d[aid]) for aid in asked if aid in d}


def parse_log_reply(reply: Any) -> LogChunk:
    """``host log``: a log chunk."""
    chunk = _chunk(obj(reply, "log reply"), "log reply")
    if chunk is None:
        raise Malformed("log reply: no log chunk")
    return chunk


def parse_stop_reply(reply: Any) -> bool:
    """``host stop``: whether the shepherd was signalled."""
    d = obj(reply, "stop reply")
    if d.get("status") is not None:
        parse_shepherd_status(d["status"], "stop reply.status")
    return boolean(d.get("signalled"), "stop reply.signalled")


def parse_start_reply(reply: Any) -> dict[str, Any]:
    """``host start``: the shepherd's pid and start-time token, and its folder there."""
    d = obj(reply, "start reply")
    return {
        "pid": integer(d.get("pid"), "start reply.pid", 1, MAX_PID),
        "token": opt_text(d, "token", "start reply", 200),
        "dir": opt_text(d, "dir", "start reply", 4096),
        "again": opt_boolean(d, "again", "start reply"),
    }


def parse_prepare_reply(reply: Any) -> dict[str, Any]:
    """``host prepare``: ``{"workspace": {...}}`` with the fields of a ``Workspace``
    (what they must be for this task is checked by the relay, which knows the task)."""
    ws = obj(obj(reply, "prepare reply").get("workspace"), "prepare reply.workspace")
    out: dict[str, Any] = {}
    for key in WORKSPACE_TEXT:
        out[key] = opt_text(ws, key, "prepare reply.workspace", 4096)
    if not out["path"]:
        raise Malformed("prepare reply.workspace.path: missing")
    out["is_worktree"] = opt_boolean(ws, "is_worktree", "prepare reply.workspace")
    return out


def parse_collect_reply(reply: Any) -> Optional[str]:
    """``host collect``: the commit made of the attempt's uncommitted work, or None."""
    d = obj(reply, "collect reply")
    commit = d.get("commit")
    return None if commit is None else sha(commit, "collect reply.commit")


def parse_cleanup_reply(reply: Any) -> dict[str, Any]:
    """``host cleanup``: which worktree, and whether it was removed."""
    d = obj(reply, "cleanup reply")
    return {
        "worktree": opt_text(d, "worktree", "cleanup reply", 4096),
        "removed": boolean(d.get("removed"), "cleanup reply.removed"),
    }


def parse_verify_start_reply(reply: Any) -> str:
    """``host verify-start``: ``running`` (also when it already was)."""
    d = obj(reply, "verify-start reply")
    opt_boolean(d, "again", "verify-start reply")
    return one_of(d.get("state"), "verify-start reply.state", ("running",))


def parse_verify_status_reply(reply: Any) -> VerifyStatus:
    """``host verify-status``: ``running``, or ``ended`` with ``passed`` (exactly
    ``true`` or ``false``), ``reason``, ``output``, ``duration_s``."""
    d = obj(reply, "verify-status reply")
    state = one_of(d.get("state"), "verify-status reply.state", ("running", "ended"))
    if state == "running":
        return VerifyStatus("running")
    return VerifyStatus(
        "ended",
        passed=boolean(d.get("passed"), "verify-status reply.passed"),
        reason=opt_text(d, "reason", "verify-status reply", 4000, "") or "",
        output=opt_text(d, "output", "verify-status reply", 1 << 20, "") or "",
        duration_s=opt_number(d, "duration_s", "verify-status reply", 0.0, 1e9, 0.0) or 0.0,
        error=None
        if d.get("error") is None
        else one_of(d.get("error"), "verify-status reply.error", ("permanent", "transient")),
    )


def parse_verify_stop_reply(reply: Any) -> bool:
    return boolean(obj(reply, "verify-stop reply").get("signalled"), "verify-stop reply.signalled")


def parse_bundle_header(header: Any) -> dict[str, Any]:
    """The header line of ``host bundle``: the branch's ``tip``, ``fork`` (where it
    left ``git_ref``), ``have`` (which of ours it has), ``bundle`` (whether one follows)."""
    d = obj(header, "bundle header")
    fork = d.get("fork")
    have = opt_str_list(d, "have", "bundle header", MAX_HAVES)
    return {
        "tip": sha(d.get("tip"), "bundle header.tip"),
        "fork": None if fork is None else sha(fork, "bundle header.fork"),
        "have": [sha(h, "bundle header.have") for h in have],
        "bundle": boolean(d.get("bundle"), "bundle header.bundle"),
    }


def _opt_measure(d: dict[str, Any], key: str, what: str) -> Optional[float]:
    return opt_number(d, key, what, 0.0, math.inf)


def parse_probe_reply(reply: Any) -> dict[str, Any]:
    """``host probe``: what the peer is and has. Every key placement and ``relay
    peers`` read has its type checked; ``tags`` must be a list of strings (a string
    is not its letters)."""
    what = "probe reply"
    d = obj(reply, what)
    out: dict[str, Any] = {}
    for key in ("fleetrun", "hostname", "os", "arch", "python", "home", "policy_error"):
        v = opt_text(d, key, what, 4000)
        if v is not None:
            out[key] = v
    out["features"] = opt_str_list(d, "features", what, 100)
    out["tags"] = opt_str_list(d, "tags", what, 1000)
    out["auth"] = opt_str_list(d, "auth", what, 100)
    tools = opt_obj(d, "tools", what) or {}
    out["tools"] = {k[:100]: (None if v is None else text(v, f"{what}.tools.{k}", 200)) for k, v in tools.items()}
    out["running"] = opt_integer(d, "running", what, 0, 1 << 20, 0)
    out["max_tasks"] = opt_integer(d, "max_tasks", what, 0, 1 << 20)
    out["drain"] = opt_boolean(d, "drain", what)
    out["worker"] = opt_integer(d, "worker", what, 0, 1 << 20)
    out["time"] = opt_number(d, "time", what)
    out["mem_per_task_mb"] = _opt_measure(d, "mem_per_task_mb", what)
    for key in ("free_mem_mb", "load_per_core", "free_disk_mb"):
        out[key] = _opt_measure(d, key, what)
    return out


def parse_peer_entry(entry: Any, what: str = "peer state") -> dict[str, Any]:
    """One peer's entry of ``peers-state.json``: the last probe it answered (checked
    as a reply is), when it was heard, the last error, the stops still to deliver."""
    d = obj(entry, what)
    out: dict[str, Any] = {
        "last_heard": opt_number(d, "last_heard", what, 0.0),
        "error": opt_text(d, "error", what, 4000),
        "error_at": opt_number(d, "error_at", what, 0.0),
    }
    probe = d.get("probe")
    out["probe"] = None if probe is None else parse_probe_reply(probe)
    stops: dict[str, Any] = {}
    for aid, s in (opt_obj(d, "pending_stops", what) or {}).items():
        s = obj(s, f"{what}.pending_stops.{aid[:60]}")
        stops[aid] = {
            "pid": opt_integer(s, "pid", what, 1, MAX_PID),
            "token": opt_text(s, "token", what, 200),
            "since": opt_number(s, "since", what),
            "error": opt_text(s, "error", what, 4000),
        }
    out["pending_stops"] = stops
    v = opt_obj(d, "violations", what)
    if v is not None:
        counts = opt_obj(v, "counts", f"{what}.violations") or {}
        out["violations"] = {
            "counts": {
                one_of(k, f"{what}.violations.counts", VIOLATION_KINDS): integer(
                    n, f"{what}.violations.counts.{k}", 0, 1 << 62
                )
                for k, n in counts.items()
            },
            "last": opt_text(v, "last", f"{what}.violations", 400),
            "last_at": opt_number(v, "last_at", f"{what}.violations", 0.0),
        }
    return out


# ---------------------------------------------------------------------------------
# the worker (``fleetrun host serve``): one JSON object a line, both ways


def worker_line(message: dict[str, Any]) -> bytes:
    """One message of the worker's protocol, as the line that carries it."""
    return json.dumps(message, separators=(",", ":"), default=str).encode() + b"\n"


@dataclass(frozen=True)
class WorkerRequest:
    """A supervisor's request to a worker: a verb, its arguments as the one-shot verb
    takes them, and the JSON it would read on stdin; ``then``, the request to run after
    it if it succeeded (:data:`WORKER_CHAINS`; the same id)."""

    id: int
    verb: str
    args: list[str]
    payload: Optional[bytes]
    then: Optional[WorkerRequest] = None
    #: the request to run when the attempt this one starts ends (:data:`WORKER_AT_END`)
    at_end: Optional[WorkerRequest] = None


@dataclass(frozen=True)
class WorkerMessage:
    """What a worker sent: a ``reply`` (``id``, ``code``: the one-shot verb's exit code,
    ``reply``: its JSON) or an event: ``then`` (the same fields: the answer to the
    request that followed request ``id``), ``hello`` (``info``), ``log`` (``chunk``),
    ``ended`` (``status``, the attempt's log ``size``; ``collect``: the answer, ``code``
    and ``reply``, to the collect its start asked for at its end, if it ran),
    ``verified`` (``verify``),
    ``probe`` (``probe``: a pushed heartbeat, the reply a ``probe`` request would get)."""

    kind: str
    id: int = 0
    code: int = 0
    reply: Optional[dict[str, Any]] = None
    attempt: str = ""
    idx: int = 0
    status: Optional[dict[str, Any]] = None
    size: int = 0
    chunk: Optional[LogChunk] = None
    verify: Optional[VerifyStatus] = None
    info: Optional[dict[str, Any]] = None
    probe: Optional[dict[str, Any]] = None
    collect: Optional[tuple[int, dict[str, Any]]] = None


def _json_line(line: bytes, what: str) -> dict[str, Any]:
    if len(line) > MAX_WORKER_LINE:
        raise Malformed(f"{what}: a line of {len(line)} bytes (at most {MAX_WORKER_LINE})")
    try:
        value = json.loads(line)
    except (ValueError, RecursionError) as e:
        raise Malformed(f"{what}: not JSON ({type(e).__name__}: {str(e)[:100]})") from None
    return obj(value, what)


def parse_worker_request(line: bytes) -> WorkerRequest:
    """A request line, read by the worker as strictly as a reply is read here: the
    supervisor's ids and paths are untrusted on the peer (the verb then checks them as
    its one-shot form does)."""
    d = _json_line(line, "request")
    rid = integer(d.get("id"), "request.id", 1, MAX_REQUEST_ID)
    req = _request_body(d, rid, "request", WORKER_VERBS)
    then = at_end = None
    if d.get("then") is not None:
        then = _request_body(obj(d["then"], "request.then"), rid, "request.then", WORKER_CHAINS.get(req.verb, ()))
    if d.get("at_end") is not None:
        at_end = _request_body(
            obj(d["at_end"], "request.at_end"), rid, "request.at_end", WORKER_AT_END.get(req.verb, ())
        )
    return WorkerRequest(rid, req.verb, req.args, req.payload, then, at_end)


def _request_body(d: dict[str, Any], rid: int, what: str, verbs: tuple[str, ...]) -> WorkerRequest:
    verb = one_of(d.get("verb"), f"{what}.verb", verbs) if verbs else None
    if verb is None:
        raise Malformed(f"{what}: no request may follow this one")
    args = d.get("args", [])
    if not isinstance(args, list) or len(args) > 32 or not all(isinstance(a, str) and len(a) <= 4096 for a in args):
        raise Malformed(f"{what}.args: must be a list of at most 32 strings")
    payload = d.get("payload")
    if payload is not None:
        payload = json.dumps(obj(payload, f"{what}.payload")).encode()
    return WorkerRequest(rid, verb, list(args), payload)


def beat_secs(payload: Optional[bytes]) -> Optional[float]:
    """How often a ``probe`` request asks its worker to push its headroom (the payload's
    ``beat_secs``), or None: the payload is the supervisor's, untrusted on the peer."""
    if payload is None:
        return None
    try:
        v = json.loads(payload).get(BEAT_KEY)
    except (ValueError, AttributeError, RecursionError):
        return None
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not MIN_BEAT_S <= v <= MAX_BEAT_S:
        return None
    return float(v)


def parse_worker_message(line: bytes) -> WorkerMessage:
    """A line from a worker, read strictly (:class:`Malformed` says what is wrong)."""
    d = _json_line(line, "worker message")
    if "id" in d and "event" not in d:
        return WorkerMessage(
            "reply",
            id=integer(d.get("id"), "worker reply.id", 1, MAX_REQUEST_ID),
            code=integer(d.get("code"), "worker reply.code", 0, 255),
            reply=obj(d.get("reply"), "worker reply.reply"),
        )
    kind = one_of(d.get("event"), "worker message.event", WORKER_EVENTS)
    what = f"{kind} event"
    if kind == "then":  # the answer to the request that followed request ``id``
        return WorkerMessage(
            "then",
            id=integer(d.get("id"), f"{what}.id", 1, MAX_REQUEST_ID),
            code=integer(d.get("code"), f"{what}.code", 0, 255),
            reply=obj(d.get("reply"), f"{what}.reply"),
        )
    if kind == "hello":
        return WorkerMessage(
            "hello",
            info={
                "protocol": integer(d.get("protocol"), f"{what}.protocol", 0, 1 << 20),
                "fleetrun": opt_text(d, "fleetrun", what, 200),
                "pid": opt_integer(d, "pid", what, 1, MAX_PID),
                "beats": opt_integer(d, "beats", what, 0, 1 << 20),
                "chain": opt_integer(d, "chain", what, 0, 1 << 20),
                "many": opt_integer(d, "many", what, 0, 1 << 20),
                "collects": opt_integer(d, "collects", what, 0, 1 << 20),
            },
        )
    if kind == "probe":
        return WorkerMessage("probe", probe=parse_probe_reply(d.get("probe")))
    from ...untrusted import attempt_id

    aid = attempt_id(d.get("attempt"), f"{what}.attempt")
    if kind == "log":
        chunk = _chunk(d, what)
        if chunk is None:
            raise Malformed(f"{what}: no log chunk")
        return WorkerMessage("log", attempt=aid, chunk=chunk)
    if kind == "ended":
        st = parse_shepherd_status(d.get("status"), f"{what}.status")
        if st["state"] not in ("ended", "died"):
            raise Malformed(f"{what}.status.state: {st['state']!r}, not ended or died")
        collect: Optional[tuple[int, dict[str, Any]]] = None
        if d.get("collect") is not None:  # the collect its start asked for at its end
            c = obj(d["collect"], f"{what}.collect")
            collect = (
                integer(c.get("code"), f"{what}.collect.code", 0, 255),
                obj(c.get("reply"), f"{what}.collect.reply"),
            )
        return WorkerMessage(
            "ended",
            attempt=aid,
            status=st,
            size=integer(d.get("log_size"), f"{what}.log_size", 0, MAX_SIZE),
            collect=collect,
        )
    result = parse_verify_status_reply(d.get("result"))
    if result.state != "ended":
        raise Malformed(f"{what}.result.state: {result.state!r}, not ended")
    return WorkerMessage("verified", attempt=aid, idx=integer(d.get("idx"), f"{what}.idx", 0, 9999), verify=result)


__all__ = [
    "beat_secs",
    "LogChunk",
    "Malformed",
    "WorkerMessage",
    "WorkerRequest",
    "parse_worker_message",
    "parse_worker_request",
    "worker_line",
    "StatusReply",
    "VerifyStatus",
    "parse_bundle_header",
    "parse_cleanup_reply",
    "parse_collect_reply",
    "parse_error_reply",
    "parse_log_reply",
    "parse_peer_entry",
    "parse_prepare_reply",
    "parse_probe_reply",
    "parse_shepherd_status",
    "parse_start_reply",
    "parse_status_reply",
    "parse_stop_reply",
    "parse_verify_start_reply",
    "parse_verify_status_reply",
    "parse_verify_stop_reply",
]

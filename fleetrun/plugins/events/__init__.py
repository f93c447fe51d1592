"""Built-in ``events`` plugin: the versioned NDJSON event stream (docs/events.md).

Every line is one JSON object, ``{"v": 1, "type": ..., "at": ..., ...}``, of the types
the JSON Schema ``fleetrun/events.schema.json`` declares: ``run_start``, ``run_end``,
``queued``, ``transition``, ``attempt_started``, ``attempt_ended``, ``verdict``,
``waiting``, ``peer_heartbeat``. Version 1 only ever gains fields and types.

The lines go to ``$FLEETRUN_HOME/events.ndjson`` (rotated by ``[events] max_bytes`` and
``keep``, :mod:`.log`) and, with ``--events FILE`` or ``--events -``, also to that file
or to standard output (the terminal's output then goes to standard error).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from ...config import ConfigKey
from ...exceptions import UsageError
from ...hookimpl import hookimpl
from ...stash import StashKey
from ...version import __version__
from .log import CHUNK_BYTES, DEFAULT_KEEP, DEFAULT_MAX_BYTES, Copy, HomeLog

if TYPE_CHECKING:
    from threading import Lock

    from ...config import Config

#: The schema version every line carries; fields and types are only ever added to it.
VERSION = 1

#: A declaration the loop reads (not a hook): this plugin's ``fleetrun_transition``
#: writes to a log every fleetrun process of the home shares, so a transition another
#: process made (a ``fleetrun cancel`` from another shell) is in it already and is not
#: replayed to this plugin by the loop that shows it.
SHARED_TRANSITION_LOG = True
#: Longer texts (a verifier's reason, a wait's reason) are cut to this many characters.
TEXT_LIMIT = 500


class Sinks:
    """Where this process's events go: the home's log (made on the first event, once
    ``config.toml`` is read) and the ``--events`` copy.

    Inside a work loop (from ``fleetrun_sessionstart`` to ``fleetrun_sessionfinish``)
    the lines are kept and written together: at the end of each pass
    (``fleetrun_loop_pass``), when they pass :data:`~.log.CHUNK_BYTES`, and as the run
    ends; a first pass over 10,000 waiting tasks is then a few ``write`` calls, not
    10,000 ``open``s. Outside one (``fleetrun cancel``...) each line is written at once,
    but for ``queued`` lines (``fleetrun queue``), kept as a loop's are until the
    command ends (a command that dies first leaves them out; the ledger has the tasks).
    """

    def __init__(self, config: Config, copy: Optional[Copy]) -> None:
        self.config = config
        self.copy = copy
        self.home: Optional[HomeLog] = None
        self.batching = False
        self.pending: list[bytes] = []
        self.pending_bytes = 0
        self.lock: Optional[Lock] = None  # made by start_batching(), for a loop only

    def start_batching(self) -> None:
        """A work loop starts: keep the lines until :meth:`flush`."""
        # the hooks come on the loop's thread; the lock is for a plugin that calls one
        # from a thread of its own. Imported here: a verb of an operator starts no thread
        import threading

        self.lock = threading.Lock()
        self.batching = True

    def emit(self, type_: str, fields: dict[str, Any]) -> None:
        event = {"v": VERSION, "type": type_, "at": stamp(time.time()), **fields}
        self._add(type_, (_ENCODE(event) + "\n").encode())

    def add_lines(self, type_: str, lines: Iterable[bytes]) -> None:
        """Events of ``type_`` already encoded, a line each (a queue's ``queued`` lines)."""
        for line in lines:
            self._add(type_, line)

    def _add(self, type_: str, line: bytes) -> None:
        if self.copy is not None and self.copy.live:
            self._to_copy(line)
        if self.lock is None:  # not a loop: the line is written as it happens
            self.pending.append(line)
            self.pending_bytes += len(line)
            # but a queue's lines (`fleetrun queue` of 100,000 tasks: a `queued` each) a
            # chunk at a time, the rest as the command ends (fleetrun_unconfigure)
            if type_ != "queued" or self.pending_bytes >= CHUNK_BYTES:
                self._flush()
            return
        with self.lock:
            self.pending.append(line)
            self.pending_bytes += len(line)
            if not self.batching or self.pending_bytes >= CHUNK_BYTES:
                self._flush()

    def flush(self) -> None:
        """Write the lines kept so far (the end of a pass, of the run, of a command)."""
        if self.lock is None:
            self._flush()
            return
        with self.lock:
            self._flush()

    def _flush(self) -> None:
        # under the lock, the write too: two threads' lines stay in their order
        lines, self.pending, self.pending_bytes = self.pending, [], 0
        if lines:
            self._write(lines)

    def _write(self, lines: list[bytes]) -> None:
        if self.copy is not None and not self.copy.live:
            self._to_copy(b"".join(lines))
        try:
            if self.home is None:
                home = self.config.home
                home.mkdir(parents=True, exist_ok=True, mode=0o700)
                self.home = HomeLog(home / "events.ndjson", *_limits(self.config))
            self.home.write_lines(lines)
        except OSError:
            pass  # the event log must never stop the loop; the ledger has the truth

    def _to_copy(self, data: bytes) -> None:
        assert self.copy is not None
        try:
            self.copy.write(data)
        except (OSError, ValueError):
            self.copy = None  # a reader that went away; the home's log goes on


SINKS_KEY = StashKey[Sinks]()
#: ``json.dumps(event, default=str, allow_nan=False)``, its encoder made once, not a
#: line at a time (a queue of 100,000 tasks writes 100,000 lines)
_ENCODE = json.JSONEncoder(default=str, allow_nan=False).encode


#: The last second :func:`stamp` formatted, and its text: a pass's 10,000 lines share a
#: few seconds, and formatting a time each was a third of what a line cost.
_SECOND: tuple[float, str] = (-1.0, "")


def stamp(t: float) -> str:
    """RFC 3339, UTC, milliseconds: ``2026-12-01T16:30:00.123Z``, as
    ``datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="milliseconds")`` says
    it (microseconds rounded half to even, then cut to milliseconds)."""
    global _SECOND
    frac, whole = math.modf(t)
    us = round(frac * 1e6)
    if us >= 1000000:
        whole, us = whole + 1, us - 1000000
    second = _SECOND  # one read: another thread may set it meanwhile
    if second[0] != whole:
        second = _SECOND = (whole, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)))
    return f"{second[1]}.{us // 1000:03d}Z"


def _limits(config: Config) -> tuple[int, int]:
    try:
        return (
            int(config.setting("events", "max_bytes", DEFAULT_MAX_BYTES)),
            int(config.setting("events", "keep", DEFAULT_KEEP)),
        )
    except UsageError:  # config.toml was refused already, where it is read
        return DEFAULT_MAX_BYTES, DEFAULT_KEEP


def _sinks(config: Config) -> Sinks:
    sinks = config.stash.get(SINKS_KEY)
    if sinks is None:
        sinks = config.stash[SINKS_KEY] = Sinks(config, None)
    return sinks


def _emit(config: Config, type_: str, **fields: Any) -> None:
    _sinks(config).emit(type_, fields)


def _num(value: Any) -> Optional[float]:
    """A finite number, or None (JSON has no NaN)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _text(value: Any) -> str:
    text = str(value or "")
    return text if len(text) <= TEXT_LIMIT else text[: TEXT_LIMIT - 3] + "..."


def _task(task: Any) -> dict[str, Any]:
    return {"task": task.id, "name": task.name}


# -- configuration ---------------------------------------------------------------------


def _positive(value: Any) -> Optional[str]:
    return None if value >= 1 else "must be at least 1"


def _not_negative(value: Any) -> Optional[str]:
    return None if value >= 0 else "must be 0 or more"


@hookimpl(trylast=True)
def fleetrun_config_keys(config: Config) -> list[ConfigKey]:
    return [
        # the home's log: a setting of this machine's home, never of a project
        ConfigKey("events", "", machine=True, doc="the event log of this home"),
        ConfigKey(
            "events",
            "max_bytes",
            (int,),
            check=_positive,
            doc="rotate events.ndjson before it grows past this many bytes",
        ),
        ConfigKey(
            "events", "keep", (int,), check=_not_negative, doc="how many rotated files to keep (events.ndjson.1 ...)"
        ),
    ]


@hookimpl(trylast=True)
def fleetrun_addoption(parser: Any) -> None:
    parser.getgroup("events", "the event stream").addoption(
        "--events",
        metavar="FILE|-",
        default=None,
        help="also write this run's events to FILE (appended), or to standard output with '-' "
        "(the terminal's output then goes to standard error); see docs/events.md",
    )


@hookimpl(tryfirst=True)
def fleetrun_configure(config: Config) -> None:
    # tryfirst: `--events -` takes standard output before the terminal plugin (or any
    # other) picks up config.out for its own lines
    where = config.getoption("events")
    if not where or config.option.verb not in ("run", "work"):
        return
    if where == "-":
        copy = Copy(stream=config.out)
        config.out = config.err
    else:
        path = Path(config.invocation_dir, os.path.expanduser(where))
        try:
            copy = Copy(path=path)
        except OSError as e:
            raise UsageError(f"cannot write to {path}: {e.strerror or e}", key="--events") from None
    config.stash[SINKS_KEY] = Sinks(config, copy)


@hookimpl(trylast=True)
def fleetrun_unconfigure(config: Config) -> None:
    sinks = config.stash.get(SINKS_KEY)
    if sinks is not None:
        sinks.flush()  # a run that ended on an internal error: what its passes said
        if sinks.copy is not None:
            sinks.copy.close()


# -- the events ------------------------------------------------------------------------


@hookimpl(trylast=True)
def fleetrun_sessionstart(session: Any) -> None:
    config = session.config
    _sinks(config).start_batching()  # a work loop: its lines are written pass by pass
    _emit(
        config,
        "run_start",
        pid=os.getpid(),
        version=__version__,
        verb=config.option.verb,
        files=[str(f) for f in (config.getoption("files") or [])],
        tasks=len(session.items or []),
        home=str(config.home),
    )


@hookimpl(trylast=True)
def fleetrun_sessionfinish(session: Any, exitstatus: int) -> None:
    led, ids = session.ledger, session.task_ids
    first = led.get(ids[0]) if led is not None and ids else None
    _emit(
        session.config,
        "run_end",
        pid=os.getpid(),
        version=__version__,
        exit_status=int(exitstatus),
        counts={str(k): int(v) for k, v in session.counts.items()},
        cost_usd=_num(session.cost_usd),
        duration_s=round(time.time() - session.started, 3),
        queue=first.queue_id if first else None,
    )
    sinks = _sinks(session.config)
    sinks.batching = False
    sinks.flush()


@hookimpl(trylast=True)
def fleetrun_loop_pass(config: Config, duration_s: float) -> None:
    # trylast: after whatever another plugin's pass hook makes happen
    _sinks(config).flush()


@hookimpl(trylast=True)
def fleetrun_queued(tasks: Any, config: Config) -> None:
    # a queue's `queued` lines, so every transition has a `from`: a call for 100,000,
    # no Task made for each (fleetrun_transition is not called here for these)
    _sinks(config).add_lines("queued", queued_lines(stamp(time.time()), tasks.queue_id, tasks.entered()))


def queued_lines(at: str, queue: str, entered: Iterable[tuple[str, str, Any, str]]) -> Iterator[bytes]:
    """The ``queued`` event of each task (id, name, state, cause) of ``queue``, at ``at``:
    the line ``json.dumps`` of ``{"v", "type", "at", "task", "name", "queue", "to",
    "cause"}`` writes (its separators, ASCII), made from the one text the fields' names
    and the queue's id share and each field's own JSON string (``json.dumps`` of a
    ``str``): a dict a line and its encoding were most of what 100,000 lines cost
    (0.22 s against 0.03)."""
    head = f'{{"v": {VERSION}, "type": "queued", "at": {_ENCODE(at)}, "task": '
    queue_text = _ENCODE(queue)
    for task_id, name, state, cause in entered:
        yield (
            f'{head}{_ENCODE(task_id)}, "name": {_ENCODE(name)}, "queue": {queue_text}, '
            f'"to": {_ENCODE(state.value)}, "cause": {_ENCODE(cause)}}}\n'
        ).encode()


@hookimpl(trylast=True)
def fleetrun_transition(task: Any, from_state: str, to_state: str, cause: str, attempt: Any, config: Config) -> None:
    if not from_state:  # entered the ledger, told by a caller other than fleetrun's queue (fleetrun_queued)
        _emit(config, "queued", **_task(task), queue=task.queue_id, to=to_state, cause=cause)
        return
    _emit(
        config,
        "transition",
        **_task(task),
        **{"from": from_state},
        to=to_state,
        cause=cause,
        attempt=attempt,
        host=task.host,
    )


@hookimpl(trylast=True)
def fleetrun_attempt_started(task: Any, attempt: Any, host: Any, config: Config) -> None:
    _emit(
        config,
        "attempt_started",
        **_task(task),
        attempt=attempt.number,
        attempt_id=attempt.id,
        kind=attempt.kind,
        host=attempt.host,
        pid=attempt.shepherd_pid,
        session_id=attempt.session_id,
    )


@hookimpl(trylast=True)
def fleetrun_attempt_ended(task: Any, attempt: Any, result: Any, config: Config) -> None:
    began, ended = _num(attempt.started), _num(attempt.ended)
    _emit(
        config,
        "attempt_ended",
        **_task(task),
        attempt=attempt.number,
        attempt_id=attempt.id,
        host=attempt.host,
        exit_code=attempt.exit_code,
        outcome=attempt.outcome,
        cost_usd=_num(attempt.cost_usd),
        session_id=attempt.session_id,
        duration_s=round(ended - began, 3) if began is not None and ended is not None else None,
    )


def _error(error: Any) -> Optional[str]:
    """A verdict's ``error`` as the schema allows it (a plugin's own word is ``permanent``)."""
    if not error:
        return None
    return "transient" if error == "transient" else "permanent"


@hookimpl(trylast=True)
def fleetrun_verdict(task: Any, verdict: Any, attempt: Any, config: Config) -> None:
    _emit(
        config,
        "verdict",
        **_task(task),
        attempt=attempt.number,
        kind=verdict.kind,
        label=verdict.label,
        passed=bool(verdict.passed) and not getattr(verdict, "error", None),
        error=_error(getattr(verdict, "error", None)),
        duration_s=round(_num(verdict.duration_s) or 0.0, 3),
        reason=_text(verdict.reason),
        cost_usd=_num(verdict.cost_usd) or 0.0,
        host=verdict.host,
    )


@hookimpl(trylast=True)
def fleetrun_task_waiting(task: Any, reason: str, config: Config) -> None:
    _emit(config, "waiting", **_task(task), reason=_text(reason))


@hookimpl(trylast=True)
def fleetrun_host_heartbeat(host: Any, info: dict[str, Any], config: Config) -> None:
    _emit(
        config,
        "peer_heartbeat",
        peer=host.name,
        reachable=bool(info.get("reachable")),
        running=info.get("running"),
        max_tasks=info.get("max_tasks"),
        free_slots=info.get("free_slots"),
        free_mem_mb=_num(info.get("free_mem_mb")),
        load_per_core=_num(info.get("load_per_core")),
        free_disk_mb=_num(info.get("free_disk_mb")),
        latency_ms=_num(info.get("latency_ms")),
        error=_text(info["error"]) if info.get("error") else None,
    )

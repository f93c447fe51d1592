"""Task and verifier specifications, as collected from a tasks file.

These are plain data: the collector builds them, the ledger stores them as JSON,
plugins read them.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

#: Claude Code's permission modes (``claude --help``): 2.1.197 asks with ``default``,
#: 2.1.332 calls that mode ``manual``; either is accepted and passed on as written.
PERMISSION_MODES = ("acceptEdits", "auto", "bypassPermissions", "default", "dontAsk", "manual", "plan")

DEFAULT_MAX_RETRIES = 2
DEFAULT_TIMEOUT_MIN = 60.0
DEFAULT_STALL_TIMEOUT_MIN = 20.0
DEFAULT_VERIFY_TIMEOUT_S = 15 * 60.0
#: A ``setup`` command may install a whole environment: longer than a verifier.
DEFAULT_SETUP_TIMEOUT_S = 30 * 60.0
#: What a task's worktree starts from (``base``): its ``git_ref``, or its ``git_ref``
#: with each dependency's branch merged in, in ``depends_on`` order.
BASES = ("git_ref", "dependencies")
#: What a conflict in that merge does (``on_conflict``): NEEDS_HUMAN, or the agent
#: starts on the conflicted tree, told so first.
ON_CONFLICT = ("human", "agent")


@dataclass
class VerifySpec:
    """One ``[[task.verify]]`` table.

    :ivar kind: ``run``, ``brain``, ``agent`` or a kind a plugin declared.
    :ivar text: the command, question or review prompt.
    :ivar name: the ``name`` key (unique within its task), or None.
    """

    kind: str
    text: str
    model: Optional[str] = None
    budget_usd: Optional[float] = None
    timeout_s: float = DEFAULT_VERIFY_TIMEOUT_S
    extra: dict[str, Any] = field(default_factory=dict)
    line: int = 0
    name: Optional[str] = None

    @property
    def label(self) -> str:
        """How the verifier is shown (verdict lines, causes, ``logs``, the retry prompt):
        its ``name`` when it has one, else its text on one line, cut to 60 characters
        (``cargo test --all`` stays whole; a longer one ends with ``...``)."""
        if self.name:
            return self.name
        text = " ".join(self.text.split())
        return text if len(text) <= 60 else text[:57] + "..."


@dataclass
class TaskSpec:
    """One ``[[task]]`` table, validated. Paths are absolute."""

    name: str
    prompt: str
    cwd: str
    source: str = ""
    line: int = 0
    git_ref: Optional[str] = None
    branch: Optional[str] = None
    depends_on: list[str] = field(default_factory=list)
    max_retries: int = DEFAULT_MAX_RETRIES
    timeout_min: float = DEFAULT_TIMEOUT_MIN
    model: Optional[str] = None
    permission_mode: Optional[str] = None
    allowed_tools: Optional[list[str]] = None
    budget_usd: Optional[float] = None
    stall_timeout_min: float = DEFAULT_STALL_TIMEOUT_MIN
    agent: str = "claude"
    role: Optional[str] = None
    paths: list[str] = field(default_factory=list)
    requires: list[str] = field(default_factory=list)
    peer: Optional[str] = None
    verify: list[VerifySpec] = field(default_factory=list)
    #: ``setup`` commands, as ``run`` steps whose ``extra["setup"]`` is their 1-based number
    setup: list[VerifySpec] = field(default_factory=list)
    base: str = "git_ref"
    on_conflict: str = "human"
    #: words ``-m EXPR`` selects the task by (pytest's markers); no effect on how it runs
    tags: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    #: where each key was written (a collected task's: found in its file when first read,
    #: :class:`~fleetrun.tomlfile.KeyLines`)
    key_lines: Mapping[str, int] = field(default_factory=dict)
    #: the keys whose value is a default (the tasks file's top level, the project file's
    #: ``[task]``), each with the file it was written in; ``key_lines`` has its line there
    defaulted: dict[str, str] = field(default_factory=dict)

    @property
    def merges_dependencies(self) -> bool:
        """The worktree starts with the dependencies' branches merged in: ``base =
        "dependencies"`` and some to merge (a default of every task leaves one without
        dependencies as it is)."""
        return self.base == "dependencies" and bool(self.depends_on)

    def file_of(self, key: str) -> str:
        """The file ``key`` was written in (its line: ``key_lines``): the task's own, or
        the file of the default it took."""
        return self.defaulted.get(key, self.source)

    def to_json(self) -> dict[str, Any]:
        """The spec as plain data, as ``dataclasses.asdict`` makes it (a copy: nothing
        shared with the spec) at a fraction of its cost: ``fleetrun queue`` of 100,000
        tasks writes each one, and ``asdict``'s generic walk was a third of its time."""
        return _plain_dataclass(self)

    def json_view(self) -> dict[str, Any]:
        """What the ledger keeps of the spec, as a view to read once (``json.dumps``, a
        digest): what :meth:`to_json` holds, the spec's own lists and dicts, not copies;
        its verifiers as dicts. Do not change it.

        Of a collected task's ``key_lines`` it holds the lines of the defaults it took
        only: where its own keys were written is read from its file when asked (an
        error, a warning), not for each of 100,000 tasks, and means nothing once the
        file changes."""
        view = _fields(self)
        lines = view["key_lines"]
        if type(lines) is not dict:
            view["key_lines"] = dict(getattr(lines, "known", lines))
        for key in ("verify", "setup"):
            if view[key]:
                view[key] = [_fields(v) for v in view[key]]
        return view

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TaskSpec:
        data = dict(data)
        # keys a newer fleetrun wrote (a peer, a ledger) are left out, as the task's are
        # the field names once a class (_names), not dataclasses.fields a task: a loop
        # reading 100,000 specs back asked it 200,000 times
        vkeys = _names(VerifySpec)
        verify = [VerifySpec(**{k: x for k, x in v.items() if k in vkeys}) for v in data.pop("verify", [])]
        setup = [
            VerifySpec(**{k: x for k, x in v.items() if k in vkeys}) for v in data.pop("setup", None) or []
        ]  # older ledgers have none
        known = _names(cls)
        return cls(verify=verify, setup=setup, **{k: v for k, v in data.items() if k in known})


_FIELDS: dict[type, tuple[str, ...]] = {}


def _names(cls: type) -> tuple[str, ...]:
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


def _fields(obj: Any) -> dict[str, Any]:
    """A dataclass instance's fields, by name, in their order: its ``__dict__`` copied
    when that holds them and nothing else, in that order (what ``__init__`` makes; one
    copy in C instead of a lookup per field)."""
    names = _names(type(obj))
    own = obj.__dict__
    if tuple(own) == names:
        return own.copy()
    return {name: getattr(obj, name) for name in names}


def _plain_dataclass(obj: Any) -> dict[str, Any]:
    return {name: _plain(getattr(obj, name)) for name in _names(type(obj))}


_SCALARS = frozenset((str, int, float, bool, type(None)))


def _plain(value: Any) -> Any:
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is list:
        return [v if type(v) in _SCALARS else _plain(v) for v in value]
    if kind is dict:
        return {k: v if type(v) in _SCALARS else _plain(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _plain_dataclass(value)
    if isinstance(value, (list, tuple, dict)):
        return _plain_other(value)
    if isinstance(value, Mapping):  # a collected task's key_lines: their lines, as a dict
        return {k: _plain(v) for k, v in value.items()}
    return copy.deepcopy(value)


def _plain_other(value: Any) -> Any:
    # what asdict does with a tuple, a list or dict subclass: the same type, items made plain
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        return type(value)(*[_plain(v) for v in value])
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    return type(value)((_plain(k), _plain(v)) for k, v in value.items())


def step_index(task: Any, verifier: VerifySpec) -> int:
    """The 0-based step number of ``verifier`` in its attempt: its place among the
    task's verifiers."""
    verify = task.spec.verify
    return verify.index(verifier) if verifier in verify else 0


@dataclass(frozen=True)
class KeyDecl:
    """A key a tasks file may use, declared by a plugin through ``fleetrun_task_keys``.

    :ivar where: ``task`` (a ``[[task]]`` key), ``verify`` (a ``[[task.verify]]``
        key) or ``verify_kind`` (a new verifier kind, like ``run``).
    :ivar types: the Python types the value may have (after TOML parsing).
    :ivar check: optional extra check; returns an error message or None.
    :ivar runs: for a ``verify_kind``, where its verifiers run: ``host`` (in the
        attempt's workspace, on the host the attempt ran on: a peer's plugin runs them
        there, as the ``run`` kind) or ``here`` (on the supervising machine, on the
        work fetched back from a peer, as ``brain`` and ``agent``).
    """

    key: str
    types: tuple[type, ...]
    where: str = "task"
    doc: str = ""
    check: Optional[Callable[[Any], Optional[str]]] = None
    runs: str = "host"


_REF_BAD = re.compile(r"(^[-/.])|(\.\.)|([\x00-\x20~^:?*\[\\\x7f])|(@\{)|(/$)|(\.lock(/|$))|(\.$)|(//)|(/\.)")


def ref_problem(ref: str) -> Optional[str]:
    """Why ``ref`` is not a safe git ref name (git-check-ref-format rules), or None."""
    if not ref:
        return "must not be empty"
    if ref.startswith("-"):
        return f"{ref!r} starts with '-' (it would be read as an option)"
    if ref == "@" or _REF_BAD.search(ref):
        return f"{ref!r} is not a valid git ref name"
    return None


_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def safe_slug(name: str, limit: int = 48) -> str:
    """A file- and ref-safe form of a task name: ``fix it/now`` -> ``fix-it-now``."""
    slug = _SAFE.sub("-", name).strip("-.")
    slug = re.sub(r"\.{2,}", ".", slug)
    return slug[:limit].rstrip("-.") or "task"

"""The keys a tasks file's tables may hold: the built-in declarations of ``[[task]]`` and
``[[task.verify]]`` keys, their value checks, and :class:`KeyTable`, which adds the keys
plugins declare through ``fleetrun_task_keys``.

Kept apart from the collector (:mod:`fleetrun.collect`) so every reader of task keys (the
tasks file, the project file's ``[task]`` defaults) checks them with one table and the
same value checks (:func:`check_value`, :func:`collect_setup`), into one :class:`KeyErrors`.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional

from .exceptions import UsageError
from .stash import StashKey
from .taskspec import (
    BASES,
    DEFAULT_SETUP_TIMEOUT_S,
    ON_CONFLICT,
    PERMISSION_MODES,
    KeyDecl,
    VerifySpec,
    ref_problem,
)
from .tomlfile import describe_value, not_one_of

NUM = (int, float)


def _nonneg(v: Any) -> Optional[str]:
    return None if v >= 0 else "must not be negative"  # nan fails too


def _positive(v: Any) -> Optional[str]:
    return None if v > 0 else "must be greater than 0"


def _str_list(v: Any) -> Optional[str]:
    if not all(isinstance(x, str) for x in v):
        return "must be a list of strings"
    return None


def _nonempty(v: Any) -> Optional[str]:
    return "must not be empty" if not v.strip() else None


#: Control characters, C1 too: U+009B is CSI on some terminals, as good as ESC [
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def _name_check(v: str) -> Optional[str]:
    if not v.strip():
        return "must not be empty"
    if v.startswith("-"):
        return f"{v!r} starts with '-'"
    if _CONTROL.search(v):  # a search in C: every task has a name
        return "must not contain control characters"
    if len(v) > 100:
        return "is longer than 100 characters"
    return None


def _tags_check(v: Any) -> Optional[str]:
    # a tag is one word of a -m expression: no spaces or parentheses, not an operator
    for tag in v:
        if not isinstance(tag, str):
            return "must be a list of strings"
        if (
            not tag
            or any(c.isspace() or c in "()" for c in tag)
            or tag in ("and", "or", "not")
            or any(ord(c) < 32 or 127 <= ord(c) <= 159 for c in tag)
        ):
            return f"{tag!r} is not a tag (one word: no spaces, parentheses, and/or/not)"
    return None


def _perm_check(v: str) -> Optional[str]:
    if v not in PERMISSION_MODES:
        return not_one_of(v, PERMISSION_MODES)
    return None


def _ref_check(v: str) -> Optional[str]:
    return ref_problem(v)


def _one_of(*choices: str) -> Callable[[str], Optional[str]]:
    def check(v: str) -> Optional[str]:
        return None if v in choices else not_one_of(v, choices)

    return check


#: The keys of a ``[[task]]`` table that fleetrun itself knows.
BUILTIN_TASK_KEYS: tuple[KeyDecl, ...] = (
    KeyDecl("name", (str,), doc="unique name of the task", check=_name_check),
    KeyDecl("prompt", (str,), doc="what the agent is asked to do", check=_nonempty),
    KeyDecl("cwd", (str,), doc="working directory, relative to the tasks file"),
    KeyDecl("git_ref", (str,), doc="run in a new worktree made from this ref", check=_ref_check),
    KeyDecl("branch", (str,), doc="branch name for the worktree", check=_ref_check),
    KeyDecl("depends_on", (list,), doc="names of tasks that must be DONE first", check=_str_list),
    KeyDecl("max_retries", (int,), doc="retries after a failed verifier", check=_nonneg),
    KeyDecl("timeout_min", NUM, doc="minutes an attempt may run", check=_positive),
    KeyDecl("model", (str,), doc="agent model"),
    KeyDecl("permission_mode", (str,), doc="Claude Code permission mode", check=_perm_check),
    KeyDecl("allowed_tools", (list,), doc="Claude Code allow rules", check=_str_list),
    KeyDecl("budget_usd", NUM, doc="cap on the task's total cost", check=_nonneg),
    KeyDecl("stall_timeout_min", NUM, doc="minutes without output", check=_positive),
    KeyDecl("agent", (str,), doc="agent backend name", check=_nonempty),
    KeyDecl("role", (str,), doc="mailbox role", check=_nonempty),
    KeyDecl("paths", (list,), doc="what the task is about, relative to cwd", check=_str_list),
    KeyDecl("requires", (list,), doc="tags or tools the machine must have", check=_str_list),
    KeyDecl("peer", (str,), doc="pin to this machine", check=_nonempty),
    KeyDecl("setup", (list,), doc="commands run in the workspace before the agent's first attempt"),
    KeyDecl(
        "base",
        (str,),
        doc="what the worktree starts from: git_ref, or dependencies (their branches merged in)",
        check=_one_of(*BASES),
    ),
    KeyDecl(
        "on_conflict",
        (str,),
        doc="a conflict merging the dependencies: ask a human, or let the agent resolve it",
        check=_one_of(*ON_CONFLICT),
    ),
    KeyDecl("tags", (list,), doc="words to select the task by with -m EXPR, as pytest's markers", check=_tags_check),
)

#: The verifier kinds fleetrun itself knows: none. Each kind (``run``, ``brain``,
#: ``agent``) is declared by the plugin that runs it (``fleetrun_task_keys``, a
#: ``KeyDecl`` with ``where="verify_kind"`` and ``runs``), so ``-p no:verify_brain``
#: takes the ``brain`` kind away and a tasks file using it fails to validate.
BUILTIN_VERIFY_KINDS: tuple[KeyDecl, ...] = ()

#: The value check of a verifier kind's text (a command, a question, a prompt).
kind_text_check = _nonempty

#: Where a verifier kind runs (:attr:`KeyDecl.runs`).
RUNS = ("host", "here")


def _verify_name_check(v: str) -> Optional[str]:
    if not v.strip():
        return "must not be empty"
    if any(ord(c) < 32 or 127 <= ord(c) <= 159 for c in v):
        return "must not contain control characters"
    if len(v) > VERIFY_NAME_LIMIT:
        # it stands for the verifier in every line a label is shown in, causes included
        return f"is longer than {VERIFY_NAME_LIMIT} characters"
    return None


#: The longest verifier ``name``: as long as a label cut from its command may be.
VERIFY_NAME_LIMIT = 60

BUILTIN_VERIFY_KEYS: tuple[KeyDecl, ...] = (
    KeyDecl(
        "name",
        (str,),
        where="verify",
        doc="the verifier's name, unique within its task; shown as its label",
        check=_verify_name_check,
    ),
    KeyDecl("model", (str,), where="verify", doc="model for brain/agent verifiers"),
    KeyDecl("budget_usd", NUM, where="verify", doc="cost cap of an agent verifier", check=_nonneg),
    KeyDecl("timeout_s", NUM, where="verify", doc="seconds before the verifier fails", check=_positive),
)


def _baseline_check(v: object) -> Optional[str]:
    return None if isinstance(v, bool) or v == "warn" else 'must be true, false or "warn"'


def _junit_check(v: str) -> Optional[str]:
    if not v.strip():
        return "must not be empty"
    if v.startswith("/") or ".." in v.split("/"):
        return "must be a path inside the worktree (relative, without ..)"
    return None


#: The keys of a ``run`` verifier's baseline and per-test judgement (docs/verifiers.md,
#: "What was already broken"); they go to the verifier's ``extra``, read by ``verify_run``.
RUN_VERIFY_KEYS: tuple[KeyDecl, ...] = (
    KeyDecl(
        "baseline",
        (bool, str),
        where="verify",
        doc='run the verifier once on the base commit first: true (default), false, or "warn"',
        check=_baseline_check,
    ),
    KeyDecl(
        "junit",
        (str,),
        where="verify",
        doc="where the verifier writes a JUnit XML report, relative to the worktree",
        check=_junit_check,
    ),
    KeyDecl(
        "must_pass", (list,), where="verify", doc="tests (pytest node ids) the task must make pass", check=_str_list
    ),
    KeyDecl("flaky_rerun", (bool,), where="verify", doc="re-run a new failure once by name (pytest); default true"),
)

#: The ``[[task]]`` keys of the same feature (also defaults of every task).
RUN_TASK_KEYS: tuple[KeyDecl, ...] = (
    KeyDecl(
        "baseline",
        (bool, str),
        doc="default of the task's run verifiers' baseline: true, false or \"warn\"",
        check=_baseline_check,
    ),
    KeyDecl("removes_tests", (bool,), doc="the task removes tests: a test missing now is not a new failure"),
)

#: The ``[[task]]`` keys that may also be written once as a default of every task: at a
#: tasks file's top level and in the project file's ``[task]`` (docs/tasks-toml.md,
#: "Defaults of every task"). Keys a plugin declares for ``[[task]]`` may be too.
DEFAULT_TASK_KEYS: tuple[str, ...] = (
    "agent",
    "model",
    "permission_mode",
    "allowed_tools",
    "max_retries",
    "timeout_min",
    "stall_timeout_min",
    "budget_usd",
    "requires",
    "git_ref",
    "peer",
    "setup",
    "tags",
    "base",
    "on_conflict",
)

_IDENTITY = "it is a task's identity"
_RELATIVE = "it is a path relative to the file it is written in"
#: The other built-in ``[[task]]`` keys, and why each cannot be a default: what names one
#: task (two tasks with one name, prompt, branch or role would be one task twice), the
#: graph, and paths, which are relative to the file that holds them.
NOT_DEFAULT_KEYS: dict[str, str] = {
    "name": _IDENTITY,
    "prompt": _IDENTITY,
    "branch": _IDENTITY,
    "role": _IDENTITY,
    "depends_on": "it is the task graph",
    "cwd": _RELATIVE,
    "paths": _RELATIVE,
}

_TYPE_NAMES = {
    str: "a string",
    int: "an integer",
    float: "a number",
    list: "a list",
    bool: "true or false",
    dict: "a table",
}


def type_name(types: tuple[type, ...]) -> str:
    """How errors name ``types``: ``a string``, ``a number``, ``a list or a table``."""
    if types == NUM:
        return "a number"
    return " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in types)


def type_ok(value: Any, types: tuple[type, ...]) -> bool:
    """``value`` is one of ``types``; TOML's true is a Python int, never a number here."""
    if isinstance(value, bool) and bool not in types:
        return False
    return isinstance(value, types)


@dataclass
class KeyTable:
    """Every key a tasks file may use: the built-in ones and what plugins declare.

    :ivar missing_kinds: verifier kinds whose plugin is not loaded (blocked with
        ``-p no:NAME``), with why: a verifier using one is an error saying so.
    """

    task: dict[str, KeyDecl]
    verify: dict[str, KeyDecl]
    verify_kinds: dict[str, KeyDecl]
    missing_kinds: dict[str, str] = field(default_factory=dict)

    @classmethod
    def build(cls, extra: Iterable[Iterable[KeyDecl]] = (), missing_kinds: Optional[dict[str, str]] = None) -> KeyTable:
        """The table of the built-in keys and ``extra`` (``fleetrun_task_keys``' answers,
        in hook order: the first declaration of a key wins). Verifier kinds are listed
        in the order their plugins were registered (the reverse of hook order), so
        errors name the built-in ones first: ``run / brain / agent``."""
        table = cls(
            task={k.key: k for k in (*BUILTIN_TASK_KEYS, *RUN_TASK_KEYS)},
            verify={k.key: k for k in (*BUILTIN_VERIFY_KEYS, *RUN_VERIFY_KEYS)},
            verify_kinds={k.key: k for k in BUILTIN_VERIFY_KINDS},
        )
        answers = [list(decls or ()) for decls in extra]
        kinds: dict[str, KeyDecl] = {}
        for decls in reversed(answers):
            for d in decls:
                if d.where == "verify_kind":
                    if d.runs not in RUNS:
                        raise ValueError(f"KeyDecl {d.key!r}: runs must be host or here, not {d.runs!r}")
                    kinds[d.key] = d  # a later (in hook order: earlier) declaration wins, in its first place
        for d in kinds.values():
            table.verify_kinds.setdefault(d.key, d)
        for decls in answers:
            for d in decls:
                target = {"task": table.task, "verify": table.verify}.get(d.where)
                if target is None and d.where != "verify_kind":
                    raise ValueError(f"KeyDecl {d.key!r}: where must be task, verify or verify_kind")
                if target is not None:
                    target.setdefault(d.key, d)
        table.missing_kinds = {k: why for k, why in (missing_kinds or {}).items() if k not in table.verify_kinds}
        return table

    def runs_here(self, kind: str) -> bool:
        """Whether verifiers of ``kind`` run on the supervising machine (``runs="here"``)."""
        d = self.verify_kinds.get(kind)
        return d is not None and d.runs == "here"

    def default_keys(self) -> dict[str, KeyDecl]:
        """The keys that may be a default of every task: :data:`DEFAULT_TASK_KEYS`, then
        every ``[[task]]`` key a plugin declared (a plugin's key has no file of its own
        to be relative to, so nothing keeps it from being one)."""
        builtin = {d.key for d in BUILTIN_TASK_KEYS}
        out = {k: self.task[k] for k in DEFAULT_TASK_KEYS}
        out.update({k: d for k, d in self.task.items() if k not in builtin})
        return out


def key_table(config: Any) -> KeyTable:
    """The run's :class:`KeyTable` (every plugin's ``fleetrun_task_keys`` asked once,
    kept in ``config.stash``): what a plugin asks about a kind, as where it runs."""
    table: Optional[KeyTable] = config.stash.get(KEY_TABLE)
    if table is None:
        table = config.stash[KEY_TABLE] = KeyTable.build(config.hook.fleetrun_task_keys(config=config))
    return table


#: ``config.stash[KEY_TABLE]``: the run's :class:`KeyTable`, made on first use.
KEY_TABLE: StashKey[KeyTable] = StashKey()


# ---------------------------------------------------------------------------------
# Value checks: a [[task]] key, a default of every task, a setup list.

#: The keys of a ``setup`` command written as a table.
SETUP_STEP_KEYS = ("run", "timeout_s")


def suggest(key: str, known: Iterable[str]) -> str:
    """`` (did you mean 'X'?)`` for the closest of ``known``, or ``""``."""
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


class KeyErrors:
    """The mistakes of one file, each a :class:`UsageError` with its line, kept to be
    raised all at once."""

    def __init__(self, display: str) -> None:
        self.display = display
        self.items: list[UsageError] = []

    def add(self, line: int, key: Optional[str], message: str) -> None:
        self.items.append(UsageError(message, file=self.display, line=line, key=key))


def value_problem(decl: KeyDecl, value: Any) -> Optional[str]:
    """What is wrong with ``value`` for ``decl`` (its type, its check), or None. The
    collector asks this of every key of every task, and looks a key's line up only
    when there is a problem to report."""
    types = decl.types
    # TOML's true is a Python int: never a number here (type_ok)
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        return f"must be {type_name(types)}, not {describe_value(value)}"
    if decl.check is not None:
        return decl.check(value) or None
    return None


def check_value(decl: KeyDecl, value: Any, line: int, label: str, errs: KeyErrors) -> bool:
    """``value`` has ``decl``'s type and passes its check; else the mistake is in ``errs``."""
    problem = value_problem(decl, value)
    if problem is not None:
        errs.add(line, label, problem)
        return False
    return True


def collect_setup(value: Any, line: int, label: str, errs: KeyErrors) -> Optional[list[VerifySpec]]:
    """A ``setup`` list: each command a string, or a table ``{run = "...", timeout_s = N}``
    (the keys of a ``run`` verifier). :return: the steps, or None after an error."""
    if not isinstance(value, list):
        errs.add(line, label, f"must be a list of commands, not {describe_value(value)}")
        return None
    n_before = len(errs.items)
    steps: list[VerifySpec] = []
    for k, item in enumerate(value, 1):
        where = f"{label} #{k}"
        timeout: Any = DEFAULT_SETUP_TIMEOUT_S
        if isinstance(item, dict):
            for key in item:
                if key not in SETUP_STEP_KEYS:
                    errs.add(line, f"{where}: {key}", f"unknown key{suggest(key, SETUP_STEP_KEYS)}")
            if "run" not in item:
                errs.add(line, where, 'needs run = "command"')
                continue
            if "timeout_s" in item:
                timeout = item["timeout_s"]
                if not type_ok(timeout, NUM):
                    errs.add(line, f"{where}: timeout_s", f"must be a number, not {describe_value(timeout)}")
                    continue
                if not timeout > 0:
                    errs.add(line, f"{where}: timeout_s", "must be greater than 0")
                    continue
            item = item["run"]
            where = f"{where}: run"
        if not isinstance(item, str):
            errs.add(
                line,
                where,
                f"must be a command string or a table {{run = ..., timeout_s = ...}}, not {describe_value(item)}",
            )
            continue
        if not item.strip():
            errs.add(line, where, "must not be empty")
            continue
        steps.append(VerifySpec(kind="run", text=item, timeout_s=float(timeout), extra={"setup": k}, line=line))
    return steps if len(errs.items) == n_before else None

"""Meta-tests, datasette-style: every hook in fleetrun/hookspec.py is documented in
its docstring and in docs/plugins.md, is called by fleetrun or implemented by a
built-in plugin, and appears in at least one test.

A failure lists every hook that is missing something, so it can be fixed in one go.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import re
from pathlib import Path
from typing import Any

import pytest

from fleetrun.pluginmanager import BUILTIN_PLUGINS, TOO_LATE_FOR_FLEETCONF

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "fleetrun"
TESTS = REPO / "tests"
PLUGINS_DOC = REPO / "docs" / "plugins.md"

HOOKSPEC = importlib.import_module("fleetrun.hookspec")  # fleetrun.hookspec is the marker


def hookspecs() -> dict[str, Any]:
    return {
        name: fn for name, fn in vars(HOOKSPEC).items() if name.startswith("fleetrun_") and hasattr(fn, "fleetrun_spec")
    }


def spec_opts(name: str) -> dict[str, Any]:
    return dict(hookspecs()[name].fleetrun_spec)


def args(name: str) -> list[str]:
    return list(inspect.signature(hookspecs()[name]).parameters)


def word(name: str) -> re.Pattern[str]:
    return re.compile(rf"\b{re.escape(name)}\b")


def builtin_plugin_files() -> list[Path]:
    files = []
    for modname in BUILTIN_PLUGINS.values():
        spec = importlib.util.find_spec(modname)
        if spec is not None and spec.origin:
            files.append(Path(spec.origin))
    return files


def test_there_are_hooks() -> None:
    assert len(hookspecs()) >= 20
    assert not [n for n in vars(HOOKSPEC) if n.startswith("fleetrun_") and n not in hookspecs()], (
        "a fleetrun_* function in hookspec.py without @hookspec"
    )


def test_every_hook_has_a_docstring() -> None:
    missing = [name for name, fn in hookspecs().items() if len((inspect.getdoc(fn) or "").strip()) < 20]
    assert not missing, f"hooks without a docstring in fleetrun/hookspec.py: {missing}"


def test_firstresult_hooks_say_so() -> None:
    """STYLE.md: each docstring says whether the hook stops at the first non-None result."""
    wrong = []
    for name, fn in hookspecs().items():
        doc = " ".join((inspect.getdoc(fn) or "").split())
        says_first = bool(re.search(r"[Ss]tops at the first non-None", doc))
        if says_first != bool(spec_opts(name)["firstresult"]):
            wrong.append(name)
    assert not wrong, (
        "hooks whose docstring says 'Stops at the first non-None' when they are not "
        f"firstresult, or the other way round: {wrong}"
    )


#: Hooks whose docstrings the helpers ``hostapi`` and ``placeext`` rewrite in the same
#: refactor (issue 12: hosts and starting an attempt become hooks, placement gets its
#: extension hooks), so the docstring rules below would only make them edit the same
#: lines twice. The coordinator empties this set once those branches are merged; the
#: rules then hold for every hook.
PENDING: frozenset[str] = frozenset()

FIRSTRESULT_LINE = "firstresult: stops at the first non-None result."
CONCATENATED = "Results are concatenated."
IGNORED = "return value ignored."
FLEETCONF_LINE = re.compile(r"^May be implemented in a ``fleetconf\.py``: (yes|no)\b", re.M)


def held_to_the_rules() -> dict[str, Any]:
    return {name: fn for name, fn in hookspecs().items() if name not in PENDING}


def doc(fn: Any) -> str:
    return inspect.getdoc(fn) or ""


def test_pending_names_hooks() -> None:
    """A name left in PENDING after a hook is renamed or removed would hide nothing."""
    assert not PENDING - set(hookspecs()), sorted(PENDING - set(hookspecs()))


def test_every_argument_has_a_param_line() -> None:
    """STYLE.md: each spec's docstring says each parameter, as ``:param NAME:``, and
    names no parameter the hook does not have."""
    wrong = []
    for name, fn in held_to_the_rules().items():
        documented = re.findall(r"^:param (\w+):", doc(fn), re.M)
        if sorted(documented) != sorted(args(name)):
            wrong.append(f"{name}: arguments {args(name)}, :param lines {documented}")
    assert not wrong, "\n".join(wrong)


def test_every_hook_says_what_it_returns() -> None:
    missing = [name for name, fn in held_to_the_rules().items() if not re.search(r"^:return:", doc(fn), re.M)]
    assert not missing, f"hooks without a :return: line: {missing}"


def test_every_hook_says_how_its_results_combine() -> None:
    """A firstresult hook says ``firstresult: stops at the first non-None result.``; any
    other one that returns something says its results are concatenated, and one that
    returns None that its return value is ignored."""
    wrong = []
    for name, fn in held_to_the_rules().items():
        text = " ".join(doc(fn).split())
        returns = inspect.signature(fn).return_annotation
        if spec_opts(name)["firstresult"]:
            expected = FIRSTRESULT_LINE
        else:
            expected = IGNORED if returns in (None, "None") else CONCATENATED
        if expected not in text or (FIRSTRESULT_LINE in text) != (expected == FIRSTRESULT_LINE):
            wrong.append(f"{name}: should say {expected!r}")
    assert not wrong, "\n".join(wrong)


def test_every_hook_says_whether_a_fleetconf_may_implement_it() -> None:
    """A line ``May be implemented in a ``fleetconf.py``: yes|no (why)``; the hooks that
    say no are exactly those the plugin manager refuses in a fleetconf.py."""
    missing, refused = [], set()
    for name, fn in held_to_the_rules().items():
        m = FLEETCONF_LINE.search(doc(fn))
        if m is None:
            missing.append(name)
        elif m.group(1) == "no":
            refused.add(name)
    assert not missing, f"hooks that do not say whether a fleetconf.py may implement them: {missing}"
    assert refused == set(TOO_LATE_FOR_FLEETCONF), (
        f"docstrings say no for {sorted(refused)}, the plugin manager refuses {sorted(TOO_LATE_FOR_FLEETCONF)}"
    )


def test_every_hook_is_in_the_plugin_docs() -> None:
    text = PLUGINS_DOC.read_text()
    missing = [name for name in hookspecs() if not word(name).search(text)]
    assert not missing, f"hooks not mentioned in docs/plugins.md: {missing}"


def test_plugin_docs_give_every_hooks_arguments() -> None:
    """docs/plugins.md writes each hook as ``fleetrun_NAME(arg, ...)`` with the spec's arguments."""
    text = PLUGINS_DOC.read_text()
    wrong = [
        f"{name}({', '.join(args(name))})" for name in hookspecs() if f"{name}({', '.join(args(name))})" not in text
    ]
    assert not wrong, f"docs/plugins.md lacks these signatures (or has outdated ones): {wrong}"


def test_plugin_docs_mark_firstresult_and_historic() -> None:
    """Each hook's entry in docs/plugins.md says ``firstresult``/``historic`` exactly when it is."""
    text = PLUGINS_DOC.read_text()
    wrong = []
    for name in hookspecs():
        sig = f"{name}({', '.join(args(name))})"
        line = next((ln for ln in text.splitlines() if sig in ln), "")
        opts = spec_opts(name)
        for flag in ("firstresult", "historic"):
            if (flag in line) != bool(opts[flag]):
                wrong.append(f"{name}: {flag}")
    assert not wrong, f"docs/plugins.md gets these flags wrong on the hook's line: {wrong}"


def test_every_hook_is_called_or_implemented_by_fleetrun() -> None:
    """A hook nothing calls and no built-in implements is dead weight (STYLE.md: a new
    hook comes only with a real consumer)."""
    sources = {p: p.read_text() for p in PACKAGE.rglob("*.py")}
    builtins = "\n".join(p.read_text() for p in builtin_plugin_files())
    missing = []
    for name in hookspecs():
        # called, or handed to the ledger to call after its commit (``partial(hook.NAME, ...)``)
        called = any(re.search(rf"hook\.{name}(\(|\.call|,)", src) for src in sources.values())
        implemented = re.search(rf"def {name}\(", builtins)
        if not (called or implemented):
            missing.append(name)
    assert not missing, f"hooks neither called in fleetrun/ nor implemented by a built-in plugin: {missing}"


def test_every_hook_appears_in_a_test() -> None:
    """Grep, as datasette does: a hook's name in a test file under tests/ (this file
    does not count: it names no hook itself)."""
    here = Path(__file__).resolve()
    texts = {p: p.read_text() for p in TESTS.rglob("*.py") if p.resolve() != here}
    missing = [name for name in hookspecs() if not any(word(name).search(t) for t in texts.values())]
    if missing:
        pytest.fail(f"{len(missing)} hook(s) appear in no test under tests/: {', '.join(missing)}", pytrace=False)


def doc_section(heading: str) -> str:
    """The text of docs/plugins.md under ``heading`` (a whole heading line), up to the
    next heading."""
    lines = PLUGINS_DOC.read_text().splitlines()
    assert heading in lines, f"docs/plugins.md has no heading {heading!r}"
    out = []
    for line in lines[lines.index(heading) + 1 :]:
        if line.startswith("#"):
            break
        out.append(line)
    return "\n".join(out)


def table_fields(section: str) -> list[str]:
    """The names in the first cell of each row of the section's table, in order
    (a row may name several: ``| `started`, `ended` | ...``)."""
    names: list[str] = []
    for line in section.splitlines():
        if line.startswith("| `"):
            names.extend(re.findall(r"`(\w+)(?:\(\))?`", line.split("|")[1]))
    return names


@pytest.mark.parametrize(
    ("heading", "cls"),
    [
        ("### `Attempt`", "fleetrun.ledger.Attempt"),
        ("### `Candidate`", "fleetrun.reports.Candidate"),
    ],
)
def test_plugin_docs_list_every_field(heading: str, cls: str) -> None:
    """The field tables of docs/plugins.md are the dataclasses' fields, in order: a
    field added, renamed or removed in the code shows here."""
    modname, _, name = cls.rpartition(".")
    klass = getattr(importlib.import_module(modname), name)
    assert table_fields(doc_section(heading)) == [f.name for f in dataclasses.fields(klass)]


@pytest.mark.parametrize(
    ("heading", "classes"),
    [
        (
            "### The `policy` of `fleetrun_place`",
            ["fleetrun.policy.Policy", "fleetrun.policy.LocalPolicy", "fleetrun.policy.PeerPolicy"],
        ),
        ("### `VerifySpec` and the verifier's handle", ["fleetrun.taskspec.VerifySpec"]),
    ],
)
def test_plugin_docs_name_every_field(heading: str, classes: list[str]) -> None:
    section = doc_section(heading)
    missing = []
    for cls in classes:
        modname, _, name = cls.rpartition(".")
        for f in dataclasses.fields(getattr(importlib.import_module(modname), name)):
            if f"`{f.name}`" not in section:
                missing.append(f"{name}.{f.name}")
    assert not missing, f"{heading} in docs/plugins.md does not name {missing}"


def test_plugin_docs_give_the_verify_handles_methods() -> None:
    """The Protocol's methods (``poll``, ``cancel``) and the optional ``fileno`` and
    ``next_deadline`` the loop sleeps on between passes."""
    from fleetrun.reports import Cancellable, HasDeadline, Selectable, VerifyHandle

    section = doc_section("### `VerifySpec` and the verifier's handle")
    protocol = {
        n
        for proto in (VerifyHandle, Cancellable, Selectable, HasDeadline)
        for n in vars(proto)
        if not n.startswith("_") and callable(getattr(proto, n))
    }
    assert set(table_fields(section)) == protocol

"""Meta-tests, datasette-style: every hook in fleetrun/hookspec.py is documented in
its docstring and in docs/plugins.md, is called by fleetrun or implemented by a
built-in plugin, and appears in at least one test.

A failure lists every hook that is missing something, so it can be fixed in one go.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
from pathlib import Path
from typing import Any

import pytest

from fleetrun.pluginmanager import BUILTIN_PLUGINS

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "fleetrun"
TESTS = REPO / "tests"
PLUGINS_DOC = REPO / "docs" / "plugins.md"

HOOKSPEC = importlib.import_module("fleetrun.hookspec")  # fleetrun.hookspec is the marker


def hookspecs() -> dict[str, Any]:
    return {name: fn for name, fn in vars(HOOKSPEC).items()
            if name.startswith("fleetrun_") and hasattr(fn, "fleetrun_spec")}


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
    assert not [n for n in vars(HOOKSPEC) if n.startswith("fleetrun_") and n not in hookspecs()], \
        "a fleetrun_* function in hookspec.py without @hookspec"


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
    assert not wrong, ("hooks whose docstring says 'Stops at the first non-None' when they are not "
                       f"firstresult, or the other way round: {wrong}")


def test_every_hook_is_in_the_plugin_docs() -> None:
    text = PLUGINS_DOC.read_text()
    missing = [name for name in hookspecs() if not word(name).search(text)]
    assert not missing, f"hooks not mentioned in docs/plugins.md: {missing}"


def test_plugin_docs_give_every_hooks_arguments() -> None:
    """docs/plugins.md writes each hook as ``fleetrun_NAME(arg, ...)`` with the spec's arguments."""
    text = PLUGINS_DOC.read_text()
    wrong = [f"{name}({', '.join(args(name))})" for name in hookspecs()
             if f"{name}({', '.join(args(name))})" not in text]
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
        called = any(re.search(rf"hook\.{name}(\(|\.call)", src) for src in sources.values())
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

"""Which way fleetrun's imports run (docs/architecture.md, DESIGN "Which way the imports run").

Every module of the package is parsed (never imported), and every import it makes is
collected, function-level (lazy) ones included: a lazy import that closes a cycle hides
the cycle, it does not remove it. Imports under ``if TYPE_CHECKING:`` are left out:
they never run.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Iterator, Optional

import pytest

import fleetrun
from fleetrun.pluginmanager import BUILTIN_PLUGINS

PACKAGE_DIR = Path(fleetrun.__file__).resolve().parent

#: Cycles through the relay's modules, which issue 12 moves into
#: ``fleetrun/plugins/relay/`` (a separate change): each is a cycle as printed below,
#: starting at its alphabetically first module. Emptied once the move is merged.
KNOWN_RELAY_CYCLES: set[str] = set()

#: Modules that import a built-in plugin module today, as (importer, imported). Issue 12:
#: the core knows plugins only by name and through hooks, and a plugin reaches another
#: through ``config.pluginmanager.get_plugin(name)``; these are left to be rewritten.
KNOWN_PLUGIN_IMPORTS: set[tuple[str, str]] = {}


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE_DIR.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE_DIR.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk_runtime(node: ast.AST) -> Iterator[ast.AST]:
    """Every node below ``node`` except the bodies of ``if TYPE_CHECKING:`` (their
    ``else:`` runs, so it stays)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for other in child.orelse:
                yield other
                yield from _walk_runtime(other)
            continue
        yield child
        yield from _walk_runtime(child)


def _resolve(modname: str, is_package: bool, level: int, target: Optional[str]) -> str:
    base = modname.split(".")
    if not is_package:
        base = base[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def imports_of(modname: str, path: Path, known: set[str]) -> set[str]:
    """The fleetrun modules ``modname`` imports at run time, lazily or not.

    ``from . import x`` counts as an import of ``fleetrun.x`` when that is a module,
    else of the package; ``import fleetrun.a.b`` imports ``fleetrun.a.b`` (and, as
    Python does, its parent packages, which are left out here: a package's
    ``__init__`` importing its own submodules is not a cycle worth reporting).
    """
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in _walk_runtime(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "fleetrun":
                    out.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = _resolve(modname, is_package, node.level, node.module)
            else:
                base = node.module or ""
            if base.split(".")[0] != "fleetrun":
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                out.add(sub if sub in known else base)
    # call-site imports by name (``importlib.import_module("fleetrun.hookspec")``)
    for node in _walk_runtime(tree):
        if (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and (
                getattr(node.func, "attr", None) == "import_module" or getattr(node.func, "id", None) == "import_module"
            )
        ):
            name = node.args[0].value
            if name in known:
                out.add(name)
    out.discard(modname)
    return {m for m in out if m in known}


def import_graph() -> dict[str, set[str]]:
    mods = all_modules()
    known = set(mods)
    return {m: imports_of(m, p, known) for m, p in mods.items()}


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The cycles of ``graph``, each as ``[a, b, ..., a]`` from its alphabetically first
    module: the strongly connected components (Tarjan), and in each, for every module
    and every import it makes inside the component, the shortest way back. That names
    every import that closes a cycle, without listing all elementary cycles (there can
    be exponentially many)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    sccs: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    cycles = []
    for comp in sccs:
        members = set(comp)
        # every cycle in the component, one per edge out of the start that closes back
        for start in comp:
            for first in sorted(graph[start] & members):
                path = _shortest(graph, first, start, members)
                if path is not None:
                    cycles.append([start, *path])
    seen: set[frozenset[tuple[str, str]]] = set()
    unique = []
    for c in cycles:
        edges = frozenset(zip(c, c[1:]))
        if edges not in seen:
            seen.add(edges)
            unique.append(_rotate(c))
    return sorted(unique)


def _shortest(graph: dict[str, set[str]], src: str, dst: str, members: set[str]) -> Optional[list[str]]:
    from collections import deque

    prev: dict[str, Optional[str]] = {src: None}
    todo = deque([src])
    while todo:
        v = todo.popleft()
        if v == dst:
            path = [v]
            while prev[path[-1]] is not None:
                path.append(prev[path[-1]])  # type: ignore[arg-type]
            return list(reversed(path))
        for w in sorted(graph[v] & members):
            if w not in prev:
                prev[w] = v
                todo.append(w)
    return None


def _rotate(cycle: list[str]) -> list[str]:
    """``[a, b, c, a]`` starting at its alphabetically first module."""
    ring = cycle[:-1]
    i = ring.index(min(ring))
    ring = ring[i:] + ring[:i]
    return [*ring, ring[0]]


def show(cycle: list[str]) -> str:
    return " -> ".join(m.removeprefix("fleetrun.") for m in cycle)


def is_core(mod: str) -> bool:
    """``fleetrun/*.py``: a module directly in the package, not under ``plugins/``."""
    return mod.count(".") == 1


PLUGIN_MODULES = set(BUILTIN_PLUGINS.values())


def plugin_of(mod: str) -> Optional[str]:
    """The built-in plugin ``mod`` is part of: the plugin's module, or a module inside
    the plugin's package (``fleetrun.plugins.relay.wire``); None for the rest."""
    for plugin in PLUGIN_MODULES:
        if mod == plugin or mod.startswith(plugin + "."):
            return plugin
    return None


# ---------------------------------------------------------------------------------


def test_the_graph_sees_lazy_imports_and_skips_type_checking(tmp_path: Path) -> None:
    """The parser itself: a function-level import counts, a TYPE_CHECKING one does not,
    relative imports resolve against the module's package."""
    src = (
        "from __future__ import annotations\n"
        "from typing import TYPE_CHECKING\n"
        "from . import a\n"
        "if TYPE_CHECKING:\n"
        "    from .b import B\n"
        "else:\n"
        "    from .c import C\n"
        "def f():\n"
        "    from .plugins import d\n"
        "    import fleetrun.e\n"
        "    from ..outside import x\n"
    )
    path = tmp_path / "m.py"
    path.write_text(src)
    known = {f"fleetrun.{n}" for n in ("a", "b", "c", "e", "plugins", "plugins.d", "m")}
    assert imports_of("fleetrun.m", path, known) == {"fleetrun.a", "fleetrun.c", "fleetrun.plugins.d", "fleetrun.e"}
    assert find_cycles({"x": {"y"}, "y": {"x", "z"}, "z": set()}) == [["x", "y", "x"]]


def test_no_import_cycles() -> None:
    """No module of fleetrun imports, directly or through others, itself."""
    cycles = [show(c) for c in find_cycles(import_graph())]
    new = [c for c in cycles if c not in KNOWN_RELAY_CYCLES]
    assert not new, "import cycles (lazy imports included):\n" + "\n".join(new)
    gone = KNOWN_RELAY_CYCLES - set(cycles)
    assert not gone, "no longer cycles; take them out of KNOWN_RELAY_CYCLES:\n" + "\n".join(sorted(gone))


def test_the_core_never_imports_the_cli() -> None:
    """The CLI imports the core, never the reverse: only ``cli`` imports ``commands``,
    and nothing but the entry points (``__main__``, the package's ``main``, the
    ``fleeter`` test harness) imports ``cli``."""
    graph = import_graph()
    allowed = {
        "fleetrun.cli": {"fleetrun.commands"},
        "fleetrun.__main__": {"fleetrun.cli"},
        # ``fleetrun.main`` is the public entry point, exported lazily
        "fleetrun": {"fleetrun.cli"},
        # the test harness drives the CLI as a user does (pytester and ``pytest.main``);
        # nothing in fleetrun imports it
        "fleetrun.fleeter": {"fleetrun.cli"},
    }
    bad = []
    for mod, deps in sorted(graph.items()):
        for cli_mod in ("fleetrun.cli", "fleetrun.commands"):
            if cli_mod in deps and cli_mod not in allowed.get(mod, set()):
                bad.append(f"{mod} imports {cli_mod}")
    assert not bad, "\n".join(bad)


def test_no_module_imports_a_builtin_plugin() -> None:
    """The core knows built-in plugins by name (the plugin manager's list) and through
    hooks; a plugin never imports another plugin."""
    graph = import_graph()
    bad = []
    for mod, deps in sorted(graph.items()):
        for dep in sorted(deps):
            plugin = plugin_of(dep)
            if plugin is None or plugin_of(mod) == plugin:  # a plugin package uses its own parts
                continue
            if (mod, dep) not in KNOWN_PLUGIN_IMPORTS:
                bad.append(f"{mod} imports {dep}")
    assert not bad, "\n".join(bad)
    stale = {f"{a} -> {b}" for a, b in KNOWN_PLUGIN_IMPORTS if b not in graph.get(a, set())}
    assert not stale, "take these out of KNOWN_PLUGIN_IMPORTS: " + ", ".join(sorted(stale))


@pytest.mark.parametrize("mod", ["fleetrun.ledger"])
def test_the_ledger_imports_no_loop_plugin_or_cli(mod: str) -> None:
    graph = import_graph()
    seen: set[str] = set()
    todo = [mod]
    while todo:  # everything the ledger pulls in, transitively
        m = todo.pop()
        for d in graph.get(m, ()):
            if d not in seen:
                seen.add(d)
                todo.append(d)
    forbidden = {m for m in seen if m in ("fleetrun.loop", "fleetrun.cli", "fleetrun.commands") or plugin_of(m)}
    assert not forbidden, sorted(forbidden)


# ---------------------------------------------------------------------------------
# The core names no plugin (issue 23 item 4)

#: The table of the built-ins (``builtin_plugins.py``: their modules, verbs, fast paths,
#: the hosts and keys they provide) and the plugin manager that loads them are where the
#: core names them, and the only places: ``-p no:NAME`` and ``--version`` need them.
NAMING_ALLOWED = {"fleetrun.pluginmanager", "fleetrun.builtin_plugins"}

#: The built-ins' registered names.
PLUGIN_NAMES = {n for n, m in BUILTIN_PLUGINS.items() if m.startswith("fleetrun.plugins.")}
#: Built-in names that are also words of the core's own, so a string starting with one
#: (``shepherd_pid``, ``worktree_tampered``) or a dict key equal to one (``local`` in
#: policy.toml, ``prompt`` in a task table) names no plugin: the host ``local``, the task
#: key ``prompt``, the core's shepherd, git's worktree, the default agent ``claude``, the
#: spec's ``notify``, the core's placement, terminal, events. A *lookup* by one
#: (``get_plugin("local")``) and a message naming one (``-p no:local``) still count.
CORE_WORDS = {"local", "prompt", "shepherd", "worktree", "claude", "notify", "placement", "terminal", "events"}
#: The plugin manager's lookups by name: a plugin reached by name, not through a hook.
PM_LOOKUPS = {"get_plugin", "is_blocked", "set_blocked", "has_plugin", "unregister"}

_NAMES = "|".join(sorted(PLUGIN_NAMES, key=len, reverse=True))
_SAYS = re.compile(rf"\bno:({_NAMES})\b|\bthe ({_NAMES}) plugin\b")
_PREFIX = re.compile(rf"^({'|'.join(sorted(PLUGIN_NAMES - CORE_WORDS, key=len, reverse=True))})_[a-z]")

#: What the core still names, as (module, what) — each is a finding of issue 23 left
#: for later, and the test fails once one is gone (take it out) or a new one comes:
KNOWN_CORE_NAMES: set[tuple[str, str]] = set()


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes (documentation may name a plugin: it is prose)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def plugin_names_in(mod: str, source: str) -> set[tuple[str, str]]:
    """How the module ``mod`` names a built-in plugin: a module path in a string
    (``fleetrun.plugins.relay``), a plugin manager lookup by a literal name
    (``get_plugin("events")``), a message naming one (``-p no:relay``, ``the mailbox
    plugin``), a string made of a plugin's name (``mailbox_failed``) or a dict keyed by
    one (``{"relay": ...}``). Comments and docstrings are prose and do not count."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    found: set[tuple[str, str]] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in PM_LOOKUPS:
            for a in [*node.args, *(k.value for k in node.keywords)]:
                if isinstance(a, ast.Constant) and isinstance(a.value, str):
                    found.add((mod, f"{node.func.attr}({a.value!r})"))
        elif isinstance(node, ast.Dict):
            for k in node.keys:
                if isinstance(k, ast.Constant) and k.value in PLUGIN_NAMES - CORE_WORDS:
                    found.add((mod, f"dict key {k.value!r}"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            v = node.value
            if "fleetrun.plugins" in v:
                found.add((mod, f"module path {v!r}"))
            for m in _SAYS.finditer(v):
                found.add((mod, f"says {m.group(0)!r}"))
            if _PREFIX.match(v):
                found.add((mod, f"string {v!r}"))
    return found


def test_the_check_finds_each_way_of_naming_a_plugin() -> None:
    src = (
        '"""The relay plugin, in a docstring: prose."""\n'
        "import x\n"
        'A = "fleetrun.plugins.relay.peer"\n'
        'B = pm.get_plugin("events")\n'
        'C = "the mailbox plugin is blocked (-p no:mailbox)"\n'
        'D = "mailbox_failed"\n'
        'E = {"relay": 1, "local": 2}\n'
        'F = "shepherd_pid"  # a word of the core\n'
        "G = pm.get_plugin(name)\n"
    )
    assert plugin_names_in("m", src) == {
        ("m", "module path 'fleetrun.plugins.relay.peer'"),
        ("m", "get_plugin('events')"),
        ("m", "says 'the mailbox plugin'"),
        ("m", "says 'no:mailbox'"),
        ("m", "string 'mailbox_failed'"),
        ("m", "dict key 'relay'"),
    }


def test_the_core_names_no_builtin_plugin() -> None:
    """Issue 23: a core module (``fleetrun/*.py``; not ``plugins/`` nor ``testing/``)
    neither imports a built-in plugin (``test_no_module_imports_a_builtin_plugin``) nor
    names one: a plugin is reached through hooks (``fleetrun_addhooks`` for its own) and
    typed declarations (``KeyDecl.runs``, ``PURE_PLACEMENT``, ``SHARED_TRANSITION_LOG``),
    not looked up, and its reasons are its own. Only the plugin manager's list of the
    built-ins names them (:data:`NAMING_ALLOWED`)."""
    found: set[tuple[str, str]] = set()
    for mod, path in all_modules().items():
        if is_core(mod) and mod not in NAMING_ALLOWED:
            found |= plugin_names_in(mod, path.read_text())
    new = sorted(found - KNOWN_CORE_NAMES)
    assert not new, "the core names a built-in plugin:\n" + "\n".join(f"{m}: {w}" for m, w in new)
    gone = sorted(KNOWN_CORE_NAMES - found)
    assert not gone, "no longer named; take them out of KNOWN_CORE_NAMES:\n" + "\n".join(f"{m}: {w}" for m, w in gone)

"""Collection: tasks.toml -> TaskSpec, line mapping, the graph checks, and a fuzz test
that no mangled tasks file makes ``fleetrun validate`` crash."""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetrun.collect import (
    BUILTIN_TASK_KEYS,
    BUILTIN_VERIFY_KEYS,
    BUILTIN_VERIFY_KINDS,
    GraphNode,
    KeyTable,
    TaskFile,
    check_graph,
    collect_toml,
    map_lines,
)
from fleetrun.exceptions import UsageError, UsageErrors
from fleetrun.plugins import verify_agent, verify_brain, verify_run
from fleetrun.taskspec import KeyDecl, TaskSpec, ref_problem

# When a @given test fails, hypothesis' pytest plugin imports hypothesis.extra._patching
# (libcst), which here emits a DeprecationWarning (mypy_extensions.TypedDict); with
# warnings as errors that hides the falsifying example behind an INTERNALERROR. Import it
# once now, with that warning silenced.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    try:
        import hypothesis.extra._patching  # noqa: F401
    except ImportError:  # pragma: no cover - libcst not installed
        pass


def builtin_keys() -> KeyTable:
    """The keys of a run with the built-in plugins: the verifier kinds are theirs
    (passed in hook order, the reverse of registration)."""
    return KeyTable.build([p.fleetrun_task_keys(config=None) for p in (verify_agent, verify_brain, verify_run)])


#: The verifier kinds the built-in plugins declare.
PLUGIN_KINDS = tuple(builtin_keys().verify_kinds.values())


def collect(tmp_path: Path, text: str, keys: KeyTable | None = None) -> TaskFile:
    p = tmp_path / "tasks.toml"
    p.write_text(text)
    return collect_toml(p, keys or builtin_keys(), "tasks.toml")


def errors(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(UsageError) as info:
        collect(tmp_path, text)
    e = info.value
    return [x.format() for x in e.errors] if isinstance(e, UsageErrors) else [e.format()]


# ---------------------------------------------------------------------------------
# defaults and values


def test_defaults(tmp_path: Path) -> None:
    tf = collect(tmp_path, '[[task]]\nname = "a"\nprompt = "do it"\n\n  [[task.verify]]\n  run = "make test"\n')
    (t,) = tf.tasks
    assert t.name == "a"
    assert t.prompt == "do it"
    assert t.cwd == str(tmp_path.resolve())
    assert t.source == str(tmp_path / "tasks.toml")
    assert t.line == 1
    assert t.max_retries == 2
    assert t.timeout_min == 60.0
    assert t.stall_timeout_min == 20.0
    assert t.agent == "claude"
    assert (t.git_ref, t.branch, t.model, t.permission_mode, t.allowed_tools, t.budget_usd, t.role, t.peer) == (
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
    )
    assert (t.depends_on, t.paths, t.requires, t.extra) == ([], [], [], {})
    (v,) = t.verify
    assert (v.kind, v.text, v.timeout_s, v.model, v.budget_usd, v.line, v.extra) == (
        "run",
        "make test",
        900.0,
        None,
        None,
        5,
        {},
    )


def test_values(tmp_path: Path) -> None:
    (tmp_path / "repo").mkdir()
    tf = collect(
        tmp_path,
        """
[[task]]
name = "b"
prompt = "p"

[[task]]
name = "a"
prompt = "p"
cwd = "repo"
git_ref = "main"
branch = "fleet/a"
depends_on = ["b"]
max_retries = 0
timeout_min = 5
model = "opus"
permission_mode = "plan"
allowed_tools = ["Read"]
budget_usd = 3
stall_timeout_min = 2.5
agent = "codex"
role = "backend"
paths = ["src"]
requires = ["gpu"]
peer = "mini"

  [[task.verify]]
  agent = "review it"
  model = "sonnet"
  budget_usd = 1
  timeout_s = 60
""".lstrip(),
    )
    a = tf.tasks[1]
    assert a.cwd == str((tmp_path / "repo").resolve())
    assert a.line == 5
    assert (a.git_ref, a.branch, a.depends_on, a.max_retries) == ("main", "fleet/a", ["b"], 0)
    assert isinstance(a.timeout_min, float) and a.timeout_min == 5.0
    assert isinstance(a.budget_usd, float) and a.budget_usd == 3.0
    assert (a.model, a.permission_mode, a.allowed_tools, a.stall_timeout_min) == ("opus", "plan", ["Read"], 2.5)
    assert (a.agent, a.role, a.paths, a.requires, a.peer) == ("codex", "backend", ["src"], ["gpu"], "mini")
    (v,) = a.verify
    assert (v.kind, v.text, v.model, v.budget_usd, v.timeout_s, v.line) == (
        "agent",
        "review it",
        "sonnet",
        1.0,
        60.0,
        25,
    )


def test_spec_json_roundtrip(tmp_path: Path) -> None:
    (t,) = collect(tmp_path, '[[task]]\nname = "a"\nprompt = "p"\n[[task.verify]]\nbrain = "ok?"\n').tasks
    assert TaskSpec.from_json(t.to_json()) == t


def test_a_verifier_name_round_trips_and_unknown_verifier_keys_are_left_out(tmp_path: Path) -> None:
    """A verifier's ``name`` is kept in the ledger's JSON; a key a newer fleetrun wrote
    there (a ledger, a supervisor's request to a peer) is left out, as a task's is."""
    (t,) = collect(
        tmp_path, '[[task]]\nname = "a"\nprompt = "p"\n[[task.verify]]\nname = "unit"\nrun = "pytest -q"\n'
    ).tasks
    assert t.verify[0].name == "unit" and t.verify[0].label == "unit"
    data = t.to_json()
    assert TaskSpec.from_json(data) == t
    data["verify"][0]["later_key"] = 1
    assert TaskSpec.from_json(data) == t


def test_settings_kept(tmp_path: Path) -> None:
    tf = collect(tmp_path, '[agents.x]\ncommand = ["x"]\n[brain]\nmodel = "m"\n[[task]]\nname = "a"\nprompt = "p"\n')
    assert tf.settings == {"agents": {"x": {"command": ["x"]}}, "brain": {"model": "m"}}


def test_partial_graph_on_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageErrors) as info:
        collect(tmp_path, '[[task]]\nname = "a"\nprompt = "p"\nmax_retries = -1\ndepends_on = ["b"]\n')
    partial = info.value.partial  # type: ignore[attr-defined]
    assert partial.tasks == []
    assert [(n.name, n.depends_on, n.name_line, n.deps_line) for n in partial.graph] == [("a", ["b"], 2, 5)]


def test_single_error_is_still_usage_errors(tmp_path: Path) -> None:
    assert errors(tmp_path, '[[task]]\nname = "a"\n') == [
        "ERROR: tasks.toml:1: task 'a': prompt: missing (every [[task]] needs name and prompt)"
    ]


def test_toml_error_at_end_of_document(tmp_path: Path) -> None:
    out = errors(tmp_path, '[[task]]\nname = "a"\nprompt = """\nnever closed\n')
    assert len(out) == 1
    assert re.fullmatch(r"ERROR: tasks\.toml:\d+: invalid TOML: .+", out[0])


# ---------------------------------------------------------------------------------
# line mapping


def test_map_lines() -> None:
    text = """
# comment
[agents.codex]
command = ["x"]

[[task]]
name = "a"
prompt = \"\"\"
name = "not a key"
\"\"\"
depends_on = [
  "b",
]
"quoted" = 1
dotted.key = 2

  [[ task.verify ]]
  run = "x"

  [[task.verify]]
  brain = "y"

[[task]]
name = "b"
[task.sub]
x = 1
""".lstrip("\n")
    m = map_lines(text)
    assert m.get("top", "agents") == 2
    assert m.get("task", 0) == 5
    assert m.get("task", 0, "name") == 6
    assert m.get("task", 0, "prompt") == 7
    assert m.get("task", 0, "depends_on") == 10
    assert m.get("task", 0, "quoted") == 13
    assert m.get("task", 0, "dotted") == 14
    assert m.get("task", 0, "verify", 0) == 16
    assert m.get("task", 0, "verify", 0, "run") == 17
    assert m.get("task", 0, "verify", 1, "brain") == 20
    assert m.get("task", 1, "name") == 23
    assert m.get("task", 1, "table", "sub") == 24
    # unknown locations fall back outward, then to the default
    assert m.get("task", 1, "nothing") == 22
    assert m.get("task", 9, "x") == 1
    assert m.get("task", 9, default=7) == 7


# ---------------------------------------------------------------------------------
# keys


def test_builtin_keys_are_documented() -> None:
    from fleetrun.taskkeys import RUN_TASK_KEYS, RUN_VERIFY_KEYS

    every = (
        *BUILTIN_TASK_KEYS,
        *BUILTIN_VERIFY_KEYS,
        *BUILTIN_VERIFY_KINDS,
        *PLUGIN_KINDS,
        *RUN_TASK_KEYS,
        *RUN_VERIFY_KEYS,
    )
    for d in every:
        assert d.doc, d.key
    doc = Path(__file__).resolve().parent.parent / "docs" / "tasks-toml.md"
    if doc.exists():
        text = doc.read_text()
        for d in every:
            assert f"`{d.key}`" in text, f"docs/tasks-toml.md does not describe {d.key}"


def test_keytable_build() -> None:
    table = KeyTable.build([[KeyDecl("priority", (int,))], [KeyDecl("http", (str,), where="verify_kind")], None])
    assert "priority" in table.task
    assert list(table.verify_kinds) == ["http"]  # no kind is the core's: each comes from its plugin
    # hook order is the reverse of registration: kinds are listed in registration order,
    # and the first declaration in hook order wins
    first, second = (
        KeyDecl("x", (str,), where="verify_kind", doc="1"),
        KeyDecl("x", (str,), where="verify_kind", doc="2"),
    )
    table = KeyTable.build(
        [
            [KeyDecl("b", (str,), where="verify_kind", runs="here"), first],
            [KeyDecl("a", (str,), where="verify_kind"), second],
        ]
    )
    assert list(table.verify_kinds) == ["a", "x", "b"] and table.verify_kinds["x"] is first
    assert table.runs_here("b") and not table.runs_here("a") and not table.runs_here("nope")
    with pytest.raises(ValueError, match="runs must be host or here"):
        KeyTable.build([[KeyDecl("c", (str,), where="verify_kind", runs="there")]])


def test_keytable_builtin_wins() -> None:
    mine = KeyDecl("name", (int,))
    table = KeyTable.build([[mine]])
    assert table.task["name"] is not mine


def test_keytable_bad_where() -> None:
    with pytest.raises(ValueError, match="where must be task, verify or verify_kind"):
        KeyTable.build([[KeyDecl("x", (str,), where="tasks")]])


def test_plugin_keys_go_to_extra(tmp_path: Path) -> None:
    keys = KeyTable.build(
        [
            [KeyDecl("priority", (int,)), KeyDecl("retries_s", (float, int), where="verify")],
            verify_run.fleetrun_task_keys(config=None),
        ]
    )
    (t,) = collect(
        tmp_path, '[[task]]\nname = "a"\nprompt = "p"\npriority = 3\n[[task.verify]]\nrun = "x"\nretries_s = 2\n', keys
    ).tasks
    assert t.extra == {"priority": 3}
    assert t.verify[0].extra == {"retries_s": 2}


# ---------------------------------------------------------------------------------
# refs


@pytest.mark.parametrize("ref", ["main", "a/b", "v1.0", "feature/X_y-z", "a@b", "ünï"])
def test_good_refs(ref: str) -> None:
    assert ref_problem(ref) is None


@pytest.mark.parametrize(
    "ref",
    [
        "a..b",
        "a b",
        "x.lock",
        "@{x}",
        "@",
        "/a",
        "a/",
        ".a",
        "a.",
        "a//b",
        "a/.b",
        "a~",
        "a^",
        "a:",
        "a?",
        "a*",
        "a[",
        "a\\b",
        "a\x7f",
        "a\tb",
    ],
)
def test_bad_refs(ref: str) -> None:
    assert ref_problem(ref) == f"{ref!r} is not a valid git ref name"


def test_ref_dash_and_empty() -> None:
    assert ref_problem("-x") == "'-x' starts with '-' (it would be read as an option)"
    assert ref_problem("") == "must not be empty"


# ---------------------------------------------------------------------------------
# the graph


def node(name: str, *deps: str, file: str = "t.toml", line: int = 1) -> GraphNode:
    return GraphNode(name, list(deps), file, line, line + 1)


def tf(*nodes: GraphNode) -> TaskFile:
    return TaskFile(path="t.toml", tasks=[], graph=list(nodes))


def test_graph_ok() -> None:
    assert check_graph([tf(node("a"), node("b", "a"), node("c", "a", "b"))]) == []


def test_graph_long_chain_no_recursion_limit() -> None:
    n = 5000
    nodes = [node("t0")] + [node(f"t{i}", f"t{i - 1}") for i in range(1, n)]
    assert check_graph([tf(*nodes)]) == []
    nodes[0] = node("t0", f"t{n - 1}")
    (e,) = check_graph([tf(*nodes)])
    assert e.message.startswith("dependency cycle: t0 -> ")
    assert e.message.count("->") == n


def test_graph_cycle_reported_once() -> None:
    out = check_graph([tf(node("a", "b", line=1), node("b", "a", line=5))])
    assert [e.format() for e in out] == ["ERROR: t.toml:2: task 'a': depends_on: dependency cycle: a -> b -> a"]


def test_graph_self_loop_left_to_the_collector() -> None:
    assert check_graph([tf(node("a", "a"))]) == []


# ---------------------------------------------------------------------------------
# fuzz: no mangled tasks file makes validate crash

BASE = '''\
# A tasks file to mangle.
[agents.demo]
command = ["{python}", "{tasks_dir}/agent.py", "{prompt_file}"]

[[task]]
name = "user-schema"
cwd = "repo"
prompt = "Add a users table."
git_ref = "main"
paths = ["db/schema.sql"]
max_retries = 2
timeout_min = 30

  [[task.verify]]
  run = "grep -q users schema.sql"
  timeout_s = 60

[[task]]
name = "user-api"
cwd = "repo"
git_ref = "main"
agent = "demo"
prompt = """
Add CRUD endpoints
for users.
"""
depends_on = ["user-schema"]
budget_usd = 1.5
requires = ["git"]

  [[task.verify]]
  brain = "Are the endpoints tested?"
  model = "qwen"

[[task]]
name = "docs"
prompt = 'Write the docs.'
permission_mode = "plan"
allowed_tools = ["Read"]
branch = "docs-branch"
stall_timeout_min = 5
'''

KEYS = sorted(
    {d.key for d in (*BUILTIN_TASK_KEYS, *BUILTIN_VERIFY_KEYS, *BUILTIN_VERIFY_KINDS, *PLUGIN_KINDS)}
    | {"verify", "task", "agents", "brain", "depnds_on", "command", "stdin", "env"}
)

# NUL and over-long names in cwd are left out while
# tests/test_validate_cli.py::test_cwd_unusable_path is xfail.
VALUES = [
    "1",
    "-1",
    "0",
    "2.5",
    "-0.5",
    "nan",
    "inf",
    "-inf",
    "true",
    "false",
    '""',
    '" "',
    '"x"',
    '"-x"',
    '"../x"',
    '"/abs"',
    '"a..b"',
    '"repo"',
    '"."',
    '"plan"',
    '"demo"',
    '"nope"',
    "[]",
    "[1]",
    '["a"]',
    '["user-schema"]',
    '["docs", "docs"]',
    '["user-api"]',
    '["../x", "/y"]',
    "{ a = 1 }",
    "{}",
    "[[1]]",
    '[{ run = "x" }]',
    "1979-05-27",
    "07:32:00",
    '"""\nmulti\n"""',
    "'lit'",
    '"\\t"',
    '"' + "n" * 120 + '"',
]

HEADERS = [
    "[[task]]",
    "[[task.verify]]",
    "[task]",
    "[task.verify]",
    "[agents.x]",
    "[agents]",
    "[brain]",
    "[[agents]]",
    "[x]",
    "[[task.x]]",
    "[task.sub]",
]

ident = st.from_regex(r"[A-Za-z_][A-Za-z0-9_-]{0,12}", fullmatch=True)
key_st = st.one_of(st.sampled_from(KEYS), ident)
value_st = st.one_of(
    st.sampled_from(VALUES),
    st.integers(-(10**20), 10**20).map(str),
    st.text(st.characters(codec="utf-8", exclude_characters='"\\'), max_size=8).map(lambda s: f'"{s}"'),
)
char_st = st.one_of(st.sampled_from(list("[]{}=\"'#.,\\\n\t -:")), st.characters(codec="utf-8"))
idx = st.integers(0, 10**6)

mutation = st.one_of(
    st.tuples(st.just("delete"), idx),
    st.tuples(st.just("duplicate"), idx),
    st.tuples(st.just("swap"), idx, idx),
    st.tuples(st.just("char"), idx, char_st),
    st.tuples(st.just("retype"), idx, value_st),
    st.tuples(st.just("insert"), idx, key_st, value_st),
    st.tuples(st.just("header"), idx, st.sampled_from(HEADERS)),
    st.tuples(st.just("truncate"), idx),
)


def mutate(text: str, op: tuple[Any, ...]) -> str:
    kind = op[0]
    lines = text.split("\n")
    n = len(lines)
    if kind == "delete":
        del lines[op[1] % n]
    elif kind == "duplicate":
        i = op[1] % n
        lines.insert(i, lines[i])
    elif kind == "swap":
        i, j = op[1] % n, op[2] % n
        lines[i], lines[j] = lines[j], lines[i]
    elif kind == "char":
        if not text:
            return op[2]
        i = op[1] % len(text)
        return text[:i] + op[2] + text[i + 1 :]
    elif kind == "retype":
        assigns = [i for i, line in enumerate(lines) if re.match(r"\s*[A-Za-z_\"'][^=]*=", line)]
        if assigns:
            i = assigns[op[1] % len(assigns)]
            lines[i] = lines[i].split("=", 1)[0] + "= " + op[2]
    elif kind == "insert":
        lines.insert(op[1] % (n + 1), f"{op[2]} = {op[3]}")
    elif kind == "header":
        lines.insert(op[1] % (n + 1), op[2])
    elif kind == "truncate":
        return text[: op[1] % (len(text) + 1)]
    return "\n".join(lines)


_ERROR_LINE = re.compile(r"ERROR: tasks\.toml:(\d+): ")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(mutation, min_size=1, max_size=4))
def test_mangled_tasks_file_never_crashes(fleeter: Any, ops: list[tuple[Any, ...]]) -> None:
    if not (fleeter.path / "repo" / ".git").exists():  # its git_ref must name a commit
        fleeter.make_repo("repo")
    text = BASE
    for op in ops:
        text = mutate(text, op)
    (fleeter.path / "tasks.toml").write_bytes(text.encode("utf-8"))

    r = fleeter.run("validate", "tasks.toml")

    assert "Traceback" not in r.stderr, r.stderr
    assert "INTERNAL ERROR" not in r.stderr, r.stderr
    assert r.ret in (0, 4, 5), (r.ret, r.stderr)
    if r.ret == 0:
        assert all(line.startswith("warning: ") for line in r.errlines), r.errlines
        assert len(r.outlines) == 1 and r.outlines[0].endswith(" valid")
    if r.ret == 4:
        assert r.errlines
        assert all(line.startswith("ERROR: ") for line in r.errlines), r.errlines
        # every error points into the file, in line order
        n_lines = max(1, len(text.splitlines()))
        numbers = [int(m.group(1)) for m in map(_ERROR_LINE.match, r.errlines) if m]
        assert all(1 <= k <= n_lines for k in numbers), (numbers, n_lines)
        assert numbers == sorted(numbers)


def test_base_of_the_fuzz_is_valid(fleeter: Any) -> None:
    fleeter.make_repo("repo")  # its git_ref must name a commit
    fleeter.write_config('[brain]\nurl = "http://127.0.0.1:9"\n')  # its brain verifier asks there
    (fleeter.path / "tasks.toml").write_text(BASE)
    r = fleeter.run("validate", "tasks.toml")
    assert (r.ret, r.outlines, r.errlines) == (0, ["tasks.toml: 3 tasks, valid"], [])


def test_project_task_defaults_sit_under_the_files_own(tmp_path: Path) -> None:
    """``collect_toml(defaults=...)``: the project file's ``[task]`` defaults apply to a
    file without its own top-level ``setup``; the file's replaces them; a task's its."""
    from fleetrun.collect import collect_defaults

    defaults = collect_defaults({"setup": ["make deps"]}, lambda key: 7, "pyproject.toml", "tool.fleetrun.task.")
    plain = tmp_path / "a.toml"
    plain.write_text('[[task]]\nname = "a"\nprompt = "x"\n\n[[task]]\nname = "b"\nprompt = "x"\nsetup = []\n')
    own = tmp_path / "b.toml"
    own.write_text('setup = ["npm ci"]\n\n[[task]]\nname = "c"\nprompt = "x"\n')
    got = {
        t.name: [s.text for s in t.setup]
        for f in (plain, own)
        for t in collect_toml(f, builtin_keys(), f.name, defaults).tasks
    }
    assert got == {"a": ["make deps"], "b": [], "c": ["npm ci"]}
    assert defaults["setup"][0].line == 7


def test_project_task_defaults_are_checked_with_the_files_errors() -> None:
    from fleetrun.collect import collect_defaults

    with pytest.raises(UsageErrors) as e:
        collect_defaults(
            {"setup": [3], "model": 3},
            lambda key: {"setup": 2, "model": 3}[key],
            "pyproject.toml",
            "tool.fleetrun.task.",
        )
    assert [x.format() for x in e.value.errors] == [
        "ERROR: pyproject.toml:2: tool.fleetrun.task.setup #1: must be a command string or a table "
        "{run = ..., timeout_s = ...}, not the number 3",
        "ERROR: pyproject.toml:3: tool.fleetrun.task.model: must be a string, not the number 3",
    ]


def test_every_builtin_task_key_is_a_default_or_says_why_not() -> None:
    """One list decides (taskkeys.DEFAULT_TASK_KEYS); every other built-in key has its reason."""
    from fleetrun.taskkeys import BUILTIN_TASK_KEYS, DEFAULT_TASK_KEYS, NOT_DEFAULT_KEYS

    builtin = [d.key for d in BUILTIN_TASK_KEYS]
    assert set(DEFAULT_TASK_KEYS) | set(NOT_DEFAULT_KEYS) == set(builtin)
    assert not set(DEFAULT_TASK_KEYS) & set(NOT_DEFAULT_KEYS)
    assert set(NOT_DEFAULT_KEYS) == {"name", "prompt", "depends_on", "branch", "role", "cwd", "paths"}


def test_the_docs_list_the_default_keys_of_taskkeys() -> None:
    """docs/tasks-toml.md and docs/configuration.md name the same keys as the code."""
    from fleetrun.taskkeys import DEFAULT_TASK_KEYS, NOT_DEFAULT_KEYS

    docs = Path(__file__).resolve().parents[1] / "docs"
    listed = ", ".join(f"`{k}`" for k in DEFAULT_TASK_KEYS)
    assert listed in (docs / "tasks-toml.md").read_text()
    assert listed in (docs / "configuration.md").read_text()
    refused = (docs / "tasks-toml.md").read_text()
    assert all(f"`{k}`" in refused for k in NOT_DEFAULT_KEYS)


def test_defaults_are_not_shared_between_tasks(tmp_path: Path) -> None:
    p = tmp_path / "t.toml"
    p.write_text(
        'requires = ["gpu"]\nallowed_tools = ["Read"]\n\n[[task]]\nname = "a"\nprompt = "x"\n\n'
        '[[task]]\nname = "b"\nprompt = "x"\n'
    )
    a, b = collect_toml(p, builtin_keys(), "t.toml").tasks
    a.requires.append("cuda")
    assert b.requires == ["gpu"] and a.allowed_tools is not b.allowed_tools
    assert (a.file_of("requires"), a.key_lines["requires"], a.defaulted) == (
        str(p),
        1,
        {"requires": str(p), "allowed_tools": str(p)},
    )
    assert a.file_of("name") == str(p) and "name" not in a.defaulted


def test_baseline_keys_go_to_extra_and_are_checked(tmp_path: Path) -> None:
    """issue 26's keys: a run verifier's ``baseline``, ``junit``, ``must_pass``,
    ``flaky_rerun`` and a task's ``baseline``/``removes_tests`` (also as defaults)."""
    (tmp_path / "repo").mkdir()
    tf = collect(
        tmp_path,
        """
baseline = "warn"

[[task]]
name = "t"
cwd = "repo"
prompt = "p"
removes_tests = true

  [[task.verify]]
  run = "python -m pytest --junitxml=r.xml"
  junit = "r.xml"
  must_pass = ["tests/test_x.py::test_y"]
  flaky_rerun = false
  baseline = true
""",
    )
    (t,) = tf.tasks
    assert t.extra == {"baseline": "warn", "removes_tests": True}
    assert t.verify[0].extra == {
        "junit": "r.xml",
        "must_pass": ["tests/test_x.py::test_y"],
        "flaky_rerun": False,
        "baseline": True,
    }
    bad = errors(
        tmp_path,
        """
[[task]]
name = "t"
cwd = "repo"
prompt = "p"
baseline = "yes"

  [[task.verify]]
  run = "x"
  junit = "../r.xml"
""",
    )
    assert any('baseline: must be true, false or "warn"' in e for e in bad), bad
    assert any("junit: must be a path inside the worktree" in e for e in bad), bad


def test_task_lines_are_the_lines_the_whole_files_map_gives() -> None:
    """Where a task's keys were written, found in its part of the file when asked
    (TaskLines), is what map_lines of the whole file says, on a file with every way of
    writing headers and keys (spaces in headers, CRLF, inline verifiers, sub-tables,
    dotted and quoted keys, a table between tasks); a file the header search would read
    differently (multi-line strings) is mapped whole, with the same answers."""
    from fleetrun.tomlfile import KeyLines, TaskLines, tomllib

    text = """model = "x"
[agents.codex]
command = ["x"]

[[task]]
name = "a"
"quoted" = 1
dotted.key = 2
depends_on = [
  "b",
]
verify = [{ run = "x" }, { brain = "y" }]

[[ task ]]
name = "b"   # [[task]] in a comment
  [[ task.verify ]]
  run = "x"
  [[task.verify]]
  brain = "y"
  [task.sub]
  x = 1

[brain]
model = "m"

[[task]]
name = "c"
prompt = 'p'
"""
    for variant in (text, text.replace("\n", "\r\n"), text.replace("prompt = 'p'", "prompt = '''\n[[task]]\n'''")):
        data = tomllib.loads(variant)
        whole = map_lines(variant)
        lines = TaskLines(variant, len(data["task"]))
        assert (lines._full is None) == ("'''" not in variant)  # the header search, or the whole map
        for i, raw in enumerate(data["task"]):
            head = whole.get("task", i)
            assert lines.head(i) == head
            for key in [*raw, "missing"]:
                assert lines.get(i, key) == whole.get("task", i, key, default=head), (i, key)
                assert lines.table(i, key) == whole.lines.get(("task", i, "table", key))
            for j in range(len(raw.get("verify", []))):
                assert lines.verify(i, j) == whole.get("task", i, "verify", j, default=head)
                assert lines.get(i, "verify", j, "run") == whole.get("task", i, "verify", j, "run", default=head)
            kl = KeyLines(lines, i, tuple(k for k in raw if k != "verify"))
            assert dict(kl) == {k: whole.get("task", i, k, default=head) for k in raw if k != "verify"}
        for top in ("model", "agents", "brain", "task"):
            assert lines.top(top) == whole.get("top", top)

"""``fleetrun validate`` and ``-k``, through the real command line.

Each error case asserts the exact lines printed (``ERROR: FILE:LINE: task 'NAME':
key: message``), exit code 4, and that no traceback leaked out.
"""

from __future__ import annotations

import textwrap
from typing import Any

import pytest

USAGE_ERROR = 4
NO_TASKS = 5


def validate(fleeter: Any, text: str, *args: str) -> Any:
    fleeter.write_tasks(text)
    return fleeter.run("validate", *(args or ("tasks.toml",)))


def assert_errors(result: Any, *lines: str) -> None:
    """Exit 4, exactly ``lines`` on stderr (in this order), nothing on stdout, no traceback."""
    assert "Traceback" not in result.stderr, result.stderr
    assert "INTERNAL ERROR" not in result.stderr, result.stderr
    assert result.errlines == list(lines), "\n".join(result.errlines)
    assert result.ret == USAGE_ERROR
    assert result.outlines == []


def assert_valid(result: Any, *outlines: str) -> None:
    """Exit 0, exactly ``outlines`` on stdout; stderr may hold plugins' warnings only."""
    assert "Traceback" not in result.stderr, result.stderr
    assert all(line.startswith("warning: ") for line in result.errlines), result.errlines
    assert result.ret == 0
    assert result.outlines == list(outlines)


def check(fleeter: Any, text: str, *lines: str) -> None:
    assert_errors(validate(fleeter, text), *lines)


def task(name: str = "a", **keys: str) -> str:
    """A ``[[task]]`` table; values are TOML source text."""
    body = "".join(f"{k} = {v}\n" for k, v in keys.items())
    return f'[[task]]\nname = "{name}"\nprompt = "do it"\n{body}'


# ---------------------------------------------------------------------------------
# success


def test_valid_file(fleeter: Any) -> None:
    r = validate(
        fleeter,
        """
        [[task]]
        name = "user-schema"
        prompt = "Add a users table."

          [[task.verify]]
          run = "grep -q users schema.sql"

        [[task]]
        name = "user-api"
        prompt = "Add endpoints."
        depends_on = ["user-schema"]

        [[task]]
        name = "docs"
        prompt = "Write docs."
    """,
    )
    assert r.ret == 0
    assert r.outlines == ["tasks.toml: 3 tasks, valid"]
    assert r.errlines == []


def test_valid_one_task_singular(fleeter: Any) -> None:
    r = validate(fleeter, task("a"))
    assert (r.ret, r.outlines, r.errlines) == (0, ["tasks.toml: 1 task, valid"], [])


def test_valid_default_file_name(fleeter: Any) -> None:
    fleeter.write_tasks(task("a"))
    r = fleeter.run("validate")
    assert (r.ret, r.outlines) == (0, ["tasks.toml: 1 task, valid"])


def test_valid_every_key(fleeter: Any) -> None:
    fleeter.make_repo("repo")
    r = validate(
        fleeter,
        """
        [[task]]
        name = "base"
        prompt = "p"
        peer = "mini"  # not with role: a task with a role runs on this machine

        [[task]]
        name = "all"
        prompt = \"\"\"
        Several
        lines.
        \"\"\"
        cwd = "repo"
        git_ref = "main"
        branch = "fleet/all-keys"
        depends_on = ["base"]
        max_retries = 0
        timeout_min = 1.5
        model = "opus"
        permission_mode = "acceptEdits"
        allowed_tools = ["Read", "Bash(git *)"]
        budget_usd = 0
        stall_timeout_min = 5
        agent = "claude"
        role = "backend"
        paths = ["src/", "a/../b", "./c"]
        requires = ["python", "gpu"]

          [[task.verify]]
          run = "make test"
          timeout_s = 30

          [[task.verify]]
          brain = "Does the diff add tests?"
          model = "qwen"

          [[task.verify]]
          agent = "Review the change."
          budget_usd = 0.5
    """,
    )
    # warnings (e.g. a requires tag this machine lacks) are allowed; errors are not
    assert_valid(r, "tasks.toml: 2 tasks, valid")


def test_two_files(fleeter: Any) -> None:
    fleeter.write_tasks(task("a"), name="one.toml")
    fleeter.write_tasks(task("b") + task("c"), name="sub/two.toml")
    r = fleeter.run("validate", "one.toml", "sub/two.toml")
    assert r.ret == 0
    assert r.outlines == ["one.toml: 1 task, valid", "sub/two.toml: 2 tasks, valid"]


def test_depends_on_across_files(fleeter: Any) -> None:
    fleeter.write_tasks(task("a"), name="one.toml")
    fleeter.write_tasks(task("b", depends_on='["a"]'), name="two.toml")
    r = fleeter.run("validate", "one.toml", "two.toml")
    assert (r.ret, r.errlines) == (0, [])


def test_empty_file_is_exit_5(fleeter: Any) -> None:
    fleeter.write_tasks("")
    r = fleeter.run("validate", "tasks.toml")
    assert r.ret == NO_TASKS
    assert "Traceback" not in r.stderr
    assert not any(line.startswith("ERROR") for line in r.errlines)


def test_only_comments_is_exit_5(fleeter: Any) -> None:
    fleeter.write_tasks("# nothing yet\n\n[agents.x]\ncommand = ['x']\n")
    assert fleeter.run("validate", "tasks.toml").ret == NO_TASKS


def test_missing_file(fleeter: Any) -> None:
    assert_errors(fleeter.run("validate", "nope.toml"), "ERROR: nope.toml: file not found")


def test_missing_default_file(fleeter: Any) -> None:
    assert_errors(fleeter.run("validate"), "ERROR: tasks.toml: file not found")


def test_not_utf8(fleeter: Any) -> None:
    (fleeter.path / "tasks.toml").write_bytes(b'[[task]]\nname = "\xff"\n')
    r = fleeter.run("validate", "tasks.toml")
    assert r.ret == USAGE_ERROR
    assert r.errlines[0].startswith("ERROR: tasks.toml: not UTF-8 text")


def test_validate_as_subprocess(fleeter: Any) -> None:
    fleeter.write_tasks(task("a", depnds_on='["b"]'))
    r = fleeter.runsub("validate", "tasks.toml")
    assert_errors(r, "ERROR: tasks.toml:4: task 'a': depnds_on: unknown key (did you mean 'depends_on'?)")
    fleeter.write_tasks(task("a"))
    r = fleeter.runsub("validate", "tasks.toml")
    assert (r.ret, r.outlines, r.errlines) == (0, ["tasks.toml: 1 task, valid"], [])


# ---------------------------------------------------------------------------------
# TOML syntax


def test_toml_syntax_error(fleeter: Any) -> None:
    check(
        fleeter,
        """
        [[task]]
        name = "a"
        prompt = "unterminated
    """,
        "ERROR: tasks.toml:3: invalid TOML: Illegal character '\\n'",
    )


def test_toml_syntax_error_missing_value(fleeter: Any) -> None:
    check(
        fleeter,
        """
        [[task]]
        name = "a"
        prompt = "x"

        max_retries =
    """,
        "ERROR: tasks.toml:5: invalid TOML: Invalid value",
    )


def test_toml_duplicate_key(fleeter: Any) -> None:
    r = validate(
        fleeter,
        """
        [[task]]
        name = "a"
        name = "b"
        prompt = "x"
    """,
    )
    assert r.ret == USAGE_ERROR
    assert len(r.errlines) == 1
    assert r.errlines[0].startswith("ERROR: tasks.toml:3: invalid TOML: ")


# ---------------------------------------------------------------------------------
# unknown keys


@pytest.mark.parametrize(
    ("key", "hint"),
    [
        ("depnds_on", " (did you mean 'depends_on'?)"),
        ("promt", " (did you mean 'prompt'?)"),
        ("max_retry", " (did you mean 'max_retries'?)"),
        ("verfy", " (did you mean 'verify'?)"),
        ("colour", ""),
    ],
)
def test_unknown_task_key(fleeter: Any, key: str, hint: str) -> None:
    check(fleeter, task("a", **{key: '"x"'}), f"ERROR: tasks.toml:4: task 'a': {key}: unknown key{hint}")


def test_misspelled_prompt_is_also_missing_prompt(fleeter: Any) -> None:
    check(
        fleeter,
        """
        [[task]]
        name = "a"
        promt = "x"
    """,
        "ERROR: tasks.toml:1: task 'a': prompt: missing (every [[task]] needs name and prompt)",
        "ERROR: tasks.toml:3: task 'a': promt: unknown key (did you mean 'prompt'?)",
    )


def test_unknown_task_subtable(fleeter: Any) -> None:
    check(fleeter, task("a") + "\n[task.misc]\nx = 1\n", "ERROR: tasks.toml:5: task 'a': misc: unknown key")


def test_a_misspelt_verify_table_points_at_its_header(fleeter: Any) -> None:
    check(
        fleeter,
        task("b") + "\n" + task("a") + '\n  [[task.verifiy]]\n  run = "make test"\n',
        "ERROR: tasks.toml:9: task 'a': verifiy: unknown key (did you mean 'verify'?)",
    )


def test_a_verify_table_written_once_points_at_its_header(fleeter: Any) -> None:
    check(
        fleeter,
        task("b") + "\n" + task("a") + '\n  [task.verify]\n  run = "make test"\n',
        "ERROR: tasks.toml:9: task 'a': verify: must be an array of tables, written [[task.verify]]",
    )


def test_an_inline_misspelt_table_points_at_its_key(fleeter: Any) -> None:
    check(
        fleeter,
        task("a") + 'verifiy = { run = "make test" }\n',
        "ERROR: tasks.toml:4: task 'a': verifiy: unknown key (did you mean 'verify'?)",
    )


def test_unknown_verify_key(fleeter: Any) -> None:
    check(
        fleeter,
        task("a") + '  [[task.verify]]\n  rn = "make test"\n',
        "ERROR: tasks.toml:4: task 'a': verify #1: needs exactly one of run / brain / agent, found none",
        "ERROR: tasks.toml:5: task 'a': verify #1: rn: unknown key (did you mean 'run'?)",
    )


def test_unknown_verify_key_next_to_a_kind(fleeter: Any) -> None:
    check(
        fleeter,
        task("a") + '  [[task.verify]]\n  run = "make"\n\n  [[task.verify]]\n  run = "x"\n  timeout = 5\n',
        "ERROR: tasks.toml:9: task 'a': verify #2: timeout: unknown key (did you mean 'timeout_s'?)",
    )


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("taks = 1", "ERROR: tasks.toml:1: taks: unknown key (did you mean 'task'?)"),
        ("[agent.codex]", "ERROR: tasks.toml:1: agent: unknown key (did you mean 'agents'?)"),
        ("[misc]", "ERROR: tasks.toml:1: misc: unknown key"),
        ("agents = 1", "ERROR: tasks.toml:1: agents: must be a table"),
        ("[model.x]", "ERROR: tasks.toml:1: model: must be a string, not a table"),
    ],
)
def test_unknown_top_level_key(fleeter: Any, line: str, expected: str) -> None:
    check(fleeter, f"{line}\n\n" + task("a").replace("[[task]]", "[[task]]", 1), expected)


def test_a_slip_of_a_task_only_key_as_a_default_says_which(fleeter: Any) -> None:
    # depends_on is no default, so the closest default was none; the slip is still depends_on
    check(
        fleeter,
        'dependancies = ["a"]\n\n' + task("b"),
        "ERROR: tasks.toml:1: dependancies: unknown key (did you mean 'depends_on'? It cannot be a default of "
        "every task (it is the task graph); write it in each [[task]])",
    )


def test_task_not_an_array_of_tables(fleeter: Any) -> None:
    check(
        fleeter,
        '[task]\nname = "a"\nprompt = "x"\n',
        "ERROR: tasks.toml:1: task: must be an array of tables, written [[task]]",
    )


def test_verify_not_an_array_of_tables(fleeter: Any) -> None:
    check(
        fleeter,
        task("a", verify='"make test"'),
        "ERROR: tasks.toml:4: task 'a': verify: must be an array of tables, written [[task.verify]]",
    )


# ---------------------------------------------------------------------------------
# required keys


def test_missing_name(fleeter: Any) -> None:
    check(
        fleeter,
        '# tasks\n[[task]]\nprompt = "x"\n',
        "ERROR: tasks.toml:2: task #1: name: missing (every [[task]] needs name and prompt)",
    )


def test_missing_prompt(fleeter: Any) -> None:
    check(
        fleeter,
        task("a") + '\n[[task]]\nname = "b"\n',
        "ERROR: tasks.toml:5: task 'b': prompt: missing (every [[task]] needs name and prompt)",
    )


def test_missing_name_and_prompt(fleeter: Any) -> None:
    check(
        fleeter,
        task("a") + '[[task]]\nmodel = "x"\n',
        "ERROR: tasks.toml:4: task #2: name: missing (every [[task]] needs name and prompt)",
        "ERROR: tasks.toml:4: task #2: prompt: missing (every [[task]] needs name and prompt)",
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ('""', "must not be empty"),
        ('"   "', "must not be empty"),
        ('"-a"', "'-a' starts with '-'"),
        ('"a\\tb"', "must not contain control characters"),
        ('"' + "x" * 101 + '"', "is longer than 100 characters"),
        ("3", "must be a string, not the number 3"),
    ],
)
def test_bad_name(fleeter: Any, value: str, message: str) -> None:
    who = "task #1" if value in ('""', "3") else f"task '{value[1:-1]}'"
    if value == '"a\\tb"':
        who = "task 'a\tb'"
    if "x" * 101 in value:  # a very long name is capped where it is quoted
        who = "task '" + "x" * 79 + "\u2026'"
    check(fleeter, f'[[task]]\nname = {value}\nprompt = "x"\n', f"ERROR: tasks.toml:2: {who}: name: {message}")


def test_empty_prompt(fleeter: Any) -> None:
    check(
        fleeter, '[[task]]\nname = "a"\nprompt = "  \\n "\n', "ERROR: tasks.toml:3: task 'a': prompt: must not be empty"
    )


# ---------------------------------------------------------------------------------
# types and values


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("max_retries", '"2"', "must be an integer, not a string"),
        ("max_retries", "true", "must be an integer, not true/false"),
        ("max_retries", "2.0", "must be an integer, not the number 2.0"),
        ("max_retries", "-1", "must not be negative"),
        ("timeout_min", '"x"', "must be a number, not a string"),
        ("timeout_min", "0", "must be greater than 0"),
        ("timeout_min", "-5", "must be greater than 0"),
        ("timeout_min", "false", "must be a number, not true/false"),
        ("stall_timeout_min", "0.0", "must be greater than 0"),
        ("budget_usd", "-0.01", "must not be negative"),
        ("budget_usd", '"5"', "must be a number, not a string"),
        ("depends_on", '"a"', "must be a list, not a string"),
        ("depends_on", "[1]", "must be a list of strings"),
        ("requires", "[1]", "must be a list of strings"),
        ("requires", '"gpu"', "must be a list, not a string"),
        ("allowed_tools", '["Read", 2]', "must be a list of strings"),
        ("paths", '[["a"]]', "must be a list of strings"),
        ("model", "4", "must be a string, not the number 4"),
        ("cwd", '["."]', "must be a string, not a list"),
        ("peer", '{ host = "x" }', "must be a string, not a table"),
        ("agent", '""', "must not be empty"),
        ("role", '" "', "must not be empty"),
        ("peer", '""', "must not be empty"),
        (
            "permission_mode",
            '"yolo"',
            "'yolo' is not one of acceptEdits, auto, bypassPermissions, default, dontAsk, manual, plan",
        ),
        (
            "permission_mode",
            '"AcceptEdits"',
            "'AcceptEdits' is not one of acceptEdits, auto, bypassPermissions, "
            "default, dontAsk, manual, plan (did you mean 'acceptEdits'?)",
        ),
        (
            "permission_mode",
            '"acceptedits"',
            "'acceptedits' is not one of acceptEdits, auto, bypassPermissions, "
            "default, dontAsk, manual, plan (did you mean 'acceptEdits'?)",
        ),
        ("base", '"dependency"', "'dependency' is not one of git_ref, dependencies (did you mean 'dependencies'?)"),
    ],
)
def test_bad_value(fleeter: Any, key: str, value: str, message: str) -> None:
    check(fleeter, task("b") + task("a", **{key: value}), f"ERROR: tasks.toml:7: task 'a': {key}: {message}")


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("timeout_min", "must be greater than 0"),
        ("stall_timeout_min", "must be greater than 0"),
        ("budget_usd", "must not be negative"),
    ],
)
def test_nan_rejected(fleeter: Any, key: str, message: str) -> None:
    check(fleeter, task("a", **{key: "nan"}), f"ERROR: tasks.toml:4: task 'a': {key}: {message}")


@pytest.mark.parametrize(
    "cwd",
    [
        pytest.param("a\\u0000b", id="nul"),
        pytest.param("x" * 300, id="long-name"),
        pytest.param("/".join(["x" * 200] * 30), id="long-path"),
        # Path.resolve() raises RuntimeError on a symlink loop before Python 3.13 only
        pytest.param("loop", id="symlink-loop"),
    ],
)
def test_cwd_unusable_path(fleeter: Any, cwd: str) -> None:
    # When fixed, also add '"a\\u0000b"' to VALUES in tests/test_collect.py.
    (fleeter.path / "loop").symlink_to("loop")
    r = validate(fleeter, task("a", cwd=f'"{cwd}"'))
    assert "INTERNAL ERROR" not in r.stderr
    assert r.ret == USAGE_ERROR
    assert len(r.errlines) == 1
    assert r.errlines[0].startswith("ERROR: tasks.toml:4: task 'a': cwd: ")


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("run", "1", "must be a string, not the number 1"),
        ("run", '""', "must not be empty"),
        ("brain", '" "', "must not be empty"),
        ("timeout_s", "0", "must be greater than 0"),
        ("timeout_s", '"60"', "must be a number, not a string"),
        ("budget_usd", "-1", "must not be negative"),
        ("model", "true", "must be a string, not true/false"),
    ],
)
def test_bad_verify_value(fleeter: Any, key: str, value: str, message: str) -> None:
    kind = "" if key in ("run", "brain") else '  agent = "review"\n'
    check(
        fleeter,
        task("a") + f"  [[task.verify]]\n{kind}  {key} = {value}\n",
        f"ERROR: tasks.toml:{6 if kind else 5}: task 'a': verify #1: {key}: {message}",
    )


def test_verify_with_no_kind(fleeter: Any) -> None:
    check(
        fleeter,
        task("a") + "  [[task.verify]]\n  timeout_s = 10\n",
        "ERROR: tasks.toml:4: task 'a': verify #1: needs exactly one of run / brain / agent, found none",
    )


def test_verify_with_two_kinds(fleeter: Any) -> None:
    check(
        fleeter,
        task("a") + '  [[task.verify]]\n  run = "make"\n\n  [[task.verify]]\n  run = "x"\n  brain = "y"\n',
        "ERROR: tasks.toml:7: task 'a': verify #2: needs exactly one of run / brain / agent, found 2: run, brain",
    )


def test_verify_with_three_kinds(fleeter: Any) -> None:
    check(
        fleeter,
        task("a") + '  [[task.verify]]\n  agent = "a"\n  run = "x"\n  brain = "y"\n',
        "ERROR: tasks.toml:4: task 'a': verify #1: needs exactly one of run / brain / agent, "
        "found 3: agent, run, brain",
    )


# ---------------------------------------------------------------------------------
# paths, cwd, refs


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("/etc/passwd", "'/etc/passwd' is absolute; paths are relative to cwd"),
        ("~/x", "'~/x' is absolute; paths are relative to cwd"),
        ("../x", "'../x' escapes cwd"),
        ("..", "'..' escapes cwd"),
        ("a/../../x", "'a/../../x' escapes cwd"),
        ("./../x", "'./../x' escapes cwd"),
    ],
)
def test_bad_paths(fleeter: Any, path: str, message: str) -> None:
    check(fleeter, task("a", paths=f'["ok/file.py", "{path}"]'), f"ERROR: tasks.toml:4: task 'a': paths: {message}")


def test_several_bad_paths(fleeter: Any) -> None:
    check(
        fleeter,
        task("a", paths='["/abs", "../x", "a/../b", "a/../../x"]'),
        "ERROR: tasks.toml:4: task 'a': paths: '/abs' is absolute; paths are relative to cwd",
        "ERROR: tasks.toml:4: task 'a': paths: '../x' escapes cwd",
        "ERROR: tasks.toml:4: task 'a': paths: 'a/../../x' escapes cwd",
    )


def test_cwd_does_not_exist(fleeter: Any) -> None:
    check(
        fleeter,
        task("a", cwd='"repo"'),
        "ERROR: tasks.toml:4: task 'a': cwd: 'repo' does not exist (it is relative to the tasks file)",
    )


def test_cwd_is_a_file(fleeter: Any) -> None:
    fleeter.write("notes.txt", "x")
    check(fleeter, task("a", cwd='"notes.txt"'), "ERROR: tasks.toml:4: task 'a': cwd: 'notes.txt' is not a directory")


def test_cwd_is_relative_to_the_tasks_file(fleeter: Any) -> None:
    fleeter.make_repo("plans/repo")
    fleeter.write_tasks(task("a", cwd='"repo"'), name="plans/tasks.toml")
    r = fleeter.run("validate", "plans/tasks.toml")
    no_ref = [
        f"warning: plans/tasks.toml:1: task 'a': no git_ref: the agent works in your checkout "
        f"{fleeter.path / 'plans' / 'repo'} itself"
    ]
    assert (r.ret, r.outlines, r.errlines) == (0, ["plans/tasks.toml: 1 task, valid"], no_ref)

    # from another directory: still the tasks file's folder, not the invocation's
    other = fleeter.path / "elsewhere"
    (other / "repo").mkdir(parents=True)
    fleeter.monkeypatch.chdir(other)
    r = fleeter.run("validate", "../plans/tasks.toml")
    assert (r.ret, [e.split(":", 3)[-1] for e in r.errlines]) == (0, [e.split(":", 3)[-1] for e in no_ref])
    assert r.outlines == [f"{fleeter.path / 'plans' / 'tasks.toml'}: 1 task, valid"]


def test_cwd_relative_to_tasks_file_not_invocation_dir(fleeter: Any) -> None:
    (fleeter.path / "repo").mkdir()  # next to where we run, but not next to the tasks file
    fleeter.write_tasks(task("a", cwd='"repo"'), name="plans/tasks.toml")
    assert_errors(
        fleeter.run("validate", "plans/tasks.toml"),
        "ERROR: plans/tasks.toml:4: task 'a': cwd: 'repo' does not exist (it is relative to the tasks file)",
    )


def test_cwd_parent_folder_is_allowed(fleeter: Any) -> None:
    fleeter.write_tasks(task("a", cwd='".."'), name="plans/tasks.toml")
    r = fleeter.run("validate", "plans/tasks.toml")
    assert (r.ret, r.errlines) == (0, [])


@pytest.mark.parametrize("key", ["git_ref", "branch"])
@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("-x", "'-x' starts with '-' (it would be read as an option)"),
        ("--upload-pack=evil", "'--upload-pack=evil' starts with '-' (it would be read as an option)"),
        ("a..b", "'a..b' is not a valid git ref name"),
        ("a b", "'a b' is not a valid git ref name"),
        ("x.lock", "'x.lock' is not a valid git ref name"),
        ("@{x}", "'@{x}' is not a valid git ref name"),
        ("@", "'@' is not a valid git ref name"),
        ("a~1", "'a~1' is not a valid git ref name"),
        ("a^", "'a^' is not a valid git ref name"),
        ("a:b", "'a:b' is not a valid git ref name"),
        ("a?", "'a?' is not a valid git ref name"),
        ("a*", "'a*' is not a valid git ref name"),
        ("a[b", "'a[b' is not a valid git ref name"),
        ("a\\\\b", "'a\\\\b' is not a valid git ref name"),
        ("/a", "'/a' is not a valid git ref name"),
        ("a/", "'a/' is not a valid git ref name"),
        ("a//b", "'a//b' is not a valid git ref name"),
        ("a/.b", "'a/.b' is not a valid git ref name"),
        (".a", "'.a' is not a valid git ref name"),
        ("a.", "'a.' is not a valid git ref name"),
        ("", "must not be empty"),
    ],
)
def test_bad_ref(fleeter: Any, key: str, ref: str, message: str) -> None:
    check(fleeter, task("a", **{key: f'"{ref}"'}), f"ERROR: tasks.toml:4: task 'a': {key}: {message}")


@pytest.mark.parametrize("ref", ["main", "feature/x-1", "v1.2.3", "fleet/user_api", "HEAD", "a@b"])
def test_good_ref(fleeter: Any, ref: str) -> None:
    # a git_ref must name a commit of the repository (here a tag), a branch must not exist yet
    repo = fleeter.make_repo("repo")
    if ref not in ("main", "HEAD"):
        fleeter.git(repo, "tag", ref)
    r = validate(fleeter, task("a", cwd='"repo"', git_ref=f'"{ref}"') + task("b", branch=f'"{ref}"'))
    assert (r.ret, r.errlines) == (0, [])


# ---------------------------------------------------------------------------------
# names and the dependency graph


def test_duplicate_name_in_one_file(fleeter: Any) -> None:
    check(
        fleeter,
        task("a") + task("b") + task("a"),
        "ERROR: tasks.toml:8: task 'a': name: duplicate task name (first defined at tasks.toml:2)",
    )


def test_duplicate_name_three_times(fleeter: Any) -> None:
    check(
        fleeter,
        task("a") + task("a") + task("a"),
        "ERROR: tasks.toml:5: task 'a': name: duplicate task name (first defined at tasks.toml:2)",
        "ERROR: tasks.toml:8: task 'a': name: duplicate task name (first defined at tasks.toml:2)",
    )


def test_duplicate_name_across_files(fleeter: Any) -> None:
    fleeter.write_tasks(task("a") + task("b"), name="one.toml")
    fleeter.write_tasks("# second\n" + task("b"), name="two.toml")
    assert_errors(
        fleeter.run("validate", "one.toml", "two.toml"),
        "ERROR: two.toml:3: task 'b': name: duplicate task name (first defined at one.toml:5)",
    )


def test_dangling_depends_on(fleeter: Any) -> None:
    check(
        fleeter,
        task("user-schema") + task("user-api", depends_on='["user-shema"]'),
        "ERROR: tasks.toml:7: task 'user-api': depends_on: 'user-shema' is not a task (did you mean 'user-schema'?)",
    )


def test_dangling_depends_on_without_suggestion(fleeter: Any) -> None:
    check(fleeter, task("a", depends_on='["zzz"]'), "ERROR: tasks.toml:4: task 'a': depends_on: 'zzz' is not a task")


def test_dangling_depends_on_two(fleeter: Any) -> None:
    check(
        fleeter,
        task("a", depends_on='[\n  "x",\n  "y",\n]'),
        "ERROR: tasks.toml:4: task 'a': depends_on: 'x' is not a task",
        "ERROR: tasks.toml:4: task 'a': depends_on: 'y' is not a task",
    )


def test_cycle_of_two(fleeter: Any) -> None:
    check(
        fleeter,
        task("a", depends_on='["b"]') + task("b", depends_on='["a"]'),
        "ERROR: tasks.toml:4: task 'a': depends_on: dependency cycle: a -> b -> a",
    )


def test_cycle_of_three(fleeter: Any) -> None:
    check(
        fleeter,
        task("x") + task("a", depends_on='["b"]') + task("b", depends_on='["c"]') + task("c", depends_on='["a"]'),
        "ERROR: tasks.toml:7: task 'a': depends_on: dependency cycle: a -> b -> c -> a",
    )


def test_cycle_reached_from_outside(fleeter: Any) -> None:
    check(
        fleeter,
        task("start", depends_on='["a"]') + task("a", depends_on='["b"]') + task("b", depends_on='["a"]'),
        "ERROR: tasks.toml:8: task 'a': depends_on: dependency cycle: a -> b -> a",
    )


def test_two_separate_cycles(fleeter: Any) -> None:
    check(
        fleeter,
        task("a", depends_on='["b"]')
        + task("b", depends_on='["a"]')
        + task("c", depends_on='["d"]')
        + task("d", depends_on='["c"]'),
        "ERROR: tasks.toml:4: task 'a': depends_on: dependency cycle: a -> b -> a",
        "ERROR: tasks.toml:12: task 'c': depends_on: dependency cycle: c -> d -> c",
    )


def test_cycle_across_files(fleeter: Any) -> None:
    fleeter.write_tasks(task("a", depends_on='["b"]'), name="one.toml")
    fleeter.write_tasks(task("b", depends_on='["a"]'), name="two.toml")
    assert_errors(
        fleeter.run("validate", "one.toml", "two.toml"),
        "ERROR: one.toml:4: task 'a': depends_on: dependency cycle: a -> b -> a",
    )


def test_diamond_is_not_a_cycle(fleeter: Any) -> None:
    r = validate(
        fleeter,
        task("a") + task("b", depends_on='["a"]') + task("c", depends_on='["a"]') + task("d", depends_on='["b", "c"]'),
    )
    assert (r.ret, r.errlines) == (0, [])


def test_self_dependency(fleeter: Any) -> None:
    check(
        fleeter,
        task("a", depends_on='["a"]'),
        "ERROR: tasks.toml:4: task 'a': depends_on: the task depends on itself ('a')",
    )


def test_dependency_named_twice(fleeter: Any) -> None:
    check(
        fleeter,
        task("a") + task("b", depends_on='["a", "a"]'),
        "ERROR: tasks.toml:7: task 'b': depends_on: names a task twice",
    )


def test_graph_errors_reported_with_key_errors(fleeter: Any) -> None:
    # a task with a bad key still takes part in the duplicate/dangling/cycle checks
    check(
        fleeter,
        task("a", depends_on='["b"]', max_retries="-1") + task("b", depends_on='["a"]'),
        "ERROR: tasks.toml:4: task 'a': depends_on: dependency cycle: a -> b -> a",
        "ERROR: tasks.toml:5: task 'a': max_retries: must not be negative",
    )


# ---------------------------------------------------------------------------------
# all errors at once


def test_all_errors_in_one_run_sorted_by_line(fleeter: Any) -> None:
    check(
        fleeter,
        """
        [[task]]
        name = "user-schema"
        prompt = "x"
        depends_on = ["user-api"]
        max_retries = "2"

        [[task]]
        name = "user-api"
        promt = "y"
        depends_on = ["user-schema", "user-shema"]
        timeout_min = 0
        git_ref = "a..b"

          [[task.verify]]
          rn = "make test"

        [[task]]
        name = "user-schema"
        prompt = "z"
        paths = ["/abs"]
    """,
        "ERROR: tasks.toml:4: task 'user-schema': depends_on: dependency cycle: user-schema -> user-api -> user-schema",
        "ERROR: tasks.toml:5: task 'user-schema': max_retries: must be an integer, not a string",
        "ERROR: tasks.toml:7: task 'user-api': prompt: missing (every [[task]] needs name and prompt)",
        "ERROR: tasks.toml:9: task 'user-api': promt: unknown key (did you mean 'prompt'?)",
        "ERROR: tasks.toml:10: task 'user-api': depends_on: 'user-shema' is not a task (did you mean 'user-schema'?)",
        "ERROR: tasks.toml:11: task 'user-api': timeout_min: must be greater than 0",
        "ERROR: tasks.toml:12: task 'user-api': git_ref: 'a..b' is not a valid git ref name",
        "ERROR: tasks.toml:14: task 'user-api': verify #1: needs exactly one of run / brain / agent, found none",
        "ERROR: tasks.toml:15: task 'user-api': verify #1: rn: unknown key (did you mean 'run'?)",
        "ERROR: tasks.toml:18: task 'user-schema': name: duplicate task name (first defined at tasks.toml:2)",
        "ERROR: tasks.toml:20: task 'user-schema': paths: '/abs' is absolute; paths are relative to cwd",
    )


def test_errors_of_several_files_in_command_line_order(fleeter: Any) -> None:
    fleeter.write_tasks(task("a", max_retries="-1"), name="z.toml")
    fleeter.write_tasks(task("b", timeout_min="0"), name="a.toml")
    fleeter.write_tasks('[[task]]\nname = "c"\nprompt = "\n', name="m.toml")
    assert_errors(
        fleeter.run("validate", "z.toml", "m.toml", "a.toml"),
        "ERROR: z.toml:4: task 'a': max_retries: must not be negative",
        "ERROR: m.toml:3: invalid TOML: Illegal character '\\n'",
        "ERROR: a.toml:4: task 'b': timeout_min: must be greater than 0",
    )


def test_good_file_next_to_a_bad_one_prints_no_success(fleeter: Any) -> None:
    fleeter.write_tasks(task("a"), name="good.toml")
    fleeter.write_tasks(task("b", agent="1"), name="bad.toml")
    assert_errors(
        fleeter.run("validate", "good.toml", "bad.toml"),
        "ERROR: bad.toml:4: task 'b': agent: must be a string, not the number 1",
    )


# ---------------------------------------------------------------------------------
# agents


def test_agents_table_accepted(fleeter: Any) -> None:
    r = validate(
        fleeter,
        """
        [agents.codex]
        command = ["codex", "exec", "--cd", "{workdir}", "{prompt}"]

        [agents.script]
        command = ["{python}", "{tasks_dir}/agent.py", "{prompt_file}", "{attempt}", "{model}"]
        stdin = true
        env = { AGENT_MODE = "fast" }

        [[task]]
        name = "a"
        prompt = "x"
        agent = "codex"

        [[task]]
        name = "b"
        prompt = "x"
        agent = "script"
    """,
    )
    # codex is not installed here: a warning (a peer may have it), not an error
    assert (r.ret, r.outlines, r.errlines) == (
        0,
        ["tasks.toml: 2 tasks, valid"],
        ["warning: tasks.toml:12: task 'a': agent: codex is not on PATH (set [agents.codex] command)"],
    )


def test_agent_declared_in_config_toml(fleeter: Any) -> None:
    fleeter.write_config('[agents.aider]\ncommand = ["aider", "--message", "{prompt}"]\n')
    r = validate(fleeter, task("a", agent='"aider"'))
    assert (r.ret, r.errlines) == (
        0,
        ["warning: tasks.toml:4: task 'a': agent: aider is not on PATH (set [agents.aider] command)"],
    )


def test_unknown_agent(fleeter: Any) -> None:
    r = validate(fleeter, task("a", agent='"codex"'))
    assert r.ret == USAGE_ERROR
    assert "Traceback" not in r.stderr
    r.fnmatch_lines(
        [
            "ERROR: *tasks.toml:*: task 'a': agent: 'codex' is not an agent (known: claude); "
            "declare it as [[]agents.codex]"
        ],
        stream="err",
    )


def test_unknown_agent_exact_line(fleeter: Any) -> None:
    check(
        fleeter,
        "[agents.aider]\ncommand = ['aider']\n\n" + task("a", agent='"codex"'),
        "ERROR: tasks.toml:7: task 'a': agent: 'codex' is not an agent (known: claude, aider); "
        "declare it as [agents.codex]",
    )


def test_unknown_agents_all_reported(fleeter: Any) -> None:
    r = validate(fleeter, task("a", agent='"codex"') + task("b", agent='"aider"'))
    assert r.ret == USAGE_ERROR
    assert len(r.errlines) == 2


def test_agents_table_without_command(fleeter: Any) -> None:
    check(
        fleeter,
        "[agents.codex]\nargs = ['x']\n\n" + task("a", agent='"codex"'),
        "ERROR: tasks.toml:1: agents.codex: command is missing",
        "ERROR: tasks.toml:2: agents.codex.args: unknown key (known: command, env, stdin)",
    )


def test_agents_command_not_a_list(fleeter: Any) -> None:
    check(
        fleeter,
        "[agents.codex]\ncommand = 'codex {prompt}'\n\n" + task("a", agent='"codex"'),
        "ERROR: tasks.toml:2: agents.codex.command: expected a list of strings, got a string",
    )


def test_an_agents_table_no_task_uses_is_checked_with_its_lines(fleeter: Any) -> None:
    # a slip in a table no task of this run uses is found now, not the night a task does
    check(
        fleeter,
        """
        [agents.codex]
        command = ["codex", "exec", "{prompt}"]
        stdn = true

        [agents.aider]
        command = []

        [[task]]
        name = "a"
        prompt = "x"
    """,
        "ERROR: tasks.toml:3: agents.codex.stdn: unknown key (did you mean 'stdin'?)",
        "ERROR: tasks.toml:6: agents.aider.command: must not be empty",
    )


def test_a_placeholder_typo_in_a_command_agent_is_an_error_with_its_line(fleeter: Any) -> None:
    check(
        fleeter,
        """
        [agents.codex]
        command = ["codex", "exec", "--cd", "{workdri}",
                   "{promt}"]

        [[task]]
        name = "a"
        prompt = "x"
        agent = "codex"
    """,
        "ERROR: tasks.toml:2: agents.codex.command: unknown placeholder {workdri} (did you mean {workdir}?), "
        "unknown placeholder {promt} (did you mean {prompt}?)",
    )


@pytest.mark.parametrize("where", ["config.toml", "fleetrun.toml"])
def test_a_placeholder_typo_in_config_toml_or_the_project_file(fleeter: Any, where: str) -> None:
    text = '[agents.script]\ncommand = ["{python}", "agent.py", "{atempt}"]\n'
    if where == "config.toml":
        fleeter.write_config(text)
        shown = str(fleeter.home / "config.toml")
    else:
        fleeter.write("fleetrun.toml", text)
        shown = "fleetrun.toml"
    check(
        fleeter,
        task("a", agent='"script"'),
        f"ERROR: {shown}:2: agents.script.command: unknown placeholder {{atempt}} (did you mean {{attempt}}?)",
    )


def test_braces_that_are_no_placeholder_name_pass(fleeter: Any) -> None:
    r = validate(
        fleeter,
        """
        [agents.script]
        command = ["{python}", "-c", "import json; i = 1; print(json.dumps({'a': 1}), f'{i}')", "{}",
                   "sh -c 'echo ${HOME} {print}'", "{prompt}"]

        [[task]]
        name = "a"
        prompt = "x"
        agent = "script"
    """,
    )
    assert_valid(r, "tasks.toml: 1 task, valid")


def test_a_task_that_must_run_here_pinned_to_a_peer_is_an_error(fleeter: Any) -> None:
    # it would wait for ever, and the run end with "cannot place"
    check(
        fleeter,
        task("a", peer='"mini"') + '  [[task.verify]]\n  brain = "is it done?"\n  model = "m"\n',
        "ERROR: tasks.toml:4: task 'a': peer: pinned to mini, but a task with a brain verifier and no git_ref "
        "runs on this machine (the verifier runs here, and without git_ref the work on a peer is on no branch "
        "to fetch back)",
    )


# ---------------------------------------------------------------------------------
# keys declared by plugins

FLEETCONF = """
    import fleetrun

    def fleetrun_task_keys(config):
        return [
            fleetrun.KeyDecl("priority", (int,), doc="higher runs first"),
            fleetrun.KeyDecl("http", (str,), where="verify_kind", doc="URL that must answer 200"),
            fleetrun.KeyDecl("expect_status", (int,), where="verify"),
        ]
"""


class Capture:
    """A plugin that keeps what was collected."""

    def __init__(self) -> None:
        self.items: list[Any] = []

    def fleetrun_collection_modifyitems(self, config: Any, items: list[Any]) -> None:
        self.items = list(items)


def test_plugin_task_key(fleeter: Any) -> None:
    fleeter.write_fleetconf(FLEETCONF)
    fleeter.write_tasks(task("a", priority="3"))
    cap = Capture()
    r = fleeter.run("validate", "tasks.toml", plugins=[cap])
    assert (r.ret, r.outlines, r.errlines) == (0, ["tasks.toml: 1 task, valid"], [])
    assert cap.items[0].extra == {"priority": 3}


def test_plugin_task_key_wrong_type(fleeter: Any) -> None:
    fleeter.write_fleetconf(FLEETCONF)
    check(
        fleeter, task("a", priority='"x"'), "ERROR: tasks.toml:4: task 'a': priority: must be an integer, not a string"
    )


def test_plugin_task_key_suggested(fleeter: Any) -> None:
    fleeter.write_fleetconf(FLEETCONF)
    check(
        fleeter,
        task("a", priorty="3"),
        "ERROR: tasks.toml:4: task 'a': priorty: unknown key (did you mean 'priority'?)",
    )


def test_undeclared_key_without_the_plugin(fleeter: Any) -> None:
    check(fleeter, task("a", priority="3"), "ERROR: tasks.toml:4: task 'a': priority: unknown key")


def test_plugin_verify_kind(fleeter: Any) -> None:
    fleeter.write_fleetconf(FLEETCONF)
    fleeter.write_tasks(
        task("a") + '  [[task.verify]]\n  http = "http://127.0.0.1:8000/health"\n'
        "  expect_status = 204\n  timeout_s = 5\n"
    )
    cap = Capture()
    r = fleeter.run("validate", "tasks.toml", plugins=[cap])
    assert (r.ret, r.outlines, r.errlines) == (0, ["tasks.toml: 1 task, valid"], [])
    (v,) = cap.items[0].verify
    assert (v.kind, v.text, v.timeout_s, v.extra) == (
        "http",
        "http://127.0.0.1:8000/health",
        5.0,
        {"expect_status": 204},
    )


def test_plugin_verify_kind_counts_as_a_kind(fleeter: Any) -> None:
    fleeter.write_fleetconf(FLEETCONF)
    check(
        fleeter,
        task("a") + '  [[task.verify]]\n  run = "make"\n  http = "http://x"\n',
        "ERROR: tasks.toml:4: task 'a': verify #1: needs exactly one of run / brain / agent / http, found 2: run, http",
    )


def test_plugin_verify_kind_wrong_type(fleeter: Any) -> None:
    fleeter.write_fleetconf(FLEETCONF)
    check(
        fleeter,
        task("a") + "  [[task.verify]]\n  http = 80\n",
        "ERROR: tasks.toml:5: task 'a': verify #1: http: must be a string, not the number 80",
    )


def test_plugin_verify_kind_unknown_without_plugin(fleeter: Any) -> None:
    check(
        fleeter,
        task("a") + '  [[task.verify]]\n  http = "http://x"\n',
        "ERROR: tasks.toml:4: task 'a': verify #1: needs exactly one of run / brain / agent, found none",
        "ERROR: tasks.toml:5: task 'a': verify #1: http: unknown key",
    )


@pytest.mark.parametrize("plugin,kind", [("verify_brain", "brain"), ("verify_agent", "agent"), ("verify_run", "run")])
def test_a_verifier_kind_whose_plugin_is_blocked_does_not_validate(fleeter: Any, plugin: str, kind: str) -> None:
    """Issue 23: a verifier kind is its plugin's (``fleetrun_task_keys``); with the
    plugin blocked, a verifier of that kind is an error naming the plugin, not "valid"."""
    assert_errors(
        validate(
            fleeter, task("a") + f'  [[task.verify]]\n  {kind} = "is it done?"\n', "-p", f"no:{plugin}", "tasks.toml"
        ),
        f"ERROR: tasks.toml:5: task 'a': verify #1: {kind}: unknown verifier kind {kind}: "
        f"its plugin {plugin} is not loaded (-p no:{plugin})",
    )
    others = " / ".join(k for k in ("run", "brain", "agent") if k != kind)
    check(
        fleeter,
        task("a") + "  [[task.verify]]\n  timeout_s = 10\n",
        "ERROR: tasks.toml:4: task 'a': verify #1: needs exactly one of run / brain / agent, found none",
    )
    assert_errors(
        validate(fleeter, task("a") + "  [[task.verify]]\n  timeout_s = 10\n", "-p", f"no:{plugin}", "tasks.toml"),
        f"ERROR: tasks.toml:4: task 'a': verify #1: needs exactly one of {others}, found none",
    )


def test_plugin_key_with_check(fleeter: Any) -> None:
    fleeter.write_fleetconf("""
        import fleetrun

        def fleetrun_task_keys(config):
            return [fleetrun.KeyDecl("priority", (int,), check=lambda v: None if 0 <= v <= 9 else "must be 0..9")]
    """)
    check(fleeter, task("a", priority="10"), "ERROR: tasks.toml:4: task 'a': priority: must be 0..9")


def test_plugin_key_in_a_parent_fleetconf(fleeter: Any) -> None:
    fleeter.make_repo("proj")
    fleeter.write_fleetconf(FLEETCONF, folder="proj")
    fleeter.write_tasks(task("a", priority="1"), name="proj/plans/tasks.toml")
    r = fleeter.run("validate", "proj/plans/tasks.toml")
    assert (r.ret, r.errlines) == (
        0,
        [
            f"warning: proj/plans/tasks.toml:1: task 'a': no git_ref: the agent works "
            f"in your checkout {fleeter.path / 'proj'} itself"
        ],
    )


# ---------------------------------------------------------------------------------
# -k


KTASKS = """
    [[task]]
    name = "user-schema"
    prompt = "x"

    [[task]]
    name = "user-api"
    prompt = "x"
    depends_on = ["user-schema"]

    [[task]]
    name = "base"
    prompt = "x"

    [[task]]
    name = "order-schema"
    prompt = "x"
    depends_on = ["base"]

    [[task]]
    name = "docs"
    prompt = "x"
"""


def collected(result: Any) -> list[str]:
    return [line for line in result.outlines if line.startswith("<Task ")]


def test_collect_only_all(fleeter: Any) -> None:
    fleeter.write_tasks(KTASKS)
    r = fleeter.run("--collect-only")
    assert r.ret == 0
    assert collected(r) == [
        "<Task user-schema>",
        "<Task user-api>  (after user-schema)",
        "<Task base>",
        "<Task order-schema>  (after base)",
        "<Task docs>",
    ]
    r.fnmatch_lines(["5 tasks collected"], stream="out")


def test_k_selects(fleeter: Any) -> None:
    fleeter.write_tasks(KTASKS)
    r = fleeter.run("--collect-only", "-k", "user and not api")
    assert r.ret == 0
    assert collected(r) == ["<Task user-schema>"]


def test_k_pulls_in_dependencies(fleeter: Any) -> None:
    fleeter.write_tasks(KTASKS)
    r = fleeter.run("--collect-only", "-k", "schema and not api")
    assert (r.ret, r.errlines) == (0, [])
    # order-schema needs base, which the expression did not select
    assert collected(r) == ["<Task user-schema>", "<Task base>", "<Task order-schema>  (after base)"]
    r.fnmatch_lines(["3/5 tasks collected (2 deselected)"], stream="out")


def test_k_pulls_in_dependencies_transitively(fleeter: Any) -> None:
    fleeter.write_tasks(task("a") + task("b", depends_on='["a"]') + task("c", depends_on='["b"]') + task("d"))
    r = fleeter.run("--co", "-k", "c")
    assert collected(r) == ["<Task a>", "<Task b>  (after a)", "<Task c>  (after b)"]


def test_k_is_case_insensitive(fleeter: Any) -> None:
    fleeter.write_tasks(KTASKS)
    r = fleeter.run("--collect-only", "-k", "DOCS or BASE")
    assert collected(r) == ["<Task base>", "<Task docs>"]


def test_k_matches_nothing(fleeter: Any) -> None:
    fleeter.write_tasks(KTASKS)
    r = fleeter.run("--collect-only", "-k", "nothing")
    assert r.ret == NO_TASKS
    assert collected(r) == []


def test_k_with_validate(fleeter: Any) -> None:
    fleeter.write_tasks(KTASKS)
    r = fleeter.run("validate", "-k", "docs", "tasks.toml")
    assert (r.ret, r.outlines) == (0, ["tasks.toml: 1 task, valid"])


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("schema and", "unexpected end"),
        ("(schema", "unexpected end"),
        ("schema)", "unexpected ')'"),
        ("and docs", "unexpected 'and'"),
        ("user api", "unexpected 'api'"),
    ],
)
def test_k_bad_expression(fleeter: Any, expr: str, message: str) -> None:
    fleeter.write_tasks(KTASKS)
    r = fleeter.run("--collect-only", "-k", expr)
    assert_errors(r, f"ERROR: -k: bad expression {expr!r}: {message}")


def test_k_bad_expression_validate(fleeter: Any) -> None:
    fleeter.write_tasks(KTASKS)
    assert_errors(fleeter.run("validate", "-k", "not", "tasks.toml"), "ERROR: -k: bad expression 'not': unexpected end")


# ---------------------------------------------------------------------------------
# the worked example


def test_demo_example_is_valid(fleeter: Any) -> None:
    from pathlib import Path

    demo = Path(__file__).resolve().parent.parent / "examples" / "demo" / "tasks.toml"
    text = demo.read_text()
    fleeter.make_repo("sandbox")
    (fleeter.path / "tasks.toml").write_text(text)
    r = fleeter.run("validate", "tasks.toml")
    assert (r.ret, r.outlines, r.errlines) == (0, ["tasks.toml: 3 tasks, valid"], [])


def test_docs_example_is_valid(fleeter: Any) -> None:
    """The full example in docs/tasks-toml.md validates as written."""
    from pathlib import Path

    doc = Path(__file__).resolve().parent.parent / "docs" / "tasks-toml.md"
    if not doc.exists():
        pytest.skip("docs/tasks-toml.md not written")
    text = doc.read_text()
    start = text.index("<!-- example:start -->")
    block = text[start : text.index("<!-- example:end -->")]
    toml = block.split("```toml\n", 1)[1].rsplit("```", 1)[0]
    fleeter.make_repo("backend")
    fleeter.make_repo("frontend")
    fleeter.write("tasks.toml", textwrap.dedent(toml))
    r = fleeter.run("validate", "tasks.toml")
    assert_valid(r, "tasks.toml: 3 tasks, valid")


# ---------------------------------------------------------------------------------
# hostile input (issue 10): escapes, branches that are not fleetrun's, symlinked paths


def test_name_with_terminal_escapes_is_shown_escaped(fleeter: Any) -> None:
    """A name that would clear the screen and set the window title is printed with its
    control characters made visible: no raw ESC or BEL reaches the terminal."""
    r = validate(fleeter, '[[task]]\nname = "\\u001b[2J\\u001b]0;owned\\u0007x"\nprompt = "p"\n')
    assert "\x1b" not in r.stderr and "\x07" not in r.stderr
    assert_errors(
        r, "ERROR: tasks.toml:2: task '\\x1b[2J\\x1b]0;owned\\x07x': name: must not contain control characters"
    )


def test_name_with_c1_control_is_refused(fleeter: Any) -> None:
    """A C1 CSI (U+009B) works like ESC [ on some terminals: refused like any control."""
    r = validate(fleeter, '[[task]]\nname = "a\\u009b2Jb"\nprompt = "p"\n')
    assert "\x9b" not in r.stderr
    assert_errors(r, "ERROR: tasks.toml:2: task 'a\\x9b2Jb': name: must not contain control characters")


def _branch_repo(fleeter: Any) -> Any:
    repo = fleeter.make_repo("repo")
    fleeter.git(repo, "branch", "release")
    return repo


@pytest.mark.parametrize("verb", ["validate", "queue", "run"])
def test_branch_that_exists_is_an_error(fleeter: Any, fake_claude: Any, verb: str) -> None:
    """`branch = "main"` with `git_ref = "release"` would commit straight onto main."""
    repo = _branch_repo(fleeter)
    fleeter.write_tasks(task("x", cwd='"repo"', git_ref='"release"', branch='"main"'))
    args = ("tasks.toml",) if verb == "run" else (verb, "tasks.toml")
    r = fleeter.run(*args)
    assert_errors(
        r,
        f"ERROR: tasks.toml:6: task 'x': branch: branch 'main' already exists in {repo}; fleetrun "
        "only works on branches it creates (leave branch out, or name a new one)",
    )
    if verb != "validate":
        assert not (fleeter.home / "state.db").exists() or fleeter.states() == {}


def test_branch_that_exists_in_a_subfolder_cwd(fleeter: Any) -> None:
    repo = _branch_repo(fleeter)
    (repo / "sub").mkdir()
    check(
        fleeter,
        task("x", cwd='"repo/sub"', git_ref='"main"', branch='"release"'),
        f"ERROR: tasks.toml:6: task 'x': branch: branch 'release' already exists in {repo}; fleetrun "
        "only works on branches it creates (leave branch out, or name a new one)",
    )


def test_two_tasks_naming_one_branch(fleeter: Any) -> None:
    fleeter.make_repo("repo")
    check(
        fleeter,
        task("a", cwd='"repo"', git_ref='"main"', branch='"feat"')
        + task("b", cwd='"repo"', git_ref='"main"', branch='"feat"'),
        "ERROR: tasks.toml:12: task 'b': branch: branch 'feat' is also named by task 'a' (tasks.toml:6); "
        "each task needs a branch of its own",
    )


def test_two_tasks_naming_one_branch_across_files(fleeter: Any) -> None:
    fleeter.make_repo("repo")
    fleeter.write_tasks(task("a", cwd='"repo"', git_ref='"main"', branch='"feat"'), name="one.toml")
    fleeter.write_tasks("# two\n" + task("b", cwd='"repo"', git_ref='"main"', branch='"feat"'), name="two.toml")
    for verb in ("validate", "queue"):
        assert_errors(
            fleeter.run(verb, "one.toml", "two.toml"),
            "ERROR: two.toml:7: task 'b': branch: branch 'feat' is also named by task 'a' (one.toml:6); "
            "each task needs a branch of its own",
        )


def test_one_branch_name_in_two_repositories_is_fine(fleeter: Any) -> None:
    fleeter.make_repo("r1")
    fleeter.make_repo("r2")
    r = validate(
        fleeter,
        task("a", cwd='"r1"', git_ref='"main"', branch='"feat"')
        + task("b", cwd='"r2"', git_ref='"main"', branch='"feat"'),
    )
    assert_valid(r, "tasks.toml: 2 tasks, valid")


def test_a_branch_fleetrun_created_for_the_same_task_may_be_reused(fleeter: Any, fake_claude: Any) -> None:
    """End to end: a task with `branch =` runs; a new queue of the same task (changed
    file) names the branch fleetrun created for it: allowed, and `logs` says so. A task
    of another name may not take it."""
    repo = fleeter.make_repo("repo")
    fake_claude.script(x=[{"actions": [["write", "one.txt", "1"]]}, {"actions": [["write", "two.txt", "2"]]}])
    fleeter.write_tasks(task("x", cwd='"repo"', git_ref='"main"', branch='"feat"'))
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    first = fleeter.task("x")
    assert first.branch == "feat"

    # the branch exists now; the same task name may take it again (a changed file: a new queue)
    fleeter.write_tasks(task("x", cwd='"repo"', git_ref='"main"', branch='"feat"') + "# again\n")
    assert_valid(fleeter.run("validate", "tasks.toml"), "tasks.toml: 1 task, valid")
    # a comment alone re-runs nothing (issue 14): --new-queue runs the same task again
    r = fleeter.run("tasks.toml", "--new-queue")
    assert r.ret == 0, r.stdout + r.stderr
    second = fleeter.task("x")
    assert second.id != first.id
    logs = fleeter.run("logs", second.id)
    logs.fnmatch_lines([f"*note: reusing branch feat that fleetrun created for task x ({first.id})"])
    assert set(fleeter.git(repo, "ls-tree", "--name-only", "feat").split()) >= {"one.txt", "two.txt"}

    # another task may not
    fleeter.write_tasks(task("y", cwd='"repo"', git_ref='"main"', branch='"feat"'))
    check(
        fleeter,
        task("y", cwd='"repo"', git_ref='"main"', branch='"feat"'),
        f"ERROR: tasks.toml:6: task 'y': branch: branch 'feat' already exists in {repo}; fleetrun "
        "only works on branches it creates (leave branch out, or name a new one)",
    )


def test_path_through_a_symlink_out_of_cwd(fleeter: Any) -> None:
    """`paths = ["root/etc/shadow"]` where `root` links to `/`: resolved, not read as text."""
    import os

    repo = fleeter.make_repo("repo")
    os.symlink("/", repo / "root")
    os.symlink("../..", repo / "up")
    (repo / "src").mkdir()
    os.symlink("src", repo / "inside")
    check(
        fleeter,
        task("a", cwd='"repo"', paths='["src", "inside/x.py", "root/etc/shadow", "up/x"]'),
        "ERROR: tasks.toml:5: task 'a': paths: 'root/etc/shadow' resolves to /etc/shadow, outside cwd",
        f"ERROR: tasks.toml:5: task 'a': paths: 'up/x' resolves to {fleeter.path.parent / 'x'}, outside cwd",
    )


def test_relay_tags_must_be_a_list(fleeter: Any) -> None:
    fleeter.write_config('# relay\n[relay]\nheartbeat_secs = 5\ntags = "gpu"\n')
    fleeter.write_tasks('[agents.ok]\ncommand = ["true"]\n' + task("a", agent='"ok"'))
    for args in (("validate", "tasks.toml"), ("tasks.toml",), ("queue", "tasks.toml")):
        assert_errors(
            fleeter.run(*args),
            f"ERROR: {fleeter.home / 'config.toml'}:4: relay.tags: expected a list of strings, got a string",
        )
    fleeter.write_config('[relay]\ntags = ["gpu", 3]\n')
    assert_errors(
        fleeter.run("validate", "tasks.toml"),
        f"ERROR: {fleeter.home / 'config.toml'}:2: relay.tags: expected a list of strings, got a list "
        "holding the number 3",
    )


# ---------------------------------------------------------------------------------
# the command line itself


@pytest.mark.parametrize("value", ["-1", "0"])
def test_max_tasks_must_be_at_least_one(fleeter: Any, value: str) -> None:
    fleeter.write_tasks(task("a"))
    for verb in ((), ("work", "--until-idle")):
        # argparse writes its errors to the real stderr
        r = fleeter.runsub(*verb, "--max-tasks", value, *(() if verb else ("tasks.toml",)))
        assert r.ret == USAGE_ERROR, r
        assert r.errlines[-1].endswith(
            f"argument --max-tasks: {value} is not a whole number of at least 1 (to start nothing, use fleetrun drain)"
        ), r.errlines
        assert not (fleeter.home / "state.db").exists()


def test_misspelt_verb_is_not_taken_for_a_file(fleeter: Any) -> None:
    r = fleeter.run("stauts")
    assert (r.ret, r.outlines, r.errlines) == (
        USAGE_ERROR,
        [],
        ["ERROR: stauts: not a file or a verb (did you mean status?)"],
    )
    r = fleeter.run("frobnicate")
    assert (r.ret, r.errlines) == (
        USAGE_ERROR,
        [
            "ERROR: frobnicate: not a file or a verb (verbs: run, validate, queue, work, status, logs, cancel, retry, "
            "approve, drain, undrain, gc, relay, host, role, mailbox, report)"
        ],
    )
    # a real file by that name is a file
    fleeter.write("stauts", "")
    r = fleeter.run("validate", "stauts")
    assert r.errlines == ["ERROR: stauts: no collector takes this kind of file (tasks files are .toml)"]


def test_a_directory_means_its_tasks_toml(fleeter: Any) -> None:
    fleeter.write("sub/tasks.toml", task("a"))
    fleeter.write("sub/deeper/tasks.toml", task("b"))
    r = fleeter.run("validate", "sub")
    assert (r.ret, r.outlines, r.errlines) == (0, ["sub/tasks.toml: 1 task, valid"], [])
    r = fleeter.run("--co", "sub")
    assert r.ret == 0 and "a" in r.stdout and "b" not in r.stdout.replace("tasks", ""), r.stdout


def test_a_directory_without_tasks_toml_names_what_it_holds(fleeter: Any) -> None:
    fleeter.write("q/tasks-night.toml", task("a"))
    fleeter.write("q/more/tasks.toml", task("b"))
    fleeter.write("q/notes.toml", "")
    r = fleeter.run("validate", "q")
    assert (r.ret, r.errlines) == (
        USAGE_ERROR,
        ["ERROR: q: no tasks.toml in this folder; name a file: q/more/tasks.toml, q/tasks-night.toml"],
    )
    (fleeter.path / "empty").mkdir()
    r = fleeter.run("validate", "empty")
    assert (r.ret, r.errlines) == (USAGE_ERROR, ["ERROR: empty: no tasks.toml in this folder"])


def test_relay_help_is_what_relay_help_names(fleeter: Any) -> None:
    r = fleeter.runsub("relay", "--help")  # argparse writes --help to the real stdout
    assert r.ret == 0
    assert "fleetrun relay help" in r.stdout
    r = fleeter.run("relay", "help")
    assert (r.ret, r.errlines) == (0, [])
    assert r.outlines[0] == "usage: fleetrun relay [-h] {add,peers,remove} ..."
    assert any(line.split()[:1] == ["add"] for line in r.outlines), r.stdout
    # and the host verb names only what works
    r = fleeter.runsub("host", "--help")
    assert r.ret == 0 and "fleetrun host help" not in r.stdout and "verify-status" in r.stdout


def test_sigterm_of_work_is_a_clean_stop(fleeter: Any) -> None:
    """A service manager stops `fleetrun work` with SIGTERM: that is its normal end, exit 0
    (systemd counts 0 as a clean stop, and 2 or 143 as a failure)."""
    import json
    import signal
    import time

    proc = fleeter.popen("work")
    try:
        live = fleeter.home / "supervisor.json"
        deadline = time.monotonic() + 60
        while not (live.exists() and json.loads(live.read_text() or "{}").get("pid") == proc.pid):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, (proc.returncode, out, err)
    assert b"Traceback" not in err


def test_collect_only_with_nothing_selected_says_no_tasks_collected(fleeter: Any) -> None:
    fleeter.write_tasks(task("a"))
    r = fleeter.run("--co", "-k", "nomatch", "tasks.toml")
    assert (r.ret, r.outlines, r.errlines) == (NO_TASKS, ["no tasks collected"], [])


# setup: the keys, and the editable-install trap of run verifiers


def test_setup_keys(fleeter: Any) -> None:
    check(
        fleeter,
        'setup = "make venv"\n'
        + task("a", setup='["ok", {run = "x", timeot_s = 5}]')
        + task("b", setup='[{timeout_s = 5}, 3, ""]')
        + task("c", setup='[{run = "x", timeout_s = 0}]'),
        "ERROR: tasks.toml:1: setup: must be a list of commands, not a string",
        "ERROR: tasks.toml:5: task 'a': setup #2: timeot_s: unknown key (did you mean 'timeout_s'?)",
        "ERROR: tasks.toml:9: task 'b': setup #1: needs run = \"command\"",
        "ERROR: tasks.toml:9: task 'b': setup #2: must be a command string or a table "
        "{run = ..., timeout_s = ...}, not the number 3",
        "ERROR: tasks.toml:9: task 'b': setup #3: must not be empty",
        "ERROR: tasks.toml:13: task 'c': setup #1: timeout_s: must be greater than 0",
    )


def test_setup_valid_forms(fleeter: Any) -> None:
    fleeter.write_tasks(
        'setup = ["python -m venv .venv"]\n'
        + task("a")
        + task("b", setup='[{run = "uv sync", timeout_s = 600}, "true"]')
        + task("c", setup="[]")
    )
    assert_valid(fleeter.run("validate", "tasks.toml"), "tasks.toml: 3 tasks, valid")
    from fleetrun.collect import KeyTable, collect_toml

    tf = collect_toml(fleeter.path / "tasks.toml", KeyTable.build(), "tasks.toml")
    a, b, c = tf.tasks
    assert [(s.text, s.timeout_s) for s in a.setup] == [("python -m venv .venv", 1800.0)]
    assert [(s.text, s.timeout_s, s.extra) for s in b.setup] == [
        ("uv sync", 600.0, {"setup": 1}),
        ("true", 1800.0, {"setup": 2}),
    ]
    assert c.setup == []


PYPROJECT = """\
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "tinypkg"
version = "0.1"
"""


# ---------------------------------------------------------------------------------
# warnings: valid, but a verifier that could not judge


def verify_task(*runs: str, extra: str = "") -> str:
    body = "".join(f"\n  [[task.verify]]\n  run = {r}\n" for r in runs)
    return f'[[task]]\nname = "a"\nprompt = "do it"\n{extra}{body}'


def test_warns_when_a_run_verifiers_command_is_not_found(fleeter: Any) -> None:
    (fleeter.path / "check.sh").write_text("#!/bin/sh\n")
    r = validate(
        fleeter,
        verify_task(
            "'no-such-tool --all'",
            "'./missing.sh'",
            "'./check.sh'",
            "'FOO=1 grep -q x y'",
            "'cd sub && make'",
            '"test -f x"',
            '"no-such-tool \\"unbalanced"',
        ),
    )
    assert_valid(r, "tasks.toml: 1 task, valid")
    assert r.errlines == [
        "warning: tasks.toml:5: task 'a': verify #1: no-such-tool is not on PATH "
        "(the verifier would fail, command not found)",
        "warning: tasks.toml:8: task 'a': verify #2: ./missing.sh is not in the task's cwd "
        "(the verifier would fail, command not found)",
    ]


def test_a_missing_verifier_command_is_one_warning_for_all_its_tasks(fleeter: Any) -> None:
    # one cause, one warning, at the first task's verifier: a file of 100,000 tasks
    # sharing a verifier printed 100,000 lines
    r = validate(
        fleeter,
        "".join(
            f'[[task]]\nname = "{n}"\nprompt = "p"\n\n  [[task.verify]]\n  run = "no-such-tool"\n\n'
            for n in ("a", "b", "c")
        )
        + '[[task]]\nname = "d"\nprompt = "p"\n\n  [[task.verify]]\n  run = "true"\n'
        + '\n  [[task.verify]]\n  run = "no-such-tool"\n',
    )
    assert_valid(r, "tasks.toml: 4 tasks, valid")
    assert r.errlines == [
        "warning: tasks.toml:5: task 'a' and 2 more tasks: verify #1: no-such-tool is not on PATH "
        "(the verifier would fail, command not found)",
        "warning: tasks.toml:29: task 'd': verify #2: no-such-tool is not on PATH "
        "(the verifier would fail, command not found)",
    ]


def test_a_relative_command_a_setup_step_may_make_is_not_warned_about(fleeter: Any) -> None:
    r = validate(fleeter, verify_task("'.venv/bin/python -m pytest'", extra='setup = ["python3 -m venv .venv"]\n'))
    assert (r.ret, r.errlines) == (0, [])


def test_warns_when_a_brain_verifier_has_no_brain_configured(fleeter: Any) -> None:
    r = validate(fleeter, task("a") + '\n  [[task.verify]]\n  brain = "Is it done?"\n  model = "qwen"\n')
    assert_valid(r, "tasks.toml: 1 task, valid")
    assert r.errlines == [
        "warning: tasks.toml:5: task 'a': verify #1: no [brain] is configured (config.toml, the project file or "
        "the tasks file): the verifier asks http://127.0.0.1:11434"
    ]
    fleeter.write_config('[brain]\nurl = "http://127.0.0.1:9"\n')
    assert fleeter.run("validate", "tasks.toml").errlines == []


def test_a_brain_verifier_without_a_brain_is_one_warning_for_all_its_tasks(fleeter: Any) -> None:
    brain = '\n  [[task.verify]]\n  brain = "Is it done?"\n'
    r = validate(fleeter, task("a") + brain + '  model = "qwen"\n\n' + task("b") + brain + task("c") + brain)
    assert_valid(r, "tasks.toml: 3 tasks, valid")
    assert r.errlines == [
        "warning: tasks.toml:5: task 'a': verify #1: no [brain] is configured (config.toml, the project file or "
        "the tasks file): the verifier asks http://127.0.0.1:11434",
        "warning: tasks.toml:13: task 'b' and 1 more task: verify #1: a brain verifier needs a model: set [brain] "
        "model (config.toml or the tasks file) or model = on the verifier; without one it fails",
    ]


def test_the_test_extra_installs_what_the_editable_fixtures_build_with() -> None:
    """``editable_venv`` (and tests/acceptance/test_setup.py) run ``pip install -e``
    offline with this venv's setuptools: before setuptools 70.1, ``bdist_wheel`` is in
    ``wheel``, which a fresh venv lacks (``invalid command 'bdist_wheel'``). The README's
    ``pip install -e '.[test]'`` must bring both."""
    import configparser
    import re
    from pathlib import Path

    cfg = configparser.ConfigParser()
    cfg.read(Path(__file__).resolve().parent.parent / "setup.cfg")
    extra = [ln.strip() for ln in cfg["options.extras_require"]["test"].splitlines()]
    names = {re.split(r"[<>=!~;\[ ]", ln, maxsplit=1)[0].lower() for ln in extra if ln and not ln.startswith("#")}
    assert {"setuptools", "wheel"} <= names, names


@pytest.fixture(scope="module")
def editable_venv(tmp_path_factory: Any) -> tuple[Any, Any]:
    """A git checkout of a tiny src-layout package, and a real venv with it installed
    the usual way (``pip install -e``; offline, with this interpreter's setuptools)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import setuptools

    from fleetrun.fleeter import GIT_ENV

    root = tmp_path_factory.mktemp("editable")
    repo = root / "checkout"
    (repo / "src" / "tinypkg").mkdir(parents=True)
    (repo / "src" / "tinypkg" / "__init__.py").write_text("VALUE = 1\n")
    (repo / "pyproject.toml").write_text(PYPROJECT)
    env = dict(os.environ, **GIT_ENV)
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "initial"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True, env=env)
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    pip_env = dict(os.environ, PYTHONPATH=str(Path(setuptools.__file__).parent.parent))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "-q",
            "--no-index",
            "--no-build-isolation",
            "--no-deps",
            "-e",
            str(repo),
        ],
        check=True,
        env=pip_env,
        stdout=subprocess.DEVNULL,
    )
    # a console script, as pip leaves one (the venv has no pytest: the verifier is not run)
    script = venv / "bin" / "pytest"
    script.write_text(f"#!{venv / 'bin' / 'python'}\nimport sys\nsys.exit(0)\n")
    script.chmod(0o755)
    return repo, venv


def test_warns_when_a_verifier_imports_the_checkout_not_the_worktree(fleeter: Any, editable_venv: Any) -> None:
    repo, venv = editable_venv
    r = validate(
        fleeter,
        f'''[[task]]
name = "x"
prompt = "p"
cwd = "{repo}"
git_ref = "main"

  [[task.verify]]
  run = "{venv}/bin/python -m pytest -x -q"

  [[task.verify]]
  run = "PYTHONPATH=src {venv}/bin/python -m pytest"

  [[task.verify]]
  run = "{venv}/bin/pytest -q"

  [[task.verify]]
  run = "python3 -c 1"

[[task]]
name = "in-checkout"
prompt = "p"
cwd = "{repo}"

  [[task.verify]]
  run = "{venv}/bin/python -m pytest"
''',
    )
    assert_valid(r, "tasks.toml: 2 tasks, valid")
    fix = "add PYTHONPATH=src or a setup step (docs/verifiers.md)"
    assert r.errlines == [
        # a task without git_ref works in the checkout itself: that warning, not the editable one
        f"warning: tasks.toml:19: task 'in-checkout': no git_ref: the agent works in your checkout {repo} itself",
        f"warning: tasks.toml:7: task 'x': verify: {venv}/bin/python imports tinypkg from {repo} "
        f"(an editable install of the main checkout), not from the worktree; {fix}",
        f"warning: tasks.toml:13: task 'x': verify: {venv}/bin/pytest imports tinypkg from {repo} "
        f"(an editable install of the main checkout), not from the worktree; {fix}",
    ]


def test_an_editable_trap_is_one_warning_for_all_its_tasks(fleeter: Any, editable_venv: Any) -> None:
    repo, venv = editable_venv
    one = f'[[task]]\nname = "{{}}"\nprompt = "p"\ncwd = "{repo}"\ngit_ref = "main"\n\n  [[task.verify]]\n'
    text = "".join(one.format(n) + f'  run = "{venv}/bin/python -m pytest"\n\n' for n in ("x", "y", "z"))
    r = validate(fleeter, text)
    assert_valid(r, "tasks.toml: 3 tasks, valid")
    assert r.errlines == [
        f"warning: tasks.toml:7: task 'x' and 2 more tasks: verify: {venv}/bin/python imports tinypkg from {repo} "
        "(an editable install of the main checkout), not from the worktree; "
        "add PYTHONPATH=src or a setup step (docs/verifiers.md)",
    ]


def test_editable_finder_and_pth_are_found_too(fleeter: Any, tmp_path: Any) -> None:
    """Installs that leave no direct_url.json: a path ``.pth`` (``setup.py develop``) and
    setuptools' ``__editable__`` finder, as they are written."""
    repo = fleeter.make_repo(files={"lib/pkg_a/__init__.py": "", "pkg_b/__init__.py": ""})
    for name, content in {
        "easy-install.pth": f"# a comment\nimport os\n{repo}/lib\n",
        "__editable___pkg_b_0_1_finder.py": f"import sys\nMAPPING: dict[str, str] = {{'pkg_b': '{repo}/pkg_b'}}\n",
    }.items():
        sp = tmp_path / f"env-{name[:4]}" / "lib" / "python3.11" / "site-packages"
        sp.mkdir(parents=True)
        (sp / name).write_text(content)
        (sp.parent.parent.parent / "bin").mkdir()
        python = sp.parent.parent.parent / "bin" / "python"  # there, never run
        python.write_text("#!/bin/sh\n")
        python.chmod(0o755)
    r = validate(
        fleeter,
        f'''[[task]]
name = "x"
prompt = "p"
cwd = "repo"
git_ref = "main"
  [[task.verify]]
  run = "{tmp_path}/env-easy/bin/python -m pytest"
  [[task.verify]]
  run = "{tmp_path}/env-__ed/bin/python -m pytest"
''',
    )
    assert_valid(r, "tasks.toml: 1 task, valid")
    assert [line.split(" imports ")[1].split(" (")[0] for line in r.errlines] == [
        f"pkg_a from {repo}/lib",
        f"pkg_b from {repo}",
    ]
    assert r.errlines[0].endswith("add PYTHONPATH=lib or a setup step (docs/verifiers.md)")


# what can never start: a git_ref that names nothing, a cwd in no repository, an
# agent that is not installed here


@pytest.mark.parametrize("verb", ["validate", "queue", "run"])
def test_git_ref_that_names_nothing(fleeter: Any, fake_claude: Any, verb: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("fleetrun.decide.NEVER_STARTED_CAP", 2)  # a fleetrun that only fails at run time ends soon
    monkeypatch.setattr("fleetrun.placement.BACKOFF_BASE_S", 0.01)
    repo = fleeter.make_repo("repo")
    fleeter.write_tasks(
        task("x", cwd='"repo"', git_ref='"nosuchbranch"') + task("y", cwd='"repo"', git_ref='"nosuchbranch"')
    )
    args = ("tasks.toml",) if verb == "run" else (verb, "tasks.toml")
    assert_errors(
        fleeter.run(*args),
        f"ERROR: tasks.toml:5: task 'x': git_ref: no branch, tag or commit 'nosuchbranch' in {repo}",
        f"ERROR: tasks.toml:10: task 'y': git_ref: no branch, tag or commit 'nosuchbranch' in {repo}",
    )
    if verb != "validate":
        assert not (fleeter.home / "state.db").exists() or fleeter.states() == {}


@pytest.mark.parametrize("verb", ["validate", "queue", "run"])
def test_git_ref_with_a_cwd_in_no_repository(
    fleeter: Any, fake_claude: Any, verb: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("fleetrun.decide.NEVER_STARTED_CAP", 2)
    monkeypatch.setattr("fleetrun.placement.BACKOFF_BASE_S", 0.01)
    (fleeter.path / "plain").mkdir()
    fleeter.write_tasks(task("x", cwd='"plain"', git_ref='"main"'))
    args = ("tasks.toml",) if verb == "run" else (verb, "tasks.toml")
    assert_errors(
        fleeter.run(*args),
        f"ERROR: tasks.toml:5: task 'x': git_ref: {fleeter.path / 'plain'} is not in a git repository",
    )


def test_git_ref_resolves_to_a_tag_a_commit_or_a_branch(fleeter: Any) -> None:
    repo = fleeter.make_repo("repo")
    fleeter.git(repo, "tag", "v1")
    sha = fleeter.git(repo, "rev-parse", "HEAD").strip()
    r = validate(
        fleeter,
        task("a", cwd='"repo"', git_ref='"v1"')
        + task("b", cwd='"repo"', git_ref=f'"{sha}"')
        + task("c", cwd='"repo"', git_ref='"main"'),
    )
    assert_valid(r, "tasks.toml: 3 tasks, valid")


def test_git_ref_in_a_subfolder_cwd(fleeter: Any) -> None:
    repo = fleeter.make_repo("repo")
    (repo / "sub").mkdir()
    check(
        fleeter,
        task("x", cwd='"repo/sub"', git_ref='"nope"'),
        f"ERROR: tasks.toml:5: task 'x': git_ref: no branch, tag or commit 'nope' in {repo}",
    )


def test_agent_not_on_path_is_one_warning_for_all_its_tasks(fleeter: Any) -> None:
    # one cause, one warning: the count and the first task's line (a file of 100,000
    # tasks printed 100,000 lines)
    fleeter.write_config('[claude]\nexecutable = "fleetrun-test-no-claude"\n')
    r = validate(fleeter, task("x") + task("y", model='"opus"') + task("z"))
    assert (r.ret, r.outlines) == (0, ["tasks.toml: 3 tasks, valid"])
    assert r.errlines == [
        "warning: tasks.toml:1: task 'x' and 2 more tasks: agent: fleetrun-test-no-claude is not on PATH "
        "(set [claude] executable in config.toml)",
    ]


def test_agent_not_executable_is_a_warning(fleeter: Any) -> None:
    exe = fleeter.write("claude", "#!/bin/sh\n")
    exe.chmod(0o644)
    fleeter.write_config(f'[claude]\nexecutable = "{exe}"\n')
    r = validate(fleeter, task("x", agent='"claude"'))
    assert (r.ret, r.outlines) == (0, ["tasks.toml: 1 task, valid"])
    assert r.errlines == [
        f"warning: tasks.toml:4: task 'x': agent: {exe} is not executable (set [claude] executable in config.toml)"
    ]


def test_command_agent_not_on_path_is_a_warning(fleeter: Any) -> None:
    r = validate(
        fleeter, task("x", agent='"codex"') + '\n[agents.codex]\ncommand = ["fleetrun-test-no-codex", "{prompt}"]\n'
    )
    assert (r.ret, r.outlines) == (0, ["tasks.toml: 1 task, valid"])
    assert r.errlines == [
        "warning: tasks.toml:4: task 'x': agent: fleetrun-test-no-codex is not on PATH (set [agents.codex] command)"
    ]


def test_command_agent_not_on_path_is_one_warning_for_all_its_tasks(fleeter: Any) -> None:
    r = validate(
        fleeter,
        task("x", agent='"codex"')
        + task("y", agent='"codex"')
        + '\n[agents.codex]\ncommand = ["fleetrun-test-no-codex", "{prompt}"]\n',
    )
    assert (r.ret, r.outlines) == (0, ["tasks.toml: 2 tasks, valid"])
    assert r.errlines == [
        "warning: tasks.toml:4: task 'x' and 1 more task: agent: fleetrun-test-no-codex is not on PATH "
        "(set [agents.codex] command)"
    ]


def test_agent_found_gives_no_warning(fleeter: Any, fake_claude: Any) -> None:
    r = validate(fleeter, task("x") + task("y", agent='"py"') + '\n[agents.py]\ncommand = ["{python}", "-c", "1"]\n')
    assert (r.ret, r.outlines, r.errlines) == (0, ["tasks.toml: 2 tasks, valid"], [])


# ---------------------------------------------------------------------------------
# top-level defaults of every task (docs/tasks-toml.md, "Defaults of every task")


DEFAULTS = """\
max_retries = 0
model = "sonnet"
allowed_tools = ["Read"]
requires = ["gpu"]
timeout_min = 5

"""


def test_top_level_defaults_apply_to_every_task_that_sets_none(fleeter: Any) -> None:
    fleeter.write_tasks(DEFAULTS + task("a") + task("b", model='"opus"', allowed_tools="[]", max_retries="4"))
    cap = Capture()
    r = fleeter.run("validate", "tasks.toml", plugins=[cap])
    # a default's warning names the line of the default, once for the tasks that took it
    never = (
        "requires: `gpu` is neither a tag of this machine ([relay] tags in config.toml) nor a probed tool "
        "(claude, git, cargo, python3, node); it is never met"
    )
    assert (r.ret, r.outlines, r.errlines) == (
        0,
        ["tasks.toml: 2 tasks, valid"],
        [f"warning: tasks.toml:4: task 'a' and 1 more task: {never}"],
    )
    a, b = cap.items
    assert (a.max_retries, a.model, a.allowed_tools, a.requires, a.timeout_min) == (0, "sonnet", ["Read"], ["gpu"], 5.0)
    # the task's own key wins; its own list replaces the default's (no merging)
    assert (b.max_retries, b.model, b.allowed_tools, b.requires) == (4, "opus", [], ["gpu"])
    assert a.requires is not b.requires  # each task its own copy
    assert (a.key_lines["model"], a.file_of("model")) == (2, a.source)


def test_validate_verbose_shows_the_defaults_each_task_takes(fleeter: Any) -> None:
    fleeter.write_tasks(
        'model = "sonnet"\nsetup = ["make deps"]\n\n'
        + task("a")
        + task("b", model='"opus"')
        + task("c", model='"opus"', setup="[]")
    )
    r = fleeter.run("validate", "-v", "tasks.toml")
    assert (r.ret, r.errlines) == (0, [])
    assert r.outlines == [
        "tasks.toml: 3 tasks, valid",
        '  a: model = "sonnet" (tasks.toml:1), setup = ["make deps"] (tasks.toml:2)',
        '  b: setup = ["make deps"] (tasks.toml:2)',
        "  c: no defaults",
    ]
    # without -v, as before
    assert fleeter.run("validate", "tasks.toml").outlines == ["tasks.toml: 3 tasks, valid"]


def test_top_level_default_mistakes_all_at_once(fleeter: Any) -> None:
    check(
        fleeter,
        'max_retries = -1\nmodel = 3\nname = "x"\ndepends_on = []\npermission_mode = "yolo"\n'
        'modle = "x"\n\n' + task("a", timeout_min="0"),
        "ERROR: tasks.toml:1: max_retries: must not be negative",
        "ERROR: tasks.toml:2: model: must be a string, not the number 3",
        "ERROR: tasks.toml:3: name: cannot be a default of every task (it is a task's identity); "
        "write it in each [[task]]",
        "ERROR: tasks.toml:4: depends_on: cannot be a default of every task (it is the task graph); "
        "write it in each [[task]]",
        "ERROR: tasks.toml:5: permission_mode: 'yolo' is not one of acceptEdits, auto, bypassPermissions, "
        "default, dontAsk, manual, plan",
        "ERROR: tasks.toml:6: modle: unknown key (did you mean 'model'?)",
        "ERROR: tasks.toml:11: task 'a': timeout_min: must be greater than 0",
    )


def test_top_level_agent_default_unknown_names_its_line(fleeter: Any) -> None:
    check(
        fleeter,
        'agent = "codex"\n\n' + task("a"),
        "ERROR: tasks.toml:1: task 'a': agent: 'codex' is not an agent (known: claude); declare it as [agents.codex]",
    )


def test_plugin_task_key_as_a_default(fleeter: Any) -> None:
    fleeter.write_fleetconf(FLEETCONF)
    fleeter.write_tasks("priority = 2\n\n" + task("a") + task("b", priority="7"))
    cap = Capture()
    r = fleeter.run("validate", "tasks.toml", plugins=[cap])
    assert (r.ret, r.errlines) == (0, [])
    assert [t.extra for t in cap.items] == [{"priority": 2}, {"priority": 7}]
    check(
        fleeter, 'priority = "high"\n\n' + task("a"), "ERROR: tasks.toml:1: priority: must be an integer, not a string"
    )

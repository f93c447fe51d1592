"""Project configuration: ``[tool.fleetrun]`` in a repository's ``pyproject.toml``, or a
``fleetrun.toml`` (docs/configuration.md), through the real CLI in a real git repository.

Which file, ``addopts``, the ``[task]`` defaults, plugin tables and which layer wins,
machine-level tables that stay in the home, and every mistake as
``ERROR: FILE:LINE: tool.fleetrun.KEY: message``, exit 4.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path
from typing import Any

import pytest

import fleetrun

USAGE_ERROR = 4
TASKS = """
[[task]]
name = "user-schema"
prompt = "x"

[[task]]
name = "user-api"
prompt = "y"

[[task]]
name = "fix-it"
prompt = "z"
"""


@pytest.fixture
def repo(fleeter: Any) -> Path:
    """A git repository with the tasks file in ``sub/``, where the tests run."""
    top = fleeter.make_repo("proj")
    (top / "sub").mkdir()
    (top / "sub" / "tasks.toml").write_text(textwrap.dedent(TASKS))
    fleeter.monkeypatch.chdir(top / "sub")
    return top


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def collected(r: Any) -> list[str]:
    assert (r.ret, r.errlines) == (0, []), (r.ret, r.stdout, r.stderr)
    return [ln for ln in r.outlines if ln.startswith("<Task")]


def errors_of(r: Any) -> list[str]:
    assert "Traceback" not in r.stderr and "INTERNAL ERROR" not in r.stderr, r.stderr
    assert r.ret == USAGE_ERROR, (r.ret, r.stdout, r.stderr)
    return r.errlines


# -- which file ----------------------------------------------------------------------


def test_addopts_of_pyproject_at_the_repository_root(fleeter: Any, repo: Path) -> None:
    write(
        repo / "pyproject.toml",
        """
        [project]
        name = "proj"

        [tool.fleetrun]
        addopts = "-k api"
    """,
    )
    assert collected(fleeter.runsub("--co")) == ["<Task user-api>"]
    # the same in-process
    assert collected(fleeter.run("--co")) == collected(fleeter.runsub("--co"))


def test_addopts_as_a_list_and_the_command_line_wins(fleeter: Any, repo: Path) -> None:
    write(repo / "pyproject.toml", '[tool.fleetrun]\naddopts = ["-k", "api"]\n')
    assert collected(fleeter.runsub("--co")) == ["<Task user-api>"]
    # inserted before the command line's own arguments: a later -k is the one argparse keeps
    assert collected(fleeter.runsub("--co", "-k", "fix")) == ["<Task fix-it>"]


def test_fleetrun_addopts_env_comes_after_the_file(fleeter: Any, repo: Path) -> None:
    write(repo / "pyproject.toml", '[tool.fleetrun]\naddopts = "-k api"\n')
    assert collected(fleeter.runsub("--co", env={"FLEETRUN_ADDOPTS": "-k fix"})) == ["<Task fix-it>"]
    (repo / "pyproject.toml").unlink()
    assert collected(fleeter.runsub("--co", env={"FLEETRUN_ADDOPTS": "-k schema"})) == ["<Task user-schema>"]


def test_fleetrun_toml_wins_over_pyproject_in_the_same_folder(fleeter: Any, repo: Path) -> None:
    write(repo / "pyproject.toml", '[tool.fleetrun]\naddopts = "-k api"\n')
    write(repo / "fleetrun.toml", 'addopts = "-k fix"\n')
    assert collected(fleeter.runsub("--co")) == ["<Task fix-it>"]


def test_the_nearest_file_wins_and_files_are_not_merged(fleeter: Any, repo: Path) -> None:
    write(repo / "fleetrun.toml", 'addopts = "-k fix"\n[claude]\npermission_mode = "yolo"\n')
    write(repo / "sub" / "pyproject.toml", '[tool.fleetrun]\naddopts = "-k api"\n')
    # the outer file's mistake is not read: only the nearest file counts
    assert collected(fleeter.runsub("--co")) == ["<Task user-api>"]


def test_a_pyproject_without_the_table_is_passed_over(fleeter: Any, repo: Path) -> None:
    write(repo / "sub" / "pyproject.toml", '[project]\nname = "sub"\n')
    write(repo / "pyproject.toml", '[tool.fleetrun]\naddopts = "-k fix"\n')
    assert collected(fleeter.runsub("--co")) == ["<Task fix-it>"]


def test_a_broken_pyproject_that_does_not_mention_fleetrun_is_passed_over(fleeter: Any, repo: Path) -> None:
    write(repo / "pyproject.toml", '[project\nname = "x"\n')
    assert len(collected(fleeter.runsub("--co"))) == 3


def test_a_broken_pyproject_with_the_table_is_an_error(fleeter: Any, repo: Path) -> None:
    write(repo / "pyproject.toml", '[tool.fleetrun]\naddopts = "-k api\n')
    assert errors_of(fleeter.runsub("--co")) == [
        f"ERROR: {repo / 'pyproject.toml'}:2: invalid TOML: Illegal character '\\n'"
    ]


def test_nothing_above_the_repository_root_is_read(fleeter: Any, repo: Path) -> None:
    # the repository lives in fleeter.path; a fleetrun.toml there is outside it
    write(repo.parent / "fleetrun.toml", 'addopts = "--no-such-option"\n')
    assert len(collected(fleeter.runsub("--co"))) == 3


def test_outside_a_repository_only_the_current_folder(fleeter: Any) -> None:
    write(fleeter.path / "fleetrun.toml", 'addopts = "-k api"\n')
    (fleeter.path / "w2").mkdir()
    write(fleeter.path / "w2" / "tasks.toml", TASKS)
    write(fleeter.path / "tasks.toml", TASKS)
    assert collected(fleeter.runsub("--co")) == ["<Task user-api>"]
    fleeter.monkeypatch.chdir(fleeter.path / "w2")
    assert len(collected(fleeter.runsub("--co"))) == 3


def test_a_project_file_in_a_task_worktree_is_never_read(fleeter: Any) -> None:
    # an agent writes its worktree: its addopts could load a module (-p) from there
    wt = fleeter.home / "worktrees" / "a-task_1"
    wt.mkdir(parents=True)
    (wt / ".git").write_text("gitdir: /nowhere\n")
    write(wt / "fleetrun.toml", 'addopts = "-p evil"\n')
    write(wt / "tasks.toml", TASKS)
    fleeter.monkeypatch.chdir(wt)
    assert len(collected(fleeter.runsub("--co"))) == 3


def test_help_and_version_read_it_and_work(fleeter: Any, repo: Path) -> None:
    write(repo / "pyproject.toml", '[tool.fleetrun]\naddopts = "-q"\n')
    r = fleeter.runsub("--version")
    assert r.ret == 0 and r.outlines[0].startswith("fleetrun ")
    assert fleeter.runsub("--help").ret == 0


# -- addopts mistakes ----------------------------------------------------------------


def test_a_bad_option_in_addopts_names_the_file(fleeter: Any, repo: Path) -> None:
    write(repo / "pyproject.toml", '[project]\nname = "x"\n\n[tool.fleetrun]\naddopts = "-v --no-such"\n')
    assert errors_of(fleeter.runsub("--co")) == [
        f"ERROR: {repo / 'pyproject.toml'}:5: tool.fleetrun.addopts: unrecognized arguments: --no-such "
        "(addopts go before every command line: fleetrun -v --no-such ...)"
    ]


def test_addopts_error_of_fleetrun_toml_and_of_the_env(fleeter: Any, repo: Path) -> None:
    write(repo / "sub" / "fleetrun.toml", 'addopts = ["--max-tasks", "0"]\n')
    assert errors_of(fleeter.runsub("--co")) == [
        "ERROR: fleetrun.toml:1: addopts: argument --max-tasks: 0 is not a whole number of at least 1 "
        "(to start nothing, use fleetrun drain) (addopts go before every command line: "
        "fleetrun --max-tasks 0 ...)"
    ]
    (repo / "sub" / "fleetrun.toml").unlink()
    assert errors_of(fleeter.runsub("--co", env={"FLEETRUN_ADDOPTS": "--nope"})) == [
        "ERROR: FLEETRUN_ADDOPTS: unrecognized arguments: --nope (addopts go before every command line: "
        "fleetrun --nope ...)"
    ]


# -- addopts reach the verbs that take them (pytest's addopts are options of a test run) --

#: the docs' example, and an option only the run takes
RUN_ADDOPTS = '[tool.fleetrun]\naddopts = ["-k", "api", "--durations", "3", "-v"]\n'


@pytest.mark.parametrize(
    "verb",
    [
        ["validate"],
        ["queue"],
        ["status"],
        ["status", "--graph"],
        ["logs", "user-api"],
        ["cancel", "--all"],
        ["retry", "--all"],
        ["approve", "fix-it"],
        ["drain"],
        ["undrain"],
        ["gc"],
    ],
)
def test_addopts_of_the_run_do_not_break_other_verbs(fleeter: Any, repo: Path, verb: list[str]) -> None:
    # the same queue in two homes: the verb without addopts in one, with them in the other
    other = str(fleeter.path / "other-home")
    assert fleeter.run("queue").ret == fleeter.run("--home", other, "queue").ret == 0
    bare = fleeter.run(*verb)
    write(repo / "pyproject.toml", RUN_ADDOPTS)
    with_addopts = fleeter.run("--home", other, *verb)
    assert "unrecognized" not in with_addopts.stderr and "Traceback" not in with_addopts.stderr, with_addopts.stderr
    assert with_addopts.ret == bare.ret, (verb, bare.stderr, with_addopts.stderr)


def test_addopts_select_for_the_run_never_for_cancel(fleeter: Any, repo: Path) -> None:
    write(repo / "pyproject.toml", RUN_ADDOPTS)
    assert collected(fleeter.run("--co")) == ["<Task user-api>"]
    assert fleeter.run("queue").ret == 0
    assert fleeter.run("cancel", "--all").ret == 0
    # -k of the project is a selection of the run: cancel --all cancels all
    status = fleeter.run("status", "-q")
    assert status.ret == 0
    assert status.stdout.count("CANCELLED") == 1 and "user-api" in status.stdout, status.stdout


def test_fleetrun_addopts_reach_the_verbs_that_take_them_too(fleeter: Any, repo: Path) -> None:
    env = {"FLEETRUN_ADDOPTS": "-k api --durations 3"}
    r = fleeter.runsub("status", env=env)
    assert (r.ret, r.errlines) == (0, []), r.stderr
    assert collected(fleeter.runsub("--co", env=env)) == ["<Task user-api>"]


def test_an_option_typed_is_still_an_error_where_addopts_are_dropped(fleeter: Any, repo: Path) -> None:
    write(repo / "pyproject.toml", RUN_ADDOPTS)
    r = fleeter.runsub("status", "-k", "api")  # argparse's own message: to the process's stderr
    assert r.ret == USAGE_ERROR and "unrecognized arguments: -k api" in r.stderr, r.stderr
    # an option no verb takes is an error on every verb, as before
    write(repo / "pyproject.toml", '[tool.fleetrun]\naddopts = "-v --no-such"\n')
    assert errors_of(fleeter.run("status")) == [
        f"ERROR: {repo / 'pyproject.toml'}:2: tool.fleetrun.addopts: unrecognized arguments: --no-such "
        "(addopts go before every command line: fleetrun -v --no-such ...)"
    ]


def test_addopts_of_the_wrong_type(fleeter: Any, repo: Path) -> None:
    write(repo / "pyproject.toml", "[tool.fleetrun]\naddopts = 3\n")
    assert errors_of(fleeter.runsub("--co")) == [
        f"ERROR: {repo / 'pyproject.toml'}:2: tool.fleetrun.addopts: must be a string or a list of strings, "
        "not the number 3"
    ]
    write(repo / "pyproject.toml", '[tool.fleetrun]\naddopts = "-k \'api"\n')
    assert errors_of(fleeter.runsub("--co")) == [
        f"ERROR: {repo / 'pyproject.toml'}:2: tool.fleetrun.addopts: cannot be split into words (No closing quotation)"
    ]


# -- [task] defaults -----------------------------------------------------------------

SHOW_SETUP = """
def fleetrun_collection_modifyitems(config, items):
    for t in items:
        print("SETUP", t.name, [s.text for s in t.setup])
"""


def setups(r: Any) -> dict[str, list[str]]:
    assert r.ret == 0, (r.stdout, r.stderr)
    out = {}
    for ln in r.outlines:
        if ln.startswith("SETUP "):
            _, name, rest = ln.split(" ", 2)
            out[name] = eval(rest)  # noqa: S307 - our own print of a list of strings
    return out


def test_task_defaults_apply_under_the_tasks_file_and_the_task(fleeter: Any, repo: Path) -> None:
    write(repo / "pyproject.toml", '[tool.fleetrun.task]\nsetup = ["make deps"]\n')
    write(repo / "sub" / "fleetconf.py", SHOW_SETUP)
    write(
        repo / "sub" / "other.toml",
        'setup = ["npm ci"]\n\n[[task]]\nname = "o"\nprompt = "x"\n\n'
        '[[task]]\nname = "own"\nprompt = "x"\nsetup = []\n',
    )
    assert setups(fleeter.runsub("--co", "tasks.toml", "other.toml")) == {
        "user-schema": ["make deps"],
        "user-api": ["make deps"],
        "fix-it": ["make deps"],
        "o": ["npm ci"],
        "own": [],
    }


def test_task_defaults_in_fleetrun_toml(fleeter: Any, repo: Path) -> None:
    write(repo / "fleetrun.toml", '[task]\nsetup = [{ run = "make deps", timeout_s = 60 }]\n')
    write(repo / "sub" / "fleetconf.py", SHOW_SETUP)
    assert setups(fleeter.runsub("--co"))["fix-it"] == ["make deps"]


def test_task_default_mistakes(fleeter: Any, repo: Path) -> None:
    write(repo / "pyproject.toml", '[tool.fleetrun.task]\nsetup = "make deps"\nmodle = "x"\n')
    where = repo / "pyproject.toml"
    assert errors_of(fleeter.runsub("validate")) == [
        f"ERROR: {where}:2: tool.fleetrun.task.setup: must be a list of commands, not a string",
        f"ERROR: {where}:3: tool.fleetrun.task.modle: unknown key (did you mean 'model'?)",
    ]
    write(repo / "pyproject.toml", "[tool.fleetrun]\ntask = 3\n")
    assert errors_of(fleeter.runsub("validate")) == [f"ERROR: {where}:2: tool.fleetrun.task: must be a table"]
    write(repo / "pyproject.toml", '[tool.fleetrun.task]\nsetup = ["ok", ""]\n')
    assert errors_of(fleeter.runsub("validate")) == [
        f"ERROR: {where}:2: tool.fleetrun.task.setup #2: must not be empty"
    ]


def test_changed_task_defaults_make_a_new_queue(fleeter: Any, repo: Path) -> None:
    # `fleetrun run` resumes the queue of an unchanged file; new defaults make new tasks
    import sqlite3

    def digests() -> list[str]:
        with sqlite3.connect(fleeter.home / "state.db") as db:
            return [h for (h,) in db.execute("SELECT source_hash FROM queues ORDER BY created")]

    assert fleeter.run("queue").ret == 0
    (repo / "pyproject.toml").write_text('[tool.fleetrun.task]\nsetup = ["make deps"]\n')
    assert fleeter.run("queue").ret == 0
    (repo / "pyproject.toml").write_text('[tool.fleetrun.task]\nsetup = ["make deps", "make db"]\n')
    assert fleeter.run("queue").ret == 0
    (repo / "pyproject.toml").write_text('[tool.fleetrun]\naddopts = "-v"\n')
    assert fleeter.run("queue").ret == 0
    first, second, third, fourth = digests()
    assert len({first, second, third}) == 3
    assert fourth == first  # addopts alone make no other tasks


SHOW_KEYS = """
def fleetrun_collection_modifyitems(config, items):
    for t in items:
        print("KEYS", t.name, [t.model, t.max_retries, t.allowed_tools, t.budget_usd, t.peer])
"""


def keys_of(r: Any) -> dict[str, list[Any]]:
    assert (r.ret, r.errlines) == (0, []), (r.stdout, r.stderr)
    out = {}
    for ln in r.outlines:
        if ln.startswith("KEYS "):
            _, name, rest = ln.split(" ", 2)
            out[name] = eval(rest)  # noqa: S307 - our own print of a list
    return out


def test_every_default_key_in_the_project_file_under_the_tasks_file_and_the_task(fleeter: Any, repo: Path) -> None:
    # precedence, key by key: the task's own > the tasks file's top level > the project's [task]
    write(
        repo / "pyproject.toml",
        """
        [tool.fleetrun.task]
        model = "opus"
        max_retries = 5
        allowed_tools = ["Read", "Edit"]
        budget_usd = 2.5
    """,
    )
    write(repo / "sub" / "fleetconf.py", SHOW_KEYS)
    write(
        repo / "sub" / "other.toml",
        'model = "sonnet"\npeer = "mini"\n\n[[task]]\nname = "o"\nprompt = "x"\n\n'
        '[[task]]\nname = "own"\nprompt = "x"\nmax_retries = 0\nallowed_tools = []\n'
        'model = "haiku"\n',
    )
    assert keys_of(fleeter.runsub("--co", "tasks.toml", "other.toml")) == {
        "user-schema": ["opus", 5, ["Read", "Edit"], 2.5, None],
        "user-api": ["opus", 5, ["Read", "Edit"], 2.5, None],
        "fix-it": ["opus", 5, ["Read", "Edit"], 2.5, None],
        "o": ["sonnet", 5, ["Read", "Edit"], 2.5, "mini"],
        "own": ["haiku", 0, [], 2.5, "mini"],
    }


def test_validate_verbose_names_where_each_default_was_written(fleeter: Any, repo: Path) -> None:
    write(repo / "sub" / "fleetrun.toml", '[task]\nmodel = "opus"\nmax_retries = 5\n')
    write(
        repo / "sub" / "tasks.toml",
        'max_retries = 1\n\n[[task]]\nname = "a"\nprompt = "x"\n\n'
        '[[task]]\nname = "b"\nprompt = "x"\nmodel = "haiku"\n',
    )
    r = fleeter.runsub("validate", "-v")
    assert (r.ret, r.outlines) == (
        0,
        [
            "tasks.toml: 2 tasks, valid",
            '  a: model = "opus" (fleetrun.toml:2), max_retries = 1 (tasks.toml:1)',
            "  b: max_retries = 1 (tasks.toml:1)",
        ],
    ), (r.stdout, r.stderr)


def test_every_default_mistake_of_the_project_file_at_once(fleeter: Any, repo: Path) -> None:
    write(
        repo / "pyproject.toml",
        """
        [project]
        name = "proj"

        [tool.fleetrun.task]
        max_retries = -1
        model = 3
        cwd = "src"
        paths = ["a"]
        colour = "red"
    """,
    )
    where = repo / "pyproject.toml"
    assert errors_of(fleeter.runsub("validate")) == [
        f"ERROR: {where}:5: tool.fleetrun.task.max_retries: must not be negative",
        f"ERROR: {where}:6: tool.fleetrun.task.model: must be a string, not the number 3",
        f"ERROR: {where}:7: tool.fleetrun.task.cwd: cannot be a default of every task (it is a path relative "
        "to the file it is written in); write it in each [[task]]",
        f"ERROR: {where}:8: tool.fleetrun.task.paths: cannot be a default of every task (it is a path relative "
        "to the file it is written in); write it in each [[task]]",
        f"ERROR: {where}:9: tool.fleetrun.task.colour: unknown key (a default of every task can be: agent, "
        "model, permission_mode, allowed_tools, max_retries, timeout_min, stall_timeout_min, budget_usd, "
        "requires, git_ref, peer, setup, tags, base, on_conflict, baseline, removes_tests, max_turns, fallback_model, "
        "append_system_prompt, settings, mcp_config, strict_mcp_config, disallowed_tools, env, extra_args, "
        "allow_verifiers)",
    ]


def test_a_project_agent_default_that_names_no_agent_points_at_the_project_file(fleeter: Any, repo: Path) -> None:
    write(repo / "pyproject.toml", '[tool.fleetrun.task]\nagent = "codex"\n')
    where = repo / "pyproject.toml"
    assert errors_of(fleeter.runsub("validate")) == [
        f"ERROR: {where}:2: task '{name}': agent: 'codex' is not an agent (known: claude); declare it as [agents.codex]"
        for name in ("user-schema", "user-api", "fix-it")
    ]


def test_a_project_git_ref_default_that_names_nothing_points_at_the_project_file(fleeter: Any, repo: Path) -> None:
    write(repo / "pyproject.toml", '[tool.fleetrun.task]\ngit_ref = "no-such-ref"\n')
    errs = errors_of(fleeter.runsub("validate"))
    assert len(errs) == 3
    assert all(e.startswith(f"ERROR: {repo / 'pyproject.toml'}:2: task '") for e in errs), errs


def test_changed_default_of_any_key_makes_a_new_queue(fleeter: Any, repo: Path) -> None:
    import sqlite3

    def digests() -> list[str]:
        with sqlite3.connect(fleeter.home / "state.db") as db:
            return [h for (h,) in db.execute("SELECT source_hash FROM queues ORDER BY created")]

    (repo / "pyproject.toml").write_text("[tool.fleetrun.task]\nmax_retries = 1\n")
    assert fleeter.run("queue").ret == 0
    assert fleeter.run("queue").ret == 0  # unchanged: the same queue
    (repo / "pyproject.toml").write_text("[tool.fleetrun.task]\nmax_retries = 3\n")
    assert fleeter.run("queue").ret == 0
    tasks_file = repo / "sub" / "tasks.toml"
    tasks_file.write_text('model = "opus"\n' + tasks_file.read_text())
    assert fleeter.run("queue").ret == 0
    same, again, retries, model = digests()
    assert same == again and len({same, retries, model}) == 3


# -- plugin tables -------------------------------------------------------------------


class Notify:
    """A third-party plugin that reads ``[notify]`` (and shows what it got)."""

    @fleetrun.hookimpl
    def fleetrun_config_keys(self, config: Any) -> list[Any]:
        return [
            fleetrun.ConfigKey("notify", "url", (str,)),
            fleetrun.ConfigKey("notify", "level", (str,)),
            fleetrun.ConfigKey("notify", "retries", (int,)),
        ]

    @fleetrun.hookimpl
    def fleetrun_collection_modifyitems(self, config: Any, items: list[Any]) -> None:
        print("NOTIFY", sorted(config.setting("notify").items()), file=config.out)
        print("BRAIN", sorted(config.setting("brain", default={}).items()), file=config.out)


def shown(r: Any, what: str) -> Any:
    assert (r.ret, r.errlines) == (0, []), (r.stdout, r.stderr)
    return eval(next(ln for ln in r.outlines if ln.startswith(what + " "))[len(what) + 1 :])  # noqa: S307


def test_which_layer_wins_key_by_key(fleeter: Any, repo: Path) -> None:
    fleeter.write_config(
        '[notify]\nurl = "https://home"\nlevel = "all"\n\n'
        '[brain]\nurl = "http://127.0.0.1:1"\nmodel = "home"\ntimeout_s = 5\n'
    )
    write(
        repo / "pyproject.toml",
        '[tool.fleetrun.notify]\nlevel = "failures"\nretries = 2\n\n'
        '[tool.fleetrun.brain]\nmodel = "project"\ntimeout_s = 7\n',
    )
    write(repo / "sub" / "tasks.toml", TASKS + '\n[brain]\nmodel = "tasks-file"\n')
    r = fleeter.run("--co", plugins=[Notify()])
    assert shown(r, "NOTIFY") == [("level", "failures"), ("retries", 2), ("url", "https://home")]
    assert shown(r, "BRAIN") == [("model", "tasks-file"), ("timeout_s", 7), ("url", "http://127.0.0.1:1")]


def test_project_tables_are_checked_as_config_toml(fleeter: Any, repo: Path) -> None:
    write(
        repo / "pyproject.toml",
        '[tool.fleetrun]\naddopts = "-q"\nnotfy = 1\n\n'
        '[tool.fleetrun.claude]\npermission_mode = "yolo"\n\n'
        '[tool.fleetrun.notify]\nretries = "2"\n',
    )
    where = repo / "pyproject.toml"
    assert errors_of(fleeter.run("validate", plugins=[Notify()])) == [
        f"ERROR: {where}:3: tool.fleetrun.notfy: unknown table (did you mean 'notify'?)",
        f"ERROR: {where}:6: tool.fleetrun.claude.permission_mode: 'yolo' is not one of acceptEdits, auto, "
        "bypassPermissions, default, dontAsk, manual, plan",
        f"ERROR: {where}:9: tool.fleetrun.notify.retries: expected a whole number, got a string",
    ]


def test_fleetrun_toml_tables_have_no_prefix(fleeter: Any, repo: Path) -> None:
    write(repo / "sub" / "fleetrun.toml", '[worktree]\ncommit_mesage = "x"\n')
    assert errors_of(fleeter.runsub("validate")) == [
        "ERROR: fleetrun.toml:2: worktree.commit_mesage: unknown key (did you mean 'commit_message'?)"
    ]


@pytest.mark.parametrize(
    ("text", "line", "key"),
    [
        ('[tool.fleetrun.relay]\ntags = ["gpu"]\n', 1, "tool.fleetrun.relay"),
        ('[tool.fleetrun.claude]\nexecutable = "/opt/claude"\n', 2, "tool.fleetrun.claude.executable"),
    ],
)
def test_machine_level_settings_stay_in_the_home(fleeter: Any, repo: Path, text: str, line: int, key: str) -> None:
    write(repo / "pyproject.toml", text)
    assert errors_of(fleeter.runsub("validate")) == [
        f"ERROR: {repo / 'pyproject.toml'}:{line}: {key}: is a setting of this machine: it belongs in "
        "$FLEETRUN_HOME/config.toml, not in the project file"
    ]


def test_operator_verbs_work_with_a_broken_project_table(fleeter: Any, repo: Path) -> None:
    # as with config.toml: status and cancel must work whatever the files say
    write(repo / "pyproject.toml", '[tool.fleetrun.claude]\npermission_mode = "yolo"\n')
    assert fleeter.runsub("status").ret == 0
    assert errors_of(fleeter.runsub("validate"))


def test_project_file_is_read_where_fleetrun_runs_not_where_the_tasks_file_is(fleeter: Any, repo: Path) -> None:
    write(repo / "pyproject.toml", '[tool.fleetrun]\naddopts = "-k api"\n')
    fleeter.monkeypatch.chdir(fleeter.path)
    assert len(collected(fleeter.runsub("--co", str(repo / "sub" / "tasks.toml")))) == 3


def test_the_git_top_level_is_the_root_in_a_linked_worktree(fleeter: Any, repo: Path) -> None:
    write(repo / "pyproject.toml", '[tool.fleetrun]\naddopts = "-k api"\n')
    fleeter.git(repo, "add", "-A")
    fleeter.git(repo, "commit", "-q", "-m", "project")
    linked = fleeter.path / "linked"
    fleeter.git(repo, "worktree", "add", "-q", str(linked))
    write(linked / "sub" / "tasks.toml", TASKS)
    fleeter.monkeypatch.chdir(linked / "sub")
    assert collected(fleeter.runsub("--co")) == ["<Task user-api>"]
    assert os.path.isfile(linked / ".git")


def test_a_slip_of_a_task_only_key_in_the_project_defaults_says_which(fleeter: Any, repo: Path) -> None:
    write(repo / "sub" / "fleetrun.toml", '[task]\ndependancies = ["x"]\n')
    assert errors_of(fleeter.runsub("validate")) == [
        "ERROR: fleetrun.toml:2: task.dependancies: unknown key (did you mean 'depends_on'? It cannot be a "
        "default of every task (it is the task graph); write it in each [[task]])"
    ]


def test_project_default_mistakes_come_with_the_tasks_files_own(fleeter: Any, repo: Path) -> None:
    # every error at once: the project file's first, then the tasks file's, in one run
    write(repo / "sub" / "fleetrun.toml", '[task]\nmax_retries = -1\nmodel = "opus"\n')
    write(repo / "sub" / "tasks.toml", 'timeout_min = 0\n\n[[task]]\nname = "a"\nprompt = "x"\nretries = 1\n')
    assert errors_of(fleeter.runsub("validate")) == [
        "ERROR: fleetrun.toml:2: task.max_retries: must not be negative",
        "ERROR: tasks.toml:1: timeout_min: must be greater than 0",
        "ERROR: tasks.toml:6: task 'a': retries: unknown key (did you mean 'max_retries'?)",
    ]


def test_a_plugin_task_key_as_a_project_default(fleeter: Any, repo: Path) -> None:
    write(
        repo / "sub" / "fleetconf.py",
        """
        import fleetrun

        def fleetrun_task_keys(config):
            return [fleetrun.KeyDecl("priority", (int,), check=lambda v: None if 0 <= v <= 9 else "must be 0..9")]

        def fleetrun_collection_modifyitems(config, items):
            for t in items:
                print("KEYS", t.name, [t.extra])
    """,
    )
    write(repo / "pyproject.toml", "[tool.fleetrun.task]\npriority = 2\n")
    assert keys_of(fleeter.runsub("--co")) == {
        name: [{"priority": 2}] for name in ("user-schema", "user-api", "fix-it")
    }
    write(repo / "pyproject.toml", "[tool.fleetrun.task]\npriority = 12\n")
    assert errors_of(fleeter.runsub("validate")) == [
        f"ERROR: {repo / 'pyproject.toml'}:2: tool.fleetrun.task.priority: must be 0..9"
    ]

"""The plugin manager through the real CLI: fleetconf.py discovery, -p / -p no:,
FLEETRUN_PLUGINS, entry points of an installed distribution, fresh managers.

Every test runs fleetrun on real files in a tmp folder, in-process (``fleeter.run``)
or as a subprocess (``fleeter.runsub``) where an import path or an environment
variable has to be in place when the interpreter starts.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap
import types
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Optional

import pytest

import fleetrun
from fleetrun.pluginmanager import BUILTIN_PLUGINS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]

ECHO_AGENT = """
[agents.echo]
command = ["{python}", "-c", "print('hi')"]
"""


def echo_tasks(*names: str, verify: str = "true", extra: str = "") -> str:
    """A tasks file whose tasks run a command agent that prints one line; ``extra``
    is added to every ``[[task]]`` table."""
    out = ECHO_AGENT
    for name in names:
        out += f'\n[[task]]\nname = "{name}"\nprompt = "do {name}"\ncwd = "."\nagent = "echo"\n{extra}'
        if verify:
            out += f'  [[task.verify]]\n  run = "{verify}"\n'
    return out


def logging_fleetconf(label: str, log: Path) -> str:
    """A fleetconf.py that appends ``load LABEL`` to ``log`` when it is imported and
    ``configure LABEL`` when its ``fleetrun_configure`` is called."""
    return f"""
        def _log(word):
            with open({str(log)!r}, "a") as f:
                f.write(word + " " + {label!r} + "\\n")

        _log("load")

        def fleetrun_configure(config):
            _log("configure")
    """


def read_log(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


#: The entry points this environment installed (CI installs plugins/fleetrun-* as a
#: user would): not what these tests load, so left out of what they compare.
ENVIRONMENT_PLUGINS = {ep.name for ep in metadata.entry_points(group="fleetrun")}


def plugins_of(result: Any) -> list[str]:
    """The plugin names ``fleetrun --version`` printed (but the environment's own)."""
    line = next(line for line in result.outlines if line.startswith("plugins: "))
    return [n for n in line[len("plugins: ") :].split(", ") if n not in ENVIRONMENT_PLUGINS]


def write_module(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.py"
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


# ---------------------------------------------------------------------------------
# fleetconf.py discovery


def test_fleetconfs_from_repo_root_down_to_the_tasks_folder(fleeter: Any) -> None:
    log = fleeter.path.parent / "order.log"
    repo = fleeter.make_repo("repo")
    fleeter.write_fleetconf(logging_fleetconf("above-the-repo", log))  # NOT loaded
    fleeter.write_fleetconf(logging_fleetconf("repo", log), folder="repo")
    fleeter.write_fleetconf(logging_fleetconf("sub", log), folder="repo/sub")
    fleeter.write_tasks(echo_tasks("a"), name="repo/sub/tasks.toml")

    result = fleeter.run("validate", str(repo / "sub" / "tasks.toml"))
    assert result.ret == 0, result.stderr
    # loaded outermost first; hooks are called last registered first (pluggy's order),
    # so the innermost fleetconf.py gets the first word, and wins a firstresult hook
    assert read_log(log) == ["load repo", "load sub", "configure sub", "configure repo"]


def test_fleetconf_in_a_folder_between_root_and_tasks_file(fleeter: Any) -> None:
    log = fleeter.path.parent / "order.log"
    fleeter.make_repo("repo")
    fleeter.write_fleetconf(logging_fleetconf("mid", log), folder="repo/mid")
    fleeter.write_fleetconf(logging_fleetconf("deep", log), folder="repo/mid/deep")
    fleeter.write_fleetconf(logging_fleetconf("sibling", log), folder="repo/other")  # not on the path
    fleeter.write_tasks(echo_tasks("a"), name="repo/mid/deep/tasks.toml")

    result = fleeter.run("validate", "repo/mid/deep/tasks.toml")
    assert result.ret == 0, result.stderr
    assert read_log(log) == ["load mid", "load deep", "configure deep", "configure mid"]


def test_outside_a_repo_only_the_tasks_folder(fleeter: Any) -> None:
    log = fleeter.path.parent / "order.log"
    fleeter.write_fleetconf(logging_fleetconf("outer", log), folder="outer")
    fleeter.write_fleetconf(logging_fleetconf("inner", log), folder="outer/inner")
    fleeter.write_tasks(echo_tasks("a"), name="outer/inner/tasks.toml")

    result = fleeter.run("validate", "outer/inner/tasks.toml")
    assert result.ret == 0, result.stderr
    assert read_log(log) == ["load inner", "configure inner"]


def test_each_tasks_file_brings_its_fleetconfs_once(fleeter: Any) -> None:
    log = fleeter.path.parent / "order.log"
    fleeter.make_repo("repo")
    fleeter.write_fleetconf(logging_fleetconf("root", log), folder="repo")
    fleeter.write_fleetconf(logging_fleetconf("a", log), folder="repo/a")
    fleeter.write_fleetconf(logging_fleetconf("b", log), folder="repo/b")
    fleeter.write_tasks(echo_tasks("ta"), name="repo/a/tasks.toml")
    fleeter.write_tasks(echo_tasks("tb"), name="repo/b/tasks.toml")

    result = fleeter.run("validate", "repo/a/tasks.toml", "repo/b/tasks.toml")
    assert result.ret == 0, result.stderr
    assert [line for line in read_log(log) if line.startswith("load")] == ["load root", "load a", "load b"]
    assert sorted(read_log(log)) == ["configure a", "configure b", "configure root", "load a", "load b", "load root"]


def test_fleetconf_hooks_run_in_a_run(fleeter: Any) -> None:
    fleeter.write_fleetconf("""
        def fleetrun_report_header(config):
            return ["fleetconf header line"]

        def fleetrun_terminal_summary(config, exitstatus, counts):
            config.get_plugin("terminalreporter").write_line(f"fleetconf summary: {exitstatus} {counts}")
    """)
    fleeter.write_tasks(echo_tasks("a"))
    result = fleeter.run("tasks.toml")
    assert result.ret == 0, result.stdout + result.stderr
    result.fnmatch_lines(
        [
            "fleetrun * -- plugins: *, fleetconf*",
            "fleetconf header line",
            "collected 1 task",
            "*a DONE*",
            "fleetconf summary: 0 {'DONE': 1}",
            "=== 1 done in *",
        ],
        stream="out",
    )


def test_report_header_lines_outermost_fleetconf_first(fleeter: Any) -> None:
    fleeter.make_repo("repo")
    fleeter.write_fleetconf('def fleetrun_report_header(config):\n    return ["header: repo"]\n', folder="repo")
    fleeter.write_fleetconf('def fleetrun_report_header(config):\n    return ["header: sub"]\n', folder="repo/sub")
    fleeter.write_tasks(echo_tasks("a"), name="repo/sub/tasks.toml")
    result = fleeter.run("repo/sub/tasks.toml")
    assert result.ret == 0, result.stdout + result.stderr
    headers = [line for line in result.outlines if line.startswith("header: ")]
    assert headers == ["header: repo", "header: sub"]


def test_fleetconf_imports_a_helper_next_to_it(fleeter: Any) -> None:
    fleeter.write("proj/fleet_helpers_for_test.py", 'LINE = "from a helper module"\n')
    fleeter.write_fleetconf(
        """
        from fleet_helpers_for_test import LINE

        def fleetrun_report_header(config):
            return [LINE]
    """,
        folder="proj",
    )
    fleeter.write_tasks(echo_tasks("a"), name="proj/tasks.toml")
    result = fleeter.run("validate", "proj/tasks.toml")
    assert result.ret == 0, result.stderr


# ---------------------------------------------------------------------------------
# hooks from fleetconf.py are really called


def test_collection_modifyitems_in_fleetconf_deselects(fleeter: Any) -> None:
    fleeter.write_tasks(echo_tasks("a", "b", "c"))
    before = fleeter.run("--collect-only", "tasks.toml")
    assert before.ret == 0, before.stderr
    before.fnmatch_lines(["<Task a>", "<Task b>", "<Task c>", "3 tasks collected"])

    fleeter.write_fleetconf("""
        def fleetrun_collection_modifyitems(config, items):
            items[:] = [t for t in items if t.name != "b"]
    """)
    after = fleeter.run("--collect-only", "tasks.toml")
    assert after.ret == 0, after.stderr
    assert [line for line in after.outlines if line.startswith("<Task")] == ["<Task a>", "<Task c>"]
    after.fnmatch_lines(["2 tasks collected"])


def test_task_keys_in_fleetconf_makes_a_key_valid(fleeter: Any) -> None:
    log = fleeter.path.parent / "extra.log"
    fleeter.write_tasks(echo_tasks("a", extra='ticket = "PROJ-1"\n'))
    before = fleeter.run("validate")
    assert before.ret == 4
    before.fnmatch_lines(["ERROR: tasks.toml:*: task 'a': ticket: unknown key*"], stream="err")

    fleeter.write_fleetconf(f"""
        import fleetrun

        @fleetrun.hookimpl
        def fleetrun_task_keys(config):
            return [fleetrun.KeyDecl("ticket", (str,), doc="the issue this task closes")]

        def fleetrun_collection_modifyitems(config, items):
            with open({str(log)!r}, "w") as f:
                f.write(",".join(f"{{t.name}}={{t.extra.get('ticket')}}" for t in items))
    """)
    after = fleeter.run("validate")
    assert after.ret == 0, after.stderr
    assert log.read_text() == "a=PROJ-1"

    # the declared type is checked like a built-in key's
    fleeter.write_tasks(echo_tasks("a", extra="ticket = 5\n"))
    wrong = fleeter.run("validate")
    assert wrong.ret == 4
    wrong.fnmatch_lines(["ERROR: tasks.toml:*: task 'a': ticket: must be a string, not the number 5"], stream="err")


@pytest.mark.parametrize("style", ["wrapper", "tryfirst"])
def test_build_prompt_from_fleetconf(fleeter: Any, style: str) -> None:
    if style == "wrapper":
        fleeter.write_fleetconf("""
            import fleetrun

            @fleetrun.hookimpl(wrapper=True)
            def fleetrun_build_prompt(task, attempt, config, context):
                prompt = yield
                return prompt + "\\n\\nHouse rules: keep commits small."
        """)
    else:
        fleeter.write_fleetconf("""
            import fleetrun

            @fleetrun.hookimpl(tryfirst=True)
            def fleetrun_build_prompt(task, attempt, config, context):
                return f"Only this: {task.name} ({context['kind']})"
        """)
    # the agent keeps the prompt it was given; the verifier checks it
    fleeter.write_tasks("""
        [agents.keeper]
        command = ["{python}", "-c", "import shutil, sys; shutil.copy(sys.argv[1], 'seen-prompt.txt')", "{prompt_file}"]

        [[task]]
        name = "a"
        prompt = "Do the thing."
        cwd = "."
        agent = "keeper"
        max_retries = 0
          [[task.verify]]
          run = "test -s seen-prompt.txt"
    """)
    result = fleeter.run("tasks.toml")
    assert result.ret == 0, result.stdout + result.stderr
    seen = (fleeter.path / "seen-prompt.txt").read_text()
    if style == "wrapper":
        assert seen == "Do the thing.\n\nHouse rules: keep commits small."
    else:
        assert seen == "Only this: a (fresh)"


def test_custom_verifier_kind_from_fleetconf(fleeter: Any) -> None:
    # the example of docs/fleetconf.md, as written there
    fleeter.write_fleetconf("""
        from pathlib import Path

        import fleetrun


        @fleetrun.hookimpl
        def fleetrun_task_keys(config):
            return [fleetrun.KeyDecl("file_exists", (str,), where="verify_kind",
                                     doc="a file the task must leave behind")]


        @fleetrun.hookimpl
        def fleetrun_verify(task, verifier, workspace, attempt, config):
            if verifier.kind != "file_exists":
                return None  # not mine: the next plugin's
            found = Path(workspace.path, verifier.text).is_file()
            return fleetrun.Verdict(passed=found, kind=verifier.kind, label=verifier.label,
                                    reason="found" if found else f"{verifier.text} is missing")
    """)
    fleeter.write_tasks("""
        [agents.writer]
        command = ["{python}", "-c", "open('out.txt', 'w').write('x')"]

        [agents.lazy]
        command = ["{python}", "-c", "print('did nothing')"]

        [[task]]
        name = "writes"
        prompt = "write out.txt"
        cwd = "."
        agent = "writer"
          [[task.verify]]
          file_exists = "out.txt"

        [[task]]
        name = "lazy"
        prompt = "write nothing.txt"
        cwd = "."
        agent = "lazy"
        max_retries = 0
          [[task.verify]]
          file_exists = "nothing.txt"
    """)
    result = fleeter.run("tasks.toml")
    assert result.ret == 1, result.stdout + result.stderr
    assert fleeter.states() == {"writes": "DONE", "lazy": "NEEDS_HUMAN"}
    assert fleeter.task("lazy").reason == "retries_exhausted:nothing.txt"
    result.fnmatch_lines(["*writes verify file_exists `out.txt`: PASS (found)"], stream="out")
    result.fnmatch_lines(["*lazy verify file_exists `nothing.txt`: FAIL (nothing.txt is missing)"], stream="out")


def test_work_loads_the_fleetconfs_of_queued_tasks(fleeter: Any) -> None:
    fleeter.write_fleetconf("""
        import fleetrun

        @fleetrun.hookimpl(wrapper=True)
        def fleetrun_build_prompt(task, attempt, config, context):
            prompt = yield
            return prompt + " (wrapped by fleetconf.py)"
    """)
    # the agent is declared in config.toml: `work` reads no tasks file
    fleeter.write_config("""
        [agents.keeper]
        command = ["{python}", "-c", "import shutil, sys; shutil.copy(sys.argv[1], 'seen-prompt.txt')", "{prompt_file}"]
    """)
    fleeter.write_tasks("""
        [[task]]
        name = "a"
        prompt = "Do the thing."
        cwd = "."
        agent = "keeper"
    """)
    assert fleeter.run("queue", "tasks.toml").ret == 0
    result = fleeter.run("work", "--until-idle")
    assert result.ret == 0, result.stdout + result.stderr
    assert (fleeter.path / "seen-prompt.txt").read_text() == "Do the thing. (wrapped by fleetconf.py)"


# ---------------------------------------------------------------------------------
# errors in fleetconf.py and in hook implementations


@pytest.mark.parametrize(
    ("source", "line", "pattern"),
    [
        (
            "import os\n\nimport nonexistent_mod\n",
            3,
            "cannot import fleetconf.py: ModuleNotFoundError: No module named 'nonexistent_mod'",
        ),
        ("x = 1\ndef broken(:\n    pass\n", 2, "syntax error in fleetconf.py: *"),
        ("x = 1\nraise RuntimeError('boom')\n", 2, "cannot import fleetconf.py: RuntimeError: boom"),
    ],
    ids=["import-error", "syntax-error", "raises"],
)
def test_broken_fleetconf_is_a_usage_error(fleeter: Any, source: str, line: int, pattern: str) -> None:
    fleeter.write_tasks(echo_tasks("a"))
    conf = fleeter.path / "fleetconf.py"
    conf.write_text(source)
    for args in (["validate"], ["tasks.toml"]):
        result = fleeter.run(*args)
        assert result.ret == 4, result.stdout + result.stderr
        assert len(result.errlines) == 1, result.stderr
        result.fnmatch_lines([f"ERROR: {conf.resolve()}:{line}: {pattern}"], stream="err")
        assert "Traceback" not in result.stdout + result.stderr
        assert result.outlines == []  # nothing ran, nothing was queued
    assert not (fleeter.home / "state.db").exists()


@pytest.mark.parametrize("marked", [False, True], ids=["unmarked", "marked"])
def test_misspelt_hook_in_fleetconf(fleeter: Any, marked: bool) -> None:
    fleeter.write_tasks(echo_tasks("a"))
    conf = fleeter.write_fleetconf(
        ("import fleetrun\n\n@fleetrun.hookimpl\n" if marked else "")
        + "def fleetrun_colect_file(file_path, config, keys):\n    return None\n"
    )
    result = fleeter.run("validate")
    assert result.ret == 4, result.stdout + result.stderr
    assert result.errlines == [
        f"ERROR: {conf.resolve()}: unknown hook fleetrun_colect_file (did you mean fleetrun_collect_file?)"
    ]


def test_misspelt_hook_in_a_plugin_object(fleeter: Any) -> None:
    class Typo:
        def fleetrun_confgure(self, config: Any) -> None:
            raise AssertionError("never called")

    fleeter.write_tasks(echo_tasks("a"))
    result = fleeter.run("validate", plugins=[Typo()])
    assert result.ret == 4
    result.fnmatch_lines(["ERROR: *unknown hook fleetrun_confgure (did you mean fleetrun_configure?)"], stream="err")


def test_hookimpl_argument_the_spec_lacks(fleeter: Any) -> None:
    fleeter.write_tasks(echo_tasks("a"))
    conf = fleeter.write_fleetconf("""
        import fleetrun

        @fleetrun.hookimpl(tryfirst=True)
        def fleetrun_configure(config, bogus):
            pass
    """)
    result = fleeter.run("validate")
    assert result.ret == 4, result.stdout + result.stderr
    result.fnmatch_lines([f"ERROR: {conf.resolve()}: invalid hook implementation: *fleetrun_configure*"], stream="err")
    assert "bogus" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "args", [["validate"], ["tasks.toml"], ["work", "--until-idle"]], ids=["validate", "run", "work"]
)
def test_addoption_in_a_fleetconf_is_a_usage_error(fleeter: Any, args: list[str]) -> None:
    """A fleetconf.py is imported once the command line is parsed: an option it added
    would never exist, so its fleetrun_addoption is an error (as fleetrun_verbs is),
    not silently ignored."""
    fleeter.write_tasks(echo_tasks("a"))
    if args[0] == "work":  # `work` loads the fleetconf.py files of the queued tasks files
        assert fleeter.run("queue", "tasks.toml").ret == 0
    conf = fleeter.write_fleetconf("""
        def fleetrun_addoption(parser):
            parser.addoption("--zz")
    """)
    result = fleeter.run(*args)
    assert result.ret == 4, result.stdout + result.stderr
    assert result.errlines == [
        f"ERROR: {conf.resolve()}: fleetrun_addoption: a fleetconf.py is loaded after the command line is "
        "parsed and cannot add options; put it in a plugin (-p MODULE or an installed one)"
    ]
    assert result.outlines == []
    if args[0] == "work":
        assert fleeter.states() == {"a": "READY"}  # nothing ran
    else:
        assert not (fleeter.home / "state.db").exists()  # nothing was queued


def test_a_plugin_name_taken_by_another_plugin_is_a_usage_error(fleeter: Any) -> None:
    """Two different plugins under one name: say which name and who has it, not
    pluggy's dict of every plugin (exit 3)."""
    mine = types.ModuleType("worktree")  # canonical name: the module's, a built-in's
    mine.__file__ = str(fleeter.path / "worktree.py")
    fleeter.write_tasks(echo_tasks("a"))
    result = fleeter.run("validate", plugins=[mine])
    assert result.ret == 4, result.stdout + result.stderr
    assert result.errlines == [
        f"ERROR: {mine.__file__}: plugin name 'worktree' is taken by fleetrun.plugins.worktree; "
        "register this plugin under another name"
    ]


# ---------------------------------------------------------------------------------
# -p, -p no:, FLEETRUN_PLUGINS


def test_p_no_terminal(fleeter: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETRUN_DISABLE_PLUGIN_AUTOLOAD", "1")
    full = plugins_of(fleeter.run("--version"))
    assert full == list(BUILTIN_PLUGINS)
    without = plugins_of(fleeter.run("-p", "no:terminal", "--version"))
    assert without == [name for name in BUILTIN_PLUGINS if name != "terminal"]

    fleeter.write_tasks(echo_tasks("a"))
    result = fleeter.run("-p", "no:terminal", "tasks.toml")
    assert result.ret == 0, result.stderr
    assert fleeter.states() == {"a": "DONE"}  # it ran...
    assert result.outlines == []  # ...and printed nothing: no header, no progress, no summary


def test_p_no_events(fleeter: Any) -> None:
    fleeter.write_tasks(echo_tasks("a"))
    assert fleeter.run("-p", "no:events", "tasks.toml").ret == 0
    assert not (fleeter.home / "events.ndjson").exists()
    assert fleeter.run("--new-queue", "tasks.toml").ret == 0
    assert (fleeter.home / "events.ndjson").exists()


def test_p_no_collect_is_a_usage_error(fleeter: Any) -> None:
    fleeter.write_tasks(echo_tasks("a"))
    for args in (["-p", "no:collect", "validate"], ["-pno:collect", "--version"]):
        result = fleeter.run(*args)
        assert result.ret == 4
        assert result.errlines == ["ERROR: -p: plugin 'collect' cannot be disabled: fleetrun needs it"]


def test_p_unknown_module_is_a_usage_error(fleeter: Any) -> None:
    result = fleeter.run("-p", "no_such_fleetrun_plugin_module", "--version")
    assert result.ret == 4
    result.fnmatch_lines(["ERROR: -p: cannot import plugin 'no_such_fleetrun_plugin_module': *"], stream="err")


LIFECYCLE_PLUGIN = """
    import os

    import fleetrun


    def _log(line):
        with open(os.environ["PLUG_LOG"], "a") as f:
            f.write(line + "\\n")


    @fleetrun.hookimpl
    def fleetrun_addoption(parser, pluginmanager):
        parser.addoption("--greeting", default="none", help="say hello")


    @fleetrun.hookimpl
    def fleetrun_configure(config):
        _log(f"configure {config.option.verb} greeting={config.getoption('greeting')}")


    @fleetrun.hookimpl
    def fleetrun_sessionstart(session):
        _log(f"sessionstart {[t.name for t in session.items]}")


    @fleetrun.hookimpl
    def fleetrun_sessionfinish(session, exitstatus):
        _log(f"sessionfinish {exitstatus}")


    @fleetrun.hookimpl
    def fleetrun_unconfigure(config):
        _log("unconfigure")
"""


def test_p_module_from_pythonpath(fleeter: Any) -> None:
    mods = fleeter.path.parent / "mods"
    write_module(mods, "lifecycle_plugin", LIFECYCLE_PLUGIN)
    log = fleeter.path.parent / "plug.log"
    env = {"PYTHONPATH": str(mods), "PLUG_LOG": str(log)}
    fleeter.write_tasks(echo_tasks("a", "b"))

    version = fleeter.runsub("-p", "lifecycle_plugin", "--version", env=env)
    assert version.ret == 0, version.stderr
    assert plugins_of(version)[-1] == "lifecycle_plugin"

    result = fleeter.runsub("-p", "lifecycle_plugin", "tasks.toml", "--greeting", "hi", env=env)
    assert result.ret == 0, result.stdout + result.stderr
    assert read_log(log) == ["configure run greeting=hi", "sessionstart ['a', 'b']", "sessionfinish 0", "unconfigure"]

    # without -p the option does not exist
    plain = fleeter.runsub("tasks.toml", "--greeting", "hi", env=env)
    assert plain.ret == 4
    assert "unrecognized arguments: --greeting" in plain.stderr


def test_fleetrun_plugins_env(fleeter: Any) -> None:
    mods = fleeter.path.parent / "mods"
    write_module(mods, "lifecycle_plugin", LIFECYCLE_PLUGIN)
    write_module(
        mods,
        "second_plugin",
        """
        import os

        def fleetrun_configure(config):
            with open(os.environ["PLUG_LOG"], "a") as f:
                f.write("second\\n")
    """,
    )
    log = fleeter.path.parent / "plug.log"
    env = {"PYTHONPATH": str(mods), "PLUG_LOG": str(log), "FLEETRUN_PLUGINS": "lifecycle_plugin, second_plugin"}
    fleeter.write_tasks(echo_tasks("a"))

    version = fleeter.runsub("--version", env=env)
    assert version.ret == 0, version.stderr
    assert {"lifecycle_plugin", "second_plugin"} <= set(plugins_of(version))

    result = fleeter.runsub("validate", env=env)
    assert result.ret == 0, result.stderr
    # validate has no --greeting (plugin options belong to run and work)
    assert sorted(read_log(log)) == ["configure validate greeting=None", "second", "unconfigure"]

    blocked = fleeter.runsub("-p", "no:second_plugin", "--version", env=env)
    assert "second_plugin" not in plugins_of(blocked)


def test_plugin_specific_hooks_through_addhooks(fleeter: Any) -> None:
    calls: list[str] = []

    class NewHooks:
        """What a plugin's ``newhooks.py`` holds."""

        @fleetrun.hookspec(firstresult=True)
        def fleetrun_greeter_greeting(self, name: str) -> Optional[str]:
            """The greeting for ``name``."""

    class Greeter:
        @fleetrun.hookimpl
        def fleetrun_addhooks(self, pluginmanager: Any) -> None:
            calls.append("addhooks")
            pluginmanager.add_hookspecs(NewHooks)

        @fleetrun.hookimpl
        def fleetrun_report_header(self, config: Any) -> list[str]:
            return [f"greeter: {config.hook.fleetrun_greeter_greeting(name='fleet')}"]

    # the fleetconf.py implements the plugin's own hook, unmarked, like any other
    fleeter.write_fleetconf("""
        def fleetrun_greeter_greeting(name):
            return f"ahoy {name}"
    """)
    fleeter.write_tasks(echo_tasks("a"))
    result = fleeter.run("tasks.toml", plugins=[Greeter()])
    assert result.ret == 0, result.stdout + result.stderr
    assert calls == ["addhooks"]
    result.fnmatch_lines(["greeter: ahoy fleet"], stream="out")


# ---------------------------------------------------------------------------------
# an entry-point plugin, installed


MYPLUG_PYPROJECT = """
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "fleetrun-myplug"
version = "0.1.0"
dependencies = ["fleetrun"]

[project.entry-points.fleetrun]
myplug = "myplug_pkg.plugin"

[tool.setuptools]
packages = ["myplug_pkg"]
"""

MYPLUG_MODULE = """
import os

import fleetrun


@fleetrun.hookimpl
def fleetrun_configure(config):
    log = os.environ.get("MYPLUG_LOG")
    if log:
        with open(log, "a") as f:
            f.write(f"myplug configure {config.option.verb}\\n")


@fleetrun.hookimpl
def fleetrun_report_header(config):
    return ["myplug: installed and loaded"]
"""


def _can_build_offline() -> bool:
    """pip can build a setuptools project without build isolation (and so without a
    network): setuptools is here, and ``bdist_wheel`` too (``wheel``, or setuptools
    70.1+, which has its own)."""
    if importlib.util.find_spec("setuptools") is None:
        return False
    if importlib.util.find_spec("wheel") is not None:
        return True
    parts = metadata.version("setuptools").split(".")[:2]
    return tuple(int(p) if p.isdigit() else 0 for p in parts) >= (70, 1)


def _write_dist_info(src: Path, target: Path) -> None:
    """What ``pip install --target`` leaves, written by hand: the code, and a
    ``.dist-info`` with ``METADATA`` and ``entry_points.txt`` (importlib.metadata
    finds entry points through exactly these files)."""
    project = tomllib.loads((src / "pyproject.toml").read_text())
    meta = project["project"]
    tool = project.get("tool", {}).get("setuptools", {})
    for pkg in tool.get("packages", []):
        shutil.copytree(src / pkg.replace(".", "/"), target / pkg.replace(".", "/"))
    for mod in tool.get("py-modules", []):
        shutil.copy(src / f"{mod}.py", target / f"{mod}.py")
    dist = target / f"{meta['name'].replace('-', '_')}-{meta['version']}.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {meta['name']}\nVersion: {meta['version']}\n")
    lines = []
    for group, eps in meta.get("entry-points", {}).items():
        lines.append(f"[{group}]")
        lines.extend(f"{name} = {value}" for name, value in eps.items())
    (dist / "entry_points.txt").write_text("\n".join(lines) + "\n")


def install(src: Path, target: Path) -> str:
    """Install the distribution in ``src`` into ``target`` (put ``target`` on
    PYTHONPATH to use it). :return: ``pip`` or, where pip cannot build offline,
    ``dist-info`` (the files an install leaves, written by hand)."""
    work = target.parent / f"src-{src.name}"
    shutil.copytree(src, work, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "tests"))
    target.mkdir(parents=True)
    if not _can_build_offline():
        _write_dist_info(work, target)
        return "dist-info"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--target",
            str(target),
            str(work),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=120,
        env=dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_ROOT_USER_ACTION="ignore"),
    )
    assert proc.returncode == 0, proc.stdout.decode(errors="replace")
    return "pip"


@pytest.fixture(scope="module")
def myplug(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A distribution declaring entry point ``myplug`` (module ``myplug_pkg.plugin``),
    installed into a folder of its own; returns the folder."""
    base = tmp_path_factory.mktemp("myplug")
    src = base / "fleetrun-myplug"
    (src / "myplug_pkg").mkdir(parents=True)
    (src / "pyproject.toml").write_text(MYPLUG_PYPROJECT)
    (src / "myplug_pkg" / "__init__.py").write_text("")
    (src / "myplug_pkg" / "plugin.py").write_text(MYPLUG_MODULE)
    target = base / "site"
    install(src, target)
    assert any(target.glob("*.dist-info/entry_points.txt"))
    return target


def test_entry_point_plugin_is_loaded(fleeter: Any, myplug: Path) -> None:
    fleeter.enable_plugin_autoload()  # fleeter turns autoload off
    log = fleeter.path.parent / "myplug.log"
    env = {"PYTHONPATH": str(myplug), "MYPLUG_LOG": str(log)}
    fleeter.write_tasks(echo_tasks("a"))

    version = fleeter.runsub("--version", env=env)
    assert version.ret == 0, version.stderr
    assert plugins_of(version) == [*BUILTIN_PLUGINS, "myplug"]

    result = fleeter.runsub("tasks.toml", env=env)
    assert result.ret == 0, result.stdout + result.stderr
    result.fnmatch_lines(["fleetrun * -- plugins: *, myplug*", "myplug: installed and loaded"], stream="out")
    assert read_log(log) == ["myplug configure run"]


def test_entry_point_plugin_blocked_with_p_no(fleeter: Any, myplug: Path) -> None:
    fleeter.enable_plugin_autoload()  # fleeter turns autoload off
    log = fleeter.path.parent / "myplug.log"
    env = {"PYTHONPATH": str(myplug), "MYPLUG_LOG": str(log)}
    fleeter.write_tasks(echo_tasks("a"))
    version = fleeter.runsub("-p", "no:myplug", "--version", env=env)
    assert version.ret == 0, version.stderr
    assert plugins_of(version) == list(BUILTIN_PLUGINS)
    assert fleeter.runsub("-p", "no:myplug", "validate", env=env).ret == 0
    assert read_log(log) == []


def test_entry_point_plugin_not_autoloaded_when_disabled(fleeter: Any, myplug: Path) -> None:
    log = fleeter.path.parent / "myplug.log"
    env = {"PYTHONPATH": str(myplug), "MYPLUG_LOG": str(log), "FLEETRUN_DISABLE_PLUGIN_AUTOLOAD": "1"}
    fleeter.write_tasks(echo_tasks("a"))
    version = fleeter.runsub("--version", env=env)
    assert plugins_of(version) == list(BUILTIN_PLUGINS)
    assert fleeter.runsub("validate", env=env).ret == 0
    assert read_log(log) == []
    # its module can still be named with -p, like any module on the path
    named = fleeter.runsub("-p", "myplug_pkg.plugin", "validate", env=env)
    assert named.ret == 0, named.stderr
    assert read_log(log) == ["myplug configure validate"]


def test_p_loads_an_entry_point_by_name_when_autoload_is_disabled(fleeter: Any, myplug: Path) -> None:
    env = {"PYTHONPATH": str(myplug), "FLEETRUN_DISABLE_PLUGIN_AUTOLOAD": "1"}
    version = fleeter.runsub("-p", "myplug", "--version", env=env)
    assert version.ret == 0, version.stderr
    assert plugins_of(version) == [*BUILTIN_PLUGINS, "myplug"]


@pytest.mark.parametrize("how", ["-p", "FLEETRUN_PLUGINS"])
def test_p_names_the_module_of_an_autoloaded_plugin(fleeter: Any, myplug: Path, how: str) -> None:
    """``-p myplug_pkg.plugin`` (or FLEETRUN_PLUGINS) names the module the entry point
    ``myplug`` already loaded: it is one plugin, registered once, as pytest's ``-p``
    of a registered plugin does nothing."""
    fleeter.enable_plugin_autoload()  # fleeter turns autoload off
    log = fleeter.path.parent / "myplug.log"
    env = {"PYTHONPATH": str(myplug), "MYPLUG_LOG": str(log)}
    args: list[str] = []
    if how == "-p":
        args = ["-p", "myplug_pkg.plugin"]
    else:
        env["FLEETRUN_PLUGINS"] = "myplug_pkg.plugin"
    fleeter.write_tasks(echo_tasks("a"))

    version = fleeter.runsub(*args, "--version", env=env)
    assert version.ret == 0, version.stdout + version.stderr
    names = plugins_of(version)
    assert len(names) == len(BUILTIN_PLUGINS) + 1, names  # one name for the one plugin
    assert set(BUILTIN_PLUGINS) < set(names)

    result = fleeter.runsub(*args, "tasks.toml", env=env)
    assert result.ret == 0, result.stdout + result.stderr
    assert result.outlines.count("myplug: installed and loaded") == 1
    assert read_log(log) == ["myplug configure run"]


def test_p_names_the_module_of_a_builtin(fleeter: Any) -> None:
    """``-p fleetrun.plugins.worktree`` is the built-in ``worktree``: loaded once, quietly."""
    fleeter.write_tasks(echo_tasks("a"))
    version = fleeter.run("-p", "fleetrun.plugins.worktree", "--version")
    assert version.ret == 0, version.stdout + version.stderr
    assert plugins_of(version) == list(BUILTIN_PLUGINS)
    result = fleeter.run("-p", "fleetrun.plugins.worktree", "tasks.toml")
    assert result.ret == 0, result.stdout + result.stderr
    assert fleeter.states() == {"a": "DONE"}


# ---------------------------------------------------------------------------------
# fleetrun.main: a fresh manager per call; --version


def _check_fresh_managers(main: Callable[..., int]) -> None:
    seen: list[tuple[str, Any]] = []

    class Spy:
        def __init__(self, label: str) -> None:
            self.label = label

        @fleetrun.hookimpl
        def fleetrun_configure(self, config: Any) -> None:
            seen.append((self.label, config.pluginmanager))

    first, second = Spy("first"), Spy("second")
    assert main(["validate", "tasks.toml"], plugins=[first]) == 0
    assert main(["validate", "tasks.toml"], plugins=[second]) == 0
    assert [label for label, _ in seen] == ["first", "second"]  # first is not called again
    pm1, pm2 = seen[0][1], seen[1][1]
    assert pm1 is not pm2
    assert pm1.is_registered(first)
    assert pm2.is_registered(second) and not pm2.is_registered(first)


def test_main_builds_a_fresh_manager_per_call(fleeter: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from fleetrun.cli import main as cli_main  # what fleetrun.main() delegates to

    fleeter.write_tasks(echo_tasks("a"))
    _check_fresh_managers(cli_main)
    assert capsys.readouterr().out.splitlines() == ["tasks.toml: 1 task, valid"] * 2


def test_public_main_builds_a_fresh_manager_per_call(fleeter: Any, capsys: pytest.CaptureFixture[str]) -> None:
    importlib.import_module("fleetrun.cli")  # as the console script, fleeter or an earlier call do
    fleeter.write_tasks(echo_tasks("a"))
    _check_fresh_managers(fleetrun.main)  # type: ignore[arg-type]
    assert capsys.readouterr().out.splitlines() == ["tasks.toml: 1 task, valid"] * 2


def test_version_lists_the_plugins(fleeter: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETRUN_DISABLE_PLUGIN_AUTOLOAD", "1")
    spy = types.ModuleType("spy_plugin")
    result = fleeter.run("--version", plugins=[spy])
    assert result.ret == 0
    assert result.outlines == [f"fleetrun {fleetrun.__version__}", f"plugins: {', '.join(BUILTIN_PLUGINS)}, spy_plugin"]
    assert {"collect", "worktree", "claude", "command_agent", "terminal", "events"} <= set(BUILTIN_PLUGINS)
    assert result.errlines == []

"""Verbs come from a registry hook, ``fleetrun_verbs``: the core declares its own through
it, and a plugin (installed, ``-p``, or passed to ``fleetrun.main``) adds one with its
own arguments."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

import fleetrun
from fleetrun import ConfigKey, ExitCode, UsageError, VerbDecl, hookimpl
from fleetrun.commands import BUILTIN_VERBS


class HelloPlugin:
    """A verb with its own arguments and its own config.toml table."""

    def __init__(self) -> None:
        self.seen: list[Any] = []

    @hookimpl
    def fleetrun_verbs(self, pluginmanager: Any) -> list[VerbDecl]:
        return [VerbDecl("hello", "greet someone (a plugin's verb)", self.run, self.arguments)]

    @hookimpl
    def fleetrun_config_keys(self, config: Any) -> list[ConfigKey]:
        return [ConfigKey("hello", "punctuation", (str,))]

    def arguments(self, parser: Any) -> None:
        parser.add_argument("who", metavar="WHO", help="whom to greet")
        parser.add_argument("--times", type=int, default=1, help="how many times")

    def run(self, config: Any, out: Any, err: Any) -> int:
        self.seen.append(config)
        if config.option.who == "nobody":
            raise UsageError("there is nobody to greet", key="WHO")
        mark = config.setting("hello", "punctuation", "!")
        for _ in range(config.option.times):
            print(f"hello {config.option.who}{mark}", file=out)
        return ExitCode.OK


def test_a_plugin_adds_a_verb_with_its_own_arguments(fleeter: Any, capsys: pytest.CaptureFixture[str]) -> None:
    plugin = HelloPlugin()
    assert fleetrun.main(["hello", "world", "--times", "2"], plugins=[plugin]) == 0
    assert capsys.readouterr().out == "hello world!\nhello world!\n"
    (config,) = plugin.seen
    assert config.option.verb == "hello"

    assert fleetrun.main(["--help"], plugins=[plugin]) == 0
    listing = capsys.readouterr().out
    assert "  hello     greet someone (a plugin's verb)" in listing
    assert listing.index("  host ") < listing.index("  hello ")  # after the core's
    assert fleetrun.main(["hello", "--help"], plugins=[plugin]) == 0
    own = capsys.readouterr().out
    assert "usage: fleetrun hello" in own and "--times TIMES" in own and "whom to greet" in own


def test_a_plugin_verb_reports_usage_errors_and_checks_config_toml(
    fleeter: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    plugin = HelloPlugin()
    assert fleetrun.main(["hello", "nobody"], plugins=[plugin]) == ExitCode.USAGE_ERROR
    assert capsys.readouterr().err == "ERROR: WHO: there is nobody to greet\n"
    assert fleetrun.main(["hello"], plugins=[plugin]) == ExitCode.USAGE_ERROR  # WHO is missing
    assert "the following arguments are required: WHO" in capsys.readouterr().err

    fleeter.write_config('[hello]\npunctuation = "?"\n')
    assert fleetrun.main(["hello", "you"], plugins=[plugin]) == 0
    assert capsys.readouterr().out == "hello you?\n"
    fleeter.write_config('[hello]\npunctuaton = "?"\n')  # checked before the verb runs
    assert fleetrun.main(["hello", "you"], plugins=[plugin]) == ExitCode.USAGE_ERROR
    assert "hello.punctuaton: unknown key (did you mean 'punctuation'?)" in capsys.readouterr().err
    assert len(plugin.seen) == 2


def test_without_the_plugin_the_verb_is_unknown(fleeter: Any) -> None:
    result = fleeter.run("hello", "world")
    assert result.ret == ExitCode.USAGE_ERROR
    assert result.stderr.startswith("ERROR: hello: not a file or a verb")
    # with it, a misspelling of it is hinted at as the core's verbs are
    result = fleeter.run("helo", plugins=[HelloPlugin()])
    assert result.ret == ExitCode.USAGE_ERROR
    assert result.stderr == "ERROR: helo: not a file or a verb (did you mean hello?)\n"


PLUGIN_MODULE = """
import json
import fleetrun
from fleetrun.queueing import collect_items


def _arguments(parser):
    parser.add_argument("--json", action="store_true", help="print JSON")


def _count(config, out, err):
    items = collect_items(config)
    names = [t.name for t in items]
    print(json.dumps(names) if config.option.json else f"{len(names)} tasks: {', '.join(names)}", file=out)
    return fleetrun.ExitCode.OK if names else fleetrun.ExitCode.NO_TASKS_COLLECTED


@fleetrun.hookimpl
def fleetrun_verbs(pluginmanager):
    return [fleetrun.VerbDecl("count", "count the tasks of tasks files", _count, _arguments,
                              takes_tasks_files=True)]
"""


def _write_module(folder: Path, name: str, text: str) -> dict[str, str]:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.py").write_text(textwrap.dedent(text))
    return {"PYTHONPATH": str(folder)}


def test_a_p_module_adds_a_verb_that_takes_tasks_files(fleeter: Any) -> None:
    """``-p MODULE``: the verb gets the tasks files resolved as ``fleetrun [run]`` does
    (a folder stands for its tasks.toml), ``-k``, and their fleetconf.py files."""
    env = _write_module(fleeter.path.parent / "mods", "countverb", PLUGIN_MODULE)
    fleeter.write(
        "sub/tasks.toml",
        textwrap.dedent("""
        [[task]]
        name = "alpha"
        prompt = "a"
        [[task]]
        name = "beta"
        prompt = "b"
        """),
    )
    fleeter.write_fleetconf("def fleetrun_collection_modifyitems(config, items):\n    items.reverse()\n", folder="sub")
    result = fleeter.runsub("-p", "countverb", "count", "sub", env=env)
    assert result.ret == 0, result.stderr
    assert result.stdout == "2 tasks: beta, alpha\n"
    result = fleeter.runsub("count", "-p", "countverb", "sub", "-k", "alpha", "--json", env=env)
    assert (result.ret, result.stdout) == (0, '["alpha"]\n'), result.stderr
    result = fleeter.runsub("-p", "countverb", "count", env=env)  # no ./tasks.toml
    assert result.ret == ExitCode.USAGE_ERROR
    assert "tasks.toml" in result.stderr
    assert fleeter.runsub("count", "sub", env=env).ret == ExitCode.USAGE_ERROR  # not loaded: no verb


def test_a_plugin_cannot_replace_a_verb(fleeter: Any) -> None:
    class Takeover:
        @hookimpl
        def fleetrun_verbs(self, pluginmanager: Any) -> list[VerbDecl]:
            return [VerbDecl("status", "mine", lambda config, out, err: 0)]

    result = fleeter.run("status", plugins=[Takeover()])
    assert result.ret == ExitCode.USAGE_ERROR
    assert "fleetrun_verbs: verb 'status' is declared twice: fleetrun has it already" in result.stderr

    result = fleeter.run("--version", plugins=[HelloPlugin(), HelloPlugin()])
    assert result.ret == ExitCode.USAGE_ERROR
    assert "verb 'hello' is declared twice: another plugin has it already" in result.stderr

    class BadName:
        @hookimpl
        def fleetrun_verbs(self, pluginmanager: Any) -> list[Any]:
            return [VerbDecl("two words", "x", lambda config, out, err: 0)]

    result = fleeter.run("--version", plugins=[BadName()])
    assert result.ret == ExitCode.USAGE_ERROR
    assert "verb 'two words' is not one word" in result.stderr


def test_a_fleetconf_cannot_add_a_verb(fleeter: Any) -> None:
    """Verbs are known before the command line is parsed, a fleetconf.py only once its
    tasks file is: a fleetrun_verbs in one is an error, not silently ignored."""
    fleeter.write_tasks('[[task]]\nname = "a"\nprompt = "p"\n')
    fleeter.write_fleetconf(
        textwrap.dedent("""
        import fleetrun

        def fleetrun_verbs(pluginmanager):
            return [fleetrun.VerbDecl("mine", "x", lambda config, out, err: 0)]
        """)
    )
    result = fleeter.run("validate")
    assert result.ret == ExitCode.USAGE_ERROR
    assert "fleetconf.py: fleetrun_verbs cannot add a verb from a fleetconf.py" in result.stderr
    assert "-p MODULE" in result.stderr


def test_the_core_declares_its_verbs_the_same_way() -> None:
    names = [d.name for d in BUILTIN_VERBS]
    assert names == [
        "run",
        "validate",
        "queue",
        "work",
        "status",
        "logs",
        "cancel",
        "retry",
        "approve",
        "drain",
        "undrain",
        "gc",
    ]
    assert all(isinstance(d, VerbDecl) for d in BUILTIN_VERBS)
    # the loop's verbs take the plugins' options; the operator's verbs work with a broken config.toml
    assert {d.name for d in BUILTIN_VERBS if d.plugin_options} == {"run", "work"}
    assert {d.name for d in BUILTIN_VERBS if d.reads_config} == {"run", "validate", "queue", "work"}

"""fleetrun.fleeter, the pytest plugin that tests fleetrun and its plugins: the hook
recorder, assert_outcomes, sys.modules/sys.path restored after in-process runs,
entry-point autoload off, the fake_claude fixture and spawn on a pty."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

import fleetrun
from fleetrun.fleeter import ECHO_AGENT, FakeClaude, Fleeter, RunResult, echo_task
from fleetrun.testing.recorder import HookRecorder, SysModulesSnapshot, SysPathsSnapshot

QUEUE = (
    ECHO_AGENT
    + echo_task("ok", verify="true")
    + echo_task("bad", verify="false", max_retries=0)
    + echo_task("stuck", requires=["no-such-tool-on-any-machine"])
)


# -- the hook recorder -------------------------------------------------------------------


def test_inline_run_records_the_hook_calls_with_their_arguments(fleeter: Fleeter) -> None:
    fleeter.write_tasks(QUEUE)
    result = fleeter.inline_run("tasks.toml")
    assert result.ret == 1, result.stdout + result.stderr
    calls = result.hooks.getcalls("fleetrun_transition")
    assert calls, result.hooks.listnames()
    to_done = [c for c in calls if c.to_state == "DONE"]
    assert [c.task.name for c in to_done] == ["ok"]
    assert to_done[0].from_state == "VERIFYING" and to_done[0].attempt == 1
    assert to_done[0]._name == "fleetrun_transition"
    assert to_done[0].config.pluginmanager is not None
    # comma-separated names, in call order, as pytester's getcalls takes them
    both = result.hooks.getcalls("fleetrun_transition, fleetrun_sessionfinish")
    assert both[-1]._name == "fleetrun_sessionfinish"
    assert len(both) == len(calls) + 1
    assert result.hooks.getcall("fleetrun_sessionfinish") is both[-1]


def test_getcalls_refuses_a_name_that_is_no_hook(fleeter: Fleeter) -> None:
    fleeter.write_tasks(QUEUE)
    result = fleeter.inline_run("validate")
    with pytest.raises(ValueError, match="no such hook: fleetrun_transtion"):
        result.hooks.getcalls("fleetrun_transtion")
    with pytest.raises(AssertionError, match="called 0 times"):
        result.hooks.getcall("fleetrun_transition")


def test_each_run_records_its_own_calls_and_run_records_none(fleeter: Fleeter) -> None:
    fleeter.write_tasks(QUEUE)
    first = fleeter.inline_run("tasks.toml")
    second = fleeter.inline_run("status")
    assert first.hooks.getcalls("fleetrun_transition")
    assert second.hooks.getcalls("fleetrun_transition") == []
    # the first recorder stopped with its run: the second run added nothing to it
    assert first.hooks.listnames().count("fleetrun_configure") == 0
    assert "fleetrun_unconfigure" in first.hooks.listnames()
    assert first.hooks.listnames()[-1] == "fleetrun_unconfigure"
    plain = fleeter.run("status")
    assert plain.hooks.calls == []


def test_recorder_plugin_is_only_passed_when_recording(fleeter: Fleeter, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []
    import fleetrun.cli

    real = fleetrun.cli.main

    def spy(args: Any, plugins: Any = None, **kw: Any) -> int:
        seen.append(plugins)
        return real(args, plugins=plugins, **kw)

    monkeypatch.setattr(fleetrun.cli, "main", spy)
    fleeter.run("--version")
    fleeter.inline_run("--version")
    assert seen[0] is None  # `fleetrun host ...` answers without a manager only when no plugins are given
    assert len(seen[1]) == 1


def test_hook_recorder_on_a_plain_manager() -> None:
    import pluggy

    spec, impl = pluggy.HookspecMarker("x"), pluggy.HookimplMarker("x")

    class Spec:
        @spec
        def x_hook(self, a: int) -> None: ...

    class Impl:
        @impl
        def x_hook(self, a: int) -> None: ...

    pm = pluggy.PluginManager("x")
    pm.add_hookspecs(Spec)
    pm.register(Impl())
    rec = HookRecorder()
    pm.hook.x_hook(a=0)
    rec.attach(pm)
    pm.hook.x_hook(a=1)
    rec.finish_recording()
    pm.hook.x_hook(a=2)
    assert [c.a for c in rec.getcalls(["x_hook"])] == [1]
    assert "x_hook" in repr(rec.calls[0])


# -- assert_outcomes ---------------------------------------------------------------------


def test_assert_outcomes_counts_the_tasks_of_the_run(fleeter: Fleeter) -> None:
    fleeter.write_tasks(QUEUE)
    result = fleeter.run("tasks.toml")
    assert result.outcomes() == {"done": 1, "needs_human": 1, "ready": 1}
    result.assert_outcomes(done=1, needs_human=1)
    result.assert_outcomes(done=1, needs_human=1, ready=1, pending=0)
    with pytest.raises(AssertionError) as e:
        result.assert_outcomes(done=2)
    text = str(e.value)
    assert "  done: expected 2, got 1" in text
    assert "  needs_human: expected 0, got 1" in text
    assert "  bad NEEDS_HUMAN (retries_exhausted:false)" in text
    assert "exit code 1" in text
    with pytest.raises(TypeError, match="no such state: passed"):
        result.assert_outcomes(passed=1)


def test_assert_outcomes_is_the_ledger_when_the_run_ended(fleeter: Fleeter) -> None:
    fleeter.write_tasks(QUEUE)
    run = fleeter.run("tasks.toml")
    cancel = fleeter.runsub("cancel", "stuck")
    assert cancel.ret == 0, cancel.stderr
    run.assert_outcomes(done=1, needs_human=1, ready=1)
    cancel.assert_outcomes(done=1, needs_human=1, cancelled=1)


def test_assert_outcomes_with_no_ledger(fleeter: Fleeter) -> None:
    result = fleeter.run("--version")
    assert result.tasks == []
    result.assert_outcomes()
    assert not (fleeter.home / "state.db").exists()  # looking made no ledger


def test_an_unreadable_ledger_says_so() -> None:
    r = RunResult(0, "", "", 0.0, ledger_error="state.db: file is not a database")
    with pytest.raises(AssertionError, match="cannot read the ledger after the run: state.db"):
        r.assert_outcomes()


# -- sys.modules and sys.path ------------------------------------------------------------

FLEETCONF_WITH_HELPER = """
import pathlib

import helper_of_fleetconf

pathlib.Path(__file__).with_name("seen.txt").write_text(f"helper says {helper_of_fleetconf.VALUE}")
"""


def test_a_fleetconf_and_its_neighbours_do_not_outlive_the_run(fleeter: Fleeter) -> None:
    fleeter.write_tasks(QUEUE)
    fleeter.write_fleetconf(FLEETCONF_WITH_HELPER)
    fleeter.write("helper_of_fleetconf.py", "VALUE = 1\n")
    path_before = list(sys.path)
    first = fleeter.run("validate")
    assert first.ret == 0, first.stderr
    assert (fleeter.path / "seen.txt").read_text() == "helper says 1"
    assert "helper_of_fleetconf" not in sys.modules
    assert not [m for m in sys.modules if m.startswith("fleetconf_")]
    assert sys.path == path_before
    # a second run imports the helper afresh: the module cached by the first would say 1
    fleeter.write("helper_of_fleetconf.py", "VALUE = 2\n")
    assert fleeter.run("validate").ret == 0
    assert (fleeter.path / "seen.txt").read_text() == "helper says 2"


def test_fleetruns_own_lazy_imports_stay(fleeter: Fleeter) -> None:
    fleeter.write_tasks(QUEUE)
    sys.modules.pop("fleetrun.plugins.terminal", None)
    assert fleeter.run("validate").ret == 0
    # one copy of fleetrun's modules: a second one would hold classes of its own
    assert "fleetrun.plugins.terminal" in sys.modules


def test_snapshots_restore_and_preserve(tmp_path: Path) -> None:
    paths = SysPathsSnapshot()
    mods = SysModulesSnapshot(lambda name, mod: name == "kept_by_snapshot")
    old_json = sys.modules["json"]
    sys.path.insert(0, str(tmp_path))
    sys.modules["dropped_by_snapshot"] = sys  # any module object will do
    sys.modules["kept_by_snapshot"] = sys
    sys.modules["json"] = sys
    try:
        mods.restore()
        paths.restore()
        assert "dropped_by_snapshot" not in sys.modules
        assert sys.modules["json"] is old_json
        assert str(tmp_path) not in sys.path
        assert "kept_by_snapshot" in sys.modules
    finally:
        sys.modules.pop("kept_by_snapshot", None)
        sys.modules["json"] = old_json


def test_what_the_test_imports_from_its_folder_is_forgotten_at_teardown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    f = Fleeter(tmp_path, monkeypatch)
    f.write("mine_for_teardown.py", "X = 1\n")
    sys.path.insert(0, str(f.path))
    __import__("mine_for_teardown")
    f.close()
    assert "mine_for_teardown" not in sys.modules
    assert str(f.path) not in sys.path


# -- entry-point autoload ----------------------------------------------------------------


def _install_entry_point(site: Path) -> None:
    """An installed plugin as ``pip install`` leaves it: a module and a dist-info."""
    site.mkdir()
    (site / "fleeter_ep_plugin.py").write_text("def fleetrun_configure(config):\n    pass\n")
    dist = site / "fleeter_ep-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fleeter-ep\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[fleetrun]\nfleeter_ep = fleeter_ep_plugin\n")


def test_installed_plugins_are_not_autoloaded_unless_the_test_says_so(
    fleeter: Fleeter, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert os.environ["FLEETRUN_DISABLE_PLUGIN_AUTOLOAD"] == "1"
    _install_entry_point(fleeter.root / "site")
    monkeypatch.syspath_prepend(str(fleeter.root / "site"))
    off = fleeter.run("--version")
    assert off.ret == 0, off.stderr
    off.no_fnmatch_line("plugins: *fleeter_ep*")
    fleeter.enable_plugin_autoload()
    assert "FLEETRUN_DISABLE_PLUGIN_AUTOLOAD" not in os.environ
    on = fleeter.run("--version")
    on.fnmatch_lines(["plugins: *fleeter_ep*"])


# -- the fake claude ---------------------------------------------------------------------


def test_fake_claude_fixture_for_a_plugins_tests(fleeter: Fleeter, fake_claude: FakeClaude) -> None:
    fleeter.make_repo()
    fleeter.write_tasks("""
        [[task]]
        name = "greet"
        cwd = "repo"
        prompt = "write hello.txt"
          [[task.verify]]
          run = "test -f hello.txt"
    """)
    fake_claude.script(greet=[{"actions": [["write", "hello.txt", "hello\n"], ["commit", "hello"]]}])
    result = fleeter.inline_run("tasks.toml")
    result.assert_outcomes(done=1)
    (call,) = fake_claude.calls("greet")
    assert "write hello.txt" in call["prompt"]
    assert fake_claude.review_calls() == []
    assert [c.to_state for c in result.hooks.getcalls("fleetrun_transition")][-1] == "DONE"


def test_a_call_the_fake_could_not_finish_logging_is_left_out_not_an_error(
    fleeter: Fleeter, fake_claude: FakeClaude
) -> None:
    """The soak kills fakes and fills the disk: a cut-short line in the middle of the
    log (the next fake appended after it) is no call, and the calls around it are read."""
    fleeter.make_repo()
    fleeter.write_tasks("""
        [[task]]
        name = "a"
        cwd = "repo"
        prompt = "p"
    """)
    fake_claude.script(a=[{"actions": [["write", "a.txt", "a\n"], ["commit", "a"]]}])
    fleeter.inline_run("tasks.toml").assert_outcomes(done=1)
    whole = fake_claude.log_path.read_text()
    fake_claude.log_path.write_text(whole + '{"argv": ["-p"], "env": {"FLEETRUN_TA' + "\n" + whole)
    assert len(fake_claude.calls("a")) == 2
    fake_claude.log_path.write_text(whole + "[1, 2]\n\x00\x00\n")
    assert len(fake_claude.calls("a")) == 1


def test_fake_claude_is_the_packaged_one_and_first_on_path(fake_claude: FakeClaude) -> None:
    import fleetrun.testing.fake_claude as packaged

    assert shutil.which("claude") == str(fake_claude.executable)
    text = fake_claude.executable.read_text()
    assert str(Path(packaged.__file__).parent) in text and sys.executable in text  # the package's folder, run by path
    assert "tests" not in Path(packaged.__file__).relative_to(Path(fleetrun.__file__).parent).parts


def test_the_fake_ships_in_the_package() -> None:
    """setup.cfg finds packages with ``include = fleetrun, fleetrun.*``: the fake is a
    module of a package, so it ships without package_data."""
    import configparser

    import setuptools

    root = Path(fleetrun.__file__).parent.parent
    cfg = configparser.ConfigParser()
    cfg.read(root / "setup.cfg")
    include = [p.strip() for p in cfg["options.packages.find"]["include"].replace(",", "\n").split() if p.strip()]
    assert "fleetrun.testing" in setuptools.find_packages(str(root), include=include)
    assert (root / "fleetrun" / "testing" / "__init__.py").is_file()


# -- spawn -------------------------------------------------------------------------------


def test_spawn_runs_fleetrun_on_a_terminal(fleeter: Fleeter) -> None:
    import pexpect

    fleeter.write_tasks(QUEUE)
    fleeter.write_fleetconf("import os\nprint('stdout is a tty:', os.isatty(1))\n")
    child = fleeter.spawn("validate")
    child.expect("stdout is a tty: True")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert b"stdout is a tty: True" in (fleeter.root / "spawn.out").read_bytes()
    # the same through runsub: pipes, no terminal
    fleeter.runsub("validate").fnmatch_lines(["stdout is a tty: False"])


def test_a_spawned_child_still_running_is_killed_at_teardown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = Fleeter(tmp_path, monkeypatch)
    f.write_tasks("""
        [agents.slow]
        command = ["{python}", "-c", "import time; time.sleep(60)"]

        [[task]]
        name = "slow"
        prompt = "p"
        cwd = "."
        agent = "slow"
    """)
    child = f.spawn("tasks.toml")
    child.expect("slow")
    f.close()
    assert not child.isalive()


# -- docs/plugins.md ---------------------------------------------------------------------


def _doc_files() -> dict[str, str]:
    """The ```python blocks of docs/plugins.md's "Testing your plugin" whose first line
    is ``# PATH``: the worked example's files."""
    import re

    doc = (Path(__file__).resolve().parents[1] / "docs" / "plugins.md").read_text()
    section = doc[doc.index("## Testing your plugin") :]
    section = section[: section.find("\n## ", 1)] if "\n## " in section[1:] else section
    files = {}
    for block in re.findall(r"```python\n(.*?)```", section, re.S):
        first, _, rest = block.partition("\n")
        if re.fullmatch(r"# [\w/]+\.py", first):
            files[first[2:]] = rest
    return files


def test_the_worked_example_in_plugins_md_passes(tmp_path: Path) -> None:
    """Run as a plugin author would: their own folder, their conftest.py enabling
    fleetrun.fleeter, pytest in a subprocess (no conftest of this repository)."""
    import subprocess

    files = _doc_files()
    assert set(files) == {"fleetrun_needs_human.py", "tests/test_needs_human.py"}
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["fleetrun.fleeter"]\n')
    (tmp_path / "pytest.ini").write_text("[pytest]\nfilterwarnings = error\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEETRUN_", "FAKE_CLAUDE_"))}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout

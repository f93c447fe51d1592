"""The cached answer of a command line that is only read (``--help``, ``--version``):
the second run prints the first's text without importing pluggy or argparse, and every
input of the answer that changes gives the new answer (docs/cli.md, "Cached answers").

Every run is the real CLI in a fresh interpreter (``python -X importtime -m fleetrun``),
so what it imported is seen from outside; nothing here is timed."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import pytest

from fleetrun import helpcache, helprecord

PLUGIN = """
from fleetrun import hookimpl

@hookimpl
def fleetrun_addoption(parser):
    parser.addoption("--helpplug-opt", help="{text}")
"""
ENTRY_POINTS = "[fleetrun]\nhelpplug = helpplug\n"
#: ``-m`` puts the current folder on ``sys.path``, and a folder of ``sys.path`` is listed
#: (any entry made there is another answer): without it, what the tests below make in
#: the folder they run in is seen by the stat() of the probe that found it missing.
SAFE_PATH = ["-P"] if sys.version_info >= (3, 11) else []


class Env:
    """A home (made: the cache lives in it), a folder to run in and a folder on
    ``PYTHONPATH`` a plugin distribution can be put in or taken out of."""

    def __init__(self, tmp: Path) -> None:
        self.home = tmp / "home"
        self.home.mkdir()
        self.cwd = tmp / "work"
        self.cwd.mkdir()
        self.site = tmp / "site"
        self.site.mkdir()
        self.env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("FLEETRUN_") and k not in ("COLUMNS", "LINES", "PYTHONPATH")
        }
        self.env.update(FLEETRUN_HOME=str(self.home), COLUMNS="100", PYTHONPATH=str(self.site))

    def run(self, *args: str, **env: Optional[str]) -> tuple[bytes, set[str]]:
        """The command's stdout and the modules it imported; it must exit 0, silently."""
        e = dict(self.env)
        for k, v in env.items():
            if v is None:
                e.pop(k, None)
            else:
                e[k] = v
        proc = subprocess.run(
            [sys.executable, *SAFE_PATH, "-X", "importtime", "-m", "fleetrun", *args],
            env=e,
            cwd=str(self.cwd),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=120,
        )
        err = proc.stderr.decode(errors="replace")
        lines = err.splitlines()
        imported = {ln.rsplit("|", 1)[-1].strip() for ln in lines if ln.startswith("import time:")}
        others = [ln for ln in lines if not ln.startswith("import time:")]
        assert proc.returncode == 0 and not others, f"exit {proc.returncode}\n{err}"
        assert "fleetrun" in imported  # the import listing means something
        return proc.stdout, imported

    def fresh(self, *args: str, **env: Optional[str]) -> bytes:
        """What the command prints with no cache at all."""
        out, imported = self.run(*args, FLEETRUN_NO_CACHE="1", **env)
        assert "argparse" in imported or args == ("--version",)
        return out

    def settle(self) -> None:
        """Every file and folder made here dated a while ago: one changed a moment ago
        keeps no answer (``helprecord.RACY_NS``). Each call a time of its own."""
        Env.past -= 1000
        when = time.time_ns() - 10 * helprecord.RACY_NS + Env.past
        for folder in (self.cwd, self.site):
            for path in [folder, *folder.rglob("*")]:
                os.utime(path, ns=(when, when), follow_symlinks=False)

    past = 0

    def cached(self, *args: str, **env: Optional[str]) -> bytes:
        """The command run until its answer is cached; the cached answer."""
        self.settle()
        first, _ = self.run(*args, **env)
        second, imported = self.run(*args, **env)
        assert second == first
        assert not {"pluggy", "argparse"} & imported, sorted({"pluggy", "argparse"} & imported)
        return second

    def plugin(self, text: str) -> Path:
        path = self.site / "helpplug.py"
        path.write_text(PLUGIN.format(text=text))
        return path

    def install(self) -> Path:
        dist = self.site / "helpplug-1.0.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: helpplug\nVersion: 1.0\n")
        (dist / "entry_points.txt").write_text(ENTRY_POINTS)
        return dist


@pytest.fixture
def env(tmp_path: Path) -> Env:
    return Env(tmp_path)


@pytest.mark.parametrize(
    "args",
    [["--help"], ["-h"], ["--version"], ["status", "--help"], ["-p", "no:relay", "--help"]],
    ids=" ".join,
)
def test_the_second_answer_is_the_first_byte_for_byte_without_pluggy_or_argparse(
    env: Env, args: list[str]
) -> None:
    first, imported = env.run(*args)
    assert "pluggy" in imported  # the first run renders it as always
    assert env.cached(*args) == first == env.fresh(*args)
    assert first.startswith(b"fleetrun 0" if args == ["--version"] else b"usage: fleetrun")


def test_the_cache_is_private(env: Env) -> None:
    env.cached("--help")
    folder = env.home / "cache"
    files = [f for f in folder.iterdir() if f.name.startswith(helpcache.PREFIX)]
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert files and all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)
    assert not [f for f in folder.iterdir() if f.name.endswith(".tmp")]


def test_no_home_is_made_to_cache_the_help(env: Env) -> None:
    """``--help`` makes no home; it is not made for its cache either: without a home
    each run renders it."""
    env.home.rmdir()
    first, _ = env.run("--help")
    second, imported = env.run("--help")
    assert second == first and "argparse" in imported
    assert not env.home.exists()


def test_the_opt_out_renders_every_time(env: Env) -> None:
    env.cached("--help")
    _, imported = env.run("--help", FLEETRUN_NO_CACHE="1")
    assert "argparse" in imported


def test_a_garbled_cache_is_the_usual_answer(env: Env) -> None:
    want = env.cached("--help")
    for f in (env.home / "cache").iterdir():
        f.write_bytes(b"\xe3garbage" + f.read_bytes()[:40])
    out, imported = env.run("--help")
    assert out == want and "argparse" in imported
    assert env.cached("--help") == want  # and it is cached again


def test_a_plugin_installed_or_removed_changes_the_help(env: Env) -> None:
    env.plugin("HELPPLUG-ONE")
    before = env.cached("--help")
    assert b"--helpplug-opt" not in before
    dist = env.install()
    got, imported = env.run("--help")
    assert b"HELPPLUG-ONE" in got and got == env.fresh("--help")
    assert env.cached("--help") == got
    shutil.rmtree(dist)
    assert env.run("--help")[0] == before


def test_an_edited_plugin_module_changes_the_help(env: Env) -> None:
    path = env.plugin("HELPPLUG-ONE")
    env.install()
    assert b"HELPPLUG-ONE" in env.cached("--help")
    st = path.stat()
    with open(path, "r+") as f:  # in place, the same size: only the time tells
        text = f.read()
        f.seek(0)
        f.write(text.replace("HELPPLUG-ONE", "HELPPLUG-TWO"))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert (path.stat().st_ino, path.stat().st_size) == (st.st_ino, st.st_size)
    got, _ = env.run("--help")
    assert b"HELPPLUG-TWO" in got and b"HELPPLUG-ONE" not in got


def test_a_file_changed_a_moment_ago_keeps_no_answer(env: Env) -> None:
    """Changed within its time's granularity, a file could change again unseen (same
    time, size and inode): an answer read from it is kept once that has passed."""
    path = env.plugin("HELPPLUG-ONE")
    env.install()
    env.settle()
    os.utime(path)  # now
    for _ in range(2):
        out, imported = env.run("--help")
        assert b"HELPPLUG-ONE" in out and "argparse" in imported
    assert env.cached("--help") == out


def test_a_plugin_blocked_or_named_is_another_answer(env: Env) -> None:
    env.plugin("HELPPLUG-ONE")
    plain = env.cached("--help")
    assert b"\n  relay " in plain
    blocked = env.cached("-p", "no:relay", "--help")
    assert b"\n  relay " not in blocked
    named = env.cached("-p", "helpplug", "--help")
    assert b"HELPPLUG-ONE" in named
    assert env.run("--help", FLEETRUN_PLUGINS="helpplug")[0] == named
    assert env.run("--help", FLEETRUN_PLUGINS=None)[0] == plain


def test_the_width_is_part_of_the_answer(env: Env) -> None:
    wide = env.cached("--help")
    narrow, _ = env.run("--help", COLUMNS="60")
    assert narrow != wide and narrow == env.fresh("--help", COLUMNS="60")
    assert env.run("--help")[0] == wide


@pytest.mark.parametrize("where", ["here", "the repository's root"])
def test_a_project_file_that_appears_changes_the_help(env: Env, where: str) -> None:
    """The project file's ``addopts`` come before the command line (``-p no:relay``):
    its absence is recorded, so one made later is read, here or up to the repository's
    root (a folder no listing covers)."""
    root = env.cwd
    if where != "here":
        (root / ".git").mkdir()
        env.cwd = root / "sub"
        env.cwd.mkdir()
    plain = env.cached("--help")
    (root / "fleetrun.toml").write_text('addopts = ["-p", "no:relay"]\n')
    got, _ = env.run("--help")
    assert got != plain and b"\n  relay " not in got
    assert got == env.fresh("--help")


def test_a_fleetconf_py_is_not_read_by_the_help(env: Env) -> None:
    """A ``fleetconf.py`` is loaded after the command line is parsed (and may not add
    options): one that appears leaves the answer as it was, rendered or cached."""
    plain = env.cached("--help")
    (env.cwd / "tasks.toml").write_text('[[task]]\nname = "a"\nprompt = "p"\n')
    (env.cwd / "fleetconf.py").write_text(PLUGIN.format(text="FLEETCONF"))
    assert env.fresh("--help") == plain == env.cached("--help")


def test_the_version_follows_the_package(env: Env, tmp_path: Path) -> None:
    """A copy of fleetrun first on the path stands for an upgrade: its version is the
    new answer."""
    import fleetrun

    copy = env.site / "fleetrun"
    shutil.copytree(
        Path(fleetrun.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__")
    )
    before = env.cached("--version")
    assert before.startswith(f"fleetrun {fleetrun.__version__}\n".encode())
    (copy / "version.py").write_text('__version__ = "9.9.9"\n')
    got, _ = env.run("--version")
    assert got.startswith(b"fleetrun 9.9.9\n")


def test_an_answer_with_an_error_is_not_cached(env: Env) -> None:
    """``-p`` naming a module that does not import: the error each time, never cached."""
    e = dict(env.env)
    for _ in range(2):
        proc = subprocess.run(
            [sys.executable, "-m", "fleetrun", "-p", "nosuchplugin", "--help"],
            env=e,
            cwd=str(env.cwd),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 4 and "cannot import plugin 'nosuchplugin'" in proc.stderr
    assert (
        not [f for f in (env.home / "cache").glob(helpcache.PREFIX + "*")]
        if (env.home / "cache").exists()
        else True
    )


def test_the_in_process_api_never_uses_the_cache(
    env: Env, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``fleetrun.main(args, plugins=[...])`` renders: a test's plugins' options show."""
    import fleetrun
    from fleetrun import hookimpl

    env.cached("--help")
    for k, v in env.env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.chdir(env.cwd)

    class Mine:
        @hookimpl
        def fleetrun_addoption(self, parser: object) -> None:
            parser.addoption("--mine-only", help="MINE")  # type: ignore[attr-defined]

    assert fleetrun.main(["--help"], plugins=[Mine()]) == 0
    assert "--mine-only" in capsys.readouterr().out


def test_the_read_only_words_are_the_clis() -> None:
    from fleetrun import cli

    assert helpcache.READ_ONLY_WORDS == cli._READ_ONLY_WORDS


def test_the_markers_are_exported_whatever_was_imported_first() -> None:
    """``fleetrun.hookimpl`` and ``fleetrun.hookspec`` are the markers, not the modules
    of the same name, even when a module imported them first (lazily exported)."""
    code = (
        "import fleetrun.hookspec, fleetrun.hookimpl, pluggy, fleetrun\n"
        "assert isinstance(fleetrun.hookimpl, pluggy.HookimplMarker), fleetrun.hookimpl\n"
        "assert isinstance(fleetrun.hookspec, pluggy.HookspecMarker), fleetrun.hookspec\n"
        "from fleetrun import hookimpl, hookspec\n"
        "assert isinstance(hookimpl, pluggy.HookimplMarker)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import fleetrun"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "pluggy" not in {ln.rsplit("|", 1)[-1].strip() for ln in proc.stderr.splitlines()}

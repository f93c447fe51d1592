"""fleetrun.gitutil: the one place git commands are built (issue 21, item 1), with real
git repositories; the end-to-end attacks are tests/acceptance/test_security_gitconfig.py."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from fleetrun.fleeter import GIT_ENV
from fleetrun.gitutil import filters_off, git, git_env


def sh_git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=dict(os.environ, **GIT_ENV)
    ).stdout


def make_repo(path: Path) -> Path:
    path.mkdir()
    sh_git(path, "init", "-q")
    (path / "a.txt").write_text("a\n")
    sh_git(path, "add", "-A")
    sh_git(path, "commit", "-q", "-m", "a")
    return path


def test_filters_off_switches_off_every_driver_the_config_defines(tmp_path):
    # driver names may hold dots, and a value may hold a newline; each driver once
    repo = make_repo(tmp_path / "repo")
    sh_git(repo, "config", "filter.lfs.clean", "git-lfs clean -- %f")
    sh_git(repo, "config", "filter.lfs.process", "git-lfs filter-process")
    sh_git(repo, "config", "filter.a.b.smudge", "printf 'x\ny'")
    off = filters_off(git(repo, "config", "-z", "--get-regexp", r"^filter\."))
    pairs = [off[i + 1] for i in range(0, len(off), 2)]
    assert off[::2] == ["-c"] * len(pairs)
    assert pairs == [
        "filter.a.b.clean=",
        "filter.a.b.smudge=",
        "filter.a.b.process=",
        "filter.a.b.required=false",
        "filter.lfs.clean=",
        "filter.lfs.smudge=",
        "filter.lfs.process=",
        "filter.lfs.required=false",
    ]
    assert filters_off("") == []


def test_git_env_leaves_out_what_would_send_git_elsewhere(monkeypatch):
    monkeypatch.setenv("GIT_DIR", "/elsewhere/.git")
    monkeypatch.setenv("GIT_INDEX_FILE", "/elsewhere/index")
    monkeypatch.setenv("GIT_EXTERNAL_DIFF", "/bin/evil")
    monkeypatch.setenv("GIT_AUTHOR_NAME", "me")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", "/my/gitconfig")
    env = git_env({"GIT_COMMITTER_NAME": "fleetrun"})
    assert not {"GIT_DIR", "GIT_INDEX_FILE", "GIT_EXTERNAL_DIFF"} & set(env)
    assert env["GIT_AUTHOR_NAME"] == "me" and env["GIT_CONFIG_GLOBAL"] == "/my/gitconfig"
    assert env["GIT_COMMITTER_NAME"] == "fleetrun" and env["GIT_TERMINAL_PROMPT"] == "0"

"""fleetrun-github and a task that ran on a peer: its branch is pushed from this machine
once it was fetched back (the task has a dependent), and a peer's branch that was not
fetched back (``[relay] fetch_back = false``) is not pushed (a note says why).

This file borrows fleetrun's own peer harness (``tests/sshd.py`` of this repository: a
real sshd on 127.0.0.1), so it runs only from a checkout of fleetrun. The peer's
``repo`` path holds a clone of the repository in a private mount namespace, as in
``tests/acceptance/test_peers_fetchback.py``: the branch really is only on the peer
until it is fetched. That needs root and ``unshare``; without them the test skips.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import fleetrun_github
import pytest
from ghstub import write_gh

TESTS = Path(__file__).resolve().parents[3] / "tests"
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

pytest_plugins = ["sshd"]
# ~15 s under load (an sshd, two peer tasks, a fetch-back): with the slow tests (-m slow)
pytestmark = [pytest.mark.ssh, pytest.mark.slow]


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def test_a_peers_branch_is_pushed_from_here_once_fetched_back(fleeter: Any, fake_claude: Any, peer_lab: Any) -> None:
    repo = fleeter.make_repo()
    remote = fleeter.path / "remote.git"
    git(fleeter.path, "init", "-q", "--bare", str(remote))
    git(repo, "remote", "add", "origin", str(remote))
    mini = peer_lab.private_machine("mini", repo)
    mini.pair(fleeter)
    gh = write_gh(fleeter.path / "bin")
    # a DONE peer task's branch is fetched back by default: here only one with a
    # dependent is (fetch_back = false), so lonely's stays on the peer
    fleeter.write_config(
        (fleeter.home / "config.toml").read_text() + f'\n[github]\ngh = "{gh}"\n\n[relay]\nfetch_back = false\n'
    )
    fleeter.write_tasks("""
        [[task]]
        name = "api"
        cwd = "repo"
        prompt = "Write API.txt."
        git_ref = "main"
        peer = "mini"

        [[task]]
        name = "lonely"
        cwd = "repo"
        prompt = "Write LONELY.txt."
        git_ref = "main"
        peer = "mini"

        [[task]]
        name = "client"
        cwd = "repo"
        prompt = "Use the API."
        git_ref = "main"
        peer = "local"
        pr = false
        depends_on = ["api"]
    """)
    fake_claude.script(
        **{
            "api": [{"actions": [["write", "API.txt", "GET /things\n"], ["commit", "add api"]]}],
            "lonely": [{"actions": [["write", "LONELY.txt", "alone\n"], ["commit", "add lonely"]]}],
            "client": [{"actions": [["write", "C.txt", "c\n"], ["commit", "client"]]}],
        }
    )
    r = fleeter.run("tasks.toml", plugins=[fleetrun_github])
    assert r.ret == 0, r.stdout + r.stderr
    api, lonely = fleeter.task("api"), fleeter.task("lonely")
    assert (api.host, lonely.host) == ("mini", "mini")
    # api came back (it has a dependent) and was pushed from here: the peer's commit
    assert git(remote, "rev-parse", api.branch) == git(mini.clone, "rev-parse", api.branch)
    (dep,) = fake_claude.calls("client")
    assert "Its pull request: https://github.com/acme/widgets/pull/1" in dep["prompt"]
    # lonely's branch is on the peer only: nothing pushed, and the note says why
    notes = [n for _, n in fleeter.ledger().notes(lonely.id) if n.startswith("github:")]
    assert notes == [
        f"github: no pull request: branch {lonely.branch} is not in {git(repo, 'rev-parse', '--show-toplevel')} "
        "(it ran on mini and its branch was not fetched back); nothing was pushed"
    ]
    assert lonely.branch not in git(remote, "branch", "--list")

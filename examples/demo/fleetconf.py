"""The demo's fleetconf.py: make the sandbox repository the tasks run in.

A fleetconf.py can implement any hook; this one only prepares the example.
"""

import os
import subprocess
from pathlib import Path

SANDBOX = Path(__file__).with_name("sandbox")


def _git(*args):
    env = dict(
        os.environ,
        GIT_AUTHOR_NAME="demo",
        GIT_AUTHOR_EMAIL="demo@example.invalid",
        GIT_COMMITTER_NAME="demo",
        GIT_COMMITTER_EMAIL="demo@example.invalid",
    )
    subprocess.run(
        ["git", "-C", str(SANDBOX), *args], check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def fleetrun_configure(config):
    if (SANDBOX / ".git").exists():
        return
    SANDBOX.mkdir(exist_ok=True)
    _git("init", "-q")
    _git("symbolic-ref", "HEAD", "refs/heads/main")
    (SANDBOX / "README.md").write_text("A sandbox repository for the fleetrun demo.\n")
    _git("add", "README.md")
    _git("commit", "-q", "-m", "initial commit")

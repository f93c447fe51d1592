"""The baseline example's fleetconf.py: make the sandbox repository, whose main has a
test that already fails."""

import os
import subprocess
from pathlib import Path

SANDBOX = Path(__file__).with_name("sandbox")
FILES = {
    "calc.py": "def add(a, b):\n    return a + b\n",
    "tests/test_calc.py": (
        "from calc import add\n\n\n"
        "def test_add():\n    assert add(2, 3) == 5\n\n\n"
        "def test_old():\n    assert add(1, 1) == 3, 'broken on main before anyone touched it'\n"
    ),
    ".gitignore": "report.xml\n__pycache__/\n",
}


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
    for rel, text in FILES.items():
        (SANDBOX / rel).parent.mkdir(parents=True, exist_ok=True)
        (SANDBOX / rel).write_text(text)
    _git("add", "-A")
    _git("commit", "-q", "-m", "initial commit, one test already failing")

"""The ``gh`` stand-in the tests write next to their repositories: a small program
that honours the two commands the plugin runs, records every call, and answers as gh
does.

- ``gh pr list --head BRANCH --json url``: ``[{"url": ...}]`` for a pull request it
  opened for BRANCH, ``[]`` when none;
- ``gh pr create --head BRANCH ... --body-file -``: reads the body on stdin, checks
  the branch is on the remote (``git ls-remote``: gh refuses a head the remote lacks,
  ``Head ref must be a branch``) and prints the new pull request's URL; for a branch
  that has one, gh's own error (``a pull request for branch ... already exists:``);
- a branch whose name holds ``signed-out``: gh's error when it has no credential, on
  stderr, exit code 4; ``junk``: an HTML page on stdout, exit code 0 (a proxy's
  answer), which names ``$GH_TOKEN`` (a note must never show it).

Each call is a JSON line in ``calls.jsonl`` beside it: argv, stdin, cwd and whether
``GH_TOKEN`` reached it (never its value).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

SOURCE = r"""#!{python}
import json, os, subprocess, sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
argv = sys.argv[1:]
stdin = sys.stdin.read() if "--body-file" in argv else None
with open(HERE / "calls.jsonl", "a") as f:
    f.write(json.dumps({{"argv": argv, "stdin": stdin, "cwd": os.getcwd(),
                        "gh_token": bool(os.environ.get("GH_TOKEN"))}}) + "\n")
prs_file = HERE / "prs.json"
prs = json.loads(prs_file.read_text()) if prs_file.exists() else {{}}
head = argv[argv.index("--head") + 1] if "--head" in argv else ""
if "signed-out" in head:
    sys.stderr.write("To get started with GitHub CLI, please run:  gh auth login\n"
                     "Alternatively, populate the GH_TOKEN environment variable with a GitHub API "
                     "authentication token.\n")
    sys.exit(4)
if "junk" in head:
    print("<html><body>Something went wrong (token " + os.environ.get("GH_TOKEN", "") + ")</body></html>")
    sys.exit(0)
if argv[:2] == ["pr", "list"]:
    print(json.dumps([{{"url": prs[head]}}] if head in prs else []))
    sys.exit(0)
if argv[:2] == ["pr", "create"]:
    base = argv[argv.index("--base") + 1] if "--base" in argv else "main"
    if head in prs:
        sys.stderr.write(f'a pull request for branch "{{head}}" into branch "{{base}}" already exists:\n'
                         f"{{prs[head]}}\n")
        sys.exit(1)
    there = subprocess.run(["git", "ls-remote", "origin", f"refs/heads/{{head}}"], capture_output=True, text=True)
    if not there.stdout.strip():
        sys.stderr.write("pull request create failed: GraphQL: Head ref must be a branch (createPullRequest)\n")
        sys.exit(1)
    prs[head] = f"https://github.com/acme/widgets/pull/{{len(prs) + 1}}"
    prs_file.write_text(json.dumps(prs))
    print(prs[head])
    sys.exit(0)
sys.stderr.write(f"unknown command {{argv!r}} for gh\n")
sys.exit(1)
"""


def write_gh(folder: Path) -> Path:
    """Write the stand-in as ``folder/gh`` (executable) and return its path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "gh"
    path.write_text(SOURCE.format(python=sys.executable))
    os.chmod(path, 0o755)
    return path

"""``host bundle``, the peer's side of fetch-back: a header line
(``{"fleetrun_bundle": 1, "tip": ..., "fork": ..., "bundle": true}``) followed by a git
bundle of the branch (what the supervisor lacks of it), which the supervisor
unbundles into its own repository (:mod:`fleetrun.plugins.relay.bundle`).
"""

from __future__ import annotations

import json
import os
import re
import sys
from typing import TYPE_CHECKING, Any, Optional, TextIO

from ....gitutil import git_argv, git_env
from ..protocol import BUNDLE_MARK, MAX_HAVES
from .request import HostError, _payload, _prepared_all

if TYPE_CHECKING:
    from .request import HasHome

_SHA = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")


def _git(repo: str, *args: str, stdin: Optional[str] = None) -> tuple[int, str, str]:
    import subprocess

    proc = subprocess.run(
        git_argv(repo, *args), input=(stdin or "").encode(), capture_output=True, env=git_env(), timeout=300
    )
    return proc.returncode, proc.stdout.decode("utf-8", "replace").strip(), proc.stderr.decode("utf-8", "replace")


def bundle_plan(repo: str, branch: str, git_ref: Optional[str], have: list[str]) -> dict[str, Any]:
    """What ``bundle`` sends: the branch's tip, where it left ``git_ref`` (``fork``: the
    merge base, an ancestor of the tip, so the supervisor has it once it has the tip),
    which of the supervisor's commits ``have`` are here too, and whether a bundle is
    needed at all (not when the tip is one of them or below one of them)."""
    if not os.path.isdir(repo):
        raise HostError(f"{repo} does not exist on this host")
    code, tip, err = _git(
        repo, "rev-parse", "--verify", "--quiet", "--end-of-options", f"refs/heads/{branch}^{{commit}}"
    )
    if code != 0 or not _SHA.match(tip):
        raise HostError(f"there is no branch {branch} in {repo} on this host")
    fork = None
    if git_ref:
        code, out, _ = _git(repo, "merge-base", "--end-of-options", git_ref, tip)
        fork = out if code == 0 and _SHA.match(out) else None
    have = [h for h in have if isinstance(h, str) and _SHA.match(h)][:MAX_HAVES]
    here: list[str] = []
    if have:
        _, out, _ = _git(
            repo,
            "cat-file",
            "--batch-check=%(objectname) %(objecttype)",
            stdin="".join(f"{h}^{{commit}}\n" for h in have),
        )
        known = {line.split()[0] for line in out.splitlines() if line.endswith(" commit")}
        here = [h for h in have if h in known]
    covered = tip in here or any(_git(repo, "merge-base", "--is-ancestor", tip, h)[0] == 0 for h in here)
    return {BUNDLE_MARK: 1, "tip": tip, "fork": fork, "have": here, "bundle": not covered}


def cmd_bundle(config: HasHome, out: TextIO) -> int:
    """``host bundle``: stdin ``{"repo", "branch", "git_ref", "have": [commits]}``;
    stdout one header line (:func:`bundle_plan`), then, if it says ``"bundle": true``,
    ``git bundle create - refs/heads/BRANCH ^HAVE...``: the branch, less what the
    supervisor has. An error before the header is the usual JSON error; after it, a
    message on stderr and a non-zero exit."""
    import subprocess

    p = _payload()
    repo, branch = p.get("repo"), p.get("branch")
    if not isinstance(repo, str) or not isinstance(branch, str) or not repo or not branch or branch.startswith("-"):
        raise HostError("bundle needs a repo and a branch")
    # only a branch of a repository this peer made a worktree in for a task
    if not any(r.get("repo") == repo and r.get("branch") == branch for r in _prepared_all(config.home).values()):
        raise HostError(f"no task prepared on this host has branch {branch} in {repo}")
    plan = bundle_plan(repo, branch, p.get("git_ref") or None, list(p.get("have") or []))
    try:
        fd = out.fileno()
    except (AttributeError, OSError, ValueError):
        raise HostError("bundle writes to a real stdout") from None
    out.write(json.dumps(plan) + "\n")
    out.flush()
    if not plan["bundle"]:
        return 0
    proc = subprocess.run(
        git_argv(repo, "bundle", "create", "-", f"refs/heads/{branch}", *(f"^{h}" for h in plan["have"])),
        stdin=subprocess.DEVNULL,
        stdout=fd,
        stderr=subprocess.PIPE,
        env=git_env(),
    )
    if proc.returncode != 0:
        sys.stderr.write(
            f"git bundle create failed (exit {proc.returncode}): "
            f"{proc.stderr.decode('utf-8', 'replace').strip()[-500:]}\n"
        )
        return 1
    return 0

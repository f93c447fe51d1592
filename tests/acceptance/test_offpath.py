"""Local effects off the loop's critical path (issue 16): a new worktree is added, and a
DONE task's clean worktree removed, on a worker of :mod:`fleetrun.effects` while the
loop handles other tasks; two adds or removes in one repository never overlap.

No timing is asserted: a ``git`` wrapper on PATH holds the slow repository's
``worktree add`` until another task's verifier has run (a file it touches), and its
``worktree remove`` until a third task's verifier has. With either effect on the loop's
thread, that verifier could never run while git waits: the wrapper gives up (its log
says ``timed out``) and the order the test asserts is not the one seen.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

WRAPPER = '''#!/bin/sh
# the repository "slow": worktree add waits for $FLAGS/add.go, remove for $FLAGS/rm.go
case "$*" in
  *"/slow worktree add"*) f="{flags}/add.go" ;;
  *"/slow worktree remove"*) f="{flags}/rm.go" ;;
  *"/fast worktree "*)
    # one add or remove at a time in one repository, or the log says so
    mkdir "{flags}/busy" 2>/dev/null || echo overlap >> "{flags}/log"
    sleep 0.05
    "{git}" "$@"; code=$?
    rmdir "{flags}/busy" 2>/dev/null
    exit $code ;;
  *) exec "{git}" "$@" ;;
esac
i=0
while [ ! -e "$f" ] && [ $i -lt 300 ]; do sleep 0.05; i=$((i+1)); done
if [ -e "$f" ]; then echo "$(basename "$f") released" >> "{flags}/log"; else echo "$(basename "$f") timed out" >> "{flags}/log"; fi
exec "{git}" "$@"
'''

AGENT = ("echo x > f.txt && git add f.txt && "
         "git -c user.name=t -c user.email=t@example.invalid commit -q -m work")


def task(name: str, repo: str, verify: str, extra: str = "") -> str:
    return f'''
[[task]]
name = "{name}"
cwd = "{repo}"
prompt = "p"
agent = "sh"
git_ref = "main"
{extra}
  [[task.verify]]
  run = {json.dumps(verify)}
'''


def test_worktree_add_and_remove_do_not_block_other_tasks(fleeter, monkeypatch):
    fleeter.make_repo("slow")
    fleeter.make_repo("fast")
    flags = fleeter.path / "flags"
    flags.mkdir()
    bindir = fleeter.path / "bin"
    bindir.mkdir()
    real = shutil.which("git")
    assert real
    wrapper = bindir / "git"
    wrapper.write_text(WRAPPER.format(flags=flags, git=real))
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{Path(real).parent}:/usr/bin:/bin")
    fleeter.write_tasks(f'[agents.sh]\ncommand = ["/bin/sh", "-c", {json.dumps(AGENT)}]\n'
                        + task("s", "slow", "true")
                        + task("f1", "fast", f"touch {flags}/add.go")
                        + task("f2", "fast", "true")
                        + task("g", "fast", f"touch {flags}/rm.go", 'depends_on = ["s"]'))
    r = fleeter.run("tasks.toml", "--max-tasks", "4")
    assert r.ret == 0, r.stdout + r.stderr
    log = (flags / "log").read_text().split("\n")
    # s's add waited for f1's verifier, s's removal for g's (which could start only once s was DONE)
    assert [ln for ln in log if ln] == ["add.go released", "rm.go released"], log
    assert fleeter.states() == {"s": "DONE", "f1": "DONE", "f2": "DONE", "g": "DONE"}
    led = fleeter.ledger()
    for name in ("s", "f1", "f2", "g"):
        t = fleeter.task(name)
        assert not Path(t.worktree).exists(), name
        notes = [text for _, text in led.notes(t.id)]
        assert any(n.startswith(f"removed clean worktree {t.worktree}") for n in notes), (name, notes)
        assert "f.txt" in fleeter.git(fleeter.path / ("slow" if name == "s" else "fast"), "ls-tree", "-r",
                                      "--name-only", t.branch)

"""Issue 10 item 6: no file fleetrun writes holds a secret, and every home is private.

Three runs, each with known secret values in the environment (``ANTHROPIC_API_KEY``,
the brain's API key, a random ``FOO_TOKEN``): on this machine (the fake claude and a
``run`` verifier, plus an ``agent`` reviewer), with an OpenAI-style brain that needs
its key, and on a peer over real SSH. Afterwards every byte of every file in every
home (the supervisor's and the peer's: the ledger, its WAL, attempt logs, status and
spec files, events, worktrees), and a dump of the ledger (``iterdump``), is searched
for each secret: zero hits. And every home is walked: folders 0700, files 0600.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import sqlite3
import stat
from pathlib import Path
from typing import Any

import pytest
from brainserver import BrainServer

pytest_plugins = ["sshd"]


@pytest.fixture
def secret_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Fresh secret values, set in this process's environment (the supervisor's)."""
    values = {
        "ANTHROPIC_API_KEY": "sk-secret-" + secrets.token_hex(16),
        "FLEETRUN_TEST_BRAIN_KEY": "brain-secret-" + secrets.token_hex(16),
        "FOO_TOKEN": "foo-secret-" + secrets.token_hex(16),
    }
    for k, v in values.items():
        monkeypatch.setenv(k, v)
    return values


def private(*paths: Path) -> None:
    """What the test itself wrote into a home (the fixtures' config.toml), made private as
    a careful user would: the walk below is about what fleetrun writes."""
    for p in paths:
        if p.exists():
            os.chmod(p, 0o700 if p.is_dir() else 0o600)


def leaks(roots: list[Path], values: dict[str, str]) -> list[str]:
    """``path: NAME`` for every file under ``roots`` (links not followed) that holds a
    secret value, in its bytes or its name."""
    found = []
    needles = {k: v.encode() for k, v in values.items()}
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
            for name in dirnames + filenames:
                path = Path(dirpath) / name
                for k, v in values.items():
                    if v in name:
                        found.append(f"{path} (name): {k}")
                if name in dirnames or path.is_symlink() or not path.is_file():
                    continue
                data = path.read_bytes()
                found += [f"{path}: {k}" for k, v in needles.items() if v in data]
    return found


def ledger_leaks(home: Path, values: dict[str, str]) -> list[str]:
    db = home / "state.db"
    if not db.exists():
        return []
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        dump = "\n".join(conn.iterdump())
    finally:
        conn.close()
    assert "CREATE TABLE" in dump
    return [f"ledger dump: {k}" for k, v in values.items() if v in dump]


def not_private(home: Path) -> list[str]:
    """Every folder in the home 0700, every file 0600. A worktree's own files are the
    repository's checkout (git gives them the modes it tracks); they are out of reach
    because ``worktrees/`` itself is 0700."""
    bad = []
    worktrees = home / "worktrees"
    for dirpath, dirnames, filenames in os.walk(home, followlinks=False):
        d = Path(dirpath)
        if d != worktrees and worktrees in d.parents:
            dirnames[:] = []
            continue
        mode = stat.S_IMODE(d.lstat().st_mode)
        if mode != 0o700:
            bad.append(f"{d}/ is {mode:o}")
        for name in filenames:
            p = d / name
            st = p.lstat()
            if stat.S_ISLNK(st.st_mode):
                continue
            if stat.S_IMODE(st.st_mode) != 0o600:
                bad.append(f"{p} is {stat.S_IMODE(st.st_mode):o}")
    return bad


def check_home(home: Path, values: dict[str, str], extra: tuple[Path, ...] = ()) -> None:
    assert home.is_dir()
    hits = leaks([home, *extra], values) + ledger_leaks(home, values)
    assert hits == [], "\n".join(hits)
    bad = not_private(home)
    assert bad == [], "\n".join(bad)


# --------------------------------------------------------------------------- this machine


def test_a_local_run_writes_no_secret_and_keeps_its_home_private(fleeter, fake_claude, secret_env):
    fleeter.make_repo()
    private(fleeter.home, fleeter.home / "config.toml")
    fleeter.write_tasks("""
        [[task]]
        name = "greet"
        cwd = "repo"
        prompt = "Write hello.txt saying hello."
        git_ref = "main"

          [[task.verify]]
          run = "test -n \\"$FOO_TOKEN\\" && test -n \\"$ANTHROPIC_API_KEY\\" && test -f hello.txt"

          [[task.verify]]
          agent = "Check that hello.txt says hello."
    """)
    fake_claude.script(
        **{
            "greet": [
                {
                    "actions": [
                        ["write", "hello.txt", "hello\n"],
                        # the agent has the key it needs (it is in its environment)
                        ["bash", 'test -n "$ANTHROPIC_API_KEY"'],
                        ["commit", "add hello"],
                    ]
                }
            ],
            "greet:review": [{"result": "PASS"}],
        }
    )
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    assert secret_env["FOO_TOKEN"] not in r.stdout + r.stderr
    (v1, v2) = fleeter.ledger().verdicts(task_id=fleeter.task("greet").id)
    assert v1.passed and v2.passed  # the verifier saw the secrets in its environment
    assert fleeter.run("logs", "greet").ret == 0
    check_home(fleeter.home, secret_env)


# --------------------------------------------------------------------------- a brain


def test_a_brain_run_writes_no_secret_and_keeps_its_home_private(fleeter, fake_claude, secret_env):
    with BrainServer() as brain:
        brain.script("PASS\nhello.txt greets.")
        fleeter.make_repo()
        fleeter.write_config(
            (fleeter.home / "config.toml").read_text()
            + f'\n[brain]\nurl = "{brain.url}"\nmodel = "tiny"\napi = "openai"\n'
            'api_key_env = "FLEETRUN_TEST_BRAIN_KEY"\n'
        )
        private(fleeter.home, fleeter.home / "config.toml")
        fleeter.write_tasks("""
            [[task]]
            name = "greet"
            cwd = "repo"
            prompt = "Write hello.txt saying hello."
            git_ref = "main"

              [[task.verify]]
              brain = "Does hello.txt greet?"
        """)
        fake_claude.script(greet=[{"actions": [["write", "hello.txt", "hello\n"], ["commit", "add hello"]]}])
        r = fleeter.run("tasks.toml")
        assert r.ret == 0, r.stdout + r.stderr
        (req,) = brain.requests
        # the key really was used: it went to the server, and only there
        headers = {k.lower(): v for k, v in req.headers.items()}
        assert headers.get("authorization") == f"Bearer {secret_env['FLEETRUN_TEST_BRAIN_KEY']}"
    check_home(fleeter.home, secret_env)


# --------------------------------------------------------------------------- a peer


def peer_run(fleeter: Any, fake_claude: Any, peer_lab: Any, secret_env: dict[str, str]) -> Any:
    fleeter.make_repo()
    mini = peer_lab.machine("mini")
    mini.write("config.toml", (fleeter.home / "config.toml").read_text())
    # The peer's own environment holds the secrets, set by a wrapper outside its home,
    # so that neither peers.toml nor the command line carries them.
    wrapper = peer_lab.root / "mini-env.sh"
    wrapper.write_text("#!/bin/sh\n" + "".join(f"export {k}='{v}'\n" for k, v in secret_env.items()) + 'exec "$@"\n')
    wrapper.chmod(0o700)
    command = shlex.join([str(wrapper), *mini.command()])
    r = fleeter.run("relay", "add", mini.name, mini.address, "--accept-new", "--command", command)
    assert r.ret == 0, r.stdout + r.stderr
    assert fleeter.run("drain").ret == 0
    private(fleeter.home, fleeter.home / "config.toml", mini.home, mini.home / "config.toml")
    fleeter.write_tasks("""
        [[task]]
        name = "remote"
        cwd = "repo"
        prompt = "Write REMOTE.txt."
        git_ref = "main"
        peer = "mini"

          [[task.verify]]
          run = "test -n \\"$FOO_TOKEN\\" && test -f REMOTE.txt"
    """)
    fake_claude.script(
        remote=[
            {"actions": [["write", "REMOTE.txt", "x"], ["bash", 'test -n "$ANTHROPIC_API_KEY"'], ["commit", "remote"]]}
        ]
    )
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    task = fleeter.task("remote")
    assert task.host == "mini"
    (v,) = fleeter.ledger().verdicts(task_id=task.id)
    assert v.passed and v.host == "mini"  # the peer's verifier saw the peer's secrets
    return mini


def test_a_peer_run_keeps_both_homes_private_and_no_secret_comes_back(fleeter, fake_claude, secret_env, peer_lab):
    mini = peer_run(fleeter, fake_claude, peer_lab, secret_env)
    assert not_private(mini.home) == []
    check_home(fleeter.home, secret_env)


def test_a_peer_run_leaves_no_secret_in_the_peer_home(fleeter, fake_claude, secret_env, peer_lab):
    mini = peer_run(fleeter, fake_claude, peer_lab, secret_env)
    hits = leaks([mini.home], secret_env) + ledger_leaks(mini.home, secret_env)
    assert hits == [], "\n".join(hits)


def test_the_scan_finds_what_it_looks_for(tmp_path):
    """The scanner itself: a secret in a file, in a name, or in the ledger is found, and
    a 0644 file or a 0755 folder is reported."""
    home = tmp_path / "home"
    (home / "attempts" / "a1").mkdir(parents=True, mode=0o700)
    os.chmod(home, 0o700)
    os.chmod(home / "attempts", 0o755)
    values = {"K": "sk-secret-xyz"}
    (home / "attempts" / "a1" / "spec.json").write_text(json.dumps({"env": {"K": "sk-secret-xyz"}}))
    (home / "attempts" / "a1" / "sk-secret-xyz").write_text("")
    conn = sqlite3.connect(home / "state.db")
    conn.execute("CREATE TABLE t (v TEXT)")
    conn.execute("INSERT INTO t VALUES ('sk-secret-xyz')")
    conn.commit()
    conn.close()
    hits: Any = leaks([home], values)
    assert any(h.endswith("spec.json: K") for h in hits) and any("(name)" in h for h in hits)
    assert ledger_leaks(home, values) == ["ledger dump: K"]
    bad = not_private(home)
    assert any(b.endswith("attempts/ is 755") for b in bad) and any("spec.json is 644" in b for b in bad)

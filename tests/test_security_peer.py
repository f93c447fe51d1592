"""A peer does not trust the ids, paths and pids a supervisor sends it, and keeps no
secret of its environment in its home (issue 10, items 3, 6 and 8); run as sshd runs
it: ``fleetrun host VERB --json`` as a subprocess with the request on stdin."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

import pytest

TID = "task_m0abc123def_0"
AID = f"{TID}_a1"
GIT_ID = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=dict(os.environ, **GIT_ID)
    ).stdout


def make_repo(path: Path, files: Optional[dict[str, str]] = None) -> Path:
    path.mkdir(parents=True)
    git(path, "init", "-q")
    git(path, "symbolic-ref", "HEAD", "refs/heads/main")
    for rel, text in (files or {"README.md": "hello\n"}).items():
        (path / rel).write_text(text)
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "initial")
    return path


class Peer:
    def __init__(self, home: Path) -> None:
        self.home = home
        self.env = {"FLEETRUN_HOME": str(home), "FLEETRUN_DISABLE_PLUGIN_AUTOLOAD": "1"}

    def host(self, *args: str, stdin: Any = None, env: Optional[dict[str, str]] = None) -> tuple[int, dict]:
        proc = subprocess.run(
            [sys.executable, "-m", "fleetrun", "host", *args, "--json"],
            input=json.dumps(stdin).encode() if stdin is not None else b"",
            capture_output=True,
            env=dict(os.environ, **self.env, **(env or {})),
            timeout=60,
        )
        lines = proc.stdout.decode().strip().splitlines()
        assert len(lines) == 1, proc.stdout.decode() + proc.stderr.decode()
        reply = json.loads(lines[0])
        assert "traceback" not in reply, reply["traceback"]
        return proc.returncode, reply


@pytest.fixture
def peer(tmp_path):
    home = tmp_path / "peerhome"
    home.mkdir(mode=0o700)
    yield Peer(home)
    from sshd import kill_leftovers

    kill_leftovers(home)


def task(
    cwd: Path,
    tid: str = TID,
    state: str = "ASSIGNED",
    git_ref: Optional[str] = "main",
    branch: Optional[str] = None,
    **extra: Any,
) -> dict[str, Any]:
    spec = {"name": "fix", "prompt": "p", "cwd": str(cwd)}
    if git_ref:
        spec["git_ref"] = git_ref
    if branch:
        spec["branch"] = branch
    return {
        "id": tid,
        "name": "fix",
        "state": state,
        "source": "",
        "queue_id": "q",
        "created": 0,
        "updated": 0,
        "spec": spec,
        **extra,
    }


def attempt(tid: str = TID, n: int = 1) -> dict[str, Any]:
    return {
        "id": f"{tid}_a{n}",
        "task_id": tid,
        "number": n,
        "kind": "fresh",
        "host": "mini",
        "state": "leased",
        "created": 0,
    }


def prepare(peer: Peer, repo: Path) -> dict[str, Any]:
    code, r = peer.host("prepare", stdin={"task": task(repo), "attempt": attempt()})
    assert code == 0, r
    return dict(r["workspace"])


# -- item 3: ids ------------------------------------------------------------------


def test_prepare_refuses_a_task_id_that_leaves_the_home(peer, tmp_path):
    repo = make_repo(tmp_path / "repo")
    evil = "../../../../outside/escaped"
    code, r = peer.host("prepare", stdin={"task": task(repo, tid=evil, branch="escaped"), "attempt": attempt(evil)})
    assert code == 1 and "bad task id" in r["error"], r
    assert not (tmp_path / "outside").exists()
    assert not list(tmp_path.rglob("*escaped*"))
    assert git(repo, "worktree", "list").count("\n") == 1  # no worktree was added anywhere


def test_prepare_refuses_an_attempt_of_another_task(peer, tmp_path):
    repo = make_repo(tmp_path / "repo")
    code, r = peer.host("prepare", stdin={"task": task(repo), "attempt": attempt("task_m0abc123def_7")})
    assert code == 1 and "not an attempt of" in r["error"], r


def test_log_and_status_refuse_an_attempt_id_outside_the_home(peer, tmp_path):
    outside = tmp_path / "outside" / "x"
    outside.mkdir(parents=True)
    (outside / "log").write_text("the user's secret file\n")
    (outside / "status.json").write_text('{"state": "ended", "exit_code": 0}')
    code, r = peer.host("log", "--attempt", "../../outside/x")
    assert code == 1 and "bad attempt id" in r["error"], r
    code, r = peer.host("status", "--attempt", "../../outside/x", "--log-offset", "0")
    assert code == 1 and "bad attempt id" in r["error"], r
    code, r = peer.host("stop", "--attempt", "../../outside/x")
    assert code == 1 and "bad attempt id" in r["error"], r
    assert not (outside / "cancel").exists()


# -- item 3: paths ------------------------------------------------------------------


def test_cleanup_removes_no_worktree_this_peer_did_not_prepare(peer, tmp_path):
    user = make_repo(tmp_path / "user", {"README.md": "hi\n", ".gitignore": ".env\n"})
    linked = tmp_path / "user-linked"
    git(user, "worktree", "add", "-q", "-b", "feature", str(linked), "main")
    (linked / ".env").write_text("API_KEY=the user's\n")
    request = {"task": task(user, state="DONE", worktree=str(linked))}
    code, r = peer.host("cleanup", stdin=request)
    assert code == 1 and "no workspace was prepared on this host" in r["error"], r
    assert (linked / ".env").read_text() == "API_KEY=the user's\n"
    # and for a task it did prepare, the request's worktree is not the one it removes
    ws = prepare(peer, user)
    code, r = peer.host("cleanup", stdin=request)
    assert code == 0 and r == {"worktree": ws["root"], "removed": True}, r
    assert (linked / ".env").exists() and not os.path.exists(ws["root"])


def test_collect_commits_only_in_the_worktree_it_prepared(peer, tmp_path):
    repo = make_repo(tmp_path / "repo")
    other = make_repo(tmp_path / "other")
    (other / "README.md").write_text("the user's work in progress\n")
    before = git(other, "rev-parse", "HEAD")
    foreign = {
        "path": str(other),
        "root": str(other),
        "repo": str(other),
        "branch": "main",
        "is_worktree": True,
        "base_ref": "main",
    }
    request = {"task": task(repo), "attempt": attempt(), "workspace": foreign}
    code, r = peer.host("collect", stdin=request)
    assert code == 1 and "no workspace was prepared on this host" in r["error"], r
    ws = prepare(peer, repo)
    Path(ws["path"], "work.txt").write_text("the agent's\n")
    code, r = peer.host("collect", stdin=request)
    assert code == 0 and r["commit"], r
    assert git(other, "rev-parse", "HEAD") == before and "M README.md" in git(other, "status", "--short")
    assert git(Path(ws["path"]), "log", "-1", "--format=%H").strip() == r["commit"]


def test_collect_and_cleanup_refuse_a_tampered_worktree(peer, tmp_path):
    repo = make_repo(tmp_path / "repo")
    other = make_repo(tmp_path / "other", {"keep.txt": "tracked\n"})
    before = git(other, "rev-parse", "HEAD")
    ws = prepare(peer, repo)
    wt = Path(ws["root"])
    (wt / ".git").write_text(f"gitdir: {other / '.git'}\n")  # what a hostile agent can do
    (wt / "EVIL.txt").write_text("evil\n")
    code, r = peer.host("collect", stdin={"task": task(repo), "attempt": attempt(), "workspace": ws})
    assert code == 1 and r["error"].startswith("worktree_tampered: "), r
    assert git(other, "rev-parse", "HEAD") == before and (other / "keep.txt").exists()
    code, r = peer.host("cleanup", stdin={"task": task(repo, state="DONE")})
    assert code == 1 and r["error"].startswith("worktree_tampered: "), r
    assert wt.exists()


def test_collect_refuses_an_embedded_repository_and_runs_nothing_it_names(peer, tmp_path):
    # the agent leaves sub/.git as plain files: a HEAD, the repository's objects, and a
    # core.fsmonitor command; committed as a gitlink, every later git status would run it
    repo = make_repo(tmp_path / "repo")
    marker = tmp_path / "marker"
    ws = prepare(peer, repo)
    wt = Path(ws["root"])
    sub = wt / "sub" / ".git"
    (sub / "objects" / "info").mkdir(parents=True)
    (sub / "refs").mkdir()
    (sub / "HEAD").write_text(git(repo, "rev-parse", "main"))
    (sub / "objects" / "info" / "alternates").write_text(f"{repo / '.git' / 'objects'}\n")
    (sub / "config").write_text(
        f'[core]\n\trepositoryformatversion = 0\n\tfsmonitor = "echo ran $FLEETRUN_TEST_SECRET >> {marker}; false"\n'
    )
    (wt / "work.txt").write_text("the agent's\n")
    secret = {"FLEETRUN_TEST_SECRET": "the peer's secret"}
    code, r = peer.host("collect", stdin={"task": task(repo), "attempt": attempt(), "workspace": ws}, env=secret)
    assert code == 1 and r["error"] == "worktree_tampered: embedded repository sub/", r
    assert git(repo, "rev-parse", ws["branch"]) == git(repo, "rev-parse", "main")  # nothing committed
    code, r = peer.host("cleanup", stdin={"task": task(repo, state="DONE")}, env=secret)
    assert code == 0 and r["removed"] is False, r  # dirty: kept
    assert not marker.exists(), marker.read_text()


def test_verify_start_runs_in_the_worktree_it_prepared(peer, tmp_path):
    repo = make_repo(tmp_path / "repo")
    ws = prepare(peer, repo)
    elsewhere = dict(ws, path=str(tmp_path))
    v = {"kind": "run", "text": "pwd", "timeout_s": 60}
    code, r = peer.host(
        "verify-start",
        stdin={"task": task(repo), "attempt": attempt(), "verifier": v, "idx": 0, "workspace": elsewhere},
    )
    assert code == 0, r
    out = wait_verifier(peer, AID, 0)
    assert out["output"].strip() == os.path.realpath(ws["path"]) or out["output"].strip() == ws["path"]


def test_bundle_sends_only_a_branch_it_prepared(peer, tmp_path):
    user = make_repo(tmp_path / "user")
    git(user, "branch", "private")
    code, r = peer.host("bundle", stdin={"repo": str(user), "branch": "private", "have": []})
    assert code == 1 and "no task prepared on this host" in r["error"], r


# -- item 3: pids -------------------------------------------------------------------


def test_stop_signals_no_process_this_peer_did_not_start(peer):
    victim = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        code, r = peer.host("stop", "--attempt", AID, "--pid", str(victim.pid))
        assert code == 0 and r["signalled"] is False, r
        time.sleep(0.3)
        assert victim.poll() is None, "an unrelated process was signalled"
        code, r = peer.host("stop", "--attempt", AID, "--pid", str(victim.pid), "--token", "forged")
        assert r["signalled"] is False and victim.poll() is None
        # its status is not "running" either because some pid is alive
        code, r = peer.host("status", "--attempt", AID, "--pid", str(victim.pid))
        assert code == 0 and r["status"]["state"] == "died", r
    finally:
        victim.kill()
        victim.wait()


def test_stop_still_stops_its_own_shepherd(peer):
    spec = {"argv": ["sleep", "30"], "cwd": "/", "env": {}, "timeout_s": 60, "stall_s": 60}
    code, r = peer.host("start", stdin={"attempt_id": AID, "task_id": TID, "spec": spec, "prompt": "p"})
    assert code == 0, r
    code, s = peer.host("stop", "--attempt", AID, "--pid", str(r["pid"]), "--token", r["token"])
    assert code == 0 and s["signalled"] is True, s


def test_start_refuses_bad_ids(peer):
    spec = {"argv": ["true"], "cwd": "/", "env": {}, "timeout_s": 60, "stall_s": 60}
    code, r = peer.host("start", stdin={"attempt_id": "../../x", "task_id": TID, "spec": spec})
    assert code == 1 and "bad attempt id" in r["error"]
    code, r = peer.host("start", stdin={"attempt_id": "task_zz_1_a1", "task_id": TID, "spec": spec})
    assert code == 1 and "not an attempt of" in r["error"]
    assert not (peer.home.parent / "x").exists()


# -- item 6: no environment in any file ---------------------------------------------


def wait_verifier(peer: Peer, aid: str, idx: int) -> dict[str, Any]:
    deadline = time.time() + 120
    while time.time() < deadline:
        code, r = peer.host("verify-status", "--attempt", aid, "--idx", str(idx))
        assert code == 0, r
        if r["state"] == "ended":
            return r
        time.sleep(0.1)
    raise AssertionError("the verifier did not end")


def test_a_peer_run_verifier_writes_no_secret_of_its_environment(peer, tmp_path):
    secret = "sk-ant-peer-secret-4f1e9c"
    peer.env["ANTHROPIC_API_KEY"] = secret
    repo = make_repo(tmp_path / "repo")
    ws = prepare(peer, repo)
    # the verifier sees it (its length is printed, not the key: the command itself is stored)
    v = {"kind": "run", "text": 'echo "${#ANTHROPIC_API_KEY}"', "timeout_s": 60}
    code, r = peer.host(
        "verify-start", stdin={"task": task(repo), "attempt": attempt(), "verifier": v, "idx": 0, "workspace": ws}
    )
    assert code == 0, r
    out = wait_verifier(peer, AID, 0)
    assert out["passed"] is True and out["output"] == f"{len(secret)}\n", out
    spec = json.loads((peer.home / "attempts" / AID / "verify-1" / "spec.json").read_text())
    assert set(spec["env"]) == {"FLEETRUN_TASK_ID", "FLEETRUN_TASK_NAME", "FLEETRUN_ATTEMPT", "FLEETRUN_WORKTREE"}
    hits = [
        str(p) for p in peer.home.rglob("*") if p.is_file() and not p.is_symlink() and secret.encode() in p.read_bytes()
    ]
    assert hits == []


# -- item 8: the peer's own configuration --------------------------------------------


def test_probe_with_a_broken_config_toml_is_a_clear_error(peer):
    (peer.home / "config.toml").write_text("[relay\ntags = 1\n")
    code, r = peer.host("probe")
    assert code == 4 and "config.toml:1" in r["error"] and "invalid TOML" in r["error"], r
    assert "internal error" not in r["error"]


def test_probe_refuses_tags_that_are_not_a_list(peer):
    (peer.home / "config.toml").write_text('[relay]\ntags = "gpu"\n')
    code, r = peer.host("probe")
    assert code == 4 and "config.toml:2: relay.tags: expected a list of strings, got a string" in r["error"], r
    (peer.home / "config.toml").write_text('[relay]\ntags = ["gpu", 3]\n')
    code, r = peer.host("probe")
    assert (
        code == 4
        and "config.toml:2: relay.tags: expected a list of strings, got a list holding the number 3" in r["error"]
    ), r


def test_a_malformed_request_is_an_error_not_a_traceback(peer, tmp_path):
    for verb, payload in (
        ("prepare", {}),
        ("prepare", {"task": "x"}),
        ("collect", {"task": {"id": TID}}),
        ("start", {}),
        ("cleanup", {"task": [1]}),
        ("verify-start", {"task": None}),
    ):
        code, r = peer.host(verb, stdin=payload)
        assert code == 1 and r["error"], (verb, r)
    code, r = peer.host("log", "--attempt", AID, "--offset", "-5")
    assert code == 0 and r["log"] == ""


# -- over real SSH: a peer whose fleetrun forges its replies -------------------------
#
# The peer's command runs FORGER instead of fleetrun: it runs the real `fleetrun host
# VERB` and rewrites the reply by the rules in $FORGE_RULES, {verb: {"reply":
# {"dotted.key": value}, "once": bool}}, read on every call (a test changes them).

pytest_plugins = ["sshd"]

FORGER = r"""
import json, os, subprocess, sys

def put(obj, dotted, value):
    keys = dotted.split(".")
    for k in keys[:-1]:
        obj = obj.setdefault(k, {})
    obj[keys[-1]] = value

args = sys.argv[1:]
verb = args[args.index("host") + 1] if "host" in args else None
path = os.environ["FORGE_RULES"]
rules = json.load(open(path)) if os.path.exists(path) else {}
rule = rules.get(verb)
if rule and rule.get("once"):
    del rules[verb]
    json.dump(rules, open(path, "w"))
proc = subprocess.run([sys.executable, "-m", "fleetrun", *args], stdin=sys.stdin, stdout=subprocess.PIPE)
out = proc.stdout
if rule and "reply" in rule:
    lines = out.decode().splitlines()
    reply = json.loads(lines[-1])
    for dotted, value in rule["reply"].items():
        put(reply, dotted, value)
    lines[-1] = json.dumps(reply)
    out = ("\n".join(lines) + "\n").encode()
sys.stdout.buffer.write(out)
sys.stdout.flush()
sys.exit(proc.returncode)
"""


class Forger:
    def __init__(self, folder: Path) -> None:
        self.script = folder / "forge.py"
        self.script.write_text(FORGER)
        self.rules = folder / "rules.json"
        self.rules.write_text("{}")

    def command(self, m: Any) -> list[str]:
        argv = m.command(FORGE_RULES=str(self.rules))
        assert argv[-2:] == ["-m", "fleetrun"]
        return [*argv[:-2], str(self.script)]

    def set(self, **rules: Any) -> None:
        self.rules.write_text(json.dumps({k.replace("_", "-"): v for k, v in rules.items()}))


def add_forged_peer(fleeter: Any, m: Any, forger: Forger) -> Any:
    import shlex

    from fleetrun.plugins.relay.host import SSHHost
    from fleetrun.plugins.relay.peers import load_peers

    m.write(
        "config.toml", (fleeter.home / "config.toml").read_text() if (fleeter.home / "config.toml").exists() else ""
    )
    r = fleeter.run("relay", "add", m.name, m.address, "--accept-new", "--command", shlex.join(forger.command(m)))
    assert r.ret == 0, r.stdout + r.stderr
    return SSHHost(load_peers(fleeter.home)["mini"], fleeter.home)


@pytest.fixture
def forged(fleeter, peer_lab, tmp_path):
    m = peer_lab.machine("mini")
    forger = Forger(tmp_path)
    host = add_forged_peer(fleeter, m, forger)
    m.host, m.forger = host, forger
    yield m
    host.close()


def shepherd_spec(argv: list[str]) -> dict[str, Any]:
    return {"argv": argv, "cwd": "/", "env": {"FLEETRUN_TASK_ID": TID}, "timeout_s": 60, "stall_s": 60}


def wait_state(host: Any, aid: str, states: tuple[str, ...] = ("ended", "died")) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    st: dict[str, Any] = {}
    while time.monotonic() < deadline:
        st = host.status(aid, None, None)
        if st.get("state") in states:
            return st
        time.sleep(0.1)
    raise AssertionError(f"{aid}: {st}")


def test_a_garbled_status_reply_is_an_unreadable_peer_not_an_exception(forged):
    host, forger = forged.host, forged.forger
    info = host.start(AID, shepherd_spec(["sh", "-c", "echo hello; sleep 1"]))
    assert info["pid"]
    for garbage in (
        {"status": "garbage"},
        {"log": "%%% not base64 %%%", "log_offset": 0},
        {"status.state": "exploded"},
        {"log_size": "big"},
    ):
        forger.set(status={"reply": garbage})
        st = host.status(AID, info["pid"], info["token"])
        assert st["state"] == "unreachable" and "malformed status reply" in st["error"], (garbage, st)
    forger.set()
    assert wait_state(host, AID)["state"] == "ended"
    # an ended status with a garbled log size: still not read as anything
    forger.set(status={"reply": {"log_size": "big"}})
    st = host.status(AID, info["pid"], info["token"])
    assert st["state"] == "unreachable" and "log_size" in st["error"], st


def test_a_garbled_verifier_status_is_a_fail_verdict(forged, tmp_path):
    from fleetrun.ledger import Attempt, Task
    from fleetrun.plugins.relay.host import RemoteRunHandle
    from fleetrun.reports import Workspace
    from fleetrun.states import State
    from fleetrun.taskspec import TaskSpec, VerifySpec

    v = VerifySpec(kind="run", text="exit 1")
    task_ = Task(
        id=TID,
        name="fix",
        state=State.VERIFYING,
        spec=TaskSpec(name="fix", prompt="p", cwd=str(tmp_path), verify=[v]),
        source="",
        queue_id="q",
        created=0,
        updated=0,
        host="mini",
    )
    att = Attempt(id=AID, task_id=TID, number=1, kind="fresh", host="mini", state="ended", created=0)
    for idx, forged_reply in enumerate(({"passed": "no"}, {"duration_s": "abc"}, {"passed": 1})):
        forged.forger.set(verify_status={"reply": forged_reply})
        handle = RemoteRunHandle(forged.host, task_, att, v, idx, Workspace(path=str(tmp_path)))
        deadline = time.monotonic() + 120
        verdict = None
        while verdict is None and time.monotonic() < deadline:
            time.sleep(max(0.0, handle.next_deadline() - time.monotonic()))
            verdict = handle.poll()
        assert verdict is not None and verdict.passed is False, (forged_reply, verdict)
        assert "malformed verifier status" in verdict.reason, verdict.reason


def test_a_garbled_probe_reply_is_a_reason_the_peer_gets_nothing(forged):
    from fleetrun.plugins.relay.transport import PeerError

    forged.forger.set(probe={"reply": {"tags": "gpu"}})
    with pytest.raises(PeerError) as e:
        forged.host.probe()
    assert "malformed reply" in str(e.value) and "tags" in str(e.value)
    forged.forger.set(probe={"reply": {"running": "lots"}})
    with pytest.raises(PeerError):
        forged.host.probe()


def test_a_peer_collect_that_finds_a_tampered_worktree_raises_worktree_tampered(forged, fleeter, tmp_path):
    from fleetrun.gitutil import WorktreeTampered
    from fleetrun.ledger import Attempt, Task
    from fleetrun.reports import Workspace
    from fleetrun.states import State
    from fleetrun.taskspec import TaskSpec

    repo = make_repo(tmp_path / "repo")
    other = make_repo(tmp_path / "other", {"keep.txt": "tracked\n"})
    before = git(other, "rev-parse", "HEAD")
    task_ = Task(
        id=TID,
        name="fix",
        state=State.RUNNING,
        spec=TaskSpec(name="fix", prompt="p", cwd=str(repo), git_ref="main"),
        source="",
        queue_id="q",
        created=0,
        updated=0,
        host="mini",
    )
    att = Attempt(id=AID, task_id=TID, number=1, kind="fresh", host="mini", state="ended", created=0)
    ws = forged.host.prepare(task_, att)
    Path(ws["root"], ".git").write_text(f"gitdir: {other / '.git'}\n")
    Path(ws["root"], "EVIL.txt").write_text("evil\n")
    with pytest.raises(WorktreeTampered):
        forged.host.collect(task_, att, Workspace(**ws))
    assert git(other, "rev-parse", "HEAD") == before


def test_a_malformed_cached_probe_is_a_never_heard_peer_with_a_reason(fleeter):
    from fleetrun.plugins.relay.peers import Peer, save_peers

    save_peers(fleeter.home, {"mini": Peer(name="mini", address="nobody@127.0.0.1:1")})
    (fleeter.home / "peers-state.json").write_text(
        json.dumps(
            {
                "mini": {
                    "last_heard": time.time(),
                    "probe": {"fleetrun": "0.1.0", "features": ["supervised-tasks-1"], "running": "lots"},
                }
            }
        )
    )
    r = fleeter.run("relay", "peers", "--cached")
    assert r.ret == 0, r.stdout + r.stderr
    assert "never" in r.stdout and "gets no tasks: has a malformed entry in peers-state.json" in r.stdout
    r = fleeter.run("relay", "peers", "--cached", "--json")
    (row,) = json.loads(r.stdout)
    assert row["status"] == "never" and row["gets_tasks"] is False and "running" in row["why_not"]


def test_a_peer_with_a_broken_config_says_so_as_the_reason_it_gets_nothing(fleeter, peer_lab):
    m = peer_lab.machine("mini")
    m.write("config.toml", "[relay\n")
    r = fleeter.run("relay", "add", "mini", m.address, "--accept-new", "--command", m.command_line())
    assert r.ret == 6  # added, but not paired for work (docs/cli.md, exit codes)
    assert "gets no tasks: mini answered its probe" in r.stderr or "config.toml:1" in r.stderr, r.stderr
    assert "config.toml:1: invalid TOML" in r.stderr and "internal error" not in r.stderr, r.stderr
    m.write("config.toml", '[relay]\ntags = "gpu"\n')
    r = fleeter.run("relay", "peers")
    assert "relay.tags: expected a list of strings, got a string" in r.stdout, r.stdout


def private_peer(peer_lab: Any, name: str, repo: Path) -> Any:
    """A peer on 127.0.0.1 whose ``repo`` path holds a clone of ``repo`` (a private
    mount namespace: root and unshare), as in tests/acceptance/test_peers_fetchback.py."""
    import shutil

    from sshd import IS_ROOT, PeerMachine, Sshd

    if not IS_ROOT or not shutil.which("unshare"):
        pytest.skip("a peer with a repository of its own at the same path needs root and unshare")
    folder = peer_lab.root / name
    home = folder / "home"
    home.mkdir(parents=True, mode=0o700)
    clone = folder / "repo"
    subprocess.run(["git", "clone", "-q", str(repo), str(clone)], check=True, capture_output=True)
    sshd = Sshd(folder / "sshd", [peer_lab.client_pub], binds=[(clone, repo)])
    sshd.start()
    m = PeerMachine(name, sshd, home, "127.0.0.1", {})
    m.clone = clone  # type: ignore[attr-defined]
    peer_lab.machines.append(m)
    return m


def test_a_forged_prepare_reply_naming_another_branch_writes_no_branch_here(fleeter, fake_claude, peer_lab, tmp_path):
    repo = fleeter.make_repo()
    fleeter.git(repo, "branch", "stable")
    stable = fleeter.git(repo, "rev-parse", "stable").strip()
    mini = private_peer(peer_lab, "mini", repo)
    # the hostile peer has its own "stable", one commit ahead of ours
    fleeter.git(mini.clone, "checkout", "-q", "-b", "stable")
    (mini.clone / "EVIL.txt").write_text("evil\n")
    fleeter.git(mini.clone, "add", "-A")
    fleeter.git(mini.clone, "commit", "-q", "-m", "the peer's commit")
    fleeter.git(mini.clone, "checkout", "-q", "main")
    forger = Forger(tmp_path)
    forger.set(prepare={"reply": {"workspace.branch": "stable"}, "once": True})
    add_forged_peer(fleeter, mini, forger).close()
    fleeter.write_tasks("""
        [[task]]
        name = "fix"
        cwd = "repo"
        prompt = "Write FIX.txt."
        git_ref = "main"
        peer = "mini"

        [[task]]
        name = "after"
        cwd = "repo"
        prompt = "Go on."
        git_ref = "main"
        peer = "local"
        depends_on = ["fix"]
    """)
    fake_claude.script(
        fix=[{"actions": [["write", "FIX.txt", "fixed\n"], ["commit", "fix it"]]}],
        after=[{"actions": [["write", "AFTER.txt", "after\n"], ["commit", "after"]]}],
    )
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    fix = fleeter.task("fix")
    # the forged reply was refused: that attempt never started, with the reason
    causes = [t.cause for t in fleeter.ledger().transitions(fix.id)]
    assert any(
        c.startswith(
            "start_failed:mini answered prepare with a workspace that is not the one asked for: branch 'stable', not "
        )
        for c in causes
    ), causes
    # our stable did not move; the task's branch is the one chosen for it, fetched back
    assert fleeter.git(repo, "rev-parse", "stable").strip() == stable
    assert fix.branch == f"fleetrun/fix-{fix.id}" and fix.state.value == "DONE"
    assert fleeter.git(repo, "log", "-1", "--format=%s", fix.branch).strip() == "fix it"


def test_a_task_on_a_peer_leaves_no_secret_of_either_environment_in_any_home(
    fleeter, fake_claude, peer_lab, tmp_path, monkeypatch
):
    import shlex

    peer_secret, own_secret = "sk-ant-peer-only-7d2a91", "sk-ant-supervisor-only-1c4b55"
    monkeypatch.setenv("ANTHROPIC_API_KEY", own_secret)
    m = peer_lab.machine("mini")
    m.write("config.toml", (fleeter.home / "config.toml").read_text())
    # the peer's own environment holds its key (read from a file outside every home, so
    # that no command line, and so no peers.toml, holds it)
    (tmp_path / "peer-key").write_text(peer_secret)
    wrapper = tmp_path / "with-key.sh"
    wrapper.write_text(
        f'#!/bin/sh\nANTHROPIC_API_KEY="$(cat {tmp_path / "peer-key"})"\nexport ANTHROPIC_API_KEY\nexec "$@"\n'
    )
    wrapper.chmod(0o755)
    r = fleeter.run(
        "relay", "add", "mini", m.address, "--accept-new", "--command", shlex.join([str(wrapper), *m.command()])
    )
    assert r.ret == 0, r.stdout + r.stderr
    fleeter.make_repo()
    fleeter.write_tasks("""
        [[task]]
        name = "fix"
        cwd = "repo"
        prompt = "Write FIX.txt."
        git_ref = "main"
        peer = "mini"

          [[task.verify]]
          run = 'test "${#ANTHROPIC_API_KEY}" = 23 && test -f FIX.txt'
    """)
    fake_claude.script(fix=[{"actions": [["write", "FIX.txt", "fixed\n"], ["commit", "fix it"]]}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    fix = fleeter.task("fix")
    assert fix.state.value == "DONE" and fix.host == "mini"
    (v,) = fleeter.ledger().verdicts(task_id=fix.id)
    assert v.passed and v.host == "mini"  # the verifier had the peer's key
    dump = tmp_path / "ledger-dump.sql"
    import sqlite3

    with sqlite3.connect(fleeter.home / "state.db") as conn:
        dump.write_text("\n".join(conn.iterdump()))
    hits = []
    for root in (m.home, fleeter.home, dump):
        for p in [root] if root.is_file() else root.rglob("*"):
            if p.is_file() and not p.is_symlink():
                data = p.read_bytes()
                hits += [f"{p}: {s}" for s in (peer_secret, own_secret) if s.encode() in data]
    assert hits == []

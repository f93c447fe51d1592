"""`fleetrun relay add|peers|remove` against real sshd processes: host keys, ~/.ssh/config,
ssh-agent, a peer without fleetrun, the peers table."""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import time

pytest_plugins = ["sshd"]


def add(fleeter, m, *extra, name=None, command=None):
    return fleeter.run("relay", "add", name or m.name, m.address, "--command", command or m.command_line(), *extra)


def known_hosts(fleeter) -> str:
    p = fleeter.home / "known_hosts"
    return p.read_text() if p.exists() else ""


def test_unknown_host_key_is_refused_with_its_fingerprint(fleeter, peer_lab):
    m = peer_lab.machine("mini")
    fp = subprocess.run(
        ["ssh-keygen", "-lf", str(m.sshd.host_key) + ".pub"], capture_output=True, text=True, check=True
    ).stdout.split()[1]
    assert fp.startswith("SHA256:")
    r = add(fleeter, m)
    assert r.ret == 6
    assert f"the host key of [127.0.0.1]:{m.sshd.port} is not known: ssh-ed25519 {fp}" in r.stderr
    # the exact command that accepts it, ready to paste
    hint = r.errlines[-1].strip()
    assert hint.startswith("fleetrun ") and hint.endswith("--accept-new")
    argv = shlex.split(hint)
    assert argv[1:5] == ["relay", "add", "mini", m.address]
    assert argv[argv.index("--command") + 1] == m.command_line()
    assert not (fleeter.home / "peers.toml").exists()
    assert known_hosts(fleeter) == ""


def test_accept_new_records_the_key_once_and_says_so(fleeter, peer_lab):
    m = peer_lab.machine("mini")
    r = add(fleeter, m, "--accept-new")
    assert r.ret == 0, r.stdout + r.stderr
    r.fnmatch_lines(
        [
            f"accepted the new host key of [[]127.0.0.1[]]:{m.sshd.port}: ssh-ed25519 SHA256:* "
            f"recorded in {fleeter.home}/known_hosts (trust on first use)",
            "connected to * in * ms",
            "mini: fleetrun * · *(linux/*); features: supervised-tasks-1",
            f"added peer mini ({m.address}) in {fleeter.home}/peers.toml",
        ]
    )
    host_pub = (m.sshd.host_key.with_suffix(".pub")).read_text().split()
    assert known_hosts(fleeter) == f"[127.0.0.1]:{m.sshd.port} {host_pub[0]} {host_pub[1]}\n"
    assert ((fleeter.home / "known_hosts").stat().st_mode & 0o777) == 0o600
    assert ((fleeter.home / "peers.toml").stat().st_mode & 0o777) == 0o600
    # known now: no --accept-new needed, nothing recorded twice
    r = add(fleeter, m)
    assert r.ret == 0, r.stdout + r.stderr
    r.fnmatch_lines(
        [
            f"host key of [[]127.0.0.1[]]:{m.sshd.port}: ssh-ed25519 SHA256:* (on record in "
            f"{fleeter.home}/known_hosts:1)",
            "updated peer mini *",
        ]
    )
    assert len(known_hosts(fleeter).splitlines()) == 1


def test_a_changed_host_key_is_always_refused(fleeter, peer_lab):
    m = peer_lab.machine("mini")
    assert add(fleeter, m, "--accept-new").ret == 0
    m.sshd.restart(new_host_key=True)
    for extra in ((), ("--accept-new",)):
        r = add(fleeter, m, *extra)
        assert r.ret == 6
        assert f"@@@ THE HOST KEY OF [127.0.0.1]:{m.sshd.port} HAS CHANGED @@@" in r.stderr
        assert "--accept-new does not change that" in r.stderr
        assert f"ssh-keygen -R '[127.0.0.1]:{m.sshd.port}' -f {fleeter.home}/known_hosts" in r.stderr
    assert len(known_hosts(fleeter).splitlines()) == 1
    # and the peers table says why it gets nothing
    r = fleeter.run("relay", "peers", "--json")
    (row,) = json.loads(r.stdout)
    assert not row["gets_tasks"] and "HAS CHANGED" in row["why_not"]


def test_users_known_hosts_counts_hashed_or_not_and_a_change_there_is_refused(fleeter, peer_lab):
    m = peer_lab.machine("mini")
    pub = m.sshd.host_key.with_suffix(".pub").read_text().split()
    user_kh = peer_lab.client_home / ".ssh" / "known_hosts"
    user_kh.write_text(f"[127.0.0.1]:{m.sshd.port} {pub[0]} {pub[1]}\n")
    subprocess.run(["ssh-keygen", "-q", "-H", "-f", str(user_kh)], check=True, capture_output=True)
    assert "|1|" in user_kh.read_text()
    r = add(fleeter, m)
    assert r.ret == 0, r.stdout + r.stderr
    r.fnmatch_lines([f"*on record in {user_kh}:1)"])
    assert known_hosts(fleeter) == ""
    m.sshd.restart(new_host_key=True)
    r = add(fleeter, m, "--accept-new")
    assert r.ret == 6
    assert "HAS CHANGED" in r.stderr and f"(in {user_kh}:1)" in r.stderr


def test_ssh_config_alias_user_port_and_identity_file(fleeter, peer_lab):
    m = peer_lab.machine("mini")
    ssh = peer_lab.client_home / ".ssh"
    (ssh / "id_ed25519").rename(ssh / "fleet_key")  # found only through IdentityFile
    (ssh / "id_ed25519.pub").rename(ssh / "fleet_key.pub")
    (ssh / "config").write_text(
        f"Host mini-alias\n    HostName 127.0.0.1\n    Port {m.sshd.port}\n"
        f"    User {m.address.split('@')[0]}\n    IdentityFile ~/.ssh/fleet_key\n"
    )
    r = fleeter.run("relay", "add", "mini", "mini-alias", "--accept-new", "--command", m.command_line())
    assert r.ret == 0, r.stdout + r.stderr
    assert known_hosts(fleeter).startswith(f"[127.0.0.1]:{m.sshd.port} ssh-ed25519 ")
    assert 'address = "mini-alias"' in (fleeter.home / "peers.toml").read_text()
    r = fleeter.run("relay", "peers", "--json")
    (row,) = json.loads(r.stdout)
    assert row["status"] == "live" and row["gets_tasks"], row
    # without the IdentityFile line no key is accepted, and it says what it tried
    (ssh / "config").write_text(f"Host mini-alias\n    HostName 127.0.0.1\n    Port {m.sshd.port}\n")
    r = fleeter.run("relay", "add", "mini", "mini-alias", "--command", m.command_line())
    assert r.ret == 6
    assert "no key was accepted for" in r.stderr


def test_ssh_agent_keys_are_used(fleeter, peer_lab, tmp_path, monkeypatch):
    m = peer_lab.machine("mini")
    ssh = peer_lab.client_home / ".ssh"
    key = tmp_path / "agent_key"
    (ssh / "id_ed25519").rename(key)
    (ssh / "id_ed25519.pub").unlink()
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(
        ["ssh-agent", "-D", "-a", str(sock)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        # The socket file appears at bind(), before the agent listens: wait
        # until it accepts a connection (ssh-add exits 2 on a refused one).
        for _ in range(250):
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(str(sock))
                break
            except OSError:
                time.sleep(0.02)
            finally:
                probe.close()
        env = dict(os.environ, SSH_AUTH_SOCK=str(sock))
        subprocess.run(["ssh-add", "-q", str(key)], env=env, check=True, capture_output=True)
        monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
        r = add(fleeter, m, "--accept-new")
        assert r.ret == 0, r.stdout + r.stderr
    finally:
        os.killpg(agent.pid, signal.SIGTERM)
        agent.wait()


def test_a_peer_without_fleetrun_gets_nothing_and_says_why(fleeter, peer_lab, fake_claude):
    m = peer_lab.machine("bare")
    r = add(fleeter, m, "--accept-new", command="/nonexistent/fleetrun")
    assert r.ret == 6
    r.fnmatch_lines(
        [
            "added peer bare (*) in *peers.toml, but it gets no tasks: bare has no fleetrun: "
            "`/nonexistent/fleetrun` was not found there (*); install it, or set command = [[]...]*"
        ]
    )
    r = fleeter.run("relay", "peers")
    r.fnmatch_lines(["bare * never * never *", "  └ gets no tasks: has no fleetrun: *"])
    fleeter.make_repo()
    fleeter.write_tasks("""
        [[task]]
        name = "t"
        cwd = "repo"
        prompt = "hi"
    """)
    assert fleeter.run("drain").ret == 0
    r = fleeter.run("tasks.toml")
    assert r.ret == 1
    r.fnmatch_lines(["cannot place: t: this machine is draining; bare has no fleetrun: *"])
    assert fake_claude.calls() == []


def test_a_peer_too_old_for_supervised_tasks_gets_nothing(fleeter, peer_lab):
    m = peer_lab.machine("old")
    reply = json.dumps({"fleetrun": "0.1.0", "features": [], "os": "linux", "arch": "x86_64"})
    r = add(fleeter, m, "--accept-new", command=shlex.join(["sh", "-c", f"echo '{reply}'", "old-fleetrun"]))
    assert r.ret == 6
    assert "gets no tasks: old runs fleetrun 0.1.0 without supervised-tasks-1" in r.stderr


def test_peers_table_json_and_remove(fleeter, peer_lab):
    a, b = peer_lab.machine("alpha"), peer_lab.machine("beta")
    assert add(fleeter, a, "--accept-new").ret == 0
    assert add(fleeter, b, "--accept-new").ret == 0
    # gamma was paired once and has not been heard from since; beta was heard long ago
    with open(fleeter.home / "peers.toml", "a") as f:
        f.write('\n[peers.gamma]\naddress = "nobody@127.0.0.1:1"\n')
    state = json.loads((fleeter.home / "peers-state.json").read_text())
    state["beta"]["last_heard"] = time.time() - 600
    (fleeter.home / "peers-state.json").write_text(json.dumps(state))
    r = fleeter.run("relay", "peers", "--cached")
    assert r.ret == 0
    r.fnmatch_lines(
        [
            "PEER                       STATUS  LAST HEARD        ADDRESS",
            "──────────*",
            f"alpha                      live    *s ago            {a.address}",
            "  └ fleetrun 0.1.0 · *git *, python * (linux/*)",
            "  └ * MB free · load *.**/core · * MB disk · 0 running (*s ago)",
            f"beta                       stale   10m ago           {b.address}",
            "gamma                      never   never             nobody@127.0.0.1:1",
        ]
    )
    rows = {row["name"]: row for row in json.loads(fleeter.run("relay", "peers", "--cached", "--json").stdout)}
    assert [rows[n]["status"] for n in ("alpha", "beta", "gamma")] == ["live", "stale", "never"]
    assert rows["alpha"]["gets_tasks"] and not rows["beta"]["gets_tasks"]
    assert rows["alpha"]["probe"]["features"] == ["supervised-tasks-1"]
    # without --cached every peer is probed: beta is live again, gamma cannot be reached
    rows = {row["name"]: row for row in json.loads(fleeter.run("relay", "peers", "--json").stdout)}
    assert rows["beta"]["status"] == "live"
    assert rows["gamma"]["status"] == "never" and "cannot connect to 127.0.0.1:1" in rows["gamma"]["why_not"]
    r = fleeter.run("relay", "remove", "beta")
    assert r.ret == 0 and "removed peer beta" in r.stdout
    assert "beta" not in (fleeter.home / "peers.toml").read_text()
    assert "beta" not in json.loads((fleeter.home / "peers-state.json").read_text())
    r = fleeter.run("relay", "remove", "beta")
    assert r.ret == 4 and "no peer named 'beta'" in r.stderr


def test_bad_arguments_are_usage_errors(fleeter):
    assert fleeter.run("relay", "add", "local", "me@host").ret == 4
    r = fleeter.run("relay", "add", "x y", "me@host")
    assert r.ret == 4 and "not a usable peer name" in r.stderr
    r = fleeter.run("relay", "add", "mini", "me@host:99999")
    assert r.ret == 4 and "the port must be a number" in r.stderr
    assert fleeter.run("relay", "frobnicate").ret == 4
    r = fleeter.run("relay", "peers")
    assert r.ret == 0 and "no peers" in r.stdout

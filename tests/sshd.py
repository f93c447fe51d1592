"""Real sshd processes as fleetrun peers, for the relay's tests.

Each peer is an sshd of its own (its own host key, its own ``authorized_keys`` with
the test session's client key, ``StrictModes no``, ``UsePAM no``), run as
``/usr/sbin/sshd -D -e -f CONFIG``, and its own ``FLEETRUN_HOME``, set through the
peer command in ``peers.toml``::

    command = ["env", "FLEETRUN_HOME=/tmp/.../peerhome", ..., sys.executable, "-m", "fleetrun"]

Two kinds of peer:

- on ``127.0.0.1:<free port>`` (``lab.machine(name)``), the same machine, so "the repo
  at the same path" is literally the same repo;
- in a network namespace (``lab.machine(name, netns=True)``): a veth pair with
  addresses in a private test subnet (``10.213.X.0/24``), sshd started through
  ``ip netns exec NS unshare -m`` with a private mount namespace, where a clone is
  bind-mounted over the repository's path (the same path holds different files, as
  on two machines). Before any namespace exists, an ``unreachable`` route for the
  whole subnet goes into the root namespace, so that a namespace that failed to come
  up can never send a packet off the machine.

Facts this relies on: sshd does not start without ``/run/sshd``; Debian's bash runs
``~/.bashrc`` for every command sshd runs, so on 127.0.0.1 peers (when we are root)
a ``.bashrc`` that prints is bind-mounted over root's (the relay must not be
confused by it) and in namespaces an empty one hides it.

The client side gets a HOME of its own (``~/.ssh/id_ed25519`` is the session's key,
``~/.ssh/config`` and ``known_hosts`` start empty) and no ssh-agent.
"""

from __future__ import annotations

import getpass
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

import pytest

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
SSH_KEYGEN = shutil.which("ssh-keygen") or "/usr/bin/ssh-keygen"
IS_ROOT = os.geteuid() == 0
NOISY_BASHRC = 'echo "hello from .bashrc, on stdout"\necho "and on stderr" >&2\n'


def need_sshd() -> None:
    if not os.path.exists(SSHD) or not os.path.exists(SSH_KEYGEN):
        pytest.skip(f"no {SSHD} / ssh-keygen here (apt-get install openssh-server; .ci/run does)")


def keygen(path: Path, comment: str = "fleetrun-test") -> Path:
    subprocess.run(
        [SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        stdin=subprocess.DEVNULL,
    )
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, check=check, stdin=subprocess.DEVNULL)


#: ``python -m fleetrun`` whose ``host serve`` says hello without the keys ``{keys}``.
OLDER_SERVE = (
    "import sys\n"
    "from fleetrun.plugins.relay.peer import serve\n"
    "send = serve.Worker.send\n"
    "serve.Worker.send = lambda self, m: send(self, {{k: v for k, v in m.items() if k not in {keys!r}}})\n"
    "from fleetrun import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


class Sshd:
    """One sshd process with its own folder, host key and config."""

    def __init__(
        self,
        folder: Path,
        authorized_keys: list[str],
        listen: str = "127.0.0.1",
        port: Optional[int] = None,
        netns: Optional[str] = None,
        binds: Optional[list[tuple[Path, Path]]] = None,
    ) -> None:
        self.dir = folder
        self.dir.mkdir(parents=True, exist_ok=True)
        self.listen = listen
        self.port = port or free_port()
        self.netns = netns
        self.binds = list(binds or [])
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.host_key = self.dir / "ssh_host_ed25519_key"
        (self.dir / "authorized_keys").write_text("".join(k.strip() + "\n" for k in authorized_keys))
        os.chmod(self.dir / "authorized_keys", 0o600)
        self.new_host_key()

    def new_host_key(self) -> None:
        for p in (self.host_key, self.host_key.with_suffix(".pub")):
            if p.exists():
                p.unlink()
        keygen(self.host_key, "fleetrun-test-host")

    def write_config(self) -> Path:
        cfg = self.dir / "sshd_config"
        cfg.write_text(f"""\
Port {self.port}
ListenAddress {self.listen}
HostKey {self.host_key}
PidFile {self.dir / "sshd.pid"}
AuthorizedKeysFile {self.dir / "authorized_keys"}
StrictModes no
UsePAM no
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
X11Forwarding no
AllowTcpForwarding no
PrintMotd no
PrintLastLog no
MaxSessions 64
MaxStartups 64
LogLevel INFO
""")
        return cfg

    def argv(self) -> list[str]:
        cfg = self.write_config()
        sshd = [SSHD, "-D", "-e", "-f", str(cfg)]
        if not self.binds:
            return sshd
        script = " && ".join(f"mount --bind {shlex.quote(str(a))} {shlex.quote(str(b))}" for a, b in self.binds)
        argv = ["unshare", "-m", "--propagation", "private", "sh", "-c", f"{script} && exec {shlex.join(sshd)}"]
        if self.netns:
            argv = ["ip", "netns", "exec", self.netns, *argv]
        return argv

    def start(self, timeout: float = 120.0) -> None:
        if IS_ROOT:
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd will not start without it
        log = open(self.dir / "sshd.log", "ab")  # noqa: SIM115 - closed in stop()
        start = log.tell()  # a restart appends: only what this sshd writes counts
        try:
            self.proc = subprocess.Popen(
                self.argv(), stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
            )
        finally:
            log.close()
        # this sshd's own word that it listens (logged after listen()) before its banner: a
        # banner alone could be another process's, one that took the port since free_port()
        listening = f"Server listening on {self.listen} port {self.port}.".encode()
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited {self.proc.returncode}:\n{self.log()}")
            try:
                with open(self.dir / "sshd.log", "rb") as f:
                    f.seek(start)
                    ours = listening in f.read()
                if ours:
                    with socket.create_connection((self.listen, self.port), timeout=0.5) as s:
                        s.settimeout(1.0)
                        if s.recv(64).startswith(b"SSH-"):
                            return
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"sshd did not answer on {self.listen}:{self.port}:\n{self.log()}")
            time.sleep(0.05)

    def log(self) -> str:
        try:
            return (self.dir / "sshd.log").read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def restart(self, new_host_key: bool = False) -> None:
        self.stop()
        if new_host_key:
            self.new_host_key()
        self.start()


class PeerMachine:
    """A peer: its sshd, its FLEETRUN_HOME, and the command that runs fleetrun there."""

    def __init__(self, name: str, sshd: Sshd, home: Path, host: str, env: dict[str, str]) -> None:
        self.name = name
        self.sshd = sshd
        self.home = home
        self.host = host
        self.env = env

    @property
    def address(self) -> str:
        port = "" if self.sshd.port == 22 else f":{self.sshd.port}"
        return f"{getpass.getuser()}@{self.host}{port}"

    def command(self, **extra: str) -> list[str]:
        """``env FLEETRUN_HOME=... FAKE_CLAUDE_...=... python -m fleetrun``."""
        env = {"FLEETRUN_HOME": str(self.home), "PYTHONDONTWRITEBYTECODE": "1", "FLEETRUN_DISABLE_PLUGIN_AUTOLOAD": "1"}
        for k, v in os.environ.items():  # the fake claude's scenario, git's identity
            if k.startswith(("FAKE_CLAUDE_", "GIT_AUTHOR_", "GIT_COMMITTER_")) or k == "GIT_CONFIG_NOSYSTEM":
                env[k] = v
        env.update(self.env)
        env.update(extra)
        return ["env", *(f"{k}={v}" for k, v in env.items()), sys.executable, "-m", "fleetrun"]

    def command_line(self, **extra: str) -> str:
        return shlex.join(self.command(**extra))

    def older_command(self, without: tuple[str, ...], **extra: str) -> list[str]:
        """:meth:`command`, its ``host serve`` as an older fleetrun's: its hello without
        the keys ``without`` (``collects``, ``chain``...), so the supervisor does not use
        what they offer."""
        script = self.home.parent / f"older-{'-'.join(without)}.py"
        script.write_text(OLDER_SERVE.format(keys=without))
        command = self.command(**extra)
        i = command.index(sys.executable)
        return [*command[: i + 1], str(script)]

    def pair(self, fleeter: Any, *extra: str, **env: str) -> None:
        """Pair it with ``fleeter``'s home (``relay add NAME ADDRESS --accept-new --command
        ...`` and ``extra``), its fleetrun run with ``env`` besides :meth:`command`'s; it
        gets the home's ``config.toml`` first (the fake claude's ``[claude]`` settings)."""
        config = fleeter.home / "config.toml"
        if config.exists():
            self.write("config.toml", config.read_text())
        r = fleeter.run(
            "relay", "add", self.name, self.address, "--accept-new", "--command", self.command_line(**env), *extra
        )
        assert r.ret == 0, r.stdout + r.stderr

    def write(self, name: str, text: str) -> Path:
        self.home.mkdir(parents=True, exist_ok=True, mode=0o700)
        p = self.home / name
        p.write_text(text)
        return p

    def fake_headroom(self, free_mem_mb: float, load_per_core: float = 0.1, free_disk_mb: float = 50000) -> None:
        """Feed ``fleetrun host probe`` this headroom (``FLEETRUN_FAKE_HEADROOM``)."""
        import json

        path = self.home.parent / "headroom.json"
        path.write_text(
            json.dumps({"free_mem_mb": free_mem_mb, "load_per_core": load_per_core, "free_disk_mb": free_disk_mb})
        )
        self.env["FLEETRUN_FAKE_HEADROOM"] = str(path)


class NetLab:
    """Network namespaces joined to this one by veth pairs, in a private test subnet."""

    def __init__(self) -> None:
        # a subnet of its own per process; under pytest-xdist each worker (up to 4) draws
        # from a quarter of the range, so two workers never share one
        worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:]
        index = int(worker) if worker.isdigit() else 0
        self.octet = 100 + (index % 4) * 25 + os.getpid() % 25
        self.subnet = f"10.213.{self.octet}.0/24"
        self.spaces: list[tuple[str, str, str]] = []
        self.route = False

    def setup(self) -> None:
        if not IS_ROOT or not shutil.which("ip") or not shutil.which("unshare"):
            pytest.skip("network namespaces need root, ip (iproute2) and unshare")
        probe = f"fr-probe-{os.getpid()}"
        r = run("ip", "netns", "add", probe, check=False)
        if r.returncode != 0:
            pytest.skip(f"this machine cannot create network namespaces (ip netns add: {r.stderr.strip()})")
        run("ip", "netns", "del", probe, check=False)
        # before anything connects: nothing in the test subnet may leave this machine
        r = run("ip", "route", "add", "unreachable", self.subnet, check=False)
        if r.returncode != 0:
            pytest.skip(f"cannot add the unreachable route for {self.subnet}: {r.stderr.strip()}")
        self.route = True

    def add(self) -> tuple[str, str, str]:
        """A namespace with a veth link to this one: (namespace, its address, its interface)."""
        i = len(self.spaces)
        ns = f"fleetrun-{os.getpid()}-{i}"
        tag = f"{os.getpid() % 100000}{i}"
        host_if, peer_if = f"frh{tag}", f"frp{tag}"
        here, there = f"10.213.{self.octet}.{4 * i + 1}", f"10.213.{self.octet}.{4 * i + 2}"
        run("ip", "netns", "add", ns)
        self.spaces.append((ns, host_if, peer_if))
        run("ip", "link", "add", host_if, "type", "veth", "peer", "name", peer_if, "netns", ns)
        run("ip", "addr", "add", f"{here}/30", "dev", host_if)
        run("ip", "link", "set", host_if, "up")
        run("ip", "-n", ns, "addr", "add", f"{there}/30", "dev", peer_if)
        run("ip", "-n", ns, "link", "set", peer_if, "up")
        run("ip", "-n", ns, "link", "set", "lo", "up")
        return ns, there, peer_if

    def link(self, ns: str, up: bool) -> None:
        """Drop or restore the peer's link (its end of the veth): packets vanish silently."""
        for name, _, peer_if in self.spaces:
            if name == ns:
                run("ip", "-n", ns, "link", "set", peer_if, "up" if up else "down")

    def teardown(self) -> None:
        for ns, host_if, _ in self.spaces:
            # sshd's per-connection children outlive the listener; with the link gone
            # their connections would never close
            pids = run("ip", "netns", "pids", ns, check=False).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            run("ip", "link", "del", host_if, check=False)
            run("ip", "netns", "del", ns, check=False)
        self.spaces.clear()
        if self.route:
            run("ip", "route", "del", "unreachable", self.subnet, check=False)
            self.route = False


class PeerLab:
    """Makes peers for one test and stops them afterwards."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, client_key: Path) -> None:
        need_sshd()
        self.root = tmp_path / "peers"
        self.root.mkdir()
        self.client_home = tmp_path / "client"
        ssh = self.client_home / ".ssh"
        ssh.mkdir(parents=True, mode=0o700)
        shutil.copy(client_key, ssh / "id_ed25519")
        shutil.copy(client_key.with_suffix(".pub"), ssh / "id_ed25519.pub")
        os.chmod(ssh / "id_ed25519", 0o600)
        self.client_pub = client_key.with_suffix(".pub").read_text()
        monkeypatch.setenv("HOME", str(self.client_home))
        monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
        self.machines: list[PeerMachine] = []
        self.net: Optional[NetLab] = None

    def machine(
        self,
        name: str,
        netns: bool = False,
        repo: Optional[Path] = None,
        env: Optional[dict[str, str]] = None,
        hide: tuple[Path, ...] = (),
    ) -> PeerMachine:
        """A peer on 127.0.0.1, or (``netns``) in a namespace of its own, where ``repo``
        (if given) is replaced by a clone of it, at the same path, and each folder in
        ``hide`` by an empty one."""
        folder = self.root / name
        home = folder / "home"
        home.mkdir(parents=True, mode=0o700)
        binds: list[tuple[Path, Path]] = []
        rc = Path("/root/.bashrc")
        if netns:
            assert self.net is not None, "call lab.netlab() first"
            ns, host, _ = self.net.add()
            if repo is not None:
                clone = folder / "repo"
                run("git", "clone", "-q", str(repo), str(clone))
                binds.append((clone, repo))
            for i, path in enumerate(hide):
                empty = folder / f"empty-{i}"
                empty.mkdir()
                binds.append((empty, path))
            if IS_ROOT and rc.exists():
                (folder / "bashrc").write_text("")
                binds.append((folder / "bashrc", rc))
            sshd = Sshd(folder / "sshd", [self.client_pub], listen=host, port=22, netns=ns, binds=binds)
        else:
            host = "127.0.0.1"
            if IS_ROOT and rc.exists() and shutil.which("unshare"):
                (folder / "bashrc").write_text(NOISY_BASHRC)
                binds.append((folder / "bashrc", rc))
            sshd = Sshd(folder / "sshd", [self.client_pub], binds=binds)
        sshd.start()
        m = PeerMachine(name, sshd, home, host, dict(env or {}))
        if netns:
            m.netns = ns  # type: ignore[attr-defined]
        self.machines.append(m)
        return m

    def private_machine(self, name: str, repo: Path) -> PeerMachine:
        """A peer on 127.0.0.1 in a private mount namespace in which ``repo``'s path holds
        a clone of it (``machine.clone``), and root's ``.bashrc`` prints on stdout (as a
        chatty one does): a branch made there is on the peer only, until it is fetched.
        The test skips without root and ``unshare``, saying so."""
        if not IS_ROOT or not shutil.which("unshare"):
            pytest.skip(
                "a peer with a repository of its own at the same path needs root and unshare "
                "(a private mount namespace)"
            )
        folder = self.root / name
        home = folder / "home"
        home.mkdir(parents=True, mode=0o700)
        clone = folder / "repo"
        run("git", "clone", "-q", str(repo), str(clone))
        binds = [(clone, repo)]
        rc = Path("/root/.bashrc")
        if rc.exists():
            (folder / "bashrc").write_text(NOISY_BASHRC)
            binds.append((folder / "bashrc", rc))
        sshd = Sshd(folder / "sshd", [self.client_pub], binds=binds)
        sshd.start()
        m = PeerMachine(name, sshd, home, "127.0.0.1", {})
        m.clone = clone  # type: ignore[attr-defined]
        self.machines.append(m)
        return m

    def netlab(self) -> NetLab:
        if self.net is None:
            net = NetLab()
            net.setup()
            self.net = net
        return self.net

    def close(self) -> None:
        for m in self.machines:
            m.sshd.stop()
        kill_leftovers(self.root)
        if self.net is not None:
            self.net.teardown()


def kill_leftovers(root: Path) -> None:
    """Shepherds and verifier runners a test left running on its peers."""
    import psutil

    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
        except (psutil.Error, TypeError):
            continue
        if str(root) in cmd and ("shepherd" in cmd or "verify-runner" in cmd):
            try:
                p.terminate()  # a shepherd ends its agent's process group first
            except psutil.Error:
                pass


@pytest.fixture(scope="session")
def client_key(tmp_path_factory: pytest.TempPathFactory) -> Path:
    need_sshd()
    return keygen(tmp_path_factory.mktemp("client-key") / "id_ed25519", "fleetrun-test-client")


@pytest.fixture
def peer_lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, client_key: Path) -> Any:
    """A :class:`PeerLab`: ``peer_lab.machine("mini")`` starts a peer."""
    lab = PeerLab(tmp_path, monkeypatch, client_key)
    try:
        yield lab
    finally:
        lab.close()

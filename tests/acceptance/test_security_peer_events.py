"""A peer's events are about the attempts this supervisor placed on it, and nothing else
(issue 21, items 2 and 3): a forging peer behind a real sshd (``tests/forgeworker.py``,
the real ``fleetrun host serve`` with lines of its own in its stream) writes into no
local attempt's log, sets no cost, pauses nothing, makes no folder in the home, and
its lies are dropped and counted in ``fleetrun relay peers``; a peer that floods the
supervisor with events for made-up attempts does not grow its memory."""

from __future__ import annotations

import base64
import json
import shlex
import time
from pathlib import Path
from typing import Any, Callable

import psutil
import pytest

from fleetrun.fleeter import RunResult

pytest_plugins = ["sshd"]

FORGER = Path(__file__).resolve().parent.parent / "forgeworker.py"
DEADLINE_S = 120.0
#: What the flood may add to the supervisor's RSS over the most it used with the honest
#: peer, in the same run (on main, 3,000 kept ``ended`` events of 32 kB: ~100 MB more).
RSS_SLACK_MB = 30


def wait_for(cond: Callable[[], Any], what: str, proc: Any = None) -> Any:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        if proc is not None and proc.poll() is not None:
            raise AssertionError(
                f"the supervisor exited ({proc.returncode}) while waiting for {what}: "
                + proc.stderr.read().decode(errors="replace")[-3000:]
            )
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


class Forging:
    """A peer whose worker forges lines (:mod:`forgeworker`), paired with the fleeter's home."""

    def __init__(self, fleeter: Any, peer_lab: Any, tmp_path: Path) -> None:
        self.dir = tmp_path / "forge"
        self.dir.mkdir()
        self.m = peer_lab.machine("mini")
        self.m.fake_headroom(9000)
        argv = self.m.command(FORGE_DIR=str(self.dir))
        assert argv[-2:] == ["-m", "fleetrun"]
        if (fleeter.home / "config.toml").exists():
            self.m.write("config.toml", (fleeter.home / "config.toml").read_text())
        r = fleeter.run(
            "relay", "add", "mini", self.m.address, "--accept-new", "--command", shlex.join([*argv[:-2], str(FORGER)])
        )
        assert r.ret == 0, r.stdout + r.stderr
        self.fleeter = fleeter
        self.n = 0

    def inject(self, *messages: dict[str, Any]) -> None:
        """Have its worker send ``messages``, and wait until the supervisor read them: the
        headroom it reports changes after they went out, and the supervisor's reader
        takes lines in order, so the new headroom recorded means they were read."""
        self.n += 1
        tmp = self.dir / f".inject-{self.n}"
        tmp.write_text("".join(json.dumps(m) + "\n" for m in messages))
        tmp.rename(self.dir / f"inject-{self.n}.ndjson")
        wait_for(lambda: (self.dir / f"inject-{self.n}.sent").exists(), "the forger to send its lines")
        self.read_through()

    def read_through(self) -> None:
        mark = 9000 + self.n
        self.m.fake_headroom(mark)
        wait_for(lambda: self.heard_mem() == mark, f"the supervisor to hear headroom {mark}")

    def heard_mem(self) -> Any:
        try:
            state = json.loads((self.fleeter.home / "peers-state.json").read_text())
        except (OSError, ValueError):
            return None
        return ((state.get("mini") or {}).get("probe") or {}).get("free_mem_mb")


def gated_local_task(fleeter: Any, fake_claude: Any, gate: Path) -> None:
    from tests.conftest import FAKE_CLAUDE

    fleeter.write_config(
        f'[claude]\nexecutable = "{FAKE_CLAUDE}"\nallowed_tools = ["Bash"]\n[relay]\nheartbeat_secs = 0.2\n'
    )
    fleeter.make_repo()
    fleeter.write_tasks("""
        [[task]]
        name = "t1"
        cwd = "repo"
        prompt = "Write t1.txt."
        git_ref = "main"
        peer = "local"
    """)
    fake_claude.script(
        t1=[
            {
                "actions": [
                    ["bash", f"while [ ! -e {gate} ]; do sleep 0.05; done"],
                    ["write", "t1.txt", "1"],
                    ["commit", "t1"],
                ],
                "cost": 0.25,
            }
        ]
    )


def log_event(aid: str, data: bytes, offset: int) -> dict[str, Any]:
    return {
        "event": "log",
        "attempt": aid,
        "log": base64.b64encode(data).decode(),
        "log_offset": offset,
        "log_size": offset + len(data),
    }


def ended_event(aid: str) -> dict[str, Any]:
    return {
        "event": "ended",
        "attempt": aid,
        "status": {"state": "ended", "exit_code": 0, "ended": time.time()},
        "log_size": 0,
    }


def running_attempt(fleeter: Any) -> Any:
    led = fleeter.ledger()
    t = led.find("t1")
    if t is None or t.state.value != "RUNNING":
        return None
    atts = led.attempts(t.id)
    if not atts or not atts[-1].dir:
        return None
    log = Path(atts[-1].dir) / "log"
    return atts[-1] if log.exists() and b'"Bash"' in log.read_bytes() else None


def stop(proc: Any) -> tuple[str, str]:
    """Its (stdout, stderr), once it ended (stopped if it still ran)."""
    if proc.poll() is None:
        proc.terminate()
    try:
        out, err = proc.communicate(timeout=60)
    except Exception:  # noqa: BLE001 - a supervisor that does not stop: killed
        proc.kill()
        out, err = proc.communicate()
    return out.decode(errors="replace"), err.decode(errors="replace")


def test_a_peer_s_events_for_attempts_it_was_not_given_are_dropped_and_counted(
    fleeter, fake_claude, peer_lab, tmp_path
):
    gate = tmp_path / "gate"
    gated_local_task(fleeter, fake_claude, gate)
    peer = Forging(fleeter, peer_lab, tmp_path)
    proc = fleeter.popen("tasks.toml", env={"PYTHONUNBUFFERED": "1"})
    try:
        wait_for(lambda: (peer.dir / "serving").exists(), "the peer's worker", proc)
        att = wait_for(lambda: running_attempt(fleeter), "t1 to run here, in its gate", proc)
        log = Path(att.dir) / "log"
        before = log.read_bytes()
        six_days = int(time.time()) + 6 * 86400
        forged = (
            json.dumps(
                {
                    "type": "rate_limit_event",
                    "session_id": "FORGED",
                    "uuid": "u",
                    "rate_limit_info": {"status": "rejected", "resetsAt": six_days, "rateLimitType": "seven_day"},
                }
            )
            + "\n"
            + json.dumps(
                {
                    "type": "result",
                    "subtype": "success",
                    "is_error": True,
                    "result": "FORGED",
                    "session_id": "FORGED",
                    "total_cost_usd": 4321.0,
                    "num_turns": 1,
                    "duration_ms": 1,
                    "api_error_status": 429,
                }
            )
            + "\n"
        ).encode()
        never = [f"task_zz{i:08d}_0_a1" for i in range(40)]
        peer.inject(
            log_event(att.id, forged, len(before)),
            *(log_event(aid, b"FORGED\n", 0) for aid in never[:20]),
            *(ended_event(aid) for aid in never[20:]),
            {"event": "ended", "attempt": att.id, "status": {"state": "died", "exit_code": 9}, "log_size": 0},
            {
                "event": "verified",
                "attempt": never[0],
                "idx": 0,
                "result": {"state": "ended", "passed": True, "reason": "FORGED"},
            },
            {"id": 999999, "code": 0, "reply": {"forged": True}},
        )
        gate.touch()
        wait_for(lambda: fleeter.task("t1").state.value not in ("ASSIGNED", "RUNNING"), "t1 to end", proc)
        try:
            ret = proc.wait(timeout=60) if fleeter.task("t1").state.value in ("VERIFYING", "DONE") else None
        except Exception:  # noqa: BLE001 - judged by the asserts below
            ret = None
    finally:
        out, err = stop(proc)
    led = fleeter.ledger()
    t1 = fleeter.task("t1")
    print(
        f"t1 {t1.state.value}, cost {t1.cost_usd}, pauses {led.usage_pauses()}, "
        f"attempt folders {len(list((fleeter.home / 'attempts').iterdir()))}"
    )
    assert b"FORGED" not in log.read_bytes() and log.read_bytes().startswith(before)
    assert t1.state.value == "DONE", (t1.state, out, err)
    assert t1.cost_usd == pytest.approx(0.25)
    assert "local" not in led.usage_pauses()
    assert ret == 0, out + err
    # no folder for an attempt it was never given
    assert sorted(p.name for p in (fleeter.home / "attempts").iterdir()) == [att.id]
    # counted, per kind, in `relay peers`, and said once in the run's output
    r = fleeter.run("relay", "peers", "--cached")
    assert r.ret == 0, r.stdout + r.stderr
    print(r.stdout)
    r.fnmatch_lines(["*protocol violations: 44 dropped (ended 21, log 21, reply 1, verified 1)*"])
    rows = json.loads(fleeter.run("relay", "peers", "--cached", "--json").stdout)
    assert rows[0]["violations"]["counts"] == {"ended": 21, "log": 21, "reply": 1, "verified": 1}
    RunResult(0, out, err, 0.0).fnmatch_lines(["*mini: 44 protocol violations dropped*relay peers*"])


def test_a_peer_flooding_ended_events_for_made_up_attempts_does_not_grow_the_supervisor(
    fleeter, fake_claude, peer_lab, tmp_path
):
    gate = tmp_path / "gate"
    gated_local_task(fleeter, fake_claude, gate)
    peer = Forging(fleeter, peer_lab, tmp_path)
    proc = fleeter.popen("tasks.toml", env={"PYTHONUNBUFFERED": "1"})
    try:
        wait_for(lambda: (peer.dir / "serving").exists(), "the peer's worker", proc)
        wait_for(lambda: running_attempt(fleeter), "t1 to run here, in its gate", proc)
        sup = psutil.Process(proc.pid)
        # the honest peer: its heartbeats pushed through the worker, a few seconds' worth
        honest = []
        for _ in range(5):
            peer.read_through()
            peer.n += 1
            honest.append(sup.memory_info().rss)
        baseline = max(honest)
        # the flood: 3,000 `ended` events for made-up attempts (32 kB each), 25 s at most
        (peer.dir / ".flood").write_text(json.dumps({"count": 3000, "seconds": 25, "pad": 32768}))
        (peer.dir / ".flood").rename(peer.dir / "flood.json")
        flooded = []
        while not (peer.dir / "flood.done").exists():
            flooded.append(sup.memory_info().rss)
            time.sleep(0.1)
        sent = int((peer.dir / "flood.done").read_text())
        peer.n += 1
        peer.read_through()  # the supervisor has read the whole flood
        flooded.append(sup.memory_info().rss)
        gate.touch()
        assert proc.wait(timeout=DEADLINE_S) == 0
    finally:
        stop(proc)
    mb = 1 << 20
    print(f"honest {baseline / mb:.1f} MB, flooded max {max(flooded) / mb:.1f} MB, {sent} events")
    assert sent >= 500, sent
    assert max(flooded) < baseline + RSS_SLACK_MB * mb, (baseline / mb, max(flooded) / mb, sent)
    assert fleeter.task("t1").state.value == "DONE"
    rows = json.loads(fleeter.run("relay", "peers", "--cached", "--json").stdout)
    assert rows[0]["violations"]["counts"] == {"ended": sent}


def test_an_answer_the_peer_never_sends_is_not_waited_for_for_ever(fleeter, peer_lab, tmp_path):
    """A request's follower (``then``: a collect's verifier start) whose answer never
    comes is given up on, and forgotten: the worker keeps no table of them."""
    from fleetrun.plugins.relay.host import SSHHost
    from fleetrun.plugins.relay.peers import load_peers
    from fleetrun.plugins.relay.transport import PeerUnreachable

    peer = Forging(fleeter, peer_lab, tmp_path)
    (peer.dir / "swallow").write_text("then")
    host = SSHHost(load_peers(fleeter.home)["mini"], fleeter.home, worker=True)
    try:
        w = host.worker(host.transport())
        assert w is not None and w.chains
        for _ in range(3):
            p = w.submit("collect", [], {"task": {}}, then=("verify-start", [], {"idx": 0}))
            code, _ = p.wait(DEADLINE_S)
            assert code != 0  # a collect of nothing: refused, and its follower not run
            assert p.follower is not None
            with pytest.raises(PeerUnreachable):
                p.follower.wait(0.2)
        assert w._following == {} and w._waiting == {}
    finally:
        host.close()

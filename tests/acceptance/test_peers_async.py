"""A slow peer does not hold the loop up: while a peer task's run verifier is being
started there, or its worktree is being removed there after DONE, the loop goes on
working other tasks (`Worker.submit`: the request is sent, its reply wakes the loop).

What is slow is made slow on the peer itself, and held until the test has seen the loop
work a chain of local tasks to DONE: the verifier's start waits for the peer's host lock
(the test holds it), the cleanup's ``git worktree remove`` for a file (a ``git`` wrapper
first on the peer's PATH). A loop that waited for the peer's reply would work nothing
meanwhile, until its wait gave up: 120 s for a cleanup, whose note then says it could not
clean up; 30 s for a verifier's start, asked again a second or two later, and so on. In
those seconds between two waits a loop gets some work done, so for the verifier the test
also counts the loop's passes while the peer is slow (its liveness beats, one a pass at
most once a second): a loop that blocks beats a few times a minute.
"""

from __future__ import annotations

import fcntl
import os
import shlex
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

from fleetrun.liveness import LIVENESS
from fleetrun.shepherd import read_json

pytest_plugins = ["sshd"]

#: local tasks after the first, each depending on the one before: each takes the loop
#: several passes, so a loop that blocks on the peer cannot finish them in HANG_S
CHAIN = 3
#: a bound for a hung run, not a timing: the chain takes seconds even on a loaded machine
HANG_S = 150.0
#: the loop's passes (liveness beats) to see while the peer's verifier cannot start: a loop
#: that is not held up beats about once a second; one that waits 30 s for each
#: verify-start beats at most a few times in each 30 s, fewer than this in HANG_S
BEATS = 20


def wait_for(cond: Callable[[], Any], what: str, proc: subprocess.Popen[bytes], timeout: float = HANG_S) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        assert proc.poll() is None, f"the run ended before {what}"
        assert time.monotonic() < deadline, f"waited {timeout:g}s for {what}"
        time.sleep(0.1)


def hold(gate: Path) -> list[str]:
    """A fake claude action: wait until ``gate`` exists (its task must allow Bash: the
    default lets an agent run git only, and a command it may not run returns at once)."""
    return ["bash", f"while [ ! -e {shlex.quote(str(gate))} ]; do sleep 0.05; done"]


def write_tasks(fleeter: Any, fake_claude: Any, peer_actions: list[Any], local_gate: Path, more: str = "") -> None:
    """``far`` on mini, the local chain l0..lCHAIN (l0 held until ``local_gate``), and
    ``more`` tasks (their scripts the caller's)."""
    chain = more + "".join(
        f"""
        [[task]]
        name = "l{i}"
        cwd = "repo"
        prompt = "p"
        git_ref = "main"
        peer = "local"
        depends_on = ["l{i - 1}"]
    """
        for i in range(1, CHAIN + 1)
    )
    fleeter.write_tasks(
        """
        [[task]]
        name = "far"
        cwd = "repo"
        prompt = "Write far.txt."
        git_ref = "main"
        peer = "mini"
        allowed_tools = ["Bash"]

          [[task.verify]]
          run = "test -f far.txt"

        [[task]]
        name = "l0"
        cwd = "repo"
        prompt = "p"
        git_ref = "main"
        peer = "local"
        allowed_tools = ["Bash"]
    """
        + chain
    )
    fake_claude.script(
        far=[{"actions": [*peer_actions, ["write", "far.txt", "x"], ["commit", "far"]]}],
        l0=[{"actions": [hold(local_gate), ["write", "l0.txt", "x"], ["commit", "l0"]]}],
        **{f"l{i}": [{"actions": [["write", f"l{i}.txt", "x"], ["commit", f"l{i}"]]}] for i in range(1, CHAIN + 1)},
    )


def states(fleeter: Any) -> dict[str, str]:
    return fleeter.states()


def chain_done(fleeter: Any) -> bool:
    now = states(fleeter)
    return all(now.get(f"l{i}") == "DONE" for i in range(CHAIN + 1))


def finish(proc: subprocess.Popen[bytes]) -> str:
    out, err = proc.communicate(timeout=300)
    text = out.decode(errors="replace") + err.decode(errors="replace")
    assert proc.returncode == 0, text
    return text


def pair_with_held_git(
    fleeter: Any, mini: Any, tmp_path: Path, words: str, without: tuple[str, ...] = ()
) -> tuple[Path, Path]:
    """Pair ``mini`` with a ``git`` first on its PATH that, for a command line holding
    ``words``, touches ``entered`` and waits until the test creates ``gate``; its worker's
    hello ``without`` those keys (an older fleetrun's).

    :return: (entered, gate)."""
    bin_dir, entered, gate = tmp_path / "peer-bin", tmp_path / "git-entered", tmp_path / "git-may-go"
    bin_dir.mkdir()
    git = bin_dir / "git"
    git.write_text(
        "#!/bin/sh\n"
        f'case " $* " in *" {words} "*) touch {shlex.quote(str(entered))}; '
        f"while [ ! -e {shlex.quote(str(gate))} ]; do sleep 0.05; done;; esac\n"
        f'exec {shlex.quote(shutil.which("git") or "/usr/bin/git")} "$@"\n'
    )
    git.chmod(0o755)
    if (fleeter.home / "config.toml").exists():
        mini.write("config.toml", (fleeter.home / "config.toml").read_text())
    command = mini.older_command(without, PATH=f"{bin_dir}:{os.environ['PATH']}")
    r = fleeter.run("relay", "add", mini.name, mini.address, "--accept-new", "--command", shlex.join(command))
    assert r.ret == 0, r.stdout + r.stderr
    return entered, gate


def test_the_loop_works_other_tasks_while_a_peer_verifier_is_being_started(fleeter, fake_claude, peer_lab, tmp_path):
    fleeter.make_repo()
    mini = peer_lab.machine("mini")
    mini.pair(fleeter)
    far_gate, local_gate = tmp_path / "far-may-end", tmp_path / "local-may-end"
    write_tasks(fleeter, fake_claude, [hold(far_gate)], local_gate)
    proc = fleeter.popen("tasks.toml")
    lock = os.open(mini.home / "host.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        wait_for(lambda: states(fleeter).get("far") == "RUNNING", "far RUNNING on mini", proc)
        # from now on the peer cannot start a verifier (verify-start takes its host lock)
        fcntl.flock(lock, fcntl.LOCK_EX)
        far_gate.touch()
        wait_for(lambda: states(fleeter).get("far") == "VERIFYING", "far VERIFYING", proc)
        local_gate.touch()
        beats: set[float] = set()

        def worked() -> bool:
            beat = (read_json(str(fleeter.home / LIVENESS)) or {}).get("beat")
            if isinstance(beat, float):
                beats.add(beat)
            return len(beats) > BEATS and chain_done(fleeter)

        wait_for(worked, f"l0..l{CHAIN} DONE and {BEATS} passes while far's verifier cannot start", proc)
        assert states(fleeter)["far"] == "VERIFYING"
    finally:
        far_gate.touch()
        local_gate.touch()
        os.close(lock)  # the peer may start the verifier now
    finish(proc)
    far = fleeter.task("far")
    assert far.state.value == "DONE" and far.host == "mini"
    assert [(v.kind, v.passed, v.host) for v in fleeter.ledger().verdicts(task_id=far.id)] == [("run", True, "mini")]


def test_the_loop_works_other_tasks_while_a_peer_removes_a_done_worktree(fleeter, fake_claude, peer_lab, tmp_path):
    fleeter.make_repo()
    mini = peer_lab.machine("mini")
    entered, gate = pair_with_held_git(fleeter, mini, tmp_path, "worktree remove")
    local_gate = tmp_path / "local-may-end"
    write_tasks(fleeter, fake_claude, [], local_gate)
    proc = fleeter.popen("tasks.toml")
    try:
        wait_for(entered.exists, "far DONE and its worktree being removed on mini", proc)
        assert states(fleeter)["far"] == "DONE"
        local_gate.touch()
        wait_for(
            lambda: chain_done(fleeter),
            f"l0..l{CHAIN} DONE while far's worktree is being removed",
            proc,
        )
    finally:
        local_gate.touch()
        gate.touch()
    finish(proc)  # the run waits for the cleanup's reply before it ends
    far = fleeter.task("far")
    notes = [n for _, n in fleeter.ledger().notes(far.id)]
    assert far.worktree is None  # shown as removed once it is
    (attempt,) = fleeter.ledger().attempts(far.id)
    there = attempt.workspace["root"]  # the peer's worktree, as its prepare recorded it
    assert f"removed clean worktree {there} on mini; branch {far.branch} stays" in notes, notes


def test_a_verifier_started_with_a_collect_is_stopped_when_its_task_moved_meanwhile(
    fleeter, fake_claude, peer_lab, tmp_path
):
    """The collect request carries the start of the task's first run verifier (one round
    trip for the two), to a worker that does not collect at the end itself (the fleetrun
    before). A task cancelled while its work was collected never reaches VERIFYING, so
    nothing would watch that verifier: the relay stops it on the peer."""
    fleeter.make_repo()
    mini = peer_lab.machine("mini")
    # the collect's commit waits for the test (the agent commits nothing)
    entered, gate = pair_with_held_git(fleeter, mini, tmp_path, "--no-verify", without=("collects",))
    fleeter.write_tasks("""
        [[task]]
        name = "far"
        cwd = "repo"
        prompt = "Write far.txt."
        git_ref = "main"
        peer = "mini"

          [[task.verify]]
          run = "sleep 300"
    """)
    fake_claude.script(far=[{"actions": [["write", "far.txt", "x"]]}])
    proc = fleeter.popen("tasks.toml")
    try:
        wait_for(entered.exists, "far's work being committed on mini", proc)
        assert fleeter.run("cancel", "far").ret == 0
    finally:
        gate.touch()
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, out.decode(errors="replace") + err.decode(errors="replace")
    far = fleeter.task("far")
    assert far.state.value == "CANCELLED" and not fleeter.ledger().verdicts(task_id=far.id)
    att = fleeter.ledger().latest_attempt(far.id)
    runner = mini.home / "attempts" / att.id / "verify-1" / "runner.json"
    assert runner.exists(), "the verifier was not started with the collect: this test tests nothing"
    pid = read_json(str(runner))["pid"]

    def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        with open(f"/proc/{pid}/stat") as f:  # a zombie is gone too
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"

    deadline = time.monotonic() + 60
    while not gone():
        assert time.monotonic() < deadline, "the verifier of a cancelled task runs on on mini (sleep 300)"
        time.sleep(0.1)


def test_the_loop_works_other_tasks_while_a_peer_collects_an_attempts_work(fleeter, fake_claude, peer_lab, tmp_path):
    """A peer's collect (its ``git status``, ``add``, ``commit``) is a request the loop does
    not wait for: other tasks go on while it runs, and its answer moves the task on."""
    fleeter.make_repo()
    mini = peer_lab.machine("mini")
    # the collect's commit waits for the test (the agent commits nothing)
    entered, gate = pair_with_held_git(fleeter, mini, tmp_path, "--no-verify")
    local_gate = tmp_path / "local-may-end"
    write_tasks(fleeter, fake_claude, [], local_gate)
    fake_claude.script(far=[{"actions": [["write", "far.txt", "x"]]}])  # left uncommitted
    proc = fleeter.popen("tasks.toml")
    try:
        wait_for(entered.exists, "far's work being committed on mini", proc)
        local_gate.touch()
        wait_for(lambda: chain_done(fleeter), f"l0..l{CHAIN} DONE while far's work is committed on mini", proc)
        # a loop that waited for the reply would have given up on it (120 s) and moved on
        assert states(fleeter)["far"] == "RUNNING", "the loop waited for the collect's reply"
    finally:
        local_gate.touch()
        gate.touch()
    finish(proc)
    far = fleeter.task("far")
    assert far.state.value == "DONE" and far.host == "mini"
    assert not [n for _, n in fleeter.ledger().notes(far.id) if "could not commit" in n]
    assert [(v.kind, v.passed, v.host) for v in fleeter.ledger().verdicts(task_id=far.id)] == [("run", True, "mini")]


def test_the_loop_works_other_tasks_while_a_peer_makes_an_attempts_worktree(fleeter, fake_claude, peer_lab, tmp_path):
    """A peer's prepare (its ``git worktree add``) and the start after it are requests the
    loop does not wait for: a hundred peers' attempts start in one pass, and the ends of
    other tasks are handled meanwhile; the reply moves the task on."""
    fleeter.make_repo()
    mini = peer_lab.machine("mini")
    entered, gate = pair_with_held_git(fleeter, mini, tmp_path, "worktree add")
    local_gate = tmp_path / "local-may-end"
    write_tasks(fleeter, fake_claude, [], local_gate)
    proc = fleeter.popen("tasks.toml")
    try:
        wait_for(entered.exists, "far's worktree being made on mini", proc)
        local_gate.touch()
        wait_for(lambda: chain_done(fleeter), f"l0..l{CHAIN} DONE while far's worktree is made on mini", proc)
        # a loop that waited for the reply would have given up on it (120 s) and backed off
        assert states(fleeter)["far"] == "ASSIGNED", "the loop waited for the prepare's reply"
    finally:
        local_gate.touch()
        gate.touch()
    finish(proc)
    far = fleeter.task("far")
    assert far.state.value == "DONE" and far.host == "mini"
    (attempt,) = fleeter.ledger().attempts(far.id)
    assert attempt.shepherd_pid and attempt.workspace["branch"] == far.branch
    assert [(v.kind, v.passed, v.host) for v in fleeter.ledger().verdicts(task_id=far.id)] == [("run", True, "mini")]


def test_the_loop_works_other_tasks_while_a_done_peer_tasks_branch_is_fetched_back(
    fleeter, fake_claude, peer_lab, tmp_path
):
    """A peer task's branch is fetched back as it goes DONE (``host bundle`` there, then
    ``git bundle unbundle`` here) on a worker thread: other tasks go on meanwhile, and the
    task goes DONE once its branch is here."""
    fleeter.make_repo()
    mini = peer_lab.machine("mini")
    # the peer's bundle plan (what to send) waits for the test
    entered, gate = pair_with_held_git(fleeter, mini, tmp_path, "merge-base --end-of-options main")
    local_gate = tmp_path / "local-may-end"
    write_tasks(fleeter, fake_claude, [], local_gate)
    proc = fleeter.popen("tasks.toml")
    try:
        wait_for(entered.exists, "far's branch being fetched back from mini", proc)
        local_gate.touch()
        wait_for(lambda: chain_done(fleeter), f"l0..l{CHAIN} DONE while far's branch is fetched", proc)
        assert states(fleeter)["far"] == "VERIFYING", "the loop waited for the fetch-back"
    finally:
        local_gate.touch()
        gate.touch()
    finish(proc)
    far = fleeter.task("far")
    assert far.state.value == "DONE" and far.host == "mini"
    assert far.handoff and "was fetched from mini" in far.handoff["fetch_hint"], far.handoff
    notes = " ".join(n for _, n in fleeter.ledger().notes(far.id))
    assert f"branch {far.branch} of mini" in notes and "could not fetch" not in notes, notes


def test_the_loop_works_other_tasks_while_a_done_peer_tasks_fetched_worktree_is_removed(
    fleeter, fake_claude, peer_lab, tmp_path
):
    """A DONE peer task's fetched worktree (its branch checked out here) is removed on a
    worker thread: other tasks go on meanwhile, and the note says it once it is gone."""
    fleeter.make_repo()
    mini = peer_lab.machine("mini")
    mini.pair(fleeter)
    # this machine's first git command for removing a fetched worktree (which repository
    # holds it; the removal itself holds the repository's lock, which other tasks' git
    # worktree add would wait for too) waits for the test
    bin_dir, entered, gate = tmp_path / "bin", tmp_path / "git-entered", tmp_path / "git-may-go"
    bin_dir.mkdir()
    (bin_dir / "git").write_text(
        "#!/bin/sh\n"
        f'case " $* " in *-fetched" "*" rev-parse --git-common-dir "*) touch {shlex.quote(str(entered))}; '
        f"while [ ! -e {shlex.quote(str(gate))} ]; do sleep 0.05; done;; esac\n"
        f'exec {shlex.quote(shutil.which("git") or "/usr/bin/git")} "$@"\n'
    )
    (bin_dir / "git").chmod(0o755)
    local_gate = tmp_path / "local-may-end"
    write_tasks(fleeter, fake_claude, [], local_gate)
    proc = fleeter.popen("tasks.toml", env={"PATH": f"{bin_dir}:{os.environ['PATH']}"})
    try:
        wait_for(entered.exists, "far DONE and its fetched worktree being removed", proc)
        assert states(fleeter)["far"] == "DONE"
        local_gate.touch()
        wait_for(lambda: chain_done(fleeter), f"l0..l{CHAIN} DONE while far's fetched worktree is removed", proc)
    finally:
        local_gate.touch()
        gate.touch()
    finish(proc)  # the run waits for the removal before it ends
    far = fleeter.task("far")
    notes = [n for _, n in fleeter.ledger().notes(far.id)]
    assert any(n.startswith("removed the fetched worktree ") for n in notes), notes


def test_the_loop_works_other_tasks_while_a_collected_peer_tasks_branch_is_fetched_back(
    fleeter, fake_claude, peer_lab, tmp_path
):
    """A peer task with dependents has its branch fetched back as soon as its work is
    collected (a dependent may run here): on a worker thread, as the handoff's
    fetch-back, so that no pass waits on a peer's bundle; other tasks go on meanwhile,
    and the task goes on to VERIFYING once its branch is here."""
    fleeter.make_repo()
    mini = peer_lab.machine("mini")
    # the peer's bundle plan (what to send) waits for the test
    entered, gate = pair_with_held_git(fleeter, mini, tmp_path, "merge-base --end-of-options main")
    local_gate = tmp_path / "local-may-end"
    after = """
        [[task]]
        name = "after"
        cwd = "repo"
        prompt = "p"
        git_ref = "main"
        peer = "local"
        depends_on = ["far"]
    """
    write_tasks(fleeter, fake_claude, [], local_gate, more=after)
    fake_claude.script(
        far=[{"actions": [["write", "far.txt", "x"], ["commit", "far"]]}],
        after=[{"actions": [["write", "after.txt", "x"], ["commit", "after"]]}],
        l0=[{"actions": [hold(local_gate), ["write", "l0.txt", "x"], ["commit", "l0"]]}],
        **{f"l{i}": [{"actions": [["write", f"l{i}.txt", "x"], ["commit", f"l{i}"]]}] for i in range(1, CHAIN + 1)},
    )
    proc = fleeter.popen("tasks.toml")
    try:
        wait_for(entered.exists, "far's branch being fetched back from mini", proc)
        local_gate.touch()
        wait_for(lambda: chain_done(fleeter), f"l0..l{CHAIN} DONE while far's branch is fetched", proc)
        # a loop that waited for the bundle would have worked nothing meanwhile
        assert states(fleeter)["far"] == "RUNNING", "the loop waited for the fetch-back"
    finally:
        local_gate.touch()
        gate.touch()
    finish(proc)
    far = fleeter.task("far")
    assert far.state.value == "DONE" and fleeter.task("after").state.value == "DONE"
    notes = " ".join(n for _, n in fleeter.ledger().notes(far.id))
    assert f"branch {far.branch} of mini" in notes and "could not fetch" not in notes, notes

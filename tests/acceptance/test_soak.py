"""The chaos soak, bounded (issue 21; ``bench/soak.py`` is the long one): 30 tasks with
dependencies (some ``base = "dependencies"``), retries, reviewers, malformed agent
output and known costs, under random SIGKILLs of the supervisor and of shepherds and a
full home disk for a while (when a tmpfs can be mounted); local only (the bench adds
peers in network namespaces). No invariant may break: see
:func:`soakrun.check` for the list. ``FLEETRUN_TEST_SEED=N`` replays one seed; ``-s``
prints the counts."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Optional

from soakrun import Soak, SoakOptions, kill_orphans

from .test_crash_points import _no_strays  # noqa: F401

pytest_plugins = ["sshd"]

SEED = int(os.environ.get("FLEETRUN_TEST_SEED") or 21)


def small_home(fleeter, tmp_path: Path, size: str) -> Optional[str]:
    """Put the home on a tmpfs of ``size``: :return: None, or why it could not be."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    try:
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(mnt)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError) as e:
        return f"cannot mount a tmpfs: {e}"
    if r.returncode != 0:
        return "cannot mount a tmpfs (needs root): " + (r.stderr.strip() or f"exit {r.returncode}")
    fleeter.home = mnt / "h"
    fleeter.monkeypatch.setenv("FLEETRUN_HOME", str(fleeter.home))
    return None


def unmount(tmp_path: Path) -> None:
    mnt = tmp_path / "small"
    if os.path.ismount(mnt):
        kill_orphans(tmp_path)  # nothing may hold the mount
        if subprocess.run(["umount", str(mnt)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def queue_one_task(fleeter, fake_claude, peer: Optional[str] = None) -> None:
    """Queue t1: its agent writes and commits out.txt, its verifier looks for it."""
    pin = f'\n        peer = "{peer}"' if peer else ""
    fleeter.write_tasks(f'''
        [[task]]
        name = "t1"
        cwd = "repo"
        prompt = "Write out.txt."
        git_ref = "main"{pin}
          [[task.verify]]
          run = "test -f out.txt"
    ''')
    fake_claude.script(t1=[{"actions": [["write", "out.txt", "x"], ["commit", "out"]]}])
    assert fleeter.runsub("queue", "tasks.toml").ret == 0


def test_the_queue_survives_chaos(fleeter, fake_claude, tmp_path):
    """Local only: with a peer, a supervisor killed every second spends its runs
    connecting (the first heartbeat) and the queue outlasts a test's minute; the peers
    and their dropped links are the bench's (``bench/soak.py --peers 2``)."""
    why = small_home(fleeter, tmp_path, "64m")
    try:
        opts = SoakOptions(tasks=30, seed=SEED, parallel=3, chatty=1, detach=1, gap=(0.4, 1.5), deadline=120, log=print)
        report = Soak(fleeter, fake_claude, opts, tmp_path, small_disk=why).run()
        print("\n" + "\n".join(report.lines()))
        assert sum(report.kills.values()) >= 3, f"too few blows landed: {report.kills}"
        assert not report.violations, "\n".join(report.lines())
    finally:
        kill_orphans(tmp_path)
        unmount(tmp_path)


# ---------------------------------------------------------------------------------
# what the soak found, each reproduced alone


def test_a_crash_after_a_failed_start_is_recorded_does_not_leave_its_task_assigned(fleeter, fake_claude):
    """Found by the soak (a full disk, then a SIGKILL): the attempt whose workspace could
    not be made is recorded as abandoned (start_failed) in one commit, the task's move
    back in the next. A crash between the two left the task ASSIGNED with no attempt in
    flight: the restarted loop never moved it again, counted it as a running task of
    its machine, and `work --until-idle` ended with it ASSIGNED."""
    fleeter.make_repo()
    fleeter.write_tasks("""
        [[task]]
        name = "t1"
        cwd = "repo"
        prompt = "Write out.txt."
        git_ref = "main"
          [[task.verify]]
          run = "test -f out.txt"
    """)
    flag = fleeter.path.parent / "failed-once"
    fleeter.write_fleetconf(
        f"""
        import errno, os
        import fleetrun

        @fleetrun.hookimpl(tryfirst=True)
        def fleetrun_prepare_workspace(task, attempt, config):
            if not os.path.exists({str(flag)!r}):
                open({str(flag)!r}, "w").close()
                raise OSError(errno.ENOSPC, "No space left on device")
    """,
        folder=".",
    )
    fake_claude.script(t1=[{"actions": [["write", "out.txt", "x"], ["commit", "out"]]}])
    assert fleeter.runsub("queue", "tasks.toml").ret == 0
    # the first READY of this run is the move back after the failed start: die before it
    r = fleeter.runsub("work", "--until-idle", env={"FLEETRUN_CRASH_AT": "before_transition:READY"}, timeout=120)
    assert r.ret == 86, r.stdout + r.stderr
    led = fleeter.ledger()
    t = fleeter.task("t1")
    assert t.state.value == "ASSIGNED"
    (att,) = led.attempts(t.id)
    if att.state == "leased":
        # the failed start's record and the move back share the pass's commit (one
        # commit a pass), lost with it; a batch that held the lock past its bound commits
        # the record alone: the state this test is about, written as that commit would
        led.update_attempt(att.id, state="abandoned", outcome="start_failed", ended=time.time())
    assert [(a.state, a.outcome) for a in led.attempts(t.id)] == [("abandoned", "start_failed")]
    r = fleeter.runsub("work", "--until-idle", timeout=120)
    assert r.ret == 0, r.stdout + r.stderr
    assert fleeter.task("t1").state.value == "DONE", r.stdout + r.stderr
    assert len(fake_claude.calls("t1")) == 1


def test_a_shepherd_that_cannot_record_its_start_is_not_a_session_that_died(fleeter, fake_claude):
    """Found by the soak (the home's disk full as a shepherd started): a shepherd that
    cannot write its first status.json runs nothing and exits. The loop took that for a
    session that died: the task spent a resume (three send it to a human) though no
    agent ran. It is an attempt that did not start: the task backs off and starts again,
    its resumes untouched. (A status.json that is a folder stands in for the full disk:
    the shepherd's write fails the same way, every time.)"""
    fleeter.make_repo()
    fleeter.write_tasks("""
        [[task]]
        name = "t1"
        cwd = "repo"
        prompt = "Write out.txt."
        git_ref = "main"
          [[task.verify]]
          run = "test -f out.txt"
    """)
    fleeter.write_fleetconf(
        """
        import os
        import fleetrun

        @fleetrun.hookimpl(tryfirst=True)
        def fleetrun_spawn(task, attempt, workspace, prompt, config):
            if attempt.number == 1:  # its shepherd will find no way to write its status
                os.makedirs(os.path.join(os.environ["FLEETRUN_HOME"], "attempts", attempt.id, "status.json"))
    """,
        folder=".",
    )
    fake_claude.script(t1=[{"actions": [["write", "out.txt", "x"], ["commit", "out"]]}])
    r = fleeter.runsub("tasks.toml", timeout=120)
    assert r.ret == 0, r.stdout + r.stderr
    t = fleeter.task("t1")
    assert t.state.value == "DONE"
    causes = [r.cause for r in fleeter.ledger().transitions(t.id)]
    assert not any(c.startswith("session_died") for c in causes), causes
    assert t.resumes == 0, causes
    assert any(c.startswith("start_failed") for c in causes), causes
    assert len(fake_claude.calls("t1")) == 1


def test_a_dependent_whose_first_start_failed_half_way_still_gets_its_dependencies(fleeter, fake_claude):
    """Found by the soak, eleven times in a 300-task run: the home's disk filled while
    ``git worktree add -b`` made a dependent's worktree (``start_failed:fatal: could not
    write to …``, or ``error: unable to write file`` at its checkout). git had made the
    branch; the next attempt found it, took it for a branch it need not build, and
    merged nothing: a DONE ``base = "dependencies"`` task without its dependency's
    work. (The hook stands in for that git run: it makes the branch, then fails as the
    full disk did.)"""
    repo = fleeter.make_repo()
    fleeter.write_tasks("""
        [[task]]
        name = "schema"
        cwd = "repo"
        prompt = "Write schema.sql."
        git_ref = "main"

        [[task]]
        name = "api"
        cwd = "repo"
        prompt = "Write api.py."
        git_ref = "main"
        depends_on = ["schema"]
        base = "dependencies"
    """)
    flag = fleeter.path.parent / "failed-once"
    fleeter.write_fleetconf(
        f"""
        import errno, os, subprocess
        import fleetrun

        @fleetrun.hookimpl(tryfirst=True)
        def fleetrun_prepare_workspace(task, attempt, config):
            if task.name == "api" and not os.path.exists({str(flag)!r}):
                open({str(flag)!r}, "w").close()
                subprocess.run(["git", "-C", {str(repo)!r}, "branch", f"fleetrun/api-{{task.id}}", "main"],
                               check=True)
                raise OSError(errno.ENOSPC, "No space left on device")
    """,
        folder=".",
    )
    fake_claude.script(
        schema=[{"actions": [["write", "schema.sql", "x"], ["commit", "schema"]]}],
        api=[{"actions": [["write", "api.py", "x"], ["commit", "api"]]}],
    )
    r = fleeter.runsub("tasks.toml", timeout=120)
    assert r.ret == 0, r.stdout + r.stderr
    schema, api = fleeter.task("schema"), fleeter.task("api")
    assert api.state.value == "DONE"
    assert "start_failed:[Errno 28] No space left on device" in [t.cause for t in fleeter.ledger().transitions(api.id)]
    head = fleeter.git(repo, "rev-parse", schema.branch).strip()
    merged = subprocess.run(["git", "-C", str(repo), "merge-base", "--is-ancestor", head, api.branch]).returncode
    assert merged == 0, f"{api.branch} is DONE without {schema.branch} ({head[:12]}) merged in"


def test_a_done_peer_tasks_worktree_is_removed_after_a_crash_before_its_cleanup(fleeter, fake_claude, peer_lab):
    """Found by the soak with peers (five times in 300 tasks): a peer task went DONE,
    the supervisor was killed before it sent the peer the worktree's cleanup (sent as
    the loop's pass ends), and the restarted supervisor never sent it: the clean
    worktree stays on the peer for good. A local task's is removed by adoption."""
    repo = fleeter.make_repo()
    mini = peer_lab.private_machine("mini", repo)
    mini.pair(fleeter)
    queue_one_task(fleeter, fake_claude, peer="mini")
    r = fleeter.runsub("work", "--until-idle", env={"FLEETRUN_CRASH_AT": "after_transition:DONE"}, timeout=120)
    assert r.ret == 86, r.stdout + r.stderr
    t = fleeter.task("t1")
    assert t.state.value == "DONE" and t.host == "mini"
    assert t.worktree and os.path.exists(t.worktree), "the crash came before the cleanup: the worktree is there"
    r = fleeter.runsub("work", "--until-idle", timeout=120)
    assert r.ret == 0, r.stdout + r.stderr
    assert not os.path.exists(t.worktree), f"{t.worktree} is still on the peer: {r.stdout}"


def test_a_task_left_assigned_with_its_attempt_ended_moves_on(fleeter, fake_claude):
    """Found by the long soak with peers (a task stuck for good, `work --until-idle`
    never ending): a task ASSIGNED whose latest attempt is recorded as ended. The
    attempt's start was never confirmed (a supervisor killed before RUNNING; the peer's
    reply lost with its link) and its end was recorded by a later poll, whose move of the
    task expects RUNNING. Here the state is made as it was found: the crash before
    RUNNING, the agent's end, its record. The end of an attempt whose start was never
    confirmed is the task's end all the same: the task goes RUNNING (adopted), then on."""
    import sqlite3

    fleeter.make_repo()
    queue_one_task(fleeter, fake_claude)
    r = fleeter.runsub("work", "--until-idle", env={"FLEETRUN_CRASH_AT": "before_transition:RUNNING"})
    assert r.ret == 86, r.stdout + r.stderr
    (att,) = fleeter.ledger().attempts(fleeter.task("t1").id)
    assert (att.state, fleeter.task("t1").state.value) == ("starting", "ASSIGNED")
    status = fleeter.home / "attempts" / att.id / "status.json"
    deadline = time.monotonic() + 120
    while '"ended"' not in (status.read_text() if status.exists() else ""):  # it ran to its end
        assert time.monotonic() < deadline, "the attempt never ended"
        time.sleep(0.1)
    conn = sqlite3.connect(str(fleeter.home / "state.db"))
    with conn:  # its end recorded, as the poll that found it does; the task still ASSIGNED
        conn.execute(
            "UPDATE attempts SET state='ended', exit_code=0, outcome='ok', ended=? WHERE id=?", (time.time(), att.id)
        )
    conn.close()
    r = fleeter.runsub("work", "--until-idle", timeout=120)
    assert r.ret == 0, r.stdout + r.stderr
    task = fleeter.task("t1")
    assert task.state.value == "DONE", [t.cause for t in fleeter.ledger().transitions(task.id)]
    assert len(fake_claude.calls("t1")) == 1  # it ran once


SILENT_BAY = '''
from pathlib import Path

import fleetrun
from fleetrun.hosts import LocalHost


class SilentBay(LocalHost):
    """This machine under the name bay, whose status does not come while bay-silent
    exists (a peer whose link is down, or not connected yet after a restart)."""

    def candidate(self, config):
        return fleetrun.Candidate(name="bay", kind="peer", status="live", running=0, max_tasks=2,
                                  free_mem_mb=100000.0)

    def status(self, attempt_id, pid, token):
        here = Path(__file__).parent
        if (here / "bay-silent").exists():
            (here / "bay-asked").touch()
            return {"state": "unreachable", "error": "bay: the link is down"}
        return super().status(attempt_id, pid, token)


@fleetrun.hookimpl
def fleetrun_hosts(config):
    return [SilentBay(config.home, name="bay", root=config.home / "bay")]
'''


def test_an_end_recorded_before_a_crash_is_decided_from_the_record_not_a_silent_host(fleeter, fake_claude):
    """Found by the long soak with peers (four tasks to a human, each after three
    sessions that had all ended well): the supervisor recorded an attempt's end, was
    killed before the task's move after it, and came back while the peer could not be
    reached. The restart asked the host again; `unreachable` was read as a shepherd
    that died, and an attempt that exited 0 became `session_died:died`, resumed, up to
    resume_cap. The end is decided from what was recorded."""
    fleeter.make_repo()
    fleeter.write_fleetconf(SILENT_BAY)
    queue_one_task(fleeter, fake_claude, peer="bay")
    r = fleeter.runsub("work", "--until-idle", env={"FLEETRUN_CRASH_AT": "before_transition:VERIFYING"})
    assert r.ret == 86, r.stdout + r.stderr
    task = fleeter.task("t1")
    (att,) = fleeter.ledger().attempts(task.id)
    assert (task.state.value, att.state, att.outcome) == ("RUNNING", "ended", "ok")
    silent = fleeter.path / "bay-silent"
    silent.touch()  # the restart cannot reach bay, at first
    proc = fleeter.popen("work", "--until-idle")
    try:
        deadline = time.monotonic() + 120
        # until the restart has asked bay (on the code before, its adoption did), or ended
        # without needing to
        while not (fleeter.path / "bay-asked").exists() and proc.poll() is None:
            assert time.monotonic() < deadline, "the restart neither asked bay nor ended"
            time.sleep(0.05)
        silent.unlink()
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, out.decode() + err.decode()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    causes = [t.cause for t in fleeter.ledger().transitions(task.id)]
    assert fleeter.task("t1").state.value == "DONE", causes
    assert not any(c.startswith("session_died") for c in causes), causes
    assert len(fake_claude.calls("t1")) == 1

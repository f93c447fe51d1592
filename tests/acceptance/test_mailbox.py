"""The mailbox end to end (docs/mailbox.md): real processes stand in for role sessions
(a long-running fake ``claude`` whose cwd is the role's folder, bound ``sleep``
processes); the Stop hook is run exactly as Claude Code runs it (the fake runs the
hooks of the role folder's ``.claude/settings.local.json``: JSON on stdin, the decision
on stdout)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

import pytest

from fleetrun.crash import CRASH_EXIT
from fleetrun.plugins.mailbox import store

from .test_crash_points import kill_leftovers

FAKE = Path(__file__).parent.parent / "fakes" / "claude"
PREFIX = shlex.join([sys.executable, "-m", "fleetrun"])  # what the hook tells the session to run


@pytest.fixture(autouse=True)
def _no_strays(tmp_path: Path):
    yield
    kill_leftovers(tmp_path)


def wait_for(what: Callable[[], Any], timeout: float = 120.0, why: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = what()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {why or what}")
        time.sleep(0.1)


def message(fleeter: Any, task_name: str) -> Optional[store.Message]:
    t = fleeter.ledger().find(task_name)
    if t is None:
        return None
    conn = store.connect(str(fleeter.home / "state.db"))
    try:
        return store.message_of_task(conn, t.id)
    finally:
        conn.close()


def messages(fleeter: Any) -> list[tuple[str, str]]:
    conn = store.connect(str(fleeter.home / "state.db"))
    try:
        return [(r["task_id"], r["state"]) for r in conn.execute("SELECT * FROM mailbox_messages ORDER BY id")]
    finally:
        conn.close()


def causes(fleeter: Any, name: str) -> list[str]:
    return [r.cause for r in fleeter.ledger().transitions(fleeter.task(name).id)]


def role_dir(fleeter: Any, rel: str = "proj") -> Path:
    d = fleeter.path / rel
    d.mkdir(parents=True, exist_ok=True)
    return d


def install_stop_hook(folder: Path, command: str = PREFIX) -> None:
    """What ``role install-hooks`` writes: the Stop hook, and the allow rules that let the
    session report back in -p mode (measured: they count in settings.local.json)."""
    (folder / ".claude").mkdir(exist_ok=True)
    (folder / ".claude" / "settings.local.json").write_text(
        json.dumps(
            {
                "hooks": {"Stop": [{"hooks": [{"type": "command", "command": f"{command} mailbox stop-hook"}]}]},
                "permissions": {"allow": [f"Bash({command} mailbox done:*)", f"Bash({command} mailbox fail:*)"]},
            }
        )
    )


def finish(proc: subprocess.Popen[bytes], timeout: float = 60.0) -> tuple[int, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"fleetrun did not end:\n{out.decode()}\n{err.decode()}") from None
    return proc.returncode, out.decode() + err.decode()


def report_from(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``fleetrun ARGS`` run in ``folder`` (a person at a terminal there): it answers to
    the role bound over that folder, when that role is bound to no running process."""
    return subprocess.run(
        [sys.executable, "-m", "fleetrun", *args],
        cwd=str(folder),
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


class Standin:
    """A role's session stood in for by a shell (bind the role to :attr:`pid`): the
    commands it is given run as its children, so they answer to the role, as the
    commands of a session's Bash tool do."""

    def __init__(self, where: Path) -> None:
        self.where = where
        self.n = 0
        self.proc = subprocess.Popen(["sh"], stdin=subprocess.PIPE, cwd=str(where))
        self.pid = self.proc.pid

    def run(self, *args: str) -> tuple[int, str]:
        self.n += 1
        out, rc = self.where / f"standin.{self.n}.out", self.where / f"standin.{self.n}.rc"
        assert self.proc.stdin is not None
        self.proc.stdin.write(
            f"{PREFIX} {shlex.join(args)} > {out} 2>&1; echo $? > {rc}.tmp; mv {rc}.tmp {rc}\n".encode()
        )
        self.proc.stdin.flush()
        wait_for(rc.exists, why=f"the stand-in's {args}")
        return int(rc.read_text()), out.read_text()

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        if self.proc.stdin is not None:
            self.proc.stdin.close()


ROLE_TASK = """
    [[task]]
    name = "reconnect"
    cwd = "proj"
    role = "relay"
    prompt = "Reconnect with backoff after a dropped link."
"""


# -- the whole turn ---------------------------------------------------------------------


def test_a_session_ends_its_turn_gets_the_task_from_its_stop_hook_and_reports_it_done(
    fleeter: Any, fake_claude: Any
) -> None:
    proj = role_dir(fleeter)
    # the hook names its home (a session's environment need not have FLEETRUN_HOME): the
    # commands it hands the session start with the same words, so the allow rules match
    command = f"{PREFIX} --home {shlex.quote(str(fleeter.home))}"
    install_stop_hook(proj, command)
    assert fleeter.runsub("role", "bind", "relay", str(proj)).ret == 0
    fleeter.write_tasks(ROLE_TASK)
    run = fleeter.popen("tasks.toml")
    msg = wait_for(lambda: message(fleeter, "reconnect"), why="the delivery")
    assert msg.state == "pending" and msg.why == "role = relay"
    task_id = msg.task_id
    # the session: its first turn ends, the hook blocks with the task, it does it and reports
    fake_claude.script(
        default=[
            {"actions": [["print", "idle"]], "result": "nothing to do"},
            {
                "actions": [
                    ["write", "peer.rs", "backoff"],
                    ["bash", f"{command} mailbox done {task_id} --summary 'reconnects with backoff'"],
                ],
                "result": "reported",
            },
        ]
    )
    env = {k: v for k, v in os.environ.items() if k != "FLEETRUN_HOME"}
    session = subprocess.run(
        [str(FAKE), "-p", "hello", "--permission-mode", "acceptEdits", "--output-format", "stream-json", "--verbose"],
        cwd=str(proj),
        capture_output=True,
        timeout=60,
        env=env,
    )
    assert session.returncode == 0, session.stderr.decode()
    code, out = finish(run)
    assert code == 0, out
    task = fleeter.task("reconnect")
    assert task.state.value == "DONE"
    assert task.spec.role == "relay" and task.host == "local"  # the row keeps what was declared
    assert task.handoff["summary"] == "reconnects with backoff"
    assert (proj / "peer.rs").read_text() == "backoff"
    assert causes(fleeter, "reconnect")[:4] == ["queued", "placed", "assigned_via_mailbox:role = relay", "exited"]
    att = fleeter.ledger().latest_attempt(task.id)
    assert att.host == "mailbox" and att.outcome == "ok"
    # the fake's log: the continuation's prompt is the hook's reason, with the literal id
    calls = [c for c in fake_claude._log() if c.get("continuation")]
    assert len(calls) == 1
    reason = calls[0]["prompt"]
    assert f"{command} mailbox done {task_id} --summary" in reason and "$(" not in reason
    assert f"{command} mailbox fail {task_id} --reason" in reason
    assert "Reconnect with backoff after a dropped link." in reason
    assert messages(fleeter) == [(task_id, "done")]
    assert (
        "role relay reported done: reconnects with backoff" in (fleeter.home / "attempts" / att.id / "log").read_text()
    )
    assert (fleeter.home / "attempts" / att.id / "prompt").read_text().startswith("Reconnect with backoff")
    # a second report of the same task is refused
    late = fleeter.runsub("mailbox", "done", task_id)
    assert late.ret == 4 and "nothing to report" in late.stderr


def test_the_stop_hook_prints_nothing_without_mail_and_never_fails_the_session(fleeter: Any) -> None:
    proj = role_dir(fleeter)
    hook = {
        "session_id": "s",
        "transcript_path": "/x",
        "cwd": str(proj),
        "hook_event_name": "Stop",
        "stop_hook_active": False,
        "last_assistant_message": "done",
    }
    r = fleeter.runsub("mailbox", "stop-hook", input=json.dumps(hook))  # no ledger at all
    assert (r.ret, r.stdout) == (0, "")
    assert fleeter.runsub("role", "bind", "relay", str(proj)).ret == 0
    r = fleeter.runsub("mailbox", "stop-hook", input=json.dumps(hook))
    assert (r.ret, r.stdout) == (0, "")
    r = fleeter.runsub("mailbox", "stop-hook", input="{not json")
    assert (r.ret, r.stdout, r.stderr) == (0, "", "")
    assert "stop-hook" in (fleeter.home / "mailbox-hook.log").read_text()


def test_a_session_bound_with_self_answers_by_its_pid_where_two_roles_share_its_folder(
    fleeter: Any, fake_claude: Any
) -> None:
    proj = role_dir(fleeter)
    install_stop_hook(proj)
    assert fleeter.runsub("role", "bind", "repo", str(proj)).ret == 0
    assert fleeter.runsub("role", "bind", "relay", str(proj)).ret == 0
    fleeter.write_tasks(ROLE_TASK)
    run = fleeter.popen("tasks.toml")
    msg = wait_for(lambda: message(fleeter, "reconnect"), why="the delivery")
    fake_claude.script(
        default=[
            # two roles on its folder: it answers to neither until it binds one to itself
            {
                "actions": [
                    ["bash", f"{PREFIX} role whoami > before.txt; {PREFIX} role bind relay . --self"],
                    ["bash", f"{PREFIX} role whoami > after.txt"],
                ]
            },
            {"actions": [["bash", f"{PREFIX} mailbox done {msg.task_id} --summary bound"]]},
        ]
    )
    session = subprocess.Popen(
        [str(FAKE), "-p", "hello", "--permission-mode", "bypassPermissions"],
        cwd=str(proj),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    _, err = session.communicate(timeout=60)
    assert session.returncode == 0, err.decode()
    assert (proj / "before.txt").read_text().startswith("no role (session ")
    assert (proj / "after.txt").read_text().startswith(f"relay (session {session.pid}: bound to this session")
    code, out = finish(run)
    assert code == 0, out
    assert fleeter.task("reconnect").handoff["summary"] == "bound"
    roles = json.loads(fleeter.runsub("role", "list", "--json").stdout)
    assert [(r["role"], r["pid"], r["live"]) for r in roles] == [("relay", session.pid, False), ("repo", None, False)]


#: The CLI's entry point in a fresh interpreter, then what it imported (as tests/test_startup.py).
PROBE = """
import json, sys
from fleetrun.cli import main
code = main(sys.argv[1:])
sys.stdout.flush()
sys.stderr.write("\\nPROBE " + json.dumps({"code": code, "modules": sorted(sys.modules)}) + "\\n")
"""


def test_note_edit_credits_the_sessions_role_and_never_fails_the_session(fleeter: Any) -> None:
    pytest.importorskip("fleetrun.plugins.mailbox.hookio")  # the install-hooks change's module
    proj = role_dir(fleeter)
    assert fleeter.runsub("role", "bind", "relay", str(proj)).ret == 0
    edit = {
        "session_id": "s",
        "cwd": str(proj),
        "hook_event_name": "PostToolUse",
        "tool_name": "Write",
        "tool_input": {"file_path": "src/a.py", "content": "x"},
        "tool_response": {},
    }
    r = fleeter.runsub("role", "note-edit", input=json.dumps(edit))
    assert (r.ret, r.stdout, r.stderr) == (0, "", "")
    conn = store.connect(str(fleeter.home / "state.db"))
    assert store.edits(conn) == {"relay": [str(proj.resolve() / "src" / "a.py")]}
    conn.close()
    r = fleeter.runsub("role", "note-edit", input="[1, 2")
    assert (r.ret, r.stdout, r.stderr) == (0, "", "")
    assert "note-edit" in (fleeter.home / "mailbox-hook.log").read_text()


def hook_imports(fleeter: Any, cwd: Path) -> tuple[str, list[str]]:
    """What ``mailbox stop-hook`` printed, and the modules it imported."""
    hook = json.dumps({"session_id": "s", "cwd": str(cwd), "hook_event_name": "Stop", "stop_hook_active": False})
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, "mailbox", "stop-hook"],
        input=hook.encode(),
        capture_output=True,
        cwd=str(cwd),
        timeout=60,
    )
    lines = [ln for ln in proc.stderr.decode().splitlines() if ln.startswith("PROBE ")]
    assert proc.returncode == 0 and lines, proc.stderr.decode()
    got = json.loads(lines[-1][len("PROBE ") :])
    assert got["code"] == 0
    return proc.stdout.decode(), got["modules"]


def test_the_stop_hook_loads_no_plugin_and_no_psutil_unless_mail_may_be_its_own(fleeter: Any) -> None:
    proj = role_dir(fleeter)
    other = role_dir(fleeter, "other")
    assert fleeter.runsub("role", "bind", "relay", str(proj)).ret == 0
    assert fleeter.runsub("role", "bind", "docs", str(other)).ret == 0
    conn = store.connect(str(fleeter.home / "state.db"))
    with store.tx(conn) as cur:
        store.deliver(cur, "docs", "task_x_0", "task_x_0_a1", "Write the docs.", "role = docs", time.time())
    out, mods = hook_imports(fleeter, proj)  # mail, but for a role it cannot answer to
    assert out == ""
    assert "fleetrun.plugins.mailbox.stophook" in mods  # the check below means something
    assert not [m for m in mods if m.split(".")[0] == "psutil" or m.startswith("fleetrun.plugins.claude")]
    out, mods = hook_imports(fleeter, other)  # its own mail: claimed, and psutil walked the chain
    assert json.loads(out)["decision"] == "block" and "psutil" in mods
    assert store.message_of_task(conn, "task_x_0").state == "claimed"
    conn.close()


def test_installed_hooks_credit_edits_and_focus_routes_between_two_roles_on_one_folder(
    fleeter: Any, fake_claude: Any
) -> None:
    settings = pytest.importorskip("fleetrun.plugins.mailbox.settings")  # the install-hooks change's module
    proj = role_dir(fleeter)
    role_dir(fleeter, "proj/src/relay")
    command = settings.default_command(fleeter.home)
    r = fleeter.runsub("role", "install-hooks", str(proj))
    assert r.ret == 0 and "settings.local.json" in r.stdout
    assert command in (proj / ".claude" / "settings.local.json").read_text()
    other = subprocess.Popen(["sleep", "120"])  # a second live role on the same folder
    try:
        assert fleeter.runsub("role", "bind", "repo", str(proj), "--pid", str(other.pid)).ret == 0
        fleeter.write_tasks("""
            [[task]]
            name = "peer"
            cwd = "proj"
            paths = ["src/relay/peer.rs"]
            prompt = "Reconnect."
        """)
        fake_claude.script(
            default=[
                {
                    "actions": [
                        ["bash", f"{command} role bind relay . --self"],
                        ["write", "src/relay/a.rs", "a"],
                        ["write", "src/relay/b.rs", "b"],
                        ["bash", "until test -f go; do sleep 0.1; done"],
                    ]
                },
                {"actions": [["bash", f"{command} mailbox done TASK --summary focused"]]},
            ]
        )
        session = subprocess.Popen(
            [str(FAKE), "-p", "hello", "--permission-mode", "bypassPermissions"],
            cwd=str(proj),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        relay_focus = str((proj / "src" / "relay").resolve())

        def focus_of_relay() -> bool:
            rows = json.loads(fleeter.runsub("role", "list", "--json").stdout)
            return any(r["role"] == "relay" and r["focus"] == relay_focus and r["live"] for r in rows)

        wait_for(focus_of_relay, why="the session's edits credited to relay")
        fleeter.write_policy("auto_route = true\n")
        run = fleeter.popen("tasks.toml")
        msg = wait_for(lambda: message(fleeter, "peer"), why="the delivery")
        assert msg.role == "relay" and msg.why == f"relay owns src/relay/peer.rs (its focus {relay_focus})"
        # the session's next step reports the task it was given (the id is known only now)
        fake_claude.script(
            default=[
                {
                    "actions": [
                        ["bash", f"{command} role bind relay . --self"],
                        ["write", "src/relay/a.rs", "a"],
                        ["write", "src/relay/b.rs", "b"],
                        ["bash", "until test -f go; do sleep 0.1; done"],
                    ]
                },
                {"actions": [["bash", f"{command} mailbox done {msg.task_id} --summary focused"]]},
            ]
        )
        (proj / "go").write_text("")
        _, err = session.communicate(timeout=60)
        assert session.returncode == 0, err.decode()
        code, out = finish(run)
        assert code == 0, out
        assert fleeter.task("peer").handoff["summary"] == "focused"
    finally:
        other.kill()
        other.wait()
    assert "note-edit" in (fleeter.runsub("role", "install-hooks", str(proj), "--remove").stdout)


# -- fleetrun's own sessions ------------------------------------------------------------


def test_a_session_fleetrun_spawned_in_a_roles_folder_takes_no_mail_and_earns_the_role_no_focus(
    fleeter: Any, fake_claude: Any
) -> None:
    proj = role_dir(fleeter)
    assert fleeter.runsub("role", "install-hooks", str(proj)).ret == 0  # the Stop and PostToolUse hooks
    assert fleeter.runsub("role", "bind", "relay", str(proj)).ret == 0
    go = fleeter.path / "go"
    whoami = fleeter.path / "whoami.txt"
    fleeter.write_tasks(
        ROLE_TASK
        + """
    [[task]]
    name = "tidy"
    cwd = "proj"
    prompt = "Tidy up."
    permission_mode = "bypassPermissions"
    """
    )
    # a task without a worktree: fleetrun spawns its session in the role's folder, where
    # the role's hooks are; its turn ends only once the role's mail waits
    fake_claude.script(
        tidy=[
            {
                "actions": [
                    ["bash", f"until test -f {go}; do sleep 0.1; done"],
                    ["write", "tidy.txt", "tidied"],
                    ["bash", f"{PREFIX} role whoami > {whoami}"],
                    # its own variable taken out: its session's still says whose it is
                    ["bash", f"env -u FLEETRUN_TASK_ID {PREFIX} role whoami > {whoami}.2"],
                    # nor does it report the role's task, or bind itself a role
                    ["bash", f"{PREFIX} mailbox done reconnect > {whoami}.done 2>&1"],
                    ["bash", f"{PREFIX} role bind tidy . --self > {whoami}.bind 2>&1"],
                ],
                "result": "tidied",
            }
        ]
    )
    run = fleeter.popen("tasks.toml")
    msg = wait_for(lambda: message(fleeter, "reconnect"), why="the delivery")
    go.write_text("")
    wait_for(lambda: fleeter.states().get("tidy") == "DONE", why="tidy DONE")
    assert (proj / "tidy.txt").read_text() == "tidied"
    # its Stop hook claimed nothing: the role's mail still waits for the role
    assert message(fleeter, "reconnect").state == "pending"
    assert len(fake_claude.calls("tidy")) == 1
    assert [c for c in fake_claude._log() if c.get("continuation")] == []
    # it answers to no role, and its edit is not the role's
    tidy_id = fleeter.task("tidy").id
    assert (
        whoami.read_text().startswith("no role (")
        and f"fleetrun started it for task {tidy_id}, and its own sessions answer to no role" in whoami.read_text()
    )
    assert f"fleetrun started it for task {tidy_id}" in Path(f"{whoami}.2").read_text()
    assert "only a session of role relay may report it" in Path(f"{whoami}.done").read_text()
    assert f"fleetrun started this session for task {tidy_id}" in Path(f"{whoami}.bind").read_text()
    assert [r["role"] for r in json.loads(fleeter.runsub("role", "list", "--json").stdout)] == ["relay"]
    conn = store.connect(str(fleeter.home / "state.db"))
    try:
        assert store.edits(conn) == {}
    finally:
        conn.close()
    assert fleeter.runsub("cancel", msg.task_id).ret == 0
    finish(run)


def test_only_a_session_of_the_role_a_task_was_delivered_to_may_report_it(fleeter: Any, fake_claude: Any) -> None:
    ra, rb = role_dir(fleeter, "ra"), role_dir(fleeter, "rb")
    for folder in (ra, rb):
        install_stop_hook(folder)
    assert fleeter.runsub("role", "bind", "ra", str(ra)).ret == 0
    assert fleeter.runsub("role", "bind", "rb", str(rb)).ret == 0
    fleeter.write_tasks(ROLE_TASK.replace('cwd = "proj"', 'cwd = "rb"').replace('"relay"', '"rb"'))
    run = fleeter.popen("tasks.toml")
    msg = wait_for(lambda: message(fleeter, "reconnect"), why="the delivery")
    out, rc = fleeter.path / "forged.txt", fleeter.path / "forged.rc"
    fake_claude.script(
        default=[
            # role ra's session reports role rb's task, still pending, as done
            {
                "actions": [
                    ["bash", f"{PREFIX} mailbox done {msg.task_id} --summary forged > {out} 2>&1; echo $? > {rc}"],
                    ["bash", f"{PREFIX} mailbox read --role rb > {out}.read 2>&1; echo $? > {rc}.read"],
                ]
            },
            # role rb's session: its turn ends, its Stop hook hands it the task, it reports
            {"actions": [["print", "idle"]]},
            {"actions": [["bash", f"{PREFIX} mailbox done {msg.task_id} --summary 'done by rb'"]]},
        ]
    )

    def session(folder: Path) -> None:
        proc = subprocess.run(
            [str(FAKE), "-p", "hello", "--permission-mode", "bypassPermissions"],
            cwd=str(folder),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr.decode()

    session(ra)
    assert rc.read_text().strip() == "4"
    assert f"task {msg.task_id} was delivered to role rb, and this session answers to role ra" in out.read_text()
    # nor may it claim role rb's mail (a claim hands the task over)
    assert Path(f"{rc}.read").read_text().strip() == "4"
    assert "this session answers to role ra, not to role rb" in Path(f"{out}.read").read_text()
    assert message(fleeter, "reconnect").state == "pending"  # refused: nothing moved
    assert fleeter.states() == {"reconnect": "RUNNING"}
    session(rb)
    code, output = finish(run)
    assert code == 0, output
    task = fleeter.task("reconnect")
    assert task.state.value == "DONE" and task.handoff["summary"] == "done by rb"
    assert message(fleeter, "reconnect").state == "done"


# -- routing ----------------------------------------------------------------------------


def test_auto_route_is_read_every_pass_while_work_runs(fleeter: Any, fake_claude: Any) -> None:
    proj = role_dir(fleeter)
    relay_dir = role_dir(fleeter, "proj/src/relay")
    home_proc = Standin(fleeter.path)  # the relay session's stand-in, pid-bound
    try:
        assert fleeter.runsub("role", "bind", "relay", str(relay_dir), "--pid", str(home_proc.pid)).ret == 0
        assert fleeter.runsub("role", "bind", "repo", str(proj)).ret == 0
        fleeter.write_policy("auto_route = false\n")
        work = fleeter.popen("work")
        task = """
            [[task]]
            name = "{name}"
            cwd = "proj"
            paths = ["src/relay/peer.rs"]
            prompt = "Reconnect."
        """
        fleeter.write_tasks(task.format(name="off"), name="off.toml")
        assert fleeter.runsub("queue", "off.toml").ret == 0
        wait_for(lambda: fleeter.states().get("off") == "DONE", why="off spawned and DONE")
        assert len(fake_claude.calls("off")) == 1 and message(fleeter, "off") is None

        fleeter.write_policy("auto_route = true\n")
        fleeter.write_tasks(task.format(name="on"), name="on.toml")
        assert fleeter.runsub("queue", "on.toml").ret == 0
        msg = wait_for(lambda: message(fleeter, "on"), why="on delivered")
        assert msg.role == "relay" and msg.why == "relay owns src/relay/peer.rs"
        owner = fleeter.runsub("role", "owner", "proj/src/relay/peer.rs")
        assert owner.ret == 0 and owner.stdout.strip() == "relay owns proj/src/relay/peer.rs"
        assert home_proc.run("mailbox", "done", msg.task_id, "--summary", "ok")[0] == 0
        wait_for(lambda: fleeter.states().get("on") == "DONE", why="on DONE")
        assert "assigned_via_mailbox:relay owns src/relay/peer.rs" in causes(fleeter, "on")
        assert fake_claude.calls("on") == []

        fleeter.write_policy("auto_route = false\n")
        fleeter.write_tasks(task.format(name="off-again"), name="again.toml")
        assert fleeter.runsub("queue", "again.toml").ret == 0
        wait_for(lambda: fleeter.states().get("off-again") == "DONE", why="spawned again")
        assert message(fleeter, "off-again") is None
        work.terminate()
        finish(work)
    finally:
        home_proc.stop()


def test_a_task_that_asks_for_what_a_mailbox_cannot_carry_is_spawned(fleeter: Any, fake_claude: Any) -> None:
    proj = role_dir(fleeter)
    assert fleeter.runsub("role", "bind", "relay", str(proj)).ret == 0
    fleeter.write_tasks("""
        [[task]]
        name = "verified"
        cwd = "proj"
        role = "relay"
        prompt = "Do it."
          [[task.verify]]
          run = "true"
    """)
    r = fleeter.runsub("tasks.toml", timeout=60)
    assert r.ret == 0, r.stdout + r.stderr
    assert len(fake_claude.calls("verified")) == 1 and message(fleeter, "verified") is None


# -- claim timeout, claimed without a report, failure, cancel --------------------------


def test_unclaimed_past_the_claim_timeout_it_is_withdrawn_and_spawned_but_not_while_a_session_is_home(
    fleeter: Any, fake_claude: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = fleeter.path / "clock"
    clock.write_text("0")
    monkeypatch.setenv("FLEETRUN_TEST_CLOCK", str(clock))
    proj = role_dir(fleeter)
    home_proc = subprocess.Popen(["sleep", "120"])
    try:
        assert fleeter.runsub("role", "bind", "relay", str(proj), "--pid", str(home_proc.pid)).ret == 0
        fleeter.write_policy("claim_timeout_secs = 60\n")
        fleeter.write_tasks(ROLE_TASK)
        run = fleeter.popen("tasks.toml")
        wait_for(lambda: message(fleeter, "reconnect"), why="the delivery")
        clock.write_text("600")  # ten minutes later, but the role's process is home: it waits
        time.sleep(3)
        assert message(fleeter, "reconnect").state == "pending"
        assert fleeter.states() == {"reconnect": "RUNNING"}
    finally:
        home_proc.kill()
        home_proc.wait()
    code, out = finish(run)  # nobody home now: withdrawn, spawned, DONE
    assert code == 0, out
    msg = message(fleeter, "reconnect")
    assert msg.state == "withdrawn" and msg.reason.startswith("unclaimed: role relay did not claim it in 60s")
    calls = fake_claude.calls("reconnect")
    assert len(calls) == 1 and "it waited in a role's mailbox and no session took it" in calls[0]["prompt"]
    assert [c for c in causes(fleeter, "reconnect") if c.startswith("mailbox_unclaimed:")]
    late = fleeter.runsub("mailbox", "done", msg.task_id)  # the role cannot pick it up later
    assert late.ret == 4 and "withdrawn" in late.stderr


def test_claimed_and_never_reported_by_its_timeout_needs_a_human(fleeter: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = fleeter.path / "clock"
    clock.write_text("0")
    monkeypatch.setenv("FLEETRUN_TEST_CLOCK", str(clock))
    proj = role_dir(fleeter)
    assert fleeter.runsub("role", "bind", "relay", str(proj)).ret == 0
    fleeter.write_tasks(ROLE_TASK + "    timeout_min = 5\n")
    run = fleeter.popen("tasks.toml")
    wait_for(lambda: message(fleeter, "reconnect"), why="the delivery")
    read = fleeter.runsub("mailbox", "read", "--role", "relay")
    assert read.ret == 0 and "Reconnect with backoff" in read.stdout and "mailbox done task_" in read.stdout
    assert message(fleeter, "reconnect").state == "claimed"
    clock.write_text(str(6 * 60))
    code, out = finish(run)
    assert code == 1, out
    assert fleeter.task("reconnect").reason == "mailbox_claimed_no_completion"


def test_a_reported_failure_needs_a_human_with_the_reason(fleeter: Any) -> None:
    proj = role_dir(fleeter)
    assert fleeter.runsub("role", "bind", "relay", str(proj)).ret == 0
    fleeter.write_tasks(ROLE_TASK)
    run = fleeter.popen("tasks.toml")
    msg = wait_for(lambda: message(fleeter, "reconnect"), why="the delivery")
    assert report_from(proj, "mailbox", "fail", msg.task_id, "--reason", "not my module").returncode == 0
    code, out = finish(run)
    assert code == 1, out
    assert fleeter.task("reconnect").reason == "mailbox_failed:not my module"


def test_cancel_withdraws_the_message(fleeter: Any) -> None:
    proj = role_dir(fleeter)
    assert fleeter.runsub("role", "bind", "relay", str(proj)).ret == 0
    fleeter.write_tasks(ROLE_TASK)
    run = fleeter.popen("tasks.toml")
    msg = wait_for(lambda: message(fleeter, "reconnect"), why="the delivery")
    assert fleeter.runsub("cancel", msg.task_id).ret == 0
    finish(run)
    assert message(fleeter, "reconnect").state == "withdrawn"
    r = fleeter.runsub("mailbox", "read", "--role", "relay")
    assert r.ret == 0 and "no mail for role relay" in r.stdout


# -- a crash between delivery and claim ----------------------------------------------


@pytest.mark.parametrize("point", ["after_delivery", "after_shepherd_start"])
def test_a_crash_between_delivery_and_claim_delivers_nothing_twice_and_loses_nothing(fleeter: Any, point: str) -> None:
    proj = role_dir(fleeter)
    assert fleeter.runsub("role", "bind", "relay", str(proj)).ret == 0
    fleeter.write_tasks(ROLE_TASK)
    crashed = fleeter.runsub("tasks.toml", env={"FLEETRUN_CRASH_AT": point}, timeout=60)
    assert crashed.ret == CRASH_EXIT, crashed.stdout + crashed.stderr
    msg = message(fleeter, "reconnect")
    assert msg is not None and msg.state == "pending"
    # the role claims it while no supervisor runs
    assert fleeter.runsub("mailbox", "read", "--role", "relay").ret == 0
    run = fleeter.popen("work", "--until-idle")
    wait_for(lambda: fleeter.states() == {"reconnect": "RUNNING"}, why="adopted")
    assert report_from(proj, "mailbox", "done", msg.task_id, "--summary", "after the crash").returncode == 0
    code, out = finish(run)
    assert code == 0, out
    assert fleeter.states() == {"reconnect": "DONE"}
    assert messages(fleeter) == [(msg.task_id, "done")]
    assert len(fleeter.ledger().attempts(msg.task_id)) == 1
    assert fleeter.task("reconnect").handoff["summary"] == "after the crash"


# -- without the plugin ------------------------------------------------------------------


def test_a_role_that_can_never_be_bound_is_an_error_and_one_that_is_spawned_a_warning(fleeter: Any) -> None:
    role_dir(fleeter)
    fleeter.write_tasks("""
        [[task]]
        name = "boss"
        cwd = "proj"
        role = "Supervisor"
        prompt = "Do it."

        [[task]]
        name = "checked"
        cwd = "proj"
        role = "relay"
        prompt = "Do it."
          [[task.verify]]
          run = "true"

        [[task]]
        name = "checked-too"
        cwd = "proj"
        role = "relay"
        prompt = "Do it too."
          [[task.verify]]
          run = "true"
    """)
    r = fleeter.run("validate", "tasks.toml")
    assert r.ret == 4
    assert r.errlines == [
        "ERROR: tasks.toml:4: task 'boss': role: 'Supervisor' is reserved (supervisor and "
        "operator name fleetrun's own sides)"
    ]
    fleeter.write_tasks((fleeter.path / "tasks.toml").read_text().replace('"Supervisor"', '"boss"'))
    r = fleeter.run("validate", "tasks.toml")
    assert r.ret == 0
    # one warning for the tasks that share its cause, as every collection warning
    spawned = [line for line in r.errlines if "so it is spawned" in line]
    assert spawned == [
        "warning: tasks.toml:10: task 'checked' and 1 more task: role: it has verifiers, so it is spawned, not "
        "delivered to role relay (a mailbox carries only the prompt)"
    ]


def test_with_the_mailbox_blocked_a_role_task_is_a_validate_error(fleeter: Any) -> None:
    role_dir(fleeter)
    fleeter.write_tasks(ROLE_TASK)
    r = fleeter.runsub("-p", "no:mailbox", "validate", "tasks.toml")
    assert r.ret == 4
    assert "tasks.toml:4: task 'reconnect': role: the mailbox plugin is blocked (-p no:mailbox)" in r.stderr
    r = fleeter.runsub("-p", "no:mailbox", "role", "list")
    assert r.ret == 4 and "the mailbox plugin is blocked (-p no:mailbox)" in r.stderr
    assert fleeter.runsub("validate", "tasks.toml").ret == 0
    assert not os.path.exists(fleeter.home / "state.db") or messages(fleeter) == []

"""Tasks without ``git_ref`` work in the user's checkout itself: never two at once in
one checkout, and ``validate`` says so."""

from __future__ import annotations


def no_ref_tasks(fleeter, names, git_ref_for=()):
    fleeter.make_repo()
    fleeter.write_policy("[local]\nmax_tasks = 3\n")
    fleeter.write_tasks(
        "\n".join(
            f'''
        [[task]]
        name = "{n}"
        cwd = "repo"
        prompt = "p"
        {'git_ref = "main"' if n in git_ref_for else ""}
    '''
            for n in names
        )
    )


def test_two_tasks_never_work_in_one_checkout_at_once(fleeter, fake_claude):
    no_ref_tasks(fleeter, ["a", "b", "c"])
    fake_claude.script(
        **{n: [{"actions": [["write", f"{n}.txt", n], ["sleep", 0.3], ["commit", f"add {n}"]]}] for n in "abc"}
    )
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    r.fnmatch_lines(["waiting: task_* (*): another task works in */repo (no git_ref)"])
    spans = sorted((a.started, a.ended) for a in fleeter.ledger().attempts())
    assert len(spans) == 3
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert end <= start  # one after the other
    log = fleeter.git(fleeter.path / "repo", "log", "--format=%s", "main").split("\n")
    assert sorted(line for line in log if line.startswith("add ")) == ["add a", "add b", "add c"]


def test_tasks_with_a_git_ref_still_run_beside_one_without(fleeter, fake_claude):
    no_ref_tasks(fleeter, ["a", "b"], git_ref_for=("b",))
    fake_claude.script(default=[{"actions": [["sleep", 0.5], ["write", "f.txt", "x"]]}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    r.no_fnmatch_line("*another task works in*")
    a, b = (fleeter.ledger().attempts(fleeter.task(n).id)[0] for n in "ab")
    assert a.started < b.ended and b.started < a.ended  # they overlapped


def test_validate_warns_that_a_task_without_git_ref_edits_the_checkout(fleeter):
    no_ref_tasks(fleeter, ["a", "b"], git_ref_for=("b",))
    v = fleeter.run("validate")
    assert v.ret == 0
    repo = fleeter.path / "repo"
    assert v.errlines == [
        f"warning: tasks.toml:1: task 'a': no git_ref: the agent works in your checkout {repo} itself"
    ]


def test_validate_warns_once_for_every_task_without_git_ref_in_a_checkout(fleeter):
    # one checkout, one warning: at the first task, with how many more
    no_ref_tasks(fleeter, ["a", "b", "c", "d"], git_ref_for=("b",))
    v = fleeter.run("validate")
    assert v.ret == 0
    repo = fleeter.path / "repo"
    assert v.errlines == [
        f"warning: tasks.toml:1: task 'a' and 2 more tasks: no git_ref: the agent works in your checkout {repo} itself"
    ]


def test_two_spawned_tasks_declaring_a_role_never_work_in_one_checkout_at_once(fleeter, fake_claude):
    # a role, but a permission mode a mailbox cannot carry: both are spawned in the checkout
    import json
    import time

    fleeter.make_repo()
    fleeter.write_policy("[local]\nmax_tasks = 3\n")
    assert fleeter.runsub("role", "bind", "relay", str(fleeter.path / "repo")).ret == 0
    fleeter.write_tasks(
        "\n".join(
            f'''
        [[task]]
        name = "{n}"
        cwd = "repo"
        role = "relay"
        permission_mode = "bypassPermissions"
        prompt = "p"
    '''
            for n in "ab"
        )
    )
    gates = fleeter.path / "gates"
    gates.mkdir()
    fake_claude.script(
        **{
            n: [
                {
                    "actions": [
                        [
                            "bash",
                            f"ls {gates}/*.running 2>/dev/null && touch {gates}/overlap; touch {gates}/{n}.running; "
                            f"until test -f {gates}/go; do sleep 0.1; done; rm {gates}/{n}.running",
                        ]
                    ]
                }
            ]
            for n in "ab"
        }
    )
    run = fleeter.popen("tasks.toml")

    def waited_or_started():
        started = sorted(p.stem for p in gates.glob("*.running"))
        if len(started) != 1:
            return ("started", started) if len(started) > 1 else None
        path = fleeter.home / "events.ndjson"
        events = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        other = "b" if started == ["a"] else "a"
        waits = [e for e in events if e.get("type") == "waiting" and e.get("name") == other]
        return ("waited", other, waits[-1]["reason"]) if waits else None

    deadline = time.monotonic() + 120
    got = None
    while got is None and time.monotonic() < deadline:
        got = waited_or_started()
        time.sleep(0.1)
    assert got is not None and got[0] == "waited", got
    assert got[2] == f"another task works in {(fleeter.path / 'repo').resolve()} (no git_ref)"
    assert fleeter.states()[got[1]] == "READY"
    (gates / "go").write_text("")
    out, err = run.communicate(timeout=120)
    assert run.returncode == 0, out.decode() + err.decode()
    assert not (gates / "overlap").exists()
    assert fleeter.states() == {"a": "DONE", "b": "DONE"}

"""Tasks without ``git_ref`` work in the user's checkout itself: never two at once in
one checkout, and ``validate`` says so."""

from __future__ import annotations


def no_ref_tasks(fleeter, names, git_ref_for=()):
    fleeter.make_repo()
    fleeter.write_policy("[local]\nmax_tasks = 3\n")
    fleeter.write_tasks("\n".join(f'''
        [[task]]
        name = "{n}"
        cwd = "repo"
        prompt = "p"
        {'git_ref = "main"' if n in git_ref_for else ''}
    ''' for n in names))


def test_two_tasks_never_work_in_one_checkout_at_once(fleeter, fake_claude):
    no_ref_tasks(fleeter, ["a", "b", "c"])
    fake_claude.script(**{n: [{"actions": [["write", f"{n}.txt", n], ["sleep", 0.3], ["commit", f"add {n}"]]}]
                          for n in "abc"})
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
    assert v.errlines == [f"warning: tasks.toml:1: task 'a': no git_ref: the agent works in your checkout {repo} "
                          "itself"]

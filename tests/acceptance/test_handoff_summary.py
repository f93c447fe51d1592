"""The summary a DONE task hands its dependents (issue 14): an agent writes it to
$FLEETRUN_SUMMARY_FILE; without one, the subjects of its branch's commits, never the
agent's raw stdout (a command agent's last 20 lines, debug lines included, were passed
word for word). The file is untrusted: read through no link, capped, cleaned."""

from __future__ import annotations

import json
import os

AGENT = """
[agents.sh]
command = ["{python}", "-c", %s]
"""

DEPENDENT = """
[[task]]
name = "api"
cwd = "repo"
prompt = "build the api"
git_ref = "main"
depends_on = ["schema"]
"""


def schema_task(script: str) -> str:
    return (
        AGENT % json.dumps(script)
        + """
[[task]]
name = "schema"
cwd = "repo"
prompt = "p"
agent = "sh"
git_ref = "main"
"""
        + DEPENDENT
    )


NOISY = (
    "import os, subprocess\n"
    "for i in range(30): print(f'DEBUG step {i}')\n"
    "open('schema.sql', 'w').write('create table users;')\n"
    "subprocess.run(['git', 'add', 'schema.sql'], check=True)\n"
    "subprocess.run(['git', '-c', 'user.name=a', '-c', 'user.email=a@b', 'commit', '-q', '-m', "
    "'add the users table'], check=True)\n"
)


def dependent_prompt(fake_claude) -> str:
    calls = fake_claude.calls("api")
    assert calls, "the dependent never started"
    return calls[0]["prompt"]


def test_a_command_agents_summary_file_is_handed_on_not_its_stdout(fleeter, fake_claude):
    fleeter.make_repo()
    script = NOISY + (
        "open(os.environ['FLEETRUN_SUMMARY_FILE'], 'w').write('Added schema.sql: the users table.\\x1b[2J\\u202e\\n')\n"
    )
    fleeter.write_tasks(schema_task(script))
    fake_claude.script(api=[{"actions": [["write", "api.py", "x"]]}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    prompt = dependent_prompt(fake_claude)
    assert "Its summary: Added schema.sql: the users table." in prompt
    assert "DEBUG" not in prompt and "\x1b" not in prompt and "\u202e" not in prompt
    assert fleeter.task("schema").handoff["summary"] == "Added schema.sql: the users table.[2J"


def test_without_a_summary_file_the_branchs_commit_subjects_are_handed_on(fleeter, fake_claude):
    fleeter.make_repo()
    fleeter.write_tasks(schema_task(NOISY))
    fake_claude.script(api=[{"actions": [["write", "api.py", "x"]]}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    prompt = dependent_prompt(fake_claude)
    assert "DEBUG" not in prompt
    assert "Its summary: (no summary written) the commits on its branch:\n  - add the users table" in prompt


def test_a_claude_agents_summary_file_wins_over_its_result_text(fleeter, fake_claude):
    fleeter.make_repo()
    fleeter.write_tasks(
        """
        [[task]]
        name = "schema"
        cwd = "repo"
        prompt = "p"
        git_ref = "main"
        permission_mode = "bypassPermissions"
    """
        + DEPENDENT
    )
    fake_claude.script(
        schema=[
            {
                "actions": [
                    ["write", "schema.sql", "x"],
                    ["bash", 'printf "wrote the schema on purpose" > "$FLEETRUN_SUMMARY_FILE"'],
                ]
            }
        ],
        api=[{"actions": [["write", "api.py", "x"]]}],
    )
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    env = fake_claude.calls("schema")[0]["env"]
    att = fleeter.ledger().latest_attempt(fleeter.task("schema").id)
    assert env["FLEETRUN_SUMMARY_FILE"] == os.path.join(att.dir, "summary")
    assert "Its summary: wrote the schema on purpose" in dependent_prompt(fake_claude)


def test_a_summary_file_that_is_a_link_is_not_read_and_a_long_one_is_cut(fleeter, fake_claude):
    fleeter.make_repo()
    secret = fleeter.path / "secret.txt"
    secret.write_text("SECRET-TOKEN")
    script = NOISY + f"os.symlink({str(secret)!r}, os.environ['FLEETRUN_SUMMARY_FILE'])\n"
    fleeter.write_tasks(schema_task(script))
    fake_claude.script(api=[{"actions": [["write", "api.py", "x"]]}])
    assert fleeter.run("tasks.toml").ret == 0
    prompt = dependent_prompt(fake_claude)
    assert "SECRET-TOKEN" not in prompt and "- add the users table" in prompt

    from fleetrun.summary import SUMMARY_LIMIT, read_summary

    long = fleeter.path / "long"
    long.write_text("x" * (SUMMARY_LIMIT * 10))
    got = read_summary(long)
    assert got == "x" * SUMMARY_LIMIT + " [...]"
    fifo = fleeter.path / "fifo"
    os.mkfifo(fifo)
    assert read_summary(fifo) == ""  # never blocks on a FIFO nobody writes

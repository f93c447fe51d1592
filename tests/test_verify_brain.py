"""The ``verify_brain`` plugin and ``fleetrun.diffutil``: against a real HTTP server on
127.0.0.1 (tests/brainserver.py), real git repositories, and through the real CLI."""

from __future__ import annotations

import select
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from brainserver import BrainServer, Gated, Malformed, Redirect, Shape, Slow, Status, closed_port

from fleetrun.diffutil import NO_VERDICT, TaskDiff, cut_utf8, parse_reply, review_prompt, task_diff
from fleetrun.plugins import verify_brain
from fleetrun.plugins.verify_brain import BrainError, BrainHandle, problems, request_for
from fleetrun.reports import Verdict, Workspace
from fleetrun.taskspec import VerifySpec


@pytest.fixture
def brain_server():
    """A fresh model server on 127.0.0.1 for one test (replies PASS until scripted)."""
    with BrainServer() as server:
        yield server


def wait_verdict(handle: Any, limit: float = 120.0) -> Verdict:
    """Poll a handle the way the loop does: select on its fileno, up to its deadline."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        v = handle.poll()
        if v is not None:
            return v
        timeout = max(0.0, min(0.5, handle.next_deadline() - time.monotonic()))
        fd = handle.fileno()
        if fd >= 0:
            select.select([fd], [], [], max(timeout, 0.005))
        else:
            time.sleep(0.01)
    raise AssertionError("no verdict in time")


@pytest.fixture
def repo(fleeter) -> Path:
    """A repository on branch work, one commit ahead of main (adds hello.txt)."""
    repo = fleeter.make_repo(files={"README.md": "hello\n"})
    fleeter.git(repo, "checkout", "-q", "-b", "work")
    (repo / "hello.txt").write_text("hello from the agent\n")
    fleeter.git(repo, "add", "hello.txt")
    fleeter.git(repo, "commit", "-q", "-m", "add hello")
    return repo


def handle(
    repo: Path,
    settings: dict[str, Any],
    question: str = "Does hello.txt greet?",
    task_prompt: str = "Write hello.txt.",
    prompt_path: Path | None = None,
    **vkw: Any,
) -> BrainHandle:
    v = VerifySpec(kind="brain", text=question, **vkw)
    ws = Workspace(path=str(repo), base_ref="main", is_worktree=True)
    return BrainHandle(v, settings, task_prompt, ws, prompt_path)


# --------------------------------------------------------------------------- the rule


@pytest.mark.parametrize(
    "reply, passed, reason",
    [
        ("PASS", True, "PASS"),
        ("  \n PASS\nThe change is fine.", True, "PASS"),
        ("PASS looks right", True, "PASS looks right"),
        ("<think>the diff adds hello.txt</think>\nPASS", True, "PASS"),
        ("PASS.", True, "PASS."),
        ("Pass", False, NO_VERDICT),
        ("**PASS**", True, "**PASS**"),
        ("PASS: fine", True, "PASS: fine"),
        ("I think it is a PASS", False, NO_VERDICT),
        ("`PASS`", True, "`PASS`"),
        ("FAIL: no tests were added\nDetails follow.", False, "no tests were added"),
        ("FAIL:no space", False, "no space"),
        ("FAIL", False, "FAIL (no reason given)"),
        ("FAILED to look", False, NO_VERDICT),
        ("", False, "empty reply"),
        ("   \n\t", False, "empty reply"),
    ],
)
def test_parse_reply_is_strict(reply, passed, reason):
    assert parse_reply(reply) == (passed, reason)


def test_cut_utf8_never_splits_a_character():
    data = "aé€".encode()  # 1 + 2 + 3 bytes
    assert [cut_utf8(data, n).decode() for n in range(7)] == ["", "a", "a", "aé", "aé", "aé", "aé€"]


# --------------------------------------------------------------------------- the diff


def test_task_diff_committed_uncommitted_and_untracked(fleeter, repo):
    (repo / "README.md").write_text("hello\nchanged, not committed\n")
    (repo / "new.txt").write_text("untracked\n")
    d = task_diff(str(repo), "main", 60000)
    assert not d.error and not d.trimmed and d.note == ""
    assert "+hello from the agent" in d.text  # main...HEAD
    assert "+changed, not committed" in d.text  # git diff HEAD
    assert "+untracked" in d.text and "new file mode" in d.text  # a new file not added yet
    assert d.untracked == ()
    assert "hello.txt" in d.stat and "not committed yet" in d.stat and "new.txt (new, not added)" in d.stat
    assert "```diff" in d.render()


def test_task_diff_names_new_files_past_the_cap(fleeter, repo, monkeypatch):
    monkeypatch.setattr("fleetrun.diffutil.MAX_UNTRACKED_SHOWN", 1)
    (repo / "a.txt").write_text("A\n")
    (repo / "b.txt").write_text("B\n")
    d = task_diff(str(repo), "main")
    assert "+A" in d.text and "+B" not in d.text
    assert d.untracked == ("b.txt",)
    assert "Untracked files (not shown): b.txt" in d.render()


def test_task_diff_is_trimmed_with_a_note(fleeter, repo):
    (repo / "big.txt").write_text("x" * 5000 + "\n")
    fleeter.git(repo, "add", "big.txt")
    fleeter.git(repo, "commit", "-q", "-m", "big")
    d = task_diff(str(repo), "main", 1000)
    assert d.trimmed and d.shown == 1000 and d.size > 5000
    assert len(d.text.encode()) == 1000
    assert d.note == f"[diff trimmed: showed 1000 of {d.size} bytes]"
    assert d.note in d.render()


def test_task_diff_without_git_ref_or_repo(fleeter, repo, tmp_path):
    assert task_diff(str(repo), None).render() == "(no changes)"
    (repo / "README.md").write_text("edited\n")
    assert "+edited" in task_diff(str(repo), None).text
    plain = tmp_path / "plain"
    plain.mkdir()
    d = task_diff(str(plain), "main")
    assert d.error and d.render().startswith("(no diff: ")
    assert task_diff(str(repo), "no-such-ref").error


def test_review_prompt_has_everything_in_order():
    d = TaskDiff(text="+x\n", stat=" a | 1 +\n", size=3, shown=3, base="main")
    p = review_prompt("Do the thing.", d, "Is it done?", "You review.")
    order = [
        p.index(s)
        for s in (
            "You review.",
            "Do the thing.",
            "git diff main...HEAD",
            "+x",
            "Is it done?",
            "first line of exactly `PASS` or `FAIL: reason`",
        )
    ]
    assert order == sorted(order)


# --------------------------------------------------------------------------- the APIs


@pytest.mark.parametrize(
    "settings, path",
    [
        ({}, "/api/generate"),
        ({"api": "ollama", "ollama_endpoint": "chat"}, "/api/chat"),
        ({"api": "openai"}, "/v1/chat/completions"),
    ],
)
def test_each_api_passes_and_sees_the_task(brain_server, repo, tmp_path, settings, path):
    brain_server.script("PASS\nhello.txt greets.")
    h = handle(repo, {"url": brain_server.url, "model": "tiny", **settings}, prompt_path=tmp_path / "p.txt")
    v = wait_verdict(h)
    assert (v.passed, v.kind, v.reason, v.output) == (True, "brain", "PASS", "PASS\nhello.txt greets.")
    assert v.label == "Does hello.txt greet?"
    (req,) = brain_server.requests
    assert req.path == path
    assert req.body["model"] == "tiny" and req.body["stream"] is False
    assert "+hello from the agent" in req.prompt  # the diff reached the model
    assert "Does hello.txt greet?" in req.prompt and "Write hello.txt." in req.prompt
    assert "first line of exactly `PASS` or `FAIL: reason`" in req.prompt
    assert "authorization" not in req.headers
    assert (tmp_path / "p.txt").read_text() == req.prompt  # kept for the operator


def test_openai_bearer_key_and_v1_base(brain_server, repo, monkeypatch):
    monkeypatch.setenv("MY_BRAIN_KEY", "sk-test-123")
    h = handle(
        repo, {"url": brain_server.url + "/v1/", "model": "gpt-x", "api": "openai", "api_key_env": "MY_BRAIN_KEY"}
    )
    assert wait_verdict(h).passed
    (req,) = brain_server.requests
    assert req.path == "/v1/chat/completions"
    assert req.headers["authorization"] == "Bearer sk-test-123"
    assert req.body["messages"][0]["role"] == "user"


def test_openai_key_variable_not_set_fails_without_asking(brain_server, repo, monkeypatch):
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    v = wait_verdict(
        handle(repo, {"url": brain_server.url, "model": "m", "api": "openai", "api_key_env": "NO_SUCH_KEY_VAR"})
    )
    assert not v.passed and v.reason == "api_key_env names NO_SUCH_KEY_VAR, which is not set"
    assert v.error == "permanent"  # it answers the same until someone fixes it
    assert brain_server.requests == []


def test_request_for_defaults_to_local_ollama():
    url, body, headers = request_for({}, "m", "hi")
    assert url == "http://127.0.0.1:11434/api/generate"
    assert body == {"model": "m", "prompt": "hi", "stream": False}
    with pytest.raises(BrainError):
        request_for({"api": "openai", "api_key_env": "FLEETRUN_TEST_UNSET_VAR"}, "m", "hi")


# --------------------------------------------------------------------------- failures


@pytest.mark.parametrize(
    "reply, reason, error",
    [
        ("FAIL: hello.txt does not greet\nIt says hi.", "hello.txt does not greet", None),
        ("PASS?", NO_VERDICT, "transient"),
        ("", "empty reply", "transient"),
        (Status(500, {"error": "out of memory"}), "brain returned HTTP 500: out of memory", "transient"),
        (Status(503, "upstream down"), "brain returned HTTP 503: upstream down", "transient"),
        (Status(429, "slow down"), "brain returned HTTP 429: slow down", "transient"),
        (Status(401, "bad key"), "brain returned HTTP 401: bad key", "permanent"),
        (Malformed(), 'brain returned malformed JSON: \'{"response": "PASS", \'', "transient"),
        (Shape({"done": True}), 'brain reply has no answer in it: {"done": true}', "transient"),
    ],
)
def test_failures_are_fail_or_error_verdicts_with_reasons(brain_server, repo, reply, reason, error):
    """Only a FAIL the model gave is the work's; the rest is an ERROR (it could not judge)."""
    brain_server.script(reply)
    v = wait_verdict(handle(repo, {"url": brain_server.url, "model": "m"}))
    assert (v.passed, v.reason, v.error) == (False, reason, error)
    if isinstance(reply, str) and reply:
        assert v.output == reply  # the reply goes into the retry prompt


def test_ollama_model_not_found(repo):
    with BrainServer(models=["llama3"]) as server:
        v = wait_verdict(handle(repo, {"url": server.url, "model": "nope"}))
    assert v.reason == "brain returned HTTP 404: model 'nope' not found" and v.error == "permanent"


def test_slow_brain_times_out(brain_server, repo):
    gate = threading.Event()  # the answer never comes before the timeout: it is held
    brain_server.script(Gated(gate))
    before = time.monotonic()
    h = handle(repo, {"url": brain_server.url, "model": "m", "timeout_s": 0.5})
    after = time.monotonic()
    assert before + 0.5 <= h.next_deadline() <= after + 0.5
    v = wait_verdict(h)
    gate.set()
    assert (v.passed, v.reason, v.error) == (False, "brain timed out after 0.5s", "transient")


def test_the_verifiers_own_timeout_wins_when_smaller(brain_server, repo):
    brain_server.script(Slow(5))
    v = wait_verdict(handle(repo, {"url": brain_server.url, "model": "m", "timeout_s": 60}, timeout_s=0.3))
    assert v.reason == "brain timed out after 0.3s"


def test_a_local_brain_is_not_reached_through_a_proxy(brain_server, repo, monkeypatch):
    dead = f"http://127.0.0.1:{closed_port()}"
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY"):
        monkeypatch.setenv(var, dead)
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    assert wait_verdict(handle(repo, {"url": brain_server.url, "model": "m"})).passed
    v = wait_verdict(handle(repo, {"url": "http://brain.invalid:11434", "model": "m", "timeout_s": 5}))
    assert v.reason == "brain unreachable at http://brain.invalid:11434: connection refused"  # the proxy's


def test_refused_connection(repo):
    port = closed_port()
    v = wait_verdict(handle(repo, {"url": f"http://127.0.0.1:{port}", "model": "m"}))
    assert (v.passed, v.reason) == (False, f"brain unreachable at http://127.0.0.1:{port}: connection refused")


def test_model_is_required_and_the_verifier_overrides_it(brain_server, repo):
    v = wait_verdict(handle(repo, {"url": brain_server.url}))
    assert not v.passed and v.reason.startswith("no model for the brain: set [brain] model")
    assert brain_server.requests == []
    assert wait_verdict(handle(repo, {"url": brain_server.url, "model": "big"}, model="small")).passed
    assert brain_server.requests[0].body["model"] == "small"


def test_max_diff_bytes_trims_what_the_model_sees(fleeter, brain_server, repo):
    (repo / "big.txt").write_text("y" * 3000 + "\n")
    v = wait_verdict(handle(repo, {"url": brain_server.url, "model": "m", "max_diff_bytes": 500}))
    assert v.passed
    prompt = brain_server.requests[0].prompt
    assert "[diff trimmed: showed 500 of " in prompt
    assert "y" * 3000 not in prompt


def test_hook_returns_at_once_and_fileno_wakes_the_loop(brain_server, repo):
    gate = threading.Event()  # the brain answers only once the test opens it
    brain_server.script(Gated(gate))
    h = handle(repo, {"url": brain_server.url, "model": "m"})
    assert h.poll() is None  # the hook returned before the answer could exist
    assert select.select([h], [], [], 0.2)[0] == []  # and nothing wakes the loop before it
    gate.set()
    ready, _, _ = select.select([h], [], [], 120)
    assert ready == [h]
    assert h.poll().passed
    assert h.fileno() == -1  # closed once the verdict is out
    assert h.poll().passed  # and poll() keeps answering


def test_cancel_closes_and_the_late_thread_is_harmless(brain_server, repo):
    brain_server.script(Slow(0.2))
    h = handle(repo, {"url": brain_server.url, "model": "m"})
    h.cancel()
    assert h.fileno() == -1
    h._thread.join(5)
    assert not h._thread.is_alive()


def test_problems_names_unknown_and_bad_keys():
    assert (
        problems(
            {
                "url": "http://x",
                "model": "m",
                "api": "openai",
                "ollama_endpoint": "chat",
                "api_key_env": "K",
                "timeout_s": 3,
                "max_diff_bytes": 10,
            }
        )
        == []
    )
    assert problems({"modle": "m"}) == [("modle", "unknown key (did you mean 'model'?)")]
    assert dict(problems({"api": "anthropic", "timeout_s": 0, "max_diff_bytes": 1.5, "url": "127.0.0.1"})) == {
        "api": "must be one of 'ollama', 'openai'",
        "timeout_s": "must be a positive number",
        "max_diff_bytes": "must be a positive whole number of bytes",
        "url": "must be an http:// or https:// URL",
    }


def test_a_bad_setting_is_a_fail_verdict_too(brain_server, repo):
    v = wait_verdict(handle(repo, {"url": brain_server.url, "model": "m", "temperature": 0}))
    assert (v.passed, v.reason) == (
        False,
        "[brain] temperature: unknown key (known: url, model, api, "
        "ollama_endpoint, api_key_env, timeout_s, max_diff_bytes)",
    )


# --------------------------------------------------------------------------- the CLI


def brain_task(
    fleeter, url: str, question: str = "Does hello.txt say hello?", extra: str = "", brain: str = 'model = "tiny"'
) -> None:
    fleeter.make_repo()
    fleeter.write_tasks(f'''
        [brain]
        url = "{url}"
        {brain}

        [[task]]
        name = "greet"
        cwd = "repo"
        prompt = "Write hello.txt saying hello."
        git_ref = "main"
        {extra}

          [[task.verify]]
          brain = "{question}"
    ''')


def test_cli_unknown_brain_key_in_config_toml_stops_work(fleeter):
    fleeter.write_config('[brain]\nmodel = "m"\ntimeout = 5\n')
    r = fleeter.run("work", "--until-idle")
    assert r.ret == 4
    r.fnmatch_lines(["ERROR: *config.toml:3: brain.timeout: unknown key (did you mean 'timeout_s'?)"])
    assert fleeter.run("status").ret == 0  # reading the ledger still works


def test_cli_bad_brain_table_in_tasks_file(fleeter):
    brain_task(fleeter, "http://127.0.0.1:1", brain='model = "tiny"\n        api = "claude"')
    r = fleeter.run("validate", "tasks.toml")
    assert r.ret == 4
    r.fnmatch_lines(["ERROR: tasks.toml:4: brain.api: must be one of 'ollama', 'openai'"])


def test_cli_validate_warns_when_a_brain_verifier_has_no_model(fleeter):
    brain_task(fleeter, "http://127.0.0.1:1", brain="")
    r = fleeter.run("validate", "tasks.toml")
    assert r.ret == 0
    r.fnmatch_lines(["warning: tasks.toml:12: task 'greet': verify #1: a brain verifier needs a model*"])


def test_cli_pass_is_done(fleeter, fake_claude, brain_server):
    brain_task(fleeter, brain_server.url)
    fake_claude.script(greet=[{"actions": [["write", "hello.txt", "hello"], ["commit", "add hello"]]}])
    brain_server.script("PASS")
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    r.fnmatch_lines(["*greet DONE (attempt 1)*verify_pass"])
    (req,) = brain_server.requests
    assert req.body["model"] == "tiny"
    assert "+hello" in req.prompt and "hello.txt" in req.prompt
    assert "Does hello.txt say hello?" in req.prompt and "Write hello.txt saying hello." in req.prompt
    task = fleeter.task("greet")
    (v,) = fleeter.ledger().verdicts(task_id=task.id)
    assert (v.kind, v.passed, v.reason) == ("brain", True, "PASS")


def test_cli_fail_retries_with_the_reply_in_the_prompt(fleeter, fake_claude, brain_server):
    brain_task(fleeter, brain_server.url)
    fake_claude.script(
        greet=[
            {"actions": [["write", "hello.txt", "hi"], ["commit", "add hi"]]},
            {"actions": [["write", "hello.txt", "hello"], ["commit", "say hello"]]},
        ]
    )
    brain_server.script("FAIL: hello.txt says hi, not hello\nChange the word to hello.", "PASS")
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    r.fnmatch_lines(["*greet RETRYING (attempt 1)*verify_fail:Does hello.txt say hello?*", "*greet DONE (attempt 2)*"])
    first, second = fake_claude.calls("greet")
    assert "Change the word to hello." not in first["prompt"]
    assert "hello.txt says hi, not hello" in second["prompt"]
    assert "Change the word to hello." in second["prompt"]
    # the second question saw the second attempt's work
    assert "+hi" in brain_server.requests[0].prompt
    assert "+hello" in brain_server.requests[1].prompt and "+hi\n" not in brain_server.requests[1].prompt


def test_cli_refused_connection_needs_a_human(fleeter, fake_claude):
    """A refused connection is the brain's, not the work's: an ERROR, no verdict row
    (tried once here; test_verifier_errors.py has the backoff)."""
    port = closed_port()
    brain_task(fleeter, f"http://127.0.0.1:{port}")
    fleeter.write_config((fleeter.home / "config.toml").read_text() + "\n[fleetrun]\nverifier_error_tries = 1\n")
    fake_claude.script(greet=[{"actions": [["write", "hello.txt", "hello"]]}])
    r = fleeter.run("tasks.toml")
    assert r.ret == 1
    task = fleeter.task("greet")
    assert task.state.value == "NEEDS_HUMAN"
    why = f"brain unreachable at http://127.0.0.1:{port}: connection refused"
    assert task.reason == f"verifier_error:Does hello.txt say hello?: {why} (tried 1 time)"
    assert fleeter.ledger().verdicts(task_id=task.id) == []
    assert len(fake_claude.calls("greet")) == 1
    logs = fleeter.run("logs", "greet")
    logs.fnmatch_lines(["*verifier_error:Does hello.txt say hello?: brain unreachable*connection refused*"])


def test_cli_config_toml_brain_and_verifier_model(fleeter, fake_claude, brain_server):
    fleeter.make_repo()
    cfg = (fleeter.home / "config.toml").read_text()
    fleeter.write_config(cfg + f'\n[brain]\nurl = "{brain_server.url}"\nmodel = "from-config"\napi = "openai"\n')
    fleeter.write_tasks("""
        [[task]]
        name = "t"
        cwd = "repo"
        prompt = "p"
        git_ref = "main"

          [[task.verify]]
          brain = "ok?"
          model = "from-verifier"
    """)
    r = fleeter.run("tasks.toml")
    assert r.ret == 0, r.stdout + r.stderr
    (req,) = brain_server.requests
    assert req.path == "/v1/chat/completions" and req.body["model"] == "from-verifier"


def test_plugin_is_builtin_and_can_be_blocked(fleeter):
    r = fleeter.run("--version")
    assert "verify_brain" in r.stdout and "verify_agent" in r.stdout
    assert verify_brain.fleetrun_verify.__module__ == "fleetrun.plugins.verify_brain"
    fleeter.write_tasks("""
        [[task]]
        name = "t"
        prompt = "p"

          [[task.verify]]
          brain = "ok?"
    """)
    # the brain kind is the plugin's: blocked, a brain verifier does not validate (issue 23)
    r = fleeter.run("validate", "-p", "no:verify_brain", "tasks.toml")
    assert r.ret == 4 and "unknown verifier kind brain: its plugin verify_brain is not loaded" in r.stderr


def test_a_task_on_a_peer_is_not_asked_about_here():
    task = SimpleNamespace(spec=SimpleNamespace(verify=[], prompt="p"))
    v = verify_brain.fleetrun_verify(
        task=task,
        verifier=VerifySpec("brain", "ok?"),
        workspace=Workspace(path="/on/the/peer"),
        attempt=SimpleNamespace(host="mini", id="a1"),
        config=None,
    )
    assert isinstance(v, Verdict) and not v.passed and v.host == "mini"
    assert v.reason == "a brain verifier runs on this machine; the task's workspace is on mini"


def test_a_peers_work_comes_from_whichever_plugin_answers_fleetrun_fetch_workspace(tmp_path, monkeypatch):
    """Issue 23: the core names no plugin: a verifier that runs here gets a peer's work
    through ``fleetrun_fetch_workspace`` (the relay answers for its peers), not from the
    relay looked up by name. No answer, or an exception, is a FAIL saying why."""
    from fleetrun.diffutil import local_workspace

    task = SimpleNamespace(spec=SimpleNamespace(verify=[], prompt="p"), id="t1")
    attempt = SimpleNamespace(host="bay", id="a1")
    answers = []

    def fetch(task, attempt, workspace, config):
        if isinstance(answers[0], Exception):
            raise answers[0]
        return answers[0]

    config = SimpleNamespace(hook=SimpleNamespace(fleetrun_fetch_workspace=fetch), stash={}, home=tmp_path)
    monkeypatch.setattr("fleetrun.diffutil._is_local", lambda config, name: False)  # bay's files are elsewhere
    here = Workspace(path=str(tmp_path / "fetched"))
    answers[:] = [here]
    assert local_workspace(config, task, attempt, Workspace(path="/there"), VerifySpec("brain", "ok?")) is here
    answers[:] = [None]
    v = local_workspace(config, task, attempt, Workspace(path="/there"), VerifySpec("agent", "ok?"))
    assert (
        isinstance(v, Verdict) and v.reason == "an agent verifier runs on this machine; the task's workspace is on bay"
    )
    answers[:] = [RuntimeError("no route")]
    v = local_workspace(config, task, attempt, Workspace(path="/there"), VerifySpec("brain", "ok?"))
    assert v.reason == (
        "a brain verifier runs on this machine, and the task's branch could not be fetched from bay: no route"
    )


# --------------------------------------------------------------------------- redirects (issue 10 item 6)


@pytest.mark.parametrize("code", [301, 302, 307, 308])
def test_a_redirect_is_a_fail_and_the_key_goes_nowhere_else(brain_server, repo, monkeypatch, code):
    """A brain that answers 3xx to another server: the client follows nothing, so the
    bearer key never reaches that server and its answer is never the verdict."""
    monkeypatch.setenv("MY_BRAIN_KEY", "sk-secret-value-123")
    elsewhere = BrainServer()
    got: list[dict[str, str]] = []

    def do_get(h: Any) -> None:  # urllib turns a 301/302 after a POST into a GET
        got.append({k.lower(): v for k, v in h.headers.items()})
        h._send(200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": "PASS"}}]})

    elsewhere.Handler.do_GET = do_get  # type: ignore[method-assign]
    with elsewhere:
        elsewhere.script("PASS")
        target = elsewhere.url + "/v1/chat/completions"
        brain_server.script(Redirect(target, code))
        v = wait_verdict(
            handle(repo, {"url": brain_server.url, "model": "gpt-x", "api": "openai", "api_key_env": "MY_BRAIN_KEY"})
        )
        assert brain_server.requests[0].headers["authorization"] == "Bearer sk-secret-value-123"
        assert not [g for g in got if "authorization" in g], "the bearer key went to the other server"
        assert elsewhere.requests == [] and got == []  # nothing reached it at all
    assert not v.passed
    assert v.reason == f"brain redirected to {target} (HTTP {code}); redirects are not followed"
    assert v.error == "permanent"  # it answers the same until someone fixes it

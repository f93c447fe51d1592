"""The built-in ``htmlreport`` plugin: ``--html PATH`` on a run, ``fleetrun report``.

Real runs of small queues (command agents stand in for the model) and ledgers built
through the ledger's API for what a run on one machine cannot make (a peer's task, a
role's mailbox, hostile names); the page is read back with the standard library's
HTML parser as a browser builds its DOM, and by a real headless chromium
(``test_chromium_draws_the_bars_and_rows``).
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, Optional

import pytest

import fleetrun
from fleetrun.fleeter import ECHO_AGENT, echo_task

#: The plugin's folder (read, not imported: each test here fails on its own without it).
PLUGIN_DIR = Path(fleetrun.__file__).parent / "plugins" / "htmlreport"


@dataclass
class El:
    tag: str
    attrs: dict[str, str]
    parent: Optional[El] = None
    children: list[El] = field(default_factory=list)
    text: str = ""

    def all_text(self) -> str:
        return self.text + "".join(c.all_text() for c in self.children)

    def iter(self, tag: Optional[str] = None) -> list[El]:
        found = [self] if tag is None or self.tag == tag else []
        for c in self.children:
            found.extend(c.iter(tag))
        return found

    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())


VOID = {"meta", "br", "input", "img", "link", "hr"}


class Tree(HTMLParser):
    """The page's elements as a browser's parser sees them (entities decoded, SVG
    elements and their attributes included)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = El("#document", {})
        self.cur = self.root

    def handle_starttag(self, tag: str, attrs: list[tuple[str, Optional[str]]]) -> None:
        el = El(tag, {k: v or "" for k, v in attrs}, self.cur)
        self.cur.children.append(el)
        if tag not in VOID:
            self.cur = el

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, Optional[str]]]) -> None:
        self.cur.children.append(El(tag, {k: v or "" for k, v in attrs}, self.cur))

    def handle_endtag(self, tag: str) -> None:
        el: Optional[El] = self.cur
        while el is not None and el.tag != tag:
            el = el.parent
        if el is not None and el.parent is not None:
            self.cur = el.parent

    def handle_data(self, data: str) -> None:
        self.cur.text += data


def parse(path: Path) -> El:
    tree = Tree()
    tree.feed(path.read_text(encoding="utf-8"))
    tree.close()
    return tree.root


def bars(doc: El) -> list[El]:
    return [a for a in doc.iter("a") if "attempt" in a.classes()]


def rows(doc: El) -> list[El]:
    table = next(t for t in doc.iter("table") if t.attrs.get("id") == "tasks")
    return [tr for tr in table.iter("tr") if "data-state" in tr.attrs]


def title_of(el: El) -> str:
    return next((c.all_text() for c in el.children if c.tag == "title"), "")


#: The elements and attributes the template writes: nothing else may be in the DOM.
TEMPLATE_TAGS = {
    "#document",
    "html",
    "head",
    "meta",
    "title",
    "style",
    "body",
    "h1",
    "h2",
    "h3",
    "p",
    "span",
    "b",
    "div",
    "svg",
    "defs",
    "marker",
    "path",
    "g",
    "rect",
    "text",
    "line",
    "a",
    "label",
    "select",
    "option",
    "table",
    "thead",
    "tbody",
    "tr",
    "th",
    "td",
    "code",
    "br",
    "details",
    "summary",
    "pre",
    "ul",
    "li",
    "script",
    "i",
}


def check_inert(doc: El) -> None:
    """The DOM holds no element, handler or link the agent wrote: only the template's
    tags, no ``on...`` attribute, links only to the page's own anchors, one script
    (the page's own, allowed by the CSP's hash)."""
    for el in doc.iter():
        assert el.tag in TEMPLATE_TAGS, el.tag
        assert not [k for k in el.attrs if k.startswith("on")], (el.tag, el.attrs)
        if "href" in el.attrs:
            assert re.fullmatch(r"#task-\d+", el.attrs["href"]), el.attrs["href"]
    scripts = doc.iter("script")
    assert len(scripts) == 1
    assert scripts[0].all_text() == (PLUGIN_DIR / "report.js").read_text(encoding="utf-8")
    meta = next(m for m in doc.iter("meta") if m.attrs.get("http-equiv") == "Content-Security-Policy")
    digest = base64.b64encode(hashlib.sha256(scripts[0].all_text().encode()).digest()).decode()
    assert meta.attrs["content"].startswith("default-src 'none';")
    assert f"script-src 'sha256-{digest}'" in meta.attrs["content"]


# Every way a task ends up, on one machine: DONE, retried then DONE, NEEDS_HUMAN,
# CANCELLED (it cancels itself through the CLI, as an operator would), waiting for a
# tool no machine has, and a dependency chain.
QUEUE = (
    ECHO_AGENT
    + r"""
[agents.selfcancel]
command = ["{python}", "-c", "import subprocess, sys, time; subprocess.run([sys.executable, '-m', 'fleetrun', 'cancel', 'gone']); time.sleep(5)"]
"""
    + "".join(
        [
            echo_task("ok", verify="true", prompt="do it"),
            echo_task("flaky", verify="test -f m || { touch m; exit 1; }", prompt="do it"),
            echo_task("bad", verify=r"printf 'expected <b> & got red\n'; exit 3", prompt="do it", max_retries=1),
            echo_task("gone", prompt="do it", agent="selfcancel"),
            echo_task("stuck", prompt="do it", requires=["no-such-tool-on-any-machine"]),
            # its verifier takes a second, so api waits long enough for the page to draw the wait (>= 0.5 s)
            echo_task("schema", verify="sleep 1", prompt="make the schema"),
            echo_task("api", verify="true", prompt="make the api", depends_on=["schema"]),
            echo_task("client", verify="true", prompt="make the client", depends_on=["api"]),
        ]
    )
)


def test_a_run_with_html_draws_every_state(fleeter: Any) -> None:
    fleeter.write_tasks(QUEUE)
    result = fleeter.run("tasks.toml", "--html", "out/report.html")
    assert result.ret == 1, result.stdout + result.stderr
    result.assert_outcomes(done=5, needs_human=1, cancelled=1, ready=1)
    path = fleeter.path / "out" / "report.html"
    assert oct(path.stat().st_mode & 0o777) == oct(0o666 & ~_umask())  # the user's file, as --junitxml's
    doc = parse(path)
    check_inert(doc)
    assert [h.all_text() for h in doc.iter("h1")] == ["fleetrun: tasks.toml"]
    assert [h.all_text() for h in doc.iter("title") if h.parent and h.parent.tag == "head"] == ["fleetrun: tasks.toml"]

    # the table: every task, what needs a person first, DONE last
    states = [(r.attrs["data-task"], r.attrs["data-state"]) for r in rows(doc)]
    assert sorted(states) == sorted(
        [
            ("ok", "DONE"),
            ("flaky", "DONE"),
            ("bad", "NEEDS_HUMAN"),
            ("gone", "CANCELLED"),
            ("stuck", "READY"),
            ("schema", "DONE"),
            ("api", "DONE"),
            ("client", "DONE"),
        ]
    )
    assert states[0] == ("bad", "NEEDS_HUMAN") and states[1] == ("stuck", "READY")
    assert {s for _, s in states[-5:]} == {"DONE"}
    bad_row = next(r for r in rows(doc) if r.attrs["data-task"] == "bad")
    assert "retries_exhausted" in bad_row.all_text()

    # the timeline: one bar per attempt, coloured by how it ended, all in this machine's lane
    lanes = [g.attrs["data-host"] for g in doc.iter("g") if "lane" in g.classes()]
    assert lanes == ["local"]
    got = sorted((b.attrs["data-task"], b.attrs["data-attempt"], b.attrs["data-outcome"]) for b in bars(doc))
    assert got == sorted(
        [
            ("ok", "1", "done"),
            ("flaky", "1", "failed"),
            ("flaky", "2", "done"),
            ("bad", "1", "failed"),
            ("bad", "2", "needs-human"),
            ("gone", "1", "cancelled"),
            ("schema", "1", "done"),
            ("api", "1", "done"),
            ("client", "1", "done"),
        ]
    )
    flaky1 = next(b for b in bars(doc) if b.attrs["data-task"] == "flaky" and b.attrs["data-attempt"] == "1")
    assert "flaky · attempt 1" in title_of(flaky1) and "verify failed" in title_of(flaky1)
    segs = [s for s in flaky1.iter("rect") if "seg-verify-fail" in s.classes()]
    assert len(segs) == 1 and "FAIL" in title_of(segs[0])
    # each bar links to its task's details
    anchors = {d.attrs["data-task"]: d.attrs["id"] for d in doc.iter("details") if "task" in d.classes()}
    assert set(anchors) == {t for t, _ in states}
    assert all(b.attrs["href"] == "#" + anchors[b.attrs["data-task"]] for b in bars(doc))
    # the chain reads left to right: schema -> api -> client
    deps = [title_of(p) for p in doc.iter("path") if "dep" in p.classes()]
    assert sorted(deps) == ["api → client", "schema → api"]
    # api waited for its dependency before it was placed
    (wait,) = [line for line in doc.iter("line") if "wait" in line.classes() and line.attrs["data-task"] == "api"]
    assert title_of(wait).startswith("api waited") and "its dependencies" in title_of(wait)

    # the details: transitions, the failing verifier's output, each attempt's prompt, the handoff
    bad = next(d for d in doc.iter("details") if d.attrs.get("data-task") == "bad")
    text = bad.all_text()
    assert "Attempt 2 (retry) on local: NEEDS_HUMAN" in text
    assert "expected <b> & got red" in [p.all_text().strip() for p in bad.iter("pre") if "output" in p.classes()][0]
    prompts = [p.all_text() for p in bad.iter("pre") if "prompt" in p.classes()]
    assert len(prompts) == 2 and "do it" in prompts[0] and "expected <b> & got red" in prompts[1]
    client = next(d for d in doc.iter("details") if d.attrs.get("data-task") == "client")
    assert "Handoff it received from api" in client.all_text()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_the_run_rewrites_the_page_as_it_goes(fleeter: Any) -> None:
    """While ``fleetrun work --html`` goes on the page shows the night so far: a task
    under way is in it before the run ends (its agent waits for a gate file the test writes only then)."""
    gate = fleeter.path / "gate"
    fleeter.write_tasks(
        ECHO_AGENT
        + f"""
[agents.gated]
command = ["{{python}}", "-c", "import os, time\\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.05)"]
"""
        + echo_task("first", verify="true")
        + echo_task("slow", agent="gated", verify="true")
    )
    path = fleeter.path / "report.html"
    assert fleeter.runsub("queue", "tasks.toml").ret == 0
    proc = fleeter.popen("work", "--until-idle", "--html", str(path))
    try:
        seen: dict[str, str] = {}
        done = threading.Event()

        def watch() -> None:
            while not done.is_set():
                if path.exists():
                    states = {r.attrs["data-task"]: r.attrs["data-state"] for r in rows(parse(path))}
                    if states.get("slow") == "RUNNING" and states.get("first") == "DONE":
                        seen.update(states)
                        return
                done.wait(0.05)

        watcher = threading.Thread(target=watch)
        watcher.start()
        watcher.join(120)
        done.set()
        assert seen == {"first": "DONE", "slow": "RUNNING"}, "the page never showed the run under way"
        assert proc.poll() is None  # the run was still going when the page showed it
        gate.write_text("go")
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, (out + err).decode(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    doc = parse(path)
    assert {r.attrs["data-task"]: r.attrs["data-state"] for r in rows(doc)} == {"first": "DONE", "slow": "DONE"}
    assert not [m for m in doc.iter("meta") if m.attrs.get("http-equiv") == "refresh"]  # the last page is still


def test_a_report_that_cannot_be_written_does_not_stop_the_run(fleeter: Any) -> None:
    """``--html`` into a folder that is a file: the run does its work and ends as it
    would, and says once why there is no page."""
    fleeter.write_tasks(ECHO_AGENT + echo_task("ok", verify="true"))
    (fleeter.path / "out").write_text("a file, not a folder")
    result = fleeter.runsub("tasks.toml", "--html", "out/report.html")
    assert result.ret == 0, result.stdout + result.stderr
    result.assert_outcomes(done=1)
    assert "fleetrun: cannot write the HTML report" in result.stderr
    assert "Traceback" not in result.stderr


HOSTILE = [
    "<script>alert(1)</script>",
    "<img src=x onerror=alert(2)>",
    '<a href="javascript:alert(3)">click</a>',
    '"><svg onload=alert(4)>',
    "</title><script>alert(5)</script>",
    "]]></text><foreignObject><iframe src=javascript:alert(6)>",
]


def a_night_on_three_hosts(home: Path, hostile: bool = False) -> dict[str, str]:
    """A ledger as a night on this machine, a peer (``mini``) and a role's mailbox
    leaves it, built through the ledger's API; with ``hostile``, every text an agent
    or a peer could write is markup."""
    from fleetrun.ledger import Ledger
    from fleetrun.reports import Verdict
    from fleetrun.states import State
    from fleetrun.taskspec import TaskSpec

    evil = " ".join(HOSTILE)
    names = [f"{evil} local" if hostile else "local-task", "peer-task", "mailbox-task", "waiting"]
    with Ledger(home / "state.db") as led:
        local, peer, mail, waiting = led.add_tasks(
            [TaskSpec(name=n, prompt="p", cwd="/repo") for n in names], source="/repo/tasks.toml"
        )
        for task, host in ((local, "local"), (peer, "mini"), (mail, "mailbox")):
            att = led.lease(task.id, State.READY, host, "fresh")
            adir = home / "attempts" / att.id
            adir.mkdir(parents=True)
            (adir / "prompt").write_text(f"the prompt {evil if hostile else ''}")
            led.update_attempt(
                att.id,
                dir=str(adir),
                started=att.created + 0.5,
                ended=att.created + 2,
                cost_usd=0.5,
                result_text=evil if hostile else "did it",
            )
            led.transition(task.id, State.ASSIGNED, State.RUNNING, "started", 1, host)
            led.transition(task.id, State.RUNNING, State.VERIFYING, "exited", 1, host)
            v = Verdict(
                passed=task is not local,
                kind="run",
                label=evil if hostile else "pytest -q",
                reason=evil if hostile else "exit code 0",
                output=evil if hostile else "1 passed in 0.1s",
                duration_s=0.5,
                host=host,
            )
            led.add_verdict(task.id, att.id, 0, v)
            if task is local:
                led.transition(
                    task.id,
                    State.VERIFYING,
                    State.NEEDS_HUMAN,
                    f"retries_exhausted:{evil}" if hostile else "retries_exhausted:pytest -q",
                    1,
                    host,
                )
            else:
                led.transition(task.id, State.VERIFYING, State.DONE, "verify_pass", 1, host)
            led.update_task(
                task.id,
                branch=f"fleetrun/{task.name[:20]}-x",
                handoff={"summary": evil if hostile else "done", "branch": "b"},
            )
        if hostile:  # a peer's shepherd reports its times by its own clock: one far off
            (far,) = led.attempts(task_id=peer.id)
            led.update_attempt(far.id, started=far.created - 1e9, ended=far.created + 1e12)
        led.add_note(
            peer.id,
            "the branch is on mini; fetch it with `git fetch ssh://me@mini.local:22/repo fleetrun/peer-task-x`.",
        )
        led.add_note(local.id, evil if hostile else "a note")
        return {"local": local.id, "peer": peer.id, "mailbox": mail.id, "waiting": waiting.id}


def test_report_after_the_fact_from_the_ledger_alone(fleeter: Any) -> None:
    """``fleetrun report --html`` in a fresh process, with no run going: one lane per
    host (this machine, the peer, the mailbox), the peer's branch with the command that
    fetches it, the tasks of the newest queue."""
    empty = fleeter.runsub("report", "--html", "night.html")  # nothing queued yet: said, and no home made
    assert empty.ret == 4 and "no ledger here" in empty.stderr and not fleeter.home.exists()
    a_night_on_three_hosts(fleeter.home)
    result = fleeter.runsub("report", "--html", "night.html")
    assert result.ret == 0, result.stdout + result.stderr
    path = fleeter.path / "night.html"
    assert f"wrote {path}: 4 tasks" in result.stdout
    doc = parse(path)
    check_inert(doc)
    assert [g.attrs["data-host"] for g in doc.iter("g") if "lane" in g.classes()] == ["local", "mini", "mailbox"]
    assert sorted((b.attrs["data-task"], b.attrs["data-outcome"]) for b in bars(doc)) == [
        ("local-task", "needs-human"),
        ("mailbox-task", "done"),
        ("peer-task", "done"),
    ]
    peer = next(r for r in rows(doc) if r.attrs["data-task"] == "peer-task")
    assert "git fetch ssh://me@mini.local:22/repo fleetrun/peer-task-x" in peer.all_text()
    assert [r.attrs["data-state"] for r in rows(doc)] == ["NEEDS_HUMAN", "READY", "DONE", "DONE"]
    # the same queue named by its tasks file, and by its id
    again = fleeter.runsub("report", "--html", "again.html", "/repo/tasks.toml")
    assert again.ret == 0, again.stderr
    queue = fleeter.task("peer-task").queue_id
    by_id = fleeter.runsub("report", "--html", "by-id.html", "--queue", queue)
    assert by_id.ret == 0 and f"4 tasks of queue {queue}" in by_id.stdout, by_id.stderr
    assert len(rows(parse(fleeter.path / "by-id.html"))) == 4
    (fleeter.path / "afile").write_text("")
    unwritable = fleeter.runsub("report", "--html", "afile/night.html")
    assert unwritable.ret == 4 and "cannot write" in unwritable.stderr and "Traceback" not in unwritable.stderr
    unknown = fleeter.runsub("report", "--html", "none.html", "--queue", "nosuchqueue")
    assert unknown.ret == 4 and "no queue 'nosuchqueue'" in unknown.stderr
    nothing = fleeter.runsub("report", "--html", "none.html", "elsewhere.toml")
    assert nothing.ret == 4 and "no run of" in nothing.stderr
    assert not (fleeter.path / "none.html").exists()


def test_report_reads_a_home_on_a_read_only_mount(fleeter: Any, tmp_path: Path) -> None:
    """A machine that only reads the home (a read-only mount of it): ``fleetrun report``
    draws the run from the ledger as it is (it could write nothing there if it tried).
    (Needs root and mount: skipped without them, as the disk-full tests are.)"""
    fleeter.write_tasks(ECHO_AGENT + echo_task("ok", verify="true") + echo_task("bad", verify="false", max_retries=0))
    assert fleeter.runsub("tasks.toml").ret == 1
    # as a home is once every writer is gone (fleeter's read-only looks keep the WAL's
    # files): SQLite takes them away, and a reader on the mount cannot make them again
    import sqlite3

    conn = sqlite3.connect(str(fleeter.home / "state.db"))
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    assert not (fleeter.home / "state.db-wal").exists() and not (fleeter.home / "state.db-shm").exists()
    ro = tmp_path / "ro"
    ro.mkdir()
    try:
        mounted = subprocess.run(
            ["mount", "--bind", "-o", "ro", str(fleeter.home), str(ro)], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError) as e:
        pytest.skip(f"cannot bind-mount the home read-only: {e}")
    if mounted.returncode != 0:
        pytest.skip(
            "cannot bind-mount the home read-only (needs root and mount permission): "
            + (mounted.stderr.strip() or f"exit {mounted.returncode}")
        )
    try:
        result = fleeter.runsub("report", "--html", "night.html", "tasks.toml", env={"FLEETRUN_HOME": str(ro)})
        assert result.ret == 0, result.stdout + result.stderr
    finally:
        subprocess.run(["umount", str(ro)], capture_output=True)
        if os.path.ismount(ro):
            subprocess.run(["umount", "-l", str(ro)], capture_output=True)
    doc = parse(fleeter.path / "night.html")
    assert [(r.attrs["data-task"], r.attrs["data-state"]) for r in rows(doc)] == [
        ("bad", "NEEDS_HUMAN"),
        ("ok", "DONE"),
    ]


def test_hostile_names_and_outputs_stay_text(fleeter: Any) -> None:
    """Names, reasons, verifier labels and output, notes, handoffs and prompts holding
    ``<script>``, ``<img onerror>``, ``javascript:`` links and SVG breakouts: the DOM
    holds no element the agent wrote, and the characters are all shown as text."""
    a_night_on_three_hosts(fleeter.home, hostile=True)
    result = fleeter.runsub("report", "--html", "night.html")
    assert result.ret == 0, result.stdout + result.stderr
    doc = parse(fleeter.path / "night.html")
    check_inert(doc)
    evil = " ".join(HOSTILE)
    # the peer's far-off clock does not stretch the axis: every bar is drawn within it
    svg = doc.iter("svg")[0]
    assert all(
        float(r.attrs["x"]) >= 0 and float(r.attrs["x"]) + float(r.attrs["width"]) <= float(svg.attrs["width"])
        for b in bars(doc)
        for r in b.iter("rect")
    )
    # and none is squeezed to nothing by it (an axis stretched to the far-off clock draws
    # a 1.5 s bar 0.00 px wide); how wide a bar is otherwise depends on how long after the
    # ledger was written the report ran (the waiting task's lane runs to now)
    assert all(float(r.attrs["width"]) >= 1 for b in bars(doc) for r in b.iter("rect") if "bar" in r.classes())
    bar = next(b for b in bars(doc) if b.attrs["data-outcome"] == "needs-human")
    assert bar.attrs["data-task"] == f"{evil} local"  # an attribute: as it was
    assert evil in title_of(bar)  # an SVG title: text
    assert evil in title_of(next(s for s in bar.iter("rect") if "seg-verify-fail" in s.classes()))
    details = next(d for d in doc.iter("details") if d.attrs.get("data-task") == f"{evil} local")
    text = details.all_text()
    for where in ("retries_exhausted:" + evil, "the prompt " + evil):
        assert where in text, where
    assert text.count(HOSTILE[0]) >= 6  # name, reason, label, output, note, handoff, prompt...


def find_chromium() -> Optional[str]:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def chromium(args: list[str], profile: str) -> subprocess.CompletedProcess[str]:
    exe = find_chromium()
    assert exe is not None
    return subprocess.run(
        [
            exe,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def test_chromium_draws_the_bars_and_rows(fleeter: Any, tmp_path: Path) -> None:
    """The page in a real browser (Debian's chromium, headless): the DOM it builds holds
    the timeline's bars and the table's rows, nothing hostile became an element, the
    page's script runs under its CSP (a link to a task opens its details), and it takes
    a screenshot."""
    if find_chromium() is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed (.ci/run installs it)")
        pytest.skip("chromium is not installed")
    a_night_on_three_hosts(fleeter.home, hostile=True)
    assert fleeter.runsub("report", "--html", "night.html").ret == 0
    url = (fleeter.path / "night.html").as_uri()
    with tempfile.TemporaryDirectory(dir=tmp_path) as profile:
        dumped = chromium(["--dump-dom", url], profile)
    assert dumped.returncode == 0, dumped.stderr
    dom_file = tmp_path / "dom.html"
    dom_file.write_text(dumped.stdout, encoding="utf-8")
    doc = parse(dom_file)
    check_inert(doc)
    assert len(bars(doc)) == 3 and all(b.iter("rect") for b in bars(doc))
    assert len(rows(doc)) == 4 and not [r for r in rows(doc) if "hidden" in r.attrs]
    # the page's own script ran under its CSP (the hash is right): a link to a task's
    # details opens them
    anchor = bars(doc)[0].attrs["href"]
    with tempfile.TemporaryDirectory(dir=tmp_path) as profile:
        opened = chromium(["--dump-dom", url + anchor], profile)
    assert opened.returncode == 0, opened.stderr
    dom_file.write_text(opened.stdout, encoding="utf-8")
    details = {d.attrs["id"]: "open" in d.attrs for d in parse(dom_file).iter("details") if "task" in d.classes()}
    assert details[anchor[1:]] and sum(details.values()) == 1, details
    shot = tmp_path / "shot.png"
    with tempfile.TemporaryDirectory(dir=tmp_path) as profile:
        taken = chromium([f"--screenshot={shot}", "--window-size=1300,900", url], profile)
    assert taken.returncode == 0, taken.stderr
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_report_is_built_from_the_ledgers_public_api_only() -> None:
    """The plugin reads the ledger through its public methods (no SQL of its own)."""
    src = "".join(p.read_text() for p in PLUGIN_DIR.glob("*.py"))
    assert "def build" in src
    assert "execute(" not in src and ".conn" not in src and "sqlite3" not in src


def test_what_a_wait_was_for_is_read_from_the_transition_before_it() -> None:
    """Pure: the wait before an attempt is named by the transition that began it (a
    dependency, a slot, a retry's backoff, a usage limit's reset)."""
    from fleetrun.ledger import Attempt, TransitionRow
    from fleetrun.plugins.htmlreport import model

    def tr(i: int, src: Optional[str], dst: str, cause: str, t: float, attempt: Optional[int] = None) -> TransitionRow:
        return TransitionRow(
            id=i, task_id="t", from_state=src, to_state=dst, cause=cause, time=t, attempt=attempt, host=None
        )

    trs = [
        tr(1, None, "PENDING", "queued", 0),
        tr(2, "PENDING", "READY", "dependencies_done", 10),
        tr(3, "READY", "ASSIGNED", "placed", 12, 1),
        tr(4, "ASSIGNED", "RUNNING", "started", 13, 1),
        tr(5, "RUNNING", "RESUMING", "usage_limit:usage limit, resumes at 03:00", 20, 1),
        tr(6, "RESUMING", "ASSIGNED", "placed", 50, 2),
        tr(7, "ASSIGNED", "RUNNING", "started", 51, 2),
        tr(8, "VERIFYING", "RETRYING", "verify_fail:unit", 60, 2),
        tr(9, "RETRYING", "ASSIGNED", "placed", 70, 3),
    ]

    def att(n: int, created: float) -> Attempt:
        return Attempt(id=f"a{n}", task_id="t", number=n, kind="fresh", host="local", state="ended", created=created)

    assert model._wait_before(att(1, 12), trs) == (0, "PENDING", "dependencies_done")
    assert model._wait_before(att(2, 50), trs) == (20, "RESUMING", "usage_limit:usage limit, resumes at 03:00")
    assert model._wait_before(att(3, 70), trs) == (60, "RETRYING", "verify_fail:unit")
    assert model._outcome(att(1, 12), trs) == ("died", "RESUMING", "usage_limit:usage limit, resumes at 03:00")
    assert model._outcome(att(2, 50), trs) == ("failed", "RETRYING", "verify_fail:unit")
    assert model._outcome(att(3, 70), trs) == ("running", "", "")
    # a verifier that could not judge (not the agent's failure), and its record read defensively
    trs.append(tr(10, "VERIFYING", "NEEDS_HUMAN", "verifier_error:unit: pytest: not found", 80, 3))
    assert model._outcome(att(3, 70), trs) == (
        "verifier-error",
        "NEEDS_HUMAN",
        "verifier_error:unit: pytest: not found",
    )
    a3 = att(3, 70)
    a3.info = {"verify_error": {"idx": 0, "label": "unit", "error": "permanent", "reason": "pytest: not found"}}
    assert model.verify_error(a3) == "unit: pytest: not found (permanent)"
    for junk in ({"verify_error": "a string"}, {"verify_error": None}, {}, {"verify_error": {"label": ["x"]}}):
        a3.info = junk
        assert isinstance(model.verify_error(a3), str)

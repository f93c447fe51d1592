"""Built-in ``htmlreport`` plugin: the night at a glance, one self-contained HTML file.

``fleetrun tasks.toml --html report.html`` (as pytest-html's ``--html``) writes the
report of the run's queues: a timeline (SVG, one lane per host, one bar per attempt
with its setup and verifiers as segments, the waits before it, dependencies as
arrows), a table of every task sorted so what needs a person comes first, and each
task's details (transitions, verdicts and failing output, prompts, handoffs, cost).
While the run goes on the file is rewritten at most every :data:`REWRITE_EVERY`
seconds (on ``fleetrun_loop_pass``; less often if drawing it took more than a
twentieth of that), so a browser reload shows the night so far; the
run's end writes it once more.

``fleetrun report --html PATH [FILE ...]`` writes the same page after the fact from the
ledger alone: the last queue of those tasks files, ``--queue ID``, or with neither the
newest queue of the home.

Everything it shows comes from the ledger's public API (:mod:`.model`), and is drawn
by Jinja2 with autoescaping (:mod:`.render`): a name, reason or output an agent wrote
stays text. ``-p no:htmlreport`` removes the option and the verb.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any, Optional, TextIO

from ...hookimpl import hookimpl

if TYPE_CHECKING:
    import argparse

    from ...config import Config
    from ...ledger import Ledger

#: The name the reporter object is registered under while a run writes a report.
REPORTER = "htmlreport-reporter"
#: The least time between two rewrites of the file while a run goes on, in seconds.
REWRITE_EVERY = 10.0


@hookimpl
def fleetrun_addoption(parser: Any, pluginmanager: Any) -> None:
    group = parser.getgroup("htmlreport", "HTML report")
    group.addoption(
        "--html",
        dest="htmlpath",
        metavar="PATH",
        default=None,
        help="write a self-contained HTML report of the run (timeline, table, details) to PATH, "
        "rewritten as the run goes",
    )


@hookimpl
def fleetrun_verbs(pluginmanager: Any) -> list[Any]:
    """``report``: the HTML report of a queue, after the fact, from the ledger."""
    from ...verbs import VerbDecl

    return [
        VerbDecl(
            name="report",
            help="report --html PATH [FILE ...] [--queue ID]: the HTML report of the last "
            "run of FILE (or of a queue) from the ledger",
            run=_run_report,
            add_arguments=_report_arguments,
            reads_config=False,
        )
    ]


def _report_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--html", dest="report_html", metavar="PATH", required=True, help="where to write the report")
    parser.add_argument(
        "--queue",
        dest="queue",
        metavar="ID",
        default=None,
        help="the queue to report (its id, as status --json gives it)",
    )
    parser.add_argument(
        "report_files",
        metavar="FILE",
        nargs="*",
        help="tasks files: the report is of their last run (default: the newest queue)",
    )


def _resolve(config: Config, name: str) -> str:
    path = os.path.abspath(os.path.join(str(config.invocation_dir), os.path.expanduser(name)))
    return os.path.join(path, "tasks.toml") if os.path.isdir(path) else path


def _run_report(config: Config, out: TextIO, err: TextIO) -> int:
    from ...ledger import Ledger

    # read only: the report writes nothing to the home, so it can be drawn from a home
    # on a read-only mount, or from a copy of one
    with Ledger(config.home / "state.db", readonly=True) as led:
        return _report(config, led, out)


def _report(config: Config, led: Ledger, out: TextIO) -> int:
    from ...exceptions import ExitCode, UsageError

    files = [_resolve(config, f) for f in config.option.report_files or []]
    queue: Optional[str] = config.option.queue
    if files and queue:
        raise UsageError("give tasks files or --queue, not both", key="report")
    if files:
        source = ",".join(files)
        rows = led.tasks_of_source(source)
        if not rows:
            raise UsageError(f"no run of {', '.join(files)} in the ledger ({config.home}); run it first", key="report")
        newest = max(rows, key=lambda r: (r[0].created, r[0].queue_id))[0]
        queue = newest.queue_id
    elif queue is None:
        every = led.tasks()
        if not every:
            raise UsageError(f"the ledger ({config.home}) holds no task yet", key="report")
        queue = max(every, key=lambda t: (t.created, t.queue_id)).queue_id
    tasks = led.tasks(queue_id=queue)
    if not tasks:
        raise UsageError(f"no queue {queue!r} in the ledger ({config.home})", key="report")
    path = _resolve_out(config, config.option.report_html)
    try:
        write_report(led, tasks, path, live=False)
    except OSError as e:  # the user's path: a mistake of theirs, said as one
        raise UsageError(f"cannot write {path}: {e.strerror or e}", key="--html") from None
    out.write(f"wrote {path}: {len(tasks)} tasks of queue {queue}\n")
    return int(ExitCode.OK)


def _resolve_out(config: Config, name: str) -> str:
    return os.path.abspath(os.path.join(str(config.invocation_dir), os.path.expanduser(name)))


def title_of(tasks: list[Any]) -> str:
    sources = sorted({os.path.basename(s) for t in tasks for s in (t.source or "").split(",") if s})
    return "fleetrun: " + (", ".join(sources) if sources else "tasks")


def write_report(ledger: Ledger, tasks: list[Any], path: str, live: bool) -> None:
    """Draw ``tasks`` as the ledger has them now and write the page to ``path``."""
    from . import model, render

    report = model.build(ledger, tasks, title_of(tasks), live=live)
    render.write(path, render.render(report))


@hookimpl
def fleetrun_configure(config: Config) -> None:
    path = config.getoption("htmlpath")
    if not path or config.pluginmanager.get_plugin(REPORTER) is not None:
        return
    config.pluginmanager.register(HtmlReporter(_resolve_out(config, path), config), REPORTER)


@hookimpl
def fleetrun_unconfigure(config: Config) -> None:
    reporter = config.pluginmanager.get_plugin(REPORTER)
    if reporter is not None:
        config.pluginmanager.unregister(reporter)


class HtmlReporter:
    """Notes the queues a run moves; rewrites the page as it goes and at its end."""

    def __init__(self, path: str, config: Config) -> None:
        self.path = path
        self.config = config
        self.queues: list[str] = []
        self.last_write = 0.0
        self.every = REWRITE_EVERY
        self.dirty = False
        self.warned = False

    @hookimpl
    def fleetrun_transition(
        self, task: Any, from_state: str, to_state: str, cause: str, attempt: Optional[int], config: Config
    ) -> None:
        if task.queue_id not in self.queues:
            self.queues.append(task.queue_id)
        self.dirty = True

    @hookimpl
    def fleetrun_loop_pass(self, config: Config, duration_s: float) -> None:
        # throttled: a pass comes at least once a second, and drawing 500 tasks is work
        now = time.monotonic()
        if not self.dirty or now - self.last_write < self.every:
            return
        from ...ledger import open_ledger

        self.write(open_ledger(config), live=True)
        # the loop's pass waits while the page is drawn: the bigger the night, the rarer
        # the rewrite (at most a twentieth of the loop's time)
        self.every = max(REWRITE_EVERY, 20 * (time.monotonic() - now))

    @hookimpl
    def fleetrun_sessionfinish(self, session: Any, exitstatus: int) -> None:
        ledger = getattr(session, "ledger", None)
        if ledger is None:
            from ...ledger import open_ledger

            ledger = open_ledger(self.config)
        for tid in getattr(session, "task_ids", []) or []:  # a run whose tasks were all done before
            task = ledger.get(tid)
            if task is not None and task.queue_id not in self.queues:
                self.queues.append(task.queue_id)
        self.write(ledger, live=False)

    def write(self, ledger: Ledger, live: bool) -> None:
        """Write the page; a path that cannot be written (a folder that is a file, a
        full disk) is said once on stderr and tried again later: the report is the
        user's view of the run, not a reason to stop it."""
        from . import model

        self.last_write = time.monotonic()
        self.dirty = False
        try:
            write_report(ledger, model.choose_tasks(ledger, self.queues), self.path, live=live)
        except OSError as e:
            if not self.warned or not live:
                self.warned = True
                import sys

                later = "; trying again as the run goes" if live else ""
                print(f"fleetrun: cannot write the HTML report {self.path}: {e}{later}", file=sys.stderr)

"""Built-in ``terminal`` plugin: what a run prints.

A header line, ``collected N tasks``, one line per transition as it happens, a
``waiting:`` line when a task's reason to wait changes, and a summary line:
``=== 2 done, 1 needs_human in 3m12s, $0.68 ===``. Colour (colorama) as ``--color``
says: by default only when the output is a terminal and ``NO_COLOR`` is not set.
``-q`` prints less, ``-v`` more. On a terminal, the live view
(:class:`fleetrun.liveview.LiveView`) keeps the running tasks below the lines.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Optional, TextIO

from ..hookimpl import hookimpl
from ..table import terminal_width
from ..textutil import safe_name, safe_text
from ..version import __version__

if TYPE_CHECKING:
    from ..config import Config

COLORS = {
    "DONE": "GREEN",
    "NEEDS_HUMAN": "RED",
    "CANCELLED": "RED",
    "RETRYING": "YELLOW",
    "RESUMING": "YELLOW",
    "RUNNING": "CYAN",
    "VERIFYING": "BLUE",
}


def fmt_duration(s: float) -> str:
    s = int(round(s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


class TerminalReporter:
    def __init__(self, config: Config, out: TextIO) -> None:
        self.config = config
        self.out = out
        self.verbosity = config.verbosity
        from ..liveview import color_wanted  # run and work only: off the path of --help and status

        self.color = color_wanted(config, out)  # --color, NO_COLOR
        self._fore: Any = None
        if self.color:
            import colorama

            self._fore = colorama.Fore
            self._reset = colorama.Style.RESET_ALL

    def paint(self, text: str, state: str) -> str:
        color = COLORS.get(state)
        if not self.color or not color:
            return text
        return f"{getattr(self._fore, color)}{text}{self._reset}"

    def write_line(self, line: str = "", state: Optional[str] = None) -> None:
        # names, causes, reasons and agent output are in the line: whatever control
        # characters they hold are shown, not sent (the colour codes come after)
        line = safe_text(line, keep="\t\n")
        if state:
            line = self.paint(line, state)
        try:
            self.out.write(line + "\n")
            self.out.flush()
        except (BrokenPipeError, ValueError):
            pass

    # -- hooks -------------------------------------------------------------------------

    @hookimpl(trylast=True)
    def fleetrun_sessionstart(self, session: Any) -> None:
        if self.verbosity < 0:
            return
        config = self.config
        names = [n for n, p in config.pluginmanager.list_name_plugin() if p is not None and not n.startswith("<")]
        short = [
            n.rsplit(".", 1)[-1] if n.startswith("fleetrun.") else ("fleetconf" if n.endswith("fleetconf.py") else n)
            for n in names
        ]
        self.write_line(f"fleetrun {__version__} -- home {config.home} -- plugins: {', '.join(short)}")
        for lines in reversed(config.hook.fleetrun_report_header(config=config)):  # outermost first
            for line in lines or ():
                self.write_line(line)
        if session.items:
            n = len(session.items)
            self.write_line(f"collected {n} task{'s' if n != 1 else ''}")
        from ..session import SESSION_NOTES_KEY  # loaded by then: it calls this hook

        for note in config.stash.get(SESSION_NOTES_KEY, []):
            self.write_line(note)

    @hookimpl(trylast=True)
    def fleetrun_transition(
        self, task: Any, from_state: str, to_state: str, cause: str, attempt: Any, config: Config
    ) -> None:
        if self.verbosity < 0 and to_state not in ("DONE", "NEEDS_HUMAN", "CANCELLED"):
            return
        if (not from_state or to_state == "ASSIGNED") and self.verbosity < 1:
            return  # "queued" and "placed" lines only with -v: RUNNING follows at once
        stamp = time.strftime("%H:%M:%S")
        att = f" (attempt {attempt})" if attempt else ""
        where = f" on {task.host}" if to_state in ("ASSIGNED", "RUNNING") and task.host else ""
        self.write_line(
            f"{stamp} {safe_name(task.name)} {to_state}{att}{safe_text(where)}  {safe_text(cause)}", to_state
        )

    @hookimpl(wrapper=True)
    def fleetrun_setup_step(
        self, task: Any, step: Any, number: int, workspace: Any, attempt: Any, host: Any, config: Config
    ) -> Any:
        """Say that a setup command started (a venv and a pip install can take minutes:
        the run is not silent meanwhile); whoever runs it answers as before."""
        if self.verbosity >= 0:
            where = f" on {host.name}" if not getattr(host, "local", True) else ""
            self.write_line(
                f"{time.strftime('%H:%M:%S')} {safe_name(task.name)} setup {number} of "
                f"{len(task.spec.setup)} started{safe_text(where)}: `{safe_text(step.label)}`"
            )
        return (yield)

    @hookimpl(wrapper=True)
    def fleetrun_verify(self, task: Any, verifier: Any, workspace: Any, attempt: Any, host: Any, config: Config) -> Any:
        """Say what a verifier's baseline found; whoever runs it answers as before."""
        got = yield
        if getattr(verifier, "kind", None) == "baseline" and self.verbosity >= 0:
            # a verifier's run on the base commit (docs/verifiers.md): what it found, or that it started
            what = (
                f"{got.reason}"
                if getattr(got, "reason", None) is not None and hasattr(got, "passed")
                else "started (the verifier on the base commit)"
            )
            self.write_line(
                f"{time.strftime('%H:%M:%S')} {safe_name(task.name)} baseline "
                f"`{safe_text(verifier.label)}`: {safe_text(what)}"
            )
        return got

    @hookimpl(trylast=True)
    def fleetrun_task_waiting(self, task: Any, reason: str, config: Config) -> None:
        if self.verbosity >= 0:
            self.write_line(f"waiting: {safe_text(task.id)} ({safe_name(task.name)}): {safe_text(reason)}")

    @hookimpl(trylast=True)
    def fleetrun_verdict(self, task: Any, verdict: Any, attempt: Any, config: Config) -> None:
        if self.verbosity < 0:
            return
        # ERROR: the verifier could not judge (the work is neither passed nor failed)
        word = "ERROR" if getattr(verdict, "error", None) else ("PASS" if verdict.passed else "FAIL")
        cost = f" ${verdict.cost_usd:.2f}" if verdict.cost_usd else ""
        self.write_line(
            f"         {safe_name(task.name)} verify {safe_text(verdict.kind)} `{safe_text(verdict.label)}`: "
            f"{word} ({safe_text(verdict.reason)}){cost}",
            "DONE" if verdict.passed else "RETRYING",
        )
        if not verdict.passed and verdict.output:  # what failed, without -v too (a few lines, cut)
            # imported here: `fleetrun --help` loads this plugin, but needs none of its summary
            from .summary import failure_tail

            for line in failure_tail(verdict.output, self.verbosity, terminal_width(self.out)):
                self.write_line(line)

    @hookimpl(trylast=True)
    def fleetrun_sessionfinish(self, session: Any, exitstatus: int) -> None:
        counts: dict[str, int] = session.counts if hasattr(session, "counts") else {}
        self.config.hook.fleetrun_terminal_summary(config=self.config, exitstatus=exitstatus, counts=counts)
        self.summary_sections(session)
        parts = [f"{n} {state.lower()}" for state, n in counts.items() if n]
        cost = getattr(session, "cost_usd", 0.0)
        text = f"=== {', '.join(parts) or 'no tasks'} in {fmt_duration(time.time() - session.started)}"
        if getattr(session, "cost_unknown", False):  # a session that never reported its cost
            text += f", ${cost:.2f}+"
        elif cost:
            text += f", ${cost:.2f}"
        older = getattr(session, "older_tasks", 0)
        if older:  # `fleetrun work` counts what it worked on, not the whole ledger
            text += f" (this run; {older} older task{'s' if older != 1 else ''} not shown: fleetrun status --all)"
        text += " ==="
        state = "DONE" if exitstatus == 0 else "NEEDS_HUMAN"
        for line in session.final_notes if hasattr(session, "final_notes") else ():
            self.write_line(line)
        self.write_line(text, state)

    def summary_sections(self, session: Any) -> None:
        """``--durations N``, where the work is (when a task ran on a peer) and the
        ``short task summary info`` of what needs a human, after the plugins' summaries
        and before the final line, as in pytest."""
        led = getattr(session, "ledger", None)
        task_ids: list[str] = getattr(session, "task_ids", [])
        if led is None:
            return
        from .summary import durations, short_summary, where_work_is

        n = self.config.getoption("durations")
        if n is not None and self.verbosity >= -1:
            for line in durations(led, task_ids, session.started, n, self.verbosity):
                self.write_line(line)
        if self.verbosity >= -1:
            for line in where_work_is(led, task_ids):
                self.write_line(line)
        if self.verbosity >= -1:
            for line, state in short_summary(led, task_ids):
                self.write_line(line, state or None)


# a name of its own (specname): the module's other options come from its
# fleetrun_addoption, and a second function of that name would hide one of them
@hookimpl(trylast=True, specname="fleetrun_addoption")
def addoption_durations(parser: Any) -> None:
    parser.getgroup("terminal", "what a run prints").addoption(
        "--durations",
        type=_durations_arg,
        default=None,
        metavar="N",
        help="list the N slowest tasks and verifiers at the end of the run (0: all)",
    )


def _durations_arg(text: str) -> int:
    import argparse

    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative; 0 lists all")
    return n


@hookimpl(trylast=True)
def fleetrun_addoption(parser: Any) -> None:
    parser.getgroup("terminal", "what a run prints").addoption(
        "--color",
        choices=("yes", "no", "auto"),
        default="auto",
        help="colour the output: yes, no, or auto (on a terminal, unless NO_COLOR is set)",
    )


@hookimpl(trylast=True)
def fleetrun_configure(config: Config) -> None:
    if config.option.verb in ("run", "work"):
        from ..liveview import LiveView, live_wanted

        if live_wanted(config, config.out):  # before the reporter: its lines go above the region
            config.pluginmanager.register(LiveView(config, config.out), "liveview")
        config.pluginmanager.register(TerminalReporter(config, config.out), "terminalreporter")


@hookimpl(trylast=True)
def fleetrun_unconfigure(config: Config) -> None:
    rep = config.pluginmanager.get_plugin("terminalreporter")
    if rep is not None:
        config.pluginmanager.unregister(rep)
    live = config.pluginmanager.get_plugin("liveview")
    if live is not None:  # a run that ended without its sessionfinish (Ctrl-C in collection)
        live.stop()
        config.pluginmanager.unregister(live)

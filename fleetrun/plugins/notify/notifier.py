"""The ``notify`` plugin's object for one run: hooks in, messages out.

The hooks (a task went NEEDS_HUMAN, a host was paused) only add to the
:class:`~.messages.Batch`; the batch goes out from the loop's own wait
(:class:`~fleetrun.waiting.Ticker`: a turn before each of the loop's sleeps, on its
thread), when its window is over, and whatever is held goes out when the run ends, with
the run's summary. The sending itself is the :class:`~.sender.Sender`'s thread: the loop
never waits on an endpoint (at the very end, at most ``END_WAIT_S``).
"""

from __future__ import annotations

import shlex
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ... import clock
from ...home import default_home
from ...hookimpl import hookimpl
from ...textutil import safe_text
from ...waiting import TICKERS_KEY
from .messages import Batch, Item, Message, NeedsHuman, Paused, batch_message, run_end_message
from .sender import END_WAIT_S, Outcome, make_sender

if TYPE_CHECKING:
    from ...config import Config

#: What :meth:`Notifier.tick` asks for with nothing held: the loop wakes each second anyway.
IDLE_S = 3600.0


class Notifier:
    """Holds the run's events and sends them (``[notify]`` of config.toml).

    :param events: the events to send, a subset of :data:`~.messages.EVENTS`.
    :param min_interval: the batch window, in seconds.
    """

    def __init__(self, config: Config, urls: list[str], events: list[str], min_interval: float) -> None:
        self.config = config
        self.events = frozenset(events)
        self.sender = make_sender(urls)
        self.batch = Batch(min_interval)
        self.machine = safe_text(socket.gethostname() or "this machine")
        # the commands a message gives must reach this home from a shell of the user's
        self.home_opt = "" if config.home == default_home() else f" --home {shlex.quote(str(config.home))}"
        self.handed = 0  # messages handed to the sender
        self.failed: dict[str, tuple[int, str]] = {}  # URL -> (messages not sent there, last reason)
        self.warned = False
        self.finished = False
        config.stash.setdefault(TICKERS_KEY, []).append(self)

    # -- hooks -----------------------------------------------------------------------------

    @hookimpl(trylast=True)
    def fleetrun_transition(
        self, task: Any, from_state: str, to_state: str, cause: str, attempt: Any, config: Config
    ) -> None:
        if to_state == "NEEDS_HUMAN" and "needs_human" in self.events:
            self.hold(NeedsHuman(task.id, task.name, cause, attempt))

    @hookimpl(trylast=True)
    def fleetrun_host_paused(self, host: str, until: float, reason: str, config: Config) -> None:
        if "paused" in self.events:
            self.hold(Paused(host, until, reason))

    # not trylast: before the terminal's summary (trylast), which prints the notes added here
    @hookimpl
    def fleetrun_sessionfinish(self, session: Any, exitstatus: int) -> None:
        self.finished = True
        self.flush(force=True)
        if "run_end" in self.events:
            files = [self._display(f) for f in (getattr(self.config.option, "files", None) or [])]
            self.send(
                run_end_message(
                    session.counts,
                    exitstatus,
                    time.time() - session.started,
                    session.cost_usd,
                    bool(getattr(session, "cost_unknown", False)),
                    files,
                    self.machine,
                    self.home_opt,
                )
            )
        self.account(self.sender.close(END_WAIT_S))
        session.final_notes.extend(self.notes())

    # -- the loop's turn -------------------------------------------------------------------

    def tick(self) -> float:
        """Note what came back from the sender; send the batch when its window is over.
        :return: seconds until the batch is due."""
        self.account(self.sender.done())
        self.flush()
        wait = self.batch.wait(clock.now())
        return IDLE_S if wait is None else wait

    def hold(self, item: Item) -> None:
        self.batch.add(item, clock.now())

    def flush(self, force: bool = False) -> None:
        items = self.batch.take(clock.now(), force=force)
        if items:
            self.send(batch_message(items, self.machine, self.home_opt))

    def send(self, message: Message) -> None:
        self.handed += 1
        self.sender.send(message)

    def account(self, outcomes: list[Outcome]) -> None:
        """Count the failures; the first of the run is said at once, on one line (the run
        goes on, and its end says how many)."""
        for outcome in outcomes:
            for url, reason in outcome.failures:
                n, _ = self.failed.get(url, (0, ""))
                self.failed[url] = (n + 1, reason)
                if not self.warned:
                    self.warned = True
                    self.warn(
                        f"warning: notify: could not send to {url}: {reason} (the run goes on; "
                        "its end says how many were not sent)"
                    )

    def warn(self, line: str) -> None:
        line = safe_text(line)
        reporter = self.config.get_plugin("terminalreporter")
        if reporter is not None:  # above the live view, if there is one
            reporter.write_line(line)
            return
        try:
            self.config.err.write(line + "\n")
            self.config.err.flush()
        except (OSError, ValueError):
            pass

    def notes(self) -> list[str]:
        """What the run's end says about notifications that did not go out."""
        total = self.handed - self.sender.dropped
        out = []
        for url, (n, reason) in self.failed.items():
            out.append(
                f"notify: {n} of {total} notification{'s' if total != 1 else ''} "
                f"{'was' if n == 1 else 'were'} not sent to {url} (last: {reason})"
            )
        if self.sender.pending:
            out.append(
                f"notify: {self.sender.pending} notification(s) not sent within {END_WAIT_S:g}s "
                "of the run's end were given up"
            )
        if self.sender.dropped:
            out.append(f"notify: {self.sender.dropped} notification(s) dropped: the endpoints did not keep up")
        return [safe_text(line) for line in out]

    def close(self) -> None:
        """The command is over (``fleetrun_unconfigure``): a run that ended without its
        ``sessionfinish`` (an internal error) still sends what is held."""
        tickers = self.config.stash.get(TICKERS_KEY, [])
        if self in tickers:
            tickers.remove(self)
        if not self.finished:
            self.finished = True
            self.flush(force=True)
            self.account(self.sender.close(END_WAIT_S))
            for line in self.notes():
                self.warn(line)

    def _display(self, path: str) -> str:
        from ...collect import display_path

        return display_path(Path(path), self.config.invocation_dir)

"""The apprise side of the ``notify`` plugin: the URLs checked and parsed, and the one
thread that sends.

Why a thread: the loop is single-threaded and ``select()``-based, and an HTTP post to a
slow endpoint (apprise waits up to its connect and read timeouts, 4 s each by default,
per URL and per retry) would hold up every task meanwhile. The thread only runs apprise:
it gets finished :class:`~.messages.Message` objects through a bounded queue and hands
back an :class:`Outcome` for each through another; it calls no hook and touches no
state of the loop's, so nothing needs a lock. A full queue (an endpoint that hangs
through :data:`QUEUE_MAX` messages) drops the new message, counted. At the run's end the
loop waits for what is queued at most :data:`END_WAIT_S` seconds, then goes on; the
thread is a daemon, so a hung post never keeps the process alive.

apprise is imported only here, and only when ``[notify] urls`` is set for a run (its
start-up costs about 0.4 s): never on the paths of ``--help`` or ``status``.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Optional

from .messages import Message

#: Messages waiting for the thread at most; one more is dropped (and counted).
QUEUE_MAX = 32
#: At the run's end, how long the last messages may take to go out, in all.
END_WAIT_S = 10.0

NOT_INSTALLED = "needs apprise, which is not installed: pip install 'fleetrun[notify]'"


def load_apprise() -> Any:
    """``import apprise``, its deprecation noise left out (its service modules import
    ``imghdr``, which Python 3.11+ warns about when they load, on the first URL parsed).

    :raises ImportError: apprise is not installed.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import apprise
    return apprise


def _parse(apprise: Any, url: str) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return apprise.Apprise.instantiate(url)


def _shown(url: str) -> str:
    """A URL as an error may show it: its scheme only, since the rest may hold a token."""
    return f"{url.split('://', 1)[0]}://..." if "://" in url else "no scheme://"


def check_urls(urls: list[str]) -> Optional[str]:
    """What is wrong with ``[notify] urls`` (apprise is missing, a URL it cannot parse),
    or None. A ``ConfigKey`` check: the error gets the file and line of the key."""
    try:
        apprise = load_apprise()
    except ImportError:
        return NOT_INSTALLED
    bad = [f"item {n} ({_shown(u)})" for n, u in enumerate(urls, 1) if not u.strip() or _parse(apprise, u) is None]
    if not bad:
        return None
    return (
        f"{', '.join(bad)} {'is' if len(bad) == 1 else 'are'} not a URL apprise can send to (its services "
        "and their URLs: https://github.com/caronc/apprise/wiki)"
    )


def display_url(server: Any) -> str:
    """A service's URL with its secrets masked by apprise (``privacy=True``), without its
    query (apprise adds every default option there)."""
    try:
        return str(server.url(privacy=True)).split("?", 1)[0]
    except Exception:  # a service's bug: name it by its class
        return type(server).__name__


@dataclass
class Outcome:
    """How one message went: ``failures`` holds ``(url, reason)`` for each URL it could
    not be sent to (empty: sent to every one)."""

    message: Message
    failures: list[tuple[str, str]] = field(default_factory=list)


class Sender:
    """Sends messages to every service of ``services`` on a thread of its own, started
    with the first message. Used from the loop's thread only (the queues excepted).

    :param apprise: the module (:func:`load_apprise`).
    """

    def __init__(self, apprise: Any, services: list[Any]) -> None:
        self.apprise = apprise
        self.services = services
        self.queue: queue.Queue[Optional[Message]] = queue.Queue(QUEUE_MAX)
        self.outcomes: queue.Queue[Outcome] = queue.Queue()
        self.thread: Optional[threading.Thread] = None
        self.pending = 0  # handed over, no outcome yet
        self.dropped = 0

    def send(self, message: Message) -> None:
        if self.thread is None:
            self.thread = threading.Thread(target=self._work, name="fleetrun-notify", daemon=True)
            self.thread.start()
        try:
            self.queue.put_nowait(message)
        except queue.Full:
            self.dropped += 1
            return
        self.pending += 1

    def done(self) -> list[Outcome]:
        """The outcomes that came back since the last call."""
        out = []
        while True:
            try:
                out.append(self.outcomes.get_nowait())
            except queue.Empty:
                break
        self.pending -= len(out)
        return out

    def close(self, timeout: float = END_WAIT_S) -> list[Outcome]:
        """Let the thread send what it holds, for ``timeout`` seconds at most, then stop
        it. :return: the outcomes that came back meanwhile (``pending`` counts the rest)."""
        if self.thread is not None:
            deadline = time.monotonic() + timeout
            try:
                self.queue.put(None, timeout=timeout)
            except queue.Full:
                pass  # hung with a full queue: the join below gives up too
            self.thread.join(max(0.0, deadline - time.monotonic()))
        return self.done()

    # -- the thread ----------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            message = self.queue.get()
            if message is None:
                return
            failures = [f for f in (self._send_one(s, message) for s in self.services) if f]
            self.outcomes.put(Outcome(message, failures))

    def _send_one(self, service: Any, message: Message) -> Optional[tuple[str, str]]:
        apprise = self.apprise
        try:
            with apprise.LogCapture(level=logging.WARNING, fmt="%(message)s") as logs:
                ok = service.notify(
                    body=message.body,
                    title=message.title,
                    notify_type=getattr(apprise.NotifyType, message.kind.upper()),
                    body_format=apprise.NotifyFormat.TEXT,
                )
            said = [ln for ln in logs.getvalue().splitlines() if ln.strip()]
        except Exception as e:  # a service's own bug is a failed notification, never the loop's
            return display_url(service), f"{type(e).__name__}: {e}"
        if ok:
            return None
        return display_url(service), " ".join(said[-1].split()) if said else "not sent"


def make_sender(urls: list[str]) -> Sender:
    """A :class:`Sender` to the services of ``urls`` (checked already by :func:`check_urls`)."""
    apprise = load_apprise()
    return Sender(apprise, [s for s in (_parse(apprise, u) for u in urls) if s is not None])

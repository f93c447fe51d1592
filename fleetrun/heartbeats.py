"""Host heartbeats, posted from any thread and delivered to ``fleetrun_host_heartbeat``
on the loop's thread.

Hooks run on the main thread (plugins need no locks), but a host plugin may probe its
hosts from threads of its own (the relay's heartbeats do). Such a thread calls
:func:`post`; the loop's wait gives the :class:`Heartbeats` box a turn
(:data:`fleetrun.waiting.TICKERS_KEY`), which calls the hook for what was posted.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Any

from .stash import StashKey
from .waiting import TICKERS_KEY

if TYPE_CHECKING:
    from .config import Config

#: A work loop that is down for long must not pile up heartbeats without end.
MAX_PENDING = 1000


class Heartbeats:
    """What host threads posted and the loop has not delivered yet (a ``deque``: its
    ``append`` and ``popleft`` are safe across threads)."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.pending: collections.deque[tuple[Any, dict[str, Any]]] = collections.deque(maxlen=MAX_PENDING)

    def tick(self) -> float:
        """Deliver what was posted; :return: the next turn is wanted in a second at most."""
        while True:
            try:
                host, info = self.pending.popleft()
            except IndexError:
                return 1.0
            self.config.hook.fleetrun_host_heartbeat(host=host, info=info, config=self.config)


#: The run's box, made on the loop's thread before the loop starts (:func:`install`).
HEARTBEATS_KEY = StashKey[Heartbeats]()


def install(config: Config) -> None:
    """Give the work loop's waits a box to deliver heartbeats from (once a run)."""
    if config.stash.get(HEARTBEATS_KEY) is None:
        box = config.stash[HEARTBEATS_KEY] = Heartbeats(config)
        config.stash.setdefault(TICKERS_KEY, []).append(box)


def post(config: Config, host: Any, info: dict[str, Any]) -> None:
    """From any thread: ``fleetrun_host_heartbeat(host, info)`` is to be called on the
    loop's thread. Dropped when no work loop runs (nothing would deliver it)."""
    box = config.stash.get(HEARTBEATS_KEY)
    if box is not None:
        box.pending.append((host, info))

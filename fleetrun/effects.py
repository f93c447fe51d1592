"""Effects off the loop's critical path: the milliseconds of a ``git worktree add`` or
``remove`` run on a worker thread while the loop handles other tasks' events.

Hooks run on the loop's thread (plugins need no locks), and so does everything that
touches the ledger or the stash. What a plugin hands to :meth:`Effects.submit` is the
effect alone: a function of its arguments (git under the repository's lock, say) that
reads no stash and writes no ledger. When it is over, its completion comes back as an
event: the worker wakes the loop through its wake-up socket, and the loop's next pass
calls :func:`deliver`, which runs each ``on_done`` on the loop's thread (where a plugin
turns an error into a note, as it did when the effect ran inline). A handle a hook
returns (the ``worktree`` plugin's workspace being made) polls its ``Future`` instead.

A run ends only once every effect submitted is over and delivered
(:meth:`Effects.pending`). A crash loses nothing the ledger does not know about: the
loop recorded what it decided before the effect was submitted, and adoption does again
what a crash left undone (docs/durability.md).
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from .liveness import wake_loop
from .stash import StashKey

if TYPE_CHECKING:
    from .config import Config

#: Worker threads. Effects on one repository wait for each other on its lock anyway;
#: a few threads let effects on different repositories overlap.
WORKERS = 4

Done = Callable[["Future[Any]"], None]


class Effects:
    """The run's worker threads and the completions they send back.

    :param home: the home whose loop is woken when an effect is over.
    :param workers: worker threads (:data:`WORKERS`).
    """

    def __init__(self, home: Path, workers: int = WORKERS) -> None:
        self.home = home
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fleetrun-effect")
        # completions not delivered yet (deque: append and popleft are safe across threads)
        self.done: collections.deque[tuple[Future[Any], Optional[Done]]] = collections.deque()
        self.outstanding = 0  # submitted, not delivered; touched on the loop's thread only

    def submit(self, fn: Callable[..., Any], *args: Any, on_done: Optional[Done] = None) -> Future[Any]:
        """Run ``fn(*args)`` on a worker thread. Call on the loop's thread.

        :param fn: the effect: reads no stash, writes no ledger, calls no hook.
        :param on_done: called with the finished ``Future`` on the loop's thread, by
            :func:`deliver` (``future.result()`` raises what ``fn`` raised).
        :return: the ``Future`` (a handle may poll ``done()`` on it).
        """
        self.outstanding += 1
        fut = self.pool.submit(fn, *args)
        fut.add_done_callback(lambda f: self._over(f, on_done))
        return fut

    def _over(self, fut: Future[Any], on_done: Optional[Done]) -> None:
        # on the worker thread, after the result is set: queued first, then the wake-up,
        # so a loop woken always finds it
        self.done.append((fut, on_done))
        wake_loop(self.home)

    def deliver(self) -> int:
        """Run the ``on_done`` of every effect that is over (loop's thread).

        :return: how many were delivered."""
        n = 0
        while True:
            try:
                fut, on_done = self.done.popleft()
            except IndexError:
                return n
            self.outstanding -= 1
            n += 1
            if on_done is not None:
                on_done(fut)

    @property
    def pending(self) -> bool:
        """Is an effect submitted and not yet delivered?"""
        return self.outstanding > 0

    def close(self, deliver: bool = True) -> None:
        """Wait for the effects still running and deliver them (the loop has ended).

        :param deliver: False after an internal error: only wait."""
        self.pool.shutdown(wait=True)
        if deliver:
            self.deliver()


#: The run's effects, made by the work session before its loop starts (:func:`install`).
EFFECTS_KEY = StashKey[Effects]()


def install(config: Config) -> Effects:
    """Give the run a worker for its effects (once a run)."""
    eff = config.stash.get(EFFECTS_KEY)
    if eff is None:
        eff = config.stash[EFFECTS_KEY] = Effects(config.home)
    return eff


def effects_of(config: Config) -> Optional[Effects]:
    """The run's effects, or None where no work loop runs (``fleetrun approve``, a
    test calling a hook): the caller then runs its effect inline."""
    return config.stash.get(EFFECTS_KEY)


def run_inline(fn: Callable[..., Any], *args: Any) -> Future[Any]:
    """``fn(*args)`` run here and now, as a finished ``Future`` (for an ``on_done``
    where no loop runs)."""
    fut: Future[Any] = Future()
    try:
        fut.set_result(fn(*args))
    except Exception as e:
        fut.set_exception(e)
    return fut


def deliver(config: Config) -> None:
    """The loop's pass: deliver the effects that are over (nothing without effects)."""
    eff = config.stash.get(EFFECTS_KEY)
    if eff is not None and eff.done:
        eff.deliver()


def pending(config: Config) -> bool:
    """Is an effect of the run still to be delivered (the run must not end yet)?"""
    eff = config.stash.get(EFFECTS_KEY)
    return eff is not None and eff.pending


def uninstall(config: Config, deliver: bool = True) -> None:
    """The loop has ended: wait for what still runs, deliver it (``deliver``), let the
    threads go."""
    eff = config.stash.get(EFFECTS_KEY)
    if eff is not None:
        del config.stash[EFFECTS_KEY]
        eff.close(deliver)

"""The loop's one table of pending work: what it waits on, by task.

Five kinds of work run off the loop's thread or in processes of their own and come back
as a handle the loop polls: a workspace being made (``starting.Preparing``), a start
not answered yet (``starting.Launching``: a peer's), a setup
command (``setupstage.SettingUp``), an ended attempt's work being collected
(``ending.Collecting``) and a verifier, its backoff or the handoff
(``verifying.Verifying``). They all live in one :class:`PendingTable`, keyed by their
kind and task; each stage sees its own kind through a :class:`PendingView` (a
``MutableMapping`` of task id to entry), and the loop polls every entry in one sweep
(:meth:`fleetrun.loop.Loop.poll_pending`), each with the same shape: poll the handle,
re-read the task's row, go on (or drop it: the task moved meanwhile).

Nothing here is durable: after a crash a restart finds in the ledger what each entry
was for (docs/durability.md, "Crash safety per action") and makes it again.
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from typing import Any, Generic, TypeVar

W = TypeVar("W")


class PendingTable:
    """Every pending entry of the loop, in the order they were added."""

    def __init__(self) -> None:
        self._entries: dict[tuple[type, str], Any] = {}

    def view(self, kind: type[W]) -> PendingView[W]:
        """The entries of ``kind``, by task id."""
        return PendingView(self, kind)

    def items(self) -> list[tuple[str, Any]]:
        """Every entry, as ``(task id, entry)``, oldest first (a snapshot: an entry added
        or removed while the caller goes through it is not seen)."""
        return [(task_id, entry) for (_kind, task_id), entry in self._entries.items()]

    def entries(self) -> list[Any]:
        return list(self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)


class PendingView(MutableMapping[str, W], Generic[W]):
    """One kind's entries of a :class:`PendingTable`, by task id."""

    def __init__(self, table: PendingTable, kind: type[W]) -> None:
        self._table = table
        self._kind = kind

    def __getitem__(self, task_id: str) -> W:
        got: W = self._table._entries[(self._kind, task_id)]
        return got

    def __setitem__(self, task_id: str, entry: W) -> None:
        assert isinstance(entry, self._kind), entry
        self._table._entries[(self._kind, task_id)] = entry

    def __delitem__(self, task_id: str) -> None:
        del self._table._entries[(self._kind, task_id)]

    def __iter__(self) -> Iterator[str]:
        return iter([task_id for (kind, task_id) in self._table._entries if kind is self._kind])

    def __len__(self) -> int:
        return sum(1 for (kind, _task_id) in self._table._entries if kind is self._kind)

    def __contains__(self, task_id: object) -> bool:
        return (self._kind, task_id) in self._table._entries

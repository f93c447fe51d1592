"""The loop's one table of pending work (fleetrun/pending.py): each stage's view of it."""

from __future__ import annotations

from dataclasses import dataclass

from fleetrun.pending import PendingTable


@dataclass
class A:
    n: int


@dataclass
class B:
    n: int


def test_one_table_seen_by_kind() -> None:
    table = PendingTable()
    a, b = table.view(A), table.view(B)
    a["t1"] = A(1)
    b["t1"] = B(2)  # a task may have an entry of each kind (a verifier of a cancelled task still ending)
    a["t2"] = A(3)
    assert len(table) == 3 and len(a) == 2 and len(b) == 1
    assert [(t, type(e).__name__) for t, e in table.items()] == [("t1", "A"), ("t1", "B"), ("t2", "A")]
    assert "t2" in a and "t2" not in b
    assert a.pop("t1") == A(1) and a.get("t1") is None and b["t1"] == B(2)
    b.clear()
    assert [t for t, _ in table.items()] == ["t2"]


def test_the_sweep_is_a_snapshot() -> None:
    table = PendingTable()
    a = table.view(A)
    a["t1"], a["t2"] = A(1), A(2)
    seen = []
    for task_id, _entry in table.items():
        seen.append(task_id)
        a["t3"] = A(3)  # added while sweeping: the next sweep's
    assert seen == ["t1", "t2"]

"""Where a task ran and where its branch is, in one line for a person: what the end of
a run, ``fleetrun logs`` and the JUnit report say after a night of tasks spread over
peers (a DONE peer task's branch is fetched home by the relay unless ``[relay]
fetch_back = false``; its handoff says into which repository)."""

from __future__ import annotations

from typing import Any

from .textutil import safe_text


def ran_on_peer(task: Any) -> bool:
    """Did the task's latest attempt run on a peer (not here)?"""
    return task.host not in (None, "", "local")


def where_text(task: Any) -> str:
    """``ran on mini; branch B fetched into /work/repo``, ``ran on mini; branch B is on
    mini (not fetched here)``, ``ran here; branch B``, or ``""`` for a task that never
    ran. Shown as it is (untrusted parts made safe).

    :param task: a :class:`~fleetrun.ledger.Task` (its ``host``, ``branch`` and
        ``handoff``, whose ``repo`` names where a peer task's branch was fetched).
    """
    if not task.host:
        return ""
    peer = ran_on_peer(task)
    ran = f"ran on {safe_text(task.host)}" if peer else "ran here"
    handoff = task.handoff if isinstance(task.handoff, dict) else {}
    branch = handoff.get("branch") or task.branch
    if not branch:
        return ran
    if not peer:
        return f"{ran}; branch {safe_text(branch)}"
    repo = handoff.get("repo")
    if isinstance(repo, str) and repo:
        return f"{ran}; branch {safe_text(branch)} fetched into {safe_text(repo)}"
    return f"{ran}; branch {safe_text(task.branch or branch)} is on {safe_text(task.host)} (not fetched here)"

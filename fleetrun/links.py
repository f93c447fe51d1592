"""Links a plugin attaches to a task (a pull request, a CI run, a ticket) and notes it
writes in the task's log: the public API of both, for plugins that run after the task
moved (``fleetrun_transition``) or from a verb of their own.

A link is a name and an ``http(s)`` URL, kept in the ledger's ``links`` table (one per
name and task: recording a name again replaces its URL). The core shows it in three
places: the handoff a DONE task's dependents get in their prompt
(:meth:`fleetrun.Handoff.render`), ``fleetrun logs TASK`` and ``fleetrun status
--json`` (``links``: name -> URL). Both values are checked here, strictly: a URL came
from a tool's output (``gh``, a CI's API), which is not trusted.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Optional
from urllib.parse import urlsplit

from .ledger import Ledger, open_ledger

if TYPE_CHECKING:
    from .config import Config

__all__ = ["add_link", "add_note", "check_url", "task_links"]

#: A link's name: what its line in a prompt or ``logs`` says (``pull_request`` reads
#: "pull request").
_NAME = re.compile(r"[a-z][a-z0-9_]{0,39}\Z")
MAX_URL = 2000
MAX_NOTE = 4000


def check_url(url: object, schemes: tuple[str, ...] = ("https", "http")) -> Optional[str]:
    """Why ``url`` is not a link fleetrun shows, or None: a string of at most
    :data:`MAX_URL` printable ASCII characters, no spaces, a scheme of ``schemes`` and a
    host.

    :param url: the value, as a tool printed it (any type).
    :param schemes: the schemes allowed (a plugin may allow ``https`` only).
    """
    if not isinstance(url, str):
        return f"is not a string ({type(url).__name__})"
    if not url or len(url) > MAX_URL:
        return f"must be 1 to {MAX_URL} characters long"
    if any(not (0x21 <= ord(c) <= 0x7E) for c in url):
        return "holds a space, a control or a non-ASCII character"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - a bad port raises here
    except ValueError as e:
        return f"is not a URL ({e})"
    if parts.scheme not in schemes:
        return f"must start with {' or '.join(s + '://' for s in schemes)}"
    if not parts.hostname:
        return "names no host"
    return None


def add_link(config: Config, task_id: str, name: str, url: str) -> None:
    """Attach ``url`` to the task as its link ``name``, replacing an earlier one of that
    name; from then on the task's dependents are handed it, ``logs`` shows it and
    ``status --json`` lists it.

    :param config: the run's :class:`~fleetrun.Config` (the ledger of its home).
    :param task_id: the task's ``id``.
    :param name: lowercase letters, digits and ``_``, starting with a letter, at most 40
        (``pull_request``).
    :param url: an ``https://`` or ``http://`` URL (:func:`check_url`).
    :raises ValueError: the name or the URL is not one (the message says why).
    """
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"link name {name!r}: lowercase letters, digits and _, starting with a letter, at most 40")
    why = check_url(url)
    if why is not None:
        raise ValueError(f"link {name}: {url!r} {why}")
    open_ledger(config).set_link(task_id, name, url)


def task_links(config_or_ledger: Config | Ledger, task_id: str) -> dict[str, str]:
    """The task's links, name -> URL, oldest first.

    :param config_or_ledger: the run's :class:`~fleetrun.Config`, or an open ledger.
    """
    led = config_or_ledger if isinstance(config_or_ledger, Ledger) else open_ledger(config_or_ledger)
    return {name: url for name, (_, url) in led.links(task_id).get(task_id, {}).items()}


def add_note(config: Config, task_id: str, text: str) -> None:
    """Write a note in the task's log (``fleetrun logs TASK``: ``note: TEXT``), for what a
    plugin did or could not do that is not a state change. Cut to :data:`MAX_NOTE`
    characters; shown terminal-safe.

    :param config: the run's :class:`~fleetrun.Config`.
    :param task_id: the task's ``id``.
    :param text: one line or more.
    """
    open_ledger(config).add_note(task_id, text[:MAX_NOTE])


def label(name: str) -> str:
    """How a link's name reads in a prompt or a log line: ``pull_request`` -> ``pull request``."""
    return name.replace("_", " ")

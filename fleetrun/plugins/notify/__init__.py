"""Built-in ``notify`` plugin: notifications through apprise (Slack, Discord, ntfy,
email, a JSON webhook... any of its services) when a task needs a human, when a run
ends, and when a host is paused by a usage limit (docs/notify.md).

Its ``[notify]`` table of ``config.toml``: ``urls`` (this machine's: they carry tokens),
``events`` and ``min_interval``. This module declares the table and, for ``run`` and
``work`` with URLs set, registers the :class:`~.notifier.Notifier` (named
``notifier``) that holds and sends the messages; it imports nothing heavy, and apprise
only where a URL is checked or sent to (``run``, ``work``, ``validate``): never on
``--help`` or ``status``.

- ``messages.py`` — **pure**: the events, the batch window, each message's text.
- ``sender.py`` — apprise: the URLs checked, the one thread that sends (bounded).
- ``notifier.py`` — the ``Notifier``: hooks in, batch out, from the loop's own wait.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional

from ...hookimpl import hookimpl

if TYPE_CHECKING:
    from ...config import Config

#: The verbs that check ``urls`` with apprise itself (parsing them loads it, ~0.4 s).
CHECKING_VERBS = ("run", "work", "validate")
#: The verbs that send.
SENDING_VERBS = ("run", "work")
NAME = "notifier"


def _check_events(value: list[str]) -> Optional[str]:
    from .messages import EVENTS

    for v in value:
        if v not in EVENTS:
            return f"{v!r} is not one of {', '.join(EVENTS)}"
    return None


def _check_min_interval(value: float) -> Optional[str]:
    return "must be 0 or more (seconds)" if value < 0 else None


def _check_urls_lightly(value: list[str]) -> Optional[str]:
    # the verbs that do not send (status, logs...) must not load apprise to check
    return "an empty string is not a URL" if any(not u.strip() for u in value) else None


@hookimpl(trylast=True)
def fleetrun_config_keys(config: Config) -> list[Any]:
    """``[notify]`` of config.toml (docs/notify.md)."""
    from ...config import ConfigKey

    check: Callable[[list[str]], Optional[str]] = _check_urls_lightly
    if getattr(config.option, "verb", None) in CHECKING_VERBS:
        from .sender import check_urls

        check = check_urls
    return [
        ConfigKey("notify", "", doc="notifications through apprise (docs/notify.md)"),
        ConfigKey(
            "notify",
            "urls",
            (list,),
            items=str,
            check=check,
            machine=True,
            doc="apprise URLs to notify (they often carry tokens: config.toml only)",
        ),
        ConfigKey(
            "notify",
            "events",
            (list,),
            items=str,
            check=_check_events,
            doc="which of needs_human, run_end, paused to send (default: all three)",
        ),
        ConfigKey(
            "notify",
            "min_interval",
            (int, float),
            check=_check_min_interval,
            doc="seconds a batch of events is held: one message per window (default 60)",
        ),
    ]


@hookimpl(trylast=True)
def fleetrun_configure(config: Config) -> None:
    if getattr(config.option, "verb", None) not in SENDING_VERBS:
        return
    urls = config.setting("notify", "urls") or []
    from .messages import DEFAULT_MIN_INTERVAL, EVENTS

    events = config.setting("notify", "events", list(EVENTS))
    if not urls or not events:
        return
    from .notifier import Notifier

    min_interval = float(config.setting("notify", "min_interval", DEFAULT_MIN_INTERVAL))
    config.pluginmanager.register(Notifier(config, urls, events, min_interval), NAME)


@hookimpl(trylast=True)
def fleetrun_unconfigure(config: Config) -> None:
    notifier = config.pluginmanager.get_plugin(NAME)
    if notifier is not None:
        notifier.close()  # a run that ended without its sessionfinish: send what is held
        config.pluginmanager.unregister(notifier)

"""Built-in ``local`` plugin: this machine as a host.

``fleetrun_hosts`` offers :class:`~fleetrun.hosts.LocalHost` under the name ``local``
(attempt folders in ``$FLEETRUN_HOME/attempts``). Its placement candidate is what the
``placement`` plugin measures (psutil headroom, ``policy.toml``'s ``[local]``, the
memory estimate, the tools): with ``-p no:placement`` this machine is still a host (its
attempts are polled, stopped, adopted) but offers no candidate, as before hosts were a
hook. A plugin of its own rather than a part of ``placement``: replacing the placement
policy (``-p no:placement -p mine``) must not take the machine away.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from ..hookimpl import hookimpl
from ..stash import StashKey

if TYPE_CHECKING:
    from ..config import Config
    from ..hosts import LocalHost
    from ..reports import Candidate

#: The run's one LocalHost: offered again when the hook is asked again, so that its
#: shepherd starter (made on its first start) is one per run and ended with it.
HOST_KEY: StashKey[LocalHost] = StashKey()


def measure(config: Config) -> Optional[Candidate]:
    """This machine as the ``placement`` plugin measures it, or None without that plugin."""
    placement = config.pluginmanager.get_plugin("placement")
    found = getattr(placement, "local_candidate", None) if placement is not None else None
    return found(config) if found is not None else None


@hookimpl(trylast=True)
def fleetrun_hosts(config: Config) -> list[Any]:
    from ..hosts import LocalHost  # asked only by what looks attempts up (not by --help)

    host = config.stash.get(HOST_KEY)
    if host is None:
        host = config.stash[HOST_KEY] = LocalHost(
            config.home, measure=measure, starter=True, err=getattr(config, "err", None)
        )
    return [host]


@hookimpl
def fleetrun_unconfigure(config: Config) -> None:
    host = config.stash.get(HOST_KEY)
    if host is not None:
        host.close()  # its starter ends; the shepherds it started run on

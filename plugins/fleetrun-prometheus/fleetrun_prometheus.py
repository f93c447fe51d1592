"""fleetrun-prometheus: a run's metrics on ``/metrics``, for Prometheus to scrape.

``fleetrun tasks.toml --metrics-port 9464`` (or ``[prometheus] port = 9464`` in
``config.toml``) serves ``http://127.0.0.1:9464/metrics`` while the run or ``fleetrun
work`` goes on, with prometheus_client's own HTTP server on its own thread. Without a
port the plugin is inert: no server, and prometheus_client is not even imported
(``fleetrun status`` and ``--help`` never pay for it).

Where each figure comes from, and why:

- **The ledger** (tasks by state, running tasks per host, cost): it is the truth, and
  other shells change it too (``fleetrun cancel``, a second ``queue``). A
  :class:`LedgerCollector` counts it *at scrape time*, on the server's thread, through
  :func:`fleetrun.ledger_counts` — a read-only SQLite connection of the scrape's own;
  the loop's connection is the main thread's and is never touched from another.
- **Hooks, on the main thread** (attempts by kind, retries by cause, verifier runs and
  passes, loop pass time, host headroom): events of this loop, counted as they happen
  into prometheus_client's counters, gauges and histogram (which take their own locks,
  so the scrape thread reads them safely). Headroom is what placement measured: the
  loop measures every host each pass that has a task to place (``fleetrun_place``,
  which this plugin wraps to read its ``candidates``), and measuring again only for
  metrics would cost a psutil sweep (or a peer's heartbeat) per pass;
  ``fleetrun_host_headroom_timestamp_seconds`` says how old the figures are.

The plugin is registered under the entry-point group ``fleetrun`` as ``prometheus``.
The module adds the option and the ``[prometheus]`` keys; when a run starts with a
port, ``fleetrun_sessionstart`` starts the server (a port in use is ``ERROR: ...``,
exit 4, before any task is queued) and registers an :class:`Exporter` under the name
``prometheus-exporter``; ``fleetrun_unconfigure`` stops and unregisters it.
"""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import Generator, Iterator
from typing import Any, Optional

import fleetrun

__version__ = "0.1.0"

#: The name the exporter is registered under while it serves.
EXPORTER = "prometheus-exporter"

#: Where the server listens unless ``[prometheus] addr`` says otherwise: this machine
#: only (a run's metrics name tasks and hosts; exposing them is the user's choice).
DEFAULT_ADDR = "127.0.0.1"

#: Buckets of ``fleetrun_loop_pass_duration_seconds``: a pass takes milliseconds when
#: nothing happens, up to seconds when it starts many attempts (worktrees, git).
PASS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

#: The attempt a lease makes, by the state the task leaves (``fleetrun.ledger.Attempt.kind``).
ATTEMPT_KINDS = {"READY": "fresh", "RETRYING": "retry", "RESUMING": "resume"}

_LABEL_WORD = re.compile(r"[a-z][a-z0-9_]{0,63}")


def port_problem(value: Any) -> Optional[str]:
    """Why ``value`` is no TCP port to listen on (0: any free one), or None."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
        return "must be 0 to 65535 (0: any free port)"
    return None


def addr_problem(value: Any) -> Optional[str]:
    """Why ``value`` is no address to listen on, or None (whether it resolves is seen
    when the server starts)."""
    if not isinstance(value, str) or not value or any(c.isspace() for c in value) or "/" in value:
        return "must be a host name or address, such as 127.0.0.1 (0.0.0.0: every interface)"
    return None


def port_arg(text: str) -> int:
    """``--metrics-port``'s value, checked as argparse checks its types."""
    try:
        port = int(text, 10)
    except ValueError:
        port = -1
    if port_problem(port):
        raise argparse.ArgumentTypeError(f"invalid port {text!r}: must be 0 to 65535")
    return port


def label_word(text: str) -> str:
    """A snake_case word as a label value: a cause's word (``verify_fail`` of
    ``verify_fail:pytest: 2 failed``), a verifier's kind. The detail after a colon is left
    out (unbounded, it would make a series per failure); anything else is ``other``."""
    word = text.split(":", 1)[0]
    return word if _LABEL_WORD.fullmatch(word) else "other"


@fleetrun.hookimpl
def fleetrun_addoption(parser: Any, pluginmanager: Any) -> None:
    group = parser.getgroup("prometheus", "Prometheus metrics (fleetrun-prometheus)")
    group.addoption(
        "--metrics-port",
        dest="metrics_port",
        metavar="N",
        type=port_arg,
        default=None,
        help="serve Prometheus metrics on http://ADDR:N/metrics while the run goes on "
        "(ADDR: [prometheus] addr, default 127.0.0.1; N=0: any free port)",
    )


@fleetrun.hookimpl
def fleetrun_config_keys(config: Any) -> list[Any]:
    return [
        fleetrun.ConfigKey(
            "prometheus",
            "port",
            (int,),
            check=port_problem,
            doc="serve /metrics on this port during runs (--metrics-port wins)",
        ),
        fleetrun.ConfigKey(
            "prometheus",
            "addr",
            (str,),
            check=addr_problem,
            doc=f"the address to listen on (default {DEFAULT_ADDR}: this machine only)",
        ),
    ]


def listen_address(config: Any) -> Optional[tuple[str, int, str]]:
    """Where to serve: ``(addr, port, key)``, ``key`` naming where the port was set (for
    errors); None when no port is set, and the plugin stays inert.

    :raises fleetrun.UsageError: an address is set without a port.
    """
    opt = config.getoption("metrics_port")
    port = opt if opt is not None else config.setting("prometheus", "port")
    addr = config.setting("prometheus", "addr")
    if port is None:
        if addr is not None:
            raise fleetrun.UsageError(
                "is set but no port is: set [prometheus] port (or --metrics-port N)", key="prometheus.addr"
            )
        return None
    return (addr or DEFAULT_ADDR, int(port), "--metrics-port" if opt is not None else "prometheus.port")


@fleetrun.hookimpl
def fleetrun_sessionstart(session: Any) -> None:
    # a run (or `work`) only: a port in config.toml must not make `status` listen
    config = session.config
    if config.pluginmanager.get_plugin(EXPORTER) is not None:
        return
    where = listen_address(config)
    if where is None:
        return
    addr, port, key = where
    exporter = Exporter(config, session)
    exporter.serve(addr, port, key)
    config.pluginmanager.register(exporter, EXPORTER)


@fleetrun.hookimpl
def fleetrun_unconfigure(config: Any) -> None:
    exporter = config.pluginmanager.get_plugin(EXPORTER)
    if exporter is not None:
        exporter.close()
        config.pluginmanager.unregister(exporter)


class LedgerCollector:
    """A prometheus_client collector of what the ledger holds, counted at each scrape
    (on the server's thread, through :func:`fleetrun.ledger_counts`: a read-only
    connection of its own)."""

    def __init__(self, home: Any) -> None:
        self.home = home

    def describe(self) -> list[Any]:
        return []  # no names to reserve; and registering must not read the ledger

    def collect(self) -> Iterator[Any]:
        import sqlite3

        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        up = GaugeMetricFamily("fleetrun_ledger_up", "1 when the last scrape could read the ledger, else 0")
        try:
            counts = fleetrun.ledger_counts(self.home)
        except sqlite3.Error:
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        if counts is None:
            return
        tasks = GaugeMetricFamily("fleetrun_tasks", "Tasks in the ledger, by state", labels=["state"])
        for state, n in counts.tasks.items():
            tasks.add_metric([state], n)
        yield tasks
        running = GaugeMetricFamily(
            "fleetrun_host_running_tasks",
            "Tasks whose attempt holds a place on the host now (leased, starting or running), from the ledger",
            labels=["host"],
        )
        for host, n in sorted(counts.active_by_host.items()):
            running.add_metric([host], n)
        yield running
        cost = CounterMetricFamily(
            "fleetrun_cost_usd", "What the ledger's tasks cost so far, in US dollars (as the agents reported it)"
        )
        cost.add_metric([], counts.cost_usd)
        yield cost


class Exporter:
    """The metrics of one run and the server that serves them; its methods are hook
    implementations (on the main thread)."""

    def __init__(self, config: Any, session: Any) -> None:
        # imported here, once a port is set: never on fleetrun's startup path
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.config = config
        self.url = ""
        self.server: Any = None
        # a registry of the run's own: fleetrun may run many times in one process
        reg = self.registry = CollectorRegistry(auto_describe=False)
        reg.register(LedgerCollector(config.home))
        self.attempts = Counter(
            "fleetrun_attempts", "Attempts this loop leased, by kind (fresh, retry, resume)", ["kind"], registry=reg
        )
        for kind in ATTEMPT_KINDS.values():
            self.attempts.labels(kind=kind)
        self.retries = Counter(
            "fleetrun_retries",
            "Tasks this loop sent back to work (RETRYING, RESUMING) or an operator retried, by the cause's word",
            ["cause"],
            registry=reg,
        )
        self.verifier_runs = Counter(
            "fleetrun_verifier_runs", "Verifier verdicts this loop reached, by kind", ["kind"], registry=reg
        )
        self.verifier_passes = Counter(
            "fleetrun_verifier_passes",
            "Passing verifier verdicts, by kind (pass rate: passes / runs)",
            ["kind"],
            registry=reg,
        )
        for spec in getattr(session, "items", None) or ():
            for verifier in spec.verify:
                self._verifier_kind(verifier.kind)
        self.loop_pass = Histogram(
            "fleetrun_loop_pass_duration_seconds",
            "How long each pass of the work loop took",
            buckets=PASS_BUCKETS,
            registry=reg,
        )
        host = ["host"]
        self.free_slots = Gauge(
            "fleetrun_host_free_slots",
            "Attempts the host could take more, as placement last measured it (0 while it drains, is stale or refuses)",
            host,
            registry=reg,
        )
        self.max_tasks = Gauge("fleetrun_host_max_tasks", "Attempts the host may run at once", host, registry=reg)
        self.free_mem = Gauge(
            "fleetrun_host_free_memory_bytes",
            "Free memory on the host, as placement last measured it",
            host,
            registry=reg,
        )
        self.free_disk = Gauge(
            "fleetrun_host_free_disk_bytes",
            "Free disk for the host's attempts, as placement last measured it",
            host,
            registry=reg,
        )
        self.load = Gauge(
            "fleetrun_host_load_per_core",
            "The host's load average per core, as placement last measured it",
            host,
            registry=reg,
        )
        self.measured = Gauge(
            "fleetrun_host_headroom_timestamp_seconds",
            "When placement last measured the host (Unix time)",
            host,
            registry=reg,
        )

    def serve(self, addr: str, port: int, key: str) -> None:
        """Start prometheus_client's server on its own (daemon) thread.

        :raises fleetrun.UsageError: the address cannot be listened on (a port in use).
        """
        from prometheus_client import start_http_server

        try:
            self.server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        except OSError as e:
            raise fleetrun.UsageError(
                f"cannot serve metrics on {addr}:{port}: {e.strerror or e}; choose another port (0: any free one)",
                key=key,
            ) from None
        host = f"[{addr}]" if ":" in addr else addr
        self.url = f"http://{host}:{self.server.server_port}/metrics"

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def _verifier_kind(self, kind: str) -> str:
        word = label_word(kind)
        self.verifier_runs.labels(kind=word)
        self.verifier_passes.labels(kind=word)
        return word

    # -- hooks -------------------------------------------------------------------------

    @fleetrun.hookimpl
    def fleetrun_report_header(self, config: Any) -> list[str]:
        return [f"metrics: {self.url}"]

    @fleetrun.hookimpl
    def fleetrun_transition(self, task: Any, from_state: str, to_state: str, cause: str) -> None:
        if to_state == "ASSIGNED" and from_state in ATTEMPT_KINDS:  # a lease: an attempt is made
            self.attempts.labels(kind=ATTEMPT_KINDS[from_state]).inc()
        elif to_state in ("RETRYING", "RESUMING") and from_state != "ASSIGNED":
            # (from ASSIGNED: a start refused hands the lease back, it is no new try)
            self.retries.labels(cause=label_word(cause)).inc()
        elif label_word(cause) == "operator_retry":
            self.retries.labels(cause="operator_retry").inc()

    @fleetrun.hookimpl
    def fleetrun_verdict(self, verdict: Any) -> None:
        kind = self._verifier_kind(verdict.kind)
        self.verifier_runs.labels(kind=kind).inc()
        if verdict.passed:
            self.verifier_passes.labels(kind=kind).inc()

    @fleetrun.hookimpl(wrapper=True)
    def fleetrun_place(self, candidates: list[Any]) -> Generator[None, Any, Any]:
        self.observe(candidates)
        return (yield)

    @fleetrun.hookimpl
    def fleetrun_loop_pass(self, duration_s: float) -> None:
        self.loop_pass.observe(duration_s)

    def observe(self, candidates: list[Any]) -> None:
        """Keep each candidate's headroom (a figure placement could not measure is left
        out, not reported as 0)."""
        now = time.time()
        for c in candidates:
            name = str(c.name)
            takes = not (c.drain or c.why_not or not c.fresh)
            self.free_slots.labels(host=name).set(max(0, c.max_tasks - c.running) if takes else 0)
            self.max_tasks.labels(host=name).set(c.max_tasks)
            for gauge, figure, scale in (
                (self.free_mem, c.free_mem_mb, 1024 * 1024),
                (self.free_disk, c.free_disk_mb, 1024 * 1024),
                (self.load, c.load_per_core, 1),
            ):
                if figure is None:
                    try:
                        gauge.remove(name)
                    except KeyError:
                        pass
                else:
                    gauge.labels(host=name).set(figure * scale)
            self.measured.labels(host=name).set(now)

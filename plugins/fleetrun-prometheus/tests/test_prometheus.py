"""fleetrun-prometheus, tested the way a third party tests a plugin: real runs of small
queues in a tmp folder, in-process, with the plugin passed explicitly (fleeter turns
entry-point autoload off), and ``/metrics`` scraped over real HTTP from the run's own
hooks, while a task is still running and again as the run ends."""

from __future__ import annotations

import os
import socket
import urllib.error
import urllib.request
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Optional

import fleetrun_prometheus
import pytest

import fleetrun
from fleetrun import AgentResult
from fleetrun.fleeter import ECHO_AGENT, echo_task

HERE = Path(__file__).resolve().parents[1]

# Three tasks, each in a folder of its own (tasks without git_ref take turns in one):
# ``quick`` passes, ``flaky`` fails its verifier once and passes on the retry, and
# ``slow``'s agent waits for the file ``go``, which the test writes once it has scraped
# the run in progress.
QUEUE = (
    ECHO_AGENT
    + r"""
[agents.waiter]
command = ["{python}", "-c", "import os, time; [time.sleep(0.05) for _ in range(12000) if not os.path.exists('../go')]"]
"""
    + echo_task("quick", verify="true", cwd="q")
    + echo_task("flaky", verify="test -f m || { touch m; exit 1; }", cwd="f")
    + echo_task("slow", verify="true", cwd="s", agent="waiter")
)

ONE = ECHO_AGENT + echo_task("ok")

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> tuple[str, Samples]:
    """GET ``url``: the text, and its samples by (name, sorted labels)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=30) as reply:
        assert reply.status == 200
        assert reply.headers["Content-Type"].startswith("text/plain")
        text = reply.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return text, samples


def value(samples: Samples, name: str, **labels: str) -> Optional[float]:
    return samples.get((name, tuple(sorted(labels.items()))))


class Costly:
    """Stands in for an agent that reports its cost: $0.25 per attempt."""

    @fleetrun.hookimpl(tryfirst=True)
    def fleetrun_agent_result(self, exit_code: Optional[int]) -> AgentResult:
        return AgentResult(
            ok=exit_code == 0, exit_code=exit_code, cost_usd=0.25, reason="" if exit_code == 0 else f"exit:{exit_code}"
        )


class Scraper:
    """Scrapes the run's /metrics from its own hooks (on the main thread, while the
    exporter's server answers on its own): once ``slow`` runs and the others are DONE,
    then as the session finishes."""

    def __init__(self, go: Optional[Path] = None) -> None:
        self.go = go
        self.states: dict[str, str] = {}
        self.url = ""
        self.during: Optional[tuple[str, Samples]] = None
        self.after: Optional[tuple[str, Samples]] = None

    def _url(self, config: Any) -> str:
        exporter = config.pluginmanager.get_plugin(fleetrun_prometheus.EXPORTER)
        assert exporter is not None
        self.url = exporter.url
        return self.url

    @fleetrun.hookimpl
    def fleetrun_transition(self, task: Any, to_state: str) -> None:
        self.states[task.name] = to_state

    @fleetrun.hookimpl
    def fleetrun_loop_pass(self, config: Any) -> None:
        if (
            self.go is not None
            and self.during is None
            and self.states.get("slow") == "RUNNING"
            and self.states.get("quick") == self.states.get("flaky") == "DONE"
        ):
            self.during = scrape(self._url(config))
            self.go.write_text("")

    @fleetrun.hookimpl
    def fleetrun_sessionfinish(self, session: Any) -> None:
        self.after = scrape(self._url(session.config))


def test_scraped_during_and_after_a_run(fleeter: Any) -> None:
    for folder in "qfs":
        (fleeter.path / folder).mkdir()
    fleeter.write_tasks(QUEUE)
    scraper = Scraper(go=fleeter.path / "go")
    result = fleeter.run("tasks.toml", "--metrics-port", "0", plugins=[fleetrun_prometheus, Costly(), scraper])
    assert result.ret == 0, result.stdout + result.stderr
    result.assert_outcomes(done=3)
    assert scraper.url.startswith("http://127.0.0.1:") and scraper.url.endswith("/metrics")
    result.fnmatch_lines([f"metrics: {scraper.url}"], stream="out")  # the header says where

    assert scraper.during is not None, "the run was never seen with slow RUNNING"
    text, during = scraper.during
    assert "# TYPE fleetrun_tasks gauge" in text
    assert "# TYPE fleetrun_loop_pass_duration_seconds histogram" in text
    assert value(during, "fleetrun_tasks", state="DONE") == 2
    assert value(during, "fleetrun_tasks", state="RUNNING") == 1
    assert value(during, "fleetrun_tasks", state="READY") == 0  # every state, 0 when empty
    assert value(during, "fleetrun_host_running_tasks", host="local") == 1
    assert value(during, "fleetrun_verifier_runs_total", kind="run") == 3  # quick 1, flaky 2
    assert value(during, "fleetrun_verifier_passes_total", kind="run") == 2
    assert value(during, "fleetrun_attempts_total", kind="fresh") == 3
    assert value(during, "fleetrun_attempts_total", kind="retry") == 1
    assert value(during, "fleetrun_attempts_total", kind="resume") == 0
    assert value(during, "fleetrun_retries_total", cause="verify_fail") == 1
    assert value(during, "fleetrun_cost_usd_total") == 0.75  # quick's and flaky's two attempts
    assert (value(during, "fleetrun_loop_pass_duration_seconds_count") or 0) >= 1
    assert value(during, "fleetrun_ledger_up") == 1
    # headroom, as placement last measured it (how many ran then depends on the
    # machine's headroom: the three tasks start at once, or one after the other)
    max_tasks = value(during, "fleetrun_host_max_tasks", host="local")
    free_slots = value(during, "fleetrun_host_free_slots", host="local")
    assert max_tasks is not None and free_slots is not None and 0 <= free_slots <= max_tasks >= 1
    assert (value(during, "fleetrun_host_free_memory_bytes", host="local") or 0) > 0
    assert (value(during, "fleetrun_host_headroom_timestamp_seconds", host="local") or 0) > 0

    assert scraper.after is not None
    _, after = scraper.after
    assert value(after, "fleetrun_tasks", state="DONE") == 3
    assert value(after, "fleetrun_tasks", state="RUNNING") == 0
    assert value(after, "fleetrun_host_running_tasks", host="local") == 0
    assert value(after, "fleetrun_verifier_runs_total", kind="run") == 4
    assert value(after, "fleetrun_verifier_passes_total", kind="run") == 3
    assert value(after, "fleetrun_cost_usd_total") == 1.0
    assert (value(after, "fleetrun_loop_pass_duration_seconds_count") or 0) > (
        value(during, "fleetrun_loop_pass_duration_seconds_count") or 0
    )

    # the run is over: the server is shut down and the exporter unregistered
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(scraper.url, timeout=5)


class Probe:
    """Looks, mid-run, at what an inactive plugin must not have done."""

    def __init__(self) -> None:
        self.seen: list[tuple[Any, list[Any]]] = []

    @fleetrun.hookimpl
    def fleetrun_loop_pass(self, config: Any) -> None:
        import psutil

        listening = [c for c in psutil.Process().net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
        self.seen.append((config.pluginmanager.get_plugin(fleetrun_prometheus.EXPORTER), listening))


def test_inert_without_a_port(fleeter: Any) -> None:
    fleeter.write_tasks(ONE)
    probe = Probe()
    result = fleeter.run("tasks.toml", plugins=[fleetrun_prometheus, probe])
    assert result.ret == 0, result.stdout + result.stderr
    result.assert_outcomes(done=1)
    assert probe.seen
    assert all(exporter is None and not listening for exporter, listening in probe.seen)
    assert not any(line.startswith("metrics:") for line in result.outlines)

    # prometheus_client stays off fleetrun's startup path: loaded only when a port is given
    env = {"PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]), "PYTHONPROFILEIMPORTTIME": "1"}
    for args in (("-p", "fleetrun_prometheus", "status"), ("-p", "fleetrun_prometheus", "tasks.toml")):
        sub = fleeter.runsub(*args, env=env)
        assert sub.ret == 0, sub.stdout + sub.stderr
        assert "fleetrun_prometheus" in sub.stderr  # the plugin was imported...
        assert "prometheus_client" not in sub.stderr  # ...and the client was not


def busy_port() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


@pytest.mark.parametrize(
    ("config", "args", "error"),
    [
        ("", ("--metrics-port", "70000"), "--metrics-port: invalid port '70000': must be 0 to 65535"),
        ("", ("--metrics-port", "x"), "--metrics-port: invalid port 'x': must be 0 to 65535"),
        ("[prometheus]\nport = '9464'\n", (), "config.toml:2: prometheus.port: "),
        ("[prometheus]\nport = -1\n", (), "config.toml:2: prometheus.port: must be 0 to 65535"),
        ("[prometheus]\nport = 9464\nbind = '0.0.0.0'\n", (), "config.toml:3: prometheus.bind: "),
        ("[prometheus]\naddr = ''\nport = 0\n", (), "config.toml:2: prometheus.addr: must be a host name or address"),
        ("[prometheus]\naddr = '127.0.0.1'\n", (), "prometheus.addr: is set but no port is"),
        ("[prometheus]\nport = BUSY\n", (), "prometheus.port: cannot serve metrics on 127.0.0.1:BUSY: "),
        ("", ("--metrics-port", "BUSY"), "--metrics-port: cannot serve metrics on 127.0.0.1:BUSY: "),
    ],
)
def test_a_bad_port_stops_the_run_before_it_starts(
    fleeter: Any, capsys: pytest.CaptureFixture[str], config: str, args: tuple[str, ...], error: str
) -> None:
    held = busy_port()
    try:
        port = str(held.getsockname()[1])
        if config:
            fleeter.write_config(config.replace("BUSY", port))
        fleeter.write_tasks(ONE)
        result = fleeter.run("tasks.toml", *[a.replace("BUSY", port) for a in args], plugins=[fleetrun_prometheus])
    finally:
        held.close()
    err = result.stderr + capsys.readouterr().err
    assert result.ret == 4, err
    assert error.replace("BUSY", port) in err
    assert "Traceback" not in err
    assert fleeter.states() == {}  # nothing was queued, nothing ran


def test_loaded_through_its_installed_entry_point(fleeter: Any) -> None:
    if not any(ep.name == "prometheus" for ep in entry_points(group="fleetrun")):
        if os.environ.get("CI"):
            pytest.fail("fleetrun-prometheus is not installed: CI installs it (.ci/run)")
        pytest.skip("fleetrun-prometheus is not installed (pip install ./plugins/fleetrun-prometheus)")
    fleeter.enable_plugin_autoload()
    fleeter.write_config("[prometheus]\nport = 0\n")
    fleeter.write_tasks(ONE)
    scraper = Scraper()
    result = fleeter.run("tasks.toml", plugins=[scraper])  # the plugin itself from its entry point
    assert result.ret == 0, result.stdout + result.stderr
    result.assert_outcomes(done=1)
    header = next(line for line in result.outlines if line.startswith("fleetrun "))
    assert "prometheus" in header.split("plugins:")[1].split(", ")
    assert scraper.after is not None
    assert value(scraper.after[1], "fleetrun_tasks", state="DONE") == 1
    assert value(scraper.after[1], "fleetrun_attempts_total", kind="fresh") == 1

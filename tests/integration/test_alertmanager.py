"""Alert delivery for real: runwatch's exporter -> Prometheus -> Alertmanager -> webhooks.

Real processes on free loopback ports: ``runwatch serve api`` following an embedded log
(its Prometheus exporter on ``--metrics-port``), Debian's ``prometheus`` with the project's
config and rules (targets pointed here, 1s scrape and evaluation), Debian's Alertmanager
(``prometheus-alertmanager``) with a config derived from deploy/alertmanager/alertmanager.yml
(the same routes and receivers; short group timings; the receivers' webhooks pointed at a
receiver thread of this test). Then detector alerts are appended to the log while
everything runs:

- ``kl_blowup`` with routing ``page`` is delivered to the paging receiver, and only there;
- ``rollout_drift`` with routing ``ticket`` is delivered to the ticket receiver, only there;
- ``eval_gate_missing`` with routing ``advisory`` reaches Alertmanager and is delivered
  nowhere;
- an alert already in the log before Prometheus started is not announced at all.

What the alerts carry is what the exporter exposes: detector, layer and routing, fleet
level (no ``run_id`` label by design; no ``tenant`` on the alert series yet).

Both binaries come from scripts/setup-prometheus.sh. Without them the test skips locally
and fails under CI.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from events import AlertFired
from events.log.embedded import EmbeddedLog
from tests.projection_runs import RunFactory, write_log
from tests.unit.test_deploy_alertmanager import AM_CONFIG, strip_timings
from tests.unit.test_deploy_stack import PROM_DIR

CLI = [sys.executable, "-m", "runwatch.cli.main"]
ALERT = "RunwatchDetectorAlertFired"


def binary(*names: str) -> str:
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    if os.environ.get("CI"):
        pytest.fail(f"{names[0]} missing in CI: scripts/setup-prometheus.sh installs it")
    pytest.skip(f"{names[0]} not installed (scripts/setup-prometheus.sh)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def get_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode()


# ---- the webhook receiver ----------------------------------------------------------------
class Receiver:
    """Records every webhook POST: (path, JSON body)."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, dict[str, Any]]] = []
        self.lock = threading.Lock()
        received = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with received.lock:
                    received.posts.append((self.path, json.loads(body)))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def url(self, receiver: str) -> str:
        return f"http://127.0.0.1:{self.port}/{receiver}"

    def alerts(self, path: str) -> list[dict[str, Any]]:
        """Every alert (with its notification's ``receiver`` and ``status``) posted to
        ``/path``."""
        with self.lock:
            return [
                {**alert, "receiver": body["receiver"], "notification": body["status"]}
                for p, body in self.posts
                if p == path
                for alert in body["alerts"]
            ]

    def all_detectors(self) -> set[str]:
        with self.lock:
            return {
                a["labels"].get("detector", "") for _, body in self.posts for a in body["alerts"]
            }


# ---- processes ---------------------------------------------------------------------------
class Proc:
    def __init__(self, name: str, args: list[str], log: Path) -> None:
        self.name, self.log_path = name, log
        self.log = log.open("w")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)

    def output(self) -> str:
        self.log.flush()
        return self.log_path.read_text()[-4000:]

    def check(self) -> None:
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.name} exited ({self.proc.returncode}):\n{self.output()}")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.close()


def wait_for(
    what: str, fn: Callable[[], Any], procs: list[Proc], timeout: float = 60.0, every: float = 0.3
) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        for p in procs:
            p.check()
        with contextlib.suppress(OSError, ValueError, KeyError):
            last = fn()
            if last:
                return last
        time.sleep(every)
    logs = "\n".join(f"--- {p.name}:\n{p.output()}" for p in procs)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})\n{logs}")


# ---- events ------------------------------------------------------------------------------
def alerting_run(
    run_id: str, tenant: str, detector: str, layer: str, routing: str, t0: float
) -> list[Any]:
    """A started run whose detector fired once (as the detectors emit AlertFired)."""
    f = RunFactory(run_id, tenant, t0)
    events = f.start()
    events += f.step(1)
    events.append(
        f.ev(
            AlertFired,
            1,
            alert_id=f"{run_id}/{detector}/1",
            detector=detector,
            layer=layer,
            routing=routing,
            window_start=0,
            window_end=1,
            config_version="test",
            reason=f"{detector} at step 1",
            first_response="look",
        )
    )
    return events


def alertmanager_config(receiver: Receiver) -> dict[str, Any]:
    """deploy's config: same routes and receivers, webhooks pointed at ``receiver``, group
    timings shortened for a test."""
    config = yaml.safe_load(AM_CONFIG.read_text())
    for r in config["receivers"]:
        for hook in r.get("webhook_configs", []):
            hook["url"] = receiver.url(r["name"])

    def shorten(route: dict[str, Any]) -> None:
        for key, value in (("group_wait", "1s"), ("group_interval", "1s")):
            if key in route or route is config["route"]:
                route[key] = value
        for child in route.get("routes", []):
            shorten(child)

    shorten(config["route"])
    # nothing but timings differs from the deployed routing tree
    deployed = yaml.safe_load(AM_CONFIG.read_text())
    assert strip_timings(config["route"]) == strip_timings(deployed["route"])
    assert [r["name"] for r in config["receivers"]] == [r["name"] for r in deployed["receivers"]]
    return config


def prometheus_config(metrics_port: int, prom_port: int, am_port: int) -> dict[str, Any]:
    config = yaml.safe_load((PROM_DIR / "prometheus.yml").read_text())
    config["global"]["scrape_interval"] = "1s"
    config["global"]["evaluation_interval"] = "1s"
    config["rule_files"] = [str(PROM_DIR / p) for p in config["rule_files"]]
    for job in config["scrape_configs"]:
        port = metrics_port if job["job_name"] == "runwatch-projections" else prom_port
        job["static_configs"][0]["targets"] = [f"127.0.0.1:{port}"]
    (am,) = config["alerting"]["alertmanagers"]
    am["static_configs"] = [{"targets": [f"127.0.0.1:{am_port}"]}]
    return config


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[dict[str, Any]]:
    prometheus_bin = binary("prometheus")
    alertmanager_bin = binary("prometheus-alertmanager", "alertmanager")
    log_dir = tmp_path / "log"
    log = EmbeddedLog(log_dir, sync=False)
    log.open_sync()
    # an alert that fired before Prometheus ever looked: it must not be announced
    write_log(log, alerting_run("run-old", "acme", "reward_hacking", "algorithmic", "page", 1.7e9))
    keys = tmp_path / "keys.yaml"
    keys.write_text(yaml.safe_dump({"keys": [{"key": "ops", "operator": True}]}))
    api_port, metrics_port, prom_port, am_port = (free_port() for _ in range(4))
    receiver = Receiver()
    receiver.thread.start()
    procs: list[Proc] = []
    try:
        api = Proc(
            "runwatch serve api",
            [
                *CLI,
                "serve",
                "api",
                "--log",
                str(log_dir),
                "--store",
                str(tmp_path / "projections.sqlite"),
                "--keys",
                str(keys),
                "--port",
                str(api_port),
                "--metrics-port",
                str(metrics_port),
                "--settle-s",
                "0.3",
            ],
            tmp_path / "api.log",
        )
        procs.append(api)
        metrics = f"http://127.0.0.1:{metrics_port}/metrics"
        wait_for(
            "the exporter to count the old alert",
            lambda: 'detector="reward_hacking"' in get_text(metrics),
            procs,
        )

        (tmp_path / "alertmanager.yml").write_text(yaml.safe_dump(alertmanager_config(receiver)))
        procs.append(
            Proc(
                "alertmanager",
                [
                    alertmanager_bin,
                    f"--config.file={tmp_path / 'alertmanager.yml'}",
                    f"--storage.path={tmp_path / 'am-data'}",
                    f"--web.listen-address=127.0.0.1:{am_port}",
                    "--cluster.listen-address=",
                ],
                tmp_path / "alertmanager.log",
            )
        )
        am = f"http://127.0.0.1:{am_port}"
        wait_for("alertmanager ready", lambda: get_text(f"{am}/-/ready"), procs)

        (tmp_path / "prometheus.yml").write_text(
            yaml.safe_dump(prometheus_config(metrics_port, prom_port, am_port))
        )
        procs.append(
            Proc(
                "prometheus",
                [
                    prometheus_bin,
                    f"--config.file={tmp_path / 'prometheus.yml'}",
                    f"--storage.tsdb.path={tmp_path / 'prom-data'}",
                    f"--web.listen-address=127.0.0.1:{prom_port}",
                ],
                tmp_path / "prometheus.log",
            )
        )
        prom = f"http://127.0.0.1:{prom_port}"

        def scraped_and_evaluated() -> bool:
            q = 'count_over_time(runwatch_runs{state="SUBMITTED"}[1m])'
            r = get_json(f"{prom}/api/v1/query?query={urllib.parse.quote(q)}")
            scrapes = int(r["data"]["result"][0]["value"][1]) if r["data"]["result"] else 0
            groups = get_json(f"{prom}/api/v1/rules")["data"]["groups"]
            (rule,) = [x for g in groups for x in g["rules"] if x["name"] == ALERT]
            return scrapes >= 3 and rule["health"] == "ok"

        wait_for(
            "prometheus to scrape the exporter and evaluate the rules", scraped_and_evaluated, procs
        )
        am_targets = get_json(f"{prom}/api/v1/alertmanagers")["data"]["activeAlertmanagers"]
        assert [t["url"] for t in am_targets] == [f"{am}/api/v2/alerts"]
        yield {
            "log": log,
            "receiver": receiver,
            "procs": procs,
            "prometheus": prom,
            "alertmanager": am,
        }
    finally:
        for p in reversed(procs):
            p.stop(signal.SIGINT if p.name.startswith("runwatch") else signal.SIGTERM)
        receiver.server.shutdown()
        receiver.thread.join(5)


def test_alerts_are_delivered_by_routing(stack):
    log, receiver, procs = stack["log"], stack["receiver"], stack["procs"]
    prom, am = stack["prometheus"], stack["alertmanager"]

    # an alert already counted when Prometheus started is not news
    time.sleep(2)
    firing = get_json(f"{prom}/api/v1/alerts")["data"]["alerts"]
    assert not [a for a in firing if a["labels"]["alertname"] == ALERT], firing

    # three detectors fire while the stack runs, one per routing
    t0 = 1.7e9 + 3600
    write_log(log, alerting_run("run-kl", "acme", "kl_blowup", "algorithmic", "page", t0))
    write_log(
        log, alerting_run("run-drift", "globex", "rollout_drift", "run_mechanics", "ticket", t0)
    )
    write_log(
        log, alerting_run("run-eval", "acme", "eval_gate_missing", "algorithmic", "advisory", t0)
    )

    pages = wait_for("the page", lambda: receiver.alerts("/page"), procs)
    tickets = wait_for("the ticket", lambda: receiver.alerts("/ticket"), procs)

    (page,) = pages[:1]
    assert page["receiver"] == "page" and page["notification"] == "firing"
    assert page["status"] == "firing"
    labels = page["labels"]
    assert labels["alertname"] == ALERT
    assert labels["detector"] == "kl_blowup"
    assert labels["layer"] == "algorithmic"
    assert labels["routing"] == labels["severity"] == "page"
    assert labels["deployment"] == "runwatch"  # Prometheus' external label
    assert page["annotations"]["summary"].startswith("detector kl_blowup")

    (ticket,) = tickets[:1]
    assert ticket["receiver"] == "ticket" and ticket["status"] == "firing"
    assert ticket["labels"]["detector"] == "rollout_drift"
    assert ticket["labels"]["layer"] == "run_mechanics"
    assert ticket["labels"]["routing"] == "ticket"

    # the advisory alert reached Alertmanager, which routed it to the receiver without
    # integrations
    def advisory_in_alertmanager() -> list[dict[str, Any]]:
        return [
            a
            for a in get_json(f"{am}/api/v2/alerts")
            if a["labels"].get("detector") == "eval_gate_missing"
        ]

    (advisory,) = wait_for("the advisory alert in Alertmanager", advisory_in_alertmanager, procs)
    assert advisory["labels"]["routing"] == "advisory"
    assert [r["name"] for r in advisory["receivers"]] == ["advisory"]

    time.sleep(3)  # a few group intervals: anything still to be sent has been sent
    assert {a["labels"]["detector"] for a in receiver.alerts("/page")} == {"kl_blowup"}
    assert {a["labels"]["detector"] for a in receiver.alerts("/ticket")} == {"rollout_drift"}
    assert receiver.all_detectors() == {"kl_blowup", "rollout_drift"}
    with receiver.lock:
        paths = {p for p, _ in receiver.posts}
    assert paths == {"/page", "/ticket"}  # the advisory receiver has no webhook at all

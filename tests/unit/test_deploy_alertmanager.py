"""deploy/alertmanager/alertmanager.yml and what feeds it, checked without a running stack.

- ``amtool check-config`` accepts the file (the same Alertmanager tooling CI installs:
  scripts/setup-prometheus.sh), and ``amtool config routes test`` resolves every value of
  the detectors' routing (``events`` ``Routing``) to its receiver: page -> page, ticket ->
  ticket, advisory -> the receiver without integrations; an alert without the label is
  filed as a ticket.
- Every Prometheus alerting rule in deploy/prometheus carries a ``routing`` label: a value
  of ``Routing``, or the series' own ``routing`` passed through (then its expression keeps
  that label); ``severity``, where present, says the same.
- Prometheus sends to the compose ``alertmanager`` service, which mounts this folder.

The delivery itself (real Prometheus and Alertmanager, webhooks received) is
tests/integration/test_alertmanager.py.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml

from events.catalog.derived import Routing
from tests.unit.test_deploy_stack import PROM_DIR, grouping_labels, rules

REPO = Path(__file__).resolve().parents[2]
AM_DIR = REPO / "deploy" / "alertmanager"
AM_CONFIG = AM_DIR / "alertmanager.yml"
ROUTINGS: tuple[str, ...] = typing.get_args(Routing)
TIMING_KEYS = ("group_wait", "group_interval", "repeat_interval")
PASS_THROUGH = "{{ $labels.routing }}"


def strip_timings(route: dict[str, Any]) -> dict[str, Any]:
    """The routing tree without its timings: what a test config may not change."""
    out = {k: v for k, v in route.items() if k not in TIMING_KEYS and k != "routes"}
    if "routes" in route:
        out["routes"] = [strip_timings(r) for r in route["routes"]]
    return out


def config() -> dict[str, Any]:
    return yaml.safe_load(AM_CONFIG.read_text())


def seconds(duration: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    parts = re.findall(r"(\d+)(ms|s|m|h|d|w)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, duration
    return sum(int(n) * units[u] for n, u in parts)


@pytest.fixture(scope="module")
def amtool() -> str:
    found = shutil.which("amtool")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("amtool missing in CI: scripts/setup-prometheus.sh installs it")
        pytest.skip("amtool not installed (scripts/setup-prometheus.sh)")
    return found


def route_of(amtool: str, **labels: str) -> str:
    r = subprocess.run(
        [
            amtool,
            "config",
            "routes",
            "test",
            f"--config.file={AM_CONFIG}",
            *(f"{k}={v}" for k, v in labels.items()),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout.strip()


def test_amtool_checks_the_config(amtool):
    r = subprocess.run(
        [amtool, "check-config", str(AM_CONFIG)], capture_output=True, text=True, timeout=30
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


def test_routings_are_the_detectors_own():
    assert ROUTINGS == ("page", "ticket", "advisory")


@pytest.mark.parametrize("routing", ROUTINGS)
def test_each_routing_goes_to_its_receiver(amtool, routing):
    got = route_of(
        amtool, alertname="RunwatchDetectorAlertFired", routing=routing, detector="kl_blowup"
    )
    assert got == routing
    # the other labels an alert may carry do not change where it goes
    assert route_of(amtool, routing=routing, tenant="acme", layer="infra") == routing


def test_an_alert_without_routing_is_filed_as_a_ticket(amtool):
    assert route_of(amtool, alertname="SomethingElse") == "ticket"
    assert route_of(amtool, alertname="SomethingElse", routing="unknown") == "ticket"


def test_routes_match_exactly_one_routing_each():
    routes = config()["route"]["routes"]
    matched = []
    for r in routes:
        (matcher,) = r["matchers"]
        m = re.fullmatch(r'routing="(\w+)"', matcher)
        assert m, matcher
        matched.append(m.group(1))
        assert r["receiver"] == m.group(1)
        assert not r.get("continue"), "one receiver per alert"
    assert sorted(matched) == sorted(ROUTINGS)


def test_receivers_page_and_ticket_notify_advisory_never():
    receivers = {r["name"]: r for r in config()["receivers"]}
    assert set(receivers) == set(ROUTINGS)
    integrations = {name: [k for k in r if k.endswith("_configs")] for name, r in receivers.items()}
    assert integrations["advisory"] == [], "advisory alerts must never notify"
    for name in ("page", "ticket"):
        assert integrations[name] == ["webhook_configs"], name
        for hook in receivers[name]["webhook_configs"]:
            assert hook["url"].startswith("http") and hook.get("send_resolved") is True
            # a placeholder until an operator sets it: it must not resolve anywhere
            assert ".invalid/" in hook["url"], hook["url"]


def test_grouping_and_repeat_intervals():
    root = config()["route"]
    assert {"alertname", "tenant", "detector"} <= set(root["group_by"])
    by = {r["receiver"]: {**root, **r} for r in root["routes"]}
    page, ticket = by["page"], by["ticket"]
    assert seconds(page["group_wait"]) <= 30, "a page goes out within half a minute"
    assert seconds(page["repeat_interval"]) <= 4 * 3600
    assert seconds(ticket["repeat_interval"]) >= seconds(page["repeat_interval"])
    for r in (root, page, ticket):
        assert seconds(r["group_wait"]) <= seconds(r["group_interval"])
        assert seconds(r["group_interval"]) <= seconds(r["repeat_interval"])


def test_every_alerting_rule_carries_its_routing():
    alerts = [r for r in rules() if "alert" in r]
    assert alerts
    for rule in alerts:
        labels = rule.get("labels") or {}
        routing = labels.get("routing")
        assert routing is not None, f"{rule['alert']} has no routing label"
        if routing == PASS_THROUGH:
            assert "routing" in grouping_labels(rule["expr"]), (
                f"{rule['alert']} passes the series' routing through but drops the label"
            )
        else:
            assert routing in ROUTINGS, f"{rule['alert']}: routing {routing!r}"
        assert labels.get("severity", routing) == routing, rule["alert"]


def test_prometheus_sends_to_the_compose_alertmanager():
    prom = yaml.safe_load((PROM_DIR / "prometheus.yml").read_text())
    (am,) = prom["alerting"]["alertmanagers"]
    targets = [t for sc in am["static_configs"] for t in sc["targets"]]
    assert targets == ["alertmanager:9093"]

    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    svc = compose["services"]["alertmanager"]
    assert svc["image"].startswith("prom/alertmanager:")
    mounts = dict(v.split(":")[:2] for v in svc["volumes"] if v.startswith("."))
    config_dir = mounts["./deploy/alertmanager"]
    assert f"./deploy/alertmanager:{config_dir}:ro" in svc["volumes"]
    assert f"--config.file={config_dir}/{AM_CONFIG.name}" in svc["command"]
    assert "--cluster.listen-address=" in svc["command"], "one instance: no gossip port"
    storage = next(c for c in svc["command"] if c.startswith("--storage.path="))
    volumes = {v.split(":")[1]: v.split(":")[0] for v in svc["volumes"]}
    assert volumes[storage.split("=", 1)[1]] in compose["volumes"], "alert state is kept"
    # its API can silence pages and has no authentication: published on loopback only
    assert svc["ports"] == ["127.0.0.1:9093:9093"]
    assert "alertmanager" in compose["services"]["prometheus"]["depends_on"]

"""Prometheus rules: ``promtool check rules`` and ``promtool test rules`` pass, and every
series a rule reads is one the exporter really exposes (rules cannot drift from names)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest

from events.log.embedded import EmbeddedLog
from projections.exporter import make_registry
from runwatch.hosting.replay import rebuild_from_log
from tests.projection_runs import synth_fleet, write_log

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "runwatch-rules.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "runwatch-rules.test.yml"


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:  # the project's own setup installs it (idempotent)
        subprocess.run(
            ["bash", str(ROOT / "scripts" / "setup-prometheus.sh")], timeout=900, check=False
        )
        found = shutil.which("promtool")
    if found is None:
        pytest.skip(
            "PROMTOOL NOT AVAILABLE: scripts/setup-prometheus.sh could not install the Debian "
            "package 'prometheus'; the Prometheus rules were NOT checked"
        )
    return found


def test_promtool_check_rules(promtool):
    out = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_promtool_test_rules(promtool):
    out = subprocess.run(
        [promtool, "test", "rules", RULE_TESTS.name],
        capture_output=True,
        text=True,
        cwd=RULE_TESTS.parent,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_rules_only_read_series_the_exporter_exposes(tmp_path):
    log = EmbeddedLog(tmp_path / "log", sync=False)
    log.open_sync()
    write_log(log, synth_fleet(7, 30))
    store = rebuild_from_log(tmp_path / "log").store
    exposed = set(
        re.findall(r"^(runwatch_[a-z_]+)", generate_latest(make_registry(store)).decode(), re.M)
    )
    # the notifier's and the processors' own metrics ports (rules on who is told)
    from tests.unit.runwatch.test_liveness_series import liveness_series

    exposed |= {re.sub(r"_(bucket|count|sum)$", "", n) for n in liveness_series(tmp_path)}
    doc = yaml.safe_load(RULES.read_text())
    used = {
        name
        for group in doc["groups"]
        for rule in group["rules"]
        for name in re.findall(r"\b(runwatch_[a-z_]+)", rule["expr"])
    }
    assert used and used <= exposed, used - exposed


def test_every_alert_has_a_promtool_test_that_sees_its_routing():
    """Each alerting rule is expected to fire in at least one ``promtool test rules`` case,
    and every expected alert names its routing (the label Alertmanager routes on:
    deploy/alertmanager/alertmanager.yml), the rule's own or the series' passed through."""
    routings = {"page", "ticket", "advisory"}
    doc = yaml.safe_load(RULES.read_text())
    alerts = {
        rule["alert"]: rule["labels"]
        for group in doc["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    firing: dict[str, list[dict[str, str]]] = {}
    for case in tests:
        for t in case.get("alert_rule_test", []):
            for exp in t.get("exp_alerts") or []:
                firing.setdefault(t["alertname"], []).append(exp["exp_labels"])
    assert set(firing) <= set(alerts), set(firing) - set(alerts)
    assert not set(alerts) - set(firing), f"never expected to fire: {set(alerts) - set(firing)}"
    for name, expected in firing.items():
        for labels in expected:
            assert labels.get("routing") in routings, (name, labels)
            if alerts[name]["routing"] in routings:
                assert labels["routing"] == alerts[name]["routing"], (name, labels)

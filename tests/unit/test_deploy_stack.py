"""Prometheus config and the Grafana dashboard against what the exporter really exposes.

- Every metric a PromQL expression names (Grafana panels and variables, Prometheus rules)
  is a series in a real HTTP scrape of the projections' exporter over a *populated* read
  model (two tenants, alerts, reward failures, terminal runs, step phases), or a recording
  rule the rules define, or Prometheus' own ``up``; every label a selector or ``by`` clause
  names exists on that metric.
- ``promtool check config`` on deploy/prometheus/prometheus.yml (which also checks the rule
  files it loads), and every rule file in deploy/prometheus is loaded by it.
- The dashboard: generated JSON up to date, the three layers and tenant accounting as
  rows, unique ids, a valid grid, the provisioned datasource everywhere.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import start_http_server
from prometheus_client.parser import text_string_to_metric_families

from projections.exporter import make_registry
from projections.store import InMemoryReadModel
from runwatch.hosting.replay import rebuild_from_log

REPO = Path(__file__).resolve().parents[2]
PROM_DIR = REPO / "deploy" / "prometheus"
GRAFANA = REPO / "deploy" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "runwatch-overview.json"
PROMETHEUS_BUILTIN = {"up": {"job", "instance"}}
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right"}
OPERATORS = {"and", "or", "unless", "bool", "offset", "inf", "nan"}


# ---- PromQL, just enough to find metric and label names --------------------------------
def _strip_strings(expr: str) -> str:
    return re.sub(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'', '""', expr)


def selectors(expr: str) -> list[tuple[str, set[str]]]:
    """(metric name, label names in its matcher) for every vector selector."""
    s = _strip_strings(expr)
    s = re.sub(r"\[[^\]]*\]", "", s)  # range and subquery durations
    s = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", s)
    out = []
    for m in re.finditer(r"(?<![\w.$])([A-Za-z_:][\w:]*)\s*(\{[^}]*\})?", s):
        name, matcher = m.group(1), m.group(2) or ""
        rest = s[m.end() :].lstrip()
        if not matcher and rest.startswith("("):
            continue  # a function or aggregation
        if name in KEYWORDS or name.lower() in OPERATORS:
            continue
        if re.fullmatch(r"\d+[smhdwy]", name):
            continue
        labels = set(re.findall(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)", matcher))
        out.append((name, labels))
    return out


def grouping_labels(expr: str) -> set[str]:
    s = _strip_strings(expr)
    found = set()
    for m in re.finditer(r"\b(?:by|without)\s*\(([^)]*)\)", s):
        found |= {x.strip() for x in m.group(1).split(",") if x.strip()}
    return found


def test_the_promql_reader_finds_names_and_labels():
    expr = (
        'sum by (phase) (rate(runwatch_x_sum{tenant=~"$tenant", a!="b"}[$__rate_interval]))'
        " / ignoring(phase) group_left clamp_min(sum(runwatch:y:rate5m), 1e-9) > 0.5"
        " and on() time() - max(up)"
    )
    assert selectors(expr) == [
        ("runwatch_x_sum", {"tenant", "a"}),
        ("runwatch:y:rate5m", set()),
        ("up", set()),
    ]
    assert grouping_labels(expr) == {"phase"}


# ---- the exporter, scraped over HTTP -----------------------------------------------------
@pytest.fixture(scope="module")
def exposed(tmp_path_factory) -> dict[str, set[str]]:
    """sample name -> label names, from a real scrape of a populated read model."""
    from tests.integration.test_dashboard_browser import build_log

    root = tmp_path_factory.mktemp("deploy-stack")
    build_log(root / "log")
    store = InMemoryReadModel()
    rebuild_from_log(root / "log", store)
    server, thread = start_http_server(0, addr="127.0.0.1", registry=make_registry(store))
    try:
        port = server.server_address[1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            body = r.read().decode()
    finally:
        server.shutdown()
        thread.join(5)
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            out.setdefault(sample.name, set()).update(sample.labels)
    assert out, "the scrape returned no samples"
    return out


def rule_files() -> list[Path]:
    config = yaml.safe_load((PROM_DIR / "prometheus.yml").read_text())
    patterns = config.get("rule_files") or []
    return sorted(p for p in PROM_DIR.iterdir() if any(fnmatch(p.name, pat) for pat in patterns))


def rules() -> list[dict[str, Any]]:
    return [
        rule
        for path in rule_files()
        for group in (yaml.safe_load(path.read_text()) or {}).get("groups", [])
        for rule in group.get("rules", [])
    ]


def dashboard_exprs() -> list[tuple[str, str]]:
    dash = json.loads(DASHBOARD.read_text())
    out = [
        (p.get("title", ""), t["expr"])
        for p in dash["panels"]
        for t in p.get("targets", [])
        if t.get("expr")
    ]
    for var in dash["templating"]["list"]:
        q = var.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", q or "")
        assert m, f"variable {var['name']}: unsupported query {q!r}"
        out.append((f"${var['name']}", f"sum by ({m.group(2)}) ({m.group(1)})"))
    return out


def check_expr(where: str, expr: str, exposed: dict[str, set[str]], recorded: set[str]) -> None:
    sels = selectors(expr)
    assert sels, f"{where}: no metric in {expr!r}"
    available: set[str] = set()
    for name, labels in sels:
        if name in recorded:
            continue  # output labels of a recording rule: checked where it is defined
        known = exposed.get(name, PROMETHEUS_BUILTIN.get(name))
        assert known is not None, f"{where}: {name} is not exposed by the exporter ({expr!r})"
        assert labels <= known, f"{where}: {name} has no label {labels - known} ({expr!r})"
        available |= known
    if all(name not in recorded for name, _ in sels):
        missing = grouping_labels(expr) - available
        assert not missing, f"{where}: grouping by unknown labels {missing} ({expr!r})"


def test_rule_files_are_loaded_and_test_files_are_not():
    loaded = {p.name for p in rule_files()}
    on_disk = {p.name for p in PROM_DIR.glob("*.yml")} - {"prometheus.yml"}
    tests = {n for n in on_disk if ".test." in n}
    assert loaded and not loaded & tests
    assert loaded == on_disk - tests, "a rule file in deploy/prometheus is not loaded"


def test_rules_use_only_exposed_metrics(exposed, tmp_path):
    # and the notifier's and the processors' own metrics ports (rules on who is told)
    from tests.unit.runwatch.test_liveness_series import liveness_series

    exposed = {**exposed, **liveness_series(tmp_path)}
    recorded = {r["record"] for r in rules() if "record" in r}
    for r in rules():
        check_expr(r.get("record") or r.get("alert"), r["expr"], exposed, recorded)


def test_dashboard_uses_only_exposed_metrics_and_defined_recordings(exposed):
    recorded = {r["record"] for r in rules() if "record" in r}
    used = set()
    for where, expr in dashboard_exprs():
        check_expr(where, expr, exposed, recorded)
        used |= {name for name, _ in selectors(expr)}
    # the dashboard covers every family the exporter offers, except the exporter's own
    families = {re.sub(r"_(?:total|bucket|sum|count|created)$", "", n) for n in exposed}
    uncovered = {f for f in families if not any(u == f or u.startswith(f + "_") for u in used)}
    assert not uncovered, f"exported but on no panel: {sorted(uncovered)}"


def test_no_expression_uses_a_run_id_label():
    exprs = [e for _, e in dashboard_exprs()] + [r["expr"] for r in rules()]
    assert not any("run_id" in e for e in exprs)


@pytest.mark.skipif(not shutil.which("promtool") and not os.environ.get("CI"), reason="promtool")
def test_promtool_checks_the_prometheus_config():
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing in CI: scripts/setup-prometheus.sh installs it"
    r = subprocess.run(
        [promtool, "check", "config", str(PROM_DIR / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    for path in rule_files():
        assert path.name in r.stdout + r.stderr  # its rules were loaded and checked too


# ---- the Grafana dashboard -------------------------------------------------------------
def test_dashboard_json_is_generated_from_its_source():
    r = subprocess.run(
        [sys.executable, str(GRAFANA / "dashboard.py"), "--check"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr


def test_dashboard_has_the_three_layers_and_accounting():
    dash = json.loads(DASHBOARD.read_text())
    rows = [p["title"].lower() for p in dash["panels"] if p["type"] == "row"]
    assert len(rows) == 4
    for row, word in zip(rows, ("infra", "run mechanics", "algorithmic health", "tenant")):
        assert row.startswith(word), rows
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    datasource = yaml.safe_load(
        (GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text()
    )["datasources"][0]
    assert datasource["url"] == "http://prometheus:9090"
    for p in dash["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24, p["title"]
        if p["type"] in ("stat", "timeseries", "table"):
            assert p["datasource"]["uid"] == datasource["uid"], p["title"]
            assert all(t["datasource"]["uid"] == datasource["uid"] for t in p["targets"])
    # panels do not overlap
    cells = set()
    for p in dash["panels"]:
        g = p["gridPos"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps another panel"
                cells.add((x, y))


def grafana_to_promql(expr: str) -> str:
    """Grafana's variables replaced by what they stand for at query time."""
    return expr.replace("$__rate_interval", "1m").replace("$tenant", ".*")


@pytest.mark.skipif(not shutil.which("promtool") and not os.environ.get("CI"), reason="promtool")
def test_promtool_parses_every_dashboard_expression(tmp_path):
    """Each panel's PromQL as a recording rule: `promtool check rules` parses them all."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing in CI: scripts/setup-prometheus.sh installs it"
    exprs = [grafana_to_promql(e) for _, e in dashboard_exprs()]
    doc = {
        "groups": [
            {
                "name": "grafana-panels",
                "rules": [{"record": f"grafana:panel_{i}", "expr": e} for i, e in enumerate(exprs)],
            }
        ]
    }
    path = tmp_path / "panels.yml"
    path.write_text(yaml.safe_dump(doc))
    r = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{len(exprs)} rules found" in r.stdout + r.stderr

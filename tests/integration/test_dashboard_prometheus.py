"""The operator stack for real, minus Docker: Debian's Prometheus server, started with the
project's scrape config (targets pointed at this machine) and rules, scrapes the
projections' exporter over a populated read model; then every Grafana panel's PromQL is
run through Prometheus' HTTP API: it must evaluate, and the panels on raw exporter series
must return data.

Prometheus comes with promtool in Debian's ``prometheus`` package
(scripts/setup-prometheus.sh). Without it the test skips locally and fails under CI.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from typing import Any

import pytest
import yaml
from prometheus_client import start_http_server

from projections.exporter import make_registry
from projections.store import InMemoryReadModel
from runwatch.hosting.replay import rebuild_from_log
from tests.integration.test_dashboard_browser import build_log
from tests.unit.test_deploy_stack import (
    PROM_DIR,
    dashboard_exprs,
    grafana_to_promql,
    rule_files,
    rules,
)

#: Panels that may be empty on the test data, and why.
MAY_BE_EMPTY = {
    # no run-mechanics alert is active in the test log (its runs are algorithmic faults)
    'sum by (detector) (runwatch_alerts_active{layer="run_mechanics"})',
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    binary = shutil.which("prometheus")
    if not binary:
        if os.environ.get("CI"):
            pytest.fail("prometheus missing in CI: scripts/setup-prometheus.sh installs it")
        pytest.skip("prometheus server not installed (scripts/setup-prometheus.sh)")
    root = tmp_path_factory.mktemp("prometheus")
    build_log(root / "log")
    store = InMemoryReadModel()
    rebuild_from_log(root / "log", store)
    exporter, thread = start_http_server(0, addr="127.0.0.1", registry=make_registry(store))
    port = _free_port()
    # the project's config, with its targets on this machine and a fast scrape
    config = yaml.safe_load((PROM_DIR / "prometheus.yml").read_text())
    config["global"]["scrape_interval"] = "1s"
    config["global"]["evaluation_interval"] = "1s"
    config["rule_files"] = [str(PROM_DIR / p) for p in config["rule_files"]]
    for job in config["scrape_configs"]:
        if job["job_name"] == "runwatch-projections":
            job["static_configs"][0]["targets"] = [f"127.0.0.1:{exporter.server_address[1]}"]
        else:
            job["static_configs"][0]["targets"] = [f"127.0.0.1:{port}"]
    (root / "prometheus.yml").write_text(yaml.safe_dump(config))
    log = (root / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={root / 'prometheus.yml'}",
            f"--storage.tsdb.path={root / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        scrapes = 0
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise AssertionError(f"prometheus exited:\n{(root / 'prometheus.log').read_text()}")
            try:
                r = _get(f"{base}/api/v1/query?query=count_over_time(up[1m])")
                values = [int(x["value"][1]) for x in r["data"]["result"]]
                jobs = len(config["scrape_configs"])  # every target up, each scraped
                scrapes = min(values) if len(values) == jobs else 0
            except OSError:
                pass
            if scrapes >= 4:  # enough samples for rate() and increase()
                break
            time.sleep(0.5)
        assert scrapes >= 4, "prometheus did not scrape every target"
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        exporter.shutdown()
        thread.join(5)


def query(base: str, expr: str) -> dict[str, Any]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        return _get(url)
    except urllib.error.HTTPError as exc:  # 400: the expression does not parse or evaluate
        return json.loads(exc.read())


def test_every_target_is_up(prometheus):
    """Every job of the project's config (the exporter; the others, the notifier's and the
    processors' among them, pointed at Prometheus itself here) is scraped and up."""
    r = _get(f"{prometheus}/api/v1/targets")
    health = {t["labels"]["job"]: t["health"] for t in r["data"]["activeTargets"]}
    jobs = yaml.safe_load((PROM_DIR / "prometheus.yml").read_text())["scrape_configs"]
    assert health == {job["job_name"]: "up" for job in jobs}
    assert {"runwatch-projections", "runwatch-notifier", "runwatch-processors"} <= set(health)


def test_the_projects_rules_are_loaded(prometheus):
    r = _get(f"{prometheus}/api/v1/rules")
    loaded = [rule["name"] for g in r["data"]["groups"] for rule in g["rules"]]
    expected = [x.get("record") or x.get("alert") for x in rules()]
    assert sorted(loaded) == sorted(expected) and rule_files()


def test_every_dashboard_panel_evaluates_and_raw_panels_have_data(prometheus):
    recorded = {r["record"] for r in rules() if "record" in r}
    empty = []
    for where, expr in dashboard_exprs():
        r = query(prometheus, grafana_to_promql(expr))
        assert r["status"] == "success", f"{where}: {r.get('error')} in {expr!r}"
        if any(name in expr for name in recorded) or expr in MAY_BE_EMPTY:
            continue  # recording rules run every minute: not evaluated yet in a short test
        if not r["data"]["result"]:
            empty.append(f"{where}: {expr}")
    assert not empty, "panels without data on a populated exporter:\n" + "\n".join(empty)


def test_tenant_variable_lists_both_tenants(prometheus):
    r = _get(f"{prometheus}/api/v1/label/tenant/values?match[]=runwatch_tenant_runs")
    assert sorted(r["data"]) == ["acme", "globex"]


def test_recording_rules_evaluate_on_the_scraped_series(prometheus):
    """The rules' own expressions, run now (the rule group's 1m interval is too slow)."""
    failed = []
    for rule in rules():
        if "record" not in rule:
            continue
        r = query(prometheus, rule["expr"])
        if r["status"] != "success" or not r["data"]["result"]:
            failed.append(f"{rule['record']}: {r.get('error') or 'no data'}")
    assert not failed, failed

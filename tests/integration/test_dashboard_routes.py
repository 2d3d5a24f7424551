"""The dashboard's routes inside the query API, without a browser: the page and its assets
are served self-contained (no external URL, strict CSP), and the customer alert view
keeps the API's tenant isolation and shows only the customer-facing layer.

The read model is folded from a real embedded log written through the emitter SDK (the
browser test's two tenants, :func:`tests.integration.test_dashboard_browser.build_log`).
"""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from projections.api import create_app
from projections.dashboard.router import STATIC, customer_alerts
from projections.keys import ApiKeys
from projections.sqlite_store import SqliteReadModel
from runwatch.hosting.replay import rebuild_from_log
from tests.integration.test_dashboard_browser import EXPECTED_STATE, KEYS, build_log


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("dashboard-routes")
    build_log(root / "log")
    db = SqliteReadModel(root / "p.sqlite")
    rebuild_from_log(root / "log", db)
    return db


@pytest.fixture(scope="module")
def client(store):
    keys = {"keys": [{"key": k, "tenant": t} for k, t in KEYS.items()]}
    keys["keys"].append({"key": "k-ops", "operator": True})
    return TestClient(create_app(store, ApiKeys.from_mapping(keys)))


def test_the_log_folds_into_the_expected_states(store):
    assert {v.run_id: v.state for v in store.all_views()} == EXPECTED_STATE


def test_page_and_assets_are_self_contained(client):
    page = client.get("/dashboard")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src 'self'" in csp
    refs = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert refs and all(r.startswith("/dashboard/static/") for r in refs), refs
    for name in STATIC:
        r = client.get(f"/dashboard/static/{name}")
        assert r.status_code == 200, name
        assert r.headers["content-type"].split(";")[0] == STATIC[name].split(";")[0]
        # nothing is fetched from anywhere else (the machine has no internet; no CDN)
        assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", r.text), name
    js = client.get("/dashboard/static/app.js").text
    assert "innerHTML" not in js and "eval(" not in js  # text only, never markup
    assert client.get("/dashboard/static/../api.py").status_code == 404
    assert client.get("/dashboard/static/index.html").status_code == 404  # allow-list only
    assert client.get("/dashboard/", follow_redirects=False).status_code == 308


def test_alerts_need_a_key_and_keep_tenants_apart(client):
    url = "/dashboard/api/runs/{}/alerts"
    assert client.get(url.format("acme-code-grpo-002")).status_code == 401
    bad = client.get(url.format("acme-code-grpo-002"), headers={"X-API-Key": "nope"})
    assert bad.status_code == 401
    own = client.get(url.format("acme-code-grpo-002"), headers={"X-API-Key": "k-acme-7d1c"})
    assert own.status_code == 200
    assert [a["detector"] for a in own.json()["items"]] == ["reward_hacking"]
    # a foreign run and an unknown run answer the same 404, by header or bearer token
    for headers in ({"X-API-Key": "k-globex-52e9"}, {"Authorization": "Bearer k-globex-52e9"}):
        foreign = client.get(url.format("acme-code-grpo-002"), headers=headers)
        unknown = client.get(url.format("acme-nope-000"), headers=headers)
        assert foreign.status_code == unknown.status_code == 404
        assert foreign.json() == unknown.json()
    ops = client.get(url.format("globex-summarize-004"), headers={"X-API-Key": "k-ops"})
    assert [a["detector"] for a in ops.json()["items"]] == ["dead_run"]


def test_customer_alerts_show_the_algorithmic_layer_in_plain_terms(client, store):
    r = client.get(
        "/dashboard/api/runs/acme-chat-grpo-003/alerts", headers={"X-API-Key": "k-acme-7d1c"}
    )
    items = r.json()["items"]
    # the entropy's sequential test sees the fall first (a ticket: the run trains on), then
    # the KL gate pages and pauses the run
    assert [a["detector"] for a in items] == ["entropy_collapse", "kl_blowup"]
    for a in items:
        assert a["title"] and a["reason"] and a["severity"] in {"critical", "warning", "info"}
        assert not {"thresholds", "observed", "routing", "config_version", "layer"} & set(a)
    steps = [a["fired_step"] for a in items]
    assert steps == sorted(steps)


def test_mechanics_and_internal_alerts_stay_internal():
    alerts = {
        "a": {"detector": "weight_sync_staleness", "layer": "run_mechanics", "fired_step": 3},
        "b": {"detector": "grad_norm_spike", "layer": "algorithmic", "fired_step": 4},
        "c": {"detector": "kl_blowup", "layer": "algorithmic", "routing": "page", "fired_step": 5},
        "d": {"detector": "dead_run", "resolved_ts": 9.0},  # a resolution without its firing
    }
    shown = customer_alerts(alerts)
    assert [(a.detector, a.severity, a.active) for a in shown] == [("kl_blowup", "critical", True)]


def test_openapi_lists_the_customer_alert_route_only(client):
    paths = client.get("/openapi.json").json()["paths"]
    assert "/dashboard/api/runs/{run_id}/alerts" in paths
    assert "/dashboard" not in paths and "/dashboard/static/{name}" not in paths

"""The query API on a real SQLite read model built from a real embedded log: tenant
isolation, keys, pagination, unknown runs, the OpenAPI document, and over real HTTP."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient
from openapi_spec_validator import validate

from events.log.embedded import EmbeddedLog
from projections.api import create_app
from projections.keys import ApiKeys, digest
from projections.sqlite_store import SqliteReadModel
from runwatch.hosting.replay import rebuild_from_log
from tests.projection_runs import synth_fleet, write_log

KEYS = {
    "keys": [
        {"key": "k-tenant-0", "tenant": "tenant-0"},
        {"sha256": digest("k-tenant-1"), "tenant": "tenant-1"},
        {"key": "k-empty", "tenant": "nobody"},
        {"key": "k-ops", "operator": True},
    ]
}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("api")
    log = EmbeddedLog(root / "log", sync=False)
    log.open_sync()
    write_log(log, synth_fleet(21, 30, tenants=3))
    db = SqliteReadModel(root / "p.sqlite")
    rebuild_from_log(root / "log", db)
    return db


@pytest.fixture(scope="module")
def client(store):
    return TestClient(create_app(store, ApiKeys.from_mapping(KEYS)))


def h(key):
    return {"Authorization": f"Bearer {key}"}


def all_ids(client, key, limit=4):
    ids, offset = [], 0
    while offset is not None:
        r = client.get("/v1/runs", params={"offset": offset, "limit": limit}, headers=h(key))
        assert r.status_code == 200
        body = r.json()
        ids += [i["run_id"] for i in body["items"]]
        offset = body["next_offset"]
    return ids, body["total"]


def test_listing_shows_only_the_callers_runs_across_pages(client, store):
    ids, total = all_ids(client, "k-tenant-0")
    expected = sorted(v.run_id for v in store.all_views() if v.tenant_id == "tenant-0")
    assert sorted(ids) == expected and total == len(expected) == 7
    assert len(set(ids)) == len(ids)  # pages neither overlap nor skip
    ids1, _ = all_ids(client, "k-tenant-1", limit=3)
    assert not set(ids) & set(ids1)


def test_foreign_and_unknown_runs_are_the_same_404(client, store):
    foreign = next(v.run_id for v in store.all_views() if v.tenant_id == "tenant-1")
    for path in ("/v1/runs/{}", "/v1/runs/{}/charts"):
        a = client.get(path.format(foreign), headers=h("k-tenant-0"))
        b = client.get(path.format("run-does-not-exist"), headers=h("k-tenant-0"))
        assert a.status_code == b.status_code == 404
        assert a.json() == b.json() == {"detail": "run not found"}
    # guessing ids: every id of the fleet pattern either is yours or is a 404
    for i in range(0, 40):
        r = client.get(f"/v1/runs/run-{i:04d}", headers=h("k-tenant-0"))
        assert r.status_code in (200, 404)
        if r.status_code == 200:
            assert store.get_run(f"run-{i:04d}").tenant_id == "tenant-0"


def test_missing_and_bad_keys(client):
    assert client.get("/v1/runs").status_code == 401
    assert client.get("/v1/runs", headers=h("nope")).status_code == 401
    assert client.get("/v1/runs", headers={"Authorization": "Basic abc"}).status_code == 401
    r = client.get("/v1/runs", headers={"X-API-Key": "k-tenant-0"})
    assert r.status_code == 200
    assert client.get("/v1/operator/runs", headers=h("k-tenant-0")).status_code == 403
    assert client.get("/v1/operator/tenants", headers=h("nope")).status_code == 401


def test_pagination_bounds(client):
    assert client.get("/v1/runs", params={"limit": 0}, headers=h("k-tenant-0")).status_code == 422
    assert client.get("/v1/runs", params={"limit": 501}, headers=h("k-tenant-0")).status_code == 422
    assert client.get("/v1/runs", params={"offset": -1}, headers=h("k-tenant-0")).status_code == 422
    r = client.get("/v1/runs", params={"offset": 100}, headers=h("k-tenant-0")).json()
    assert r["items"] == [] and r["next_offset"] is None and r["total"] == 7
    assert client.get("/v1/runs", headers=h("k-empty")).json()["total"] == 0


def test_customer_view_has_state_reason_attribution_and_the_chart_set(client, store):
    failed = [v for v in store.all_views() if v.tenant_id == "tenant-0" and v.failure_class]
    assert failed
    for v in failed:
        body = client.get(f"/v1/runs/{v.run_id}", headers=h("k-tenant-0")).json()
        assert body["state"] == "FAILED"
        assert body["failure"]["failure_class"] == v.failure_class
        assert body["failure"]["message"] == body["reason"]
        if v.failure_class == "tenant_code_fault":
            assert body["failure"]["examples"] and "your reward function raised" in body["reason"]
        assert "alerts" not in body and "mechanics" not in body  # operator-only
    run = failed[0].run_id
    charts = client.get(f"/v1/runs/{run}/charts", headers=h("k-tenant-0")).json()
    assert set(charts) == {"run_id", "reward", "kl", "eval_gate", "spend_usd", "next_since_step"}
    assert charts["reward"] and charts["spend_usd"]
    paged = client.get(
        f"/v1/runs/{run}/charts", params={"limit": 5}, headers=h("k-tenant-0")
    ).json()
    assert len(paged["reward"]) == 5 and paged["next_since_step"] == paged["reward"][-1]["step"] + 1
    usage = client.get("/v1/usage", headers=h("k-tenant-0")).json()
    assert usage["tenant_id"] == "tenant-0" and usage["runs"] == 7 and usage["spend_usd"] > 0


def test_operator_view_has_every_layer(client, store):
    v = next(v for v in store.all_views() if v.alerts)
    body = client.get(f"/v1/operator/runs/{v.run_id}", headers=h("k-ops")).json()
    run = body["run"]
    for key in ("alerts", "ledger", "usage", "mechanics", "transitions", "counters", "attribution"):
        assert key in run
    assert body["series"]["grad_norm"] and body["series"]["sync_s"]
    tenants = client.get("/v1/operator/tenants", headers=h("k-ops")).json()
    assert [t["tenant_id"] for t in tenants] == ["tenant-0", "tenant-1", "tenant-2"]
    page = client.get("/v1/operator/runs", params={"tenant_id": "tenant-2"}, headers=h("k-ops"))
    assert page.json()["total"] == 7


def test_openapi_document_validates(client):
    doc = client.get("/openapi.json").json()
    validate(doc)
    assert "/v1/runs/{run_id}/charts" in doc["paths"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_served_over_real_http(store):
    port = _free_port()
    config = uvicorn.Config(
        create_app(store, ApiKeys.from_mapping(KEYS)), port=port, log_level="error"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        base = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{base}/healthz").json() == {"status": "ok"}
        assert httpx.get(f"{base}/v1/runs", headers=h("k-tenant-1")).json()["total"] == 7
        assert httpx.get(f"{base}/v1/runs/run-0000", headers=h("k-tenant-1")).status_code == 404
    finally:
        server.should_exit = True
        thread.join(10)

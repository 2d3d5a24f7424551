"""The CLI end to end, as real processes: ``runwatch serve api`` tailing a live embedded
log (API + Prometheus scrape over HTTP), ``runwatch replay --store`` and
``runwatch audit verify`` (identical, then the first difference after tampering)."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from events.log.embedded import EmbeddedLog
from tests.projection_runs import synth_fleet, write_log

CLI = [sys.executable, "-m", "runwatch.cli.main"]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(fn, timeout=60.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = fn()
            if last:
                return last
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"timed out; last={last!r}")


@pytest.fixture
def fleet():
    return synth_fleet(12, 40, tenants=3)


def test_serve_follows_a_live_log_then_audit_verify_agrees(tmp_path, fleet):
    log_dir, store = tmp_path / "log", tmp_path / "live.sqlite"
    log = EmbeddedLog(log_dir, sync=False)
    log.open_sync()
    keys = tmp_path / "keys.yaml"
    keys.write_text(
        yaml.safe_dump(
            {"keys": [{"key": "k0", "tenant": "tenant-0"}, {"key": "ops", "operator": True}]}
        )
    )
    api_port, metrics_port = _port(), _port()
    write_log(log, fleet[: len(fleet) // 2])  # half before the server starts, half while it runs
    proc = subprocess.Popen(
        [
            *CLI,
            "serve",
            "api",
            "--log",
            str(log_dir),
            "--store",
            str(store),
            "--keys",
            str(keys),
            "--port",
            str(api_port),
            "--metrics-port",
            str(metrics_port),
            "--settle-s",
            "0.3",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        base = f"http://127.0.0.1:{api_port}"
        _wait(lambda: httpx.get(f"{base}/healthz").status_code == 200)
        write_log(log, fleet[len(fleet) // 2 :])
        ops = {"Authorization": "Bearer ops"}

        def settled():
            runs = httpx.get(f"{base}/v1/operator/runs", params={"limit": 100}, headers=ops).json()
            done = [r for r in runs["items"] if r["state"] in ("SUCCEEDED", "FAILED", "CANCELLED")]
            return runs["total"] == 12 and len(done) == 12

        _wait(settled)
        mine = httpx.get(f"{base}/v1/runs", headers={"Authorization": "Bearer k0"}).json()
        assert mine["total"] == 4
        assert (
            httpx.get(f"{base}/v1/runs", headers={"Authorization": "Bearer bad"}).status_code == 401
        )

        text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics").text
        families = {f.name: f for f in text_string_to_metric_families(text)}
        runs = {s.labels["state"]: s.value for s in families["runwatch_runs"].samples}
        assert sum(runs.values()) == 12
        phase = families["runwatch_step_phase_seconds"]
        assert {s.labels["phase"] for s in phase.samples} >= {"rollout", "score", "sync", "optim"}
        for fam in families.values():
            for s in fam.samples:
                assert "run_id" not in s.labels
        tenants = {s.labels["tenant"] for s in families["runwatch_tenant_spend_usd"].samples}
        assert tenants == {"tenant-0", "tenant-1", "tenant-2"}
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    out = subprocess.run(
        [*CLI, "audit", "verify", "--store", str(store), "--log", str(log_dir), "--json"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr + out.stdout
    report = json.loads(out.stdout)
    assert report["identical"] and report["runs"] == 12

    con = sqlite3.connect(store)
    con.execute(
        "UPDATE series SET value = value + 1 WHERE run_id = 'run-0003' AND metric = 'kl_to_ref'"
        " AND step = 7"
    )
    con.commit()
    out = subprocess.run(
        [*CLI, "audit", "verify", "--store", str(store), "--log", str(log_dir)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 1
    assert "DIFFERENT at $.series.run-0003.kl_to_ref[6][1]" in out.stdout


def test_replay_cli_rebuilds_projections_into_a_store(tmp_path, fleet):
    log_dir, store = tmp_path / "log", tmp_path / "replayed.sqlite"
    log = EmbeddedLog(log_dir, sync=False)
    log.open_sync()
    write_log(log, fleet)
    env = {**os.environ}
    first = subprocess.run(
        [*CLI, "replay", str(log_dir), "--json", "--store", str(store)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert first.returncode == 0, first.stderr
    lines = [json.loads(x) for x in first.stdout.splitlines()]
    states = [x for x in lines if x["type"] == "RunStateChanged"]
    assert {x["run_id"] for x in states} == {f"run-{i:04d}" for i in range(12)}
    again = subprocess.run([*CLI, "replay", str(log_dir), "--json"], capture_output=True, text=True)
    assert again.stdout == first.stdout  # byte for byte
    out = subprocess.run(
        [*CLI, "audit", "verify", "--store", str(store), "--log", str(log_dir)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0 and out.stdout.startswith("identical"), out.stdout + out.stderr


def test_replay_and_verify_with_key_sharded_workers(tmp_path, fleet):
    """``--workers 2``: the same store and the same derived events per run as one
    process; verify with workers agrees with the single-process store and catches a
    tampered one."""
    log_dir = tmp_path / "log"
    log = EmbeddedLog(log_dir, sync=False)
    log.open_sync()
    write_log(log, fleet)
    one, two = tmp_path / "one.sqlite", tmp_path / "two.sqlite"
    runs = {}
    for store, workers in ((one, "1"), (two, "2")):
        out = subprocess.run(
            [*CLI, "replay", str(log_dir), "--json", "--store", str(store), "--workers", workers],
            capture_output=True,
            text=True,
        )
        assert out.returncode == 0, out.stderr
        per_run: dict[tuple[str, str], list[str]] = {}
        for line in out.stdout.splitlines():
            doc = json.loads(line)
            per_run.setdefault((doc["run_id"], doc["producer"]), []).append(line)
        runs[workers] = per_run
    assert runs["1"] == runs["2"]
    for store in (one, two):
        verify = ["audit", "verify", "--store", str(store), "--log", str(log_dir)]
        out = subprocess.run(
            [*CLI, *verify, "--workers", "2", "--json"],
            capture_output=True,
            text=True,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        assert json.loads(out.stdout)["identical"]
    con = sqlite3.connect(two)
    con.execute("UPDATE series SET value = value + 1 WHERE run_id = 'run-0002' AND step = 5")
    con.commit()
    out = subprocess.run(
        [*CLI, "audit", "verify", "--store", str(two), "--log", str(log_dir), "--workers", "2"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 1 and "DIFFERENT" in out.stdout
    out = subprocess.run(
        [*CLI, "replay", str(log_dir), "--workers", "0"], capture_output=True, text=True
    )
    assert out.returncode == 1 and "--workers must be at least 1" in out.stderr


def test_audit_verify_errors_are_clear(tmp_path):
    out = subprocess.run(
        [*CLI, "audit", "verify", "--store", str(tmp_path / "none.sqlite"), "--log", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 1 and "no projection store" in out.stderr

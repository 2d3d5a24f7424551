"""People can act through the query API: real ``runwatch serve api`` and ``runwatch
train`` processes on one embedded log. An operator pauses, the customer resumes (with a
setting changed) and cancels; the projected state follows the trainer's answers; bad
commands are 404 / 403 / 409 / 422 and never change a state."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from events.catalog.control import CommandRejected, UnpauseRequested
from events.catalog.lifecycle import RunResumed
from tests.integration.test_run_control import ROOT, Trainer, _events

pytestmark = pytest.mark.timeout(240)

CUSTOMER, STRANGER, OPS = "k-tenant-a", "k-tenant-b", "k-ops"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _h(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _wait_state(api: httpx.Client, run_id: str, want: set[str], timeout: float = 60) -> str:
    end = time.monotonic() + timeout
    state = None
    while time.monotonic() < end:
        r = api.get(f"/v1/runs/{run_id}", headers=_h(CUSTOMER))
        if r.status_code == 200:
            state = r.json()["state"]
            if state in want:
                return state
        time.sleep(0.1)
    raise AssertionError(f"{run_id} never reached {want} (last {state})")


def test_operator_pauses_customer_resumes_with_a_fix_and_cancels(tmp_path: Path) -> None:
    log = tmp_path / "log"
    keys = tmp_path / "keys.yaml"
    keys.write_text(
        yaml.safe_dump(
            {
                "keys": [
                    {"key": CUSTOMER, "tenant": "tenant-a"},
                    {"key": STRANGER, "tenant": "tenant-b"},
                    {"key": OPS, "operator": True},
                ]
            }
        )
    )
    trainer = Trainer(log, "api-run")
    port = _free_port()
    server = subprocess.Popen(
        [
            sys.executable, "-m", "runwatch.cli.main", "serve", "api", "--log", str(log),
            "--keys", str(keys), "--store", str(tmp_path / "view.sqlite"), "--port", str(port),
            "--settle-s", "0.2",
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        api = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10)
        end = time.monotonic() + 60
        while True:
            try:
                if api.get("/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert server.poll() is None and time.monotonic() < end, server.stderr
            time.sleep(0.1)
        trainer.wait_step(3)
        _wait_state(api, "api-run", {"RUNNING"})

        # bad commands: clear status codes, nothing written but a rejection
        assert api.post("/v1/runs/api-run/resume", headers=_h(CUSTOMER)).status_code == 409
        assert api.post("/v1/runs/api-run/cancel", headers=_h(STRANGER)).status_code == 404
        assert api.post("/v1/runs/no-such/cancel", headers=_h(CUSTOMER)).status_code == 404
        r = api.post("/v1/operator/runs/api-run/pause", headers=_h(CUSTOMER))
        assert r.status_code == 403
        r = api.post("/v1/operator/runs/api-run/explode", headers=_h(OPS))
        assert r.status_code == 422
        r = api.post(
            "/v1/runs/api-run/resume", headers=_h(CUSTOMER), json={"overrides": {"momentum": 1}}
        )
        assert r.status_code == 422 and "momentum" in r.text

        r = api.post(
            "/v1/operator/runs/api-run/pause", headers=_h(OPS), json={"reason": "maintenance"}
        )
        assert r.status_code == 202, r.text
        _wait_state(api, "api-run", {"PAUSED_BY_GATE"})
        doc = api.get("/v1/runs/api-run", headers=_h(CUSTOMER)).json()
        assert "maintenance" in doc["reason"]

        r = api.post(
            "/v1/runs/api-run/resume",
            headers=_h(CUSTOMER),
            json={"reason": "carry on", "overrides": {"lr": 0.005}},
        )
        assert r.status_code == 202, r.text
        resume_id = r.json()["command_id"]
        _wait_state(api, "api-run", {"RUNNING", "DEGRADED"})

        r = api.post("/v1/runs/api-run/cancel", headers=_h(CUSTOMER))
        assert r.status_code == 202, r.text
        assert _wait_state(api, "api-run", {"CANCELLED"}) == "CANCELLED"
        trainer.proc.wait(timeout=60)
        assert trainer.proc.returncode == 0
        r = api.post("/v1/runs/api-run/resume", headers=_h(CUSTOMER))
        assert r.status_code == 409 and "ended" in r.text
    finally:
        trainer.kill()
        server.terminate()
        server.wait(timeout=30)
    events = _events(log, "api-run")
    unpause = next(e for e in events if isinstance(e, UnpauseRequested))
    assert (unpause.actor, str(unpause.event_id)) == ("customer", resume_id)
    assert dict(unpause.overrides) == {"lr": 0.005}
    resumed = next(e for e in events if isinstance(e, RunResumed))
    assert resumed.request_id == resume_id and "lr=0.005" in resumed.reason
    rejected = [e for e in events if isinstance(e, CommandRejected)]
    assert {e.reason for e in rejected} >= {"the run is not paused", "the run has already ended"}

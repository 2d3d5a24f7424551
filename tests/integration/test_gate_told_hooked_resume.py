"""A resume "with the fix" of a hooked run is refused, not silently dropped: a real
``runwatch serve api`` on an embedded log, and a real hook (a customer's own loop that obeys
its commands). The hook cannot apply settings, so ``POST .../resume`` with ``overrides`` is a
``409`` that tells the customer to change the setting in their own job, and nothing is
written; a plain resume still works. Overrides on runwatch's own trainer's runs are covered
by ``test_api_commands.py``."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml

from events.catalog.control import UnpauseRequested
from events.catalog.lifecycle import RunResumed
from producers.hooks import RunwatchHook
from tests.integration.hooks_support import embedded_events

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[2]
CUSTOMER, OPS = "k-acme", "k-ops"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _h(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _state(api: httpx.Client, run_id: str) -> str | None:
    r = api.get(f"/v1/runs/{run_id}", headers=_h(CUSTOMER))
    return r.json().get("state") if r.status_code == 200 else None


def _wait(what, timeout: float = 60.0):  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = what()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_resume_with_overrides_of_a_hooked_run_is_refused(tmp_path: Path) -> None:
    log = tmp_path / "log"
    keys = tmp_path / "keys.yaml"
    keys.write_text(
        yaml.safe_dump(
            {"keys": [{"key": CUSTOMER, "tenant": "acme"}, {"key": OPS, "operator": True}]}
        )
    )
    hook = RunwatchHook(
        "hooked", "acme", log=log, spool=tmp_path / "spool", gpus=1,
        install_exit_hooks=False, command_poll_s=0.1,
    )  # fmt: skip
    hook.start({"learning_rate": 1e-3})
    hook.log({"reward": 0.0, "kl": 0.0}, step=0)
    hook.flush(10)
    port = _free_port()
    server = subprocess.Popen(
        [
            sys.executable, "-m", "runwatch.cli.main", "serve", "api", "--log", str(log),
            "--keys", str(keys), "--store", str(tmp_path / "view.sqlite"), "--port", str(port),
            "--settle-s", "0.2",
        ],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    stop = threading.Event()
    trained: list[int] = []

    def train() -> None:  # the customer's loop: it obeys (pauses, resumes) at each step
        step = 0
        while not stop.is_set() and step < 2_000:
            step += 1
            hook.log({"reward": 0.1, "kl": 0.01}, step=step)
            hook.step_done(step, wall_s=0.05)
            trained.append(step)
            if hook.obey(step):
                break
            time.sleep(0.05)

    loop = threading.Thread(target=train, daemon=True)
    try:
        api = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10)

        def up() -> bool:
            assert server.poll() is None, server.stderr.read() if server.stderr else ""
            try:
                return api.get("/healthz").status_code == 200
            except httpx.TransportError:
                return False

        _wait(up)
        loop.start()
        _wait(lambda: _state(api, "hooked") == "RUNNING")
        r = api.post("/v1/operator/runs/hooked/pause", headers=_h(OPS), json={"reason": "x"})
        assert r.status_code == 202, r.text
        _wait(lambda: _state(api, "hooked") == "PAUSED_BY_GATE")

        # the fix cannot be applied by a hook: refused, saying where to change it
        for who, path in ((CUSTOMER, "/v1/runs/hooked/resume"),
                          (OPS, "/v1/operator/runs/hooked/resume")):  # fmt: skip
            r = api.post(path, headers=_h(who), json={"reason": "fix", "overrides": {"lr": 1e-5}})
            assert r.status_code == 409, (r.status_code, r.text)
            said = r.json()["detail"]
            assert "lr" in said and "your own job" in said and "without overrides" in said
        assert _state(api, "hooked") == "PAUSED_BY_GATE"

        # a plain resume is accepted and the loop trains on
        r = api.post("/v1/runs/hooked/resume", headers=_h(CUSTOMER), json={"reason": "go"})
        assert r.status_code == 202, r.text
        _wait(lambda: _state(api, "hooked") in {"RUNNING", "DEGRADED"})
    finally:
        stop.set()
        loop.join(timeout=30)
        hook.finish()
        hook.flush(10)
        hook.close()
        server.terminate()
        server.wait(timeout=30)
    events = embedded_events(log, "hooked")
    unpauses = [e for e in events if isinstance(e, UnpauseRequested)]
    assert len(unpauses) == 1 and not dict(unpauses[0].overrides)  # the refused ones: unwritten
    resumed = [e for e in events if isinstance(e, RunResumed)]
    assert resumed and "not applied" not in resumed[0].reason

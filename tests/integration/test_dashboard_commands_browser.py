"""Click Resume on a paused run and see it running again: a real ``runwatch train``
process, a real ``runwatch serve api`` following its log, and headless Chromium driving
the customer dashboard. An operator pauses the run through the API; the customer resumes
it and then cancels it with the dashboard's buttons; the trainer answers each."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from events.catalog.control import CancelRequested, UnpauseRequested
from events.catalog.lifecycle import RunCancelled, RunResumed
from tests.integration.test_api_commands import _free_port
from tests.integration.test_dashboard_browser import _need_browser, _open, _wait, browser  # noqa: F401
from tests.integration.test_run_control import ROOT, Trainer, _events

pytestmark = pytest.mark.timeout(300)

KEY, OPS = "k-tenant-a-91f2", "k-ops-77"


def _state(base: str, run_id: str) -> str | None:
    r = httpx.get(f"{base}/v1/runs/{run_id}", headers={"X-API-Key": KEY}, timeout=10)
    return r.json()["state"] if r.status_code == 200 else None


def _until(pred, timeout: float = 60.0, what: str = "") -> None:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_click_resume_on_a_paused_run_and_see_it_running_again(
    tmp_path: Path,
    browser,  # noqa: F811
) -> None:
    _need_browser()
    from selenium.webdriver.common.by import By

    log = tmp_path / "log"
    keys = tmp_path / "keys.yaml"
    keys.write_text(
        f'keys:\n  - key: "{KEY}"\n    tenant: tenant-a\n  - key: "{OPS}"\n    operator: true\n'
    )
    trainer = Trainer(log, "dash-run", steps=600)
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [
            sys.executable, "-m", "runwatch.cli.main", "serve", "api", "--log", str(log),
            "--keys", str(keys), "--store", str(tmp_path / "v.sqlite"), "--port", str(port),
            "--settle-s", "0.2",
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        trainer.wait_step(3)
        _until(lambda: _safe(lambda: _state(base, "dash-run")) == "RUNNING", what="RUNNING")
        r = httpx.post(
            f"{base}/v1/operator/runs/dash-run/pause",
            headers={"X-API-Key": OPS},
            json={"reason": "operator maintenance"},
        )
        assert r.status_code == 202, r.text
        _until(lambda: _state(base, "dash-run") == "PAUSED_BY_GATE", what="PAUSED_BY_GATE")

        _open(browser, base, f"key={KEY}&run=dash-run")
        _wait(browser, "#detail[data-run-id='dash-run'] [data-action='resume']", timeout=20)
        badge = browser.find_element(By.CSS_SELECTOR, "#detail .state")
        assert badge.get_attribute("data-state") == "PAUSED_BY_GATE"
        browser.find_element(By.CSS_SELECTOR, "#detail [data-action='resume']").click()

        def running_on_page() -> bool:
            states = browser.execute_script(
                "return [...document.querySelectorAll('#detail .head .state')]"
                ".map(e => e.dataset.state)"
            )
            return bool(states) and states[0] in ("RUNNING", "DEGRADED")

        _until(running_on_page, what="the page to show the run running again")
        assert _state(base, "dash-run") in ("RUNNING", "DEGRADED")
        step_at_resume = trainer.step
        trainer.wait_step(step_at_resume + 3)  # it really trains again

        # cancel takes two clicks (the first arms the button)
        _wait(browser, "#detail [data-action='cancel']")
        browser.find_element(By.CSS_SELECTOR, "#detail [data-action='cancel']").click()
        cancel = browser.find_element(By.CSS_SELECTOR, "#detail [data-action='cancel']")
        assert cancel.text == "Confirm cancel"
        cancel.click()
        _until(lambda: _state(base, "dash-run") == "CANCELLED", what="CANCELLED")
        trainer.proc.wait(timeout=60)
        assert trainer.proc.returncode == 0
        _until(
            lambda: (
                browser.execute_script(
                    "const b = document.querySelector('#detail .head .state');"
                    "return b && b.dataset.state"
                )
                == "CANCELLED"
            ),
            what="the page to show CANCELLED",
        )
        assert not browser.find_elements(By.CSS_SELECTOR, "#detail [data-action]")
    finally:
        trainer.kill()
        server.terminate()
        server.wait(timeout=30)
    events = _events(log, "dash-run")
    by_customer = [e for e in events if isinstance(e, UnpauseRequested | CancelRequested)]
    assert [(type(e).__name__, e.actor) for e in by_customer] == [
        ("UnpauseRequested", "customer"),
        ("CancelRequested", "customer"),
    ]
    assert any(isinstance(e, RunResumed) for e in events)
    assert any(isinstance(e, RunCancelled) for e in events)


def _safe(fn):  # type: ignore[no-untyped-def]
    try:
        return fn()
    except httpx.TransportError:
        return None

"""The customer dashboard in a real browser: Debian's Chromium, driven by Selenium through
Debian's chromedriver, against a real ``runwatch serve api`` process (uvicorn) that follows
a real embedded log.

The log is built the way production builds it: producers publish facts through the
emitter SDK (:class:`producers.emitter.Emitter` on an :class:`producers.sinks.EmbeddedSink`),
the stream processors' detector fold derives the alerts (embedded host), and the API
process's own follower folds everything into run states, accounting and charts. Nothing
derived is written by hand.

Two tenants: ``acme`` (a healthy run that completes, a reward-hacked run, an oversized-LR
run) and ``globex`` (a dead run burning money, a run whose reward function crashes, a run
lost to a platform fault). The
test asserts that the page loads, shows the key's runs with their states and reasons,
draws a run's four charts and lists its alerts, and that a tenant never sees anything of
the other tenant anywhere in the DOM.

Set-up: ``scripts/setup-browser.sh`` (chromium + chromium-driver) and ``selenium`` in the
environment. Without them the test skips locally and fails under ``CI=true``.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from events import (
    RewardBatchFailed,
    RewardBatchScored,
    RunCompleted,
    RunFailed,
    RunPaused,
    RunProvisioning,
    RunQueued,
    RunStarted,
    RunSubmitted,
)
from events.envelope import EventBase
from producers.emitter import Emitter
from producers.sinks import EmbeddedSink

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
ENVELOPE = frozenset(
    {"event_id", "type", "schema_version", "tenant_id", "run_id", "step", "ts", "producer", "seq"}
)
KEYS = {"k-acme-7d1c": "acme", "k-globex-52e9": "globex"}
STEP_S = 20.0  # seconds of producer time per training step

#: run id -> (tenant, synthetic scenario, fault, fault step, steps, ending)
RUNS: dict[str, tuple[str, int, str | None, int, int, str | None]] = {
    "acme-math-grpo-001": ("acme", 3, None, 0, 220, "completed"),
    "acme-code-grpo-002": ("acme", 11, "gameable_reward", 110, 220, None),
    "acme-chat-grpo-003": ("acme", 5, "oversized_lr", 120, 200, None),
    "globex-summarize-004": ("globex", 7, "constant_reward", 60, 220, None),
    "globex-qa-grpo-005": ("globex", 9, None, 0, 90, "reward_crash"),
    "globex-translate-006": ("globex", 13, None, 0, 60, "platform_fault"),
}
#: what the projections must conclude (the page shows these): a paging alert pauses its
#: run (the trainer obeys the run controller; see :func:`_first_pause`)
EXPECTED_STATE = {
    "acme-math-grpo-001": "SUCCEEDED",
    "acme-code-grpo-002": "PAUSED_BY_GATE",
    "acme-chat-grpo-003": "PAUSED_BY_GATE",
    "globex-summarize-004": "PAUSED_BY_GATE",
    "globex-qa-grpo-005": "FAILED",
    "globex-translate-006": "FAILED",
}


def _payload(ev: EventBase) -> dict[str, Any]:
    return {k: getattr(ev, k) for k in type(ev).model_fields if k not in ENVELOPE}


def _first_pause(events: list[EventBase]) -> Any:
    """The run controller's first PauseRequested over a run's events (folded in memory
    exactly as the processors will fold the log: derived ids depend on the run and the
    alert, so the ids match), or None."""
    from stream_processors.control import RunControllerFold
    from stream_processors.detectors import RunHealthFold

    health, ctl = RunHealthFold(), RunControllerFold()
    hs, cs = health.initial(), ctl.initial()
    for ev in events:
        hs, alerts = health.apply(hs, ev)
        for fact in (ev, *alerts):
            cs, out = ctl.apply(cs, fact)
            if out:
                return out[0]
    return None


def build_log(log_dir: Path, t_end: float | None = None) -> dict[str, int]:
    """Write the two tenants' runs to an embedded log through the emitter SDK, then run the
    detectors over it. Returns the number of events emitted per run.

    Telemetry values come from the detectors' own production-shaped generator
    (:func:`stream_processors.detectors.scenarios.synthetic_run`), re-published by an
    emitter per producer, with producer timestamps ending near ``t_end`` (default: now).
    """
    from events.log.embedded import EmbeddedLog
    from runwatch.folds import processor_folds
    from runwatch.hosting.embedded import EmbeddedHost
    from stream_processors.detectors.scenarios import synthetic_run

    log = EmbeddedLog(log_dir, sync=False)
    log.open_sync()
    sink = EmbeddedSink(log)
    t_end = time.time() if t_end is None else t_end
    counts: dict[str, int] = {}
    for i, (run_id, (tenant, seed, fault, fault_step, steps, ending)) in enumerate(RUNS.items()):
        t0 = t_end - (steps + 10) * STEP_S - 600.0 * (len(RUNS) - i)

        def at(step: int | None, offset: float = 0.0, t0: float = t0) -> float:
            return t0 + 60.0 + STEP_S * (step if step is not None else -1) + offset

        sched = Emitter(sink, tenant_id=tenant, run_id=run_id, producer="scheduler")
        trainer = Emitter(sink, tenant_id=tenant, run_id=run_id, producer="trainer")
        scorer = Emitter(sink, tenant_id=tenant, run_id=run_id, producer="reward-scorer")
        events = synthetic_run(
            seed, steps=steps, fault=fault, fault_step=fault_step, run_id=run_id, tenant_id=tenant
        )
        submitted = events[0]
        assert isinstance(submitted, RunSubmitted)
        sched.emit(RunSubmitted, ts=t0, **_payload(submitted))
        sched.emit(RunQueued, ts=t0 + 5.0)
        sched.emit(RunProvisioning, ts=t0 + 30.0)
        sched.emit(RunStarted, ts=t0 + 55.0)
        sched.flush()
        # a paging alert pauses the run: the trainer finishes the step in flight, answers
        # RunPaused and trains no further (as trainer/loop.py does)
        pause = _first_pause(events)
        cut = (pause.step or 0) + 1 if pause is not None else None
        body = [ev for ev in events[1:] if cut is None or ev.step is None or ev.step <= cut]
        for k, ev in enumerate(body):
            trainer.emit(type(ev), step=ev.step, ts=at(ev.step, 0.01 * (k % 100)), **_payload(ev))
            if type(ev).__name__ == "TrainerStepCompleted":
                s = ev.step or 0
                crash = ending == "reward_crash" and s % 4 == 1
                if crash:
                    scorer.emit(
                        RewardBatchFailed,
                        step=s,
                        ts=at(s, 5.0),
                        batch_id=f"{run_id}/b{s}",
                        n=16,
                        cause="tenant_crash",
                        message="ZeroDivisionError: division by zero",
                        examples=(f"Q{s}: what is 7/0?",),
                    )
                scorer.emit(
                    RewardBatchScored,
                    step=s,
                    ts=at(s, 6.0),
                    batch_id=f"{run_id}/b{s}" + ("-ok" if crash else ""),
                    n=240 if crash else 256,
                    score_mean=float(ev.reward_mean or 0.0),
                    score_std=0.2,
                    score_min=0.0,
                    score_max=1.0,
                    duration_s=1.5,
                )
        if pause is not None and cut is not None:
            trainer.emit(
                RunPaused,
                step=cut,
                ts=at(cut, 20.0),
                reason=f"paused by controller: {pause.reason}",
                request_id=str(pause.event_id),
            )
        trainer.flush()
        scorer.flush()
        if ending == "completed":
            sched.emit(RunCompleted, ts=at(steps, 30.0))
        elif ending == "reward_crash":
            sched.emit(RunFailed, ts=at(steps, 30.0), reason="the reward worker exited")
        elif ending == "platform_fault":
            sched.emit(
                RunFailed,
                ts=at(steps, 30.0),
                reason="trainer node lost (GPU fell off the bus)",
                failure_class="platform_fault",
            )
        sched.flush()
        counts[run_id] = sched.seq + trainer.seq + scorer.seq
    EmbeddedHost(log, processor_folds()).run_once()  # the detectors derive the alerts
    return counts


# --------------------------------------------------------------------------------------
# The server process and the browser
# --------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _need_browser() -> Any:
    """selenium's webdriver module, or skip (fail under CI) with the reason."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    reason = ""
    if missing:
        reason = f"{', '.join(missing)} missing: run scripts/setup-browser.sh"
    try:
        from selenium import webdriver
    except ImportError:
        webdriver, reason = None, reason or "selenium is not installed (pip install selenium)"
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"browser test cannot run in CI: {reason}")
        pytest.skip(reason)
    return webdriver


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("dashboard")


@pytest.fixture(scope="module")
def server(workdir: Path):
    _need_browser()
    root = workdir
    build_log(root / "log")
    keys = root / "keys.yaml"
    keys.write_text(
        "keys:\n"
        + "".join(f'  - key: "{k}"\n    tenant: {t}\n' for k, t in KEYS.items())
        + '  - key: "k-ops-1"\n    operator: true\n'
    )
    port = _free_port()
    server_log = (root / "server.log").open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "runwatch.cli.main",
            "serve",
            "api",
            "--port",
            str(port),
            "--log",
            str(root / "log"),
            "--keys",
            str(keys),
            "--store",
            str(root / "projections.sqlite"),
            "--settle-s",
            "0.3",
        ],
        cwd=REPO,
        stdout=server_log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_for_states(base, proc, root / "server.log")
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        server_log.close()


def _wait_for_states(
    base: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 30.0
) -> None:
    """Until the follower has folded the whole log (every run in its final state)."""
    deadline, states = time.monotonic() + timeout, {}
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"runwatch serve api exited {proc.returncode}:\n{log.read_text()}")
        try:
            r = httpx.get(
                f"{base}/v1/operator/runs", params={"limit": 50}, headers={"X-API-Key": "k-ops-1"}
            )
            if r.status_code == 200:
                states = {i["run_id"]: i["state"] for i in r.json()["items"]}
                if states == EXPECTED_STATE:
                    return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError(
        f"projection did not reach the expected states: {states}\n{log.read_text()}"
    )


@pytest.fixture(scope="module")
def browser():
    webdriver = _need_browser()
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1400,1000",
    ):
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(15)
    try:
        yield driver
    finally:
        driver.quit()


def _wait(driver: Any, css: str, timeout: float = 10.0) -> Any:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout).until(
        ec.presence_of_element_located((By.CSS_SELECTOR, css))
    )


def _rows(driver: Any) -> dict[str, dict[str, str]]:
    """The run table as rendered, read in one script call (atomic w.r.t. a re-render)."""
    rows = driver.execute_script(
        "return [...document.querySelectorAll('#runs tbody tr[data-run-id]')]"
        ".map(r => [r.dataset.runId, r.dataset.state, r.innerText])"
    )
    return {run_id: {"state": state, "text": text} for run_id, state, text in rows}


def _open(driver: Any, base: str, fragment: str) -> None:
    """A fresh page load with no stored key (via another document of the same origin, so a
    fragment-only change cannot turn into an in-page navigation)."""
    driver.get(f"{base}/dashboard/static/icon.svg")
    driver.execute_script("window.sessionStorage.clear()")
    driver.get(f"{base}/dashboard" + (f"#{fragment}" if fragment else ""))


def test_page_lists_only_the_keys_tenant_runs_with_state_and_reason(server, browser):
    _open(browser, server, "key=k-acme-7d1c")
    _wait(browser, "#runs tbody tr[data-run-id]")
    rows = _rows(browser)
    acme = {r: s for r, s in EXPECTED_STATE.items() if r.startswith("acme-")}
    assert {r: v["state"] for r, v in rows.items()} == acme
    assert "acme" in browser.find_element("css selector", "#tenant").text
    hacked = rows["acme-code-grpo-002"]["text"]
    assert "reward hacking" in hacked  # the plain-language reason, not a detector id
    assert "key=" not in browser.current_url  # the key leaves the address bar
    source = browser.page_source
    assert "globex" not in source
    for run_id in RUNS:
        if not run_id.startswith("acme-"):
            assert run_id not in source


def test_run_detail_draws_the_four_charts_and_lists_alerts(server, browser, tmp_path):
    from selenium.webdriver.common.by import By

    _open(browser, server, "key=k-acme-7d1c")
    _wait(browser, "#runs tbody tr[data-run-id]")
    browser.find_element(By.CSS_SELECTOR, 'tr[data-run-id="acme-code-grpo-002"]').click()
    _wait(browser, "#detail[data-run-id='acme-code-grpo-002'] .chart[data-points]")
    _wait(browser, "#alerts li[data-detector]")
    charts = {
        c.get_attribute("data-metric"): c
        for c in browser.find_elements(By.CSS_SELECTOR, "#detail .chart")
    }
    assert set(charts) == {"reward", "kl", "eval_gate", "spend"}
    for name, chart in charts.items():
        assert int(chart.get_attribute("data-points")) > 10, name
        line = chart.find_element(By.CSS_SELECTOR, "svg path.series")
        assert len(line.get_attribute("d")) > 100, name
    # the alert that moved the run is listed, in plain language, and marked on the charts
    alerts = browser.find_elements(By.CSS_SELECTOR, "#alerts li[data-detector]")
    detectors = {a.get_attribute("data-detector") for a in alerts}
    assert "reward_hacking" in detectors
    assert browser.find_elements(By.CSS_SELECTOR, "#detail .chart svg .alert-marker")
    assert "PAUSED_BY_GATE".replace("_", " ").lower() in browser.find_element(
        By.CSS_SELECTOR, "#detail .state"
    ).text.lower().replace("_", " ")
    # run-mechanics and internal signals stay internal
    assert "weight_sync_staleness" not in detectors and "grad_norm_spike" not in detectors
    browser.save_screenshot(str(tmp_path / "dashboard.png"))
    assert "globex" not in browser.page_source


def test_other_tenant_sees_its_own_runs_and_failure_attribution(server, browser):
    from selenium.webdriver.common.by import By

    _open(browser, server, "key=k-globex-52e9&run=globex-qa-grpo-005")
    _wait(browser, "#detail[data-run-id='globex-qa-grpo-005'] .chart[data-points]")
    rows = _rows(browser)
    assert set(rows) == {r for r in RUNS if r.startswith("globex-")}
    failure = browser.find_element(By.CSS_SELECTOR, "#detail .failure").text
    assert "reward function raised" in failure and "Q" in failure  # examples attached
    source = browser.page_source
    assert "acme" not in source


def test_a_foreign_run_in_the_url_is_not_found_and_a_bad_key_is_refused(server, browser):
    from selenium.webdriver.common.by import By

    _open(browser, server, "key=k-globex-52e9&run=acme-code-grpo-002")
    _wait(browser, "#detail .notice")
    assert "not found" in browser.find_element(By.CSS_SELECTOR, "#detail .notice").text
    # nothing of the foreign run leaked (its reason names the hacking gate; globex's own
    # runs never saw that detector)
    assert "reward hacking" not in browser.page_source.lower()
    _open(browser, server, "key=not-a-key")
    _wait(browser, "#signin .error")
    assert "not valid" in browser.find_element(By.CSS_SELECTOR, "#signin .error").text
    assert not browser.find_elements(By.CSS_SELECTOR, "#runs tbody tr[data-run-id]")


def test_sign_in_form_takes_the_key(server, browser):
    from selenium.webdriver.common.by import By

    _open(browser, server, "")
    field = _wait(browser, "#signin input[name=key]")
    field.send_keys("k-globex-52e9")
    browser.find_element(By.CSS_SELECTOR, "#signin button[type=submit]").click()
    _wait(browser, "#runs tbody tr[data-run-id]")
    assert set(_rows(browser)) == {r for r in RUNS if r.startswith("globex-")}


def test_the_page_follows_the_log(server, browser, workdir):
    """A run submitted after the page loaded appears on Refresh: the API process tails the
    embedded log, folds it, and the page reads the new projection."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    _open(browser, server, "key=k-acme-7d1c")
    _wait(browser, "#runs tbody tr[data-run-id]")
    run_id = "acme-live-grpo-007"
    assert run_id not in _rows(browser)
    with Emitter(
        EmbeddedSink(workdir / "log"), tenant_id="acme", run_id=run_id, producer="scheduler"
    ) as sched:
        sched.emit(RunSubmitted, algorithm="grpo")
        sched.emit(RunQueued)

    def shows_it(driver: Any) -> bool:
        driver.find_element(By.CSS_SELECTOR, "#refresh").click()
        return _rows(driver).get(run_id, {}).get("state") == "QUEUED"

    WebDriverWait(browser, 15, poll_frequency=0.5).until(shows_it)
    assert "globex" not in browser.page_source

"""A gate's page told to nobody is counted: real ``runwatch process`` and real ``runwatch
notify --metrics-port`` on one embedded log, two tenants' runs hitting a paging gate.
acme's webhook is down (its page is abandoned after the retries), globex has no webhook
(nothing is queued for it). Both show on the notifier's ``/metrics`` as urgent, which is
what ``RunwatchPageToldNobody`` fires on (promtool-tested in
``deploy/prometheus/runwatch-rules.test.yml``), and the loop's liveness gauge is there."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from producers.hooks import RunwatchHook

pytestmark = pytest.mark.timeout(240)

ROOT = Path(__file__).resolve().parents[2]
ENV = {k: v for k, v in os.environ.items() if k not in ("RUNWATCH_LOG_DIR", "RUNWATCH_KAFKA")}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "runwatch.cli.main", *args]


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """(sample name, sorted labels) -> value of one ``/metrics`` page ({} if unreachable)."""
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    except httpx.TransportError:
        return {}
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def wait_for(what, timeout: float = 90.0):  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = what()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_abandoned_and_unroutable_pages_are_counted(tmp_path: Path) -> None:
    log = tmp_path / "log"
    keys = tmp_path / "keys.yaml"
    down = _free_port()  # nothing listens there: acme's receiver is down
    keys.write_text(
        yaml.safe_dump(
            {
                "keys": [
                    {"key": "key-acme", "tenant": "acme"},
                    {"key": "key-globex", "tenant": "globex"},
                ],
                "tenants": {
                    "acme": {"webhook": {"url": f"http://127.0.0.1:{down}/h", "secret": "s" * 32}}
                },
            }
        )
    )
    port = _free_port()
    procs = [
        subprocess.Popen(
            _cli("process", "--log", str(log)), cwd=ROOT, env=ENV,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
        ),
        subprocess.Popen(
            _cli(
                "notify", "--log", str(log), "--keys", str(keys), "--allow-private-webhooks",
                "--max-attempts", "2", "--backoff-base-s", "0.2", "--backoff-factor", "1",
                "--timeout-s", "1", "--metrics-port", str(port),
            ),
            cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        ),
    ]  # fmt: skip
    hooks = {
        t: RunwatchHook(
            f"{t}-run",
            t,
            log=log,
            spool=tmp_path / f"spool-{t}",
            gpus=8,
            install_exit_hooks=False,
            follow_commands=False,
        )
        for t in ("acme", "globex")
    }
    try:
        before = wait_for(lambda: scrape(port))
        # every label pair is there from the start, at 0 (increase() sees the first one)
        for name in ("runwatch_notifications_abandoned_total",
                     "runwatch_notifications_unroutable_total"):  # fmt: skip
            for kind in ("alert.fired", "alert.resolved", "run.state_changed"):
                for flag in ("false", "true"):
                    assert before[(name, (("kind", kind), ("urgent", flag)))] == 0
        polled = before[("runwatch_notifier_last_poll_timestamp_seconds", ())]
        assert abs(polled - time.time()) < 30

        for h in hooks.values():
            h.start({})
        for step in range(20):  # KL 2.0 from step 6: kl_blowup, a paging gate
            for h in hooks.values():
                h.log({"reward": 0.1 + step / 500, "kl": 2.0 if step > 5 else 0.01}, step=step)
                h.step_done(step, wall_s=10.0)
        for h in hooks.values():
            assert h.flush(10)

        page = ("kind", "alert.fired"), ("urgent", "true")
        abandoned = ("runwatch_notifications_abandoned_total", page)
        unroutable = ("runwatch_notifications_unroutable_total", page)
        got = wait_for(lambda: (m := scrape(port)).get(abandoned) and m.get(unroutable) and m)
        assert got[abandoned] >= 1  # acme's page: its webhook is down
        assert got[unroutable] >= 1  # globex's page: it has no webhook
        assert got[("runwatch_notifier_last_poll_timestamp_seconds", ())] >= polled
        assert procs[1].poll() is None
    finally:
        for h in hooks.values():
            h.close(5)
        for p in procs:
            stop(p)

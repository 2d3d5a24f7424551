"""The processors' liveness is exported: a real ``runwatch process --metrics-port`` on an
embedded log. Its last-progress timestamp is there from the first pass and moves on while it
runs (idle passes included: an idle host is not a stalled one), and its lag falls to 0 once
it has read what a hook wrote. ``RunwatchProcessorsStalled`` (promtool-tested in
``deploy/prometheus/runwatch-rules.test.yml``) fires on an old timestamp or a dead target."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from producers.hooks import RunwatchHook
from tests.integration.test_gate_told_notifier_metrics import (
    ENV,
    ROOT,
    _cli,
    _free_port,
    scrape,
    stop,
    wait_for,
)

pytestmark = pytest.mark.timeout(180)


def test_processors_export_their_progress_and_lag(tmp_path: Path) -> None:
    log = tmp_path / "log"
    port = _free_port()
    proc = subprocess.Popen(
        _cli("process", "--log", str(log), "--metrics-port", str(port), "--app-id", "procs"),
        cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    progress = ("runwatch_processor_last_progress_timestamp_seconds", (("app", "procs"),))
    hook = RunwatchHook(
        "p-run", "acme", log=log, spool=tmp_path / "spool", gpus=1,
        install_exit_hooks=False, follow_commands=False,
    )  # fmt: skip
    try:
        first = wait_for(lambda: scrape(port).get(progress))
        assert abs(first - time.time()) < 30
        hook.start({})
        for step in range(50):
            hook.log({"reward": 0.1, "kl": 0.01}, step=step)
            hook.step_done(step, wall_s=1.0)
        assert hook.flush(10)

        def caught_up():  # type: ignore[no-untyped-def]
            m = scrape(port)
            lags = {dict(k[1])["topic"]: v for k, v in m.items()
                    if k[0] == "runwatch_processor_lag_records"}  # fmt: skip
            read = m.get(("runwatch_processor_records_total", (("app", "procs"),)), 0)
            return m if read >= 100 and lags.get("runwatch.telemetry") == 0 else None

        got = wait_for(caught_up)
        assert got[progress] > first  # it moved on
        time.sleep(1.0)
        assert scrape(port)[progress] > got[progress]  # idle passes count as progress
        assert proc.poll() is None
    finally:
        hook.close(5)
        stop(proc)

"""The faust worker exports its liveness: a real ``runwatch process --kafka --metrics-port``
on the real broker, scraped over HTTP as Prometheus would.

The three series of the embedded host, same names and labels
(``runwatch/hosting/progress.py``): the records counter grows by what was published, the
lag (per input topic, over the partitions assigned to the worker: high watermark less the
committed offset) shows a burst's backlog and falls back to 0 once it is folded and
committed, and the last-progress stamp is recent and moves on while the worker idles
caught up (an idle worker is not a stalled one). ``RunwatchProcessorsStalled``
(promtool-tested) reads these.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest

from events.codec import encode
from events.envelope import EventBase
from events.log.kafka import KafkaLog
from runwatch.folds import processor_folds
from stream_processors.detectors.scenarios import synthetic_run
from tests.integration.test_gate_told_notifier_metrics import ROOT, _free_port, scrape, wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]

LAG = "runwatch_processor_lag_records"
RECORDS = "runwatch_processor_records_total"
PROGRESS = "runwatch_processor_last_progress_timestamp_seconds"


async def _publish(bootstrap: str, events: list[EventBase]) -> None:
    async with KafkaLog(bootstrap) as log:
        for _, group in itertools.groupby(events, key=lambda e: type(e).TOPIC):
            group = list(group)
            await log.append_many(type(group[0]).TOPIC, [(e.key(), encode(e)) for e in group])


def _lags(m: dict, app: str) -> dict[str, float]:  # type: ignore[type-arg]
    out = {}
    for (name, labels), value in m.items():
        if name == LAG:
            got = dict(labels)
            assert set(got) == {"app", "topic"} and got["app"] == app
            out[got["topic"]] = value
    return out


def test_faust_worker_exports_progress_records_and_lag(kafka_bootstrap: str) -> None:
    tag = uuid.uuid4().hex[:8]
    app = f"rw-metrics-{tag}"
    inputs = {t for f in processor_folds() for t in f.inputs}
    asyncio.run(KafkaLog(kafka_bootstrap).start())  # topics exist before the worker starts
    port = _free_port()
    worker = subprocess.Popen(
        [
            sys.executable, "-m", "runwatch.cli.main", "process", "--kafka", kafka_bootstrap,
            "--app-id", app, "--instance-id", "", "--metrics-port", str(port),
        ],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    key = (("app", app),)
    try:
        # served from the start; the lag and the stamp once the worker reads its partitions
        first = wait_for(lambda: scrape(port), timeout=60)
        assert (RECORDS, key) in first

        def caught_up(least: float = 0):  # type: ignore[no-untyped-def]
            m = scrape(port)
            lags = _lags(m, app)
            if set(lags) == inputs and not any(lags.values()) and m.get((RECORDS, key), 0) >= least:
                return m if (PROGRESS, key) in m else None
            return None

        # a new group reads the shared topics from their start: what other tests left there
        before = wait_for(caught_up, timeout=120)
        assert abs(before[(PROGRESS, key)] - time.time()) < 30
        time.sleep(2.5)  # idle, caught up: the worker's checks still stamp its progress
        idle = wait_for(caught_up)
        assert idle[(PROGRESS, key)] > before[(PROGRESS, key)]

        # a burst: while it is folded, some scrape shows its backlog
        events = [
            ev
            for i in range(3)
            for ev in synthetic_run(500 + i, steps=400, run_id=f"metrics-{tag}-{i}")
        ]
        seen: list[dict[str, float]] = []
        done = threading.Event()

        def watch() -> None:
            while not done.is_set():
                seen.append(_lags(scrape(port), app))
                time.sleep(0.05)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            asyncio.run(_publish(kafka_bootstrap, events))
            after = wait_for(lambda: caught_up(idle[(RECORDS, key)] + len(events)), timeout=120)
        finally:
            done.set()
            watcher.join(10)
        backlog = max(sum(lag.values()) for lag in seen)
        assert backlog > 0, "no scrape saw the burst's lag"
        assert after[(RECORDS, key)] >= idle[(RECORDS, key)] + len(events)
        assert after[(PROGRESS, key)] > idle[(PROGRESS, key)]
        assert abs(after[(PROGRESS, key)] - time.time()) < 30
        assert worker.poll() is None
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        try:
            out, _ = worker.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            out, _ = worker.communicate()
    assert b"Prometheus metrics on" in out, out.decode(errors="replace")[-3000:]


def test_a_taken_metrics_port_refuses_to_start(kafka_bootstrap: str) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [
                sys.executable, "-m", "runwatch.cli.main", "process", "--kafka", kafka_bootstrap,
                "--app-id", f"rw-metrics-{uuid.uuid4().hex[:8]}", "--instance-id", "",
                "--metrics-port", str(port),
            ],
            cwd=ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert proc.returncode != 0
    assert f"metrics port 127.0.0.1:{port}" in proc.stderr + proc.stdout

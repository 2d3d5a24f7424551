"""On the real broker: traces imported with ``runwatch import traces --kafka`` are profiled
by a real ``runwatch process --kafka`` worker (the faust host), and it emits the same
profile events (ids included) as the embedded host over the same traces."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer

from events.codec import decode
from events.log.embedded import EmbeddedLog
from events.log.kafka import KafkaLog
from producers.sinks import EmbeddedSink
from producers.trace_import import import_traces
from producers.trace_synth import write_synthetic_traces
from runwatch.hosting.embedded import EmbeddedHost
from stream_processors.profiling import ProfilingFold

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(420)]


async def _collect(bootstrap: str, run_id: str, expected: int, timeout_s: float) -> list[bytes]:
    consumer = AIOKafkaConsumer(
        "runwatch.profiles", bootstrap_servers=bootstrap, auto_offset_reset="earliest"
    )
    await consumer.start()
    got: list[bytes] = []
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and len(got) < expected:
            for records in (await consumer.getmany(timeout_ms=1000)).values():
                got.extend(r.value for r in records if decode(r.value).run_id == run_id)
        await asyncio.sleep(3.0)  # anything beyond the expected count would show up now
        for records in (await consumer.getmany(timeout_ms=2000)).values():
            got.extend(r.value for r in records if decode(r.value).run_id == run_id)
    finally:
        await consumer.stop()
    return got


def test_faust_and_embedded_hosts_emit_identical_profiles(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex[:8]
    run_id = f"prof-{tag}"
    traces = tmp_path / "traces"
    write_synthetic_traces(
        traces, steps=4, workers=4, requests_per_worker=15, abort_share=0.1, straggler=(2, 1, 6.0)
    )
    log = EmbeddedLog(tmp_path / "log", sync=False)
    log.open_sync()
    import_traces(traces, run_id=run_id, tenant_id="acme", write=EmbeddedSink(log).write)
    EmbeddedHost(log, [ProfilingFold()]).run_once()
    expected = [r.value for r in log.read_sync("runwatch.profiles")]
    assert len(expected) == 3 * (1 + 4) + 1  # steps 1-3 (StepProfiled + 4 workers) + straggler

    asyncio.run(KafkaLog(kafka_bootstrap).start())  # topics exist before the worker starts
    cli = [sys.executable, "-m", "runwatch.cli.main"]
    worker = subprocess.Popen(
        [*cli, "process", "--kafka", kafka_bootstrap, "--app-id", f"rw-test-{tag}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        imported = subprocess.run(
            [
                *cli,
                "import",
                "traces",
                str(traces),
                "--run-id",
                run_id,
                "--tenant",
                "acme",
                "--kafka",
                kafka_bootstrap,
            ],
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert imported.returncode == 0, imported.stderr
        assert "0 skipped" in imported.stdout
        got = asyncio.run(_collect(kafka_bootstrap, run_id, len(expected), timeout_s=240))
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        try:
            out, _ = worker.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            out, _ = worker.communicate()
    assert sorted(got) == sorted(expected), out.decode(errors="replace")[-3000:]

"""On the real broker: the faust-hosted and the embedded-hosted detectors emit the same
alert events (ids included) for the same input.

The input (with another tenant's steps forged on one run's id, which both must refuse)
is published while a real ``runwatch process --kafka`` worker (a separate
process: the faust app) runs; the same events go into an embedded log processed by the
embedded host. Runs get unique ids, so records other tests put on the shared broker's
``runwatch.*`` topics are ignored.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer

from events.codec import decode, encode
from events.dead_letter import DeadLetter
from events.envelope import EventBase
from events.log.embedded import EmbeddedLog
from events.log.kafka import KafkaLog
from events.topics import DEAD_LETTER_TOPIC
from runwatch.folds import processor_folds
from runwatch.hosting.embedded import EmbeddedHost
from stream_processors.detectors.scenarios import synthetic_run
from tests.event_samples import forged_steps

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(420)]

FAULTS = ("oversized_lr", "gameable_reward", "frozen_weight_sync", "constant_reward", None)


def _input(tag: str) -> list[EventBase]:
    events: list[EventBase] = []
    for i, fault in enumerate(FAULTS):
        run = synthetic_run(
            100 + i, steps=260, fault=fault, fault_step=120, run_id=f"kafka-{tag}-{fault or 'ok'}"
        )
        events.extend(run)
    events.extend(events[200:230])  # a producer retry: same ids again
    # another tenant's steps on the healthy run's id: folded, they would page and pause it
    return events + forged_steps(events, f"kafka-{tag}-ok", "mallory")


def _embedded_alerts(events: list[EventBase], root: Path) -> list[bytes]:
    log = EmbeddedLog(root, sync=False)
    log.open_sync()
    for _, group in itertools.groupby(events, key=lambda e: type(e).TOPIC):
        log.append_events_sync(list(group))
    EmbeddedHost(log, processor_folds()).run_once()
    return [r.value for r in log.read_sync("runwatch.alerts") if _detectors(r.value)]


def _detectors(raw: bytes) -> bool:
    """An alert of the run-health detectors (the hosts are compared on those): the run
    controller's ``pause_unanswered`` pages depend on how far each host had read the
    control topic when a run's later steps came, which Kafka does not order across topics
    (these synthetic runs never answer a pause)."""
    return getattr(decode(raw), "producer", "") == "run-health"


async def _publish(bootstrap: str, events: list[EventBase]) -> None:
    async with KafkaLog(bootstrap) as log:
        for _, group in itertools.groupby(events, key=lambda e: type(e).TOPIC):
            group = list(group)
            await log.append_many(type(group[0]).TOPIC, [(e.key(), encode(e)) for e in group])
        await log.append("runwatch.telemetry", b"kafka-bad", b"\xff not json")


async def _refused(
    bootstrap: str, runs: set[str], expected: int, timeout_s: float
) -> list[DeadLetter]:
    """The ``foreign_tenant`` dead letters of records of ``runs`` on the broker."""
    consumer = AIOKafkaConsumer(
        DEAD_LETTER_TOPIC, bootstrap_servers=bootstrap, auto_offset_reset="earliest"
    )
    await consumer.start()
    got: list[DeadLetter] = []
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and len(got) < expected:
            for records in (await consumer.getmany(timeout_ms=1000)).values():
                for rec in records:
                    letter = DeadLetter.model_validate_json(rec.value)
                    ev = decode(letter.raw)
                    if letter.kind == "foreign_tenant" and getattr(ev, "run_id", "") in runs:
                        got.append(letter)
    finally:
        await consumer.stop()
    return got


async def _collect(bootstrap: str, runs: set[str], expected: int, timeout_s: float) -> list[bytes]:
    consumer = AIOKafkaConsumer(
        "runwatch.alerts", bootstrap_servers=bootstrap, auto_offset_reset="earliest"
    )
    await consumer.start()
    got: list[bytes] = []
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and len(got) < expected:
            batch = await consumer.getmany(timeout_ms=1000)
            for records in batch.values():
                for rec in records:
                    ev = decode(rec.value)
                    if getattr(ev, "run_id", None) in runs and _detectors(rec.value):
                        got.append(rec.value)
        await asyncio.sleep(3.0)  # anything beyond the expected count would show up now
        for records in (await consumer.getmany(timeout_ms=2000)).values():
            got.extend(
                r.value
                for r in records
                if getattr(decode(r.value), "run_id", "") in runs and _detectors(r.value)
            )
    finally:
        await consumer.stop()
    return got


def test_faust_and_embedded_hosts_emit_identical_alerts(kafka_bootstrap: str, tmp_path: Path):
    tag = uuid.uuid4().hex[:8]
    events = _input(tag)
    runs = {e.run_id for e in events}
    expected = _embedded_alerts(events, tmp_path / "log")
    assert len(expected) >= 5  # every faulty run fires
    # ... and nothing on the healthy run: the other tenant's steps on its id are refused
    assert not [a for a in expected if decode(a).run_id == f"kafka-{tag}-ok"]  # type: ignore[union-attr]

    asyncio.run(KafkaLog(kafka_bootstrap).start())  # topics exist before the worker starts
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "runwatch.cli.main",
            "process",
            "--kafka",
            kafka_bootstrap,
            "--app-id",
            f"rw-test-{tag}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        asyncio.run(_publish(kafka_bootstrap, events))
        got = asyncio.run(_collect(kafka_bootstrap, runs, len(expected), timeout_s=240))
        refused = asyncio.run(_refused(kafka_bootstrap, runs, 3, timeout_s=60))
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        try:
            out, _ = worker.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            out, _ = worker.communicate()
    assert sorted(got) == sorted(expected), out.decode(errors="replace")[-3000:]
    assert len(refused) == 3 and {decode(d.raw).tenant_id for d in refused} == {"mallory"}  # type: ignore[union-attr]
    assert all(d.source_topic == "runwatch.telemetry" for d in refused)

"""The broker is SIGKILLed and restarted while a producer in another process produces.

Afterwards every event the broker acknowledged is in the log exactly once: nothing
acknowledged is lost (acks=all, the log survives a process crash) and nothing is
duplicated although the producer re-sent its in-flight batches (idempotence).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from events.codec import decode
from events.envelope import EventBase
from events.log.kafka import KafkaLog
from runwatch.broker.jvm import JvmBroker

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(420)]

PRODUCER = Path(__file__).with_name("crash_producer.py")
TOTAL = 100_000


def _acked(path: Path) -> list[str]:
    if not path.exists():
        return []
    return [line for line in path.read_text().splitlines() if line]


def _wait_acked(path: Path, proc: subprocess.Popen[bytes], at_least: int, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        n = len(_acked(path))
        if n >= at_least:
            return n
        assert proc.poll() is None, f"producer exited early: {proc.returncode}"
        time.sleep(0.05)
    raise AssertionError(f"producer acknowledged fewer than {at_least} events in {timeout_s}s")


async def _log_ids(bootstrap: str, topic: str) -> Counter[str]:
    ids: Counter[str] = Counter()
    async with KafkaLog(bootstrap, create_registry_topics=False) as log:
        for partition in await log.partitions(topic):
            async for rec in log.read(topic, partition):
                ev = decode(rec.value)
                assert isinstance(ev, EventBase), ev
                ids[str(ev.event_id)] += 1
    return ids


async def _create(bootstrap: str, topic: str) -> None:
    async with KafkaLog(bootstrap, create_registry_topics=False) as log:
        await log.create_topic(topic, partitions=3)


def test_acknowledged_events_survive_broker_kill_exactly_once(
    jvm_broker: JvmBroker, tmp_path: Path
) -> None:
    topic = f"test.crash.{uuid.uuid4().hex[:8]}"
    acked_file = tmp_path / "acked.txt"
    asyncio.run(_create(jvm_broker.bootstrap, topic))
    log_file = open(tmp_path / "producer.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [
            sys.executable,
            str(PRODUCER),
            f"--bootstrap={jvm_broker.bootstrap}",
            f"--topic={topic}",
            f"--acked={acked_file}",
            f"--total={TOTAL}",
            "--chunk=500",
            "--pause=0.005",
        ],
        stdout=log_file,
        stderr=subprocess.STDOUT,
    )
    try:
        acked_before_kill = _wait_acked(acked_file, proc, at_least=5_000, timeout_s=120)
        old_pid = jvm_broker.pid
        jvm_broker.kill()  # SIGKILL mid-production
        assert not jvm_broker.is_running()
        time.sleep(1.0)  # the producer keeps trying against a dead broker
        jvm_broker.restart()  # same data dir, same ports
        assert jvm_broker.pid != old_pid
        rc = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
        log_file.close()
    output = (tmp_path / "producer.log").read_text()
    assert rc == 0, output
    assert acked_before_kill < TOTAL, "the kill must land while producing"

    acked = _acked(acked_file)
    assert len(acked) == TOTAL and len(set(acked)) == TOTAL
    ids = asyncio.run(_log_ids(jvm_broker.bootstrap, topic))
    missing = [i for i in acked if ids[i] == 0]
    duplicated = {i: n for i, n in ids.items() if n > 1}
    assert not missing, f"{len(missing)} acknowledged events lost"
    assert not duplicated, f"{len(duplicated)} events stored more than once"
    assert set(ids) == set(acked)
    print(
        f"crash test: {acked_before_kill} acked before SIGKILL, {TOTAL} acked in all, "
        f"{sum(ids.values())} records in the log, 0 lost, 0 duplicated; "
        f"{output.count('waited')} chunks waited out the outage; {output.strip().splitlines()[-1]}"
    )

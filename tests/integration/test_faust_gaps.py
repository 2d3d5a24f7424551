"""Records faust never delivered are folded all the same (`runwatch.hosting.gaps`).

faust can commit a partition's offset past records its agent never saw (around a worker
restart: `docs/recovery.md`). The test makes exactly that happen on a real broker with a
real `runwatch process --kafka` worker: probes folded, the worker stopped, more probes
published, the group's committed offsets moved to the partitions' ends (as faust's gap
bookkeeping does), the worker started again and new probes published. Every probe must
get its alert: the ones behind the moved offsets read back and folded, nothing twice.
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from events.catalog.trainer import TrainerStepCompleted
from events.codec import decode, encode
from runwatch.broker.jvm import JvmBroker
from runwatch.hosting.gaps import ReadBack, skipped

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]


def test_skipped_offsets_are_the_ones_between_the_last_folded_and_the_next() -> None:
    assert skipped(None, 7) == range(0)  # nothing folded yet on the partition
    assert skipped(b"6", 7) == range(0)  # the next one
    assert skipped(b"9", 7) == range(0)  # a redelivery (at-least-once)
    assert skipped(b"3", 7) == range(4, 7)


async def test_read_back_returns_the_records_at_the_offsets_asked(kafka_bootstrap: str) -> None:
    from aiokafka import AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    topic = f"rw-gaps-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    try:
        for i in range(12):
            await producer.send_and_wait(topic, f"v{i}".encode(), partition=1)
    finally:
        await producer.stop()
    reader = ReadBack(kafka_bootstrap, timeout_s=20)
    try:
        got = await reader.records(topic, 1, range(3, 8))
        assert got == [(i, f"v{i}".encode()) for i in range(3, 8)]
        assert await reader.records(topic, 1, range(0)) == []
        assert await reader.records(topic, 0, range(0, 0)) == []
        # offsets nobody wrote (a gap Kafka itself left) read back as nothing, in time
        with pytest.raises(TimeoutError):
            await ReadBack(kafka_bootstrap, timeout_s=2).records(topic, 0, range(0, 1))
        assert reader.unreadable == 0
    finally:
        await reader.close()


class _Worker:
    def __init__(self, bootstrap: str, app_id: str, log: Path) -> None:
        self.cmd = [
            sys.executable, "-m", "runwatch.cli.main", "process", "--kafka", bootstrap,
            "--app-id", app_id, "--instance-id", "", "--session-timeout", "10",
        ]  # fmt: skip
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                self.cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def _probe(run_id: str) -> bytes:
    ev = TrainerStepCompleted(
        event_id=uuid.uuid4(), tenant_id="gaps", run_id=run_id, step=0, ts=time.time(),
        producer="gap-test", seq=0, loss=math.nan,
    )  # fmt: skip
    return encode(ev)


async def test_records_behind_a_moved_committed_offset_are_folded(
    jvm_broker: JvmBroker, tmp_path: Path
) -> None:
    """On a broker of its own: a new consumer group reads every input topic from its
    start, and the session broker holds the other tests' records."""
    kafka_bootstrap = jvm_broker.bootstrap
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    from aiokafka.structs import OffsetAndMetadata

    from events.log.kafka import KafkaLog
    from events.topics import spec

    async with KafkaLog(kafka_bootstrap):
        pass  # the registry topics exist
    tag = uuid.uuid4().hex[:8]
    app_id = f"rw-gaps-{tag}"
    parts = [
        TopicPartition("runwatch.telemetry", p)
        for p in range(spec("runwatch.telemetry").partitions)
    ]
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all", linger_ms=0)
    alerts = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    await alerts.start()
    alert_parts = [
        TopicPartition("runwatch.alerts", p) for p in range(spec("runwatch.alerts").partitions)
    ]
    alerts.assign(alert_parts)
    await alerts.seek_to_end(*alert_parts)
    alerted: dict[str, int] = {}

    async def read_alerts() -> None:
        while True:
            for records in (await alerts.getmany(timeout_ms=100)).values():
                for rec in records:
                    ev = decode(rec.value)
                    if getattr(ev, "type", "") == "AlertFired" and ev.run_id.startswith(tag):
                        alerted[ev.run_id] = alerted.get(ev.run_id, 0) + 1

    async def publish(batch: str, n: int) -> list[str]:
        runs = [f"{tag}-{batch}-{i}" for i in range(n)]
        for run in runs:
            await producer.send_and_wait("runwatch.telemetry", _probe(run), key=run.encode())
        return runs

    async def answered(runs: list[str], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(r in alerted for r in runs):
                return True
            await asyncio.sleep(0.1)
        return False

    reader = asyncio.create_task(read_alerts())
    worker = _Worker(kafka_bootstrap, app_id, tmp_path / "worker.log")
    try:
        worker.start()
        before = await publish("a", 12)  # folded by the first worker
        assert await answered(before, 120), (tmp_path / "worker.log").read_text()[-3000:]
        worker.stop()
        skipped_runs = await publish("b", 12)  # published while the worker is down
        # the group's committed offsets moved past them, as faust's bookkeeping can do
        mover = AIOKafkaConsumer(
            bootstrap_servers=kafka_bootstrap, group_id=app_id, enable_auto_commit=False
        )
        await mover.start()
        try:
            mover.assign(parts)
            end = await mover.end_offsets(parts)
            await mover.commit({tp: OffsetAndMetadata(end[tp], "") for tp in parts})
        finally:
            await mover.stop()
        worker.start()
        after = await publish("c", 12)  # on every partition: the jump shows the gap
        assert {_partition(r, len(parts)) for r in after} == set(range(len(parts)))
        assert await answered(after, 120), (tmp_path / "worker.log").read_text()[-3000:]
        assert await answered(skipped_runs, 30), sorted(set(skipped_runs) - set(alerted))
        await asyncio.sleep(1.0)
        assert all(alerted[r] == 1 for r in before + skipped_runs + after), alerted
        worker.stop()
        log = (tmp_path / "worker.log").read_text()
        assert "were never delivered to the agent" in log
        assert "Unclosed AIOKafkaConsumer" not in log  # the read-back closes on shutdown
    finally:
        worker.stop()
        reader.cancel()
        await producer.stop()
        await alerts.stop()


def _partition(run_id: str, partitions: int) -> int:
    from aiokafka.partitioner import murmur2

    return (murmur2(run_id.encode()) & 0x7FFFFFFF) % partitions

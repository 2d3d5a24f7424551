"""``runwatch log export`` (Kafka -> embedded) and ``runwatch log cat`` on a real broker."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from events import RunCompleted, RunStarted, TrainerStepCompleted, encode
from events.log.embedded import EmbeddedLog
from events.log.kafka import KafkaLog
from tests.event_samples import sample

pytestmark = pytest.mark.kafka


def _runwatch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runwatch.cli.main", *args], capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip


def test_export_then_cat_gives_back_every_event_in_broker_order(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex[:8]
    runs = [f"export-{tag}-{i}" for i in range(4)]
    produced = []
    for i, run in enumerate(runs):
        produced.append(sample(RunStarted, 1000 * i, run_id=run))
        produced += [sample(TrainerStepCompleted, 1000 * i + s, run_id=run) for s in (1, 2, 3)]
        produced.append(sample(RunCompleted, 1000 * i + 4, run_id=run))
    produced = [e.model_copy(update={"event_id": uuid.uuid4()}) for e in produced]

    async def produce() -> None:
        async with KafkaLog(kafka_bootstrap) as kafka:
            for ev in produced:  # one at a time: broker timestamps follow this order
                await kafka.append(type(ev).TOPIC, ev.key(), encode(ev))
                await asyncio.sleep(0.002)

    asyncio.run(produce())
    out = tmp_path / "audit-log"
    proc = _runwatch("log", "export", "--topic", "runwatch.lifecycle", "--topic",
                     "runwatch.telemetry", "--to", str(out), "--kafka", kafka_bootstrap,
                     "--json")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["records"]["runwatch.telemetry"] >= 12

    cat = _runwatch("log", "cat", str(out), "--json")
    assert cat.returncode == 0, cat.stderr
    mine = [json.loads(line) for line in cat.stdout.splitlines()]
    mine = [d for d in mine if d.get("run_id") in runs]
    assert [d["event_id"] for d in mine] == [str(e.event_id) for e in produced]

    # an export never lands on top of another one
    again = _runwatch("log", "export", "--topic", "all", "--to", str(out), "--kafka",
                      kafka_bootstrap)  # fmt: skip
    assert again.returncode == 1 and "already holds" in again.stderr
    log = EmbeddedLog(out, readonly=True)
    log.open_sync()
    assert log.end_offset_sync("runwatch.lifecycle") == summary["records"]["runwatch.lifecycle"]


def test_a_record_whose_key_the_embedded_log_cannot_hold_is_kept_as_a_dead_letter(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """Kafka takes keys of MiBs; the embedded log's stop at 64 KiB. A producer's 70 KiB run
    id made every auditor's export fail as "a bug in runwatch" (red-team round four): the
    record is now exported to the dead-letter topic with its value whole."""
    from events.dead_letter import DeadLetter

    topic = f"rw-test-longkey-{uuid.uuid4().hex[:8]}"  # its own topic: the broker is shared
    ok = sample(RunStarted, 1, run_id="long-key-neighbour")
    huge_key, value = b"k" * 70 * 1024, b'{"type":"RunStarted","run_id":"k..."}'

    async def produce() -> None:
        async with KafkaLog(kafka_bootstrap) as kafka:
            await kafka.append(topic, ok.key(), encode(ok))
            await kafka.append(topic, huge_key, value)

    asyncio.run(produce())
    out = tmp_path / "audit-log"
    proc = _runwatch("log", "export", "--topic", topic, "--to", str(out), "--kafka",
                     kafka_bootstrap, "--json")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    records = json.loads(proc.stdout)["records"]
    assert records == {topic: 1, "runwatch.dead-letters": 1}
    log = EmbeddedLog(out, readonly=True)
    log.open_sync()
    (kept,) = log.read_sync(topic)
    assert kept.value == encode(ok) and kept.key == ok.key()
    (letter,) = [
        DeadLetter.model_validate_json(r.value) for r in log.read_sync("runwatch.dead-letters")
    ]
    assert letter.kind == "key_too_long" and letter.raw == value
    assert (letter.source_topic, letter.source_offset) == (topic, 1)
    assert "71680 bytes" in letter.reason

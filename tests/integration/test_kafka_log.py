"""The Kafka backend on a real broker: append/read, groups, order, malformed records.

Each test uses topics of its own (unique names), so tests share the session broker
without seeing each other's records.
"""

from __future__ import annotations

import itertools
import uuid
from collections import defaultdict

import pytest

from events.codec import decode, encode
from events.dead_letter import DeadLetter
from events.dedupe import Deduplicator
from events.envelope import EventBase
from events.log.base import Record
from events.log.kafka import KafkaLog, partition_for, topic_configs

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(180)]


def _topic(name: str) -> str:
    return f"test.{name}.{uuid.uuid4().hex[:8]}"


def _step_event(run_id: str, step: int, seq: int) -> EventBase:
    from events.catalog.trainer import TrainerStepCompleted
    from events.envelope import new_envelope

    env = new_envelope(tenant_id="t1", run_id=run_id, producer="test", seq=seq, step=step)
    return TrainerStepCompleted(
        **env, reward_mean=0.5, kl_to_ref=float("nan"), extra={"perf/mfu": 0.4}
    )


async def _read_all(log: KafkaLog, topic: str) -> list[Record]:
    out: list[Record] = []
    for partition in await log.partitions(topic):
        out.extend([r async for r in log.read(topic, partition)])
    return out


async def _drain(consumer, expected: int, max_polls: int = 60) -> list[Record]:
    got: list[Record] = []
    for _ in range(max_polls):
        if len(got) >= expected:
            break
        got.extend(await consumer.poll(max_records=1000, timeout_s=1.0))
    return got


def test_retention_classes_map_to_topic_configs() -> None:
    assert topic_configs("compacted") == {"cleanup.policy": "compact"}
    assert topic_configs("short")["cleanup.policy"] == "delete"
    assert int(topic_configs("long")["retention.ms"]) > int(topic_configs("short")["retention.ms"])


def test_partitioner_matches_kafka_default() -> None:
    # murmur2 values from Kafka's own UtilsTest.testMurmur2 (the Java client's hash)
    for key, java_hash in [(b"21", -973932308), (b"foobar", -790332482), (b"abc", 479470107)]:
        assert partition_for(key, 7) == (java_hash & 0x7FFFFFFF) % 7
    assert {partition_for(f"run-{i}".encode(), 6) for i in range(100)} == set(range(6))


async def test_registry_topics_created_idempotently(kafka_bootstrap: str) -> None:
    from aiokafka.admin import AIOKafkaAdminClient

    from events.topics import TOPICS

    async with KafkaLog(kafka_bootstrap):
        pass
    async with KafkaLog(kafka_bootstrap) as log:  # second start: all exist already, fine
        assert await log.create_topics(TOPICS.values()) == []
        for spec in TOPICS.values():
            assert len(await log.partitions(spec.name)) == spec.partitions
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

        compacted = [s.name for s in TOPICS.values() if s.retention == "compacted"]
        resp = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, compacted[0])]
        )
        configs = {c[0]: c[1] for c in resp[0].resources[0][4]}
        assert configs["cleanup.policy"] == "compact"
    finally:
        await admin.close()


async def test_append_read_round_trip(kafka_bootstrap: str) -> None:
    topic = _topic("roundtrip")
    events = [_step_event(f"run-{i % 5}", step=i, seq=i) for i in range(200)]
    async with KafkaLog(kafka_bootstrap, create_registry_topics=False) as log:
        await log.create_topic(topic, partitions=3)
        single = await log.append(topic, events[0].key(), encode(events[0]))
        many = await log.append_many(topic, [(e.key(), encode(e)) for e in events[1:]])
        appended = [single, *many]
        # append_many answers in input order, with the partition of each record's key
        for ev, ap in zip(events, appended, strict=True):
            assert ap.partition == partition_for(ev.key(), 3)
        by_pos = {(r.partition, r.offset): r for r in await _read_all(log, topic)}
        assert len(by_pos) == len(events)
        for ev, ap in zip(events, appended, strict=True):
            rec = by_pos[(ap.partition, ap.offset)]
            assert rec.key == ev.run_id.encode()
            assert rec.value == encode(ev)
            back = decode(rec.value)
            assert back.model_dump_json() == ev.model_dump_json()  # NaN survives too
        for p in await log.partitions(topic):
            assert await log.end_offset(topic, p) == 1 + max(
                (a.offset for a in appended if a.partition == p), default=-1
            )
        # read from the middle of a partition
        p0 = appended[0].partition
        tail = [r async for r in log.read(topic, p0, from_offset=3)]
        assert [r.offset for r in tail][:1] == [3]


async def test_spread_appends_fill_partitions_in_turn_and_read_back_by_place(
    kafka_bootstrap: str,
) -> None:
    """``spread``: bulk records of one key go to the partitions one batch each (so a
    produce request carries several), keep their key, and are found where the answer
    says; the ordered producer still works beside the bulk one."""
    topic = _topic("spread")
    value = bytes(range(256)) * 400  # 100 KiB: five to a 512 KiB batch
    records = [(b"run-s", value[i:] + bytes([i])) for i in range(40)]
    async with KafkaLog(kafka_bootstrap, create_registry_topics=False) as log:
        await log.create_topic(topic, partitions=3)
        where = await log.append_many(topic, records, spread=True)
        ordered = await log.append_many(topic, [(b"run-s", b"after")])
        assert ordered[0].partition == partition_for(b"run-s", 3)
        assert len({w.partition for w in where}) == 3  # 8 batches over 3 partitions
        runs = [w.partition for w in where]  # partitions change only at batch ends
        assert sum(a != b for a, b in itertools.pairwise(runs)) == 7
        by_pos = {(r.partition, r.offset): r for r in await _read_all(log, topic)}
        assert len(by_pos) == len(records) + 1
        for (key, val), at in zip(records, where, strict=True):
            rec = by_pos[(at.partition, at.offset)]
            assert (rec.key, rec.value) == (key, val)
        await log.flush()
    with pytest.raises(RuntimeError):  # closed: no bulk producer starts again
        await log.append_many(topic, records[:1], spread=True)
    assert log._bulk is None


async def test_every_event_type_round_trips_through_kafka(kafka_bootstrap: str) -> None:
    from tests.event_samples import all_samples

    samples = all_samples()
    topic = _topic("every-type")
    async with KafkaLog(kafka_bootstrap, create_registry_topics=False) as log:
        await log.create_topic(topic, partitions=3)
        await log.append_many(topic, [(e.key(), encode(e)) for e in samples])
        records = await _read_all(log, topic)
    back = {ev.event_id: ev for ev in map(decode, (r.value for r in records))}
    assert len(back) == len(samples)
    for ev in samples:
        assert back[ev.event_id] == ev
        assert type(back[ev.event_id]) is type(ev)


async def test_group_commit_and_resume_in_a_new_consumer(kafka_bootstrap: str) -> None:
    topic = _topic("group")
    group = f"g-{uuid.uuid4().hex[:6]}"
    values = [f"v{i}".encode() for i in range(300)]
    async with KafkaLog(kafka_bootstrap, create_registry_topics=False) as log:
        await log.create_topic(topic, partitions=2)
        await log.append_many(topic, [(f"r{i % 7}".encode(), v) for i, v in enumerate(values)])

        first = await log.consumer(group, [topic])
        seen = await _drain(first, 300)
        assert sorted(r.value for r in seen) == sorted(values)
        await first.commit()
        await first.close()

        more = [f"w{i}".encode() for i in range(50)]
        await log.append_many(topic, [(b"r1", v) for v in more])
        second = await log.consumer(group, [topic])
        resumed = await _drain(second, 50)
        extra = await second.poll(timeout_s=1.0)
        assert sorted(r.value for r in resumed + extra) == sorted(more)  # nothing old again
        await second.close()  # closes without commit: the 50 come again

        third = await log.consumer(group, [topic])
        again = await _drain(third, 50)
        assert sorted(r.value for r in again) == sorted(more)
        await third.close()


async def test_per_run_order_on_a_multi_partition_topic(kafka_bootstrap: str) -> None:
    topic = _topic("order")
    n_runs, n_steps = 40, 60
    # interleave runs step by step, as many producers writing at once would
    events = [
        _step_event(f"run-{r:03d}", step=s, seq=s) for s in range(n_steps) for r in range(n_runs)
    ]
    async with KafkaLog(kafka_bootstrap, create_registry_topics=False) as log:
        await log.create_topic(topic, partitions=6)
        for i in range(0, len(events), 500):
            chunk = events[i : i + 500]
            await log.append_many(topic, [(e.key(), encode(e)) for e in chunk])
        await log.append(topic, events[0].key(), encode(_step_event("run-000", n_steps, n_steps)))

        consumer = await log.consumer(f"order-{uuid.uuid4().hex[:6]}", [topic])
        records = await _drain(consumer, len(events) + 1)
        await consumer.close()
    assert len(records) == len(events) + 1
    steps: dict[str, list[int]] = defaultdict(list)
    partitions: dict[str, set[int]] = defaultdict(set)
    for rec in records:
        ev = decode(rec.value)
        assert isinstance(ev, EventBase)
        steps[ev.run_id].append(ev.step)
        partitions[ev.run_id].add(rec.partition)
    assert len({p for ps in partitions.values() for p in ps}) > 1  # really spread out
    for run_id, run_steps in steps.items():
        assert len(partitions[run_id]) == 1, run_id
        expected = list(range(n_steps + (1 if run_id == "run-000" else 0)))
        assert run_steps == expected, run_id


async def test_malformed_bytes_reach_the_consumer_and_dead_letter(kafka_bootstrap: str) -> None:
    topic = _topic("malformed")
    good = [_step_event("run-m", step=i, seq=i) for i in range(3)]
    bad = [
        b"\x00\xffnot json",
        b'{"type": "TrainerStepCompleted", "reward_mean": "lots"}',
        b'{"type": "NoSuchEvent", "run_id": "run-m"}',
        b"[1, 2, 3]",
    ]
    payloads = [encode(good[0]), *bad[:2], encode(good[1]), *bad[2:], encode(good[2])]
    async with KafkaLog(kafka_bootstrap, create_registry_topics=False) as log:
        await log.create_topic(topic, partitions=1)
        await log.append_many(topic, [(b"run-m", p) for p in payloads])
        await log.append(topic, b"run-m", encode(good[2]))  # a duplicate delivery
        consumer = await log.consumer(f"m-{uuid.uuid4().hex[:6]}", [topic])
        records = await _drain(consumer, len(payloads) + 1)
        await consumer.commit()
        await consumer.close()
    assert [r.value for r in records] == [*payloads, encode(good[2])]  # bytes untouched
    dedupe = Deduplicator()
    kept: list[EventBase] = []
    dead: list[DeadLetter] = []
    for rec in records:  # the consumer keeps going past every bad record
        result = decode(rec.value)
        if isinstance(result, DeadLetter):
            dead.append(result.located(rec.topic, rec.partition, rec.offset))
        elif dedupe.first_time(result.event_id):
            kept.append(result)
    assert [e.event_id for e in kept] == [e.event_id for e in good]
    assert dedupe.duplicates == 1
    assert [d.raw for d in dead] == bad
    assert [d.kind for d in dead] == [
        "malformed_json",
        "validation_error",
        "unknown_type",
        "not_an_object",
    ]
    assert all(d.source_topic == topic and d.reason for d in dead)

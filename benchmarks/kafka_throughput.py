"""Kafka throughput: runwatch's backend with the codec vs plain aiokafka, one broker, one run.

What is measured (``--count`` events per path, default 1,000,000):

- runwatch: typed envelope events (``TrainerStepCompleted`` with a few metrics, keyed by
  ``run_id``, ~470 bytes encoded) are encoded with :func:`events.codec.encode` and
  produced through :class:`events.log.kafka.KafkaLog` (``send_many`` chunks, idempotent,
  acks=all), then consumed by a :class:`~events.log.kafka.KafkaLogConsumer` group member
  and decoded with :func:`events.codec.decode` (every record back to a validated event).
- anchors: the same count of raw byte strings of the same sizes and keys through plain
  aiokafka with the same producer settings and no codec, consumed with
  ``AIOKafkaConsumer.getmany``: (a) ``AIOKafkaProducer.send`` per record, the usual way;
  (b) aiokafka's batch API by hand (``create_batch``/``send_batch``), the trick
  runwatch's backend uses, so the ratio against (b) is the price of the codec.

Every path has its own 3-partition topic on the same broker. The machine is shared, so
the paths take turns in ``--rounds`` rounds (each produces then consumes its share);
load that comes and goes hits all of them alike. Event objects and raw payloads are
built before the clock starts (building is the emitter's cost, not the log's) and frozen
out of the garbage collector (``gc.freeze``). Rates are events per second of wall-clock
time; "end to end" is count / (produce time + consume time). Goal: runwatch / plain
>= 0.6.

Usage: ``python benchmarks/kafka_throughput.py [--count N] [--bootstrap HOST:PORT]``
(without ``--bootstrap`` a broker is provisioned as the tests do and stopped after).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.partitioner import DefaultPartitioner

from events.catalog.trainer import TrainerStepCompleted
from events.codec import decode, encode
from events.dead_letter import DeadLetter
from events.envelope import EventBase, new_envelope
from events.log.kafka import CONSUMER_DEFAULTS, PRODUCER_DEFAULTS, KafkaLog, KafkaLogConsumer

PARTITIONS = 3
CHUNK = 20_000


@dataclass
class Figures:
    name: str
    count: int = 0
    payload_bytes: int = 0
    produce_s: float = 0.0
    consume_s: float = 0.0

    @property
    def produce_rate(self) -> float:
        return self.count / self.produce_s

    @property
    def consume_rate(self) -> float:
        return self.count / self.consume_s

    @property
    def end_to_end_rate(self) -> float:
        return self.count / (self.produce_s + self.consume_s)

    def line(self) -> str:
        mb = self.payload_bytes / 1e6
        return (
            f"{self.name:<34} produce {self.produce_rate:>9,.0f} ev/s "
            f"({mb / self.produce_s:5.1f} MB/s)  consume {self.consume_rate:>9,.0f} ev/s "
            f"({mb / self.consume_s:5.1f} MB/s)  end-to-end {self.end_to_end_rate:>9,.0f} ev/s"
        )


@dataclass
class PlainPath:
    """Plain aiokafka on raw bytes: ``send`` per record, or the batch API by hand."""

    bootstrap: str
    batches: bool
    figures: Figures
    topic: str = field(default_factory=lambda: f"bench.plain.{uuid.uuid4().hex[:8]}")
    producer: Any = None
    consumer: Any = None

    async def start(self) -> None:
        async with KafkaLog(self.bootstrap, create_registry_topics=False) as admin_only:
            await admin_only.create_topic(self.topic, PARTITIONS)
        self.producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, **PRODUCER_DEFAULTS)
        await self.producer.start()
        self.consumer = AIOKafkaConsumer(
            self.topic,
            bootstrap_servers=self.bootstrap,
            group_id=f"bench-{uuid.uuid4().hex[:6]}",
            **CONSUMER_DEFAULTS,
        )
        await self.consumer.start()

    async def produce(self, keys: list[bytes], values: list[bytes]) -> None:
        t0 = time.perf_counter()
        if self.batches:
            await self._produce_batches(keys, values)
        else:
            futures = []
            for key, value in zip(keys, values, strict=True):
                futures.append(await self.producer.send(self.topic, value, key=key))
                if len(futures) >= CHUNK:
                    await asyncio.gather(*futures[: CHUNK // 2])
                    del futures[: CHUNK // 2]
            await asyncio.gather(*futures)
        self.figures.produce_s += time.perf_counter() - t0
        self.figures.count += len(values)
        self.figures.payload_bytes += sum(map(len, values))

    async def _produce_batches(self, keys: list[bytes], values: list[bytes]) -> None:
        """One open batch per partition (default partitioner), sent when full, every
        delivery future awaited at the end."""
        producer, partitioner = self.producer, DefaultPartitioner()
        parts = sorted(await producer.partitions_for(self.topic))
        open_batches: dict[int, Any] = {}
        futures = []
        for key, value in zip(keys, values, strict=True):
            p = partitioner(key, parts, parts)
            batch = open_batches.get(p) or open_batches.setdefault(p, producer.create_batch())
            if batch.append(key=key, value=value, timestamp=None) is None:
                futures.append(await producer.send_batch(batch, self.topic, partition=p))
                batch = open_batches[p] = producer.create_batch()
                batch.append(key=key, value=value, timestamp=None)
        for p, batch in open_batches.items():
            futures.append(await producer.send_batch(batch, self.topic, partition=p))
        await asyncio.gather(*futures)

    async def consume(self, count: int) -> None:
        seen = 0
        t0 = time.perf_counter()
        while seen < count:
            batches = await self.consumer.getmany(timeout_ms=5000, max_records=10_000)
            for msgs in batches.values():
                for msg in msgs:
                    _ = msg.value
                    seen += 1
        await self.consumer.commit()
        self.figures.consume_s += time.perf_counter() - t0

    async def stop(self) -> None:
        await self.consumer.stop()
        await self.producer.stop()


@dataclass
class RunwatchPath:
    """runwatch: events encoded by the codec through KafkaLog, decoded on consume."""

    bootstrap: str
    figures: Figures
    topic: str = field(default_factory=lambda: f"bench.runwatch.{uuid.uuid4().hex[:8]}")
    log: KafkaLog | None = None
    consumer: KafkaLogConsumer | None = None

    async def start(self) -> None:
        self.log = KafkaLog(self.bootstrap, create_registry_topics=False)
        await self.log.start()
        await self.log.create_topic(self.topic, PARTITIONS)
        self.consumer = await self.log.consumer(f"bench-{uuid.uuid4().hex[:6]}", [self.topic])

    async def produce(self, events: list[EventBase]) -> None:
        assert self.log is not None
        payload = 0
        t0 = time.perf_counter()
        pending = None
        for i in range(0, len(events), CHUNK):
            records = [(e.key(), encode(e)) for e in events[i : i + CHUNK]]
            payload += sum(len(v) for _, v in records)
            acks = await self.log.send_many(self.topic, records)  # queued; acks meanwhile
            if pending is not None:
                await pending
            pending = acks
        if pending is not None:
            await pending
        self.figures.produce_s += time.perf_counter() - t0
        self.figures.count += len(events)
        self.figures.payload_bytes += payload

    async def consume(self, count: int) -> None:
        assert self.consumer is not None
        seen = dead = 0
        t0 = time.perf_counter()
        while seen < count:
            for rec in await self.consumer.poll(max_records=10_000, timeout_s=5.0):
                if isinstance(decode(rec.value), DeadLetter):
                    dead += 1
                seen += 1
        await self.consumer.commit()
        self.figures.consume_s += time.perf_counter() - t0
        if dead:
            raise SystemExit(f"{dead} records dead-lettered: the benchmark is broken")

    async def stop(self) -> None:
        if self.log is not None:
            await self.log.close()


def build_events(count: int, runs: int) -> list[EventBase]:
    return [
        TrainerStepCompleted(
            **new_envelope(
                tenant_id="tenant-a",
                run_id=f"run-{i % runs:04d}",
                producer="bench/trainer",
                seq=i,
                step=i // runs,
            ),
            reward_mean=0.5,
            kl_to_ref=0.01,
            entropy=1.2,
            loss=0.3,
            lr=1e-6,
        )
        for i in range(count)
    ]


async def warm_up(bootstrap: str) -> None:
    """Untimed: warm the broker's JIT and create the group-offsets topic."""
    path = PlainPath(bootstrap, batches=False, figures=Figures("warm-up"))
    await path.start()
    keys = [f"run-{i % 100}".encode() for i in range(20_000)]
    await path.produce(keys, [b"x" * 400] * len(keys))
    await path.consume(len(keys))
    await path.stop()


async def main_async(bootstrap: str, count: int, runs: int, rounds: int) -> None:
    print(f"building {count:,} events ({runs} runs) ...", flush=True)
    events = build_events(count, runs)
    sizes = [len(encode(e)) for e in events]
    keys = [e.key() for e in events]
    values = [os.urandom(n) for n in sizes]  # raw bytes of the very same sizes
    print(f"mean record value {sum(sizes) / count:.0f} bytes; broker {bootstrap}", flush=True)
    gc.collect()
    gc.freeze()  # the prebuilt inputs are not garbage: keep the collector off them

    await warm_up(bootstrap)
    send = PlainPath(bootstrap, batches=False, figures=Figures("plain aiokafka send() (raw)"))
    batch = PlainPath(bootstrap, batches=True, figures=Figures("plain aiokafka batch API (raw)"))
    ours = RunwatchPath(bootstrap, figures=Figures("runwatch KafkaLog + codec"))
    for path in (send, batch, ours):
        await path.start()
    size = -(-count // rounds)
    for r in range(rounds):
        part = slice(r * size, min(count, (r + 1) * size))
        n = len(sizes[part])
        for path in (send, batch, ours):
            if isinstance(path, PlainPath):
                await path.produce(keys[part], values[part])
            else:
                await path.produce(events[part])
            await path.consume(n)
        print(f"round {r + 1}/{rounds} done", flush=True)
    for path in (send, batch, ours):
        await path.stop()

    print()
    print(f"{count:,} events per path, {PARTITIONS} partitions, one broker, one run")
    for path in (send, batch, ours):
        print(path.figures.line())
    o = ours.figures
    for base in (send.figures, batch.figures):
        ratio = o.end_to_end_rate / base.end_to_end_rate
        print(
            f"runwatch / {base.name:<31} produce {o.produce_rate / base.produce_rate:.2f}, "
            f"consume {o.consume_rate / base.consume_rate:.2f}, end-to-end {ratio:.2f} "
            f"(goal >= 0.60: {'met' if ratio >= 0.6 else 'NOT met'})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=1000, help="distinct run ids (keys)")
    parser.add_argument("--rounds", type=int, default=5, help="turns the paths take")
    parser.add_argument("--bootstrap", default=None, help="use this broker (else provision)")
    args = parser.parse_args()
    if args.bootstrap:
        asyncio.run(main_async(args.bootstrap, args.count, args.runs, args.rounds))
        return
    from runwatch.broker.provision import provision

    broker = provision(log=print)
    print(f"Kafka broker: {broker.describe()}", flush=True)
    try:
        asyncio.run(main_async(broker.bootstrap, args.count, args.runs, args.rounds))
    finally:
        broker.stop()


if __name__ == "__main__":
    main()

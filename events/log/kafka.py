"""The Kafka log backend (aiokafka 0.14), the production engine.

Producing: one idempotent producer (``enable_idempotence=True``, hence ``acks=all``)
per backend. Records are keyed by the ``key`` bytes the caller passes (``run_id``) and
partitioned with Kafka's default partitioner (murmur2 of the key, as the Java client and
faust do), so one run's records stay ordered on one partition. :meth:`append_many`
builds record batches per partition itself and hands whole batches to the producer —
no await per record — then awaits every batch once; :meth:`KafkaLog.send_many` returns
as soon as the batches are queued, so a caller can encode the next chunk meanwhile.
Idempotence makes retries safe: a batch re-sent after a broker restart is stored once
(the broker deduplicates by producer id and sequence number), and an idempotent
producer retries until it succeeds.

Topics: :meth:`start` creates every topic of :data:`events.topics.TOPICS` (partitions
and retention class from the registry) plus any ``extra_topics``; an existing topic is
fine. :meth:`create_topics` adds ad-hoc topics (tests, benchmarks).

Consuming: :meth:`consumer` is a group member (``enable_auto_commit=False``,
``auto_offset_reset="earliest"``) that commits exactly the positions just past the
records it returned. :meth:`read` reads one partition from an offset without a group.

Time semantics: ``Record.timestamp_ms`` is Kafka's CreateTime (set by this producer);
folds never read it. Timeouts are wall-clock seconds.

Assumptions: partition counts of existing topics are not changed here; a topic created
earlier with other settings keeps them. Topics get ``replication_factor`` replicas (1 by
default, for the single-node brokers of tests and ``runwatch kafka up``; pass 3 on a
real cluster).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Iterable, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.client import AIOKafkaClient
from aiokafka.errors import (
    CommitFailedError,
    IllegalStateError,
    KafkaError,
    KafkaTimeoutError,
    RebalanceInProgressError,
    TopicAlreadyExistsError,
    for_code,
)
from aiokafka.partitioner import murmur2

from events.log.base import Appended, LogBackend, LogConsumer, Record
from events.topics import RETENTION_MS, TOPICS, Retention, TopicSpec

log = logging.getLogger(__name__)

#: Producer settings: throughput with durability. Batches up to 512 KiB, a short linger
#: so single appends still travel together, idempotence (acks=all) for exactly-once
#: storage of retried batches.
PRODUCER_DEFAULTS: dict[str, Any] = {
    "enable_idempotence": True,
    "acks": "all",
    "linger_ms": 5,
    "max_batch_size": 512 * 1024,
    "max_request_size": 4 * 1024 * 1024,
    "request_timeout_ms": 30_000,
    "retry_backoff_ms": 200,
}
CONSUMER_DEFAULTS: dict[str, Any] = {
    "enable_auto_commit": False,
    "auto_offset_reset": "earliest",
    "fetch_max_bytes": 16 * 1024 * 1024,
    "max_partition_fetch_bytes": 4 * 1024 * 1024,
    "session_timeout_ms": 10_000,
    "heartbeat_interval_ms": 1_000,
}


def topic_configs(retention: Retention) -> dict[str, str]:
    """Kafka topic configs of a registry retention class."""
    if retention == "compacted":
        return {"cleanup.policy": "compact"}
    ms = RETENTION_MS[retention]
    return {"cleanup.policy": "delete", "retention.ms": str(ms)}


@functools.lru_cache(maxsize=65536)
def partition_for(key: bytes, n_partitions: int) -> int:
    """Kafka's default partition of a key (murmur2, as the Java client and faust)."""
    return (murmur2(key) & 0x7FFFFFFF) % n_partitions


class KafkaLog(LogBackend):
    """:class:`~events.log.base.LogBackend` on a Kafka cluster at ``bootstrap``."""

    def __init__(
        self,
        bootstrap: str,
        *,
        extra_topics: Iterable[TopicSpec] = (),
        create_registry_topics: bool = True,
        replication_factor: int = 1,
        client_id: str = "runwatch",
        delivery_timeout_s: float = 300.0,
        producer_config: dict[str, Any] | None = None,
        consumer_config: dict[str, Any] | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.extra_topics = tuple(extra_topics)
        self.create_registry_topics = create_registry_topics
        self.replication_factor = replication_factor
        self.client_id = client_id
        self.delivery_timeout_s = delivery_timeout_s
        self.producer_config = {**PRODUCER_DEFAULTS, **(producer_config or {})}
        self.consumer_config = {**CONSUMER_DEFAULTS, **(consumer_config or {})}
        self._producer: AIOKafkaProducer | None = None
        #: a second producer (own connection) for ``spread`` appends, started on first use
        self._bulk: AIOKafkaProducer | None = None
        self._bulk_starting = asyncio.Lock()
        self._closing = False
        self._partitions: dict[str, list[int]] = {}
        self._consumers: set[KafkaLogConsumer] = set()

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        specs = [*(TOPICS.values() if self.create_registry_topics else ()), *self.extra_topics]
        if specs:
            await self.create_topics(specs)
        self._closing = False
        self._producer = self._new_producer("producer")
        await self._producer.start()

    async def close(self) -> None:
        self._closing = True  # no bulk producer starts from here on
        for consumer in list(self._consumers):
            await consumer.close()
        async with self._bulk_starting:  # one being started is done starting
            bulk, self._bulk = self._bulk, None
        producer, self._producer = self._producer, None
        try:
            if bulk is not None:
                await bulk.stop()  # flushes pending batches
        finally:
            if producer is not None:
                await producer.stop()

    async def create_topics(self, specs: Iterable[TopicSpec]) -> list[str]:
        """Create the topics that do not exist yet; returns the names created."""
        specs = list(specs)
        admin = AIOKafkaAdminClient(
            bootstrap_servers=self.bootstrap, client_id=f"{self.client_id}-admin"
        )
        await admin.start()
        created: list[str] = []
        try:
            existing = set(await admin.list_topics())
            todo = [s for s in specs if s.name not in existing]
            if not todo:
                return created
            response = await admin.create_topics(
                [
                    NewTopic(
                        s.name,
                        s.partitions,
                        self.replication_factor,
                        topic_configs=topic_configs(s.retention),
                    )
                    for s in todo
                ]
            )
            for name, code, *rest in response.topic_errors:
                error = for_code(code)
                if code == 0:
                    created.append(name)
                elif error is not TopicAlreadyExistsError:  # a concurrent creator won: fine
                    message = rest[0] if rest else ""
                    raise error(f"cannot create topic {name!r}: {message}")
        finally:
            await admin.close()
        if created:
            await self._wait_topics_visible(created)
        return created

    async def create_topic(
        self, name: str, partitions: int = 1, retention: Retention = "short"
    ) -> TopicSpec:
        """An ad-hoc topic (not in the registry), created if missing."""
        spec = TopicSpec(name, partitions, retention, "ad-hoc")
        await self.create_topics([spec])
        return spec

    async def _wait_topics_visible(self, names: Sequence[str], timeout_s: float = 30.0) -> None:
        """Block until the cluster metadata shows every partition of ``names`` with a leader."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        client = AIOKafkaClient(bootstrap_servers=self.bootstrap, client_id="runwatch-probe")
        await client.bootstrap()
        try:
            while True:
                cluster = await client.fetch_all_metadata()
                if all(_has_leaders(cluster, name) for name in names):
                    return
                if loop.time() > deadline:
                    raise KafkaTimeoutError(f"topics not visible after {timeout_s}s: {names}")
                await asyncio.sleep(0.1)
        finally:
            await client.close()

    # ------------------------------------------------------------------ producing
    @property
    def producer(self) -> AIOKafkaProducer:
        if self._producer is None:
            raise RuntimeError("KafkaLog is not started (use `async with KafkaLog(...)`)")
        return self._producer

    async def bulk_producer(self) -> AIOKafkaProducer:
        """The producer of ``spread`` appends: bulk bytes (payloads) get their own
        connection, so the small ordered appends are not queued behind a multi-megabyte
        request (the producer has one request in flight per broker)."""
        async with self._bulk_starting:
            if self._producer is None or self._closing:
                raise RuntimeError("KafkaLog is not started (use `async with KafkaLog(...)`)")
            if self._bulk is None:
                self._bulk = await self._started_producer("bulk-producer")
        return self._bulk

    def _new_producer(self, name: str) -> AIOKafkaProducer:
        return AIOKafkaProducer(
            bootstrap_servers=self.bootstrap,
            client_id=f"{self.client_id}-{name}",
            **self.producer_config,
        )

    async def _started_producer(self, name: str) -> AIOKafkaProducer:
        """A started producer; a broker that is away is waited out for up to
        ``delivery_timeout_s``, as appends wait it out (:meth:`_retry_enqueue`)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.delivery_timeout_s
        while True:
            producer = self._new_producer(name)
            try:
                await producer.start()
                return producer
            except KafkaError:
                with contextlib.suppress(Exception):
                    await producer.stop()
                if self._closing or loop.time() > deadline:
                    raise
                log.warning("Kafka %s cannot connect (broker away?); retrying", name)
                await asyncio.sleep(self.producer_config.get("retry_backoff_ms", 200) / 1000)

    async def partitions(self, topic: str) -> list[int]:
        cached = self._partitions.get(topic)
        if cached is None:
            cached = sorted(await self.producer.partitions_for(topic))
            self._partitions[topic] = cached
        return cached

    async def partition_of(self, topic: str, key: bytes) -> int | None:
        return await self._partition(topic, key)  # what append() picks for that key

    async def _partition(self, topic: str, key: bytes | None) -> int:
        parts = await self.partitions(topic)
        if key is None:
            return random.choice(parts)
        return parts[partition_for(key, len(parts))]

    async def append(self, topic: str, key: bytes | None, value: bytes) -> Appended:
        partition = await self._partition(topic, key)
        fut = await self._retry_enqueue(
            lambda: self.producer.send(topic, value, key=key, partition=partition)
        )
        meta = await fut
        return Appended(topic, meta.partition, meta.offset)

    async def append_many(
        self, topic: str, records: Sequence[tuple[bytes | None, bytes]], *, spread: bool = False
    ) -> list[Appended]:
        return await (await self.send_many(topic, records, spread=spread))

    async def send_many(
        self, topic: str, records: Sequence[tuple[bytes | None, bytes]], *, spread: bool = False
    ) -> Awaitable[list[Appended]]:
        """Hand ``records`` to the producer as whole batches, in order, and return an
        awaitable of their acknowledgements (what :meth:`append_many` awaits at once).

        Returning once everything is *queued* lets a caller prepare the next chunk while
        the broker acknowledges this one; calls made one after another keep their order
        per partition. (Concurrent calls for the same topic may interleave their
        batches, as concurrent ``send`` calls would: sequence them for per-run order.)

        ``spread``: the records go to the partitions in turn, one batch each, from a
        random one, whatever their keys, through :meth:`bulk_producer`. The producer
        keeps one batch per partition in a produce request and one request in flight per
        broker, so records keyed to one partition are written one batch per broker round
        trip; spread, a request carries a batch for each partition.
        """
        if not records:
            return _done([])
        producer = await self.bulk_producer() if spread else self.producer
        parts = await self.partitions(topic)
        n = len(parts)
        sticky = random.randrange(n)  # records without a key share one partition per call
        open_batches: dict[int, Any] = {}
        open_index: dict[int, int] = {}  # partition -> index of its open batch in `sent`
        counts: dict[int, int] = {}  # records in the open batch of each partition
        sent: list[tuple[int, Any]] = []  # (partition, delivery future) per batch
        where: list[tuple[int, int]] = []  # per record: (batch index, offset in batch)

        def open_batch(partition: int) -> Any:
            batch = open_batches[partition] = producer.create_batch()
            open_index[partition] = len(sent)
            sent.append((partition, None))
            counts[partition] = 0
            return batch

        async def submit(partition: int) -> None:
            batch = open_batches.pop(partition)
            # closed: the producer sends it at once instead of letting it linger for
            # records that could never join it (a batch handed over whole gets none),
            # and the partition's next batch waits behind it for no reason
            batch.close()
            fut = await self._retry_enqueue(
                lambda: producer.send_batch(batch, topic, partition=partition)
            )
            sent[open_index.pop(partition)] = (partition, fut)

        for key, value in records:
            spot = sticky if key is None or spread else partition_for(key, n)
            partition = parts[spot % n]
            batch = open_batches.get(partition)
            if batch is None:
                batch = open_batch(partition)
            if batch.append(key=key, value=value, timestamp=None) is None:
                if counts[partition] == 0:
                    raise ValueError(f"a record of {len(value)} bytes exceeds the batch size")
                await submit(partition)
                if spread:  # the next batch on the next partition
                    sticky += 1
                    partition = parts[sticky % n]
                batch = open_batch(partition)
                batch.append(key=key, value=value, timestamp=None)
            where.append((open_index[partition], counts[partition]))
            counts[partition] += 1
        for partition in list(open_batches):
            await submit(partition)

        async def acknowledged() -> list[Appended]:
            metas = await asyncio.gather(*(fut for _, fut in sent))
            return [Appended(topic, sent[b][0], metas[b].offset + rel) for b, rel in where]

        return asyncio.ensure_future(acknowledged())

    async def _retry_enqueue(self, enqueue: Any) -> asyncio.Future[Any]:
        """Hand a record or batch to the producer, waiting out a broker that is away
        (enqueueing times out only when nothing was queued, so retrying adds no copy)."""
        deadline = asyncio.get_running_loop().time() + self.delivery_timeout_s
        while True:
            try:
                return await enqueue()
            except KafkaTimeoutError:
                if asyncio.get_running_loop().time() > deadline:
                    raise
                log.warning("Kafka producer queue full (broker away?); retrying enqueue")

    async def flush(self) -> None:
        await self.producer.flush()
        if self._bulk is not None:
            await self._bulk.flush()

    # ------------------------------------------------------------------ reading
    async def end_offset(self, topic: str, partition: int) -> int:
        consumer = self._plain_consumer()
        await consumer.start()
        try:
            tp = TopicPartition(topic, partition)
            return int((await consumer.end_offsets([tp]))[tp])
        finally:
            await consumer.stop()

    def _plain_consumer(self) -> AIOKafkaConsumer:
        config = {k: v for k, v in self.consumer_config.items() if "commit" not in k}
        return AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            client_id=f"{self.client_id}-reader",
            group_id=None,
            **{**config, "enable_auto_commit": False},
        )

    async def read(
        self, topic: str, partition: int = 0, from_offset: int = 0, until_end: bool = True
    ) -> AsyncIterator[Record]:
        consumer = self._plain_consumer()
        await consumer.start()
        try:
            tp = TopicPartition(topic, partition)
            consumer.assign([tp])
            end = int((await consumer.end_offsets([tp]))[tp]) if until_end else None
            start = max(from_offset, int((await consumer.beginning_offsets([tp]))[tp]))
            if end is not None and start >= end:
                return
            consumer.seek(tp, start)
            while True:
                batches = await consumer.getmany(tp, timeout_ms=1000, max_records=5000)
                for msg in batches.get(tp, ()):
                    if end is not None and msg.offset >= end:
                        return
                    yield _record(msg)
                if end is not None and await consumer.position(tp) >= end:
                    return
        finally:
            await consumer.stop()

    async def consumer(self, group_id: str, topics: Sequence[str]) -> KafkaLogConsumer:
        member = KafkaLogConsumer(self, group_id, topics)
        await member.start()
        self._consumers.add(member)
        return member


def _record(msg: Any) -> Record:
    return Record(msg.topic, msg.partition, msg.offset, msg.key, msg.value, msg.timestamp)


def _has_leaders(cluster: Any, topic: str) -> bool:
    parts = cluster.partitions_for_topic(topic)
    return bool(parts) and all(
        cluster.leader_for_partition(TopicPartition(topic, p)) not in (None, -1) for p in parts
    )


def _done(value: Any) -> asyncio.Future[Any]:
    fut = asyncio.get_running_loop().create_future()
    fut.set_result(value)
    return fut


class _DropRevoked(ConsumerRebalanceListener):
    """On revocation, forget uncommitted positions of the partitions this member loses:
    their records are delivered again to the new owner (at-least-once)."""

    def __init__(self, member: KafkaLogConsumer) -> None:
        self.member = member

    async def on_partitions_revoked(self, revoked: Any) -> None:
        for tp in revoked:
            self.member._pending.pop(tp, None)

    async def on_partitions_assigned(self, assigned: Any) -> None:
        return None


class KafkaLogConsumer(LogConsumer):
    """A consumer-group member: returns records, commits exactly what it returned."""

    def __init__(self, backend: KafkaLog, group_id: str, topics: Sequence[str]) -> None:
        self.backend = backend
        self.group_id = group_id
        self.topics = tuple(topics)
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=backend.bootstrap,
            group_id=group_id,
            client_id=f"{backend.client_id}-{group_id}",
            **backend.consumer_config,
        )
        self._pending: dict[TopicPartition, int] = {}
        self._closed = False

    async def start(self) -> None:
        self._consumer.subscribe(list(self.topics), listener=_DropRevoked(self))
        await self._consumer.start()

    async def poll(self, max_records: int = 500, timeout_s: float = 1.0) -> list[Record]:
        batches = await self._consumer.getmany(
            timeout_ms=int(timeout_s * 1000), max_records=max_records
        )
        out: list[Record] = []
        for tp, msgs in batches.items():
            if not msgs:
                continue
            topic, partition = tp.topic, tp.partition
            out.extend(
                [Record(topic, partition, m.offset, m.key, m.value, m.timestamp) for m in msgs]
            )
            self._pending[tp] = msgs[-1].offset + 1
        return out

    async def commit(self) -> None:
        if not self._pending:
            return
        offsets, self._pending = self._pending, {}
        assigned = self._consumer.assignment()
        offsets = {tp: off for tp, off in offsets.items() if tp in assigned}
        if not offsets:
            return
        try:
            await self._consumer.commit(offsets)
        except (CommitFailedError, RebalanceInProgressError, IllegalStateError) as exc:
            # the group moved on: these records come again to whoever owns them now
            log.warning("commit of %s failed (%s); records will be redelivered", offsets, exc)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.backend._consumers.discard(self)
        with contextlib.suppress(Exception):
            await self._consumer.stop()

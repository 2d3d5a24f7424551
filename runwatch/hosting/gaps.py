"""Records faust skipped: noticed by their offsets, read back from Kafka, folded first.

faust 0.15 can move a partition's committed offset past records its agents never saw:
``benchmarks/worker_recovery.py`` lost 0-52 of thousands of probes around worker
restarts, never folded and committed all the same (``docs/recovery.md``; the candidate is
its gap bookkeeping while tables recover, which counts offsets it did not deliver as
acknowledged). runwatch closes that hole at its own layer instead of patching faust:

- the agent keeps, per ``(topic, partition)``, the last offset it folded, in a table
  changelogged to that partition (:data:`positions key <position_key>`), so a restarted
  worker knows where its predecessor got to;
- a record that arrives past ``last + 1`` means the ones between were skipped
  (:func:`skipped`): :class:`ReadBack` reads them from Kafka with a plain consumer (no
  group; it commits nothing) and the agent folds them first, in offset order.

Folding is idempotent (each slot dedupes by event id), so a record read back that was in
fact folded derives nothing; a gap Kafka itself left (no record at some offsets) reads
back as nothing. Records the broker no longer holds (retention) cannot be read back:
:attr:`ReadBack.unreadable` counts them, and the agent says so on its log.

Time semantics: offsets only; the read-back waits at most ``timeout_s`` for the broker.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from aiokafka import AIOKafkaConsumer, TopicPartition


def position_key(topic: str, partition: int) -> bytes:
    """The positions table's key of a partition of an input topic."""
    return f"{topic}:{partition}".encode()


def skipped(last: bytes | None, offset: int) -> range:
    """The offsets between the last folded one (the table's bytes, None: nothing folded
    yet on this partition) and ``offset``: empty unless records were skipped. A record at
    or before ``last`` is a redelivery (at-least-once), not a gap."""
    if last is None:
        return range(0)
    return range(int(last) + 1, offset)


class ReadBack:
    """Reads ranges of offsets of one partition back from Kafka (one consumer, opened on
    first use, assigned partition by partition; no consumer group)."""

    def __init__(self, bootstrap: str | Sequence[str], timeout_s: float = 30.0) -> None:
        self.bootstrap = bootstrap
        self.timeout_s = timeout_s
        #: offsets asked for that the broker no longer held (deleted by retention)
        self.unreadable = 0
        self._consumer: AIOKafkaConsumer | None = None

    async def records(self, topic: str, partition: int, wanted: range) -> list[tuple[int, bytes]]:
        """The ``(offset, value)`` records at ``wanted`` offsets, in offset order."""
        if not wanted:
            return []
        consumer = await self._open()
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        consumer.seek(tp, wanted.start)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        out: list[tuple[int, bytes]] = []
        first: int | None = None
        while await consumer.position(tp) < wanted.stop:
            if loop.time() > deadline:
                raise TimeoutError(
                    f"reading back {topic}:{partition} offsets {wanted.start}-{wanted.stop - 1}: "
                    f"got {len(out)} records in {self.timeout_s:.0f} s"
                )
            batch = await consumer.getmany(tp, timeout_ms=500)
            for rec in batch.get(tp, ()):
                if first is None:
                    first = rec.offset
                if rec.offset >= wanted.stop:
                    break
                out.append((rec.offset, rec.value))
        if first is not None and first > wanted.start:  # the broker no longer holds them
            self.unreadable += min(first, wanted.stop) - wanted.start
        return out

    async def _open(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            consumer = AIOKafkaConsumer(
                bootstrap_servers=self.bootstrap,
                group_id=None,
                enable_auto_commit=False,
                auto_offset_reset="earliest",  # past retention: from what is left
            )
            await consumer.start()
            self._consumer = consumer
        return self._consumer

    async def close(self) -> None:
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            await consumer.stop()

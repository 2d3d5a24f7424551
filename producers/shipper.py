"""The log shipper: forward a producer's local embedded log (its durable spool) to Kafka.

Producers on a machine write to a local embedded log first (durable, no network on the
hot path, and the record a resume gate reads back); the shipper tails that spool and
appends every record, unchanged (same key, same bytes), to the same topic on Kafka with
acks=all. Its position per topic is committed only after Kafka acknowledged, so a crash
re-ships the uncommitted tail: at-least-once, and consumers deduplicate by ``event_id``.

Order: records of one topic are shipped in spool order, so one run's events keep their
order on its partition.
"""

from __future__ import annotations

from collections.abc import Sequence

from events.log.base import LogBackend
from events.log.embedded import EmbeddedLog

#: The consumer group under which the shipper's spool positions are stored.
GROUP = "runwatch-shipper"


async def ship_once(
    spool: EmbeddedLog, target: LogBackend, topics: Sequence[str], batch: int = 2000
) -> int:
    """Ship everything new in ``topics`` of the spool; the number of records shipped."""
    positions = spool.load_positions(GROUP)
    shipped = 0
    for topic in topics:
        start = positions.get(topic, 0)
        pending: list[tuple[bytes | None, bytes]] = []
        end = start
        for rec in spool.read_sync(topic, start):
            pending.append((rec.key, rec.value))
            end = rec.offset + 1
            if len(pending) >= batch:
                await target.append_many(topic, pending)
                shipped += len(pending)
                pending = []
                positions[topic] = end
                spool.commit_positions(GROUP, positions)
        if pending:
            await target.append_many(topic, pending)
            shipped += len(pending)
        if end != start:
            positions[topic] = end
            spool.commit_positions(GROUP, positions)
    return shipped

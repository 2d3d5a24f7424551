"""The live follower: tail a host's input topics on any log backend.

The loop around :class:`~runwatch.hosting.host.Host` for a live consumer group over
:class:`events.log.base.LogBackend` (Kafka or the embedded log): poll a batch, apply it,
optionally publish the derived events (the read model's: RunStateChanged) to their
topics, commit the host's state (the read model: view + positions in one transaction),
then commit the consumer group. A crash anywhere re-delivers the
uncommitted tail; records before the stored positions are skipped, and re-published
derived events carry the same deterministic ids, so downstream consumers deduplicate.

Host-side time (never seen by the folds): ``settle_s`` is how long the follower waits,
once caught up (a poll came back empty), before releasing terminal events still held at
the terminal barrier (:mod:`runwatch.hosting.barrier`) — it covers detector lag, so an alert
computed from a run's last steps is folded before the run's end. It is also the longest
a run stays held by the follower's clock while the log keeps it busy: a plane where other
runs write telemetry without pause never came back empty, and where no alert, reward or
checkpoint fact moved the watermarks past a gate's ``RunPaused`` it was never shown
(found by review: no ``PAUSED_BY_GATE``, the customer's webhook never told, the resume
refused "not paused").
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from events.envelope import EventBase
from events.log.base import LogBackend
from runwatch.hosting.host import Host

DEFAULT_GROUP = "runwatch-projections"


async def publish(backend: LogBackend, events: Sequence[EventBase]) -> None:
    from events.codec import records_by_topic

    for topic, records in records_by_topic(events).items():
        await backend.append_many(topic, records)


async def follow(
    backend: LogBackend,
    host: Host,
    stop: asyncio.Event,
    *,
    group_id: str = DEFAULT_GROUP,
    publish_to: LogBackend | None = None,
    settle_s: float = 1.0,
    max_records: int = 5000,
    poll_timeout_s: float = 0.2,
    on_batch: Callable[[int, list[EventBase]], None] | None = None,
) -> None:
    """Run until ``stop`` is set. ``publish_to``: append derived events there (usually
    the same backend); ``on_batch(n_records, derived)`` is called after each commit."""
    consumer = await backend.consumer(group_id, list(host.folds.topics))
    positions = getattr(consumer, "positions", None)
    if isinstance(positions, dict):  # the embedded consumer: start from the store's positions
        for (topic, _), offset in host.positions.items():
            if topic in positions:
                positions[topic] = max(positions[topic], offset)
    loop = asyncio.get_running_loop()
    idle_since: float | None = None
    held_since: dict[str, float] = {}  # run id -> when the follower first saw it held
    try:
        while not stop.is_set():
            records = await consumer.poll(max_records, timeout_s=poll_timeout_s)
            derived = host.process(records) if records else []
            released = False
            now = loop.time()
            if records:
                idle_since = None
            elif host.held:
                idle_since = idle_since if idle_since is not None else now
                if now - idle_since >= settle_s:
                    derived, released = host.release_held(force=True), True
            overdue = _held_too_long(host.held, held_since, now, settle_s)
            if overdue:
                derived += host.release_held(force=True, only=overdue)
                released = True
            if not records and not released:
                continue
            if derived and publish_to is not None:
                await publish(publish_to, derived)
            host.checkpoint()
            await consumer.commit()
            if on_batch is not None:
                on_batch(len(records), derived)
    finally:
        await consumer.close()


def _held_too_long(
    held: dict[str, object], since: dict[str, float], now: float, settle_s: float
) -> frozenset[str]:
    """The runs held at least ``settle_s`` by the follower's clock (``since`` keeps when
    each was first seen held, forgetting those released)."""
    for rid in [r for r in since if r not in held]:
        del since[rid]
    for rid in held:
        since.setdefault(rid, now)
    return frozenset(r for r, t in since.items() if now - t >= settle_s)

"""The tail of a trajectory API instance: log -> fold -> view -> answers.

:class:`Tail` is mixed into :class:`runwatch.apps.trajectories.TrajectoryHost`: it reads
the run's partition from the host's start offset forever (Kafka: a long-polling reader;
the embedded log: woken by the host's own appends, else polled every 10 ms), folds each
record of the run through the one host's core (decode, dedupe by event id, the batching
fold), applies it and what it derived to the view, publishes what this incarnation's own
inputs derived, and answers the request waiting on it. It marks the host ready once it
has caught up with the offset of the host's start marker, and snapshots when one is due.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from events.catalog.trajectory import (
    TRAJECTORIES_TOPIC,
    ScoredDataGroupAccepted,
    ScoredDataGroupStored,
    TrajectoryBatchRequested,
    TrajectoryBatchServed,
    TrajectoryBatchUnavailable,
    TrajectoryEnvRegistered,
    TrajectoryGroupBuffered,
)
from events.dead_letter import DeadLetter
from events.envelope import EventBase
from events.fast_decode import decode_fast
from events.log.base import Record

log = logging.getLogger("runwatch.apps.trajectories")


class Tail:
    """The tail side of :class:`~runwatch.apps.trajectories.TrajectoryHost`."""

    backend: Any
    settings: Any
    hosted: Any
    view: Any
    key: bytes
    producer: str
    partition: int | None
    position: int
    start_offset: int
    ready: bool
    ready_offset: int
    skipped: int
    snapshot_path: Any
    _own: dict[int, EventBase]
    _wake: asyncio.Event
    _ready_event: asyncio.Event
    _waiters: dict[str, asyncio.Future[Any]]
    _outbox: asyncio.Queue[EventBase]
    _folded_own_groups: int
    _since_snapshot: int
    _last_value: bytes

    async def _records(self) -> AsyncIterator[Record]:
        read_sync = getattr(self.backend, "read_sync", None)
        if read_sync is None:  # Kafka: a long-polling reader of the partition
            async for rec in self.backend.read(
                TRAJECTORIES_TOPIC, self.partition or 0, self.start_offset, until_end=False
            ):
                yield rec
            return
        position = self.start_offset  # embedded: woken by our own appends, else poll 10 ms
        while True:
            self._wake.clear()
            got = 0
            for rec in read_sync(TRAJECTORIES_TOPIC, position):
                position = rec.offset + 1
                got += 1
                yield rec
            if not got:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), 0.01)

    async def _tail(self) -> None:
        n = 0
        async for rec in self._records():
            self.position = rec.offset + 1
            if rec.key == self.key:
                self._process(rec)
            if not self.ready and rec.offset >= self.ready_offset:
                self.ready = True
                self._ready_event.set()
            self._last_value = rec.value
            self._since_snapshot += 1
            if self.snapshot_path is not None and self._snapshot_due():
                self._snapshot()
            n += 1
            if n % 64 == 0:
                await asyncio.sleep(0)  # let requests in while catching up

    def _process(self, rec: Record) -> None:
        ev = self._own.pop(rec.offset, None) or decode_fast(rec.value)
        if isinstance(ev, DeadLetter) or ev.tenant_id != self.settings.tenant_id:
            self.skipped += 1
            if isinstance(ev, DeadLetter):
                log.warning("skipping undecodable record at offset %s: %s", rec.offset, ev.reason)
            return
        try:  # the fold is pure: a record it cannot take changes nothing
            derived = self.hosted.feed(ev)
            if derived is None:
                return  # a duplicate
            self.view.apply(ev)
            for d in derived:
                self.view.apply(d)
        except Exception as exc:  # a poison record: skipped and said, the tail goes on
            self.skipped += 1
            log.error("skipping record at offset %s the fold cannot take: %r", rec.offset, exc)
            return
        mine = ev.producer == self.producer
        group = isinstance(ev, (ScoredDataGroupStored, ScoredDataGroupAccepted))
        if mine and group and rec.offset > self.ready_offset:
            self._folded_own_groups += 1
        if mine and rec.offset > self.ready_offset:
            for d in derived:
                self._outbox.put_nowait(d)
        if not self._waiters:
            return
        request_id = getattr(ev, "request_id", None) or getattr(ev, "group_id", None)
        fut = self._waiters.get(request_id) if request_id else None
        if fut is None or fut.done():
            return
        if group:
            fut.set_result(
                next((d for d in derived if isinstance(d, TrajectoryGroupBuffered)), None)
            )
        elif isinstance(ev, TrajectoryEnvRegistered):
            fut.set_result(self.view.env_answer(ev.request_id))
        elif isinstance(ev, TrajectoryBatchRequested):
            answer = next(
                d
                for d in derived
                if isinstance(d, (TrajectoryBatchServed, TrajectoryBatchUnavailable))
            )
            fut.set_result(answer)

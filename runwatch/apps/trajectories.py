"""The trajectory API, assembled: ingress router + batching fold + view router, one app.

Wiring (no domain logic here):

1. On start the host appends ``TrajectoryApiStarted`` for its instance to the run's
   ``runwatch.trajectories`` partition (so the batching fold requeues whatever this
   instance's previous incarnation served but never delivered) and learns the partition
   and the offset it must catch up to before serving folded answers.
2. A tail task reads that partition from offset 0, forever. Each record of this run is
   decoded (undecodable records are skipped and counted), deduplicated by ``event_id``,
   folded by :class:`~stream_processors.batching.BatchingFold`, then it and its derived
   events are applied to :class:`~projections.trajectory_view.TrajectoryView`; a request
   this instance is waiting on is answered from there. A record the fold raises on (one
   the API would refuse now, written before or by another producer) is skipped, counted
   and logged: it used to end the tail task, and with it every later ``/batch``.
3. Derived events of this instance's own inputs (from this incarnation on) are published
   to ``runwatch.batches`` in the background, for detectors and dashboards. They are a
   deterministic function of the partition, which stays the source of truth.

Several instances on one broker run the same fold over the same partition, so they
share one state without talking to each other; each answers the requests it appended.
A restart replays the partition (the fold state is rebuilt, payloads of undelivered
groups are spilled again to a local cache), then serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import itertools
import json
import logging
import os
import socket
import uuid
import zlib
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from starlette.middleware.gzip import GZipMiddleware

from events.catalog.trajectory import (
    BATCHES_TOPIC,
    PAYLOADS_TOPIC,
    TRAJECTORIES_TOPIC,
    ScoredDataGroupAccepted,
    ScoredDataGroupStored,
    TrajectoryApiStarted,
    TrajectoryBatchRequested,
    TrajectoryBatchServed,
    TrajectoryBatchUnavailable,
    TrajectoryEnvRegistered,
    TrajectoryGroupBuffered,
)
from events.codec import decode, encode
from events.dead_letter import DeadLetter
from events.dedupe import Deduplicator
from events.envelope import EventBase, new_envelope
from events.log.base import Appended, LogBackend, Record
from events.log.segments import write_atomically
from producers.trajectory_api import AccessMiddleware, BodyBudget, RequestBodyMiddleware
from producers.trajectory_api import build_router as build_ingress
from producers.trajectory_api.once import DEFAULT_WINDOW_GROUPS, InFlight
from producers.trajectory_api.request_body import MAX_BODY_BYTES, MAX_INFLIGHT_BODY_BYTES
from projections.trajectory_view import SpillPayloads, TrajectoryView
from projections.trajectory_view.router import build_router as build_serving
from projections.trajectory_view.store import CorruptPayload
from projections.trajectory_view.view import Location
from runwatch.apps.http_errors import install as install_422
from stream_processors.batching import BatchingFold
from stream_processors.batching.push_keys import (
    PushRecord,
    content_slot,
    idempotency_slot,
    live,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrajectorySettings:
    tenant_id: str = "default"
    run_id: str = "atropos"
    #: Stable name of this API instance (default ``host:port``): a restart under the same
    #: name requeues what the previous incarnation served but never delivered.
    instance: str = ""
    max_off_policy_steps: int | None = None
    max_queue_groups: int = 50_000
    #: The model's vocabulary size: pushed token ids must be below it (None: unchecked).
    vocab_size: int | None = None
    #: Bearer token every request but ``/health`` must carry (None: no authentication;
    #: the CLI requires one when binding beyond loopback).
    token: str | None = field(default=None, repr=False)
    #: Web origins whose pages may call the API (none by default).
    cors_origins: tuple[str, ...] = ()
    #: Largest request body, plain or gzip-inflated (413 beyond it).
    max_body_bytes: int = MAX_BODY_BYTES
    #: Body bytes all requests in flight may hold together (503 + Retry-After beyond it).
    max_inflight_body_bytes: int = MAX_INFLIGHT_BODY_BYTES
    batch_timeout_s: float = 30.0
    gzip_level: int = 1
    #: Where this instance keeps its payload cache and view snapshots (None: a temporary
    #: directory and no snapshots, so a restart replays the run's partition from 0).
    state_dir: str | None = None
    snapshot_every_records: int = 2000
    snapshot_every_s: float = 5.0
    dedupe_window: int = 200_000
    #: Accepted groups after which a push's ``Idempotency-Key`` (and, with
    #: ``dedupe_content``, its groups' digests) is forgotten: a retry later than that is
    #: stored again. Stamped on each keyed group, so every instance forgets alike.
    idempotency_window: int = DEFAULT_WINDOW_GROUPS
    #: Store byte-identical groups once within the window (off: see docs/trajectory-api.md).
    dedupe_content: bool = False


#: Payloads of other instances' groups read ahead of ``/batch`` (at most this many held).
READ_AHEAD_GROUPS = 16


class TrajectoryHost:
    """Hosts the fold and the view over one run's partition; both routers' port."""

    def __init__(self, backend: LogBackend, settings: TrajectorySettings) -> None:
        self.backend = backend
        self.settings = settings
        self.instance = settings.instance or f"{socket.gethostname()}:{os.getpid()}"
        self.producer = f"trajectory-api/{self.instance}"
        self.key = settings.run_id.encode()
        self.max_off_policy_steps = settings.max_off_policy_steps
        self.max_queue_groups = settings.max_queue_groups
        self.vocab_size = settings.vocab_size
        self.dedupe_window = settings.idempotency_window
        self.dedupe_content = settings.dedupe_content
        self.body_budget = BodyBudget(settings.max_inflight_body_bytes)
        self.batch_timeout_s = settings.batch_timeout_s
        self.gzip_level = settings.gzip_level
        self.fold = BatchingFold()
        self.state = self.fold.initial()
        state_dir = Path(settings.state_dir) if settings.state_dir else None
        self.snapshot_path = state_dir / "snapshot.json" if state_dir else None
        payload_dir = state_dir / "payloads" if state_dir else None
        self.view = TrajectoryView(SpillPayloads(payload_dir, keep_files=state_dir is not None))
        self.start_offset = 0
        self.resumed_from: int | None = None
        self._since_snapshot = 0
        self._snapshot_at = 0.0
        self._snapshot_task: asyncio.Task[None] | None = None
        self._last_value = b""
        self.ready = False
        self.partition: int | None = None
        self.ready_offset = 0
        self.position = 0
        self.skipped = 0
        self._seq = itertools.count()
        self._waiters: dict[str, asyncio.Future[Any]] = {}
        self._own: dict[int, EventBase] = {}  # offset -> event this instance appended
        self._dedupe = Deduplicator(settings.dedupe_window)
        self._appended_groups = 0
        self._churn_bytes = 0
        self._folded_own_groups = 0
        self._ready_event = asyncio.Event()
        self._wake = asyncio.Event()
        self._outbox: asyncio.Queue[EventBase] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []
        self._readers: dict[int, PayloadReader] = {}  # payload partition -> reader
        self._read_ahead: dict[str, bytes] = {}  # group id -> payload read ahead of /batch
        self._prefetch: asyncio.Task[None] | None = None
        #: one thread, so the payload cache is written in request order
        self._spill_writer = ThreadPoolExecutor(1, thread_name_prefix="payload-cache")

    # -- the ports the routers use --------------------------------------------------------
    @property
    def started(self) -> bool:
        return self.view.started

    @property
    def step(self) -> int:
        return self.view.step

    @property
    def env_count(self) -> int:
        return len(self.view.envs)

    @property
    def batch_size(self) -> int | None:
        reg = self.view.registration
        return reg.batch_size if reg is not None else None

    def envelope(self) -> dict[str, Any]:
        return new_envelope(
            tenant_id=self.settings.tenant_id,
            run_id=self.settings.run_id,
            producer=self.producer,
            seq=next(self._seq),
        )

    def env_group_size(self, env_id: int | None) -> int | None:
        if env_id is None or not 0 <= env_id < len(self.view.envs):
            return None
        return int(self.view.envs[env_id]["group_size"])

    def pushed(self, key: str) -> PushRecord | None:
        """What the fold kept of an ``Idempotency-Key`` (as folded so far)."""
        return live(self.state.keys, idempotency_slot(key), self.state.arrivals)

    def content_pushed(self, digest: str) -> bool:
        return live(self.state.keys, content_slot(digest), self.state.arrivals) is not None

    def backlog_groups(self) -> int:
        """Queued groups as folded, plus this instance's appended-but-not-folded ones."""
        return len(self.view.queue) + max(0, self._appended_groups - self._folded_own_groups)

    def expect(self, request_id: str) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiters[request_id] = fut
        fut.add_done_callback(lambda _: self._waiters.pop(request_id, None))
        return fut

    async def append(self, events: Sequence[EventBase], groups: int = 0) -> None:
        """Append to the run's partition; returns once the log acknowledged every record."""
        records = [(self.key, encode(ev)) for ev in events]
        self._appended_groups += groups
        self._churn_bytes += sum(len(v) for _, v in records)
        try:
            where = await self.backend.append_many(TRAJECTORIES_TOPIC, records)
        except BaseException:
            self._appended_groups -= groups
            for ev in events:  # nothing will answer requests that never reached the log
                key = getattr(ev, "request_id", None) or getattr(ev, "group_id", None)
                fut = self._waiters.pop(key, None) if key else None
                if fut is not None and not fut.done():
                    fut.cancel()
            self.view.payloads.drop(  # payload bytes no event will ever point at
                [ev.group_id for ev in events if isinstance(ev, ScoredDataGroupStored)]
            )
            raise
        for ev, at in zip(events, where):
            if at.offset >= self.position:  # not folded yet: spare the tail a decode
                self._own[at.offset] = ev
        self._wake.set()

    async def append_payloads(self, payloads: Sequence[tuple[str, bytes, int]]) -> list[Appended]:
        """Append group payloads to the payload topic (one record each) and keep them in
        this instance's payload cache, so serving them needs no read from the log.

        The cache is written on a writer thread while the log acknowledges (the writes
        release the GIL). If the append fails or the request is cancelled, the cached
        copies are dropped once the writer is done with them (no event will point at
        them)."""
        records = [(self.key, p) for _, p, _ in payloads]
        self._churn_bytes += sum(len(p) for _, p in records)
        cached = asyncio.get_running_loop().run_in_executor(
            self._spill_writer, self.view.payloads.put_many, payloads
        )
        done = False
        try:
            where = await self.backend.append_many(PAYLOADS_TOPIC, records, spread=True)
            await asyncio.shield(cached)
            done = True
        finally:
            if not done:
                ids = [gid for gid, _, _ in payloads]

                def forget(written: asyncio.Future[None]) -> None:
                    if not written.cancelled():
                        written.exception()  # seen: the request failed already
                    self.view.payloads.drop(ids)

                cached.add_done_callback(forget)
        return where

    async def batch_body(self, group_ids: tuple[str, ...]) -> bytes:
        """The ``/batch`` body: cached payloads, plus those another instance ingested (or
        this one before a restart lost its cache) read from the payload topic."""
        if self._prefetch is not None and not self._prefetch.done():
            await asyncio.shield(self._prefetch)  # it is reading the oldest groups: these
        remote: dict[str, Location] = {}
        fetched: dict[str, bytes] = {}
        for gid in group_ids:
            if gid in self.view.payloads:
                continue
            ahead = self._read_ahead.pop(gid, None)
            if ahead is not None:
                fetched[gid] = ahead
            else:
                remote[gid] = self.view.locations[gid]
        if remote:
            fetched.update(await self.fetch_payloads(remote))
        if remote or fetched:  # groups of other instances are being served: read ahead
            self._start_read_ahead()
        try:
            return self.view.batch_body(group_ids, fetched)
        except CorruptPayload:  # a damaged cache entry: the log has the bytes
            wanted = {g: self.view.locations[g] for g in group_ids if g in self.view.locations}
            return self.view.batch_body(group_ids, await self.fetch_payloads(wanted))

    def _start_read_ahead(self, groups: int = READ_AHEAD_GROUPS) -> None:
        """Read the payloads the next batches will want from the log in the background:
        the oldest queued groups this instance has no bytes for (FIFO serving)."""
        queue = self.view.queue
        self._read_ahead = {g: b for g, b in self._read_ahead.items() if g in queue}
        wanted: dict[str, Location] = {}
        for gid in itertools.islice(queue, 4 * groups):
            if len(self._read_ahead) + len(wanted) >= groups:
                break
            if gid not in self._read_ahead and gid not in self.view.payloads:
                where = self.view.locations.get(gid)
                if where is not None:
                    wanted[gid] = where
        if wanted:
            self._prefetch = asyncio.create_task(self._read_ahead_task(wanted))

    async def _read_ahead_task(self, wanted: dict[str, Location]) -> None:
        try:
            got = await self.fetch_payloads(wanted)
        except Exception:  # only a head start: /batch reads them itself
            log.debug("reading payloads ahead failed", exc_info=True)
            return
        queue = self.view.queue
        self._read_ahead.update((g, b) for g, b in got.items() if g in queue)

    async def latest_example(self) -> bytes | None:
        view = self.view
        if view.latest is not None or view.latest_ref is None:
            return view.latest
        gid, where = view.latest_ref
        if gid in view.payloads:
            with contextlib.suppress(KeyError):
                return view.payloads.get(gid)
        return (await self.fetch_payloads({gid: where}))[gid]

    async def fetch_payloads(self, wanted: dict[str, Location]) -> dict[str, bytes]:
        """Read payloads from the payload topic by location, checking length and CRC."""
        by_partition: dict[int, dict[int, str]] = {}
        for gid, (partition, offset, _, _) in wanted.items():
            by_partition.setdefault(partition, {})[offset] = gid
        out: dict[str, bytes] = {}
        for partition, offsets in by_partition.items():
            reader = self._readers.get(partition)
            if reader is None:
                reader = self._readers[partition] = PayloadReader(self.backend, partition)
            values = await asyncio.wait_for(reader.read(set(offsets)), self.batch_timeout_s)
            for offset, value in values.items():
                gid = offsets[offset]
                _, _, length, crc = wanted[gid]
                if len(value) != length or zlib.crc32(value) != crc:
                    raise CorruptPayload(f"payload of group {gid} at {partition}/{offset}")
                out[gid] = value
        return out

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        await self.backend.start()
        marker = TrajectoryApiStarted(**self.envelope(), incarnation=uuid.uuid4().hex)
        (where,) = await self.backend.append_many(TRAJECTORIES_TOPIC, [(self.key, encode(marker))])
        self.partition, self.ready_offset = where.partition, where.offset
        await self._resume()
        self.position = self.start_offset
        self._snapshot_at = asyncio.get_running_loop().time()
        self._tasks = [
            asyncio.create_task(self._tail(), name="trajectory-tail"),
            asyncio.create_task(self._publish(), name="trajectory-publish"),
            asyncio.create_task(self._trim_memory(), name="trajectory-trim"),
        ]

    async def wait_ready(self, timeout_s: float | None = None) -> None:
        await asyncio.wait_for(self._ready_event.wait(), timeout_s)

    async def stop(self) -> None:
        if self._prefetch is not None:
            self._prefetch.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._prefetch
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._snapshot_task is not None:
            with contextlib.suppress(Exception):
                await self._snapshot_task
        # the tail stopped between records: snapshot what it folded since the last one
        # (records folded while a snapshot was being written are not snapshotted until
        # the next record comes, so the last of a burst would be replayed on restart)
        if self.snapshot_path is not None and self._since_snapshot and self.partition is not None:
            self._snapshot()
            with contextlib.suppress(Exception):
                await self._snapshot_task
        with contextlib.suppress(Exception):
            await self._flush_outbox()
        for reader in self._readers.values():
            await reader.close()
        await self.backend.close()
        self._spill_writer.shutdown(wait=True)
        self.view.payloads.close()

    # -- the tail: log -> fold -> view -> answers ----------------------------------------
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
        ev = self._own.pop(rec.offset, None) or decode(rec.value)
        if isinstance(ev, DeadLetter) or ev.tenant_id != self.settings.tenant_id:
            self.skipped += 1
            if isinstance(ev, DeadLetter):
                log.warning("skipping undecodable record at offset %s: %s", rec.offset, ev.reason)
            return
        if not self._dedupe.first_time(ev.event_id):
            return
        try:  # the fold is pure: a record it cannot take changes nothing
            self.state, derived = self.fold.apply(self.state, ev)
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

    # -- snapshots: restart without replaying the whole partition -----------------------
    def _snapshot_due(self) -> bool:
        if self._snapshot_task is not None and not self._snapshot_task.done():
            return False
        if self._since_snapshot >= self.settings.snapshot_every_records:
            return True
        elapsed = asyncio.get_running_loop().time() - self._snapshot_at
        return self._since_snapshot > 0 and elapsed >= self.settings.snapshot_every_s

    def _snapshot(self) -> None:
        """Capture fold state, view and payload index at the current record boundary
        (synchronously: the fold state is immutable, the view and index are copied, so
        it is consistent), then encode and write it atomically in a thread."""
        assert self.snapshot_path is not None
        snap = {
            "tenant_id": self.settings.tenant_id,
            "run_id": self.settings.run_id,
            "partition": self.partition,
            "offset": self.position,
            "last_crc": zlib.crc32(self._last_value),
            "view": self.view.dump(),
            "payloads": self.view.payloads.dump_index(),
        }
        state, path, fold = self.state, self.snapshot_path, self.fold

        def encode_and_write() -> None:
            snap["fold"] = fold.dump_state(state).decode()
            write_atomically(path, json.dumps(snap, separators=(",", ":")).encode())

        self._since_snapshot = 0
        self._snapshot_at = asyncio.get_running_loop().time()
        self._snapshot_task = asyncio.create_task(asyncio.to_thread(encode_and_write))

    async def _resume(self) -> None:
        """Start from this instance's last snapshot if it belongs to this log: same run,
        same partition, not past the start marker, and the record just before its offset
        is the one it last folded (a recreated log fails that check)."""
        path = self.snapshot_path
        if path is None:
            return
        if not path.exists():
            self.view.payloads.load_index({"entries": {}})  # no snapshot: stale files go
            return
        try:
            snap = json.loads(path.read_bytes())
            offset = int(snap["offset"])
            fits = (
                snap["tenant_id"] == self.settings.tenant_id
                and snap["run_id"] == self.settings.run_id
                and snap["partition"] == self.partition
                and offset <= self.ready_offset
                and snap["payloads"] is not None
                and (offset == 0 or await self._crc_at(offset - 1) == snap["last_crc"])
            )
            if fits:
                self.state = self.fold.load_state(snap["fold"].encode())
                self.view.load(snap["view"])
                self.view.payloads.load_index(snap["payloads"])
                self.start_offset = self.resumed_from = offset
                return
            log.warning("snapshot %s does not match this log; replaying from 0", path)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("unreadable snapshot %s (%s); replaying from 0", path, exc)
        self.state = self.fold.initial()
        self.view.reset()
        self.view.payloads.load_index({"entries": {}})

    async def _crc_at(self, offset: int) -> int | None:
        records = self.backend.read(TRAJECTORIES_TOPIC, self.partition or 0, offset)
        async with contextlib.aclosing(records) as it:  # type: ignore[type-var]
            async for rec in it:
                return zlib.crc32(rec.value) if rec.offset == offset else None
        return None

    async def _trim_memory(self, every_s: float = 0.5, churn_bytes: int = 8 << 20) -> None:
        """Give freed heap pages back to the OS after heavy pushes: request bodies and
        payload copies are large, short-lived and interleaved with long-lived objects, so
        glibc would otherwise keep the peak forever (RSS is a budget, seed 004).

        Only once a burst is over (nothing appended for ``every_s``): while pushes go on,
        the freed pages are used again at once, and handing them back only makes the next
        requests fault them in again (page faults are dear on a VM)."""
        try:
            trim = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            return
        seen = self._churn_bytes
        while True:
            await asyncio.sleep(every_s)
            # quiet: less than 1/8 of the threshold appended since the last look (a
            # trainer's polls and small events do not hold the trim off)
            quiet, seen = self._churn_bytes - seen < churn_bytes // 8, self._churn_bytes
            if quiet and self._churn_bytes >= churn_bytes:
                self._churn_bytes = seen = 0
                trim(0)

    async def _publish(self) -> None:
        while True:
            first = await self._outbox.get()
            batch = [first]
            while not self._outbox.empty() and len(batch) < 500:
                batch.append(self._outbox.get_nowait())
            try:
                await self.backend.append_many(BATCHES_TOPIC, [(e.key(), encode(e)) for e in batch])
            except Exception:
                log.exception("publishing %d derived trajectory events failed", len(batch))

    async def _flush_outbox(self) -> None:
        batch = []
        while not self._outbox.empty():
            batch.append(self._outbox.get_nowait())
        if batch:
            await self.backend.append_many(BATCHES_TOPIC, [(e.key(), encode(e)) for e in batch])


class PayloadReader:
    """Reads payload records of one partition by offset. ``/batch`` serves oldest groups
    first, so wanted offsets mostly grow: one open reader moves forward through them and
    is reopened only to go back or to jump a gap of more than ``reopen_gap`` records."""

    def __init__(self, backend: LogBackend, partition: int, reopen_gap: int = 256) -> None:
        self.backend = backend
        self.partition = partition
        self.reopen_gap = reopen_gap
        self._it: AsyncIterator[Record] | None = None
        self._next = 0
        self._lock = asyncio.Lock()

    async def read(self, offsets: set[int]) -> dict[int, bytes]:
        async with self._lock:
            lo = min(offsets)
            if self._it is None or not self._next <= lo <= self._next + self.reopen_gap:
                await self._close()
                self._it = aiter(self.backend.read(PAYLOADS_TOPIC, self.partition, lo, False))
                self._next = lo
            out: dict[int, bytes] = {}
            hi = max(offsets)
            try:
                while len(out) < len(offsets):
                    rec = await anext(self._it)
                    self._next = rec.offset + 1
                    if rec.offset in offsets:
                        out[rec.offset] = rec.value
                    elif rec.offset > hi:  # deleted (retention) or never there
                        missing = sorted(offsets - out.keys())
                        raise LookupError(f"payload records {missing} are not on the log")
            except BaseException:  # timeout, cancel, broker gone: start afresh next time
                await self._close()
                raise
            return out

    async def close(self) -> None:
        async with self._lock:
            await self._close()

    async def _close(self) -> None:
        it, self._it = self._it, None
        if it is not None:
            with contextlib.suppress(Exception):
                await it.aclose()  # type: ignore[attr-defined]


def build_app(host: TrajectoryHost) -> FastAPI:
    """The Atropos-compatible app over ``host`` (started and stopped with the app)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await host.start()
        try:
            yield
        finally:
            await host.stop()

    settings = host.settings
    app = FastAPI(title="AtroposLib API (runwatch)", lifespan=lifespan)
    # the last added runs first: CORS (preflights answered, allowed origins' answers
    # readable), then access (token, foreign pages, Host) before a body byte is read, then
    # the bounded body, then response gzip
    app.add_middleware(GZipMiddleware, minimum_size=1000, compresslevel=host.gzip_level)
    app.add_middleware(
        RequestBodyMiddleware, max_bytes=settings.max_body_bytes, budget=host.body_budget
    )
    app.add_middleware(
        AccessMiddleware, token=settings.token, allowed_origins=settings.cors_origins
    )
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(settings.cors_origins),
            allow_credentials=False,  # the token is a header, not a cookie
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type", "Content-Encoding"],
            max_age=600,
        )
    inflight = InFlight()
    app.include_router(build_ingress(host, inflight))
    app.include_router(build_serving(host))
    app.state.host = host
    app.state.inflight = inflight
    return install_422(app)


def open_backend(kafka: str | None, log_dir: str | None) -> LogBackend:
    """Kafka when a bootstrap address is given, else the embedded log at ``log_dir``."""
    if kafka:
        from events.log.kafka import KafkaLog

        # no linger: every append is one request's worth already, and a client waits on it
        return KafkaLog(kafka, client_id="runwatch-trajectories", producer_config={"linger_ms": 0})
    from events.log.embedded import EmbeddedLog
    from runwatch.settings import log_dir as default_log_dir

    return EmbeddedLog(default_log_dir(log_dir))

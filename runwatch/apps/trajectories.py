"""The trajectory API, assembled: ingress router + batching fold + view router, one app.

Wiring (no domain logic here):

1. On start the host appends ``TrajectoryApiStarted`` for its instance to the run's
   ``runwatch.trajectories`` partition (so the batching fold requeues whatever this
   instance's previous incarnation served but never delivered) and learns the partition
   and the offset it must catch up to before serving folded answers.
2. A tail task reads that partition from offset 0, forever. Each record of this run is
   decoded (the hosts' fast decoder; undecodable records are skipped and counted),
   deduplicated by ``event_id`` and folded by :class:`~stream_processors.batching.
   BatchingFold` in the one host's core (:class:`runwatch.hosting.core.HostedFold`: one
   key, the run; ``dedupe_window`` ids remembered), then it and its derived
   events are applied to :class:`~projections.trajectory_view.TrajectoryView`; a request
   this instance is waiting on is answered from there. A record the fold raises on (one
   the API would refuse now, written before or by another producer) is skipped, counted
   and logged: it used to end the tail task, and with it every later ``/batch``. A
   failure of the tail itself (the log cannot be read: out of file descriptors, a broker
   away) is logged and the tail restarted where it stopped, after a pause that doubles
   from 50 ms to 5 s while the failures go on (:meth:`TrajectoryHost._follow`); it used to
   end the task silently, pushes still answered 200 and ``/health`` still said ready
   while every ``/batch`` timed out. A background task that ends anyway is logged and
   makes the host unhealthy (:meth:`TrajectoryHost.health_problem`: ``/health`` 503).
3. Derived events of this instance's own inputs (from this incarnation on) are published
   to ``runwatch.batches`` in the background, for detectors and dashboards. They are a
   deterministic function of the partition, which stays the source of truth.

Several instances on one broker run the same fold over the same partition, so they
share one state without talking to each other; each answers the requests it appended.
A restart replays the partition (the fold state is rebuilt, payloads of undelivered
groups are spilled again to a local cache), then serves — or resumes from its snapshot
(:mod:`runwatch.apps.trajectory_snapshots`). Payloads: :mod:`runwatch.apps.
trajectory_payloads`; the app around the host: :mod:`runwatch.apps.trajectory_app`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import socket
import uuid
from collections import deque
from collections.abc import AsyncIterator, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from events.catalog.trajectory import (
    BATCHES_TOPIC,
    TRAJECTORIES_TOPIC,
    ScoredDataGroupStored,
    TrajectoryApiStarted,
)
from events.codec import encode
from events.envelope import EventBase, new_envelope
from events.log.base import LogBackend, Record
from producers.trajectory_api import BodyBudget
from projections.trajectory_view import SpillPayloads, TrajectoryView
from runwatch.apps.memory_trim import Churn, trim_memory
from runwatch.apps.trajectory_payloads import PayloadReader, Payloads
from runwatch.apps.trajectory_settings import TrajectorySettings
from runwatch.apps.trajectory_snapshots import Snapshots
from runwatch.apps.trajectory_tail import Tail
from runwatch.hosting.core import HostedFold
from stream_processors.batching import BatchingFold
from stream_processors.batching.push_keys import (
    PushRecord,
    content_slot,
    idempotency_slot,
    live,
)

log = logging.getLogger(__name__)

#: First and longest pause before the tail is restarted after a failure (doubling between).
TAIL_RETRY_S = (0.05, 5.0)
#: The tail is stalled when a record this instance appended has waited this long to be
#: folded and the tail has not moved meanwhile (``/health`` 503). A healthy tail folds a
#: record within milliseconds; one catching up moves.
TAIL_STALL_S = 10.0


class TrajectoryHost(Tail, Payloads, Snapshots):
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
        #: the batching fold in the one host's core (:mod:`runwatch.hosting.core`): one
        #: key, the run; ids remembered over ``dedupe_window`` events
        self.hosted = HostedFold(BatchingFold(), window=settings.dedupe_window)
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
        self._appended_groups = 0
        self.churn = Churn()  # bytes appended, for the memory trim
        self._folded_own_groups = 0
        self._ready_event = asyncio.Event()
        self._wake = asyncio.Event()
        self._outbox: asyncio.Queue[EventBase] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        #: why a background task ended (None: all running), see :meth:`_task_ended`
        self.dead: str | None = None
        #: failures of the tail in a row (0: reading), and the last one
        self.tail_failures = 0
        self.tail_error: str | None = None
        self.tail_stall_s = TAIL_STALL_S
        #: (last offset of an append of this instance, when acknowledged), oldest first,
        #: while not folded; and the tail's position when last seen, since when
        self._unfolded: deque[tuple[int, float]] = deque()
        self._seen = (0, 0.0)
        self._readers: dict[int, PayloadReader] = {}  # payload partition -> reader
        self._read_ahead: dict[str, bytes] = {}  # group id -> payload read ahead of /batch
        self._prefetch: asyncio.Task[None] | None = None
        #: one thread, so the payload cache is written in request order
        self._spill_writer = ThreadPoolExecutor(1, thread_name_prefix="payload-cache")

    # -- the fold's state ----------------------------------------------------------------
    @property
    def state(self) -> Any:
        """The batching fold's state, as folded so far."""
        return self.hosted.state_for(self.settings.run_id)

    @state.setter
    def state(self, value: Any) -> None:
        self.hosted.put_state(self.settings.run_id, value)

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
        self.churn.bytes += sum(len(v) for _, v in records)
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
        if where:
            now = asyncio.get_running_loop().time()
            self._unfolded.append((where[-1].offset, now))
            self._observe(now)
        self._wake.set()

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
            self._background(self._follow(), "trajectory-tail"),
            self._background(self._publish(), "trajectory-publish"),
            self._background(trim_memory(self.churn), "trajectory-trim"),
        ]

    async def wait_ready(self, timeout_s: float | None = None) -> None:
        await asyncio.wait_for(self._ready_event.wait(), timeout_s)

    async def stop(self) -> None:
        self._stopping = True
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

    # -- the background tasks, watched --------------------------------------------------
    def _background(self, work: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(work, name=name)
        task.add_done_callback(self._task_ended)
        return task

    def _task_ended(self, task: asyncio.Task[None]) -> None:
        """A background task runs until :meth:`stop` (the memory trim may return at once:
        no ``malloc_trim``); one that fails or is cancelled before is logged with its
        exception and makes the host unhealthy for good (``/health`` 503)."""
        if self._stopping or (not task.cancelled() and task.exception() is None):
            return
        exc = None if task.cancelled() else task.exception()
        self.dead = f"{task.get_name()} ended: {repr(exc) if exc else 'cancelled'}"
        log.error("trajectory API background task %s", self.dead, exc_info=exc)

    async def _follow(self) -> None:
        """The tail (:meth:`Tail._tail`), restarted after each failure where it stopped.

        The tail sets ``position`` past a record before it folds it, so the reader
        restarts at the first record it has not taken: a failure to read loses nothing (a
        failure while taking one, which the fold's own guard does not catch, is logged
        with its offset and not retried). Each failure is logged; the pause before the
        next try doubles while the tail fails before reading a record
        (:data:`TAIL_RETRY_S`)."""
        pause = TAIL_RETRY_S[0]
        while True:
            try:
                await self._tail()
                raise EOFError("the log's reader ended")  # (never: it waits for records)
            except Exception as exc:
                if self.tail_failures == 0:
                    pause = TAIL_RETRY_S[0]
                self.tail_failures += 1
                self.tail_error = f"{type(exc).__name__}: {exc}"
                self.start_offset = self.position
                log.error(
                    "trajectory tail failed at offset %d (%d in a row), retrying in %.2f s: %s",
                    self.position, self.tail_failures, pause, self.tail_error,
                    exc_info=self.tail_failures == 1,
                )  # fmt: skip
                await asyncio.sleep(pause)
                pause = min(2 * pause, TAIL_RETRY_S[1])

    async def _records(self) -> AsyncIterator[Record]:
        """The tail's records; the first read after failures says the tail recovered."""
        async for rec in super()._records():
            if self.tail_failures:
                log.warning(
                    "trajectory tail reading again at offset %d after %d failures",
                    rec.offset, self.tail_failures,
                )  # fmt: skip
                self.tail_failures = 0
            yield rec

    def _observe(self, now: float) -> None:
        """Note whether the tail moved since last seen; forget the appends it folded."""
        if self.position != self._seen[0]:
            self._seen = (self.position, now)
        while self._unfolded and self._unfolded[0][0] < self.position:
            self._unfolded.popleft()

    def health_problem(self) -> str | None:
        """Why this instance should not be sent traffic, or None (``/health``).

        Dead: a background task ended (:meth:`_task_ended`). Stalled: a record this
        instance appended has not been folded ``tail_stall_s`` after it was acknowledged,
        and the tail's position has not changed for as long (seen at appends and
        ``/health`` calls, so a stall is noticed at most one probe late, never early)."""
        if self.dead is not None:
            return self.dead
        now = asyncio.get_running_loop().time()
        self._observe(now)
        if not self._unfolded:
            return None
        waited = now - max(self._unfolded[0][1], self._seen[1])
        if waited < self.tail_stall_s:
            return None
        failing = f"; last error: {self.tail_error}" if self.tail_failures else ""
        return (
            f"trajectory tail stalled at offset {self.position}: no progress for "
            f"{waited:.1f} s while offset {self._unfolded[0][0]} waits to be folded{failing}"
        )

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

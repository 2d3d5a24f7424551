"""Publishing off the training thread: bounded, asynchronous, never raising, never losing.

A :class:`Publisher` owns one worker thread. The training thread calls :meth:`submit`
with a *job* (a function returning the events of one fact); that is a ``put_nowait`` on a
bounded queue and nothing else, so a hook costs the training loop microseconds whatever
the log is doing. The queue is a ``deque`` the worker *polls* every ``poll_s`` (200 ms):
submitting never wakes a sleeping thread (that alone costs the caller tens of
microseconds), and a few steps' facts travel together (one write, not one per fact).
The worker builds the events (in submission order, so a producer's ``seq`` stays
monotonic), then delivers each batch:

- **direct**: to the target log (Kafka: acks=all; or an embedded log directory), waiting
  at most ``write_timeout_s`` per write (``connect_timeout_s`` to connect: a first
  connection creates the registry's topics, slow on a busy broker);
- **spooling**: when a direct write fails or times out, the batch and everything after
  it goes to a local *spool* (an embedded log directory, fsync'd) and a warning says so
  once ("log unreachable, buffering to SPOOL"). Every ``retry_s`` (backing off to
  ``max_retry_s``, :data:`MAX_RETRY_S` = 2 s) the worker ships the spool to the target
  with the shipper (:mod:`producers.shipper`: same keys and bytes, positions committed
  after the ack); once the spool is drained it writes directly again and says so once. A
  spool left by an earlier process (it crashed while the log was away) is shipped first.
  :meth:`Publisher.retry_now` (the hook's command reader, when it reaches the log again)
  ships at once instead of waiting out the back-off. The back-off was 15 s at most; found
  by review (F2): a gate's pause then landed 9.7 s after the gateway was back, because
  the facts it needed were still waiting in the spool.
- **out of touch**: :attr:`Publisher.undelivered_since` is when the worker last became
  unable to deliver (the start of the write that failed; None while it delivers), and
  :attr:`Publisher.delivered_at` when it last drained a spool: what a hook's
  ``pause_when_unmonitored_s`` (:mod:`producers.hooks.unmonitored`) is judged by. Both
  are ``time.monotonic()``; the worker never waits on them.

Guarantees and their assumptions:

- Nothing is lost while the spool's disk works: an event is written to the target or to
  the spool before it counts as delivered. Delivery is at-least-once: a write that timed
  out may still land, and the shipper re-ships an unacknowledged tail; every event
  keeps its ``event_id`` so consumers deduplicate.
- Bounded memory: at most ``queue_size`` facts wait. If the worker falls that far behind
  (the spool's disk is failing too), further facts are dropped, counted in
  :attr:`Stats.dropped` and warned about once — the one case that loses events, chosen
  over blocking the training loop.
- Order: one producer's events reach each topic in the order they were submitted
  (direct and spooled writes never interleave: the worker drains the spool before it
  writes directly again).
- A job that raises (a bad metric value) is counted in :attr:`Stats.failed_jobs` and
  logged once per error type; it never reaches the training thread.

Time semantics: timeouts and back-off are wall-clock seconds of this process.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from events.codec import records_by_topic
from events.envelope import EventBase
from events.log.base import LogBackend
from events.log.embedded import EmbeddedLog
from producers.shipper import GROUP, ship_once

log = logging.getLogger("runwatch.hooks")

#: The longest pause between two tries to ship the spool (the back-off's cap): commands
#: a gate wrote about the shipped facts are read within about this of the log's return.
MAX_RETRY_S = 2.0

#: A job: called on the worker thread, returns the events of one fact.
Job = Callable[[], Sequence[EventBase]]


@dataclass
class Stats:
    """Counters of one publisher (events unless named otherwise)."""

    submitted_jobs: int = 0
    built: int = 0
    written: int = 0
    spooled: int = 0
    shipped_from_spool: int = 0
    dropped: int = 0
    failed_jobs: int = 0
    outages: int = 0
    mode: str = "direct"
    left_in_spool: int = 0
    notices: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Target:
    """Where events go: opened lazily, re-opened after a failure."""

    def __init__(self, describe: str, factory: Callable[[], LogBackend]) -> None:
        self.describe = describe
        self.factory = factory

    @classmethod
    def kafka(cls, bootstrap: str, timeout_s: float) -> Target:
        def make() -> LogBackend:
            from events.log.kafka import KafkaLog  # aiokafka only when used

            ms = int(timeout_s * 1000)
            return KafkaLog(
                bootstrap,
                client_id="runwatch-hook",
                producer_config={"request_timeout_ms": ms, "linger_ms": 5},
            )

        return cls(f"kafka {bootstrap}", make)

    @classmethod
    def gateway(cls, url: str, api_key: str, timeout_s: float) -> Target:
        """The ingest gateway at ``url`` (``runwatch serve ingest``), as ``api_key``'s tenant."""

        def make() -> LogBackend:
            from producers.hooks.gateway import GatewayLog

            return GatewayLog(url, api_key, timeout_s=timeout_s)

        return cls(f"gateway {url}", make)

    @classmethod
    def embedded(cls, directory: str | os.PathLike[str]) -> Target:
        return cls(f"log {directory}", lambda: EmbeddedLog(directory))


class Publisher:
    """Bounded asynchronous delivery of events to a target with a local spool (see the
    module docstring). ``spool`` is a directory (created on first use)."""

    def __init__(
        self,
        target: Target,
        spool: str | os.PathLike[str],
        *,
        queue_size: int = 10_000,
        max_batch: int = 512,
        poll_s: float = 0.2,
        write_timeout_s: float = 10.0,
        connect_timeout_s: float = 30.0,
        retry_s: float = 1.0,
        max_retry_s: float = MAX_RETRY_S,
        name: str = "runwatch-hook",
    ) -> None:
        self.target = target
        self.spool_dir = Path(spool)
        self.max_batch = max_batch
        self.poll_s = poll_s
        self.queue_size = queue_size
        self.write_timeout_s = write_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.retry_s = retry_s
        self.max_retry_s = max_retry_s
        self.stats = Stats()
        self._queue: collections.deque[Job] = collections.deque()
        self._counter = itertools.count()
        self._submitted = 0
        self._wake = threading.Event()
        self._done = 0
        self._cond = threading.Condition()
        self._warned: set[str] = set()
        self._backend: LogBackend | None = None
        self._spool: EmbeddedLog | None = None
        self._next_probe = 0.0
        self._backoff = retry_s
        #: monotonic time since which nothing could be delivered (None: delivering)
        self.undelivered_since: float | None = None
        #: monotonic time the spool was last drained to the target (None: never)
        self.delivered_at: float | None = None
        self._closing = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # -- the training thread's side -------------------------------------------------------
    def submit(self, job: Job) -> bool:
        """Queue one job; ``False`` (and the fact dropped, counted) when the queue is full.
        A ``deque.append``: no lock, and no wake-up of the worker (waking a sleeping thread
        costs the caller tens of microseconds; the worker polls every ``poll_s``)."""
        if len(self._queue) >= self.queue_size:
            self.stats.dropped += 1
            self._say_once(
                "queue-full",
                logging.ERROR,
                f"runwatch hook: {self.queue_size} facts waiting; dropping new ones "
                f"(the spool at {self.spool_dir} is not keeping up)",
            )
            return False
        self._queue.append(job)
        self._submitted = next(self._counter) + 1
        return True

    def retry_now(self) -> None:
        """Ship the spool at the worker's next turn, not after the back-off (the target
        was seen reachable again; called from any thread, never blocks)."""
        if self.stats.mode == "spooling":
            self._backoff = self.retry_s
            self._next_probe = 0.0
            self._wake.set()

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until every job submitted so far is delivered (to the target or the
        spool); ``False`` if ``timeout_s`` passed first."""
        goal = self._submitted
        self._wake.set()
        with self._cond:
            return self._cond.wait_for(lambda: self._done >= goal, timeout=timeout_s)

    def close(self, timeout_s: float = 30.0) -> Stats:
        """Deliver what is queued, ship the spool if the target is back (trying until
        ``timeout_s``), release everything; the final counters. Idempotent."""
        if not self._closing:
            self._closing = True
            deadline = time.monotonic() + timeout_s
            self._closing_deadline = deadline
            self._wake.set()
            self._thread.join(timeout=max(0.0, deadline - time.monotonic()) + 5.0)
        self.stats.submitted_jobs = self._submitted
        return self.stats

    # -- the worker -------------------------------------------------------------------------
    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            if self.spool_dir.is_dir() and (left := self._unshipped()):
                self._enter_spooling(
                    f"runwatch hook: {left} records of an earlier process wait in the spool "
                    f"{self.spool_dir}; shipping them to {self.target.describe} first"
                )
            while True:
                stopping = self._closing
                self._wake.clear()
                jobs = self._take()
                if jobs:
                    events = self._build(jobs)
                    if events:
                        self._deliver(events)
                    with self._cond:
                        self._done += len(jobs)
                        self._cond.notify_all()
                if self.stats.mode == "spooling" and time.monotonic() >= self._next_probe:
                    self._try_ship()
                if not jobs:
                    if stopping:
                        break
                    self._wake.wait(
                        self.poll_s
                        if self.stats.mode == "direct"
                        else min(self.poll_s * 4, self.retry_s)
                    )
            self._finish()
        except BaseException as exc:  # the worker must never die silently
            log.exception("runwatch hook: publisher stopped on %r", exc)
            self.stats.notices.append(f"publisher stopped: {exc!r}")
            with self._cond:
                self._done = 1 << 62
                self._cond.notify_all()
        finally:
            with contextlib.suppress(Exception):
                self._loop.close()

    def _take(self) -> list[Job]:
        """Up to ``max_batch`` queued jobs, oldest first."""
        jobs: list[Job] = []
        pop = self._queue.popleft
        while len(jobs) < self.max_batch:
            try:
                jobs.append(pop())
            except IndexError:
                break
        return jobs

    def _build(self, jobs: list[Job]) -> list[EventBase]:
        events: list[EventBase] = []
        for job in jobs:
            try:
                events.extend(job())
            except Exception as exc:
                self.stats.failed_jobs += 1
                self._say_once(
                    f"job-{type(exc).__name__}",
                    logging.WARNING,
                    f"runwatch hook: a fact could not be turned into events and is skipped "
                    f"({type(exc).__name__}: {str(exc)[:300]}); further such errors are counted",
                )
        self.stats.built += len(events)
        return events

    def _deliver(self, events: list[EventBase]) -> None:
        if self.stats.mode == "direct":
            began = time.monotonic()
            try:
                self._write_target(events)
                self.stats.written += len(events)
                return
            except Exception as exc:
                self._drop_backend()
                why = f"{type(exc).__name__}: {str(exc)[:200] or 'timed out'}"
                self.stats.outages += 1
                self.undelivered_since = began
                self._enter_spooling(
                    f"runwatch hook: {self.target.describe} unreachable ({why}); buffering "
                    f"events to the local spool {self.spool_dir}, shipped when it is back"
                )
                self._next_probe = time.monotonic() + self.retry_s
        self._write_spool(events)

    def _write_target(self, events: Sequence[EventBase]) -> None:
        backend = self._open_backend()
        if isinstance(backend, EmbeddedLog):
            backend.append_events_sync(events)  # keeps the cross-topic order
            return

        async def write() -> None:
            await asyncio.gather(
                *(backend.append_many(t, recs) for t, recs in records_by_topic(events).items())
            )

        self._await(write())

    def _open_backend(self) -> LogBackend:
        if self._backend is None:
            backend = self.target.factory()
            if isinstance(backend, EmbeddedLog):
                backend.open_sync()
            else:
                try:
                    self._await(backend.start(), timeout_s=self.connect_timeout_s)
                except BaseException:
                    with contextlib.suppress(BaseException):
                        self._await(backend.close(), timeout_s=2.0)
                    raise
            self._backend = backend
        return self._backend

    def _drop_backend(self) -> None:
        backend, self._backend = self._backend, None
        if backend is not None and not isinstance(backend, EmbeddedLog):
            with contextlib.suppress(BaseException):
                self._await(backend.close(), timeout_s=2.0)

    def _await(self, coro: Any, timeout_s: float | None = None) -> Any:
        limit = self.write_timeout_s if timeout_s is None else timeout_s
        return self._loop.run_until_complete(asyncio.wait_for(coro, limit))

    def _open_spool(self) -> EmbeddedLog:
        if self._spool is None:
            spool = EmbeddedLog(self.spool_dir)
            spool.open_sync()
            self._spool = spool
        return self._spool

    def _write_spool(self, events: Sequence[EventBase]) -> None:
        self._open_spool().append_events_sync(events)
        self.stats.spooled += len(events)

    def _enter_spooling(self, message: str) -> None:
        """Spool from now on until the spool is shipped; ``message`` says why, once."""
        self.stats.mode = "spooling"
        if self.undelivered_since is None:
            self.undelivered_since = time.monotonic()
        self._backoff = self.retry_s
        self._next_probe = time.monotonic()
        self.stats.notices.append(message)
        log.warning("%s", message)

    def _try_ship(self) -> bool:
        """Ship the spool to the target; back to direct writes once it is drained."""
        try:
            spool = self._open_spool()
            backend = self._open_backend()
            topics = spool.topic_names()
            shipped = self._await(
                ship_once(spool, backend, topics), timeout_s=max(self.write_timeout_s, 30.0)
            )
        except Exception:
            self._drop_backend()
            self._backoff = min(self._backoff * 2, self.max_retry_s)
            self._next_probe = time.monotonic() + self._backoff
            return False
        self.stats.shipped_from_spool += shipped
        self.stats.mode = "direct"
        self.delivered_at = time.monotonic()
        self.undelivered_since = None
        message = (
            f"runwatch hook: {shipped} spooled records shipped from {self.spool_dir} to "
            f"{self.target.describe}; writing to it directly again"
        )
        self.stats.notices.append(message)
        log.warning("%s", message)
        return True

    def _unshipped(self) -> int:
        spool = self._open_spool()
        positions = spool.load_positions(GROUP)
        return sum(
            max(0, spool.end_offset_sync(t) - positions.get(t, 0)) for t in spool.topic_names()
        )

    def _finish(self) -> None:
        deadline = getattr(self, "_closing_deadline", time.monotonic())
        while self.stats.mode == "spooling" and time.monotonic() < deadline:
            if self._try_ship():
                break
            time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
        if self._spool is not None:
            self.stats.left_in_spool = self._unshipped()
        if self.stats.left_in_spool:
            message = (
                f"runwatch hook: {self.stats.left_in_spool} records stay in the spool "
                f"{self.spool_dir} ({self.target.describe} unreachable); the next hook "
                f"started with this spool ships them"
            )
            self.stats.notices.append(message)
            log.warning("%s", message)
        self._drop_backend()

    def _say_once(self, key: str, level: int, message: str) -> None:
        if key in self._warned:
            return
        self._warned.add(key)
        self.stats.notices.append(message)
        log.log(level, "%s", message)

"""Payloads of a trajectory API instance: kept on the log, cached here, read back to serve.

:class:`Payloads` is mixed into :class:`runwatch.apps.trajectories.TrajectoryHost`: a
pushed group's bytes go to the payload topic (one record each) and into this instance's
payload cache at once; ``/batch`` serves cached bytes, and reads the groups another
instance ingested (or this one before a restart lost its cache) from the payload topic by
their location, checking length and CRC (:class:`PayloadReader`), reading ahead of the
next batches in the background.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import zlib
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from events.catalog.trajectory import PAYLOADS_TOPIC
from events.log.base import Appended, LogBackend, Record
from projections.trajectory_view.store import CorruptPayload
from projections.trajectory_view.view import Location
from runwatch.apps.trajectory_settings import READ_AHEAD_GROUPS

log = logging.getLogger("runwatch.apps.trajectories")


class Payloads:
    """The payload side of :class:`~runwatch.apps.trajectories.TrajectoryHost`."""

    backend: LogBackend
    key: bytes
    view: Any
    batch_timeout_s: float
    churn: Any
    _spill_writer: ThreadPoolExecutor
    _prefetch: asyncio.Task[None] | None
    _read_ahead: dict[str, bytes]
    _readers: dict[int, PayloadReader]

    async def append_payloads(self, payloads: Sequence[tuple[str, bytes, int]]) -> list[Appended]:
        """Append group payloads to the payload topic (one record each) and keep them in
        this instance's payload cache, so serving them needs no read from the log.

        The cache is written on a writer thread while the log acknowledges (the writes
        release the GIL). If the append fails or the request is cancelled, the cached
        copies are dropped once the writer is done with them (no event will point at
        them)."""
        records = [(self.key, p) for _, p, _ in payloads]
        self.churn.bytes += sum(len(p) for _, p in records)
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

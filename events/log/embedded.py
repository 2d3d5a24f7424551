"""The embedded log: a directory of file-backed, append-only topics.

It is the single-machine default (no Kafka needed) and the format an auditor takes away
(``runwatch log export`` writes it, ``runwatch log cat`` and ``runwatch replay`` read it).
The format and its crash guarantees are in :mod:`events.log.segments`.

Semantics:

- Every topic has one partition (0), so a topic is totally ordered.
- Reading several topics merges them by append time (``timestamp_ns``, strictly
  increasing per appending process), ties broken by topic name then offset. For one
  appending process this is exactly the order it appended in (a multi-topic batch is
  stamped in the caller's order before it is split by topic); the merge is
  deterministic, so a replay of a copied log sees the same order every time.
  Assumption: a live reader tailing several topics can see a later-stamped record of one
  topic before an earlier-stamped record of another becomes visible (stamps are taken
  under per-topic locks); hosts that need cross-topic order hold back as the projection
  engine's terminal barrier does, and a replay of the finished log is exact.
- Consumer groups store their committed positions in ``_groups/<group>.json``, written
  atomically (temp file, fsync, rename).
- Opening a log writable (:meth:`EmbeddedLog.open_sync`) recovers every topic: a torn
  tail is cut into ``<topic>/quarantine/``, a damaged record inside the log is moved
  there and replaced by a same-length placeholder at its offset (read as a dead letter),
  and damage that cannot be repaired without guessing offsets refuses the open with
  :class:`~events.log.segments.LogDamaged` (see :meth:`TopicLog.recover`). Offsets are
  never reused.
- Reading never writes: ``readonly=True`` (every read command: ``log cat``, ``replay``,
  ``audit verify``, ``profile``, ``serve api`` without ``--publish``) creates, locks,
  truncates and renames nothing — no topic directory, no ``LOCK``, no ``quarantine/``, no
  ``_groups/`` file (a read-only consumer's commits stay in memory) — so a copied,
  read-only or evidence log is left byte-identical. It verifies every record, reads
  stop at the first bad one, and :meth:`EmbeddedLog.torn_tails` says what is skipped.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import os
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from itertools import islice
from operator import itemgetter
from pathlib import Path

from events.codec import decode, encode
from events.dead_letter import DeadLetter
from events.envelope import EventBase
from events.log.base import Appended, LogBackend, LogConsumer, Record
from events.log.segments import (
    DEFAULT_SEGMENT_BYTES,
    RawTuple,
    Recovery,
    TopicLog,
    TornTail,
    monotonic_ns,
    write_atomically,
)
from events.topics import TOPICS

GROUPS_DIR = "_groups"


class EmbeddedLog(LogBackend):
    """A log rooted at a directory: one subdirectory per topic."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        sync: bool = True,
        readonly: bool = False,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
    ) -> None:
        self.root = Path(root)
        self.sync = sync
        self.readonly = readonly
        self.segment_bytes = segment_bytes
        self._topics: dict[str, TopicLog] = {}
        self.recoveries: list[Recovery] = []
        self._opened = False

    # -- sync API (the fast path for single-process hosting and replay) ------------------

    def open_sync(self) -> list[Recovery]:
        """Writable: create the directory, recover every existing topic; what was cut, if
        anything. Read-only: index every topic (a ``FileNotFoundError`` when there is no
        log); nothing is cut, see :meth:`torn_tails` for what reads will skip."""
        if self.readonly:
            if not self.root.is_dir():
                raise FileNotFoundError(f"no embedded log at {self.root}")
        else:
            self.root.mkdir(parents=True, exist_ok=True)
        for name in self.topic_names():
            self._topic(name)
        self._opened = True
        return list(self.recoveries)

    def torn_tails(self, topics: Sequence[str] | None = None) -> list[TornTail]:
        """Per topic (default: every topic on disk), what reads skip past its last good
        record: a torn or corrupt tail a read-only open leaves in place. Changes nothing."""
        found = []
        for name in sorted(topics if topics is not None else self.topic_names()):
            if not (self.root / name).is_dir():
                continue
            tlog = self._topic(name)
            tlog.refresh()
            tail = tlog.torn_tail()
            if tail is not None:
                found.append(tail)
        return found

    def topic_names(self) -> list[str]:
        """Topics that exist on disk, sorted."""
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and p.name != GROUPS_DIR)

    def _topic(self, name: str) -> TopicLog:
        tlog = self._topics.get(name)
        if tlog is None:
            exists = (self.root / name).is_dir()
            if self.readonly and not exists:
                raise FileNotFoundError(f"topic {name!r} not in {self.root}")
            tlog = TopicLog(
                self.root / name,
                sync=self.sync,
                segment_bytes=self.segment_bytes,
                readonly=self.readonly,
            )
            if not self.readonly and not self._opened and exists:
                self.recoveries.extend(tlog.recover())  # a writer's first look repairs
            self._topics[name] = tlog
        return tlog

    def append_many_sync(
        self,
        topic: str,
        records: Sequence[tuple[bytes | None, bytes]],
        timestamps_ns: Sequence[int] | None = None,
    ) -> list[Appended]:
        if self.readonly:
            raise PermissionError(f"embedded log {self.root} is open read-only")
        offsets = self._topic(topic).append(records, timestamps_ns)
        return [Appended(topic, 0, o) for o in offsets]

    def append_sync(self, topic: str, key: bytes | None, value: bytes) -> Appended:
        return self.append_many_sync(topic, [(key, value)])[0]

    def append_events_sync(self, events: Iterable[EventBase]) -> list[Appended]:
        """Encode and append events to their topics: one write per topic, and the
        caller's order kept across topics — every event is stamped in the order given
        before the batch is split by topic, so the merged read order is the given one."""
        by_topic: dict[str, tuple[list[tuple[bytes | None, bytes]], list[int]]] = {}
        for ev in events:
            records, stamps = by_topic.setdefault(type(ev).TOPIC, ([], []))
            records.append((ev.key(), encode(ev)))
            stamps.append(monotonic_ns())
        out: list[Appended] = []
        for topic, (records, stamps) in by_topic.items():
            out.extend(self.append_many_sync(topic, records, stamps))
        return out

    def end_offset_sync(self, topic: str) -> int:
        if not (self.root / topic).is_dir():
            return 0
        tlog = self._topic(topic)
        tlog.refresh()
        return tlog.end_offset

    def read_sync(
        self, topic: str, from_offset: int = 0, max_records: int | None = None
    ) -> Iterator[Record]:
        """Records of ``topic`` from ``from_offset`` to the current end."""
        if not (self.root / topic).is_dir():
            return
        tlog = self._topic(topic)
        tlog.refresh()
        stop = from_offset + max_records if max_records is not None else None
        for chunk in tlog.read_chunks(from_offset, stop):
            for ts, off, key, value in chunk:
                yield Record(topic, 0, off, key, value, ts // 1_000_000)

    def iter_records(
        self,
        topics: Sequence[str] | None = None,
        from_offsets: dict[str, int] | None = None,
        keys: Mapping[str, Callable[[bytes | None], bool]] | None = None,
        to_offsets: dict[str, int] | None = None,
        reached: dict[str, int] | None = None,
    ) -> Iterator[Record]:
        """Records of several topics merged by append time (deterministic; see module doc).

        ``keys``: per topic, only the records whose key its filter accepts (a key-sharded
        reader's filter; applied before the merge, which keeps the order of what is left;
        topics not named are not filtered). ``to_offsets``: stop a topic before that
        offset (default: its current end). ``reached``: filled with each topic's offset
        after the last record read, filtered or not — where the reader stopped, once the
        iterator is exhausted (a bad record ends a topic)."""
        for chunk in self.merged_chunks(topics, from_offsets, keys, to_offsets, reached):
            yield from map(_RECORD, chunk)

    def merged_chunks(
        self,
        topics: Sequence[str] | None = None,
        from_offsets: dict[str, int] | None = None,
        keys: Mapping[str, Callable[[bytes | None], bool]] | None = None,
        to_offsets: dict[str, int] | None = None,
        reached: dict[str, int] | None = None,
    ) -> Iterator[list[tuple[int, str, int, Record]]]:
        """:meth:`iter_records` as chunks of ``(stamp, topic, offset, record)``: each
        record with its merge key in front. The key of a record is the same whatever is
        filtered out (the stamps' running maximum runs over every record of its topic), so
        readers of different key filters can merge what they derived back into one order."""
        names = sorted(topics if topics is not None else self.topic_names())
        starts, stops, filters = from_offsets or {}, to_offsets or {}, keys or {}
        streams = []
        for name in names:
            if not (self.root / name).is_dir():
                continue
            tlog = self._topic(name)
            tlog.refresh()
            chunks = tlog.read_chunks(starts.get(name, 0), stops.get(name))
            streams.append(_keyed(name, chunks, filters.get(name), reached))
        yield from merge_chunks(streams)

    def iter_events(self, topics: Sequence[str] | None = None) -> Iterator[EventBase | DeadLetter]:
        """Decoded events of ``topics`` in merge order; undecodable records come back as
        dead letters stamped with where they were read."""
        for rec in self.iter_records(topics):
            result = decode(rec.value)
            if isinstance(result, DeadLetter):
                result = result.located(rec.topic, rec.partition, rec.offset)
            yield result

    def raw_chunks(self, topic: str, from_offset: int = 0) -> Iterator[list[RawTuple]]:
        """Verified records of ``topic`` from ``from_offset`` to the current end, as lists of
        ``(timestamp_ns, offset, key, value)`` (the append times kept to the nanosecond:
        what a faithful copy of the log needs)."""
        if not (self.root / topic).is_dir():
            return
        tlog = self._topic(topic)
        tlog.refresh()
        yield from tlog.read_chunks(from_offset)

    # -- consumer-group positions --------------------------------------------------------

    def load_positions(self, group_id: str) -> dict[str, int]:
        path = self.root / GROUPS_DIR / f"{group_id}.json"
        try:
            return {str(k): int(v) for k, v in json.loads(path.read_text()).items()}
        except FileNotFoundError:
            return {}

    def commit_positions(self, group_id: str, positions: dict[str, int]) -> None:
        """Atomically replace the group's committed positions (a writer's act)."""
        if self.readonly:
            raise PermissionError(f"embedded log {self.root} is open read-only")
        doc = json.dumps(positions, sort_keys=True).encode()
        write_atomically(self.root / GROUPS_DIR / f"{group_id}.json", doc)

    # -- the async LogBackend interface ---------------------------------------------------

    async def start(self) -> None:
        if self.readonly and not self.root.is_dir():
            self._opened = True  # a follower may start before the log: it reads as empty
            return
        self.open_sync()
        if not self.readonly:
            for name in TOPICS:
                self._topic(name)

    async def close(self) -> None:
        self._topics.clear()

    async def append(self, topic: str, key: bytes | None, value: bytes) -> Appended:
        return self.append_sync(topic, key, value)

    async def append_many(
        self, topic: str, records: Sequence[tuple[bytes | None, bytes]], *, spread: bool = False
    ) -> list[Appended]:
        return self.append_many_sync(topic, records)  # one partition: nothing to spread

    async def partitions(self, topic: str) -> list[int]:
        return [0]

    async def end_offset(self, topic: str, partition: int) -> int:
        return self.end_offset_sync(topic)

    async def read(  # type: ignore[override]
        self, topic: str, partition: int = 0, from_offset: int = 0, until_end: bool = True
    ) -> AsyncIterator[Record]:
        position = from_offset
        while True:
            for rec in self.read_sync(topic, position):
                position = rec.offset + 1
                yield rec
            if until_end:
                return
            await asyncio.sleep(0.05)

    async def consumer(self, group_id: str, topics: Sequence[str]) -> LogConsumer:
        return EmbeddedConsumer(self, group_id, topics)


#: ``_record(Record, (fields...))`` builds a Record without the Python frame of its
#: ``__new__`` (the same tuple, about twice as fast: one per record read)
_record = tuple.__new__


def _keyed(
    name: str,
    chunks: Iterator[list[RawTuple]],
    keys: Callable[[bytes | None], bool] | None,
    reached: dict[str, int] | None,
) -> Iterator[list[_Keyed]]:
    """A topic's records keyed for the merge by the running maximum of their stamps (so
    the stream is sorted even where stamps step back: two appenders racing for the lock, a
    clock stepped back between runs) — the order ``heapq.merge`` gives such a stream, and a
    topic's records always stay in offset order."""
    hi = -1
    for chunk in chunks:
        if reached is not None and chunk:
            reached[name] = chunk[-1][1] + 1
        stamps = [r[0] for r in chunk]
        if stamps and stamps[0] > hi and stamps == sorted(stamps):  # the usual case, in C
            hi = stamps[-1]
            yield [
                (ts, name, off, _record(Record, (name, 0, off, key, value, ts // 1_000_000)))
                for ts, off, key, value in chunk
                if keys is None or keys(key)
            ]
            continue
        out: list[_Keyed] = []
        for ts, off, key, value in chunk:
            hi = max(hi, ts)
            if keys is None or keys(key):
                out.append(
                    (hi, name, off, _record(Record, (name, 0, off, key, value, ts // 1_000_000)))
                )
        yield out


#: A record with its merge key in front: (timestamp_ns, topic, offset, record).
_Keyed = tuple[int, str, int, Record]
_RECORD = itemgetter(3)


def merge_chunks(streams: list[Iterator[list[_Keyed]]]) -> Iterator[list[_Keyed]]:
    """Merge streams of sorted chunks into sorted chunks (the order of ``heapq.merge``).

    Each round emits every buffered item up to the smallest of the buffers' last keys (no
    stream can later produce anything below its own buffer's last key), sorted in one
    ``list.sort`` call: timsort finds the presorted runs and merges them in C, so the
    per-record cost is a slice and a comparison or two instead of a Python heap step."""
    buffers: list[list[_Keyed]] = []
    live = []
    for stream in streams:
        for chunk in stream:
            if chunk:
                buffers.append(chunk)
                live.append(stream)
                break
    while buffers:
        if len(buffers) == 1:
            yield buffers[0]
            yield from (c for c in live[0] if c)
            return
        bound = min(buf[-1] for buf in buffers)
        out: list[_Keyed] = []
        for i, buf in enumerate(buffers):
            cut = bisect.bisect_right(buf, bound)
            if cut == len(buf):
                out += buf
                buffers[i] = next((c for c in live[i] if c), [])
            elif cut:
                out += buf[:cut]
                buffers[i] = buf[cut:]
        out.sort()
        yield out
        live = [s for s, b in zip(live, buffers) if b]
        buffers = [b for b in buffers if b]


class EmbeddedConsumer(LogConsumer):
    """A consumer-group member on the embedded log (one member per group is assumed)."""

    def __init__(self, log: EmbeddedLog, group_id: str, topics: Sequence[str]) -> None:
        self.log = log
        self.group_id = group_id
        self.topics = sorted(topics)
        committed = log.load_positions(group_id)
        self.positions = {t: committed.get(t, 0) for t in self.topics}

    def poll_sync(self, max_records: int = 500) -> list[Record]:
        """Up to ``max_records`` next records across the topics, merged by append time
        (no topic is read further than ``max_records`` past its position)."""
        stops = {t: p + max_records for t, p in self.positions.items()}
        records = self.log.iter_records(self.topics, self.positions, to_offsets=stops)
        batch = list(islice(records, max_records))
        for rec in batch:
            self.positions[rec.topic] = rec.offset + 1
        return batch

    async def poll(self, max_records: int = 500, timeout_s: float = 1.0) -> list[Record]:
        deadline = time.monotonic() + timeout_s
        while True:
            batch = self.poll_sync(max_records)
            if batch or time.monotonic() >= deadline:
                return batch
            await asyncio.sleep(min(0.02, max(0.0, deadline - time.monotonic())))

    async def commit(self) -> None:
        self.commit_sync()

    def commit_sync(self) -> None:
        """Store the positions in ``_groups/``; on a read-only log they are kept in this
        consumer only (a reader never writes the log, so they do not outlive it)."""
        if self.log.readonly:
            return
        merged = self.log.load_positions(self.group_id)
        merged.update(self.positions)
        self.log.commit_positions(self.group_id, merged)

    async def close(self) -> None:
        return None

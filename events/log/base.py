"""The one interface both log backends implement.

A *log* is a set of named topics (declared in :mod:`events.topics`); each topic has one
or more partitions; each partition is an append-only sequence of records addressed by a
dense, zero-based offset. Records carry the event's key (``run_id``) and its encoded
bytes; decoding is the codec's job (:mod:`events.codec`), so a backend never rejects a
record for its content and malformed bytes reach the consumer, which dead-letters them.

Time semantics: ``timestamp_ms`` is the append time as the backend saw it (Kafka's
CreateTime, the embedded log's wall clock). Folds never read it; they use event fields.

Both backends are async so hosting code is written once. The embedded backend also
offers synchronous helpers for the fast single-process replay path.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple


class Record(NamedTuple):
    """One stored record: where it sits, its key and its raw bytes (a NamedTuple: built
    once per consumed record, so it is kept as cheap as possible)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class Appended:
    """Where an appended record landed (returned once the backend acknowledged it)."""

    topic: str
    partition: int
    offset: int


class LogConsumer(abc.ABC):
    """A member of a consumer group reading some topics from its committed positions.

    Assumption: at-least-once. Records after the last :meth:`commit` are delivered
    again after a restart, so consumers deduplicate by ``event_id``
    (:class:`events.dedupe.Deduplicator`).
    """

    @abc.abstractmethod
    async def poll(self, max_records: int = 500, timeout_s: float = 1.0) -> list[Record]:
        """Up to ``max_records`` next records; an empty list once ``timeout_s`` passes."""

    @abc.abstractmethod
    async def commit(self) -> None:
        """Commit the positions just past every record returned so far."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Leave the group; uncommitted positions are not committed."""

    async def __aenter__(self) -> LogConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class LogBackend(abc.ABC):
    """Append, read from an offset, consume as a group, commit."""

    @abc.abstractmethod
    async def start(self) -> None:
        """Connect / open files and make sure every registered topic exists."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Flush pending appends and release connections and file handles."""

    @abc.abstractmethod
    async def append(self, topic: str, key: bytes | None, value: bytes) -> Appended:
        """Append one record and wait until it is durable (Kafka: acks=all)."""

    @abc.abstractmethod
    async def append_many(
        self, topic: str, records: Sequence[tuple[bytes | None, bytes]], *, spread: bool = False
    ) -> list[Appended]:
        """Append many records, pipelined; returns once all are acknowledged, in order.

        ``spread``: the records need no per-key order (each is read back at the place
        this returns), so a backend may put them on any partitions, and spread them over
        several to write them in parallel; their keys are kept."""

    @abc.abstractmethod
    async def partitions(self, topic: str) -> list[int]:
        """The partition numbers of ``topic``."""

    async def partition_of(self, topic: str, key: bytes) -> int | None:
        """The partition a record keyed ``key`` is appended to (where a reader of one key's
        records finds them all); None: this backend does not say (read every partition).
        A backend that partitions by key overrides it with its own partitioner."""
        parts = await self.partitions(topic)
        return parts[0] if len(parts) == 1 else None

    @abc.abstractmethod
    async def end_offset(self, topic: str, partition: int) -> int:
        """The offset the next appended record of that partition will get."""

    @abc.abstractmethod
    def read(
        self, topic: str, partition: int = 0, from_offset: int = 0, until_end: bool = True
    ) -> AsyncIterator[Record]:
        """Records of one partition from ``from_offset``; stops at the end if ``until_end``."""

    @abc.abstractmethod
    async def consumer(self, group_id: str, topics: Sequence[str]) -> LogConsumer:
        """A group member for ``topics``, positioned at the group's committed offsets
        (or the earliest record when the group has none)."""

    async def __aenter__(self) -> LogBackend:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

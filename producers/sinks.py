"""Where an :class:`~producers.emitter.Emitter` writes: the embedded log, Kafka, or memory.

Sinks are synchronous because producers (a torch training loop, a rollout worker) are
mostly synchronous code. ``write`` returns only once the events are durable; it encodes
the whole batch before writing any of it, so a batch that fails to encode is not written
half-way. ``write_dead_letters`` (optional) appends dead letters to the dead-letter topic:
the emitter's place for events it could not serialise (see :mod:`producers.emitter`).
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Sequence
from typing import Protocol

from events.codec import encode, records_by_topic
from events.dead_letter import DeadLetter
from events.envelope import EventBase
from events.log.base import LogBackend
from events.log.embedded import EmbeddedLog
from events.topics import DEAD_LETTER_TOPIC


class EventSink(Protocol):
    def write(self, events: Sequence[EventBase]) -> None: ...

    def close(self) -> None: ...


class MemorySink:
    """Keeps events in a list: for unit tests and in-process composition. ``strict``
    encodes every batch first, as a log would (and fails as a log would)."""

    def __init__(self, *, strict: bool = False) -> None:
        self.events: list[EventBase] = []
        self.dead_letters: list[DeadLetter] = []
        self.strict = strict

    def write(self, events: Sequence[EventBase]) -> None:
        if self.strict:
            for ev in events:
                encode(ev)
        self.events.extend(events)

    def write_dead_letters(self, letters: Sequence[DeadLetter]) -> None:
        self.dead_letters.extend(letters)

    def close(self) -> None:
        return None


class EmbeddedSink:
    """Appends to an embedded log directory (opened, and recovered, on construction)."""

    def __init__(self, log_dir: str | os.PathLike[str] | EmbeddedLog, *, sync: bool = True):
        if isinstance(log_dir, EmbeddedLog):
            self.log = log_dir
        else:
            self.log = EmbeddedLog(log_dir, sync=sync)
            self.log.open_sync()

    def write(self, events: Sequence[EventBase]) -> None:
        self.log.append_events_sync(events)

    def write_dead_letters(self, letters: Sequence[DeadLetter]) -> None:
        self.log.append_many_sync(DEAD_LETTER_TOPIC, [(None, d.encode()) for d in letters])

    def close(self) -> None:
        return None


class BackendSink:
    """A sync facade over any async :class:`LogBackend` (Kafka): its own event loop runs
    on a daemon thread; ``write`` blocks until the backend acknowledged every record."""

    def __init__(self, backend: LogBackend, *, timeout_s: float | None = None) -> None:
        """``timeout_s``: the longest any call waits (``TimeoutError``; None: no limit). A
        backend that cannot start stops the loop's thread before the error is raised."""
        self.backend = backend
        self.timeout_s = timeout_s
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        try:
            self._call(backend.start())
        except BaseException:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
            raise

    def _call(self, coro):  # type: ignore[no-untyped-def]
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(self.timeout_s)

    def write(self, events: Sequence[EventBase]) -> None:
        by_topic = records_by_topic(events)

        async def _write() -> None:
            await asyncio.gather(
                *(self.backend.append_many(t, recs) for t, recs in by_topic.items())
            )

        self._call(_write())

    def write_dead_letters(self, letters: Sequence[DeadLetter]) -> None:
        records = [(None, d.encode()) for d in letters]
        self._call(self.backend.append_many(DEAD_LETTER_TOPIC, records))

    def close(self) -> None:
        try:
            self._call(self.backend.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)


class KafkaSink(BackendSink):
    """A sink appending to Kafka at ``bootstrap`` (idempotent producer, acks=all)."""

    def __init__(self, bootstrap: str, *, timeout_s: float | None = None) -> None:
        from events.log.kafka import KafkaLog  # imported lazily: aiokafka only when used

        super().__init__(KafkaLog(bootstrap), timeout_s=timeout_s)

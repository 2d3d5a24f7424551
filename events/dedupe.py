"""The one shared duplicate detector: at-least-once delivery means consumers see repeats.

An event is a duplicate when its ``event_id`` was seen before. Memory is bounded: the
newest ``capacity`` ids are remembered (a duplicate older than that window is not caught;
size the window to cover a redelivery after a crash, i.e. the uncommitted tail). Ids are
kept as their 128-bit integers (a set for the lookup, a ring for the order: every step a
C-level operation, since every host asks once per event and fold) and given out as their
16 bytes, oldest first, so a host can persist the window compactly (see
``runwatch.hosting.core.RecentIds``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

_UUID = uuid.UUID


class Deduplicator:
    """``first_time(event_id)`` is True exactly once per id within the window."""

    __slots__ = ("_next", "_ring", "_seen", "capacity", "duplicates")

    def __init__(self, capacity: int = 1_000_000) -> None:
        self.capacity = capacity
        self._seen: set[int] = set()
        self._ring: list[int | None] = []  # grows to ``capacity``, then wraps at _next
        self._next = 0
        self.duplicates = 0

    def first_time(self, event_id: uuid.UUID | bytes) -> bool:
        key = event_id.int if type(event_id) is _UUID else int.from_bytes(event_id, "big")  # type: ignore[union-attr,arg-type]
        seen = self._seen
        if key in seen:
            self.duplicates += 1
            return False
        seen.add(key)
        ring = self._ring
        if len(ring) < self.capacity:
            ring.append(key)
        else:  # the window is full: the oldest id makes room
            i = self._next
            oldest = ring[i]
            if oldest is not None:
                seen.discard(oldest)
            ring[i] = key
            self._next = (i + 1) % self.capacity
        return True

    def __contains__(self, event_id: uuid.UUID | bytes) -> bool:
        key = event_id.int if type(event_id) is _UUID else int.from_bytes(event_id, "big")  # type: ignore[union-attr,arg-type]
        return key in self._seen

    def __len__(self) -> int:
        return len(self._seen)

    def ids(self) -> Iterator[bytes]:
        """The remembered ids, oldest first, as 16 bytes each."""
        ring, i = self._ring, self._next
        for key in (*ring[i:], *ring[:i]):
            if key is not None:
                yield key.to_bytes(16, "big")

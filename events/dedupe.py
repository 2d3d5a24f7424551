"""The one shared duplicate detector: at-least-once delivery means consumers see repeats.

An event is a duplicate when its ``event_id`` was seen before. Memory is bounded: the
newest ``capacity`` ids are remembered (a duplicate older than that window is not caught;
size the window to cover a redelivery after a crash, i.e. the uncommitted tail). Ids are
kept as their 16 bytes, so a host can persist the window compactly (see
``runwatch.hosting.core.RecentIds``).
"""

from __future__ import annotations

import uuid
from collections import OrderedDict


class Deduplicator:
    """``first_time(event_id)`` is True exactly once per id within the window."""

    __slots__ = ("_seen", "capacity", "duplicates")

    def __init__(self, capacity: int = 1_000_000) -> None:
        self.capacity = capacity
        self._seen: OrderedDict[bytes, None] = OrderedDict()
        self.duplicates = 0

    def first_time(self, event_id: uuid.UUID | bytes) -> bool:
        key = event_id.bytes if isinstance(event_id, uuid.UUID) else event_id
        if key in self._seen:
            self.duplicates += 1
            return False
        self._seen[key] = None
        if len(self._seen) > self.capacity:
            self._seen.popitem(last=False)
        return True

    def __contains__(self, event_id: uuid.UUID | bytes) -> bool:
        key = event_id.bytes if isinstance(event_id, uuid.UUID) else event_id
        return key in self._seen

    def __len__(self) -> int:
        return len(self._seen)

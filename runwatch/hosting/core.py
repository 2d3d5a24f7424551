"""What every host does with one decoded event: dedupe, find the key's state, apply.

A *slot* is one key's hosted state: the fold's state plus the ids of the last
:data:`DEDUPE_WINDOW` events folded into it (at-least-once delivery repeats events; a
producer retry may append one twice). Both hosts keep the same slots with the same window,
so they absorb the same duplicates and emit the same derived events.

Slot bytes (what the faust table stores and the embedded state file holds per key):
``{"state": <base64 fold state>, "recent": [event ids, oldest first]}``.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

from events.envelope import EventBase
from events.fold import Fold

#: Event ids remembered per key. A redelivery reaches back at most one uncommitted batch.
DEDUPE_WINDOW = 512


class RecentIds:
    """The last ``capacity`` event ids of one key, with O(1) membership."""

    __slots__ = ("_order", "_set", "capacity")

    def __init__(self, ids: Iterable[str] = (), capacity: int = DEDUPE_WINDOW) -> None:
        self.capacity = capacity
        self._order: deque[str] = deque()
        self._set: set[str] = set()
        for i in ids:
            self.first_time(i)

    def first_time(self, event_id: uuid.UUID | str) -> bool:
        key = str(event_id)
        if key in self._set:
            return False
        self._order.append(key)
        self._set.add(key)
        if len(self._order) > self.capacity:
            self._set.discard(self._order.popleft())
        return True

    def ids(self) -> list[str]:
        return list(self._order)


class Slot:
    """One key's live state in a host (mutable holder of an immutable fold state)."""

    __slots__ = ("recent", "state")

    def __init__(self, state: Any, recent: RecentIds) -> None:
        self.state = state
        self.recent = recent


def new_slot(fold: Fold[Any]) -> Slot:
    return Slot(fold.initial(), RecentIds())


def dump_slot(fold: Fold[Any], slot: Slot) -> bytes:
    doc = {
        "state": base64.b64encode(fold.dump_state(slot.state)).decode(),
        "recent": slot.recent.ids(),
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def load_slot(fold: Fold[Any], raw: bytes | None) -> Slot:
    if raw is None:
        return new_slot(fold)
    doc = json.loads(raw)
    return Slot(fold.load_state(base64.b64decode(doc["state"])), RecentIds(doc["recent"]))


def apply_event(fold: Fold[Any], slot: Slot, event: EventBase) -> Sequence[EventBase] | None:
    """Fold ``event`` into ``slot``; the derived events, or ``None`` for a duplicate."""
    if not slot.recent.first_time(event.event_id):
        return None
    slot.state, derived = fold.apply(slot.state, event)
    return derived

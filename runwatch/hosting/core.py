"""What every host does with one decoded event: dedupe, find the key's state, apply.

A *slot* is one key's hosted state: the fold's state plus the ids of the last
:data:`DEDUPE_WINDOW` events folded into it (at-least-once delivery repeats events; a
producer retry may append one twice). Both hosts keep the same slots with the same window,
so they absorb the same duplicates and emit the same derived events.

Slot bytes (what the faust table stores and the embedded state file holds per key):
msgpack ``{"state": <fold state bytes>, "recent": <the 16-byte ids, oldest first>}``
(compact on purpose: the faust host writes it to the changelog for every event).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import msgpack

from events.dedupe import Deduplicator
from events.envelope import EventBase
from events.fold import Fold

#: Event ids remembered per key. A redelivery reaches back at most one uncommitted batch
#: (the faust app commits every 100 events); folds that must absorb older repeats do it
#: themselves (the run-health fold ignores late steps whatever the window).
DEDUPE_WINDOW = 256


class RecentIds(Deduplicator):
    """The last ``capacity`` event ids of one key (the shared :class:`Deduplicator`),
    packed as 16 bytes per id for the host's persisted state."""

    __slots__ = ()

    def __init__(self, ids: Iterable[bytes] = (), capacity: int = DEDUPE_WINDOW) -> None:
        super().__init__(capacity)
        for i in ids:
            self.first_time(i)

    def pack(self) -> bytes:
        return b"".join(self._seen)

    @classmethod
    def unpack(cls, raw: bytes) -> RecentIds:
        return cls(raw[i : i + 16] for i in range(0, len(raw), 16))


class Slot:
    """One key's live state in a host (mutable holder of an immutable fold state)."""

    __slots__ = ("recent", "state")

    def __init__(self, state: Any, recent: RecentIds) -> None:
        self.state = state
        self.recent = recent


def new_slot(fold: Fold[Any]) -> Slot:
    return Slot(fold.initial(), RecentIds())


def dump_slot(fold: Fold[Any], slot: Slot) -> bytes:
    doc = {"state": fold.dump_state(slot.state), "recent": slot.recent.pack()}
    return msgpack.packb(doc, use_bin_type=True)


def load_slot(fold: Fold[Any], raw: bytes | None) -> Slot:
    if raw is None:
        return new_slot(fold)
    doc = msgpack.unpackb(raw, raw=False)
    return Slot(fold.load_state(doc["state"]), RecentIds.unpack(doc["recent"]))


def apply_event(fold: Fold[Any], slot: Slot, event: EventBase) -> Sequence[EventBase] | None:
    """Fold ``event`` into ``slot``; the derived events, or ``None`` for a duplicate."""
    if not slot.recent.first_time(event.event_id):
        return None
    slot.state, derived = fold.apply(slot.state, event)
    return derived

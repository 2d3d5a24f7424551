"""The faust agent of a fold: read a record, fold it, send what it derived (thin).

:func:`fold_record` does for one raw record exactly what every host does
(:mod:`runwatch.hosting.core`): decode (a bad record goes to ``runwatch.dead-letters``),
dedupe by event id within the key's slot, apply, and encode the derived events with the
runwatch codec. Same slots, same window, same fold: the same derived events, ids included,
as the embedded host and the replay (a unit test compares them).

At-least-once, and nothing derived is lost: the agent sends a record's derived events
and waits until Kafka acknowledged them *before* it stores the new slot in the table
(:class:`Folded`'s ``store``). A crash between the two leaves the old slot in the
table's changelog, so the redelivered record is folded again and derives the same
events again (same ids: consumers deduplicate). A crash after the store means they were
already delivered; the slot then holds the record's event id and it derives nothing twice.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from events.codec import decode, encode
from events.dead_letter import DeadLetter
from events.fold import Fold
from events.topics import DEAD_LETTER_TOPIC
from runwatch.hosting.core import Slot, apply_event, dump_slot, load_slot

Output = tuple[str, bytes | None, bytes]


class Folded(list[Output]):
    """The records one input derived (a list), and ``store()``: write the new slot to the
    table — to be called only once those records were delivered."""

    def __init__(self, outputs: list[Output], store: Callable[[], None] | None = None):
        super().__init__(outputs)
        self._store = store

    def store(self) -> None:
        if self._store is not None:
            self._store()


class SlotCache:
    """Live slots of one agent, valid while the table still holds the bytes we wrote
    (checked by identity: after a rebalance or recovery the table holds other objects,
    and the slot is loaded again from them). Saves a decode per event, nothing else."""

    def __init__(self) -> None:
        self._live: dict[bytes, tuple[bytes, Slot]] = {}

    def get(self, fold: Fold[Any], key: bytes, raw: bytes | None) -> Slot:
        hit = self._live.get(key)
        if hit is not None and raw is not None and hit[0] is raw:
            return hit[1]
        return load_slot(fold, raw)

    def put(self, key: bytes, raw: bytes, slot: Slot) -> None:
        self._live[key] = (raw, slot)


def fold_record(
    fold: Fold[Any],
    table: Any,
    cache: SlotCache,
    topic: str,
    partition: int,
    offset: int,
    raw: bytes,
) -> Folded:
    """Fold one raw record; the records to send as (topic, key, value), and the table
    write to make once they were delivered."""
    event = decode(raw)
    if isinstance(event, DeadLetter):
        return Folded([(DEAD_LETTER_TOPIC, None, event.located(topic, partition, offset).encode())])
    key = fold.key_of(event).encode()
    slot = cache.get(fold, key, table.get(key))
    derived = apply_event(fold, slot, event)
    if derived is None:
        return Folded([])  # a duplicate: already folded
    value = dump_slot(fold, slot)

    def store() -> None:
        table[key] = value
        cache.put(key, value, slot)

    return Folded([(type(ev).TOPIC, ev.key(), encode(ev)) for ev in derived], store)


def fold_agent(app: Any, fold: Fold[Any], source: Any, table: Any, sinks: Mapping[str, Any]) -> Any:
    cache = SlotCache()

    @app.agent(source, name=f"runwatch.{fold.name}")
    async def agent(stream: Any) -> None:
        async for ev in stream.events():
            m = ev.message
            folded = fold_record(fold, table, cache, m.topic, m.partition, m.offset, ev.value)
            pending = [await sinks[t].send(key=k, value=v) for t, k, v in folded]
            for delivery in pending:
                await delivery  # acknowledged by the broker before the slot is stored
            folded.store()

    return agent

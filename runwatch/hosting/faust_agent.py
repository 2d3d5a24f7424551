"""The faust agent of co-partitioned folds: read a record, fold it, send what it derived.

:func:`fold_records` does for one raw record exactly what every host does
(:mod:`runwatch.hosting.core`): decode (a bad record goes to ``runwatch.dead-letters``),
refuse an event whose run id is another tenant's (the first event of a run the agent folds
pins it for all its folds; a refused one's dead letter is sent instead),
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

import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from events.codec import encode
from events.dead_letter import DeadLetter
from events.envelope import EventBase
from events.fast_decode import decode_fast
from events.fold import Fold
from events.topics import DEAD_LETTER_TOPIC
from runwatch.hosting.core import Slot, apply_event, dump_slot, load_slot
from runwatch.hosting.progress import FaustProgress
from runwatch.hosting.tenancy import RunPins, fold_failed_letter, foreign_letter

log = logging.getLogger("runwatch.hosting")

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

    def forget(self, key: bytes) -> None:
        """Drop ``key``'s live slot: the next event loads it from the table again (what
        was stored last), e.g. after a fold raised mid-way through changing it."""
        self._live.pop(key, None)


def fold_event(
    fold: Fold[Any], table: Any, cache: SlotCache, event: EventBase, tenant: str | None = None
) -> Folded:
    """Fold one decoded event into its key's slot: the records to send as (topic, key,
    value), and the table write to make once they were delivered."""
    key = fold.key_of(event).encode()
    slot = cache.get(fold, key, table.get(key))
    if slot.tenant is None:  # a new slot, or one stored unpinned: the run's pin, if any
        slot.tenant = tenant  # (the caller checked the run's tenant)
    derived = apply_event(fold, slot, event)
    if derived is None:
        return Folded([])  # a duplicate: already folded
    value = dump_slot(fold, slot)

    def store() -> None:
        table[key] = value
        cache.put(key, value, slot)

    return Folded([(type(ev).TOPIC, ev.key(), encode(ev)) for ev in derived], store)


def fold_record(
    fold: Fold[Any],
    table: Any,
    cache: SlotCache,
    topic: str,
    partition: int,
    offset: int,
    raw: bytes,
) -> Folded:
    """Decode and fold one raw record (a bad one: its dead letter to send)."""
    return fold_records([(fold, table, cache)], topic, partition, offset, raw)


Hosted = tuple[Fold[Any], Any, SlotCache]  # a fold, its table, its live slots


def agent_pins(hosted: Sequence[Hosted]) -> RunPins:
    """The run pins of one agent's folds (:mod:`runwatch.hosting.tenancy`): kept in the
    slots of their tables, cached by run id."""

    def pinned(run: str) -> str | None:
        key = run.encode()
        for fold, table, cache in hosted:
            raw = table.get(key)
            tenant = cache.get(fold, key, raw).tenant if raw is not None else None
            if tenant is not None:
                return tenant
        return None

    return RunPins(pinned)


def fold_records(
    hosted: Sequence[Hosted],
    topic: str,
    partition: int,
    offset: int,
    raw: bytes,
    pins: RunPins | None = None,
) -> Folded:
    """Decode one raw record once and fold it into each of ``hosted`` (the folds of the
    agent that read ``topic``); everything they derived, and every table write.
    ``pins``: the agent's run pins (:func:`agent_pins` of all its folds; None: looked up
    in ``hosted``'s tables for this record)."""
    event = decode_fast(raw)
    if isinstance(event, DeadLetter):
        return Folded([(DEAD_LETTER_TOPIC, None, event.located(topic, partition, offset).encode())])
    pins = pins or agent_pins(hosted)
    owner = pins.owner_of(event, topic)
    if owner != event.tenant_id:  # another tenant's run: not folded by any fold
        letter = foreign_letter(event, owner, topic, partition, offset)
        return Folded([(DEAD_LETTER_TOPIC, None, letter.encode())])
    pinned = pins.by_run.get(event.run_id)
    parts: list[Folded] = []
    for fold, table, cache in hosted:
        try:  # a fold that raises on one event (or cannot store what it made of it) stops
            parts.append(fold_event(fold, table, cache, event, pinned))  # nothing else
        except Exception as exc:  # the slot may be half-changed: back to the stored one
            with contextlib.suppress(Exception):
                cache.forget(fold.key_of(event).encode())
            letter = fold_failed_letter(event, fold.name, exc, topic, partition, offset)
            log.error("runwatch: %s (%s)", letter.reason, topic)
            parts.append(Folded([(DEAD_LETTER_TOPIC, None, letter.encode())]))
    outputs = [out for part in parts for out in part]
    if len(parts) == 1:
        return Folded(outputs, parts[0].store)

    def store() -> None:
        for part in parts:
            part.store()

    return Folded(outputs, store)


def fold_agent(
    app: Any,
    hosted: Sequence[Hosted],
    source: Any,
    sinks: Mapping[str, Any],
    progress: FaustProgress | None = None,
) -> Any:
    """One agent for co-partitioned folds: each record decoded once, folded into every
    fold that reads its topic, its derived records acknowledged before any slot is
    stored. ``progress``: stamped once each record is done (the worker's liveness,
    :mod:`runwatch.hosting.progress`)."""
    routes: dict[str, list[Hosted]] = {}
    for h in hosted:
        for topic in h[0].inputs:
            routes.setdefault(topic, []).append(h)
    name = "+".join(h[0].name for h in hosted)
    pins = agent_pins(hosted)

    @app.agent(source, name=f"runwatch.{name}")
    async def agent(stream: Any) -> None:
        async for ev in stream.events():
            m = ev.message
            folded = fold_records(routes[m.topic], m.topic, m.partition, m.offset, ev.value, pins)
            pending = [await sinks[t].send(key=k, value=v) for t, k, v in folded]
            for delivery in pending:
                await delivery  # acknowledged by the broker before the slots are stored
            folded.store()
            if progress is not None:
                progress.folded()

    return agent

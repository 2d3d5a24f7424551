"""The embedded host: run a list of folds over an :class:`~events.log.embedded.EmbeddedLog`.

For each fold: read its input topics from its stored positions (merged in the log's
deterministic order), decode (undecodable records go to ``runwatch.dead-letters`` once,
stamped with where they were read), dedupe by ``event_id`` per key
(:mod:`runwatch.hosting.core`), apply, and append the derived events to their topics.

Durability (the eventsourcing tracking-record idea): every ``batch_records`` records the
host appends the batch's derived events, *then* writes one state file per fold —
positions and every key's slot together, atomically (temp file, fsync, rename) — at
``<log>/_groups/<fold>.state.json`` (slots as base64 of their bytes). A crash between the
two re-runs the batch on restart: the same derived events (same ids) are appended again,
which consumers deduplicate
(at-least-once, never lost). The positions can never run ahead of the state.

:func:`replay` is the read-only twin: the same folds from offset 0, in memory, yielding
every derived event without writing anything (``runwatch replay``).

Time: nothing here reads a clock except :meth:`EmbeddedHost.run_forever`'s poll sleep.
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from events.codec import decode
from events.dead_letter import DeadLetter
from events.envelope import EventBase
from events.fold import Fold
from events.log.embedded import GROUPS_DIR, EmbeddedLog
from events.log.segments import write_atomically
from events.topics import DEAD_LETTER_TOPIC
from runwatch.hosting.core import Slot, apply_event, dump_slot, load_slot, new_slot

DEAD_LETTER_GROUP = "runwatch-dead-letters"


@dataclass
class HostStats:
    records: int = 0
    duplicates: int = 0
    dead_letters: int = 0
    derived: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "records": self.records,
            "duplicates": self.duplicates,
            "dead_letters": self.dead_letters,
            "derived": dict(self.derived),
        }


@dataclass
class _Hosted:
    fold: Fold[Any]
    positions: dict[str, int]
    slots: dict[str, Slot]
    slot_bytes: dict[str, str]
    dirty: set[str] = field(default_factory=set)


class EmbeddedHost:
    def __init__(
        self, log: EmbeddedLog, folds: Sequence[Fold[Any]], *, batch_records: int = 5000
    ) -> None:
        self.log = log
        self.folds = list(folds)
        self.batch_records = batch_records
        self.stats = HostStats()
        self._hosted = {f.name: self._load(f) for f in self.folds}
        self._dl_positions = log.load_positions(DEAD_LETTER_GROUP)

    # -- state file ----------------------------------------------------------------------

    def state_path(self, fold: Fold[Any]) -> Path:
        return self.log.root / GROUPS_DIR / f"{fold.name}.state.json"

    def _load(self, fold: Fold[Any]) -> _Hosted:
        try:
            doc = json.loads(self.state_path(fold).read_text())
        except FileNotFoundError:
            return _Hosted(fold, {}, {}, {})
        slot_bytes = {k: str(v) for k, v in doc["slots"].items()}
        slots = {k: load_slot(fold, base64.b64decode(v)) for k, v in slot_bytes.items()}
        return _Hosted(fold, {k: int(v) for k, v in doc["positions"].items()}, slots, slot_bytes)

    def _save(self, hosted: _Hosted) -> None:
        for key in hosted.dirty:
            raw = dump_slot(hosted.fold, hosted.slots[key])
            hosted.slot_bytes[key] = base64.b64encode(raw).decode()
        hosted.dirty.clear()
        doc = {"fold": hosted.fold.name, "positions": hosted.positions, "slots": hosted.slot_bytes}
        write_atomically(self.state_path(hosted.fold), json.dumps(doc, sort_keys=True).encode())

    # -- processing ----------------------------------------------------------------------

    def run_once(self, max_passes: int = 8) -> HostStats:
        """Process everything appended so far; repeat while folds fed each other."""
        for _ in range(max_passes):
            if not any([self._drain(self._hosted[f.name]) for f in self.folds]):
                break
        return self.stats

    def run_forever(self, stop: threading.Event, poll_s: float = 0.2) -> HostStats:
        while not stop.is_set():
            self.run_once()
            stop.wait(poll_s)
        return self.stats

    def _drain(self, hosted: _Hosted) -> int:
        fold, derived, pending, seen = hosted.fold, [], [], 0
        for rec in self.log.iter_records(fold.inputs, dict(hosted.positions)):
            hosted.positions[rec.topic] = rec.offset + 1
            seen += 1
            self.stats.records += 1
            event = decode(rec.value)
            if isinstance(event, DeadLetter):
                if rec.offset >= self._dl_positions.get(rec.topic, 0):
                    pending.append(event.located(rec.topic, rec.partition, rec.offset))
                    self._dl_positions[rec.topic] = rec.offset + 1
                continue
            out = self._apply(hosted, event)
            if out:
                derived.extend(out)
            if seen % self.batch_records == 0:
                self._commit(hosted, derived, pending)
                derived, pending = [], []
        if seen:
            self._commit(hosted, derived, pending)
        return seen

    def _apply(self, hosted: _Hosted, event: EventBase) -> Sequence[EventBase] | None:
        key = hosted.fold.key_of(event)
        slot = hosted.slots.get(key)
        if slot is None:
            slot = hosted.slots[key] = new_slot(hosted.fold)
        out = apply_event(hosted.fold, slot, event)
        if out is None:
            self.stats.duplicates += 1
            return None
        hosted.dirty.add(key)
        return out

    def _commit(self, hosted: _Hosted, derived: list[EventBase], dead: list[DeadLetter]) -> None:
        if dead:
            self.log.append_many_sync(DEAD_LETTER_TOPIC, [(None, d.encode()) for d in dead])
            self.log.commit_positions(DEAD_LETTER_GROUP, self._dl_positions)
            self.stats.dead_letters += len(dead)
        if derived:
            self.log.append_events_sync(derived)
            for ev in derived:
                self.stats.derived[ev.type] = self.stats.derived.get(ev.type, 0) + 1
        self._save(hosted)


def replay(log: EmbeddedLog, folds: Sequence[Fold[Any]]) -> Iterator[EventBase]:
    """Every event the folds derive from the log, from scratch, fold by fold; writes
    nothing. Duplicates are absorbed exactly as the live hosts absorb them."""
    for fold in folds:
        slots: dict[str, Slot] = {}
        for event in log.iter_events(fold.inputs):
            if isinstance(event, DeadLetter):
                continue
            key = fold.key_of(event)
            slot = slots.get(key)
            if slot is None:
                slot = slots[key] = new_slot(fold)
            out = apply_event(fold, slot, event)
            if out:
                yield from out

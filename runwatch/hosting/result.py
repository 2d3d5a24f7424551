"""What a replay gives back (:class:`ReplayResult`), and the pieces a replay and a key-sharded
replay share."""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any

from events.codec import decode_or_raise
from events.envelope import EventBase
from runwatch.hosting.host import Host
from runwatch.hosting.read_model import INPUTS
from runwatch.hosting.shards import Shard

Positions = dict[str, int]


@dataclass
class ReplayResult:
    """What a replay rebuilt: the read model's host (``None`` for processors only), the
    events the read model derived, and what each processor fold derived."""

    host: Host | None
    derived: list[EventBase] = field(default_factory=list)
    #: (fold name, what it derived), in fold order
    processed: list[tuple[str, list[EventBase]]] = field(default_factory=list)
    records: int = 0
    seconds: float = 0.0

    @property
    def store(self) -> Any:
        """The read model (:class:`projections.store.ReadModel`)."""
        assert self.host is not None
        return self.host.store.read_model  # type: ignore[attr-defined]

    def processor_events(self) -> list[EventBase]:
        return [ev for _, events in self.processed for ev in events]

    def summary(self) -> dict[str, Any]:
        assert self.host is not None and self.host.view is not None
        view = self.host.view
        by_type: dict[str, int] = {}
        for ev in self.derived:
            by_type[ev.type] = by_type.get(ev.type, 0) + 1
        states: dict[str, int] = {}
        for v in view.views.values():  # type: ignore[attr-defined]
            states[str(v.state)] = states.get(str(v.state), 0) + 1
        return {
            "records": self.records,
            "applied": view.applied,  # type: ignore[attr-defined]
            "skipped_already_applied": self.host.skipped,
            "dead_letters": len(self.host.dead_letters),
            "runs": len(view.views),  # type: ignore[attr-defined]
            "runs_by_state": dict(sorted(states.items())),
            "derived": dict(sorted(by_type.items())),
            "held_at_terminal_barrier": len(self.host.held),
            "seconds": round(self.seconds, 3),
            "records_per_s": round(self.records / self.seconds) if self.seconds else None,
        }


def topic_stops(until: Positions | None) -> dict[str, int] | None:
    """``until`` (``topic:0`` positions of an embedded log) as the per-topic stop offsets
    of :meth:`~events.log.embedded.EmbeddedLog.iter_records` (a topic not named: 0)."""
    if until is None:
        return None
    return {topic: until.get(f"{topic}:0", 0) for topic in INPUTS}


def from_shard(shard: Shard) -> ReplayResult:
    """A one-process replay's result: each processor fold's output from its host."""
    processed = []
    if shard.processors is not None:
        processed = [(hf.name, hf.emitted) for hf in shard.processors.folds]
    return ReplayResult(shard.projection, shard.derived, processed, records=shard.records)


def decode_tagged(docs: list[list[tuple[Any, bytes]]]) -> list[tuple[Any, EventBase]]:
    """Every shard's tagged derived events, in one process's order."""
    merged = heapq.merge(*docs, key=lambda item: item[0])
    return [(tag, decode_or_raise(raw)) for tag, raw in merged]

"""The emitter SDK: how trainers, rollout workers and scorers publish facts.

An :class:`Emitter` belongs to one producer of one run. It stamps every event with the
envelope (random ``event_id``, the producer's monotonic ``seq``, ``ts`` now unless given)
and hands batches to a :class:`~producers.sinks.EventSink`. Events are buffered up to
``batch_size`` and flushed then, on :meth:`Emitter.flush` and on close; a sink write that
returns has made the events durable (embedded: written and fsync'd; Kafka: acks=all).

Time semantics: ``ts`` is the producer's wall clock when the fact happened; folds read
nothing else. ``seq`` starts at ``first_seq`` (a resumed producer passes the last seq + 1
so gaps stay meaningful).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from events.envelope import EventBase, new_envelope
from producers.sinks import EventSink

E = TypeVar("E", bound=EventBase)


class Emitter:
    def __init__(
        self,
        sink: EventSink,
        *,
        tenant_id: str,
        run_id: str,
        producer: str,
        batch_size: int = 256,
        first_seq: int = 0,
    ) -> None:
        self.sink = sink
        self.tenant_id = tenant_id
        self.run_id = run_id
        self.producer = producer
        self.batch_size = batch_size
        self.seq = first_seq
        self._pending: list[EventBase] = []

    def emit(
        self, cls: type[E], *, step: int | None = None, ts: float | None = None, **payload: Any
    ) -> E:
        """Build one ``cls`` event with a fresh envelope and queue it; returns the event.

        Raises ``pydantic.ValidationError`` at once for a bad payload (a producer bug is
        found where it happens, not downstream).
        """
        envelope = new_envelope(
            tenant_id=self.tenant_id,
            run_id=self.run_id,
            producer=self.producer,
            seq=self.seq,
            step=step,
            ts=ts,
        )
        event = cls(**envelope, **payload)
        self.seq += 1
        self._pending.append(event)
        if len(self._pending) >= self.batch_size:
            self.flush()
        return event

    def emit_event(self, event: EventBase) -> None:
        """Queue an event built elsewhere (e.g. by a fold run inside the producer)."""
        self._pending.append(event)
        if len(self._pending) >= self.batch_size:
            self.flush()

    @property
    def pending(self) -> Sequence[EventBase]:
        return tuple(self._pending)

    def flush(self) -> None:
        """Write every queued event; on error they stay queued (nothing is lost)."""
        if not self._pending:
            return
        batch = self._pending
        self.sink.write(batch)
        self._pending = []

    def close(self) -> None:
        self.flush()

    def __enter__(self) -> Emitter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

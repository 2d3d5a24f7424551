"""The emitter SDK: how trainers, rollout workers and scorers publish facts.

An :class:`Emitter` belongs to one producer of one run. It stamps every event with the
envelope (random ``event_id``, the producer's monotonic ``seq``, ``ts`` now unless given)
and hands batches to a :class:`~producers.sinks.EventSink`. Events are buffered up to
``batch_size`` and flushed then, on :meth:`Emitter.flush` and on close; a sink write that
returns has made the events durable (embedded: written and fsync'd; Kafka: acks=all).

Time semantics: ``ts`` is the producer's wall clock when the fact happened; folds read
nothing else. ``seq`` starts at ``first_seq`` (a resumed producer passes the last seq + 1
so gaps stay meaningful).

An event that validates but cannot be *serialised* (a string field holding a lone
surrogate, say ``"\ud800"`` from text a tenant's code raised, which UTF-8 cannot encode)
does not stop the producer, and is not lost silently. When a sink write fails, the
emitter encodes each pending event to find such events (a sink encodes the whole batch
before it writes anything, so nothing was half-written), and:

- *repairs* what it can — every lone surrogate becomes U+FFFD, the event keeps its id and
  every other field — and writes the repaired event in its place;
- *dead-letters* the original either way (:class:`~events.dead_letter.DeadLetter` on the
  dead-letter topic, kind ``validation_error``, the reason saying what was done, the raw
  record as escaped JSON), and logs a warning;
- drops an event it cannot repair from its topic, the dead letter then being its only
  trace (logged as an error).

A sink without a dead-letter topic (``write_dead_letters``) leaves the dead letters in
:attr:`Emitter.dead_letters`. A write that fails for any other reason raises, and the
events stay queued as before.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from typing import Any, TypeVar

from events.codec import encode
from events.dead_letter import DeadLetter
from events.envelope import EventBase, Stamper
from producers.sinks import EventSink

log = logging.getLogger("runwatch.emitter")

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
        self.stamper = Stamper(
            tenant_id=tenant_id, run_id=run_id, producer=producer, first_seq=first_seq
        )
        self._pending: list[EventBase] = []
        #: dead letters of unserialisable events that the sink could not take
        self.dead_letters: list[DeadLetter] = []
        #: (event type, event id, what was done) for every unserialisable event met
        self.unwritable: list[tuple[str, str, str]] = []

    def emit(
        self, cls: type[E], *, step: int | None = None, ts: float | None = None, **payload: Any
    ) -> E:
        """Build one ``cls`` event with a fresh envelope and queue it; returns the event.

        Raises ``pydantic.ValidationError`` at once for a bad payload (a producer bug is
        found where it happens, not downstream).
        """
        event = cls(**self.stamper.stamp(step=step, ts=ts), **payload)
        self._pending.append(event)
        if len(self._pending) >= self.batch_size:
            self.flush()
        return event

    @property
    def seq(self) -> int:
        """The ``seq`` the next event gets."""
        return self.stamper.seq

    def emit_event(self, event: EventBase) -> None:
        """Queue an event built elsewhere (e.g. by a fold run inside the producer)."""
        self._pending.append(event)
        if len(self._pending) >= self.batch_size:
            self.flush()

    @property
    def pending(self) -> Sequence[EventBase]:
        return tuple(self._pending)

    def flush(self) -> None:
        """Write every queued event; on error they stay queued (nothing is lost).

        An event that cannot be serialised is repaired or dead-lettered (see the module
        docstring) and the rest are written; it never stops the producer."""
        if not self._pending:
            return
        batch = self._pending
        try:
            self.sink.write(batch)
        except Exception:
            fixed, letters = _set_aside_unencodable(batch)
            if not letters:
                raise  # not an encoding problem: the events stay queued
            self._pending = fixed
            self._dead_letter(letters)
            if fixed:
                self.sink.write(fixed)
        self._pending = []

    def _dead_letter(self, letters: list[tuple[DeadLetter, str, str, str]]) -> None:
        for letter, kind, event_id, what in letters:
            self.unwritable.append((kind, event_id, what))
            level = logging.ERROR if what == "dropped" else logging.WARNING
            log.log(level, "%s", letter.reason)
        dead = [letter for letter, *_ in letters]
        writer = getattr(self.sink, "write_dead_letters", None)
        if writer is None:
            self.dead_letters.extend(dead)
            return
        try:
            writer(dead)
        except Exception as exc:
            log.error("dead letters kept in memory, the sink refused them: %r", exc)
            self.dead_letters.extend(dead)

    def close(self) -> None:
        self.flush()

    def __enter__(self) -> Emitter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_SURROGATES = re.compile("[\ud800-\udfff]")


def _set_aside_unencodable(
    batch: Sequence[EventBase],
) -> tuple[list[EventBase], list[tuple[DeadLetter, str, str, str]]]:
    """The batch with unserialisable events repaired (or dropped), and a dead letter for
    each of them: (dead letter, event type, event id, "repaired" | "dropped")."""
    out: list[EventBase] = []
    letters: list[tuple[DeadLetter, str, str, str]] = []
    for ev in batch:
        try:
            encode(ev)
        except Exception as exc:
            why = f"{type(exc).__name__}: {_SURROGATES.sub('?', str(exc))}"[:500]
            fixed, fields = _repaired(ev)
            what = "repaired" if fixed is not None else "dropped"
            if fixed is not None:
                out.append(fixed)
                done = (
                    f"written with {len(fields)} field(s) repaired (lone surrogates -> "
                    f"U+FFFD: {', '.join(fields[:5])}); this is the original"
                )
            else:
                done = "it could not be repaired and was NOT written to its topic"
            reason = (
                f"producer {ev.producer!r} could not serialise {ev.type} {ev.event_id} "
                f"(run {ev.run_id!r}, seq {ev.seq}): {why}; {done}"
            )
            letter = DeadLetter(
                kind="validation_error",
                reason=reason,
                error_types=("unserialisable",),
                event_type=ev.type,
                raw=_raw(ev),
                source_topic=type(ev).TOPIC,
            )
            letters.append((letter, ev.type, str(ev.event_id), what))
            continue
        out.append(ev)
    return out, letters


def _repaired(ev: EventBase) -> tuple[EventBase | None, list[str]]:
    """The event with every lone surrogate in its strings replaced by U+FFFD (same id and
    fields otherwise), and the paths of the fields changed; None if it still fails."""
    fields: list[str] = []

    def fix(value: Any, path: str) -> Any:
        if isinstance(value, str):
            if _SURROGATES.search(value):
                fields.append(path)
                return _SURROGATES.sub("\ufffd", value)
            return value
        if isinstance(value, dict):
            return {fix(k, path): fix(v, f"{path}.{k}") for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(fix(v, f"{path}[{i}]") for i, v in enumerate(value))
        return value

    try:
        data = {k: fix(v, k) for k, v in ev.model_dump(mode="python").items()}
        fixed = type(ev).model_validate(data)
        encode(fixed)
    except Exception:
        return None, fields
    return fixed, fields


def _raw(ev: EventBase) -> bytes:
    """The original event as JSON with every non-ASCII character escaped (a lone
    surrogate included), so the dead letter carries it exactly."""
    try:
        return json.dumps(ev.model_dump(mode="python"), default=str).encode("ascii")
    except Exception:
        return repr(ev).encode("ascii", "backslashreplace")

"""The shape of every processor and projection: a pure fold over one key's events.

``apply(state, event) -> (state, derived)``: no clock, no I/O, no randomness. Time comes
from event fields; windows are counted in steps. Derived events get deterministic ids
(:func:`events.envelope.derived_id`), so a replay emits byte-identical outputs.

Hosts (the embedded runner, the faust app, tests) keep one state per key — the
``run_id`` unless :meth:`Fold.key_of` says otherwise — feed each *new* event (hosts
deduplicate by ``event_id``) to :meth:`Fold.apply`, store the new state and append the
derived events to their topics. A host persists state with :meth:`Fold.dump_state` /
:meth:`Fold.load_state` (bytes), so folds choose their own state format.

Optional: ``replayable_inputs: tuple[str, ...]``, input topics whose events the fold may
be handed twice to no effect (it reads them, e.g. to count a run's steps, but an event
folded again derives nothing new). Hosts fold those without deduplicating them: their ids
would crowd the key's window of recent ids, which guards the events that matter.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Generic, Protocol, TypeVar

from events.envelope import EventBase

S = TypeVar("S")


class Fold(Protocol, Generic[S]):
    #: Stable name: the consumer group, the state store and part of derived ids.
    name: str
    #: Topics the fold reads.
    inputs: tuple[str, ...]

    def initial(self) -> S:
        """The state of a key never seen before."""
        ...

    def key_of(self, event: EventBase) -> str:
        """Which state an event belongs to (default: its run)."""
        ...

    def apply(self, state: S, event: EventBase) -> tuple[S, Sequence[EventBase]]:
        """Fold one event in; return the new state and the derived events."""
        ...

    def dump_state(self, state: S) -> bytes: ...

    def load_state(self, raw: bytes) -> S: ...

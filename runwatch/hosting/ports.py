"""What a :class:`~runwatch.hosting.host.Host` is given and gives back: its store, its view,
and what it loads from and commits to the store."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from events.dead_letter import DeadLetter
from events.envelope import EventBase
from runwatch.hosting.core import FoldSet

Position = tuple[str, int]  # (topic, partition)
#: The rank of what a record derives directly (before any run it releases at the barrier).
DIRECT = (float("-inf"), "")


@dataclass
class Loaded:
    """What a store gives a host to resume from."""

    #: (topic, partition) -> next offset to apply
    positions: dict[Position, int] = field(default_factory=dict)
    #: fold name -> topic -> next offset that fold has to fold (state files keep one each)
    fold_starts: dict[str, dict[str, int]] = field(default_factory=dict)
    #: fold name -> key -> persisted state
    fold_states: dict[str, dict[str, bytes]] = field(default_factory=dict)
    held: dict[str, Any] | None = None
    #: the store's own snapshot, for the view (a read model's)
    snapshot: Any = None


@dataclass
class Commit:
    positions: dict[Position, int]
    #: fold name -> changed key -> persisted state
    fold_states: dict[str, dict[str, bytes]]
    #: the barrier's document when it changed, else None
    held: dict[str, Any] | None = None
    #: the view's batch (a read model's), else None
    view: Any = None


class StateStore(Protocol):
    def load(self, folds: FoldSet) -> Loaded: ...

    def commit(self, commit: Commit) -> None: ...


class View(Protocol):
    """A read model's side of the host (:class:`projections.materializer.Materializer`)."""

    def admit(self, topic: str, ev: EventBase) -> Any | None: ...

    def derived(self, view: Any, events: Sequence[EventBase]) -> None: ...

    def dead_letter(self, letter: DeadLetter) -> None: ...

    def sync(self, fold: Any, key: str, state: Any) -> None: ...

    def take_batch(self) -> Any: ...

"""The one host: records in, decoded once, folds applied, derived events out, state committed
with the positions it reflects.

:class:`Host` runs a list of folds over records of any log backend. Per record:

1. *position*: a record before the host's position of its ``topic:partition`` was applied
   already and is skipped (a redelivered tail, a repeated replay into the same store);
2. *decode*, once for every fold that reads the topic (:func:`events.fast_decode.decode_many`);
   a record that does not decode is a :class:`~events.dead_letter.DeadLetter`, located
   where it was read and kept in :attr:`Host.dead_letters` for the caller to publish;
3. *own* (option ``owns``, a key-sharded replay): a record of another shard's run is not
   applied (its barrier facts still move the barrier's watermarks);
4. *barrier* (option ``barrier``, :mod:`runwatch.hosting.barrier`): a run's terminal and
   the records after it wait until the barrier topics passed it in event time;
5. *view* (option ``view``, a read model's :class:`~projections.materializer.Materializer`):
   the fact goes into its run's view (a foreign tenant's claim stops it here);
6. *apply*: each fold that reads the topic folds it into its key's state
   (:class:`~runwatch.hosting.core.HostedFold`; with ``dedupe``, once per event id); what
   it derives goes to the view and, unless the fold is hosted for the view only, out.

:meth:`Host.checkpoint` commits through the host's :class:`StateStore` everything that
changed — fold states, positions, held records, the view's batch — in one atomic write, so
state can never run ahead of (or behind) the positions it reflects.

Which store: the embedded state files (:class:`~runwatch.hosting.stores.StateFiles`), a
read model (:class:`~runwatch.hosting.stores.ReadModelState`), or nothing
(:class:`~runwatch.hosting.stores.NoState`, a read-only replay). The faust app keeps
state in its tables instead and uses the per-record core directly
(:mod:`runwatch.hosting.faust_agent`).

Time: nothing here reads a clock (the follower's settle time is its caller's).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from events.dead_letter import DeadLetter
from events.envelope import EventBase
from events.fast_decode import decode_many
from events.fold import Fold
from events.log.base import Record
from runwatch.hosting.barrier import TerminalBarrier
from runwatch.hosting.core import FoldSet, HostedFold, RecentIds, Slot

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


class Host:
    """Folds hosted over records; see the module docstring. Not thread-safe: one caller."""

    def __init__(
        self,
        folds: Sequence[Fold[Any] | HostedFold],
        store: StateStore,
        *,
        dedupe: bool = True,
        barrier: TerminalBarrier | None = None,
        view: Callable[[Any], View] | None = None,
        owns: Callable[[bytes | None], bool] | None = None,
        collect: bool = False,
    ) -> None:
        """``folds``: in the order an event reaches them (a :class:`HostedFold` for one
        hosted with options of its own). ``view``: makes the read model's view from the
        store's snapshot. ``owns``: for a key-sharded replay, whether a run key (its
        ``run_id`` bytes; an unkeyed record: ``None``) is this host's. ``collect``: keep
        what each fold derived in its ``emitted`` list."""
        self.folds = FoldSet(
            [
                f if isinstance(f, HostedFold) else HostedFold(f, dedupe=dedupe, collect=collect)
                for f in folds
            ]
        )
        self.store = store
        self.barrier = barrier
        self.owns = owns
        self.skipped = 0
        #: records some fold had folded already (a redelivery, a producer's retry)
        self.duplicates = 0
        self.dead_letters: list[DeadLetter] = []
        #: when a list: a tag per derived event out, ``(fold index, source, rank)`` —
        #: :attr:`source` as the caller set it for the record, rank the released run's
        #: ``(held time, run id)`` or :data:`DIRECT` (a key-sharded replay merges its
        #: shards' outputs back into one process's order by them)
        self.tags: list[tuple[int, Any, tuple[float, str]]] | None = None
        self.source: Any = None
        self._plans: dict[str, tuple[tuple[Any, ...], ...]] = {}
        loaded = store.load(self.folds)
        self.positions: dict[Position, int] = dict(loaded.positions)
        for hf in self.folds:
            hf.starts = dict(loaded.fold_starts.get(hf.name, {}))
            for key, raw in loaded.fold_states.get(hf.name, {}).items():
                hf.load(key, raw)
        #: folds whose saved positions are ahead of the host's (they skip what they did)
        self._catching_up = any(
            hf.starts.get(t, 0) > self.positions.get((t, 0), 0)
            for hf in self.folds
            for t in hf.fold.inputs
        )
        if barrier is not None:
            barrier.load_doc(loaded.held)
        self.view: View | None = view(loaded.snapshot) if view is not None else None

    # -- feeding -------------------------------------------------------------------------

    def process(self, records: Iterable[Record]) -> list[EventBase]:
        """Apply records (any topics, any interleaving); the derived events, in order."""
        routes, positions = self.folds.routes, self.positions
        fresh: list[Record] = []
        for rec in records:
            if rec.topic not in routes:
                continue
            where = (rec.topic, rec.partition)
            if rec.offset < positions.get(where, 0):
                self.skipped += 1
                continue
            positions[where] = rec.offset + 1
            fresh.append(rec)
        return self.process_decoded(fresh, decode_many([r.value for r in fresh]))

    def accept(
        self, records: Sequence[Record], events: Sequence[EventBase | DeadLetter]
    ) -> tuple[list[Record], list[EventBase | DeadLetter]]:
        """The records (with their decoded events) this host reads and has not applied
        yet, its positions moved past them: what :meth:`process_decoded` takes."""
        routes, positions = self.folds.routes, self.positions
        keep = []
        for i, rec in enumerate(records):
            if rec.topic not in routes:
                continue
            where = (rec.topic, rec.partition)
            if rec.offset < positions.get(where, 0):
                self.skipped += 1
                continue
            positions[where] = rec.offset + 1
            keep.append(i)
        if len(keep) == len(records):
            return list(records), list(events)
        return [records[i] for i in keep], [events[i] for i in keep]

    def process_decoded(
        self, records: Sequence[Record], events: Sequence[EventBase | DeadLetter]
    ) -> list[EventBase]:
        """:meth:`process` for records already positioned and decoded (a replay that feeds
        several hosts from one read and one decode)."""
        out: list[EventBase] = []
        apply, barrier, owns = self._apply, self.barrier, self.owns
        catching_up = self._catching_up
        for rec, ev in zip(records, events):
            if owns is not None and not self._owned(rec, ev, out):
                continue
            if type(ev) is DeadLetter:
                letter = ev.located(rec.topic, rec.partition, rec.offset)
                self.dead_letters.append(letter)
                if self.view is not None:
                    self.view.dead_letter(letter)
                continue
            if barrier is None:
                apply(rec.topic, ev, out, rec.offset if catching_up else -1)
                continue
            topic = rec.topic
            advanced = topic in barrier.topic_set and barrier.advance(topic, rec.partition, ev.ts)
            # nothing held and not a lifecycle fact: nothing to hold (the common case)
            if (not barrier.held and topic != barrier.lifecycle) or barrier.admit(
                topic, rec.partition, ev
            ):
                apply(topic, ev, out, -1)
            if advanced and barrier.due(rec.partition):
                barrier.release(lambda t, e: apply(t, e, out, -1), force=False)
        if catching_up:
            self._catching_up = any(
                hf.starts.get(t, 0) > self.positions.get((t, 0), 0)
                for hf in self.folds
                for t in hf.fold.inputs
            )
        return out

    def process_events(self, items: Iterable[tuple[str, int, EventBase]]) -> list[EventBase]:
        """Apply decoded events ``(topic, partition, event)``, without positions."""
        out: list[EventBase] = []
        barrier = self.barrier
        for topic, partition, ev in items:
            if barrier is None:
                self._apply(topic, ev, out, -1)
                continue
            advanced = topic in barrier.topic_set and barrier.advance(topic, partition, ev.ts)
            if barrier.admit(topic, partition, ev):
                self._apply(topic, ev, out, -1)
            if advanced and barrier.due(partition):
                barrier.release(lambda t, e: self._apply(t, e, out, -1), force=False)
        return out

    def release_held(self, force: bool = True) -> list[EventBase]:
        """Apply the runs held at the barrier (``force``: all of them); what they derived."""
        out: list[EventBase] = []
        if self.barrier is not None:
            self.barrier.release(lambda t, e: self._apply(t, e, out, -1), force)
        return out

    def _owned(self, rec: Record, ev: EventBase | DeadLetter, out: list[EventBase]) -> bool:
        """Key-sharded: is ``rec`` this host's to apply? Another run's barrier fact only
        moves the watermarks (and may release a held run of ours)."""
        assert self.owns is not None
        if type(ev) is DeadLetter:
            return self.owns(rec.key)  # reported once, by the owner of its record key
        key = ev.run_id.encode()
        if rec.key is not None and rec.key != key:
            raise ValueError(
                f"record {rec.topic}:{rec.partition}@{rec.offset} is keyed {rec.key!r} but "
                f"belongs to run {ev.run_id!r}: a key-sharded replay needs records keyed by "
                f"their run id (replay with one worker)"
            )
        if self.owns(key):
            return True
        barrier = self.barrier
        if (
            barrier is not None
            and rec.topic in barrier.topic_set
            and barrier.advance(rec.topic, rec.partition, ev.ts)
            and barrier.due(rec.partition)
        ):
            barrier.release(lambda t, e: self._apply(t, e, out, -1), force=False)
        return False

    def _plan(self, topic: str) -> tuple[tuple[Any, ...], ...]:
        """Per fold of ``topic``, what :meth:`_apply` needs, looked up once."""
        plan = self._plans.get(topic)
        if plan is None:
            plan = self._plans[topic] = tuple(
                (
                    hf,
                    hf.dedupe,
                    hf.fold.apply,
                    hf.fold.key_of,
                    hf.fold.initial,
                    hf.slots if hf.dedupe else hf.states,
                    hf.dirty,
                    hf.emit,
                    hf.emitted if hf.collect else None,
                )
                for hf in self.folds.routes[topic]
            )
        return plan

    def _apply(self, topic: str, ev: EventBase, out: list[EventBase], offset: int) -> None:
        """Fold one event into the view and every fold of its topic (the hot path: what
        :meth:`HostedFold.feed` does per key is inlined for folds without dedupe)."""
        view = self.view
        target = None
        if view is not None:
            target = view.admit(topic, ev)
            if target is None:
                return  # a run id claimed by another tenant: never merged
        duplicate = False
        for hf, dedupe, apply, key_of, initial, states, dirty, emit, emitted in self._plan(topic):
            if offset >= 0 and hf.behind(topic, offset):
                continue
            key = key_of(ev)
            if dedupe:
                slot = states.get(key)
                if slot is None:
                    slot = states[key] = Slot(initial(), RecentIds(capacity=hf.window))
                if not slot.recent.first_time(ev.event_id):
                    hf.duplicates += 1
                    duplicate = True
                    continue
                slot.state, derived = apply(slot.state, ev)
                dirty.add(key)
            else:
                before = states.get(key)
                if before is None:
                    before = initial()
                state, derived = apply(before, ev)
                if state is not before:
                    states[key] = state
                    dirty.add(key)
            if derived and emitted is not None:
                emitted.extend(derived)
            if derived:
                if target is not None:
                    view.derived(target, derived)  # type: ignore[union-attr]
                if emit:
                    out.extend(derived)
                    if self.tags is not None:
                        self._tag(hf, len(derived))
        if duplicate:
            self.duplicates += 1

    def _tag(self, hf: HostedFold, n: int) -> None:
        releasing = self.barrier.releasing if self.barrier is not None else None
        tag = (self.folds.index(hf), self.source, releasing or DIRECT)
        self.tags.extend([tag] * n)  # type: ignore[union-attr]

    # -- committing ----------------------------------------------------------------------

    def checkpoint(self) -> None:
        """Commit what changed since the last checkpoint with the positions, atomically.
        Fold decisions are shown in the view here (once per batch, not per event)."""
        view = self.view
        if view is not None:
            for hf in self.folds:
                for key in hf.dirty:
                    view.sync(hf.fold, key, hf.state_of(key))
        barrier = self.barrier
        held = barrier.to_doc() if barrier is not None and barrier.dirty else None
        if barrier is not None:
            barrier.dirty = False
        self.store.commit(
            Commit(
                positions=dict(self.positions),
                fold_states={hf.name: hf.take_dirty() for hf in self.folds},
                held=held,
                view=view.take_batch() if view is not None else None,
            )
        )

    # -- what it holds -------------------------------------------------------------------

    def states(self, fold: str) -> dict[str, Any]:
        """Every key's current state of ``fold`` (a copy of the mapping)."""
        hf = self.folds[fold]
        if hf.dedupe:
            return {k: s.state for k, s in hf.slots.items()}
        return dict(hf.states)

    @property
    def held(self) -> dict[str, Any]:
        return self.barrier.held if self.barrier is not None else {}

    @property
    def watermarks(self) -> dict[str, float]:
        return self.barrier.watermarks if self.barrier is not None else {}

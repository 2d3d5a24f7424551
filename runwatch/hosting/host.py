"""The one host: records in, decoded once, folds applied, derived events out, state committed
with the positions it reflects (``docs/hosting.md``).

Per record: skip it if it is before the host's position of its ``topic:partition``;
decode it once for every fold that reads it (:func:`events.fast_decode.decode_many`; a
dead letter is located and kept in :attr:`Host.dead_letters` for the caller); with the
options, apply only the shard's runs (``owns``), hold it at the terminal barrier
(``barrier``, :mod:`runwatch.hosting.barrier`), fold it into its run's view (``view``,
:class:`projections.materializer.Materializer`: a foreign tenant's claim stops it there);
then every fold of its topic folds it (:class:`~runwatch.hosting.core.HostedFold`; with
``dedupe``, once per event id, and only if the run is the event's tenant's: the first
event of a run this host folds pins it for every fold of its co-partitioned group, as on
faust (:func:`~runwatch.hosting.tenancy.group_pins`); another tenant's
claim on the run id is refused and dead-lettered) and what it derives goes to the view and
out.
:meth:`Host.checkpoint` commits fold states, positions, held records and the view's batch
through the host's store (:mod:`runwatch.hosting.stores`) in one atomic write.

Time: nothing here reads a clock (the follower's settle time is its caller's).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

from events.dead_letter import DeadLetter
from events.envelope import EventBase
from events.fast_decode import decode_many
from events.fold import Fold
from events.log.base import Record
from runwatch.hosting.barrier import TerminalBarrier
from runwatch.hosting.core import FoldSet, HostedFold, RecentIds, Slot
from runwatch.hosting.ports import DIRECT, Commit, Position, StateStore, View
from runwatch.hosting.tenancy import fold_failed_letter, foreign_letter, group_pins

log = logging.getLogger("runwatch.hosting")


class PositionBeyondEnd(RuntimeError):
    """A host's stored position is past the log's end: refuse to go on (loudly) rather
    than skip the records that will be appended at offsets it already passed."""

    #: the CLI prints the message as it is (the log's state, not a bug in runwatch)
    told_as_is = True

    def __init__(self, where: Position, position: int, end: int, fold: str | None = None) -> None:
        self.where, self.position, self.end = where, position, end
        topic, partition = where
        whose = f"fold {fold}'s" if fold else "this host's"
        super().__init__(
            f"{topic}:{partition}: {whose} stored position is {position} but the log ends at "
            f"{end}: records it folded are gone from the log (cut by a writer, or the log "
            "restored from an older copy). Refusing to go on: the next records appended "
            f"would reuse offsets {end}..{position - 1} and be skipped as already folded. "
            f"Look at {topic}/quarantine/ and restore the log, or remove this host's stored "
            "state to fold the log again from the start."
        )


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
        #: records refused (their run id is another tenant's; each is a dead letter too)
        self.refused = 0
        #: records a fold raised on (dead-lettered, ``fold_failed``)
        self.fold_failures = 0
        #: the runs' tenants, for hosts of deduplicating folds (the processors; the read
        #: model's view pins its own): :mod:`runwatch.hosting.tenancy`
        self.pins_by_topic = group_pins(self.folds)
        #: the pins of the run's own topics (None: no deduplicating fold reads them)
        self.pins = self.pins_by_topic.get("runwatch.lifecycle") or next(
            iter(self.pins_by_topic.values()), None
        )
        #: the record being applied (where a refused one is located)
        self._at: Record | None = None
        #: when a list: a tag per derived event out, ``(fold index, source, rank)`` —
        #: :attr:`source` as the caller set it for the record, rank the released run's
        #: ``(held time, run id)`` or :data:`DIRECT` (a key-sharded replay merges its
        #: shards' outputs back into one process's order by them)
        self.tags: list[tuple[int, Any, tuple[float, str]]] | None = None
        self.source: Any = None
        loaded = store.load(self.folds)
        self.positions: dict[Position, int] = dict(loaded.positions)
        for hf in self.folds:
            hf.starts = dict(loaded.fold_starts.get(hf.name, {}))
            for key, raw in loaded.fold_states.get(hf.name, {}).items():
                hf.load(key, raw)
        #: folds whose saved positions are ahead of the host's (they skip what they did)
        self._catching_up = self._ahead()
        if barrier is not None:
            barrier.load_doc(loaded.held)
        self.view: View | None = view(loaded.snapshot) if view is not None else None

    # -- feeding -------------------------------------------------------------------------

    def process(self, records: Iterable[Record]) -> list[EventBase]:
        """Apply records (any topics, any interleaving); the derived events, in order."""
        fresh = self._fresh(records)
        return self.process_decoded(fresh, decode_many([r.value for r in fresh]))

    def accept(
        self, records: Sequence[Record], events: Sequence[EventBase | DeadLetter]
    ) -> tuple[list[Record], list[EventBase | DeadLetter]]:
        """The records (with their decoded events) this host reads and has not applied
        yet, its positions moved past them: what :meth:`process_decoded` takes."""
        fresh = self._fresh(records)
        if len(fresh) == len(records):
            return fresh, list(events)
        index = {id(rec): i for i, rec in enumerate(records)}
        return fresh, [events[index[id(rec)]] for rec in fresh]

    def check_ends(self, ends: Mapping[Position, int]) -> None:
        """Raise :class:`PositionBeyondEnd` when a stored position (the host's, or a
        fold's own) is past the end of its ``topic:partition`` in ``ends`` (the log's
        current ends; a position not in ``ends`` is not checked). Records it folded are
        then gone from the log (a writer cut them, or the log was restored from an older
        copy): the records appended next reuse those offsets, and :meth:`_fresh` would
        skip them silently as already applied (review finding). Call it before reading.
        Assumption: offsets are dense and never reused by a healthy log, so an end below
        a committed position is always an error, never a race (logs only grow)."""
        for where, position in self.positions.items():
            end = ends.get(where)
            if end is not None and position > end:
                raise PositionBeyondEnd(where, position, end)
        for hf in self.folds:
            for topic, start in hf.starts.items():
                end = ends.get((topic, 0))
                if end is not None and start > end:
                    raise PositionBeyondEnd((topic, 0), start, end, hf.name)

    def _fresh(self, records: Iterable[Record]) -> list[Record]:
        """The records of this host's topics not applied yet; positions moved past them."""
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
        return fresh

    def process_decoded(
        self, records: Sequence[Record], events: Sequence[EventBase | DeadLetter]
    ) -> list[EventBase]:
        """:meth:`process` for records already positioned and decoded (a replay that feeds
        several hosts from one read and one decode)."""
        out: list[EventBase] = []
        apply, route, barrier, owns = self._apply, self._route, self.barrier, self.owns
        catching_up = self._catching_up
        for rec, ev in zip(records, events):
            self._at = rec
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
            elif rec.topic not in barrier.guarded and ev.run_id not in barrier.held:
                apply(rec.topic, ev, out, -1)  # its run not held, nothing to hold (the usual)
            else:
                route(rec.topic, rec.partition, ev, out)
        self._at = None
        if catching_up:
            self._catching_up = self._ahead()
        return out

    def _ahead(self) -> bool:
        """Is a fold's saved position ahead of the host's (embedded state files only)?"""
        pos = self.positions
        return any(hf.starts.get(t, 0) > pos.get((t, 0), 0) for hf in self.folds for t in hf.starts)

    def process_events(self, items: Iterable[tuple[str, int, EventBase]]) -> list[EventBase]:
        """Apply decoded events ``(topic, partition, event)``, without positions."""
        out: list[EventBase] = []
        for topic, partition, ev in items:
            self._route(topic, partition, ev, out)
        return out

    def _route(self, topic: str, partition: int, ev: EventBase, out: list[EventBase]) -> None:
        """Apply ``ev`` now or hold it at the barrier; release what its time frees."""
        barrier = self.barrier
        if barrier is None:
            self._apply(topic, ev, out, -1)
            return
        advanced = topic in barrier.topic_set and barrier.advance(topic, partition, ev.ts)
        # nothing held and not a lifecycle fact: nothing to hold (the common case)
        if (not barrier.held and topic != barrier.lifecycle) or barrier.admit(topic, partition, ev):
            self._apply(topic, ev, out, -1)
        if advanced and barrier.due(partition):
            barrier.release(lambda t, e: self._release(t, e, out), force=False)

    def release_held(
        self, force: bool = True, only: Collection[str] | None = None
    ) -> list[EventBase]:
        """Apply the runs held at the barrier (``force``: all of them, or all of ``only``'s
        run ids and those the watermarks passed); what they derived."""
        out: list[EventBase] = []
        if self.barrier is not None:
            self.barrier.release(lambda t, e: self._release(t, e, out), force, only)
        return out

    def _release(self, topic: str, ev: EventBase, out: list[EventBase]) -> None:
        """Apply a held event the barrier released (not the record being read)."""
        self._at = None
        self._apply(topic, ev, out, -1)

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
            barrier.release(lambda t, e: self._release(t, e, out), force=False)
        return False

    def _apply(self, topic: str, ev: EventBase, out: list[EventBase], offset: int) -> None:
        """Fold one event into the view and every fold of its topic (the hot path: what
        :meth:`HostedFold.feed` does per key is inlined for folds without dedupe)."""
        view = self.view
        target = None
        if view is not None:
            target = view.admit(topic, ev)
            if target is None:
                return  # a run id claimed by another tenant: never merged
        pins = self.pins_by_topic.get(topic) if self.pins_by_topic else None
        if pins is not None:  # the run's tenant, for every fold of its group (one lookup)
            owner = pins.by_run.get(ev.run_id) or pins.owner_of(ev, topic)
            if owner != ev.tenant_id:
                self._refuse(topic, ev, owner)
                return
        duplicate = False
        plan = self.folds.plans.get(topic)
        if plan is None:
            plan = self.folds.plan(topic)
        for hf, dedupe, apply, key_of, initial, states, dirty, emit, emitted, track in plan:
            try:  # (free unless raised: a fold that raises on one event stops nothing else)
                if offset >= 0 and hf.behind(topic, offset):
                    continue
                key = key_of(ev)
                if dedupe:
                    slot = states.get(key)
                    if slot is None:  # its tenant: the run's pin (none yet: a command)
                        slot = states[key] = Slot(
                            initial(),
                            RecentIds(capacity=hf.window),
                            pins.by_run.get(ev.run_id),  # type: ignore[union-attr]
                        )
                    elif slot.tenant is None:  # stored unpinned (or before slots held tenants)
                        slot.tenant = pins.by_run.get(ev.run_id)  # type: ignore[union-attr]
                    if not track:  # folded twice to no effect: ids not kept (untracked_topics)
                        before = slot.state
                        slot.state, derived = apply(before, ev)
                        if slot.state is not before:
                            dirty.add(key)
                    elif not slot.recent.first_time(ev.event_id):
                        hf.duplicates += 1
                        duplicate = True
                        continue
                    else:
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
            except Exception as exc:
                self._failed(topic, ev, hf, exc)
                continue
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

    def _failed(self, topic: str, ev: EventBase, hf: HostedFold, exc: Exception) -> None:
        """Dead-letter ``ev`` for fold ``hf``, which raised on it: not folded there (its
        key's state stays as it was, its id stays seen: a redelivery is not retried), and
        every other fold and record goes on. (Found by review: one tenant's record that a
        processor could not handle stopped every tenant's processors on every start.)"""
        self.fold_failures += 1
        letter = fold_failed_letter(ev, hf.name, exc, topic, *self._where())
        log.error("runwatch: %s (%s)", letter.reason, topic)
        self._keep(letter)

    def _refuse(self, topic: str, ev: EventBase, owner: str) -> None:
        """Dead-letter ``ev``: its run id is ``owner``'s, not its tenant's (once per record,
        whichever folds refused it)."""
        self.refused += 1
        self._keep(foreign_letter(ev, owner, topic, *self._where()))

    def _where(self) -> tuple[int, int] | tuple[()]:
        """The record being applied, as (partition, offset); () for a held record the
        barrier released, or one without a position."""
        at = self._at
        return (at.partition, at.offset) if at is not None else ()

    def _keep(self, letter: DeadLetter) -> None:
        self.dead_letters.append(letter)
        if self.view is not None:
            self.view.dead_letter(letter)

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

"""What every host does with one decoded event: find the key's state, dedupe, apply.

A *slot* is one key's hosted state: the fold's state plus the ids of the last
:data:`DEDUPE_WINDOW` events folded into it (at-least-once delivery repeats events; a
producer retry may append one twice). Every host keeps the same slots with the same window,
so they absorb the same duplicates and emit the same derived events.

A slot also holds the tenant its run belongs to: a host pins a run once for all its folds
and every slot keeps that tenant, which is where the pin persists
(:mod:`runwatch.hosting.tenancy`: another tenant's events on the run id are refused).

- :class:`HostedFold`: one fold in a host, its slots by key, the keys changed since the
  last commit, and the events it derived (for a replay that reports them fold by fold).
- :class:`FoldSet`: the folds one host runs, routed by topic: an event is decoded once and
  handed to every fold that reads its topic.

Slot bytes (what the faust table stores and the embedded state file holds per key):
msgpack ``{"state": <fold state bytes>, "recent": <the 16-byte ids, oldest first>,
"tenant": <the run's tenant>}`` (a slot stored without ``tenant`` is pinned by the next
event)
(compact on purpose: the faust host writes it to the changelog for every event). A fold
hosted without deduplication (the read model's: its records are applied exactly once by
their positions) is stored as its bare state bytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import msgpack

from events.dedupe import Deduplicator
from events.envelope import EventBase
from events.fold import Fold
from runwatch.hosting.tenancy import foreign_owner

#: Event ids remembered per key. A redelivery reaches back at most one uncommitted batch
#: (the faust app commits every 100 events); folds that must absorb older repeats do it
#: themselves (the run-health fold ignores late steps whatever the window).
DEDUPE_WINDOW = 256


class RecentIds(Deduplicator):
    """The last ``capacity`` event ids of one key (the shared :class:`Deduplicator`),
    packed as 16 bytes per id for the host's persisted state."""

    __slots__ = ()

    def __init__(self, ids: Iterable[bytes] = (), capacity: int = DEDUPE_WINDOW) -> None:
        super().__init__(capacity)
        for i in ids:
            self.first_time(i)

    def pack(self) -> bytes:
        return b"".join(self.ids())

    @classmethod
    def unpack(cls, raw: bytes) -> RecentIds:
        return cls(raw[i : i + 16] for i in range(0, len(raw), 16))


class Slot:
    """One key's live state in a host (mutable holder of an immutable fold state), and the
    tenant its run belongs to (``None``: not pinned yet)."""

    __slots__ = ("recent", "state", "tenant")

    def __init__(self, state: Any, recent: RecentIds, tenant: str | None = None) -> None:
        self.state = state
        self.recent = recent
        self.tenant = tenant


def new_slot(fold: Fold[Any]) -> Slot:
    return Slot(fold.initial(), RecentIds())


def dump_slot(fold: Fold[Any], slot: Slot) -> bytes:
    doc: dict[str, Any] = {"state": fold.dump_state(slot.state), "recent": slot.recent.pack()}
    if slot.tenant is not None:
        doc["tenant"] = slot.tenant
    return msgpack.packb(doc, use_bin_type=True)


def load_slot(fold: Fold[Any], raw: bytes | None) -> Slot:
    if raw is None:
        return new_slot(fold)
    doc = msgpack.unpackb(raw, raw=False)
    return Slot(fold.load_state(doc["state"]), RecentIds.unpack(doc["recent"]), doc.get("tenant"))


def untracked_topics(fold: Fold[Any]) -> frozenset[str]:
    """The input topics whose events ``fold`` may fold twice to no effect
    (``fold.replayable_inputs``, none by default, :class:`events.fold.Fold`): a
    deduplicating host folds them without recording their ids in the key's window, so a
    flood of them (every step of a run, to a fold that acts on a few lifecycle facts)
    cannot push the ids that matter out of it, and stores the state only when it changed
    (review, 2026-11-28: after ~256 steps a redelivered old ``RunPaused`` was folded
    again by the run controller)."""
    return frozenset(getattr(fold, "replayable_inputs", ()))


def apply_event(fold: Fold[Any], slot: Slot, event: EventBase) -> Sequence[EventBase] | None:
    """Fold ``event`` into ``slot``; the derived events, or ``None`` for a duplicate (or
    an event of an untracked topic that changed nothing: nothing to store). The caller
    checks the run's tenant first (:mod:`runwatch.hosting.tenancy`)."""
    if type(event).TOPIC in untracked_topics(fold):
        before = slot.state
        slot.state, derived = fold.apply(before, event)
        return None if slot.state is before and not derived else derived
    if not slot.recent.first_time(event.event_id):
        return None
    slot.state, derived = fold.apply(slot.state, event)
    return derived


class HostedFold:
    """One fold in a host: per-key state, the keys changed since the last commit.

    ``dedupe``: keep a window of recent event ids per key and fold each id once (the
    processors' hosts); off, every event handed in is folded (the read model's host,
    which applies each record once by its stored position) and the states are kept bare.
    ``emit``: whether the events this fold derives are the host's output; a fold hosted
    only to feed a read model (its derived events are another host's to publish) keeps
    them for the view. ``collect``: keep every derived event in :attr:`emitted` (a replay
    that reports what each fold derived, fold by fold).

    ``starts``: per topic, the first offset this fold has not folded yet (a fold whose
    saved position is ahead of its host's, e.g. beside a fold added later, skips what it
    folded already; see :meth:`behind`).
    """

    __slots__ = (
        "collect",
        "dedupe",
        "dirty",
        "duplicates",
        "emit",
        "emitted",
        "fold",
        "name",
        "refused",
        "slots",
        "starts",
        "states",
        "untracked",
        "window",
    )

    def __init__(
        self,
        fold: Fold[Any],
        *,
        dedupe: bool = True,
        emit: bool = True,
        collect: bool = False,
        window: int = DEDUPE_WINDOW,
    ) -> None:
        self.fold = fold
        self.window = window
        #: topics folded without recording ids (:func:`untracked_topics`)
        self.untracked = untracked_topics(fold)
        self.name: str = fold.name
        self.dedupe = dedupe
        self.emit = emit
        self.collect = collect
        #: key -> slot (dedupe) ...
        self.slots: dict[str, Slot] = {}
        #: ... or key -> bare fold state (no dedupe)
        self.states: dict[str, Any] = {}
        self.dirty: set[str] = set()
        self.duplicates = 0
        #: events refused: their run id belongs to another tenant (deduplicating hosts)
        self.refused = 0
        self.emitted: list[EventBase] = []
        self.starts: dict[str, int] = {}

    def feed(self, event: EventBase) -> Sequence[EventBase] | None:
        """Fold ``event`` into its key's state; the derived events (``None``: a duplicate,
        or refused: another tenant's run, counted in :attr:`refused`)."""
        fold = self.fold
        key = fold.key_of(event)
        if self.dedupe:
            slot = self.slots.get(key)
            if slot is None:
                slot = self.slots[key] = Slot(
                    fold.initial(), RecentIds(capacity=self.window), event.tenant_id
                )
            elif foreign_owner(slot, event) is not None:
                self.refused += 1
                return None
            if type(event).TOPIC in self.untracked:
                before = slot.state
                slot.state, derived = fold.apply(before, event)
                if slot.state is not before:
                    self.dirty.add(key)
            else:
                if not slot.recent.first_time(event.event_id):
                    self.duplicates += 1
                    return None
                slot.state, derived = fold.apply(slot.state, event)
                self.dirty.add(key)
        else:
            states = self.states
            before = states.get(key)
            if before is None:
                before = fold.initial()
            state, derived = fold.apply(before, event)
            if state is not before:
                states[key] = state
                self.dirty.add(key)
        if derived and self.collect:
            self.emitted.extend(derived)
        return derived

    def state_for(self, key: str) -> Any:
        """``key``'s state (its initial state if none was folded yet)."""
        state = self.state_of(key)
        return self.fold.initial() if state is None else state

    def put_state(self, key: str, state: Any) -> None:
        """Replace ``key``'s state (a host restoring a snapshot); its remembered ids stay."""
        if self.dedupe:
            slot = self.slots.get(key)
            if slot is None:
                self.slots[key] = Slot(state, RecentIds(capacity=self.window))
            else:
                slot.state = state
        else:
            self.states[key] = state
        self.dirty.add(key)

    def behind(self, topic: str, offset: int) -> bool:
        """Was the record at ``offset`` of ``topic`` folded here already?"""
        return offset < self.starts.get(topic, 0)

    # -- persisted form ------------------------------------------------------------------

    def state_of(self, key: str) -> Any:
        if self.dedupe:
            slot = self.slots.get(key)
            return slot.state if slot is not None else None
        return self.states.get(key)

    def dump(self, key: str) -> bytes:
        if self.dedupe:
            return dump_slot(self.fold, self.slots[key])
        return self.fold.dump_state(self.states[key])

    def load(self, key: str, raw: bytes) -> None:
        if self.dedupe:
            self.slots[key] = load_slot(self.fold, raw)
        else:
            self.states[key] = self.fold.load_state(raw)

    def take_dirty(self) -> dict[str, bytes]:
        """The changed keys' persisted bytes; clears the changed set."""
        out = {key: self.dump(key) for key in self.dirty}
        self.dirty.clear()  # in place: hosts hold on to the set
        return out


class FoldSet:
    """The folds of one host, routed by input topic (in the given order: a fold later in
    the list sees an event after the folds before it)."""

    def __init__(self, hosted: Sequence[HostedFold]) -> None:
        self.hosted = list(hosted)
        names = [h.name for h in self.hosted]
        if len(set(names)) != len(names):
            raise ValueError(f"folds hosted twice: {names}")
        routes: dict[str, list[HostedFold]] = {}
        for h in self.hosted:
            for topic in h.fold.inputs:
                routes.setdefault(topic, []).append(h)
        #: topic -> the hosted folds that read it
        self.routes: dict[str, tuple[HostedFold, ...]] = {t: tuple(h) for t, h in routes.items()}
        #: every topic read, sorted
        self.topics: tuple[str, ...] = tuple(sorted(routes))
        #: topic -> :meth:`plan`'s answer, once asked (hosts read it directly: hot path)
        self.plans: dict[str, tuple[tuple[Any, ...], ...]] = {}

    def plan(self, topic: str) -> tuple[tuple[Any, ...], ...]:
        """Per fold of ``topic``, what a host's hot path needs, looked up once: (hosted
        fold, dedupe, apply, key_of, initial, its slots or states, its changed keys, emit,
        its emitted list or None, whether to record the topic's ids: False for a fold's
        untracked topics). The containers are the fold's own, kept in place."""
        plan = self.plans.get(topic)
        if plan is None:
            plan = self.plans[topic] = tuple(
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
                    topic not in hf.untracked,
                )
                for hf in self.routes.get(topic, ())
            )
        return plan

    @classmethod
    def of(cls, folds: Iterable[Fold[Any]], **options: Any) -> FoldSet:
        return cls([HostedFold(f, **options) for f in folds])

    def index(self, hosted: HostedFold) -> int:
        return self.hosted.index(hosted)

    def __getitem__(self, name: str) -> HostedFold:
        for h in self.hosted:
            if h.name == name:
                return h
        raise KeyError(name)

    def __iter__(self) -> Any:
        return iter(self.hosted)

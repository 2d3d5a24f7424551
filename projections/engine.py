"""The projection engine: records in, folds applied, views materialized, offsets tracked.

One engine hosts the two projection folds (:class:`~projections.run_state.RunStateFold`,
:class:`~projections.accounting.AccountingFold`) for every run and the views of
:mod:`projections.views`, over the input topics :data:`INPUTS`. It is host-agnostic: the
live follower (:mod:`projections.feed`) and the audit replay (:mod:`projections.replay`)
feed it records, from Kafka or from the embedded log.

Exactly-once effect: every record's position is tracked per ``topic:partition``; a record
before the stored position was already applied and is skipped, and positions are
committed with the views in one :meth:`ReadModel.commit`.

The terminal barrier (what makes live processing and a replay agree, see
:mod:`projections.run_state`): a run's terminal lifecycle event (RunCompleted, RunFailed,
RunCancelled), and the trainer's RunPaused (the answer to a command an alert caused), is
*held*, together with every later record of that run, until each
barrier topic (alerts, rewards, checkpoints) of that partition has delivered a record
with an event time past the terminal's — so alerts and ledger facts from before the end
are folded first whatever order the topics were read in — or until the host releases it
(:meth:`release_held`: the replay at the end of the log, the live follower once it is
caught up and a short settle time passed). Held records are persisted with the view.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable
from typing import Any

from events.codec import EVENT_ADAPTER, decode
from events.dead_letter import DeadLetter
from events.envelope import EventBase
from events.log.base import Record
from projections.accounting import AccountingFold, RunUsage
from projections.policy import Prices, RunStatePolicy
from projections.run_state import RunStateFold, RunStatus
from projections.store import Batch, ReadModel
from projections.views import (
    Fleet,
    Points,
    RunView,
    apply_derived,
    apply_primary,
    sync_status,
    sync_usage,
)

LIFECYCLE = "runwatch.lifecycle"
TELEMETRY = "runwatch.telemetry"
BARRIER_TOPICS = ("runwatch.alerts", "runwatch.rewards", "runwatch.checkpoints")
INPUTS = (LIFECYCLE, *BARRIER_TOPICS, TELEMETRY)
TERMINAL_TYPES = frozenset({"RunCompleted", "RunFailed", "RunCancelled"})
#: Lifecycle facts held behind the barrier: the terminals, and the trainer's pause — it
#: answers a command an alert caused, so the alerts before it in event time must be folded
#: first, or a live host and a replay would tell the pause differently (a late alert would
#: rewrite an emitted PAUSED_BY_GATE). A paused trainer writes nothing, so the live
#: follower catches up and releases it within its settle time. (RunResumed is not held:
#: holding it would hold the whole resumed run while it trains.)
HELD_TYPES = TERMINAL_TYPES | frozenset({"RunPaused"})
_RUN_STATE_TOPICS = frozenset((LIFECYCLE, *BARRIER_TOPICS))
_BARRIER_SET = frozenset(BARRIER_TOPICS)
_NEVER = float("-inf")


class ProjectionEngine:
    def __init__(
        self,
        store: ReadModel,
        policy: RunStatePolicy | None = None,
        prices: Prices | None = None,
        barrier: bool = True,
        owns: Callable[[bytes | None], bool] | None = None,
    ) -> None:
        """``owns``: for a key-sharded replay (:mod:`projections.sharded`), whether a run
        key (``run_id`` bytes; a record without a key: its record key ``None``) is this
        engine's. Records of other runs are not applied, but other runs' records on the
        barrier topics still move the barrier's watermarks, which are global, so held
        terminals are released exactly where a single engine releases them."""
        self.store = store
        self.owns = owns
        self.run_state = RunStateFold(policy)
        self.accounting = AccountingFold(prices)
        self.barrier = barrier
        snap = store.load()
        self.positions: dict[str, int] = dict(snap.positions)
        self.status: dict[str, RunStatus] = {}
        self.usage: dict[str, RunUsage] = {}
        for (fold, key), raw in snap.fold_states.items():
            if fold == self.run_state.name:
                self.status[key] = self.run_state.load_state(raw)
            elif fold == self.accounting.name:
                self.usage[key] = self.accounting.load_state(raw)
        self.views: dict[str, RunView] = snap.views
        self.fleet: Fleet = snap.fleet
        held = snap.held or {}
        self.watermarks: dict[str, float] = dict(held.get("watermarks", {}))
        self.held: dict[str, list[tuple[str, int, EventBase]]] = {
            rid: [(t, p, _unpack(v)) for t, p, v in queue]
            for rid, queue in held.get("runs", {}).items()
        }
        self._next_due = min((q[0][2].ts for q in self.held.values()), default=float("inf"))
        self.applied = 0
        self.skipped = 0
        self.rejected_foreign = 0
        self.dead_letters: list[DeadLetter] = []
        self._dirty_views: set[str] = set()
        self._dirty_status: set[str] = set()
        self._dirty_usage: set[str] = set()
        self._points: Points = {}
        self._held_dirty = False

    # ------------------------------------------------------------------ feeding
    def process(self, records: Iterable[Record]) -> list[EventBase]:
        """Apply records (any topics, any interleaving); return the derived events.

        A chunk is decoded by the union's validator without the codec's diagnosis; if any
        record in it is bad the chunk falls back to the codec record by record, so a bad
        record becomes a dead letter and nothing else is lost.
        """
        out: list[EventBase] = []
        positions = self.positions
        fresh = []
        for rec in records:
            pk = f"{rec.topic}:{rec.partition}"
            if rec.offset < positions.get(pk, 0):
                self.skipped += 1
                continue
            positions[pk] = rec.offset + 1
            fresh.append(rec)
        route, apply, owns = self._route, self._apply, self.owns
        for rec, ev in zip(fresh, _decode_many([r.value for r in fresh])):
            if owns is not None and not self._owned(rec, ev, out):
                continue
            if isinstance(ev, DeadLetter):
                self.fleet.dead_letters += 1
                self.dead_letters.append(ev.located(rec.topic, rec.partition, rec.offset))
            elif rec.topic == TELEMETRY and not self.held:
                apply(TELEMETRY, ev, out)  # most records: no barrier, nothing held
            else:
                route(rec.topic, rec.partition, ev, out)
        return out

    def process_events(self, items: Iterable[tuple[str, int, EventBase]]) -> list[EventBase]:
        """Apply already decoded events (``(topic, partition, event)``), no positions."""
        out: list[EventBase] = []
        for topic, partition, ev in items:
            self._route(topic, partition, ev, out)
        return out

    def _owned(self, rec: Record, ev: EventBase | DeadLetter, out: list[EventBase]) -> bool:
        """Key-sharded: is ``rec`` this engine's to apply? Another run's barrier-topic fact
        only moves the watermarks (and may release a held run of ours)."""
        assert self.owns is not None
        if isinstance(ev, DeadLetter):
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
        advanced = rec.topic in _BARRIER_SET and self._advance(rec.topic, rec.partition, ev.ts)
        if advanced and self.held and self._low_watermark(rec.partition) > self._next_due:
            self._release(out, force=False)
        return False

    def _advance(self, topic: str, partition: int, ts: float) -> bool:
        """Move a barrier topic's watermark to ``ts`` if that is later; whether it moved."""
        wk = f"{topic}:{partition}"
        if ts > self.watermarks.get(wk, _NEVER):
            self.watermarks[wk] = ts
            return True
        return False

    def _route(self, topic: str, partition: int, ev: EventBase, out: list[EventBase]) -> None:
        advanced = topic in _BARRIER_SET and self._advance(topic, partition, ev.ts)
        held = self.held
        queue = held.get(ev.run_id) if held else None
        if queue is not None and (topic == LIFECYCLE or ev.ts >= queue[0][2].ts):
            queue.append((topic, partition, ev))  # after the held terminal in event time
            self._held_dirty = True
        elif topic == LIFECYCLE and self.barrier and ev.type in HELD_TYPES:
            held[ev.run_id] = [(topic, partition, ev)]
            self._held_dirty = True
            self._next_due = min(self._next_due, ev.ts)
        else:
            self._apply(topic, ev, out)
        if advanced and held and self._low_watermark(partition) > self._next_due:
            self._release(out, force=False)

    def _low_watermark(self, partition: int) -> float:
        get = self.watermarks.get
        return min(get(f"{b}:{partition}", float("-inf")) for b in BARRIER_TOPICS)

    def release_held(self, force: bool = True) -> list[EventBase]:
        out: list[EventBase] = []
        self._release(out, force)
        return out

    def _release(self, out: list[EventBase], force: bool) -> None:
        ready = []
        for rid, queue in self.held.items():
            _, partition, head = queue[0]
            if force or self._low_watermark(partition) > head.ts:
                ready.append((head.ts, rid))
        for _, rid in sorted(ready):
            # in event time: a queue may span a pause and the run's end, and the facts
            # before the end must be folded before it (stable: ties keep read order)
            queue, rest = sorted(self.held.pop(rid), key=lambda r: r[2].ts), None
            if not force:
                # a later held fact (the run's end after its pause) waits for the
                # watermarks to pass it in turn: it heads the run's queue from here
                for i in range(1, len(queue)):
                    topic, partition, ev = queue[i]
                    held_fact = topic == LIFECYCLE and ev.type in HELD_TYPES
                    if held_fact and self._low_watermark(partition) <= ev.ts:
                        queue, rest = queue[:i], queue[i:]
                        break
            for topic, _, ev in queue:
                self._apply(topic, ev, out)
            if rest:
                self.held[rid] = rest
            self._held_dirty = True
        self._next_due = min((q[0][2].ts for q in self.held.values()), default=float("inf"))

    def _apply(self, topic: str, ev: EventBase, out: list[EventBase]) -> None:
        rid = ev.run_id
        view = self.views.get(rid)
        if view is None:
            view = self.views[rid] = RunView(ev.tenant_id, rid)
        elif view.tenant_id != ev.tenant_id:
            self.rejected_foreign += 1  # a run id claimed by another tenant: never merged
            return
        self.applied += 1
        fleet, points = self.fleet, self._points
        counts = fleet.events
        counts[topic] = counts.get(topic, 0) + 1
        apply_primary(view, fleet, points, ev)
        if topic == TELEMETRY:
            before_u = self.usage.get(rid) or self.accounting.initial()
            us, derived = self.accounting.apply(before_u, ev)
            if us is not before_u:
                self.usage[rid] = us
                self._dirty_usage.add(rid)
        elif topic in _RUN_STATE_TOPICS:
            before = self.status.get(rid) or self.run_state.initial()
            st, derived = self.run_state.apply(before, ev)
            if st is not before:
                self.status[rid] = st
                self._dirty_status.add(rid)
        else:
            derived = ()
        for d in derived:
            apply_derived(view, fleet, points, d)
            out.append(d)
        self._dirty_views.add(rid)

    # ------------------------------------------------------------------ committing
    def checkpoint(self) -> None:
        """Write everything changed since the last checkpoint, with the positions, atomically.
        Fold decisions are copied into their views here (once per batch, not per event)."""
        self.sync_views()
        batch = Batch(
            views={r: self.views[r] for r in self._dirty_views},
            points=self._points,
            fold_states={
                **{
                    (self.run_state.name, r): self.run_state.dump_state(self.status[r])
                    for r in self._dirty_status
                },
                **{
                    (self.accounting.name, r): self.accounting.dump_state(self.usage[r])
                    for r in self._dirty_usage
                },
            },
            fleet=self.fleet,
            positions=dict(self.positions),
            held=self._held_doc() if self._held_dirty else None,
        )
        self.store.commit(batch)
        self._dirty_views, self._dirty_status, self._dirty_usage = set(), set(), set()
        self._points, self._held_dirty = {}, False

    def sync_views(self) -> None:
        for rid in self._dirty_status:
            sync_status(self.views[rid], self.status[rid])
        for rid in self._dirty_usage:
            sync_usage(self.views[rid], self.usage[rid], self.accounting.prices)

    def _held_doc(self) -> dict[str, Any]:
        return {
            "watermarks": self.watermarks,
            "runs": {rid: [[t, p, _pack(ev)] for t, p, ev in q] for rid, q in self.held.items()},
        }


_VALIDATE_JSON = EVENT_ADAPTER.validate_json


def _decode_many(values: list[bytes]) -> list[EventBase | DeadLetter]:
    """Each record through the union's validator (faster than one JSON array of them);
    one that fails goes through the codec, which upcasts or dead-letters it."""
    out: list[EventBase | DeadLetter] = []
    append = out.append
    for v in values:
        try:
            append(_VALIDATE_JSON(v))
        except ValueError:  # ValidationError or bad JSON
            append(decode(v))
    return out


def _pack(ev: EventBase) -> str:
    from events.codec import encode

    return base64.b64encode(encode(ev)).decode()


def _unpack(raw: str) -> EventBase:
    from events.codec import decode_or_raise

    return decode_or_raise(base64.b64decode(raw))

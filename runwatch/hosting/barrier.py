"""The terminal barrier: a host option that makes live processing and a replay agree.

What it holds (the one ordering guarantee the run-state fold needs from its host, see
:mod:`projections.run_state`): a run's terminal lifecycle event (``RunCompleted``,
``RunFailed``, ``RunCancelled``) and the trainer's ``RunPaused`` (the answer to a command
an alert caused) are *held*, together with every later record of that run, until each
barrier topic (alerts, rewards, checkpoints) of that partition has delivered a record with
an event time past the held one's — so alerts and ledger facts from before the end are
folded first whatever order the topics were read in — or until the host releases it
(:meth:`TerminalBarrier.release` with ``force``: a replay at the end of the log, a live
follower once it is caught up and its settle time passed). ``RunResumed`` is not held:
holding it would hold the whole resumed run while it trains. A paused trainer writes
nothing, so a live follower catches up and releases the pause within its settle time.

Watermarks (per barrier topic and partition, the highest event time seen) are global: a
key-sharded replay moves them with every run's barrier facts, not only its own, so each
shard releases where one process releases (:meth:`advance`). Held records and watermarks
are persisted with the read model (:meth:`to_doc`), so a restart resumes them.

Time: event time only (``ts`` fields); nothing here reads a clock.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Collection
from typing import Any

from events.envelope import EventBase

LIFECYCLE = "runwatch.lifecycle"
BARRIER_TOPICS = ("runwatch.alerts", "runwatch.rewards", "runwatch.checkpoints")
TERMINAL_TYPES = frozenset({"RunCompleted", "RunFailed", "RunCancelled"})
#: Lifecycle facts held behind the barrier: the terminals, and the trainer's pause.
HELD_TYPES = TERMINAL_TYPES | frozenset({"RunPaused"})
_NEVER = float("-inf")

Held = tuple[str, int, EventBase]  # (topic, partition, event)


class TerminalBarrier:
    """Watermarks and held runs of one host (mutable; see the module docstring)."""

    def __init__(
        self,
        lifecycle: str = LIFECYCLE,
        barrier_topics: tuple[str, ...] = BARRIER_TOPICS,
        held_types: frozenset[str] = HELD_TYPES,
    ) -> None:
        self.lifecycle = lifecycle
        self.barrier_topics = barrier_topics
        self.topic_set = frozenset(barrier_topics)
        #: the topics whose every record the barrier must see: its own (they move the
        #: watermarks) and the lifecycle (a fact to hold); a record of another topic
        #: concerns it only while its run is held
        self.guarded = self.topic_set | {lifecycle}
        self.held_types = held_types
        #: "topic:partition" -> the latest event time seen there
        self.watermarks: dict[str, float] = {}
        #: run id -> its held records, the held fact first
        self.held: dict[str, list[Held]] = {}
        self.dirty = False
        #: (held time, run id) of the run being released, while its records are applied
        self.releasing: tuple[float, str] | None = None
        self._next_due = float("inf")
        self._wkeys: dict[tuple[str, int], str] = {}
        self._low_keys: dict[int, tuple[str, ...]] = {}

    # -- watermarks ----------------------------------------------------------------------

    def advance(self, topic: str, partition: int, ts: float) -> bool:
        """Move a barrier topic's watermark to ``ts`` if that is later; whether it moved."""
        wk = self._wkeys.get((topic, partition))
        if wk is None:
            wk = self._wkeys[(topic, partition)] = f"{topic}:{partition}"
        if ts > self.watermarks.get(wk, _NEVER):
            self.watermarks[wk] = ts
            return True
        return False

    def low_watermark(self, partition: int) -> float:
        keys = self._low_keys.get(partition)
        if keys is None:
            keys = tuple(f"{b}:{partition}" for b in self.barrier_topics)
            self._low_keys[partition] = keys
        get = self.watermarks.get
        return min(get(k, _NEVER) for k in keys)

    def due(self, partition: int) -> bool:
        """After a watermark of ``partition`` moved: may a held run be released now?"""
        return bool(self.held) and self.low_watermark(partition) > self._next_due

    # -- holding -------------------------------------------------------------------------

    def admit(self, topic: str, partition: int, ev: EventBase) -> bool:
        """Hold ``ev`` (False) or let the host apply it now (True)."""
        held = self.held
        queue = held.get(ev.run_id) if held else None
        if queue is not None and (topic == self.lifecycle or ev.ts >= queue[0][2].ts):
            queue.append((topic, partition, ev))  # after the held fact in event time
            self.dirty = True
            return False
        if topic == self.lifecycle and ev.type in self.held_types:
            held[ev.run_id] = [(topic, partition, ev)]
            self.dirty = True
            self._next_due = min(self._next_due, ev.ts)
            return False
        return True

    def release(
        self,
        apply: Callable[[str, EventBase], None],
        force: bool,
        only: Collection[str] | None = None,
    ) -> None:
        """Hand every releasable held run's records to ``apply``, in event time: runs in
        (held time, run id) order; ``force``: every held run (``only``: every one of
        these run ids, the others as without ``force``)."""
        ready = []
        for rid, queue in self.held.items():
            _, partition, head = queue[0]
            forced = force and (only is None or rid in only)
            if forced or self.low_watermark(partition) > head.ts:
                ready.append((head.ts, rid, forced))
        for _, rid, forced in sorted(ready):
            # in event time: a queue may span a pause and the run's end, and the facts
            # before the end must be folded before it (stable: ties keep read order)
            queue, rest = sorted(self.held.pop(rid), key=lambda r: r[2].ts), None
            if not forced:
                # a later held fact (the run's end after its pause) waits for the
                # watermarks to pass it in turn: it heads the run's queue from here
                for i in range(1, len(queue)):
                    topic, partition, ev = queue[i]
                    held_fact = topic == self.lifecycle and ev.type in self.held_types
                    if held_fact and self.low_watermark(partition) <= ev.ts:
                        queue, rest = queue[:i], queue[i:]
                        break
            self.releasing = (queue[0][2].ts, rid)
            for topic, _, ev in queue:
                apply(topic, ev)
            self.releasing = None
            if rest:
                self.held[rid] = rest
            self.dirty = True
        self._next_due = min((q[0][2].ts for q in self.held.values()), default=float("inf"))

    # -- persisted form ------------------------------------------------------------------

    def to_doc(self) -> dict[str, Any]:
        return {
            "watermarks": self.watermarks,
            "runs": {rid: [[t, p, _pack(ev)] for t, p, ev in q] for rid, q in self.held.items()},
        }

    def load_doc(self, doc: dict[str, Any] | None) -> None:
        doc = doc or {}
        self.watermarks = dict(doc.get("watermarks", {}))
        self.held = {
            rid: [(t, p, _unpack(v)) for t, p, v in queue]
            for rid, queue in doc.get("runs", {}).items()
        }
        self._next_due = min((q[0][2].ts for q in self.held.values()), default=float("inf"))
        self.dirty = False


def _pack(ev: EventBase) -> str:
    from events.codec import encode

    return base64.b64encode(encode(ev)).decode()


def _unpack(raw: str) -> EventBase:
    from events.codec import decode_or_raise

    return decode_or_raise(base64.b64decode(raw))

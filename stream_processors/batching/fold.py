"""The batching processor: a pure fold over one run's ``runwatch.trajectories`` partition.

Input (all on one partition per run, so totally ordered): trainer/env registrations,
disconnects, resets, accepted scored groups (their metadata: the fold never reads a
payload), batch requests, delivery commits and API
starts (:mod:`events.catalog.trajectory`). Output (``runwatch.batches``): one
``TrajectoryBatchServed`` or ``TrajectoryBatchUnavailable`` per request, a
``TrajectoryGroupRejected`` per group that will never be served, a
``TrajectoryBatchRequeued`` per served-but-undelivered batch of a restarted instance.

Time semantics: none of wall-clock. The *trainer step* is the count of batches served
(from ``starting_step``); staleness is counted in those steps: at each request, a queued
group accepted under step ``s`` is dropped as stale once ``step - s`` exceeds its env's
``max_off_policy_steps`` (or the registration's default). A group's ``s`` is the step
the accepting instance reported, capped by the fold's own step at arrival.

Exactly once in: a group whose push identity the fold has seen within its window (the
same ``Idempotency-Key`` and index: a retried push; or, from a server deduping by
content, the same payload digest) is not queued but reported
(``TrajectoryGroupDeduplicated``). The identities live in the state
(:mod:`stream_processors.batching.push_keys`), so a restarted or a second instance
knows them; the window is counted in accepted groups, as each event states it.

Exactly once out: a batch is decided here, at the request's place in the order, so every
folder of the partition (every API instance, a replay) decides the same. It stays
*reserved* until its instance commits ``TrajectoryBatchDelivered``. It is requeued, at
its groups' original arrival positions, when the instance releases it
(``TrajectoryBatchReleased``: the client went away) or starts again
(``TrajectoryApiStarted`` from the same ``producer``: it crashed before delivering) -
nothing lost, nothing served twice.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from events.catalog.trajectory import (
    TRAJECTORIES_TOPIC,
    ScoredDataGroupAccepted,
    ScoredDataGroupStored,
    TrajectoryApiStarted,
    TrajectoryBatchDelivered,
    TrajectoryBatchReleased,
    TrajectoryBatchRequested,
    TrajectoryBatchRequeued,
    TrajectoryBatchServed,
    TrajectoryBatchUnavailable,
    TrajectoryDataReset,
    TrajectoryEnvDisconnected,
    TrajectoryEnvRegistered,
    TrajectoryGroupBuffered,
    TrajectoryGroupDeduplicated,
    TrajectoryGroupRejected,
    TrajectoryGroupsAdmitted,
    TrajectoryTrainerRegistered,
)
from events.envelope import EventBase, derive_envelope
from stream_processors.batching.backlog import EMPTY, Backlog
from stream_processors.batching.push_keys import EMPTY_KEYS, PushKeys, note_buffered, screen
from stream_processors.batching.selection import Queued, select_batch, subset_sum, unbatchable


class EnvSlot(NamedTuple):
    env_id: int
    group_size: int
    min_batch_allocation: float | None
    max_off_policy_steps: int | None
    connected: bool = True


class Reservation(NamedTuple):
    request_id: str
    producer: str
    groups: tuple[Queued, ...]


class BatchingState(NamedTuple):
    registered: bool = False
    batch_size: int = -1
    max_off_policy_steps: int | None = None
    step: int = 0
    envs: tuple[EnvSlot, ...] = ()
    queue: Backlog = EMPTY
    arrivals: int = 0
    reserved: tuple[Reservation, ...] = ()
    buffered: tuple[Queued, ...] = ()  # size-mismatched groups, all envs, arrival order
    keys: PushKeys = EMPTY_KEYS  # push identities within their window (kept over resets)


Derived = list[EventBase]


class BatchingFold:
    """``apply`` keeps the run's queue and decides every batch request in log order."""

    inputs: tuple[str, ...] = (TRAJECTORIES_TOPIC,)

    def __init__(self, name: str = "batching") -> None:
        self.name = name

    def initial(self) -> BatchingState:
        return BatchingState()

    def key_of(self, event: EventBase) -> str:
        return event.run_id

    def apply(self, state: BatchingState, event: EventBase) -> tuple[BatchingState, Derived]:
        if isinstance(event, (ScoredDataGroupStored, ScoredDataGroupAccepted)):
            return self._accept(state, event)
        if isinstance(event, TrajectoryBatchRequested):
            return self._request(state, event)
        if isinstance(event, TrajectoryBatchDelivered):
            kept = tuple(r for r in state.reserved if r.request_id != event.request_id)
            return state._replace(reserved=kept), []
        if isinstance(event, TrajectoryApiStarted):
            return self._requeue(state, event, lambda r: r.producer == event.producer)
        if isinstance(event, TrajectoryBatchReleased):
            return self._requeue(state, event, lambda r: r.request_id == event.request_id)
        if isinstance(event, TrajectoryTrainerRegistered):
            if state.registered:
                return state, []
            rejected = [g for g in state.queue if g.size > event.batch_size]
            state = state._replace(
                registered=True,
                batch_size=event.batch_size,
                max_off_policy_steps=event.max_off_policy_steps,
                step=event.starting_step,
                queue=Backlog(g for g in state.queue if g.size <= event.batch_size),
            )
            return state, [self._reject(event, g, "too_large", state) for g in rejected]
        if isinstance(event, TrajectoryEnvRegistered):
            slot = EnvSlot(
                len(state.envs),
                event.group_size,
                event.min_batch_allocation,
                event.max_off_policy_steps,
            )
            return state._replace(envs=(*state.envs, slot)), []
        if isinstance(event, TrajectoryEnvDisconnected):
            envs = tuple(
                e._replace(connected=False) if e.env_id == event.env_id else e for e in state.envs
            )
            return state._replace(envs=envs), []
        if isinstance(event, TrajectoryDataReset):  # (a push stays once: keys are kept)
            return BatchingState(arrivals=state.arrivals, keys=state.keys), []
        return state, []

    # -- groups in ------------------------------------------------------------------------
    def _accept(
        self, state: BatchingState, ev: ScoredDataGroupStored | ScoredDataGroupAccepted
    ) -> tuple[BatchingState, Derived]:
        if type(ev) is ScoredDataGroupStored and (ev.idempotency_key or ev.content_digest):
            return self._accept_identified(state, ev)
        return self._queue(state, ev)

    def _accept_identified(
        self, state: BatchingState, ev: ScoredDataGroupStored
    ) -> tuple[BatchingState, Derived]:
        """A group with a push identity: reported if that identity was seen within the
        window, else recorded and queued (and its push's record told if it buffered)."""
        keys, by = screen(state.keys, state.arrivals, ev)
        if by is not None:
            return state._replace(keys=keys), [
                TrajectoryGroupDeduplicated(
                    **{**derive_envelope(ev, self.name, "duplicate"), "step": state.step},
                    group_id=ev.group_id,
                    env_id=ev.env_id,
                    num_sequences=ev.num_sequences,
                    by=by,
                    idempotency_key=ev.idempotency_key,
                    key_index=ev.key_index,
                    content_digest=ev.content_digest,
                )
            ]
        state, derived = self._queue(state._replace(keys=keys), ev)
        buffered = next((d for d in derived if type(d) is TrajectoryGroupBuffered), None)
        if buffered is not None and ev.idempotency_key:
            keys = note_buffered(state.keys, ev.idempotency_key, buffered.buffer_sequences)
            state = state._replace(keys=keys)
        return state, derived

    def _queue(
        self, state: BatchingState, ev: ScoredDataGroupStored | ScoredDataGroupAccepted
    ) -> tuple[BatchingState, Derived]:
        step = state.step if ev.step is None else min(ev.step, state.step)
        group = Queued(ev.group_id, ev.env_id, ev.num_sequences, step, state.arrivals)
        state = state._replace(arrivals=state.arrivals + 1)
        if group.size < 1:
            return state, [self._reject(ev, group, "empty", state)]
        if state.registered and group.size > state.batch_size:
            return state, [self._reject(ev, group, "too_large", state)]
        env_id = group.env_id
        if env_id is None or not 0 <= env_id < len(state.envs):
            return state._replace(queue=state.queue.appended(group)), []
        want = state.envs[env_id].group_size
        if group.size == want:
            return state._replace(queue=state.queue.appended(group)), []
        # the reference's rule: hold it until the env's buffered groups sum to group_size
        pending = [g for g in state.buffered if g.env_id == env_id] + [group]
        picked = subset_sum([g.size for g in pending], want) if want > 0 else None
        admitted = [pending[i] for i in picked] if picked else []
        gone = {g.group_id for g in admitted}
        buffered = tuple(g for g in (*state.buffered, group) if g.group_id not in gone)
        left = sum(g.size for g in buffered if g.env_id == env_id)
        derived: Derived = [
            TrajectoryGroupBuffered(
                **derive_envelope(ev, self.name, "buffered"),
                group_id=group.group_id,
                env_id=env_id,
                num_sequences=group.size,
                buffer_sequences=left,
            )
        ]
        if admitted:
            derived.append(
                TrajectoryGroupsAdmitted(
                    **derive_envelope(ev, self.name, "admitted"),
                    env_id=env_id,
                    group_ids=tuple(g.group_id for g in admitted),
                )
            )
        state = state._replace(queue=state.queue.appended(*admitted), buffered=buffered)
        return state, derived

    # -- batches out ----------------------------------------------------------------------
    def _request(
        self, state: BatchingState, ev: TrajectoryBatchRequested
    ) -> tuple[BatchingState, Derived]:
        if not state.registered:
            return state, [self._unavailable(ev, state, "not_registered")]
        derived: Derived = []
        queue = state.queue
        limits = {e.env_id: e.max_off_policy_steps for e in state.envs}
        default = state.max_off_policy_steps
        finite = [v for v in (*limits.values(), default) if v is not None]
        if finite:

            def limit_of(g: Queued) -> int | None:
                limit = limits.get(g.env_id)  # type: ignore[arg-type]
                return default if limit is None else limit

            def is_stale(g: Queued) -> bool:
                limit = limit_of(g)
                return limit is not None and state.step - g.step > limit

            # only groups older than the strictest limit can be stale
            queue, stale = queue.split_off(is_stale, older_than=state.step - min(finite))
            for g in stale:
                age = f"{state.step - g.step} steps old, limit {limit_of(g)}"
                derived.append(self._reject(ev, g, "stale", state, age))
        minimums = self._minimums(state)
        while True:
            picked = select_batch(queue, state.batch_size, minimums)
            if picked is not None:
                break
            blocker = unbatchable(queue, state.batch_size)
            if blocker is None:
                state = state._replace(queue=queue)
                derived.append(self._unavailable(ev, state, "not_enough_data"))
                return state, derived
            derived.append(self._reject(ev, queue[blocker], "unbatchable", state))
            queue = queue.without((blocker,))
        groups = tuple(queue[i] for i in picked)
        step = state.step + 1
        state = state._replace(
            step=step,
            queue=queue.without(picked),
            reserved=(*state.reserved, Reservation(ev.request_id, ev.producer, groups)),
        )
        served = TrajectoryBatchServed(
            **{**derive_envelope(ev, self.name, "served"), "step": step},
            batch_id=ev.request_id,
            request_id=ev.request_id,
            group_ids=tuple(g.group_id for g in groups),
            env_ids=tuple(g.env_id for g in groups),
            num_sequences=sum(g.size for g in groups),
            max_staleness=max(step - 1 - g.step for g in groups),
        )
        derived.append(served)
        return state, derived

    def _minimums(self, state: BatchingState) -> dict[int, int]:
        wanted = {
            e.env_id: int(state.batch_size * e.min_batch_allocation)
            for e in state.envs
            if e.connected and e.min_batch_allocation is not None
        }
        total = sum(wanted.values())
        if total > state.batch_size:  # over-promised: scale every minimum down
            wanted = {k: v * state.batch_size // total for k, v in wanted.items()}
        return {k: v for k, v in wanted.items() if v > 0}

    def _requeue(
        self, state: BatchingState, ev: EventBase, which: Callable[[Reservation], bool]
    ) -> tuple[BatchingState, Derived]:
        mine = [r for r in state.reserved if which(r)]
        if not mine:
            return state, []
        back = [g for r in mine for g in r.groups]
        state = state._replace(
            queue=state.queue.merged(back),
            reserved=tuple(r for r in state.reserved if not which(r)),
        )
        return state, [
            TrajectoryBatchRequeued(
                **derive_envelope(ev, self.name, "requeued", r.request_id),
                batch_id=r.request_id,
                group_ids=tuple(g.group_id for g in r.groups),
            )
            for r in mine
        ]

    # -- derived-event helpers ------------------------------------------------------------
    def _reject(
        self, ev: EventBase, g: Queued, reason: Any, state: BatchingState, detail: str = ""
    ) -> TrajectoryGroupRejected:
        return TrajectoryGroupRejected(
            **{**derive_envelope(ev, self.name, "rejected", g.group_id), "step": state.step},
            group_id=g.group_id,
            env_id=g.env_id,
            num_sequences=g.size,
            reason=reason,
            detail=detail or f"batch_size {state.batch_size}",
        )

    def _unavailable(
        self, ev: TrajectoryBatchRequested, state: BatchingState, reason: Any
    ) -> TrajectoryBatchUnavailable:
        return TrajectoryBatchUnavailable(
            **{**derive_envelope(ev, self.name, "unavailable"), "step": state.step},
            request_id=ev.request_id,
            reason=reason,
            queued_groups=len(state.queue),
            queued_sequences=state.queue.sequences,
        )

    # -- persistence ----------------------------------------------------------------------
    def dump_state(self, state: BatchingState) -> bytes:
        flat = state._replace(queue=tuple(state.queue), keys=state.keys.dump())
        return json.dumps(flat, separators=(",", ":")).encode()

    def load_state(self, raw: bytes) -> BatchingState:
        d = json.loads(raw)
        return BatchingState(
            d[0],
            d[1],
            d[2],
            d[3],
            tuple(EnvSlot(*e) for e in d[4]),
            Backlog(Queued(*g) for g in d[5]),
            d[6],
            tuple(Reservation(r[0], r[1], tuple(Queued(*g) for g in r[2])) for r in d[7]),
            tuple(Queued(*g) for g in d[8]),
            PushKeys.load(d[9]) if len(d) > 9 else EMPTY_KEYS,  # (older snapshots: none)
        )


def fold_all(
    fold: BatchingFold, events: Sequence[EventBase], state: BatchingState | None = None
) -> tuple[BatchingState, Derived]:
    """Fold a sequence from ``state`` (default: initial); all derived events in order."""
    state = fold.initial() if state is None else state
    out: Derived = []
    for ev in events:
        state, derived = fold.apply(state, ev)
        out.extend(derived)
    return state, out

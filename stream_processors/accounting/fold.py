"""Tenant accounting as a pure fold: what one run has cost so far (seed 000 step 4).

Input: the ``runwatch.telemetry`` topic, where a run's metering facts are totally ordered
on one partition, and the run's pauses and ends on ``runwatch.lifecycle`` (when a bill must
be complete; the totals never depend on the two topics' interleaving).

- Device-seconds come from :class:`~events.UsageRecorded` (v3: ``device_kind`` "cpu" or
  "gpu" and ``device_seconds``; older records upcast as GPU-seconds), totalled per device
  kind and pool and priced per device kind and pool; the GPU-seconds of the view
  (``gpu_seconds_*``, by pool and by phase) count GPU time only, so a CPU host's run shows
  its CPU-seconds under ``device_seconds_by_kind`` and no GPU time. Tokens
  generated/trained come from the same facts (the metering source of truth; trainer and
  rollout metrics are not added again).
- A *committed* optimizer step is a :class:`~events.TrainerStepCompleted` whose step is
  beyond every step committed before; steps recomputed after a resume are progress
  already paid for, so they add cost but not committed steps.
- Spend = device-seconds x price per device kind and pool + tokens x per-million price
  (``prices.yaml``).
- Duplicates are never billed twice: a :class:`~events.UsageRecorded` whose ``seq`` is
  not beyond the last one billed from the same ``producer`` is a redelivery (a retry, a
  re-shipped spool tail, a history imported twice) and is ignored. Assumption (DESIGN's
  envelope): ``seq`` is monotonic per producer name, across restarts (a resumed trainer
  continues its sequence).

On every committed step the fold emits :class:`~events.TenantUsageUpdated` with the
running totals (id: uuid5 of the step event). The trainer meters a step after reporting
it, so that bill leaves the step's own usage for the next one; a run that pauses or ends
has no next one, so its pause and its end (``RunPaused``, ``RunCompleted``,
``RunFailed``, ``RunCancelled``) are billed too, and while it is paused or over every
usage fact is (usage metered after the pause or the end reached the fold, or arrived
after it on the other topic): the latest bill of a paused or ended run is all its usage.
(Before 2026-11-27 the final bill on the compacted ``runwatch.tenant-usage`` left out the
last step's usage, and any steps recomputed after a rollback.) Per-tenant aggregates are
sums over runs, computed by the read model.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from events import (
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunPaused,
    RunResumed,
    TenantUsageUpdated,
    TrainerStepCompleted,
    UsageRecorded,
)
from events.envelope import EventBase, derived_id
from stream_processors.accounting.prices import Prices

#: Producers whose last billed ``seq`` one run remembers (the most recently billed ones):
#: far more than a run's processes (a trainer, a hook per process and restart, importers);
#: a redelivery from a producer forgotten since is billed again (the module docstring).
MAX_PRODUCERS = 256
#: Phase names one run's usage keeps apart (producers send a handful: ``step``,
#: ``rollout``, ``optim``, ``resume_replay``...); usage of any further one goes to
#: :data:`OVERFLOW_PHASE`.
MAX_PHASES = 64
OVERFLOW_PHASE = "other"

#: The producer of every bill, part of each bill's id: the name under which this fold
#: derived them when it lived in ``projections/`` (kept, so a replay of any log derives
#: byte-identical bills with the same ids; see ``docs/hosting.md``).
PRODUCER = "projections/accounting"


class RunUsage(NamedTuple):
    """One run's metered totals (a NamedTuple: a new one per usage fact, the fold's
    hottest allocation)."""

    tenant_id: str = ""
    run_id: str = ""
    gpu_seconds_rollout_fleet: float = 0.0
    gpu_seconds_trainer: float = 0.0
    gpu_seconds_by_phase: tuple[tuple[str, float], ...] = ()
    tokens_generated: int = 0
    tokens_trained: int = 0
    committed_steps: int = 0
    last_committed_step: int = -1
    #: producer -> last billed seq, least recently billed first (at most
    #: :data:`MAX_PRODUCERS`; never mutated: a new dict per usage fact, see :func:`_bill`)
    billed_seq: Mapping[str, int] = {}
    #: device-seconds per "kind/pool" (e.g. "cpu/trainer"), every device kind: what is priced
    device_seconds: tuple[tuple[str, float], ...] = ()
    #: paused or over: every usage fact is billed at once (see the module docstring)
    settling: bool = False

    def by_kind(self) -> tuple[tuple[str, float], ...]:
        """Device-seconds per device kind (every pool)."""
        out: tuple[tuple[str, float], ...] = ()
        for name, secs in self.device_seconds:
            out = _add_phase(out, name.split("/", 1)[0], secs)
        return out

    def by_pool(self) -> tuple[tuple[str, float], ...]:
        return (
            ("rollout_fleet", self.gpu_seconds_rollout_fleet),
            ("trainer", self.gpu_seconds_trainer),
        )

    def spend_usd(self, prices: Prices) -> float:
        devices = 0.0
        for name, secs in self.device_seconds:
            kind, pool = name.split("/", 1)
            devices += secs * prices.device_price(kind, pool)
        return (
            devices
            + self.tokens_generated * prices.usd_per_million_tokens_generated / 1e6
            + self.tokens_trained * prices.usd_per_million_tokens_trained / 1e6
        )


def _add_phase(
    phases: tuple[tuple[str, float], ...], phase: str, seconds: float
) -> tuple[tuple[str, float], ...]:
    """``phases`` (sorted by name) with ``seconds`` added to ``phase``. A name beyond the
    first :data:`MAX_PHASES` is booked under :data:`OVERFLOW_PHASE` (so the pairs, and the
    work per fact, stay bounded whatever names a producer sends)."""
    for i, (name, total) in enumerate(phases):
        if name == phase:
            return (*phases[:i], (name, total + seconds), *phases[i + 1 :])
    if len(phases) >= MAX_PHASES and phase != OVERFLOW_PHASE:
        return _add_phase(phases, OVERFLOW_PHASE, seconds)
    return tuple(sorted((*phases, (phase, seconds))))


def _bill(billed: Mapping[str, int], producer: str, seq: int) -> Mapping[str, int] | None:
    """A new mapping: ``billed`` with ``producer`` advanced to ``seq`` and moved last (the
    most recently billed), the least recently billed producer dropped beyond
    :data:`MAX_PRODUCERS`; or None when ``seq`` is not beyond what was billed from that
    producer already. O(:data:`MAX_PRODUCERS`) at most (one dict copy), however many
    producers the run has had; ``billed`` itself is never changed (the fold is pure: a host
    may still hold the state it came from)."""
    last = billed.get(producer)
    if seq <= (-1 if last is None else last):  # a sequence starts above -1
        return None
    out = dict(billed)
    if last is not None:
        del out[producer]  # re-inserted last: the most recently billed
    out[producer] = seq
    if len(out) > MAX_PRODUCERS:
        del out[next(iter(out))]  # the least recently billed producer is forgotten
    return out


#: The lifecycle facts after which a run's bill must be complete: it is paused or over.
SETTLING = frozenset({RunPaused, RunCompleted, RunFailed, RunCancelled})

#: ``_record(RunUsage, (fields...))``: a RunUsage without the Python frame of its
#: ``__new__`` (the same record, about twice as fast: one per usage fact)
_record = tuple.__new__
_USAGE_FIELDS = tuple(TenantUsageUpdated.model_fields)
_USAGE_FIELD_SET = set(_USAGE_FIELDS)


def trusted_usage_event(values: dict[str, Any]) -> TenantUsageUpdated:
    """A :class:`TenantUsageUpdated` from values this fold computed itself, without
    re-validation: this runs once per committed step of every run and validation would
    be most of the fold's cost (5x ``model_construct``'s time). ``values`` holds every
    field in declaration order (the envelope of :func:`~events.envelope.derive_envelope`
    first), so ``encode`` writes exactly the bytes of a validated instance (a unit test
    compares both)."""
    if tuple(values) != _USAGE_FIELDS:
        raise ValueError(f"fields {tuple(values)} are not {_USAGE_FIELDS}")
    obj = TenantUsageUpdated.__new__(TenantUsageUpdated)
    object.__setattr__(obj, "__dict__", values)
    object.__setattr__(obj, "__pydantic_fields_set__", _USAGE_FIELD_SET.copy())
    object.__setattr__(obj, "__pydantic_extra__", None)
    object.__setattr__(obj, "__pydantic_private__", None)
    return obj


class AccountingFold:
    """:class:`events.fold.Fold` of one run's usage and spend, keyed by ``run_id``."""

    name = "accounting"
    inputs = ("runwatch.telemetry", "runwatch.lifecycle")

    def __init__(self, prices: Prices | None = None, *, settle: bool = True) -> None:
        """``settle``: bill a run's pauses and ends and the usage after them (the module
        docstring); off for a host that keeps only the per-step spend series (the read
        model's view: its series must not depend on how lifecycle and telemetry records
        interleave, and its totals come from the state, to the last metered second)."""
        self.prices = prices or Prices.load()
        self.settle = settle

    def initial(self) -> RunUsage:
        return RunUsage()

    def key_of(self, event: EventBase) -> str:
        return event.run_id

    def apply(self, state: RunUsage, event: EventBase) -> tuple[RunUsage, Sequence[EventBase]]:
        t = type(event)
        if t is UsageRecorded:
            (_, _, fleet_s, trainer_s, phases, generated, trained, steps, last_step,
             billed, devices, settling) = state  # fmt: skip
            billed_seq = _bill(billed, event.producer, event.seq)
            if billed_seq is None:
                return state, ()  # a redelivered or replayed usage fact: billed already
            fleet = event.pool == "rollout_fleet"
            seconds = event.device_seconds
            kind = event.device_kind
            gpu = seconds if kind == "gpu" else 0.0
            state = _record(RunUsage, (
                event.tenant_id,
                event.run_id,
                fleet_s + (gpu if fleet else 0.0),
                trainer_s + (0.0 if fleet else gpu),
                _add_phase(phases, event.phase, gpu) if kind == "gpu" else phases,
                generated + event.tokens_generated,
                trained + event.tokens_trained,
                steps,
                last_step,
                billed_seq,
                _add_phase(devices, f"{kind}/{event.pool}", seconds),
                settling,
            ))  # fmt: skip
            return state, ((self.update_event(state, event),) if settling else ())
        if t is TrainerStepCompleted:
            step = event.step
            if step is None or step <= state.last_committed_step:
                return state, ()
            (_, _, fleet_s, trainer_s, phases, generated, trained, steps, _, billed, devices,
             settling) = state  # fmt: skip
            state = _record(RunUsage, (
                event.tenant_id, event.run_id, fleet_s, trainer_s, phases, generated, trained,
                steps + 1, step, billed, devices, settling,
            ))  # fmt: skip
            return state, (self.update_event(state, event),)
        if t in SETTLING and self.settle:  # paused or over: this bill and every usage after
            state = state._replace(settling=True)
            return state, ((self.update_event(state, event),) if state.tenant_id else ())
        if t is RunResumed and state.settling:
            return state._replace(settling=False), ()
        return state, ()

    def update_event(self, state: RunUsage, cause: EventBase) -> TenantUsageUpdated:
        spend = state.spend_usd(self.prices)
        steps = state.committed_steps
        return trusted_usage_event(
            {
                "event_id": derived_id(PRODUCER, cause.event_id),
                "type": "TenantUsageUpdated",
                "schema_version": TenantUsageUpdated.SCHEMA_VERSION,
                "tenant_id": cause.tenant_id,
                "run_id": cause.run_id,
                "step": cause.step,
                "ts": cause.ts,
                "producer": PRODUCER,
                "seq": 0,
                "gpu_seconds_by_pool": state.by_pool(),
                "gpu_seconds_by_phase": state.gpu_seconds_by_phase,
                "device_seconds_by_kind": state.by_kind(),
                "tokens_generated": state.tokens_generated,
                "tokens_trained": state.tokens_trained,
                "committed_steps": steps,
                "spend_usd": spend,
                "cost_per_step_usd": spend / steps if steps else None,
            }
        )

    def dump_state(self, state: RunUsage) -> bytes:
        """JSON; ``billed_seq`` as ``[[producer, seq], ...]``, least recently billed first
        (the pairs form every earlier version wrote and reads)."""
        doc = state._asdict()
        doc["billed_seq"] = [[p, s] for p, s in state.billed_seq.items()]
        return json.dumps(doc).encode()

    def load_state(self, raw: bytes) -> RunUsage:
        """A state :meth:`dump_state` wrote, or one of an earlier version (``billed_seq``
        pairs sorted by producer, unbounded: the last :data:`MAX_PRODUCERS` are kept;
        no ``device_seconds``: all GPU time)."""
        doc: dict[str, Any] = json.loads(raw)
        doc["gpu_seconds_by_phase"] = tuple(tuple(p) for p in doc["gpu_seconds_by_phase"])
        billed = doc.get("billed_seq", ())
        items = billed.items() if isinstance(billed, dict) else billed  # (an object: a dict)
        pairs = [(str(p), int(s)) for p, s in items]
        doc["billed_seq"] = dict(pairs[-MAX_PRODUCERS:])
        if "device_seconds" in doc:
            doc["device_seconds"] = tuple(tuple(p) for p in doc["device_seconds"])
        else:  # stored before device kinds: all of it was GPU time
            gpu = (
                ("gpu/rollout_fleet", doc["gpu_seconds_rollout_fleet"]),
                ("gpu/trainer", doc["gpu_seconds_trainer"]),
            )
            doc["device_seconds"] = tuple(p for p in gpu if p[1])
        return RunUsage(**doc)

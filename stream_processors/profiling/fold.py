"""The rollout profiling processor: a pure fold over one run's trace events (seed 003).

Input: :class:`~events.catalog.rollout.RolloutTraceRecorded` on ``runwatch.traces``,
keyed by ``run_id`` (one state per run). Output,
once per finalized step: ``StepProfiled``, one ``WorkerProfiled`` per worker, a
``StragglerDetected`` per straggler worker (all on ``runwatch.profiles``), and - when the
traces carry token counts and the policy version - a ``RolloutBatchCompleted`` on
``runwatch.telemetry``: the step's rollout quality (length, truncation, unparseable rate),
the detectors' drift input. Never with a guessed version: the weight-sync staleness
detector reads ``policy_version`` too, and a version inferred from the step number would
hide exactly the frozen sync it exists to catch (set it with
``RolloutTracer.policy_version`` or a ``policy_version`` key in the trace lines).

When is a step complete? (stream time, never the wall clock)
    verl's rollout is step-synchronous: every worker finishes step ``s`` at the barrier
    before any worker starts ``s + 1``. So step ``s`` is *finalized* - its figures are
    computed and emitted - when a trace of a step greater than ``s + lateness_steps``
    arrives, or when a host calls :meth:`ProfilingFold.flush` at the end of its input
    (``runwatch profile`` over a directory or a log does). A live host (embedded runner,
    faust) never flushes, so a run's *last* step stays open there - and in ``runwatch
    replay``, which therefore matches the live output exactly. (The fold does not read
    ``runwatch.lifecycle`` for the run's end: faust co-partitions a fold's inputs, and that
    topic has 3 partitions to the traces' 6.)
    ``lateness_steps`` (default 0) tolerates producers whose batches of step ``s`` reach
    the log after the first traces of later steps. A trace of an already finalized step is
    *late*: it is dropped and counted (``late_events`` on the next ``StepProfiled``), so a
    replay of the same log emits the same events byte for byte. Traces without a step are
    counted in ``unstepped_events`` and ignored. Step numbers going backwards (a resumed
    run repeating steps) therefore count as late, by design: profile a resumed attempt
    under its own run id.

State: the open steps' observations - one flat tuple per trace event, held in immutable
cons cells (O(1) per event, and few objects for the garbage collector to walk) - the
last finalized step, the recent step spans (for ``slow_step``: a window counted in
steps) and the counters. It is bounded by the traces of ``lateness_steps + 1`` steps.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, NamedTuple

from events.catalog.profile import StepProfiled, StragglerDetected, WorkerProfiled
from events.catalog.rollout import RolloutBatchCompleted, RolloutTraceRecorded
from events.envelope import EventBase, derived_id
from stream_processors.profiling.analysis import (
    OBSERVATION_FIELDS,
    Observation,
    ProfilingConfig,
    StepResult,
    observe,
    profile_step,
)

#: An immutable singly linked list of a step's observations, newest first: (obs, rest).
Cons = tuple[Observation, "Cons"] | None


class OpenStep(NamedTuple):
    step: int
    events: Cons
    count: int
    tenant_id: str
    run_id: str


class ProfilingState(NamedTuple):
    open: tuple[OpenStep, ...] = ()
    max_step: int | None = None
    finalized_through: int | None = None
    recent_step_s: tuple[float, ...] = ()
    late_events: int = 0
    unstepped_events: int = 0


def _unwind(cell: Cons) -> list[Observation]:
    out = []
    while cell is not None:
        out.append(cell[0])
        cell = cell[1]
    out.reverse()
    return out


class ProfilingFold:
    """``apply`` adds a trace to its open step and finalizes the steps it closes."""

    inputs: tuple[str, ...] = ("runwatch.traces",)

    def __init__(self, config: ProfilingConfig | None = None, name: str = "profiling") -> None:
        self.config = config or ProfilingConfig()
        self.name = name

    def initial(self) -> ProfilingState:
        return ProfilingState()

    def key_of(self, event: EventBase) -> str:
        return event.run_id

    def apply(
        self, state: ProfilingState, event: EventBase
    ) -> tuple[ProfilingState, Sequence[EventBase]]:
        if type(event) is not RolloutTraceRecorded:
            return state, ()
        step = event.step
        if step is None:
            return state._replace(unstepped_events=state.unstepped_events + 1), ()
        if state.finalized_through is not None and step <= state.finalized_through:
            return state._replace(late_events=state.late_events + 1), ()
        ob = observe(event)
        opens = state.open
        if opens and opens[-1].step == step:  # the common case: the newest open step
            last = opens[-1]
            added = OpenStep(step, (ob, last.events), last.count + 1, last.tenant_id, last.run_id)
            opens = (*opens[:-1], added) if len(opens) > 1 else (added,)
        elif any(o.step == step for o in opens):
            opens = tuple(
                OpenStep(step, (ob, o.events), o.count + 1, o.tenant_id, o.run_id)
                if o.step == step
                else o
                for o in opens
            )
        else:
            added = OpenStep(step, (ob, None), 1, event.tenant_id, event.run_id)
            opens = tuple(sorted((*opens, added), key=lambda o: o.step))
        max_step = step if state.max_step is None or step > state.max_step else state.max_step
        state = ProfilingState(
            opens,
            max_step,
            state.finalized_through,
            state.recent_step_s,
            state.late_events,
            state.unstepped_events,
        )
        if opens[0].step < max_step - self.config.lateness_steps:
            return self._finalize(state, max_step - self.config.lateness_steps)
        return state, ()

    def flush(self, state: ProfilingState) -> tuple[ProfilingState, Sequence[EventBase]]:
        """Finalize every open step: the host's end of input (see the module doc)."""
        if not state.open:
            return state, ()
        return self._finalize(state, state.open[-1].step + 1)

    def _finalize(
        self, state: ProfilingState, below: int
    ) -> tuple[ProfilingState, list[EventBase]]:
        """Finalize the open steps numbered below ``below``, in step order."""
        derived: list[EventBase] = []
        keep = tuple(o for o in state.open if o.step >= below)
        recent = state.recent_step_s
        done = state.finalized_through
        for o in state.open:
            if o.step >= below:
                continue
            result = profile_step(_unwind(o.events), self.config)
            derived.extend(
                self._events(o.run_id, o.tenant_id, o.step, result, recent, state.late_events)
            )
            recent = (*recent, result.step["step_span_s"])[-self.config.slow_step_history :]
            done = o.step if done is None else max(done, o.step)
        return state._replace(open=keep, finalized_through=done, recent_step_s=recent), derived

    def _events(
        self,
        run_id: str,
        tenant_id: str,
        step: int,
        result: StepResult,
        recent: tuple[float, ...],
        late: int,
    ) -> list[EventBase]:
        cfg = self.config

        def envelope(kind: str, *parts: object) -> dict[str, Any]:
            return {
                "event_id": derived_id(self.name, run_id, step, kind, *parts),
                "tenant_id": tenant_id,
                "run_id": run_id,
                "step": step,
                "ts": result.last_ts,
                "producer": self.name,
                "seq": 0,
            }

        span = result.step["step_span_s"]
        med_step = None
        slow = False
        if len(recent) >= cfg.slow_step_min_history:
            med_step = sorted(recent)[(len(recent) - 1) // 2]
            slow = span > cfg.slow_step_k * med_step
        out: list[EventBase] = [
            StepProfiled(
                **envelope("StepProfiled"),
                **result.step,
                slow_step=slow,
                median_step_s=med_step,
                late_events=late,
            )
        ]
        out.extend(
            WorkerProfiled(**envelope("WorkerProfiled", w["worker"]), **w) for w in result.workers
        )
        out.extend(
            StragglerDetected(**envelope("StragglerDetected", s["worker"]), **s)
            for s in result.stragglers
        )
        if cfg.emit_batch_summaries and result.batch is not None:
            out.append(
                RolloutBatchCompleted(
                    **envelope("RolloutBatchCompleted"), **result.batch, worker=""
                )
            )
        return out

    def dump_state(self, state: ProfilingState) -> bytes:
        doc = state._asdict()
        doc["open"] = [
            [o.step, o.tenant_id, o.run_id, [list(ob) for ob in _unwind(o.events)]]
            for o in state.open
        ]
        return json.dumps(doc, sort_keys=True).encode()

    def load_state(self, raw: bytes) -> ProfilingState:
        doc = json.loads(raw)
        opens = []
        for step, tenant_id, run_id, observations in doc.pop("open"):
            cell: Cons = None
            for ob in observations:
                if len(ob) != OBSERVATION_FIELDS:
                    raise ValueError(f"profiling state: an observation of {len(ob)} fields")
                cell = (tuple(ob), cell)  # type: ignore[assignment]
            opens.append(OpenStep(step, cell, len(observations), tenant_id, run_id))
        doc["recent_step_s"] = tuple(doc["recent_step_s"])
        return ProfilingState(open=tuple(opens), **doc)

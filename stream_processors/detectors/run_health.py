"""RunHealthFold: every run-health detector as one pure fold over one run's events.

Inputs: ``runwatch.telemetry`` (trainer steps, phase timings, weight syncs, rollout
batches, eval gates, usage: one topic, so every host sees one run's telemetry in the same
order), ``runwatch.lifecycle`` (``RunSubmitted``: the algorithm and run config that pick
thresholds), ``runwatch.checkpoints`` (``CheckpointWritten`` for the cadence detector) and
``runwatch.rewards`` (the sandbox's batch outcomes and canary probes for the reward
integrity detector).
Key: ``run_id``. Output: ``AlertFired`` / ``AlertResolved`` on ``runwatch.alerts``.

Ordering rules, applied here before any detector sees an event (windows are counted in
steps and never go backwards):

- ``TrainerStepCompleted`` and ``StepPhaseTimed``: one per step; a step at or below the
  highest already folded is *late or repeated* (a redelivery under a new id, or a rewound
  run replaying steps after a resume) and is not folded; ``late`` counts it. After a
  resume the detectors pick up again once the run passes its previous highest step.
- ``EvalGateScored``, ``RolloutBatchCompleted``, ``UsageRecorded`` and the reward facts
  (``RewardBatchScored``/``Failed``, ``CanaryProbeScored``): several per step are fine;
  a step below the highest seen is late, and at the highest step an event id already
  folded there is a repeat (so re-importing a whole history adds nothing, not even money).
- Telemetry that carries no ``step`` cannot be placed in a window: ``unplaced`` counts it
  (step-less ``UsageRecorded`` is still money, and is folded).
- ``WeightSyncCompleted`` and ``CheckpointWritten`` carry versioned facts (the detectors
  keep their maximum), so they are always folded.

Exact duplicates (same ``event_id``) are absorbed by the hosts (a per-run window of recent
ids, :mod:`runwatch.hosting.core`) and, independently of any window, by the rules above:
the fold itself never counts a step-ordered event twice.

Algorithm: ``RunSubmitted.algorithm`` when seen; before that (or if the lifecycle topic is
consumed after the telemetry, which the hosts may do) the step events' own ``algorithm``
field, which producers set from the same source.

State is immutable (NamedTuples/frozen dataclasses); the catalog is fixed per fold
instance, so ``apply`` stays pure. Time: event fields only, never a clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from events.catalog.derived import AlertFired, AlertResolved
from events.envelope import EventBase, derived_id
from stream_processors.detectors import state_codec
from stream_processors.detectors.base import (
    Detector,
    RunContext,
    Settings,
    record,
    resolve,
    state_type,
)
from stream_processors.detectors.config import Catalog, load_catalog
from stream_processors.detectors.registry import DETECTORS

state_type(RunContext)

TELEMETRY = "runwatch.telemetry"
#: marks index per ordered telemetry type, and whether an equal step is still accepted.
_ORDERED: dict[str, tuple[int, bool]] = {
    "TrainerStepCompleted": (0, False),
    "StepPhaseTimed": (1, False),
    "EvalGateScored": (2, True),
    "RolloutBatchCompleted": (3, True),
    "UsageRecorded": (4, True),
    "RewardBatchScored": (5, True),
    "RewardBatchFailed": (6, True),
    "CanaryProbeScored": (7, True),
}
_NO_IDS: tuple[tuple[str, ...], ...] = ((),) * len(_ORDERED)
#: Ids kept per ordered type at its mark step (the latest): a repeat of an event folded
#: more than this many facts of its type ago at the same step is folded again (the host's
#: own redelivery window catches the near ones; money is deduplicated by accounting).
#: Unbounded, the ids of one step grew with every fact a producer sent for it: 20,000
#: usage facts at one step cost the processors quadratic time, every tenant's alerts
#: waiting behind them (review, 2026-11-28).
MAX_IDS_AT_MARK = 256
#: Dispatch plans kept by (event type, tenant, algorithm as the events say it): the hot
#: path's lookup. Bounded: algorithms are the producers' free text.
MAX_PLANS = 4096
#: The settings-cache key of a tenant or algorithm the catalog does not name (no
#: identifier contains a space).
_UNNAMED = " unnamed"


@state_type
class RunHealthState(NamedTuple):
    ctx: RunContext | None = None
    algorithm_from: str = "default"  # "submitted" | "step" | "default"
    marks: tuple[int, ...] = (-1,) * len(_ORDERED)
    late: int = 0
    unplaced: int = 0
    detectors: tuple[Any, ...] = ()
    #: per ordered type: ids of the events folded at its current mark step (several
    #: per step are allowed there, so a repeat is recognised by id, not by step)
    at_mark: tuple[tuple[str, ...], ...] = _NO_IDS
    #: open alert episodes: (alert id, detector index)
    active: tuple[tuple[str, int], ...] = ()
    #: rollbacks so far: alert ids of a later epoch carry ``@<epoch>`` (a re-fire after a
    #: rollback is a new episode, not a duplicate of the abandoned branch's)
    epoch: int = 0


class RunHealthFold:
    """Implements :class:`events.fold.Fold` for the run-health detectors."""

    name = "run-health"
    inputs: tuple[str, ...] = (
        "runwatch.lifecycle",
        TELEMETRY,
        "runwatch.checkpoints",
        "runwatch.rewards",
    )

    def __init__(
        self, catalog: Catalog | None = None, detectors: Iterable[Detector[Any, Any]] = DETECTORS
    ) -> None:
        self.detectors = tuple(detectors)
        self.catalog = catalog if catalog is not None else load_catalog(None, self.detectors)
        #: event type -> indices of the detectors that handle it
        self._dispatch: dict[str, tuple[int, ...]] = {}
        for i, det in enumerate(self.detectors):
            for t in det.handles:
                self._dispatch[t] = (*self._dispatch.get(t, ()), i)
        self._settings: dict[tuple[str, str], tuple[Settings[Any], ...]] = {}
        #: (type, tenant, algorithm) -> ((index, bound apply, settings), ...): the hot path
        self._plans: dict[tuple[str, str, str], tuple[tuple[int, Any, Settings[Any]], ...]] = {}

    def initial(self) -> RunHealthState:
        return RunHealthState(detectors=tuple(d.initial() for d in self.detectors))

    def key_of(self, event: EventBase) -> str:
        return event.run_id

    def settings(self, tenant: str, algorithm: str) -> tuple[Settings[Any], ...]:
        """Every detector's settings for a tenant running an algorithm. Cached by the
        names the catalog tells apart: a tenant or algorithm it does not name gets the
        same settings as any other it does not name (found by review: ``algorithm`` is
        the producer's free text, and a tenant sending a new one each step grew the cache
        of the one fold every tenant shares by 4.6 KB an event, ~1 GB in 45 s)."""
        catalog = self.catalog
        key = (
            tenant if tenant in catalog.tenants else _UNNAMED,
            algorithm if algorithm in catalog.algorithms else _UNNAMED,
        )
        found = self._settings.get(key)
        if found is None:
            found = tuple(self.catalog.settings(d, tenant, algorithm) for d in self.detectors)
            self._settings[key] = found
        return found

    def _plan(self, etype: str, tenant: str, algorithm: str) -> tuple[Any, ...]:
        settings = self.settings(tenant, algorithm)
        plan = tuple(
            (i, self.detectors[i].apply, settings[i]) for i in self._dispatch.get(etype, ())
        )
        if len(self._plans) < MAX_PLANS:  # (past it: built per event, from the cache above)
            self._plans[(etype, tenant, algorithm)] = plan
        return plan

    def apply(
        self, state: RunHealthState, event: EventBase
    ) -> tuple[RunHealthState, Sequence[AlertFired | AlertResolved]]:
        etype = event.type
        if etype == "RunResumed":
            back = _restart_point(state.marks, event)
            if back is not None:
                return self._rollback(state, event, back)
        ctx, algorithm_from, marks, late, unplaced, states, at_mark, active, epoch = state
        if ctx is None:
            ctx = RunContext(event.run_id, event.tenant_id, "grpo")
        if etype == "RunSubmitted":
            algorithm = event.algorithm  # type: ignore[attr-defined]
            ctx = RunContext(ctx.run_id, ctx.tenant_id, algorithm, event.config)  # type: ignore[attr-defined]
            return state._replace(ctx=ctx, algorithm_from="submitted"), ()
        ordered = _ORDERED.get(etype)
        step = event.step if ordered is not None else None
        if step is not None:
            idx, equal_ok = ordered  # type: ignore[misc]
            mark = marks[idx]
            if step < mark or (step == mark and not equal_ok):
                return state._replace(late=late + 1), ()
            if equal_ok:
                eid = str(event.event_id)
                if step == mark:
                    if eid in at_mark[idx]:
                        return state._replace(late=late + 1), ()
                    kept = at_mark[idx]
                    ids = (*kept[-(MAX_IDS_AT_MARK - 1) :], eid) if kept else (eid,)
                else:
                    ids = (eid,)
                at_mark = (*at_mark[:idx], ids, *at_mark[idx + 1 :])
            if step != mark:
                marks = (step, *marks[1:]) if idx == 0 else (*marks[:idx], step, *marks[idx + 1 :])
            if idx == 0 and algorithm_from != "submitted":
                algorithm = event.algorithm  # type: ignore[attr-defined]
                if algorithm != ctx.algorithm or algorithm_from == "default":
                    ctx = RunContext(ctx.run_id, ctx.tenant_id, algorithm, ctx.run_config)
                    algorithm_from = "step"
        elif ordered is not None and etype != "UsageRecorded":  # (step-less usage is money)
            return state._replace(unplaced=unplaced + 1), ()
        plan = self._plans.get((etype, ctx.tenant_id, ctx.algorithm))
        if plan is None:
            plan = self._plan(etype, ctx.tenant_id, ctx.algorithm)
        if not plan:
            return state, ()
        derived: list[AlertFired | AlertResolved] = []
        new_states = list(states)
        for i, apply, cfg in plan:
            new_states[i], out = apply(states[i], event, cfg, ctx)
            if out:
                if epoch:
                    out = [_in_epoch(a, epoch) for a in out]
                active = _track(active, out, i)
                derived.extend(out)
        fields = (
            ctx, algorithm_from, marks, late, unplaced, tuple(new_states), at_mark, active, epoch
        )  # fmt: skip
        return record(RunHealthState, fields), derived

    def _rollback(
        self, state: RunHealthState, event: EventBase, back: int
    ) -> tuple[RunHealthState, Sequence[AlertFired | AlertResolved]]:
        """The run continues from an earlier step ``back`` (:func:`_restart_point`): what
        the abandoned branch showed no longer describes it. Open episodes resolve (saying
        why), every detector starts afresh from that step, and later alert ids carry the
        new epoch."""
        rolled = event.type == "RunResumed" and event.rolled_back_to is not None  # type: ignore[attr-defined]
        how = "rolled back to" if rolled else "restarted from"
        ctx = state.ctx or RunContext(event.run_id, event.tenant_id, "grpo")
        settings = self.settings(ctx.tenant_id, ctx.algorithm)
        out = [
            resolve(
                event,
                settings[i],
                aid,
                f"the run was {how} step {back}: this alert's evidence belongs to the "
                "abandoned steps",
            )
            for aid, i in state.active
        ]
        fresh = self.initial()
        return fresh._replace(
            ctx=ctx,
            algorithm_from=state.algorithm_from,
            marks=(back,) * len(state.marks),
            late=state.late,
            unplaced=state.unplaced,
            epoch=state.epoch + 1,
        ), out

    def dump_state(self, state: RunHealthState) -> bytes:
        return state_codec.dump(state)

    def load_state(self, raw: bytes) -> RunHealthState:
        """A stored state; one stored before detectors or ordered types were added gets
        fresh ones for them (they are appended, never inserted)."""
        state = state_codec.load(raw)
        if not isinstance(state, RunHealthState):
            raise ValueError("not a RunHealthState")
        if len(state.detectors) < len(self.detectors):
            fresh = tuple(d.initial() for d in self.detectors[len(state.detectors) :])
            state = state._replace(detectors=(*state.detectors, *fresh))
        if len(state.marks) < len(_ORDERED):
            pad = len(_ORDERED) - len(state.marks)
            state = state._replace(
                marks=(*state.marks, *(-1,) * pad), at_mark=(*state.at_mark, *((),) * pad)
            )
        return state


def _in_epoch(alert: AlertFired | AlertResolved, epoch: int) -> AlertFired | AlertResolved:
    """An alert of a run's ``epoch``-th branch after rollbacks: its own episode id."""
    return alert.model_copy(
        update={
            "alert_id": f"{alert.alert_id}@{epoch}",
            "event_id": derived_id(alert.event_id, epoch),
        }
    )


def _track(
    active: tuple[tuple[str, int], ...], out: Sequence[AlertFired | AlertResolved], i: int
) -> tuple[tuple[str, int], ...]:
    for alert in out:
        if isinstance(alert, AlertFired):
            if all(aid != alert.alert_id for aid, _ in active):
                active = (*active, (alert.alert_id, i))
        else:
            active = tuple(a for a in active if a[0] != alert.alert_id)
    return active


def _restart_point(marks: tuple[int, ...], event: EventBase) -> int | None:
    """The step a ``RunResumed`` takes the run back to, when it trains again steps
    already judged; None: it does not.

    - ``RunResumed.rolled_back_to``: the trainer said so (a rollback on resume);
    - a restart's ``RunResumed`` (it answers no request: a process restarted from a
      checkpoint, ``runwatch resume`` or a requeued hooked job) at a step below the
      highest trainer or phase step judged: the steps after its checkpoint are trained
      again (found by review: they were all taken for late facts and ignored, up to a
      checkpoint interval of steps unwatched, 499 at TRL's default ``save_steps``).

    A pause's ``RunResumed`` (it answers the request) never takes the run back, nor does
    a ``RunStarted`` read after steps: every host reads its topics in no common order, so
    a first start's is often read after its first steps (a process that starts over from
    scratch without saying it resumed is judged as before). On Kafka a restart's
    ``RunResumed`` may be read after the first steps it trained (another topic); those
    few are judged as before, late, and the detectors start afresh from its step."""
    back = event.rolled_back_to  # type: ignore[attr-defined]
    if back is not None:
        return int(back)
    step = event.step
    if event.request_id or step is None:  # type: ignore[attr-defined]
        return None
    return step if step < max(marks[0], marks[1]) else None

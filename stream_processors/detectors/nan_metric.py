"""Non-finite metrics: a NaN or infinity in a run's telemetry is a fact, never dropped.

Every other detector skips non-finite values in its window arithmetic; this one reports
them. Checked fields: the float metrics of ``TrainerStepCompleted`` (and every float in its
``extra``), ``EvalGateScored.score``, the rates and length of ``RolloutBatchCompleted``
and the seconds of ``StepPhaseTimed``. The first non-finite value fires (observed: which
fields, how many so far); the episode collects later ones silently and resolves after
``quiet_steps`` consecutive trainer steps whose metrics are all finite. Lag: none.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import ClassVar, NamedTuple

from events.catalog.trainer import STEP_METRICS
from events.envelope import EventBase
from stream_processors.detectors.base import (
    NO_ALERTS,
    AlertEvent,
    RunContext,
    Settings,
    alert_id,
    fire,
    resolve,
    state_type,
)

FIELDS: dict[str, tuple[str, ...]] = {
    "TrainerStepCompleted": STEP_METRICS,
    "EvalGateScored": ("score",),
    "RolloutBatchCompleted": ("mean_length", "truncation_rate", "unparseable_rate"),
    "StepPhaseTimed": ("wall_s", "rollout_s", "score_s", "sync_s", "optim_s", "idle_s"),
}
_isfinite = math.isfinite


@dataclass(frozen=True, slots=True)
class Params:
    quiet_steps: int = 10


@state_type
class NanState(NamedTuple):
    episode: str | None = None
    count: int = 0
    fields: tuple[str, ...] = ()
    clean: int = 0


_GETTERS = {t: attrgetter(*names) for t, names in FIELDS.items()}


def non_finite(ev: EventBase) -> list[str]:
    """``field=value`` of every non-finite metric of the event."""
    values = _GETTERS[ev.type](ev)
    if not isinstance(values, tuple):
        values = (values,)
    extra = getattr(ev, "extra", ())
    if _isfinite(sum([v for v in values if v is not None])) and not extra:
        return []  # fast path: a finite sum means every term was finite
    bad = []
    for name in FIELDS[ev.type]:
        v = getattr(ev, name)
        if v is not None and not _isfinite(v):
            bad.append(f"{name}={v}")
    for key, v in getattr(ev, "extra", ()):
        if isinstance(v, float) and not _isfinite(v):
            bad.append(f"{key}={v}")
    return bad


class NanMetric:
    name: ClassVar[str] = "nan_metric"
    layer: ClassVar = "algorithmic"
    default_routing: ClassVar = "ticket"
    first_response: ClassVar[str] = (
        "numerics: check loss scale / mixed precision and the reward function's output; "
        "detectors skip non-finite values, so their windows are thinner until it stops"
    )
    Params: ClassVar[type] = Params
    handles: ClassVar[frozenset[str]] = frozenset(FIELDS)

    def initial(self) -> NanState:
        return NanState()

    def apply(
        self, st: NanState, ev: EventBase, cfg: Settings[Params], ctx: RunContext
    ) -> tuple[NanState, Sequence[AlertEvent]]:
        bad = non_finite(ev)
        step = ev.step or 0
        if not bad:
            if st.episode is None or ev.type != "TrainerStepCompleted":
                return st, NO_ALERTS
            clean = st.clean + 1
            if clean < cfg.params.quiet_steps:
                return st._replace(clean=clean), NO_ALERTS
            reason = f"metrics finite again for {clean} steps ({st.count} non-finite values)"
            return NanState(), (resolve(ev, cfg, st.episode, reason),)
        names = tuple(sorted({*st.fields, *(f"{ev.type}.{b.split('=')[0]}" for b in bad)}))
        if st.episode is not None:
            return NanState(st.episode, st.count + len(bad), names[-32:], 0), NO_ALERTS
        alert = fire(
            ev,
            cfg,
            first_step=step,
            window=(step, step),
            observed={"fields": ", ".join(bad)[:500], "count": len(bad), "event": ev.type},
            thresholds={"finite": True},
            reason=f"non-finite metric at step {step} in {ev.type}: {', '.join(bad)[:300]}",
        )
        return NanState(alert_id(ev.run_id, self.name, step), len(bad), names, 0), (alert,)


DETECTOR = NanMetric()

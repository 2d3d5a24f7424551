"""Entropy collapse: policy entropy falling faster than its own forecast, judged every step.

The seed's detector waits for ``k`` windows of an EWMA falling faster than a rate (lag:
``k`` windows). This one judges each step: ``log(entropy)`` is forecast one step ahead
by a local linear trend (:mod:`~stream_processors.detectors.sequential`), so a healthy
run's steady decline — slow, or fast early and slowing, as real GRPO runs show — is what
the forecast expects. A collapse bends the curve down faster than the trend: the
standardized shortfalls accumulate in a one-sided CUSUM, whose threshold comes from the
per-run false-alarm budget (``fa_per_run`` over ``horizon_steps``). It fires when the CUSUM
crosses it *and* the entropy has fallen, since the change point, faster than ``drop_rel``
per step on average (relative; the seed's rate rule, here as a floor on what is worth
telling). Log scale: the rule is the same at entropy 2.0 and 0.2.

Resolves after ``resolve_steps`` steps with the CUSUM back at zero (the forecast has caught
up and the entropy no longer falls faster than it). The alert's window starts at the
change-point estimate (where the CUSUM last left zero). Lag: a collapse at the seed's rate
(e-folding in 40 steps) fires 5-10 steps after it starts. Time: steps only.

The false-alarm budget is per ``horizon_steps`` steps: logged one row every ``c`` steps
(TRL's ``logging_steps``, the rows' mean spacing) the CUSUM is judged ``horizon_steps / c``
times, so its threshold is the one for that many rows (every step logged, unchanged; a row
every 10 steps pages a collapse a row sooner: 30 steps, not 40). The warm-up is still
``warmup`` rows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from math import isfinite, log
from typing import ClassVar, NamedTuple

from events.envelope import EventBase
from stream_processors.detectors import sequential
from stream_processors.detectors.base import (
    NO_ALERTS,
    AlertEvent,
    RunContext,
    Settings,
    fire,
    record,
    resolve,
    state_type,
)

_update, _threshold = sequential.update, sequential.threshold


@dataclass(frozen=True, slots=True)
class Params:
    warmup: int = 20
    alpha: float = 0.3
    beta: float = 0.1
    k: float = 0.5
    clip: float = 4.0
    fa_per_run: float = 0.001
    horizon_steps: int = 1000
    sigma_floor: float = 0.002
    scale_gain: float = 0.05
    drop_rel: float = 0.004
    resolve_steps: int = 25
    #: entropy values at or below this are read as this (log of zero is not a number)
    floor: float = 1e-6


@state_type
class EntropyState(NamedTuple):
    f: sequential.Forecast = sequential.FRESH
    episode: str | None = None
    calm: int = 0


def _spacing(f: sequential.Forecast) -> int:
    """The run's logging cadence: its rows' mean step spacing, rounded (1 every step
    logged, even with a few steps missing; 10 at TRL's default ``logging_steps``)."""
    rows = f.n - 1
    return max(1, (f.last - f.x0 + rows // 2) // rows) if rows > 0 else 1


def _horizon_rows(p: Params, f: sequential.Forecast) -> int:
    """The false-alarm budget's horizon in rows: ``horizon_steps`` steps logged one row
    every ``c`` steps are ``horizon_steps / c`` judgements, so the same per-run budget
    allows a lower CUSUM threshold (every step logged: ``horizon_steps``)."""
    return max(1, p.horizon_steps // _spacing(f))


class EntropyCollapse:
    name: ClassVar[str] = "entropy_collapse"
    layer: ClassVar = "algorithmic"
    default_routing: ClassVar = "ticket"
    first_response: ClassVar[str] = (
        "clip-higher or KL term per GRPO variants; mode collapse in progress"
    )
    Params: ClassVar[type] = Params
    handles: ClassVar[frozenset[str]] = frozenset({"TrainerStepCompleted"})

    def initial(self) -> EntropyState:
        return EntropyState()

    def apply(
        self, st: EntropyState, ev: EventBase, cfg: Settings[Params], ctx: RunContext
    ) -> tuple[EntropyState, Sequence[AlertEvent]]:
        x = ev.entropy
        if x is None or not isfinite(x):
            return st, NO_ALERTS
        p = cfg.params
        step: int = ev.step  # type: ignore[assignment]  (the composite drops step-less)
        f, episode, calm = st
        f = _update(f, step, log(x if x > p.floor else p.floor), -1.0, p)
        s = f.s
        if episode is None:
            if s == 0.0 or s <= _threshold(p.k, p.fa_per_run, _horizon_rows(p, f)):
                return record(EntropyState, (f, None, 0)), NO_ALERTS
            span = step - f.start + 1
            rate = (f.start_level - f.level) / span  # log units per step: relative fall
            if rate < p.drop_rel:
                return record(EntropyState, (f, None, 0)), NO_ALERTS
            return self._fire(ev, cfg, f, step, rate)
        calm = calm + 1 if s == 0.0 else 0
        if calm < p.resolve_steps:
            return record(EntropyState, (f, episode, calm)), NO_ALERTS
        why = f"entropy back on its own trend for {calm} steps (now {math.exp(f.level):.4g})"
        return EntropyState(f), (resolve(ev, cfg, episode, why),)

    def _fire(
        self, ev: EventBase, cfg: Settings[Params], f: sequential.Forecast, step: int, rate: float
    ) -> tuple[EntropyState, Sequence[AlertEvent]]:
        p = cfg.params
        h = sequential.threshold(p.k, p.fa_per_run, _horizon_rows(p, f))
        was, now = math.exp(f.start_level), math.exp(f.level)
        alert = fire(
            ev,
            cfg,
            first_step=f.start,
            window=(f.start, step),
            observed={
                "entropy": now,
                "entropy_at_change": was,
                "fall_rel_per_step": rate,
                "cusum": f.s,
            },
            thresholds={"cusum_h": h, "drop_rel": p.drop_rel, "fa_per_run": p.fa_per_run},
            reason=(
                f"entropy fell from {was:.4g} to {now:.4g} since step {f.start} "
                f"({rate:.2%} per step), faster than its own trend predicted "
                f"(CUSUM {f.s:.1f} > {h:.1f})"
            ),
        )
        return record(EntropyState, (f, alert.alert_id, 0)), (alert,)


DETECTOR = EntropyCollapse()

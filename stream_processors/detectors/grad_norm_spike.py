"""Gradient-norm spike: the grad norm above its trailing robust band; escalates when
spikes repeat while clipping is engaged.

Band: on ``log(grad_norm)`` (grad norms are roughly log-normal), the trailing ``window``
steps refolded every ``refresh`` steps; upper edge ``median + max(k·IQR, min_band_log)``.
A step above it is a spike. The first spike fires; later spikes in the same episode are
counted, and once ``escalate_after`` of them happened *with clipping engaged* the
episode fires once more with ``escalated=True`` and the catalog's escalated routing.

Clipping engaged: the step's pre-clip ``grad_norm`` exceeds its ``grad_clip_threshold``
(or the catalog's ``clip_norm`` when the trainer does not report one); when neither is
known, a ``clip_fraction`` above ``clipfrac_engaged`` counts as engaged.

Resolves after ``quiet_steps`` steps without a spike. Non-positive or non-finite grad
norms are skipped (the nan_metric detector reports them). Lag: the spike's own step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

from events.catalog.trainer import TrainerStepCompleted
from events.envelope import EventBase
from stream_processors.detectors.base import (
    NO_ALERTS,
    AlertEvent,
    RunContext,
    Settings,
    alert_id,
    fire,
    median_iqr,
    record,
    resolve,
    state_type,
)

_log, _exp, _INF = math.log, math.exp, math.inf


@dataclass(frozen=True, slots=True)
class Params:
    window: int = 50
    refresh: int = 10
    min_points: int = 30
    k: float = 6.0
    min_band_log: float = 0.5
    quiet_steps: int = 25
    escalate_after: int = 3
    clip_norm: float = 0.0
    clipfrac_engaged: float = 0.3


@state_type
class GradState(NamedTuple):
    history: tuple[float, ...] = ()
    recent: tuple[float, ...] = ()
    median: float = 0.0
    hi: float = math.inf
    episode: str | None = None
    spikes: int = 0
    clipped_spikes: int = 0
    last_spike: int = 0
    escalated: bool = False


def _clipping(ev: TrainerStepCompleted, p: Params) -> bool:
    threshold = ev.grad_clip_threshold or p.clip_norm
    if threshold:
        return (ev.grad_norm or 0.0) > threshold
    return ev.clip_fraction is not None and ev.clip_fraction > p.clipfrac_engaged


class GradNormSpike:
    name: ClassVar[str] = "grad_norm_spike"
    layer: ClassVar = "algorithmic"
    default_routing: ClassVar = "advisory"
    first_response: ClassVar[str] = (
        "check batch composition and LR schedule; correlate with loss scale if mixed precision"
    )
    Params: ClassVar[type] = Params
    handles: ClassVar[frozenset[str]] = frozenset({"TrainerStepCompleted"})

    def initial(self) -> GradState:
        return GradState()

    def apply(
        self, st: GradState, ev: EventBase, cfg: Settings[Params], ctx: RunContext
    ) -> tuple[GradState, Sequence[AlertEvent]]:
        g = ev.grad_norm
        if g is None or not (0.0 < g < _INF):
            return st, NO_ALERTS
        p = cfg.params
        step: int = ev.step  # type: ignore[assignment]  (the composite drops step-less)
        lg = _log(g)
        out: tuple[AlertEvent, ...] = NO_ALERTS
        history, recent, median, hi, episode, spikes, clipped, last, escalated = st
        if lg > hi:
            band_hi = _exp(hi)
            if episode is None:
                episode, spikes, clipped, escalated = (
                    alert_id(ev.run_id, self.name, step), 0, 0, False
                )  # fmt: skip
                out = (self._fire(ev, cfg, step, g, band_hi, 1, False),)
            spikes, last = spikes + 1, step
            clipped += _clipping(ev, p)
            if clipped >= p.escalate_after and not escalated:
                escalated = True
                first = int(episode.rsplit(":", 1)[1])
                out = (*out, self._fire(ev, cfg, first, g, band_hi, clipped, True))
        elif episode is not None and step - last >= p.quiet_steps:
            out = (
                resolve(
                    ev,
                    cfg,
                    episode,
                    f"no grad-norm spike for {step - last} steps ({spikes} in the episode)",
                ),
            )
            episode = None
        recent = (*recent, lg)  # band_update, inlined (hot path)
        if len(recent) >= p.refresh:
            history, recent = (history + recent)[-p.window :], ()
            if len(history) >= p.min_points:
                median, iqr = median_iqr(history)
                hi = median + max(p.k * iqr, p.min_band_log)
        fields = (history, recent, median, hi, episode, spikes, clipped, last, escalated)
        return record(GradState, fields), out

    def _fire(
        self,
        ev: TrainerStepCompleted,
        cfg: Settings[Params],
        first: int,
        g: float,
        band_hi: float,
        clipped: int,
        escalated: bool,
    ) -> AlertEvent:
        p = cfg.params
        step = ev.step or 0
        reason = (
            f"{clipped} grad-norm spikes with clipping engaged since step {first} "
            f"(latest {g:.4g} > band {band_hi:.4g}): repeated spikes, escalated"
            if escalated
            else f"grad norm {g:.4g} above its trailing robust band {band_hi:.4g} "
            f"(median + {p.k:g}·IQR of log grad norm over {p.window} steps)"
        )
        return fire(
            ev,
            cfg,
            first_step=first,
            window=(first, step),
            observed={"grad_norm": g, "clipped_spikes": clipped, "clip_fraction": ev.clip_fraction},
            thresholds={"band_hi": band_hi, "k_iqr": p.k, "escalate_after": p.escalate_after},
            reason=reason,
            escalated=escalated,
        )


DETECTOR = GradNormSpike()

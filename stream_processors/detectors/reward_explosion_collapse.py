"""Reward explosion or collapse: the reward mean leaves its own robust band.

Window: the trailing ``window`` steps of finite ``reward_mean`` values, refolded every
``refresh`` steps into a band ``median ± max(k·IQR, k_noise·sigma, min_band_abs,
min_band_rel·|median|)``, ``sigma`` the step-to-step noise (median absolute first
difference, scaled): the floors keep a near-constant reward from turning every wiggle
into an alert, and an IQR that came out small by chance from a short trailing window
from paging on ordinary noise.
Rule: ``consecutive`` steps in a row outside the band on the same side fire; the alert
resolves after ``consecutive`` steps back inside. The band keeps learning while firing,
so a sustained level shift fires once and resolves once the trailing window has absorbed
the new level (at most ``window`` steps); a reward stuck at a constant is then the dead-run
detector's business.

Lag: ``consecutive`` steps after the jump, once ``min_points`` values have been seen.
Time: steps only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from math import isfinite
from typing import ClassVar, NamedTuple

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

#: median |x_t - x_(t-1)| of iid Gaussian noise, in units of its sigma (0.6745 * sqrt 2)
_MEDIAN_ABS_DIFF = 0.9539


@dataclass(frozen=True, slots=True)
class Params:
    window: int = 50
    refresh: int = 10
    min_points: int = 30
    k: float = 3.5
    consecutive: int = 3
    #: the band is never narrower than this many step-to-step noise units
    k_noise: float = 5.0
    min_band_abs: float = 0.02
    min_band_rel: float = 0.05


@state_type
class RewardBandState(NamedTuple):
    history: tuple[float, ...] = ()
    recent: tuple[float, ...] = ()
    median: float = 0.0
    lo: float = float("-inf")
    hi: float = float("inf")
    ready: bool = False
    side: int = 0  # +1 above, -1 below, 0 inside
    run: int = 0  # consecutive steps on `side`
    run_start: int = 0
    episode: str | None = None
    inside: int = 0  # consecutive steps back inside while firing
    #: the band already holds its noise floor (computed the first time a value falls
    #: outside the IQR band after a refresh: most steps never need it)
    widened: bool = False


class RewardExplosionCollapse:
    name: ClassVar[str] = "reward_explosion_collapse"
    layer: ClassVar = "algorithmic"
    default_routing: ClassVar = "page"
    first_response: ClassVar[str] = "freeze promotion; inspect reward-scorer logs; reward design"
    Params: ClassVar[type] = Params
    handles: ClassVar[frozenset[str]] = frozenset({"TrainerStepCompleted"})

    def initial(self) -> RewardBandState:
        return RewardBandState()

    def apply(
        self, st: RewardBandState, ev: EventBase, cfg: Settings[Params], ctx: RunContext
    ) -> tuple[RewardBandState, Sequence[AlertEvent]]:
        r = ev.reward_mean
        if r is None or not isfinite(r):
            return st, NO_ALERTS
        p = cfg.params
        step: int = ev.step  # type: ignore[assignment]  (the composite drops step-less)
        out: tuple[AlertEvent, ...] = NO_ALERTS
        side = (1 if r > st.hi else -1 if r < st.lo else 0) if st.ready else 0
        if side and not st.widened:  # the step-to-step noise floor, now that it matters
            half = p.k_noise * _step_noise(st.history)
            lo, hi = min(st.lo, st.median - half), max(st.hi, st.median + half)
            st = st._replace(lo=lo, hi=hi, widened=True)
            side = 1 if r > hi else -1 if r < lo else 0
        run = st.run + 1 if side and side == st.side else (1 if side else 0)
        run_start = st.run_start if side and side == st.side else step
        episode, inside = st.episode, st.inside
        if side and episode is None and run >= p.consecutive:
            what = "exploded above" if side > 0 else "collapsed below"
            out = (
                fire(
                    ev,
                    cfg,
                    first_step=run_start,
                    window=(run_start, step),
                    observed={"reward_mean": r, "band_median": st.median, "steps_outside": run},
                    thresholds={"band_lo": st.lo, "band_hi": st.hi, "k_iqr": p.k},
                    reason=(
                        f"reward mean {r:.4g} {what} its robust band [{st.lo:.4g}, "
                        f"{st.hi:.4g}] (median ± the wider of {p.k:g}·IQR and {p.k_noise:g} "
                        f"step-to-step noise units, trailing {p.window} steps) for {run} "
                        "consecutive steps"
                    ),
                ),
            )
            episode, inside = alert_id(ev.run_id, self.name, run_start), 0
        elif episode is not None:
            inside = inside + 1 if side == 0 else 0
            if inside >= p.consecutive:
                out = (
                    resolve(
                        ev,
                        cfg,
                        episode,
                        f"reward mean {r:.4g} back inside its band for {inside} steps",
                    ),
                )
                episode, inside = None, 0
        history, recent = st.history, (*st.recent, r)  # band_update, inlined (hot path)
        refreshed = len(recent) >= p.refresh
        if refreshed:
            history, recent = (history + recent)[-p.window :], ()
        median, lo, hi, ready, widened = st.median, st.lo, st.hi, st.ready, st.widened
        if refreshed and len(history) >= p.min_points:
            median, iqr = median_iqr(history)
            half = max(p.k * iqr, p.min_band_abs, p.min_band_rel * abs(median))
            lo, hi, ready, widened = median - half, median + half, True, False
        fields = (history, recent, median, lo, hi, ready, side, run, run_start, episode, inside,
                  widened)  # fmt: skip
        return record(RewardBandState, fields), out


def _step_noise(history: tuple[float, ...]) -> float:
    """The step-to-step noise of ``history`` (median absolute first difference, scaled)."""
    steps = sorted(abs(b - a) for a, b in pairwise(history))
    return steps[len(steps) // 2] / _MEDIAN_ABS_DIFF if steps else 0.0


DETECTOR = RewardExplosionCollapse()

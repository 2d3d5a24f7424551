"""Reward explosion or collapse: the reward mean leaves its own robust band.

Window: the trailing ``window`` steps of finite ``reward_mean`` values, refolded every
``refresh`` steps into a band ``median ± max(k·IQR, k_noise·sigma, min_band_abs,
min_band_rel·|median|)``, ``sigma`` the step-to-step noise (median absolute first
difference, scaled): the floors keep a near-constant reward from turning every wiggle
into an alert, and an IQR that came out small by chance from a short trailing window
from paging on ordinary noise.
Where the median is positive, a reward below ``collapse_frac`` of it and at least
``k_collapse`` noise units (and ``min_band_abs``) under it has collapsed even inside that
band once it stays there ``collapse_steps`` steps (the run counts from its first step
under the line; a step outside the band itself fires after ``consecutive``): a slow
learner's noise (a reward of 0.12 moving 0.02 a step) widens the band past zero, so a fall
to 0.01 would otherwise never leave it, and a noisy run's reward dips for a few steps.
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
    #: a positive reward below this fraction of the median ...
    collapse_frac: float = 0.25
    #: ... and this many step-to-step noise units under it has collapsed, once it stays
    #: there this many steps (a noisy run's reward dips for 3-4 steps and recovers)
    k_collapse: float = 3.0
    collapse_steps: int = 8


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
        (history, recent, median, lo, hi, ready, last_side, run, run_start, episode, inside,
         widened) = st  # fmt: skip
        side = (1 if r > hi else -1 if r < lo else 0) if ready else 0
        if side and not widened:  # the step-to-step noise floor, now that it matters
            half = p.k_noise * _step_noise(history)
            lo, hi, widened = min(lo, median - half), max(hi, median + half), True
            side = 1 if r > hi else -1 if r < lo else 0
        collapsed = (
            not side
            and ready
            and median > 0.0
            and r < p.collapse_frac * median
            and (median - r >= max(p.k_collapse * _step_noise(history), p.min_band_abs))
        )  # the noise is only computed for a value already under a quarter of the median
        if collapsed:
            side = -1
        if side and side == last_side:
            run += 1
        else:
            run, run_start = (1 if side else 0), step
        if side and episode is None and run >= (p.collapse_steps if collapsed else p.consecutive):
            what = "exploded above" if side > 0 else "collapsed below"
            reason = (
                f"reward mean {r:.4g} {what} its robust band [{lo:.4g}, {hi:.4g}] (median ± "
                f"the wider of {p.k:g}·IQR and {p.k_noise:g} step-to-step noise units, "
                f"trailing {p.window} steps) for {run} consecutive steps"
            )
            if collapsed:
                reason = (
                    f"reward mean {r:.4g} collapsed below {p.collapse_frac:g} of its median "
                    f"{median:.4g} and {p.k_collapse:g} step-to-step noise units under it "
                    f"(trailing {p.window} steps) for {run} consecutive steps"
                )
            out = (
                fire(
                    ev,
                    cfg,
                    first_step=run_start,
                    window=(run_start, step),
                    observed={"reward_mean": r, "band_median": median, "steps_outside": run},
                    thresholds={
                        "band_lo": lo,
                        "band_hi": hi,
                        "k_iqr": p.k,
                        "collapse_line": p.collapse_frac * median,
                    },
                    reason=reason,
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
        recent = (*recent, r)  # band_update, inlined (hot path)
        if len(recent) >= p.refresh:
            history, recent = (history + recent)[-p.window :], ()
            if len(history) >= p.min_points:
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

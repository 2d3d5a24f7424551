"""Reward explosion or collapse: the reward mean leaves its own robust band.

Window: the finite ``reward_mean`` values of the trailing ``window`` steps (never fewer
than ``min_rows`` logged rows), refolded every ``refresh`` steps into a band ``median ±
max(k·IQR, k_noise·sigma, min_band_abs, min_band_rel·|median|)``, ``sigma`` the
step-to-step noise (median absolute first difference of the rows, scaled, and expressed
per step: a row that averages ``c`` steps — TRL logs the mean of its ``logging_steps`` —
has ``sqrt(c)`` less noise than one step, while the reward's trend moves as many steps
between two rows, so the rows' noise is multiplied by ``sqrt(c)``, ``c`` the median step
spacing of the window): the floors keep a near-constant reward from turning every wiggle
into an alert, and an IQR that came out small by chance from a short trailing window
from paging on ordinary noise.
Where the median is positive, a reward below ``collapse_frac`` of it and at least
``k_collapse`` noise units (and ``min_band_abs``) under it has collapsed even inside that
band once it stays there ``collapse_steps`` steps (the run counts from its first step
under the line; a step outside the band itself fires after ``consecutive``): a slow
learner's noise (a reward of 0.12 moving 0.02 a step) widens the band past zero, so a fall
to 0.01 would otherwise never leave it, and a noisy run's reward dips for a few steps.
Rule: rows outside the band on the same side covering ``consecutive`` steps, and at least
``min_rows_out`` rows above it (``min_rows_below`` below it), fire; the alert resolves
after rows back inside covering as many steps (and ``min_rows_below`` rows). A run of rows
covers the steps from the row before its first to its last (a row stands for the steps
since the row before it): every step logged, ``consecutive`` rows, as before; one row
every 10 steps, 3 rows above or 2 below (one row is one value, not ten: two smooth
averaged rows of a healthy 30-60-step rise, the answer format learned, leave a band the
rise is still entering, while a healthy run does not fall by three quarters). The band
keeps learning while firing, so a sustained level shift fires once and resolves once the
trailing window has absorbed the new level (at most ``window`` steps); a reward stuck at
a constant is then the dead-run detector's business.

Every step logged (``logging_steps`` 1) this is the rule it always was: a window of 50
values refreshed every 10, 3 rows outside. Counted in rows, a history logged every 10
steps needed 500 steps before its band existed (a collapse at step 250 never paged) and one
logged every 5 kept a band 50 steps stale (a healthy 60-step rise paged).

Lag: ``consecutive`` steps after the jump every step logged; at a coarser cadence the
first row that shows it plus 1 row below (a collapse: 10-19 steps at a row every 10) or 2
above (an explosion: 20-29); once ``min_points`` steps and ``min_rows`` rows have been
seen. Time: steps only.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from math import isfinite
from typing import Any, ClassVar, NamedTuple

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
    #: the band's trailing window, in steps (never fewer than ``min_rows`` rows)
    window: int = 50
    #: steps between two refolds of the band
    refresh: int = 10
    #: steps the window must cover before the band is armed
    min_points: int = 30
    #: rows the band needs (and the window keeps) whatever the logging cadence
    min_rows: int = 10
    k: float = 3.5
    #: steps outside the band (or back inside it) that fire (resolve)
    consecutive: int = 3
    #: ... and never fewer rows than this above the band (a row logged every 10 steps is
    #: one value; two smooth averaged rows of a healthy fast rise — the answer format
    #: learned — leave a band the rise is still entering)
    min_rows_out: int = 3
    #: ... or below it (a healthy run does not fall by three quarters: a collapse pages a
    #: row sooner)
    min_rows_below: int = 2
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
    """The band and the runs outside / back inside it. A state stored by the rule that
    counted rows (12 fields, its open episode at place 9) starts afresh keeping that
    episode (:meth:`from_stale`), so it resolves instead of paging twice."""

    #: the band's window: values and their steps (as of the last refresh)
    history: tuple[float, ...] = ()
    hsteps: tuple[int, ...] = ()
    #: rows since the last refresh: values and steps
    recent: tuple[float, ...] = ()
    rsteps: tuple[int, ...] = ()
    median: float = 0.0
    lo: float = float("-inf")
    hi: float = float("inf")
    ready: bool = False
    side: int = 0  # +1 above, -1 below, 0 inside
    run: int = 0  # consecutive rows on `side`
    run_start: int = 0  # the step of the run's first row
    episode: str | None = None
    inside: int = 0  # consecutive rows back inside while firing
    #: the band already holds its noise floor (computed the first time a value falls
    #: outside the IQR band after a refresh: most steps never need it)
    widened: bool = False
    #: the previous row's step (-1: none yet)
    last: int = -1
    #: the step of the row before the run outside (the run back inside) began: the run
    #: covers the steps after it
    run_from: int = 0
    inside_from: int = 0
    #: the step of the last refresh (-1: none yet)
    refreshed: int = -1
    #: the window's median step spacing (the run's logging cadence; 1 every step logged)
    spacing: int = 1

    @classmethod
    def from_stale(cls, fields: tuple[Any, ...]) -> RewardBandState:
        if len(fields) == 12 and (fields[9] is None or isinstance(fields[9], str)):
            return cls(episode=fields[9])
        return cls()


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
        (history, hsteps, recent, rsteps, median, lo, hi, ready, last_side, run, run_start,
         episode, inside, widened, last, run_from, inside_from, refreshed,
         spacing) = st  # fmt: skip
        if last < 0:  # the run's first row: it stands for its own step
            last = refreshed = step - 1
        side = (1 if r > hi else -1 if r < lo else 0) if ready else 0
        if side and not widened:  # the step-to-step noise floor, now that it matters
            half = p.k_noise * _step_noise(history, spacing)
            lo, hi, widened = min(lo, median - half), max(hi, median + half), True
            side = 1 if r > hi else -1 if r < lo else 0
        collapsed = (
            not side
            and ready
            and median > 0.0
            and r < p.collapse_frac * median
            and (median - r >= max(p.k_collapse * _step_noise(history, spacing), p.min_band_abs))
        )  # the noise is only computed for a value already under a quarter of the median
        if collapsed:
            side = -1
        if side and side == last_side:
            run += 1
        else:
            run, run_start, run_from = (1 if side else 0), step, last
        need = p.collapse_steps if collapsed else p.consecutive
        rows = p.min_rows_out if side > 0 else p.min_rows_below
        if side and episode is None and run >= rows and step - run_from >= need:
            covered = step - run_from
            what = "exploded above" if side > 0 else "collapsed below"
            trailing = _trailing(hsteps, spacing)
            held = f"{run} consecutive steps" if spacing == 1 else (
                f"{covered} steps ({run} logged rows, one every {spacing} steps)"
            )  # fmt: skip
            reason = (
                f"reward mean {r:.4g} {what} its robust band [{lo:.4g}, {hi:.4g}] (median ± "
                f"the wider of {p.k:g}·IQR and {p.k_noise:g} step-to-step noise units, "
                f"{trailing}) for {held}"
            )
            if collapsed:
                reason = (
                    f"reward mean {r:.4g} collapsed below {p.collapse_frac:g} of its median "
                    f"{median:.4g} and {p.k_collapse:g} step-to-step noise units under it "
                    f"({trailing}) for {held}"
                )
            out = (
                fire(
                    ev,
                    cfg,
                    first_step=run_start,
                    window=(run_start, step),
                    observed={"reward_mean": r, "band_median": median, "steps_outside": covered,
                              "rows_outside": run},
                    thresholds={
                        "band_lo": lo,
                        "band_hi": hi,
                        "k_iqr": p.k,
                        "collapse_line": p.collapse_frac * median,
                    },
                    reason=reason,
                ),
            )  # fmt: skip
            episode, inside = alert_id(ev.run_id, self.name, run_start), 0
        elif episode is not None:
            if side:
                inside = 0
            else:
                if not inside:
                    inside_from = last
                inside += 1
            if inside >= p.min_rows_below and step - inside_from >= p.consecutive:
                what = f"{inside} steps" if spacing == 1 else (
                    f"{step - inside_from} steps ({inside} logged rows)"
                )  # fmt: skip
                why = f"reward mean {r:.4g} back inside its band for {what}"
                out = (resolve(ev, cfg, episode, why),)
                episode, inside = None, 0
        recent, rsteps = (*recent, r), (*rsteps, step)  # the band's update, inlined (hot path)
        if step - refreshed >= p.refresh:
            history, hsteps, recent, rsteps, refreshed = (
                *_window(history + recent, hsteps + rsteps, step, p), (), (), step
            )  # fmt: skip
            spacing = _spacing(hsteps)
            if len(history) >= p.min_rows and hsteps[-1] - hsteps[0] + spacing >= p.min_points:
                median, iqr = median_iqr(history)
                half = max(p.k * iqr, p.min_band_abs, p.min_band_rel * abs(median))
                lo, hi, ready, widened = median - half, median + half, True, False
        fields = (history, hsteps, recent, rsteps, median, lo, hi, ready, side, run, run_start,
                  episode, inside, widened, step, run_from, inside_from, refreshed,
                  spacing)  # fmt: skip
        return record(RewardBandState, fields), out


def _window(
    values: tuple[float, ...], steps: tuple[int, ...], step: int, p: Params
) -> tuple[tuple[float, ...], tuple[int, ...]]:
    """The rows of the trailing ``window`` steps up to ``step``, never fewer than
    ``min_rows`` (or all there are)."""
    keep = len(steps) - bisect_right(steps, step - p.window)
    keep = min(len(steps), max(keep, p.min_rows))
    return values[-keep:], steps[-keep:]


def _spacing(steps: tuple[int, ...]) -> int:
    """The median step spacing of ``steps`` (the logging cadence); 1 for fewer than two."""
    gaps = sorted(b - a for a, b in pairwise(steps))
    return max(1, gaps[len(gaps) // 2]) if gaps else 1


def _trailing(steps: tuple[int, ...], spacing: int) -> str:
    """What the band's window covers, for an alert's reason."""
    covered = steps[-1] - steps[0] + spacing if steps else 0
    if spacing == 1:
        return f"trailing {covered} steps"
    return f"trailing {covered} steps, {len(steps)} logged rows"


def _step_noise(history: tuple[float, ...], spacing: int = 1) -> float:
    """The step-to-step noise of ``history`` (median absolute first difference, scaled),
    per step: rows ``spacing`` steps apart, each the mean of as many steps, have
    ``sqrt(spacing)`` less noise than one step."""
    steps = sorted(abs(b - a) for a, b in pairwise(history))
    noise = steps[len(steps) // 2] / _MEDIAN_ABS_DIFF if steps else 0.0
    return noise * math.sqrt(spacing) if spacing != 1 else noise


DETECTOR = RewardExplosionCollapse()

"""Sequential change detection on one per-step series: a CUSUM against a local forecast.

Fixed windows wait for a window to fill before they judge it; this judges every step.
The reference is a local linear forecast (Holt's two-gain exponential smoothing: a level
and a trend), so a series that rises or falls steadily — a healthy run's entropy drifting
down, its generation length growing — is *predicted*, not flagged. What accumulates is the
one-step-ahead forecast error, standardized by the series' own noise scale (a running mean
of ``|error|``, so each run is judged against its own noise), clipped at ``±clip`` (one
fat-tailed outlier cannot trip it) and fed to a one-sided CUSUM::

    z = direction · error / sigma            (clipped to [-clip, clip])
    S = max(0, S + z - k)                    (k: the allowance, in sigma)
    alarm when S > h

``start`` is the last step at which ``S`` left zero: the change-point estimate.

False alarms per run: for standardized, independent Gaussian errors the CUSUM's average
run length to a false alarm is, by Siegmund's approximation,
``ARL0 = (exp(2k·h') - 2k·h' - 1) / (2k²)`` with ``h' = h + 1.166``. :func:`threshold`
inverts it: the catalog states a per-run false-alarm budget (``fa_per_run`` over
``horizon_steps``) and ``h`` is the threshold whose ARL0 is ``horizon_steps / fa_per_run``.
Real errors are neither exactly Gaussian nor independent; the measured rates on healthy
runs of several shapes are in ``QUALITY.md``.

Warm-up: the first ``warmup`` values only feed least-squares sums; at the ``warmup``-th the
forecast starts from their fit (level, slope, residual scale), so an early trend is known
from the start rather than learned slowly. Nothing is judged during warm-up.

Everything here is a pure function of immutable records; time is the caller's step number.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import NamedTuple, Protocol

from stream_processors.detectors.base import EMPTY_SUMS, Sums, record, state_type

#: E|e| = sigma · sqrt(2/pi) for Gaussian errors: sigma = mean |e| · SQRT_HALF_PI.
SQRT_HALF_PI = math.sqrt(math.pi / 2.0)


@lru_cache(maxsize=256)
def threshold(k: float, fa_per_run: float, horizon_steps: int) -> float:
    """The CUSUM threshold ``h`` whose Siegmund ARL0 is ``horizon_steps / fa_per_run``.

    ``k`` > 0 is the allowance in sigma units. Monotone in the target, so bisection.
    """
    if k <= 0 or not 0 < fa_per_run < 1 or horizon_steps < 1:
        raise ValueError("threshold needs k > 0, 0 < fa_per_run < 1 and horizon_steps >= 1")
    target = horizon_steps / fa_per_run

    def arl0(h: float) -> float:
        a = 2.0 * k * (h + 1.166)
        return (math.exp(a) - a - 1.0) / (2.0 * k * k)

    lo, hi = 0.0, 1.0
    while arl0(hi) < target:
        hi *= 2.0
    for _ in range(60):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if arl0(mid) < target else (lo, mid)
    return hi


@state_type
class Forecast(NamedTuple):
    """A Holt forecast with a one-sided CUSUM on its standardized errors (immutable)."""

    n: int = 0
    warm: Sums = EMPTY_SUMS
    level: float = 0.0
    trend: float = 0.0
    abs_err: float = 0.0
    s: float = 0.0
    start: int = -1
    #: the forecast level at ``start`` (what the series was heading for before the change)
    start_level: float = 0.0
    #: the first step folded (warm-up sums are kept relative to it)
    x0: int = 0
    #: the step of the last value (the trend is per step, so gaps in the steps are fine)
    last: int = 0


FRESH = Forecast()


class ForecastParams(Protocol):
    """What :func:`update` reads from a detector's ``Params``."""

    alpha: float
    beta: float
    k: float
    clip: float
    warmup: int
    sigma_floor: float
    scale_gain: float


def update(f: Forecast, step: int, y: float, direction: float, p: ForecastParams) -> Forecast:
    """Fold one finite value ``y`` observed at ``step`` (steps increase).

    ``direction`` +1 watches for a rise, -1 for a fall. ``p.alpha`` / ``p.beta``: Holt's
    level and trend gains; ``p.scale_gain``: the gain of the running mean of ``|error|``;
    ``p.sigma_floor``: the least noise scale assumed (a flat series has none); ``p.k``,
    ``p.clip``, ``p.warmup``: the allowance, the clip and the values before judging.
    """
    warmup, clip = p.warmup, p.clip
    n = f.n + 1
    if n <= warmup:
        x0 = step if n == 1 else f.x0
        warm = f.warm.add(step - x0, y)
        if n < warmup:
            return record(Forecast, (n, warm, y, 0.0, 0.0, 0.0, -1, 0.0, x0, step))
        slope = warm.slope
        intercept = (warm.sy - slope * warm.sx) / warm.n
        resid = _resid_sd(warm, slope, intercept)
        level = intercept + slope * (step - x0)
        abs_err = resid / SQRT_HALF_PI
        return record(Forecast, (n, EMPTY_SUMS, level, slope, abs_err, 0.0, -1, level, x0, step))
    dt = step - f.last if step > f.last else 1
    pred = f.level + f.trend * dt
    err = y - pred
    sigma = f.abs_err * SQRT_HALF_PI
    if sigma < p.sigma_floor:
        sigma = p.sigma_floor
    z = direction * err / sigma
    if z > clip:
        z = clip
    elif z < -clip:
        z = -clip
    s = f.s + z - p.k
    start, start_level = f.start, f.start_level
    if s <= 0.0:
        s, start = 0.0, -1
    elif f.s == 0.0:
        start, start_level = step, pred
    abs_err = f.abs_err
    if s == 0.0:  # the noise scale learns only while no change is suspected
        bounded = min(abs(err), clip * sigma)
        abs_err += p.scale_gain * (bounded - abs_err)
    alpha = p.alpha
    level = pred + alpha * err
    trend = f.trend + alpha * p.beta * err / dt
    return record(
        Forecast, (n, EMPTY_SUMS, level, trend, abs_err, s, start, start_level, f.x0, step)
    )


def _resid_sd(s: Sums, slope: float, intercept: float) -> float:
    """Root mean square residual of the least-squares line through the points of ``s``."""
    if s.n < 3:
        return 0.0
    # sum (y - a - b x)^2 expanded over the running sums
    ssr = (
        s.syy
        - 2 * intercept * s.sy
        - 2 * slope * s.sxy
        + intercept * intercept * s.n
        + 2 * intercept * slope * s.sx
        + slope * slope * s.sxx
    )
    return math.sqrt(ssr / (s.n - 2)) if ssr > 0 else 0.0

"""Reward-hacking signature: training reward rising while the held-out eval falls.

The seed judges slopes over fixed 50-step windows (lag: one window, and a blind window
when evals are sparse). Here every new ``EvalGateScored`` point is judged at once, on two
independent conditions that must both hold: the eval fell beyond its noise, and the
training reward rose over the same steps. A false page needs both; the threshold of the
first is derived from a per-run false-alarm budget that counts on the second.

**The eval fell.** Eval points are kept as references at least ``min_span`` steps apart
(an eval at every step is thinned, not compared with its neighbour). The newest point
``e`` is compared with the mean ``m`` of the ``refs`` reference points before it (each
capped at their median + 2 sigma, so one high outlier cannot make a fall)::

    t_eval = (m - e) / (sigma * sqrt(1 + 1/k))        k = the references used

— a prediction-interval test: the mean of ``k`` points has ``sigma^2/k`` of variance, so
the fall needed is ``sqrt(1 + 1/k)`` noise units per unit of ``t`` rather than the
``sqrt(2)`` of a comparison with a single earlier point. ``sigma`` is the eval's noise per
point, estimated from the second differences of the reference series (a steady trend
cancels out of them; their mean square is ``6 sigma^2``) over the last ``noise_points``;
``n`` of them carry about ``n / 1.94`` degrees of freedom (adjacent second differences are
correlated), so ``t_eval`` is Student-t and the threshold is ``t_isf(alpha_eval, n/1.94)``:
a run whose noise has been seen a few times needs a larger fall than one seen thirty times.
Never below ``noise_floor_abs + noise_floor_rel * |e|``.

Below ``min_noise_points`` second differences there is no estimate: the noise is a guess
— the binomial noise of a score in [0, 1] over ``n_items`` items (``sqrt(p(1-p)/n)``) —
and the newest point must lie ``z_eval_prior * sqrt(2)`` guessed units below one of the
references (each at most 2 sigma above the higher of the two points before it): the
few-point regime of the real trainer's canary (0.72 -> 0.095). A producer that does not
say how many items its eval scored (``n_items`` 0: TRL / verl histories imported without
a count, the hooks, ``--eval-file``) gets the noise of a small eval set, ``prior_items``
items: real eval sets of a few hundred prompts move 0.02-0.05 a point, which a guess of
``noise_floor_abs`` (0.004) called a 7-unit fall. A score outside [0, 1] gets the floor
when its items are counted (a score of items that fell below 0 fell a long way); one of
uncounted items has no model and no known scale: it is not judged until its own noise has
been estimated.

**The training reward rose** over ``(s_last, step]`` (``s_last`` the last reference point,
widened to at least the last ``min_reward_span`` steps when shorter): its least-squares slope
exceeds ``tau`` per step and ``z_reward`` standard errors. Batch-mean rewards are
autocorrelated, which makes a plain slope t too large; the lag-1 autocorrelation ``phi``
of the span is estimated from its mean squared step-to-step change (``2 s^2 (1 - phi)``
plus the trend's share) and the t is deflated by ``sqrt((1 - phi) / (1 + phi))`` (``phi``
clipped to ``[0, phi_max]``). The slope and its residual come from running sums: the sums
(and the running sum of squared changes) are kept with each eval point and every
``snap_every`` steps, and the difference of two running sums is the sums of the span.

**The false-alarm budget.** Under a steady run (eval and reward noise independent, about
a level) each eval point pages with probability ``alpha_eval * alpha_reward``:
``alpha_reward = P(T_{min_reward_span-2} > z_reward)`` and ``alpha_eval`` the eval test's
level. The catalog states ``fa_per_run`` over ``horizon_steps``; with eval points every
``c`` steps (the run's mean cadence so far) there are ``horizon_steps / c`` of them, so::

    alpha_eval = fa_per_run * c / horizon_steps / alpha_reward          (Bonferroni)

A sparse eval gets a lower threshold per point (fewer chances to be wrong), a dense one a
higher. Where the reward rises genuinely (a healthy climb) only ``alpha_eval`` guards, and
a healthy eval usually rises with it; the measured rates on healthy runs, and on runs whose
reward climbs while the eval stays flat, are in ``QUALITY.md`` / ``docs/detectors.md``.

The first point where both hold fires. Its window is ``(s_ref, step)`` and its episode id
is ``s_ref``: the change-point estimate, the newest reference still at or above the mean
(the divergence began after it); in the few-point regime, the reference it fell from. The
episode resolves after ``resolve_evals`` eval points in a row back within the noise of the
level the eval fell from (the damage undone, not a pause in the fall; a rollback resolves
it too). Missing eval: no eval, no judgement (``eval_gate_missing`` reports the gap). Time:
steps only; the fold reads no clock.

Lag: the first eval point ``t_isf(alpha_eval)`` noise units (times ``sqrt(1 + 1/k)``) below
the reference mean while the reward's rise is significant; measured per cadence in
``QUALITY.md``.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from math import isfinite
from operator import mul
from typing import Any, ClassVar, NamedTuple

from events.envelope import EventBase
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
from stream_processors.detectors.student_t import t_isf, t_sf

#: effective degrees of freedom per squared second difference (adjacent ones correlate)
D2_DOF = 1.0 / 1.94


@dataclass(frozen=True, slots=True)
class Params:
    #: false pages per run allowed over ``horizon_steps`` on a steady run (see docstring)
    fa_per_run: float = 0.02
    horizon_steps: int = 1000
    z_reward: float = 2.5
    tau: float = 0.002
    refs: int = 8
    min_span: int = 5
    min_reward_span: int = 20
    snap_every: int = 5
    min_reward_points: int = 4
    min_noise_points: int = 6
    noise_points: int = 32
    z_eval_prior: float = 6.0
    #: the eval set size assumed for the guessed noise when ``n_items`` is not reported
    #: (0): a small set, so a large noise (0.065 at a score of 0.3) — a conservative guess
    prior_items: int = 50
    noise_floor_abs: float = 0.002
    noise_floor_rel: float = 0.01
    phi_max: float = 0.8
    resolve_evals: int = 2


@state_type
class RewardSums(NamedTuple):
    """Running least-squares sums of the reward over (step - x0, reward), with the running
    sum of squared changes between consecutive reported steps (immutable)."""

    n: int = 0
    sx: float = 0.0
    sy: float = 0.0
    sxx: float = 0.0
    sxy: float = 0.0
    syy: float = 0.0
    last: float = 0.0
    dd: float = 0.0


EMPTY = RewardSums()


@state_type
class EvalSide(NamedTuple):
    """What changes only at eval points (kept apart: a step rebuilds a smaller record)."""

    #: the reference eval points: (step, score, running reward sums there), newest last
    points: tuple[tuple[int, float, RewardSums], ...] = ()
    #: |second differences| of the reference eval series, newest last
    d2: tuple[float, ...] = ()
    n_items: int = 0
    episode: str | None = None
    calm: int = 0
    #: the open episode's reference level (where the eval fell from)
    fell_from: float = 0.0
    #: eval points seen (judged), and the step of the first: the run's eval cadence
    n_evals: int = 0
    first_eval: int = -1


class _HackingFields(NamedTuple):
    #: running sums of the training reward
    cum: RewardSums = EMPTY
    x0: int = -1
    #: running reward sums every ``snap_every`` steps: (step, sums), newest last
    snaps: tuple[tuple[int, RewardSums], ...] = ()
    evals: EvalSide = EvalSide()


@state_type
class HackingState(_HackingFields):
    """The detector's state. A state stored by an earlier rule (8 fields before issue 17,
    9 in its first round; the open episode and its calm count at places 6 and 7 in both)
    starts afresh but keeps its open episode (:meth:`from_stale`, called by the state
    codec), so a host restarted on it neither crashes nor pages twice for one episode."""

    __slots__ = ()

    @classmethod
    def from_stale(cls, fields: tuple[Any, ...]) -> HackingState:
        if len(fields) in (8, 9) and (fields[6] is None or isinstance(fields[6], str)):
            fell_from = float(fields[8]) if len(fields) == 9 else 0.0  # round one kept it
            return cls(evals=EvalSide(episode=fields[6], calm=int(fields[7]), fell_from=fell_from))
        return cls()


class Fall(NamedTuple):
    """One eval fall that held: what the alert reports."""

    #: the first reference point judged against (the window's start)
    s_first: int
    #: the change-point estimate: the newest reference still at or above the level
    s_ref: int
    level: float
    t_eval: float
    threshold: float
    dof: float
    alpha_eval: float
    slope: float
    t_reward: float
    phi: float
    n: int


@lru_cache(maxsize=64)
def _alpha_reward(z_reward: float, dof: int) -> float:
    """``P(T_dof > z_reward)``: how often a steady reward passes the rise test."""
    return t_sf(z_reward, dof)


def _sub(a: RewardSums, b: RewardSums) -> RewardSums:
    """The sums of the points in ``a`` and not in ``b`` (``b`` a prefix of ``a``)."""
    return RewardSums(
        a.n - b.n, a.sx - b.sx, a.sy - b.sy, a.sxx - b.sxx, a.sxy - b.sxy, a.syy - b.syy,
        a.last, a.dd - b.dd,
    )  # fmt: skip


def reward_rise(s: RewardSums, steps: int, phi_max: float) -> tuple[float, float, float]:
    """(slope, autocorrelation-deflated t, phi) of the points in ``s``; t 0 if undefined.

    ``s.dd`` is the sum of squared changes into each point of the span and ``steps`` the
    steps it covers (its mean spacing is ``steps / n``): with ``s^2`` the
    residual variance about the line, ``E[dd/n] = 2 s^2 (1 - phi) + (slope * spacing)^2``
    for AR(1) noise, which gives ``phi``; the slope's t is divided by
    ``sqrt((1 + phi) / (1 - phi))`` (the variance inflation of a slope under AR(1) noise).
    """
    n = s.n
    if n < 3:
        return 0.0, 0.0, 0.0
    sxx = s.sxx - s.sx * s.sx / n
    if sxx <= 0:
        return 0.0, 0.0, 0.0
    slope = (s.sxy - s.sx * s.sy / n) / sxx
    ssr = (s.syy - s.sy * s.sy / n) - slope * slope * sxx
    if ssr <= 0:
        return slope, math.inf if slope > 0 else -math.inf if slope < 0 else 0.0, 0.0
    var = ssr / (n - 2)
    t = slope / math.sqrt(var / sxx)
    spacing = steps / n
    phi = 1.0 - (s.dd / n - (slope * spacing) ** 2) / (2.0 * var)
    phi = min(max(phi, 0.0), phi_max)
    return slope, t * math.sqrt((1.0 - phi) / (1.0 + phi)), phi


def prior_noise(e: float, n_items: int, p: Params) -> float | None:
    """The guessed noise of an eval score ``e`` over ``n_items`` items: binomial for a
    score in [0, 1] (over ``prior_items`` when ``n_items`` is 0, not reported), the floor
    for one outside it whose items are counted (a score of items that fell below 0 fell a
    long way); ``None`` for a score outside [0, 1] of uncounted items (no model, no known
    scale: no guess)."""
    inside = 0.0 <= e <= 1.0
    if n_items > 0:
        sigma = math.sqrt(max(e * (1.0 - e), 1.0 / n_items) / n_items) if inside else 0.0
    elif inside:
        n = max(1, p.prior_items)
        sigma = math.sqrt(max(e * (1.0 - e), 1.0 / n) / n)
    else:
        return None
    return max(sigma, p.noise_floor_abs + p.noise_floor_rel * abs(e))


class RewardHacking:
    name: ClassVar[str] = "reward_hacking"
    layer: ClassVar = "algorithmic"
    default_routing: ClassVar = "page"
    first_response: ClassVar[str] = "stop the run; audit the reward function; evaluation integrity"
    Params: ClassVar[type] = Params
    handles: ClassVar[frozenset[str]] = frozenset({"TrainerStepCompleted", "EvalGateScored"})

    def initial(self) -> HackingState:
        return HackingState()

    def apply(
        self, st: HackingState, ev: EventBase, cfg: Settings[Params], ctx: RunContext
    ) -> tuple[HackingState, Sequence[AlertEvent]]:
        step = ev.step or 0
        if ev.type == "TrainerStepCompleted":
            r = ev.reward_mean  # type: ignore[attr-defined]
            if r is None or not isfinite(r):
                return st, NO_ALERTS
            sums, x0, snaps, evals = st
            if x0 < 0:
                x0 = step
            every = cfg.params.snap_every
            if not snaps or step // every > snaps[-1][0] // every:
                keep = cfg.params.min_reward_span // every + 2
                snaps = (*snaps, (step, sums))[-keep:]  # the sums before this step
            n, sx, sy, sxx, sxy, syy, last, dd = sums
            d = r - last if n else 0.0
            x = step - x0
            sums = (n + 1, sx + x, sy + r, sxx + x * x, sxy + x * r, syy + r * r, r, dd + d * d)
            return record(HackingState, (record(RewardSums, sums), x0, snaps, evals)), NO_ALERTS
        score = ev.score  # type: ignore[attr-defined]
        if not isfinite(score):
            return st, NO_ALERTS
        return self._judge(ev, cfg, st, step, score)

    def _judge(
        self, ev: EventBase, cfg: Settings[Params], st: HackingState, step: int, e: float
    ) -> tuple[HackingState, Sequence[AlertEvent]]:
        p = cfg.params
        es = st.evals
        n_items = ev.n_items or es.n_items  # type: ignore[attr-defined]
        refs = [pt for pt in es.points if step - pt[0] >= p.min_span][-p.refs :]
        first = es.first_eval if es.n_evals else step
        cadence = (step - first) / es.n_evals if es.n_evals else 0.0
        if len(es.d2) >= p.min_noise_points and refs:
            found, limit, sigma = self._fall(p, st, refs, step, e, cadence)
        else:
            found, limit, sigma = self._prior_fall(p, st, refs, step, e, n_items)
        # the newest point becomes a reference once min_span past the last one
        d2, points = es.d2, es.points
        if not points or step - points[-1][0] >= p.min_span:
            if len(points) >= 2:
                d2 = (*d2, abs(e - 2 * points[-1][1] + points[-2][1]))[-p.noise_points :]
            points = (*points, (step, e, st.cum))[-(p.refs + 1) :]
        es = es._replace(
            points=points, d2=d2, n_items=n_items, n_evals=es.n_evals + 1, first_eval=first
        )
        out: tuple[AlertEvent, ...] = NO_ALERTS
        if found is not None:
            if es.episode is None:
                alert = self._fire(ev, cfg, step, e, sigma, found)
                es, out = (
                    es._replace(episode=alert.alert_id, calm=0, fell_from=found.level),
                    (alert,),
                )
            else:
                es = es._replace(calm=0)
        elif es.episode is not None:
            # open episode: calm once the eval is back within its noise of where it fell from
            calm = 0 if es.fell_from - e > limit else es.calm + 1
            if calm < p.resolve_evals:
                es = es._replace(calm=calm)
            else:
                why = (
                    f"the held-out eval is back to {e:.4g} (it fell from {es.fell_from:.4g}) "
                    f"for {calm} eval points"
                )
                es, out = es._replace(episode=None, calm=0), (resolve(ev, cfg, es.episode, why),)
        return st._replace(evals=es), out

    def _fall(
        self,
        p: Params,
        st: HackingState,
        refs: list[tuple[int, float, RewardSums]],
        step: int,
        e: float,
        cadence: float,
    ) -> tuple[Fall | None, float, float]:
        """The eval's fall below the mean of ``refs`` judged against the budget.

        Returns (the fall if both conditions hold, the fall that counts as "still fallen",
        sigma).
        """
        d2 = st.evals.d2
        m = len(d2)
        floor = p.noise_floor_abs + p.noise_floor_rel * abs(e)
        sigma = max(math.sqrt(sum(map(mul, d2, d2)) / m / 6.0), floor)
        dof = m * D2_DOF
        alpha_r = _alpha_reward(p.z_reward, p.min_reward_span - 2)
        # whole steps and whole degrees of freedom: few distinct (alpha, dof), so the
        # quantile's bisection runs once per pair, not at every eval point
        every = max(1, round(cadence))
        alpha = min(0.25, p.fa_per_run * every / p.horizon_steps / alpha_r)
        threshold = t_isf(alpha, int(dof))
        values = sorted(pt[1] for pt in refs)
        k = len(values)
        cap = values[k // 2] + 2.0 * sigma  # the median + 2 sigma: no single high outlier
        j = bisect_right(values, cap)
        level = (sum(values[:j]) + cap * (k - j)) / k
        unit = sigma * math.sqrt(1.0 + 1.0 / k)
        t_eval = (level - e) / unit
        limit = threshold * unit
        if t_eval <= threshold:
            return None, limit, sigma
        rise = self._reward_rise(p, st, refs[-1], step)
        if rise is None:
            return None, limit, sigma
        slope, t_r, phi, n = rise
        s_ref = next((pt[0] for pt in reversed(refs) if pt[1] >= level), refs[0][0])
        fall = Fall(refs[0][0], s_ref, level, t_eval, threshold, dof, alpha, slope, t_r, phi, n)
        return fall, limit, sigma

    def _prior_fall(
        self,
        p: Params,
        st: HackingState,
        refs: list[tuple[int, float, RewardSums]],
        step: int,
        e: float,
        n_items: int,
    ) -> tuple[Fall | None, float, float]:
        """Few eval points: the newest against each reference, with a guessed noise
        (:func:`prior_noise`; none: no judgement until the run's own noise is known)."""
        sigma = prior_noise(e, n_items, p)
        if sigma is None:  # (an open episode is "back" only at the level it fell from)
            return None, 0.0, 0.0
        limit = p.z_eval_prior * sigma * math.sqrt(2.0)
        points = st.evals.points
        for ref in reversed(refs):
            e_i = ref[1]
            j = len(points) - 1
            while points[j][0] != ref[0]:
                j -= 1
            if j > 1:  # one high outlier is no reference: at most 2 sigma above both before
                e_i = min(e_i, max(points[j - 1][1], points[j - 2][1]) + 2.0 * sigma)
            if e_i - e <= limit:
                continue
            rise = self._reward_rise(p, st, ref, step)
            if rise is not None:
                slope, t_r, phi, n = rise
                t_eval = (e_i - e) / (sigma * math.sqrt(2.0))
                z = p.z_eval_prior
                fall = Fall(ref[0], ref[0], e_i, t_eval, z, 0.0, 0.0, slope, t_r, phi, n)
                return fall, limit, sigma
        return None, limit, sigma

    @staticmethod
    def _reward_rise(
        p: Params, st: HackingState, ref: tuple[int, float, RewardSums], step: int
    ) -> tuple[float, float, float, int] | None:
        """(slope, t, phi, points) of the reward over ``(ref step, step]`` (widened to the
        last ``min_reward_span`` steps) if it rose: slope > tau and t > z_reward."""
        s_ref, _, base = ref
        start = s_ref
        if step - s_ref < p.min_reward_span:  # widen to the last min_reward_span steps
            snaps = st.snaps
            start, base = next(
                (snap for snap in reversed(snaps) if snap[0] <= step - p.min_reward_span + 1),
                snaps[0] if snaps else (s_ref, base),
            )
        span = _sub(st.cum, base)
        if span.n < p.min_reward_points:
            return None
        slope, t, phi = reward_rise(span, step - start, p.phi_max)
        if slope > p.tau and t > p.z_reward:
            return slope, t, phi, span.n
        return None

    def _fire(
        self,
        ev: EventBase,
        cfg: Settings[Params],
        step: int,
        e: float,
        sigma: float,
        f: Fall,
    ) -> AlertEvent:
        p = cfg.params
        observed: dict[str, Any] = {
            "eval_from": f.level,
            "eval_to": e,
            "eval_noise": sigma,
            "eval_fall_t": f.t_eval,
            "eval_dof": f.dof,
            "reward_slope": f.slope,
            "reward_slope_t": f.t_reward,
            "reward_autocorr": f.phi,
            "reward_points": f.n,
        }
        thresholds: dict[str, Any] = {
            "eval_fall_t": f.threshold,
            "alpha_eval": f.alpha_eval,
            "fa_per_run": p.fa_per_run,
            "horizon_steps": p.horizon_steps,
            "z_reward": p.z_reward,
            "tau": p.tau,
        }
        regime = (
            f"the mean of the eval points since step {f.s_first}"
            if f.dof
            else f"the eval at step {f.s_ref} (noise guessed: few eval points yet)"
        )
        return fire(
            ev,
            cfg,
            first_step=f.s_ref,
            window=(f.s_ref, step),
            observed=observed,
            thresholds=thresholds,
            reason=(
                f"held-out eval fell {f.level:.4g} -> {e:.4g} after step {f.s_ref} "
                f"({f.t_eval:.1f} noise units of {sigma:.3g} below {regime}; threshold "
                f"{f.threshold:.2f}) while the training reward rose {f.slope:.4g}/step "
                f"(t {f.t_reward:.1f}) over the same steps: the policy is optimizing "
                "something the eval refutes"
            ),
        )


DETECTOR = RewardHacking()

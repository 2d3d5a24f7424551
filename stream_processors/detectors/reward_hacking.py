"""Reward-hacking signature: training reward rising while the held-out eval falls.

The seed judges slopes over fixed 50-step windows (lag: one window, and a blind window
when evals are sparse). Here every new eval point is judged at once against the eval
points before it: as soon as two eval points disagree beyond their noise while the
training reward rose between them, it fires.

For each new ``EvalGateScored`` point ``j`` and each of the last ``refs`` reference points
``i`` at least ``min_span`` steps before it (eval points are kept as references, and
their second differences as noise samples, at least ``min_span`` steps apart, so an eval
at every step is thinned rather than compared with its neighbour):

- the eval fell: ``e_i - e_j > z_eval · sigma · sqrt(2)``. ``sigma`` is the eval's noise
  per point: the run's own once ``min_noise_points`` second differences of its eval series
  exist (their root mean square over the last ``noise_points``, scaled to a standard
  deviation — a steady trend cancels out of a second difference — and raised by
  ``1 + noise_ucb/sqrt(m)`` for an estimate from ``m`` of them: an upper bound, so a run's
  noise is not taken for less than it is while few points have shown it). Before that it
  is a guess — the binomial noise of a score in [0, 1] over ``n_items`` items
  (``sqrt(p(1-p)/n)``), else ``noise_floor_abs`` — and the fall must exceed
  ``z_eval_prior`` noise units instead. Never below ``noise_floor_abs + noise_floor_rel·|e|``.
  A reference is taken at most ``2·sigma`` above the higher of the two points before it,
  so one high outlier cannot make a fall;
- the training reward rose over the same steps (``(s_i, s_j]``, widened to the last
  ``min_reward_span`` steps when shorter): its least-squares slope exceeds ``tau`` per step
  and ``z_reward`` standard errors. The slope comes from running sums: the sums are kept
  with each eval point and every ``snap_every`` steps, and the difference of two running
  sums is the sums of the span (no per-step window to hold).

The first pair that holds fires (window ``(s_i, s_j)``: the divergence began after
``s_i``). The episode resolves after ``resolve_evals`` eval points in a row back within
the noise of the eval it fell from (the damage undone, not merely a pause in the fall; a
rollback resolves it too). Missing eval: no eval, no judgement (``eval_gate_missing``
reports the gap).

Lag: the first eval point after the eval has fallen ``z_eval·sqrt(2)`` noise units below
an earlier one; measured per eval cadence in ``QUALITY.md``. Time: steps only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from math import isfinite
from typing import Any, ClassVar, NamedTuple

from events.envelope import EventBase
from stream_processors.detectors.base import (
    EMPTY_SUMS,
    NO_ALERTS,
    AlertEvent,
    RunContext,
    Settings,
    Sums,
    fire,
    record,
    resolve,
    state_type,
)


@dataclass(frozen=True, slots=True)
class Params:
    z_eval: float = 2.5
    z_eval_prior: float = 6.0
    z_reward: float = 2.0
    tau: float = 0.002
    refs: int = 4
    min_span: int = 5
    min_reward_span: int = 20
    snap_every: int = 5
    min_reward_points: int = 4
    min_noise_points: int = 6
    noise_points: int = 32
    noise_ucb: float = 1.5
    noise_floor_abs: float = 0.002
    noise_floor_rel: float = 0.01
    resolve_evals: int = 2


@state_type
class HackingState(NamedTuple):
    #: running sums of the training reward over (step - x0, reward)
    cum: Sums = EMPTY_SUMS
    x0: int = -1
    #: the last eval points: (step, score, running reward sums at that point)
    points: tuple[tuple[int, float, Sums], ...] = ()
    #: running reward sums every ``snap_every`` steps: (step, sums), newest last
    snaps: tuple[tuple[int, Sums], ...] = ()
    #: |second differences| of the eval series, newest last
    d2: tuple[float, ...] = ()
    n_items: int = 0
    episode: str | None = None
    calm: int = 0
    #: the open episode's reference eval (where the eval fell from)
    fell_from: float = 0.0


def _sub(a: Sums, b: Sums) -> Sums:
    """The sums of the points in ``a`` and not in ``b`` (``b`` a prefix of ``a``)."""
    return Sums(a.n - b.n, a.sx - b.sx, a.sy - b.sy, a.sxx - b.sxx, a.sxy - b.sxy, a.syy - b.syy)


def _slope_t(s: Sums) -> tuple[float, float]:
    """(least-squares slope, its t statistic) of the points in ``s``; t 0 when undefined."""
    if s.n < 3:
        return 0.0, 0.0
    sxx = s.sxx - s.sx * s.sx / s.n
    if sxx <= 0:
        return 0.0, 0.0
    slope = (s.sxy - s.sx * s.sy / s.n) / sxx
    ssr = (s.syy - s.sy * s.sy / s.n) - slope * slope * sxx
    if ssr <= 0:
        return slope, math.inf if slope > 0 else -math.inf if slope < 0 else 0.0
    return slope, slope / math.sqrt(ssr / (s.n - 2) / sxx)


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
            x0 = st.x0 if st.x0 >= 0 else step
            snaps = st.snaps
            every = cfg.params.snap_every
            if not snaps or step // every > snaps[-1][0] // every:
                keep = cfg.params.min_reward_span // every + 2
                snaps = (*snaps, (step, st.cum))[-keep:]  # the sums before this step
            cum = st.cum.add(step - x0, r)
            return record(HackingState, (cum, x0, st.points, snaps, *st[4:])), NO_ALERTS
        score = ev.score  # type: ignore[attr-defined]
        if not isfinite(score):
            return st, NO_ALERTS
        return self._judge(ev, cfg, st, step, score)

    def _judge(
        self, ev: EventBase, cfg: Settings[Params], st: HackingState, step: int, e: float
    ) -> tuple[HackingState, Sequence[AlertEvent]]:
        p = cfg.params
        n_items = ev.n_items or st.n_items  # type: ignore[attr-defined]
        sigma = self._sigma(p, st.d2, e, n_items)
        z = p.z_eval if len(st.d2) >= p.min_noise_points else p.z_eval_prior
        found = None
        points = st.points
        for idx in range(len(points) - 1, -1, -1):
            s_i, e_i, cum_i = points[idx]
            if step - s_i < p.min_span:
                continue
            if idx > 1:  # one high outlier is no reference: at most 2 sigma above both before
                e_i = min(e_i, max(points[idx - 1][1], points[idx - 2][1]) + 2.0 * sigma)
            if e_i - e <= z * sigma * math.sqrt(2.0):
                continue
            base = cum_i
            if step - s_i < p.min_reward_span:  # widen to the last min_reward_span steps
                base = next((c for s, c in reversed(st.snaps) if s <= step - p.min_reward_span),
                            st.snaps[0][1] if st.snaps else cum_i)  # fmt: skip
            span = _sub(st.cum, base)
            if span.n < p.min_reward_points:
                continue
            slope, t = _slope_t(span)
            if slope > p.tau and t > p.z_reward:
                found = (s_i, e_i, slope, t, span.n)
                break
        d2, points = st.d2, st.points
        if not points or step - points[-1][0] >= p.min_span:  # references: min_span apart
            if len(points) >= 2:
                d2 = (*d2, abs(e - 2 * points[-1][1] + points[-2][1]))[-p.noise_points :]
            points = (*points, (step, e, st.cum))[-(p.refs + 1) :]
        st = st._replace(points=points, d2=d2, n_items=n_items)
        out: list[AlertEvent] = []
        if found is not None:
            if st.episode is None:
                alert = self._fire(ev, cfg, step, e, sigma, found)
                out.append(alert)
                return st._replace(episode=alert.alert_id, calm=0, fell_from=found[1]), out
            return st._replace(calm=0), NO_ALERTS
        if st.episode is None:
            return st, NO_ALERTS
        # open episode: calm once the eval is back within its noise of where it fell from
        below = st.fell_from - e > z * sigma * math.sqrt(2.0)
        calm = 0 if below else st.calm + 1
        if calm < p.resolve_evals:
            return st._replace(calm=calm), NO_ALERTS
        why = (
            f"the held-out eval is back to {e:.4g} (it fell from {st.fell_from:.4g}) for "
            f"{calm} eval points"
        )
        out.append(resolve(ev, cfg, st.episode, why))
        return st._replace(episode=None, calm=0), out

    @staticmethod
    def _sigma(p: Params, d2: tuple[float, ...], e: float, n_items: int) -> float:
        m = len(d2)
        if m >= p.min_noise_points:
            rms = math.sqrt(sum(x * x for x in d2) / m / 6.0)  # var(d2) = 6 sigma^2
            sigma = rms * (1.0 + p.noise_ucb / math.sqrt(m))
        elif n_items > 0 and 0.0 <= e <= 1.0:
            sigma = math.sqrt(max(e * (1.0 - e), 1.0 / n_items) / n_items)
        else:
            sigma = p.noise_floor_abs
        return max(sigma, p.noise_floor_abs + p.noise_floor_rel * abs(e))

    def _fire(
        self,
        ev: EventBase,
        cfg: Settings[Params],
        step: int,
        e: float,
        sigma: float,
        found: tuple[int, float, float, float, int],
    ) -> AlertEvent:
        p = cfg.params
        s_i, e_i, slope, t, n = found
        observed: dict[str, Any] = {
            "eval_from": e_i,
            "eval_to": e,
            "eval_noise": sigma,
            "reward_slope": slope,
            "reward_slope_t": t,
            "reward_points": n,
        }
        return fire(
            ev,
            cfg,
            first_step=s_i,
            window=(s_i, step),
            observed=observed,
            thresholds={"z_eval": p.z_eval, "z_reward": p.z_reward, "tau": p.tau},
            reason=(
                f"held-out eval fell {e_i:.4g} -> {e:.4g} between steps {s_i} and {step} "
                f"({(e_i - e) / sigma:.1f} noise units of {sigma:.3g}) while the training "
                f"reward rose {slope:.4g}/step over the same steps: the policy is optimizing "
                "something the eval refutes"
            ),
        )


DETECTOR = RewardHacking()

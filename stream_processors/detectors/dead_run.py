"""Dead run: reward and KL flat within noise for M windows while GPU spend accrues.

Windows are aligned blocks ``[w·W, (w+1)·W)`` of steps, closed at their last step or the
first step past them. A window is *flat* when the reward's standard deviation and its
least-squares change over the window (|slope|·W) are both within
``reward_flat_abs + reward_flat_rel·|mean|``, and the same holds for KL with its own
tolerances (a run that reports no KL is judged on reward alone). ``windows`` flat windows
in a row fire, provided money is being spent: GPU-seconds from ``UsageRecorded`` grew
during the stretch, or no usage was ever reported (committed steps are assumed to cost).

The alert states the money burned so far, priced at ``usd_per_gpu_hour_*`` (an
estimate for the alert text; tenant accounting owns the bill). A non-flat window resolves.
Lag: ``windows x window`` steps after the signal dies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import isfinite
from typing import ClassVar, NamedTuple

from events.envelope import EventBase
from stream_processors.detectors.base import (
    EMPTY_SUMS,
    NO_ALERTS,
    AlertEvent,
    RunContext,
    Settings,
    Sums,
    alert_id,
    fire,
    record,
    resolve,
    state_type,
)


@dataclass(frozen=True, slots=True)
class Params:
    window: int = 25
    windows: int = 4
    min_points: int = 10
    reward_flat_abs: float = 1e-3
    reward_flat_rel: float = 0.01
    kl_flat_abs: float = 1e-3
    kl_flat_rel: float = 0.05
    usd_per_gpu_hour_trainer: float = 2.5
    usd_per_gpu_hour_rollout: float = 2.5


@state_type
class DeadRunState(NamedTuple):
    win: int = -1
    reward: Sums = EMPTY_SUMS
    kl: Sums = EMPTY_SUMS
    flat: int = 0
    streak_start: int = 0
    gpu_s_trainer: float = 0.0
    gpu_s_rollout: float = 0.0
    usage_seen: bool = False
    gpu_s_at_streak: float = 0.0
    episode: str | None = None


def _flat(s: Sums, window: int, abs_tol: float, rel_tol: float) -> bool:
    tol = abs_tol + rel_tol * abs(s.mean)
    return s.std <= tol and abs(s.slope) * window <= tol


class DeadRun:
    name: ClassVar[str] = "dead_run"
    layer: ClassVar = "algorithmic"
    default_routing: ClassVar = "page"
    first_response: ClassVar[str] = (
        "check reward-function output distribution and LR; this is budget burning with "
        "no learning signal"
    )
    Params: ClassVar[type] = Params
    handles: ClassVar[frozenset[str]] = frozenset({"TrainerStepCompleted", "UsageRecorded"})

    def initial(self) -> DeadRunState:
        return DeadRunState()

    def apply(
        self, st: DeadRunState, ev: EventBase, cfg: Settings[Params], ctx: RunContext
    ) -> tuple[DeadRunState, Sequence[AlertEvent]]:
        if ev.type == "UsageRecorded":
            gpu = ev.device_seconds  # type: ignore[attr-defined]  (every device kind)
            if gpu != gpu or gpu in (float("inf"), float("-inf")):
                return st, NO_ALERTS
            if ev.pool == "trainer":  # type: ignore[attr-defined]
                return st._replace(gpu_s_trainer=st.gpu_s_trainer + gpu, usage_seen=True), ()
            return st._replace(gpu_s_rollout=st.gpu_s_rollout + gpu, usage_seen=True), ()
        p = cfg.params
        step: int = ev.step  # type: ignore[assignment]  (the composite drops step-less)
        r, k = ev.reward_mean, ev.kl_to_ref  # type: ignore[attr-defined]
        out: list[AlertEvent] = []
        w = step // p.window
        if w != st.win:
            st = self._close(ev, cfg, st, out)._replace(win=w, reward=EMPTY_SUMS, kl=EMPTY_SUMS)
        reward, kl = st.reward, st.kl
        if r is not None and isfinite(r):
            reward = reward.add(step, r)
        if k is not None and isfinite(k):
            kl = kl.add(step, k)
        st = record(DeadRunState, (st.win, reward, kl, *st[3:]))
        if step % p.window == p.window - 1:
            st = self._close(ev, cfg, st, out)._replace(win=w + 1, reward=EMPTY_SUMS, kl=EMPTY_SUMS)
        return st, out

    def _close(
        self, ev: EventBase, cfg: Settings[Params], st: DeadRunState, out: list[AlertEvent]
    ) -> DeadRunState:
        p = cfg.params
        if st.reward.n < p.min_points:
            return st
        flat = _flat(st.reward, p.window, p.reward_flat_abs, p.reward_flat_rel) and (
            st.kl.n == 0 or _flat(st.kl, p.window, p.kl_flat_abs, p.kl_flat_rel)
        )
        gpu_s = st.gpu_s_trainer + st.gpu_s_rollout
        if not flat:
            if st.episode is not None:
                why = f"reward moved again (std {st.reward.std:.3g}, slope {st.reward.slope:.3g})"
                out.append(resolve(ev, cfg, st.episode, why))
            return st._replace(flat=0, episode=None)
        start = st.streak_start if st.flat else st.win * p.window
        at_streak = st.gpu_s_at_streak if st.flat else gpu_s
        flat_n = st.flat + 1
        accruing = not st.usage_seen or gpu_s > at_streak or flat_n == 1
        if flat_n >= p.windows and accruing and st.episode is None:
            out.append(self._fire(ev, cfg, st, start, flat_n))
            episode = alert_id(ev.run_id, self.name, start)
            return st._replace(
                flat=flat_n, streak_start=start, gpu_s_at_streak=at_streak, episode=episode
            )
        return st._replace(flat=flat_n, streak_start=start, gpu_s_at_streak=at_streak)

    def _fire(
        self, ev: EventBase, cfg: Settings[Params], st: DeadRunState, start: int, flat_n: int
    ) -> AlertEvent:
        p = cfg.params
        gpu_s = st.gpu_s_trainer + st.gpu_s_rollout
        usd = (
            st.gpu_s_trainer * p.usd_per_gpu_hour_trainer
            + st.gpu_s_rollout * p.usd_per_gpu_hour_rollout
        ) / 3600.0
        gpu = f"{gpu_s / 3600:,.1f} GPU-hours" if gpu_s >= 3600 else f"{gpu_s:,.0f} GPU-s"
        spend = f"${usd:,.2f} burned so far ({gpu})" if st.usage_seen else (
            "spend unknown (no UsageRecorded for this run) while steps keep committing"
        )  # fmt: skip
        end = (st.win + 1) * p.window - 1
        kl_mean = st.kl.mean if st.kl.n else None
        kl_text = f", KL {kl_mean:.4g}" if kl_mean is not None else ""
        observed = {"reward_mean": st.reward.mean, "reward_std": st.reward.std, "kl_mean": kl_mean}
        observed |= {"flat_windows": flat_n, "gpu_hours": gpu_s / 3600.0}
        observed["spend_usd"] = usd if st.usage_seen else None
        thresholds = {"windows": p.windows, "reward_flat_abs": p.reward_flat_abs}
        thresholds["kl_flat_abs"] = p.kl_flat_abs
        reason = (
            f"reward {st.reward.mean:.4g}{kl_text} flat within noise for {flat_n} "
            f"windows (steps {start}-{end}): no learning signal; {spend}"
        )
        window = (start, end)
        return fire(ev, cfg, first_step=start, window=window, observed=observed,
                    thresholds=thresholds, reason=reason)  # fmt: skip


DETECTOR = DeadRun()

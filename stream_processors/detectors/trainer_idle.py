"""Trainer idle fraction (run mechanics): the trainer waits on the fleet too much.

Judged every step against the step's own time: each ``StepPhaseTimed`` gives the share of
its wall time the trainer sat idle (``idle_s / wall_s``), and an exponentially weighted
mean of that share (gain ``alpha``, so about the last ``2/alpha`` steps) above ``cap``
fires once ``min_points`` timings have been seen. It resolves when the mean is back at or
below ``cap · resolve_ratio`` (hysteresis, so an idle share hovering at the cap does not
flap). Timings with no wall time are skipped. Lag: a jump from a healthy share to well
above the cap crosses it in a few steps (0.2 -> 0.85 of the step: 4 steps at alpha 0.25).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

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


@dataclass(frozen=True, slots=True)
class Params:
    alpha: float = 0.25
    cap: float = 0.6
    resolve_ratio: float = 0.8
    min_points: int = 5


@state_type
class IdleState(NamedTuple):
    n: int = 0
    share: float = 0.0
    #: the step the mean last crossed the cap from below (the episode's start)
    above_since: int = -1
    episode: str | None = None


class TrainerIdle:
    name: ClassVar[str] = "trainer_idle"
    layer: ClassVar = "run_mechanics"
    default_routing: ClassVar = "ticket"
    first_response: ClassVar[str] = (
        "platform: the trainer is starved; check rollout-fleet capacity, queue depth and "
        "preemptions (vLLM metrics), and reward-scoring latency"
    )
    Params: ClassVar[type] = Params
    handles: ClassVar[frozenset[str]] = frozenset({"StepPhaseTimed"})

    def initial(self) -> IdleState:
        return IdleState()

    def apply(
        self, st: IdleState, ev: EventBase, cfg: Settings[Params], ctx: RunContext
    ) -> tuple[IdleState, Sequence[AlertEvent]]:
        p = cfg.params
        step = ev.step or 0
        idle, wall = ev.idle_s, ev.wall_s  # type: ignore[attr-defined]
        if not (0.0 <= idle < float("inf") and 0.0 < wall < float("inf")):
            return st, NO_ALERTS  # the nan_metric detector reports it
        x = idle / wall if idle < wall else 1.0
        n = st.n + 1
        share = x if n == 1 else st.share + p.alpha * (x - st.share)
        above = share > p.cap
        since = (st.above_since if st.above_since >= 0 else step) if above else -1
        episode = st.episode
        if episode is None:
            if above and n >= p.min_points:
                alert = fire(
                    ev,
                    cfg,
                    first_step=since,
                    window=(since, step),
                    observed={"idle_share_ewma": share, "idle_share_step": x},
                    thresholds={"cap": p.cap, "alpha": p.alpha},
                    reason=(
                        f"trainer idle {share:.0%} of each step's wall-clock (weighted mean of "
                        f"the last steps; {x:.0%} at step {step}, cap {p.cap:.0%}): it is "
                        "waiting on rollouts or scoring"
                    ),
                )
                return record(IdleState, (n, share, since, alert.alert_id)), (alert,)
        elif share <= p.cap * p.resolve_ratio:
            why = f"trainer idle back to {share:.0%} of each step"
            return record(IdleState, (n, share, since, None)), (resolve(ev, cfg, episode, why),)
        return record(IdleState, (n, share, since, episode)), NO_ALERTS


DETECTOR = TrainerIdle()

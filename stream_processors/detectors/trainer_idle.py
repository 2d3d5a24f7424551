"""Trainer idle fraction (run mechanics): the trainer waits on the fleet too much.

Over aligned windows of ``window`` steps of ``StepPhaseTimed``: ``idle = Σ idle_s / Σ
wall_s``. A window closes at its last step or at the first timing past it; a window above
``cap`` fires, and a window at or below ``cap · resolve_ratio`` resolves (hysteresis, so
an idle fraction hovering at the cap does not flap). Windows with fewer than
``min_points`` timings or no wall time are skipped. Lag: one window.
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
    alert_id,
    fire,
    resolve,
    state_type,
)


@dataclass(frozen=True, slots=True)
class Params:
    window: int = 25
    cap: float = 0.6
    resolve_ratio: float = 0.8
    min_points: int = 5


@state_type
class IdleState(NamedTuple):
    win: int = -1
    n: int = 0
    idle_s: float = 0.0
    wall_s: float = 0.0
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
        if not (0.0 <= idle < float("inf") and 0.0 <= wall < float("inf")):
            return st, NO_ALERTS  # the nan_metric detector reports it
        out: list[AlertEvent] = []
        w = step // p.window
        if w != st.win:
            st = self._close(ev, cfg, st, out)._replace(win=w)
        st = st._replace(n=st.n + 1, idle_s=st.idle_s + idle, wall_s=st.wall_s + wall)
        if step % p.window == p.window - 1:
            st = self._close(ev, cfg, st, out)._replace(win=w + 1)
        return st, out

    def _close(
        self, ev: EventBase, cfg: Settings[Params], st: IdleState, out: list[AlertEvent]
    ) -> IdleState:
        p = cfg.params
        empty = st._replace(n=0, idle_s=0.0, wall_s=0.0)
        if st.n < p.min_points or st.wall_s <= 0.0:
            return empty
        frac = st.idle_s / st.wall_s
        start, end = st.win * p.window, (st.win + 1) * p.window - 1
        if frac > p.cap and st.episode is None:
            out.append(
                fire(
                    ev,
                    cfg,
                    first_step=start,
                    window=(start, end),
                    observed={"idle_fraction": frac, "idle_s": st.idle_s, "wall_s": st.wall_s},
                    thresholds={"cap": p.cap},
                    reason=(
                        f"trainer idle {frac:.0%} of wall-clock over steps {start}-{end} "
                        f"(cap {p.cap:.0%}): it is waiting on rollouts or scoring"
                    ),
                )
            )
            return empty._replace(episode=alert_id(ev.run_id, self.name, start))
        if st.episode is not None and frac <= p.cap * p.resolve_ratio:
            out.append(resolve(ev, cfg, st.episode, f"trainer idle back to {frac:.0%}"))
            return empty._replace(episode=None)
        return empty


DETECTOR = TrainerIdle()

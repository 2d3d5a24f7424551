"""Weight-sync staleness (run mechanics): the rollout fleet's policy version lags the
trainer's by more than N versions, or the lag keeps growing.

The fleet's version is the highest ``policy_version`` seen on ``WeightSyncCompleted`` or
``RolloutBatchCompleted``; the trainer's version is its last committed step. Each
``TrainerStepCompleted`` measures ``lag = step - fleet_version`` (only once the fleet has
reported a version: runs without rollout telemetry are never judged).

- ``consecutive`` steps with ``lag > max_lag`` fire;
- over an aligned window of ``window`` steps, a lag that grew by ``growth`` or more fires
  (a slow leak under a generous ``max_lag``).

Resolves once the lag is back within ``max_lag`` for ``consecutive`` steps. A frozen
sync grows the lag by one per step, so it fires ``max_lag + consecutive`` steps after the
last good sync. This is a platform signal: it never raises an algorithmic alert.
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
    max_lag: int = 4
    consecutive: int = 2
    window: int = 25
    growth: int = 12


@state_type
class StalenessState(NamedTuple):
    fleet_version: int = -1
    over: int = 0
    over_start: int = 0
    win: int = -1
    lag_at_win_start: int = 0
    episode: str | None = None
    ok_steps: int = 0


class WeightSyncStaleness:
    name: ClassVar[str] = "weight_sync_staleness"
    layer: ClassVar = "run_mechanics"
    default_routing: ClassVar = "ticket"
    first_response: ClassVar[str] = (
        "platform: check the weight-sync path (NCCL/RDMA, the sync worker); the rollout "
        "fleet is generating with a stale policy. Not an algorithmic fault."
    )
    Params: ClassVar[type] = Params
    handles: ClassVar[frozenset[str]] = frozenset(
        {"WeightSyncCompleted", "RolloutBatchCompleted", "TrainerStepCompleted"}
    )

    def initial(self) -> StalenessState:
        return StalenessState()

    def apply(
        self, st: StalenessState, ev: EventBase, cfg: Settings[Params], ctx: RunContext
    ) -> tuple[StalenessState, Sequence[AlertEvent]]:
        if ev.type != "TrainerStepCompleted":
            version = ev.policy_version  # type: ignore[attr-defined]
            if version > st.fleet_version:
                return st._replace(fleet_version=version), NO_ALERTS
            return st, NO_ALERTS
        if st.fleet_version < 0:
            return st, NO_ALERTS
        p = cfg.params
        step = ev.step or 0
        lag = step - st.fleet_version
        over = st.over + 1 if lag > p.max_lag else 0
        over_start = st.over_start if st.over and over else step
        w = step // p.window
        win, at_start = (st.win, st.lag_at_win_start) if w == st.win else (w, lag)
        grown = lag - at_start
        episode, ok_steps = st.episode, st.ok_steps
        out: tuple[AlertEvent, ...] = NO_ALERTS
        if episode is None and (over >= p.consecutive or grown >= p.growth):
            first = over_start if over >= p.consecutive else w * p.window
            out = (
                fire(
                    ev,
                    cfg,
                    first_step=first,
                    window=(first, step),
                    observed={
                        "lag_versions": lag,
                        "trainer_version": step,
                        "fleet_version": st.fleet_version,
                        "lag_growth_in_window": grown,
                    },
                    thresholds={"max_lag": p.max_lag, "growth_per_window": p.growth},
                    reason=(
                        f"rollout fleet serves policy version {st.fleet_version} while the "
                        f"trainer is at {step}: {lag} versions behind (max {p.max_lag}"
                        f"{f', grew by {grown} this window' if grown >= p.growth else ''})"
                    ),
                ),
            )
            episode, ok_steps = alert_id(ev.run_id, self.name, first), 0
        elif episode is not None:
            ok_steps = ok_steps + 1 if lag <= p.max_lag else 0
            if ok_steps >= p.consecutive:
                out = (resolve(ev, cfg, episode, f"fleet caught up: lag {lag} versions"),)
                episode, ok_steps = None, 0
        return StalenessState(
            st.fleet_version, over, over_start, win, at_start, episode, ok_steps
        ), out


DETECTOR = WeightSyncStaleness()

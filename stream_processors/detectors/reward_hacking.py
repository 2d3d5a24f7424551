"""Reward-hacking signature: training reward rising while the held-out eval falls.

The seed's executed detector (``hacking_windows``) as a fold. Windows are aligned blocks
``[w·W, (w+1)·W)`` of steps. Training-reward points come from ``TrainerStepCompleted``,
eval points from ``EvalGateScored`` (x = the step either reports). A window is judged
when it is complete: when any of those events reports a step past it, or when both
streams have reported its last step. It is true when ``slope(reward) > +tau`` and
``slope(eval) < -tau`` (least squares, per step). Eval arriving for an already judged
window is late and ignored.

Missing eval: a window with fewer than ``min_eval_points`` eval scores (or fewer than
``min_reward_points`` rewards) is *blind*: it neither fires nor resolves; the
``eval_gate_missing`` detector reports the gap. The alert fires on the first true window
and stays open while later windows are true or blind (``true_windows`` keeps their starts);
it resolves after ``resolve_windows`` judged windows that are not true.

Lag: one window (the seed: hacking starts at 150, window [150, 200) fires at step 199).
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
    window: int = 50
    tau: float = 0.002
    min_reward_points: int = 10
    min_eval_points: int = 3
    resolve_windows: int = 1


@state_type
class HackingState(NamedTuple):
    win: int = -1
    reward: Sums = EMPTY_SUMS
    evals: Sums = EMPTY_SUMS
    reward_step: int = -1
    eval_step: int = -1
    true_windows: tuple[int, ...] = ()
    episode: str | None = None
    calm: int = 0


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
        is_eval = ev.type == "EvalGateScored"
        y = ev.score if is_eval else ev.reward_mean  # type: ignore[attr-defined]
        p = cfg.params
        step = ev.step or 0
        w = step // p.window
        if w < st.win:
            return st, NO_ALERTS  # late for a judged window
        out: list[AlertEvent] = []
        if w > st.win:
            st = self._judge(ev, cfg, st, out)._replace(win=w, reward=EMPTY_SUMS, evals=EMPTY_SUMS)
        if y is not None and isfinite(y):
            win, reward, evals, reward_step, eval_step, *rest = st
            if is_eval:
                st = record(
                    HackingState, (win, reward, evals.add(step, y), reward_step, step, *rest)
                )
            else:
                st = record(HackingState, (win, reward.add(step, y), evals, step, eval_step, *rest))
        last = (w + 1) * p.window - 1
        if step == last and st.reward_step == last and st.eval_step == last:
            st = self._judge(ev, cfg, st, out)._replace(
                win=w + 1, reward=EMPTY_SUMS, evals=EMPTY_SUMS
            )
        return st, out

    def _judge(
        self, ev: EventBase, cfg: Settings[Params], st: HackingState, out: list[AlertEvent]
    ) -> HackingState:
        p = cfg.params
        if st.win < 0 or st.reward.n < p.min_reward_points or st.evals.n < p.min_eval_points:
            return st  # blind window
        start, end = st.win * p.window, (st.win + 1) * p.window - 1
        r_slope, e_slope = st.reward.slope, st.evals.slope
        if r_slope > p.tau and e_slope < -p.tau:
            true_windows = (*st.true_windows, start)[-32:]
            if st.episode is None:
                out.append(
                    fire(
                        ev,
                        cfg,
                        first_step=start,
                        window=(start, end),
                        observed={
                            "reward_slope": r_slope,
                            "eval_slope": e_slope,
                            "reward_points": st.reward.n,
                            "eval_points": st.evals.n,
                        },
                        thresholds={"tau": p.tau, "window": p.window},
                        reason=(
                            f"training reward rose {r_slope:.4g}/step while the held-out eval "
                            f"fell {-e_slope:.4g}/step over steps {start}-{end} (tau {p.tau:g}):"
                            f" the policy is optimizing something the eval refutes"
                        ),
                    )
                )
                return st._replace(
                    true_windows=true_windows,
                    episode=alert_id(ev.run_id, self.name, start),
                    calm=0,
                )
            return st._replace(true_windows=true_windows, calm=0)
        if st.episode is not None:
            if st.calm + 1 >= p.resolve_windows:
                out.append(
                    resolve(
                        ev,
                        cfg,
                        st.episode,
                        f"reward and eval no longer diverge over steps {start}-{end} "
                        f"(reward {r_slope:.4g}/step, eval {e_slope:.4g}/step)",
                    )
                )
                return st._replace(episode=None, calm=0, true_windows=())
            return st._replace(calm=st.calm + 1)
        return st


DETECTOR = RewardHacking()

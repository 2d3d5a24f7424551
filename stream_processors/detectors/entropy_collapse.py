"""Entropy collapse: the EWMA of policy entropy falls faster than a rate for k windows.

The seed's executed detector (``entropy_collapse_step``) as a fold. Per finite
``entropy`` value: ``ewma = alpha·x + (1-alpha)·ewma``. Windows are aligned blocks
``[w·W, (w+1)·W)`` of steps; a window closes at its last step (or the first step past
it) with ``rate = (ewma_last - ewma_first) / steps_spanned``. The first window the run
reports is the EWMA's warm-up and is never judged (the seed starts at ``s = window``).
``k`` consecutive windows with ``rate < -min(drop, drop_rel·ewma_first)`` fire at the end
of the k-th (the relative floor keeps a collapse that starts from a low entropy level
visible; at the seed's level 2.0 both bounds are 0.004); a window with
fewer than ``min_points`` values breaks the streak. Resolves after ``resolve_windows``
windows that are not falling.

Lag: at least ``k`` windows after the collapse starts (the seed: injected at 150,
flagged at 224 with W=25, k=3). Time: steps only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
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
    record,
    resolve,
    state_type,
)


@dataclass(frozen=True, slots=True)
class Params:
    alpha: float = 0.2
    drop: float = 0.004
    drop_rel: float = 0.002
    k: int = 3
    window: int = 25
    min_points: int = 10
    resolve_windows: int = 3


@state_type
class EntropyState(NamedTuple):
    ewma: float | None = None
    warmup_win: int = -1
    win: int = -1
    first_step: int = 0
    e_first: float = 0.0
    last_step: int = 0
    e_last: float = 0.0
    n: int = 0
    falling: int = 0
    streak_start: int = 0
    episode: str | None = None
    calm: int = 0


class EntropyCollapse:
    name: ClassVar[str] = "entropy_collapse"
    layer: ClassVar = "algorithmic"
    default_routing: ClassVar = "ticket"
    first_response: ClassVar[str] = (
        "clip-higher or KL term per GRPO variants; mode collapse in progress"
    )
    Params: ClassVar[type] = Params
    handles: ClassVar[frozenset[str]] = frozenset({"TrainerStepCompleted"})

    def initial(self) -> EntropyState:
        return EntropyState()

    def apply(
        self, st: EntropyState, ev: EventBase, cfg: Settings[Params], ctx: RunContext
    ) -> tuple[EntropyState, Sequence[AlertEvent]]:
        x = ev.entropy
        if x is None or not isfinite(x):
            return st, NO_ALERTS
        p = cfg.params
        step: int = ev.step  # type: ignore[assignment]  (the composite drops step-less)
        out: list[AlertEvent] = []
        ewma = x if st.ewma is None else p.alpha * x + (1 - p.alpha) * st.ewma
        w = step // p.window
        warmup = st.warmup_win if st.warmup_win >= 0 else w
        if w != st.win:
            st = self._close(ev, cfg, st, out)._replace(win=w, n=0)
        first_step, e_first = (step, ewma) if st.n == 0 else (st.first_step, st.e_first)
        st = record(EntropyState, (
            ewma, warmup, w, first_step, e_first, step, ewma, st.n + 1,
            st.falling, st.streak_start, st.episode, st.calm,
        ))  # fmt: skip
        if step % p.window == p.window - 1:
            st = self._close(ev, cfg, st, out)._replace(win=w + 1, n=0)
        return st, out

    def _close(
        self, ev: EventBase, cfg: Settings[Params], st: EntropyState, out: list[AlertEvent]
    ) -> EntropyState:
        p = cfg.params
        if st.n == 0 or st.win == st.warmup_win:
            return st
        if st.n < p.min_points:
            return st._replace(falling=0)
        rate = (st.e_last - st.e_first) / (st.last_step - st.first_step + 1)
        drop = min(p.drop, p.drop_rel * abs(st.e_first)) if p.drop_rel > 0 else p.drop
        if rate < -drop:
            falling = st.falling + 1
            start = st.streak_start if st.falling else st.first_step
            if falling >= p.k and st.episode is None:
                out.append(
                    fire(
                        ev,
                        cfg,
                        first_step=start,
                        window=(start, st.last_step),
                        observed={"ewma_rate_per_step": rate, "entropy_ewma": st.e_last},
                        thresholds={"drop_per_step": drop, "k_windows": p.k},
                        reason=(
                            f"entropy EWMA fell {-rate:.4g}/step (faster than {drop:.3g}) for "
                            f"{falling} consecutive {p.window}-step windows since step {start}, "
                            f"now {st.e_last:.4g}"
                        ),
                    )
                )
                return st._replace(
                    falling=falling,
                    streak_start=start,
                    episode=alert_id(ev.run_id, self.name, start),
                    calm=0,
                )
            return st._replace(falling=falling, streak_start=start, calm=0)
        if st.episode is not None and st.calm + 1 >= p.resolve_windows:
            out.append(
                resolve(
                    ev,
                    cfg,
                    st.episode,
                    f"entropy EWMA stopped falling ({rate:.4g}/step) for {st.calm + 1} windows",
                )
            )
            return st._replace(falling=0, episode=None, calm=0)
        return st._replace(falling=0, calm=st.calm + 1 if st.episode else 0)


DETECTOR = EntropyCollapse()

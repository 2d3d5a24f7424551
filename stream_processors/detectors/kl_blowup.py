"""KL blowup: KL to the reference above a per-algorithm ceiling, or rising too fast.

Two rules over finite ``kl_to_ref`` values (per-token KL to the frozen reference):

- ceiling: ``consecutive`` steps in a row above ``ceiling`` (set per algorithm in the
  catalog) fire at once;
- slope: windows are aligned blocks of ``window`` steps (``[w·W, (w+1)·W)``); a window
  closes at its last step or at the first step past it, and fires when its least-squares
  rise (slope x ``window``) exceeds ``rise_cap``.

Resolves when a closed window's rise is within the cap and its maximum is below
``ceiling · resolve_ratio``. Lag: ceiling ``consecutive`` steps; slope at most one window.
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
    ceiling: float = 0.5
    consecutive: int = 2
    window: int = 50
    rise_cap: float = 0.2
    min_points: int = 10
    resolve_ratio: float = 0.8


@state_type
class KlState(NamedTuple):
    above: int = 0
    above_start: int = 0
    win: int = -1
    sums: Sums = EMPTY_SUMS
    win_max: float = float("-inf")
    episode: str | None = None


class KlBlowup:
    name: ClassVar[str] = "kl_blowup"
    layer: ClassVar = "algorithmic"
    default_routing: ClassVar = "page"
    first_response: ClassVar[str] = (
        "check LR and KL coefficient; the policy ran away from the reference (PPO)"
    )
    Params: ClassVar[type] = Params
    handles: ClassVar[frozenset[str]] = frozenset({"TrainerStepCompleted"})

    def initial(self) -> KlState:
        return KlState()

    def apply(
        self, st: KlState, ev: EventBase, cfg: Settings[Params], ctx: RunContext
    ) -> tuple[KlState, Sequence[AlertEvent]]:
        kl = ev.kl_to_ref
        if kl is None or not isfinite(kl):
            return st, NO_ALERTS
        p = cfg.params
        step: int = ev.step  # type: ignore[assignment]  (the composite drops step-less)
        above, above_start, win, sums, win_max, episode = st
        out: list[AlertEvent] = []
        window = p.window
        w = step // window
        if w != win:
            if sums.n >= p.min_points:  # (a window with fewer points closes silently)
                episode = self._close(ev, cfg, win, sums, win_max, episode, out)
            win, sums, win_max = w, EMPTY_SUMS, float("-inf")
        n, sx, sy, sxx, sxy, syy, _ = sums  # Sums.add, inlined (hot path)
        sums = record(
            Sums, (n + 1, sx + step, sy + kl, sxx + step * step, sxy + step * kl, syy + kl * kl, kl)
        )
        if kl > win_max:
            win_max = kl
        was_above = above
        above = above + 1 if kl > p.ceiling else 0
        if not (was_above and above):
            above_start = step
        if above >= p.consecutive and episode is None:
            out.append(
                fire(
                    ev,
                    cfg,
                    first_step=above_start,
                    window=(above_start, step),
                    observed={"kl_to_ref": kl, "steps_above": above},
                    thresholds={"ceiling": p.ceiling, "algorithm": ctx.algorithm},
                    reason=(
                        f"KL to the reference {kl:.4g} above the {ctx.algorithm} ceiling "
                        f"{p.ceiling:g} for {above} consecutive steps"
                    ),
                )
            )
            episode = alert_id(ev.run_id, self.name, above_start)
        if step % window == window - 1:
            episode = self._close(ev, cfg, win, sums, win_max, episode, out)
            win, sums, win_max = w + 1, EMPTY_SUMS, float("-inf")
        return record(KlState, (above, above_start, win, sums, win_max, episode)), out

    def _close(
        self,
        ev: EventBase,
        cfg: Settings[Params],
        win: int,
        sums: Sums,
        win_max: float,
        episode: str | None,
        out: list[AlertEvent],
    ) -> str | None:
        p = cfg.params
        if sums.n < p.min_points:
            return episode
        rise = sums.slope * p.window
        start, end = win * p.window, (win + 1) * p.window - 1
        if rise > p.rise_cap and episode is None:
            out.append(
                fire(
                    ev,
                    cfg,
                    first_step=start,
                    window=(start, end),
                    observed={"kl_rise_per_window": rise, "kl_last": sums.last},
                    thresholds={"rise_cap": p.rise_cap, "window": p.window},
                    reason=(
                        f"KL to the reference rose {rise:.4g} over steps {start}-{end} "
                        f"(cap {p.rise_cap:g} per {p.window}-step window)"
                    ),
                )
            )
            return alert_id(ev.run_id, self.name, start)
        if episode is not None and rise <= p.rise_cap and win_max <= p.ceiling * p.resolve_ratio:
            out.append(
                resolve(
                    ev,
                    cfg,
                    episode,
                    f"KL back under control over steps {start}-{end} (max {win_max:.4g})",
                )
            )
            return None
        return episode


DETECTOR = KlBlowup()

"""KL blowup: KL to the reference above a per-algorithm ceiling, or rising too fast.

Two rules over finite ``kl_to_ref`` values (per-token KL to the frozen reference):

- ceiling: rows in a row above ``ceiling`` (set per algorithm in the catalog) covering
  ``consecutive`` steps fire at once (a row stands for the steps since the row before it:
  every step logged, ``consecutive`` rows; a row every 10 steps, one row; never fewer than
  ``ceiling_rows`` rows);
- slope: windows are aligned blocks of ``window`` steps (``[w·W, (w+1)·W)``); a window
  closes at its last step or at the first step past it, and fires when its least-squares
  rise (slope x ``window``) exceeds ``rise_cap``; it is judged when its rows span
  ``min_points`` steps (first to last) and number at least ``min_rows`` (counted in rows,
  a history logged every 10 steps never had the 10 points a window needed).

Resolves when a closed window's rise is within the cap and its maximum is below
``ceiling · resolve_ratio``. Lag: ceiling ``consecutive`` steps; slope at most one window.
"""

from __future__ import annotations

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
    alert_id,
    fire,
    record,
    resolve,
    state_type,
)


@dataclass(frozen=True, slots=True)
class Params:
    ceiling: float = 0.5
    #: steps above the ceiling (not logged rows: TRL logs every 10 steps by default); a
    #: row stands for the steps since the row before it
    consecutive: int = 2
    #: ... and never fewer rows than this above it
    ceiling_rows: int = 1
    window: int = 50
    rise_cap: float = 0.2
    #: steps a window's rows must span (first to last) to be judged ...
    min_points: int = 10
    #: ... and never fewer rows than this (every step logged: ``min_points`` rows)
    min_rows: int = 4
    resolve_ratio: float = 0.8


@state_type
class KlState(NamedTuple):
    above: int = 0
    above_start: int = 0
    win: int = -1
    sums: Sums = EMPTY_SUMS
    win_max: float = float("-inf")
    episode: str | None = None
    #: the step of the row before the run above the ceiling began (the run covers the
    #: steps after it), the window's first row's step, the previous row's step (-1: none)
    above_from: int = 0
    first: int = 0
    last: int = -1

    @classmethod
    def from_stale(cls, fields: tuple[Any, ...]) -> KlState:
        """A state stored by the rule that counted rows (6 fields, its open episode
        last) starts afresh keeping that episode, so it resolves instead of paging twice."""
        if len(fields) == 6 and (fields[5] is None or isinstance(fields[5], str)):
            return cls(episode=fields[5])
        return cls()


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
        above, above_start, win, sums, win_max, episode, above_from, first, last = st
        out: list[AlertEvent] = []
        window = p.window
        w = step // window
        if w != win:
            if sums.n:  # (a window with too few points closes silently)
                episode = self._close(ev, cfg, win, sums, win_max, episode, out, first, last)
            win, sums, win_max = w, EMPTY_SUMS, float("-inf")
        if not sums.n:
            first = step
        n, sx, sy, sxx, sxy, syy, _ = sums  # Sums.add, inlined (hot path)
        sums = record(
            Sums, (n + 1, sx + step, sy + kl, sxx + step * step, sxy + step * kl, syy + kl * kl, kl)
        )
        if kl > win_max:
            win_max = kl
        was_above = above
        above = above + 1 if kl > p.ceiling else 0
        if not (was_above and above):
            above_start, above_from = step, (last if 0 <= last < step else step - 1)
        if (
            above
            and above >= min(p.ceiling_rows, p.consecutive)
            and step - above_from >= p.consecutive
            and episode is None
        ):
            out.append(
                fire(
                    ev,
                    cfg,
                    first_step=above_start,
                    window=(above_start, step),
                    observed={"kl_to_ref": kl, "steps_above": step - above_from},
                    thresholds={"ceiling": p.ceiling, "algorithm": ctx.algorithm},
                    reason=(
                        f"KL to the reference {kl:.4g} above the {ctx.algorithm} ceiling "
                        f"{p.ceiling:g} for {step - above_from} consecutive steps"
                        + (f" ({above} logged rows)" if above != step - above_from else "")
                    ),
                )
            )
            episode = alert_id(ev.run_id, self.name, above_start)
        if step % window == window - 1:
            episode = self._close(ev, cfg, win, sums, win_max, episode, out, first, step)
            win, sums, win_max = w + 1, EMPTY_SUMS, float("-inf")
        return record(
            KlState, (above, above_start, win, sums, win_max, episode, above_from, first, step)
        ), out

    def _close(
        self,
        ev: EventBase,
        cfg: Settings[Params],
        win: int,
        sums: Sums,
        win_max: float,
        episode: str | None,
        out: list[AlertEvent],
        first: int,
        last: int,
    ) -> str | None:
        """Judge a closed window: rows spanning ``min_points`` steps, at least
        ``min_rows`` of them (every step logged: ``min_points`` rows, as it always was)."""
        p = cfg.params
        if sums.n < min(p.min_rows, p.min_points) or last - first + 1 < p.min_points:
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

"""Rollout-quality drift: generation length, truncation rate or unparseable-output rate
shifts materially between windows.

Windows are aligned blocks ``[w·W, (w+1)·W)`` of steps over ``RolloutBatchCompleted``
(their envelope ``step``). A window closes when the trainer commits its last step (a
step's rollouts precede its optimizer step) or when a batch or step past it arrives.
Its means are compared with the mean of the previous ``ref_windows`` closed windows:

- mean length: relative change above ``length_rel``;
- truncation rate / unparseable rate: absolute change above ``trunc_abs`` / ``unparse_abs``.

A shift fires (observed: every metric's reference and current value); a window without
a shift resolves. Each closed window then joins the reference, so a lasting level change
fires once. Windows with fewer than ``min_batches`` batches are skipped.

The open window is also judged as it fills: once it holds ``min_batches`` batches, every
batch compares the window's mean so far with the reference, so a shift fires a few
batches after it starts instead of when the window closes. Lag: ``min_batches`` steps for
a shift at a window's start; one window plus ``min_batches`` at worst (a shift late in a
window moves its mean only partly; the next window sees it whole).
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
    record,
    resolve,
    state_type,
)


@dataclass(frozen=True, slots=True)
class Params:
    window: int = 25
    ref_windows: int = 2
    min_batches: int = 5
    length_rel: float = 0.3
    trunc_abs: float = 0.1
    unparse_abs: float = 0.1


@state_type
class DriftState(NamedTuple):
    win: int = -1
    n: int = 0
    length: float = 0.0
    trunc: float = 0.0
    unparse: float = 0.0
    refs: tuple[tuple[float, float, float], ...] = ()
    episode: str | None = None
    #: the mean of ``refs`` once they are ``ref_windows`` (what the open window is judged
    #: against; kept so each batch compares three numbers)
    ref: tuple[float, float, float] | None = None


def _mean(refs: tuple[tuple[float, float, float], ...]) -> tuple[float, float, float]:
    n = len(refs)
    return (sum(r[0] for r in refs) / n, sum(r[1] for r in refs) / n, sum(r[2] for r in refs) / n)


def _ok(x: float) -> bool:
    return x == x and x not in (float("inf"), float("-inf"))


class RolloutDrift:
    name: ClassVar[str] = "rollout_drift"
    layer: ClassVar = "algorithmic"
    default_routing: ClassVar = "ticket"
    first_response: ClassVar[str] = (
        "check sampling params and stop tokens; drift here often precedes reward artifacts"
    )
    Params: ClassVar[type] = Params
    handles: ClassVar[frozenset[str]] = frozenset({"RolloutBatchCompleted", "TrainerStepCompleted"})

    def initial(self) -> DriftState:
        return DriftState()

    def apply(
        self, st: DriftState, ev: EventBase, cfg: Settings[Params], ctx: RunContext
    ) -> tuple[DriftState, Sequence[AlertEvent]]:
        p = cfg.params
        step = ev.step or 0
        w = step // p.window
        if ev.type == "TrainerStepCompleted":
            if st.n == 0 or w < st.win or (w == st.win and step % p.window != p.window - 1):
                return st, NO_ALERTS
            out: list[AlertEvent] = []
            return self._close(ev, cfg, st, out)._replace(win=w + 1 if w == st.win else w), out
        out = []
        if w != st.win:
            st = self._close(ev, cfg, st, out)._replace(win=w)
        length, trunc, unp = ev.mean_length, ev.truncation_rate, ev.unparseable_rate  # type: ignore[attr-defined]
        if not (_ok(length) and _ok(trunc) and _ok(unp)):
            return st, out  # the nan_metric detector reports it
        n = st.n + 1
        length, trunc, unp = st.length + length, st.trunc + trunc, st.unparse + unp
        st = record(DriftState, (st.win, n, length, trunc, unp, st.refs, st.episode, st.ref))
        ref = st.ref
        if st.episode is None and n >= p.min_batches and ref is not None:
            rl = ref[0]
            if (
                abs(length / n - rl) > p.length_rel * max(abs(rl), 1.0)
                or abs(trunc / n - ref[1]) > p.trunc_abs
                or abs(unp / n - ref[2]) > p.unparse_abs
            ):
                st = self._judge(ev, cfg, st, out, closing=False)
        return st, out

    def _close(
        self, ev: EventBase, cfg: Settings[Params], st: DriftState, out: list[AlertEvent]
    ) -> DriftState:
        p = cfg.params
        empty = st._replace(n=0, length=0.0, trunc=0.0, unparse=0.0)
        if st.n < p.min_batches:
            return empty
        cur = (st.length / st.n, st.trunc / st.n, st.unparse / st.n)
        refs = (*st.refs, cur)[-p.ref_windows :]
        ref = _mean(refs) if len(refs) >= p.ref_windows else None
        if st.ref is None:
            return empty._replace(refs=refs, ref=ref)
        judged = self._judge(ev, cfg, st, out, closing=True)
        return empty._replace(refs=refs, episode=judged.episode, ref=ref)

    def _judge(
        self,
        ev: EventBase,
        cfg: Settings[Params],
        st: DriftState,
        out: list[AlertEvent],
        *,
        closing: bool,
    ) -> DriftState:
        """Compare the (open or closing) window's means with the reference windows'."""
        p = cfg.params
        cur = (st.length / st.n, st.trunc / st.n, st.unparse / st.n)
        ref = st.ref if st.ref is not None else _mean(st.refs)
        shifted = []
        if abs(cur[0] - ref[0]) > p.length_rel * max(abs(ref[0]), 1.0):
            shifted.append(f"mean length {ref[0]:.4g} -> {cur[0]:.4g}")
        if abs(cur[1] - ref[1]) > p.trunc_abs:
            shifted.append(f"truncation rate {ref[1]:.3f} -> {cur[1]:.3f}")
        if abs(cur[2] - ref[2]) > p.unparse_abs:
            shifted.append(f"unparseable rate {ref[2]:.3f} -> {cur[2]:.3f}")
        start = st.win * p.window
        end = (st.win + 1) * p.window - 1 if closing else (ev.step or 0)
        episode = st.episode
        if shifted and episode is None:
            out.append(
                fire(
                    ev,
                    cfg,
                    first_step=start,
                    window=(start, end),
                    observed={
                        "mean_length": cur[0],
                        "truncation_rate": cur[1],
                        "unparseable_rate": cur[2],
                        "ref_mean_length": ref[0],
                        "ref_truncation_rate": ref[1],
                        "ref_unparseable_rate": ref[2],
                    },
                    thresholds={
                        "length_rel": p.length_rel,
                        "trunc_abs": p.trunc_abs,
                        "unparse_abs": p.unparse_abs,
                    },
                    reason=(
                        f"rollout quality shifted over steps {start}-{end} against the "
                        f"previous {len(st.refs)} windows: " + "; ".join(shifted)
                    ),
                )
            )
            episode = alert_id(ev.run_id, self.name, start)
        elif closing and not shifted and episode is not None:
            out.append(resolve(ev, cfg, episode, f"rollout quality stable over {start}-{end}"))
            episode = None
        return st._replace(episode=episode)


DETECTOR = RolloutDrift()

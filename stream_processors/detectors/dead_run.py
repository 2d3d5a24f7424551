"""Dead run: no learning signal while GPU spend accrues.

Two kinds of evidence, the fast one first:

- **No reward spread** (judged every step). Under group-baselined policy gradients (GRPO,
  RLOO, ...) a group whose completions all score the same has zero advantage: it carries
  no gradient. The fraction of such groups is TRL's ``frac_reward_zero_std`` (read from the
  step's ``extra``); where the producer does not report it, a step whose ``reward_std`` is
  0 (or whose advantages are all 0) has every group without spread, fraction 1. A reward
  mean that repeats *exactly* from step to step is the same fault seen by a producer that
  reports nothing else (batch means of a sampling policy never repeat bit for bit unless
  the reward does not depend on the completions). Rows in a row with the fraction at or
  above ``zero_std_frac`` covering ``zero_std_steps`` steps (from the first such row's step
  to the last; at least ``zero_std_rows`` rows), or identical reward means covering
  ``constant_steps`` steps (at least ``constant_rows`` rows: averaged rows of a binary
  reward repeat by chance more often than single steps), fire: a constant or saturated
  reward is called within those steps. Every step logged, that is ``zero_std_steps`` /
  ``constant_steps`` rows as it always was; a row every 10 steps (TRL's default), the
  second row without spread (counted in rows: the fifth, 40 steps later).
- **Flat within noise** (windows). Windows are aligned blocks ``[w·W, (w+1)·W)``; a
  window is *flat* when the reward's standard deviation and its least-squares change over
  the window (|slope|·W) are both within ``reward_flat_abs + reward_flat_rel·|mean|``, and
  the same holds for KL with its own tolerances (a run that reports no KL is judged on
  reward alone). ``windows`` flat windows in a row fire. Lag: ``windows x window`` steps.

Either fires only while money is being spent: device-seconds (GPU or CPU: ``UsageRecorded``
v3) grew during the stretch, or no usage was ever reported (committed steps are assumed to
cost). The alert states the money burned since the signal died and in the whole run,
priced per device kind and pool (``usd_per_gpu_second``: the composition root fills it
from the accounting price list, ``stream_processors/accounting/prices.yaml``;
``prices_version`` names it; without prices the alert states device-seconds only). An
episode resolves when its evidence ends: for the fast kind, ``resolve_steps`` steps in a
row with spread again; for the windowed kind, a window that is not flat.
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

#: ``extra`` keys that report the fraction of groups with zero reward spread (TRL).
ZERO_STD_KEYS = frozenset({"frac_reward_zero_std", "train/frac_reward_zero_std"})


@dataclass(frozen=True, slots=True)
class Params:
    window: int = 25
    windows: int = 4
    min_points: int = 10
    reward_flat_abs: float = 1e-3
    reward_flat_rel: float = 0.01
    kl_flat_abs: float = 1e-3
    kl_flat_rel: float = 0.05
    zero_std_frac: float = 0.98
    #: steps (not logged rows: TRL logs every 10 steps by default) the fast evidence must
    #: cover; a run of rows covers the steps from its first row to its last
    zero_std_steps: int = 5
    constant_steps: int = 8
    #: ... and never fewer rows than this (every step logged: the steps themselves)
    zero_std_rows: int = 2
    #: (averaged rows of a binary reward repeat by chance more often than rows of one step)
    constant_rows: int = 4
    #: a spread at or below this is no spread (and two reward means this close are equal,
    #: relative to max(1, |mean|))
    eps: float = 1e-9
    resolve_steps: int = 5
    #: ("<device kind>/<pool>" or a bare pool: GPU, USD per device-second) pairs: the
    #: accounting price list (the name is the catalog's key; it holds CPU prices too)
    usd_per_gpu_second: tuple[tuple[str, float], ...] = ()
    prices_version: str = ""


@state_type
class DeadRunState(NamedTuple):
    win: int = -1
    reward: Sums = EMPTY_SUMS
    kl: Sums = EMPTY_SUMS
    flat: int = 0
    streak_start: int = 0
    gpu_s: float = 0.0
    usd: float = 0.0
    usage_seen: bool = False
    gpu_s_at_streak: float = 0.0
    usd_at_streak: float = 0.0
    episode: str | None = None
    #: fast evidence: consecutive steps without reward spread, and of identical means
    zero_run: int = 0
    zero_start: int = 0
    const_run: int = 0
    const_start: int = 0
    last_reward: float | None = None
    #: spend (GPU-s, USD) when the fast evidence began
    gpu_s_at_zero: float = 0.0
    usd_at_zero: float = 0.0
    #: the open episode came from the fast evidence; steps with spread since
    fast: bool = False
    spread_again: int = 0
    #: spend (GPU-s, USD) when the current run of equal reward means began
    gpu_s_at_const: float = 0.0
    usd_at_const: float = 0.0


def _by_zero(p: Params, step: int, rows: int, start: int) -> bool:
    """Rows without reward spread covering ``zero_std_steps`` steps (and ``zero_std_rows``
    rows): every step logged, ``zero_std_steps`` rows as it always was."""
    return rows >= min(p.zero_std_rows, p.zero_std_steps) and step - start + 1 >= p.zero_std_steps


def _by_const(p: Params, step: int, rows: int, start: int) -> bool:
    """Equal reward means covering ``constant_steps`` steps (and ``constant_rows`` rows)."""
    return rows >= min(p.constant_rows, p.constant_steps) and step - start + 1 >= p.constant_steps


def _rows(steps: int, rows: int) -> str:
    """What the alert says of the rows when fewer rows than steps were logged."""
    return f" ({rows} logged rows)" if rows != steps else ""


def _flat(s: Sums, window: int, abs_tol: float, rel_tol: float) -> bool:
    tol = abs_tol + rel_tol * abs(s.mean)
    return s.std <= tol and abs(s.slope) * window <= tol


def zero_std_fraction(ev: Any, eps: float) -> float | None:
    """The step's fraction of groups without reward spread, if the step tells it."""
    for key, value in ev.extra:
        if key in ZERO_STD_KEYS and isinstance(value, int | float) and isfinite(value):
            return float(value)
    std = ev.reward_std
    if std is not None and isfinite(std):
        return 1.0 if std <= eps else None
    adv = ev.advantage_std
    if adv is not None and isfinite(adv) and adv <= eps:
        return 1.0
    return None


def _price(p: Params, where: str) -> float:
    """The price of ``"<device kind>/<pool>"``; a price list keyed by bare pool names (the
    older form) prices GPU time only."""
    bare = where.split("/", 1)[1] if where.startswith("gpu/") else None
    for name, usd in p.usd_per_gpu_second:
        if name == where:
            return usd
    for name, usd in p.usd_per_gpu_second:
        if name == bare:
            return usd
    return 0.0


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
        p = cfg.params
        if ev.type == "UsageRecorded":
            gpu = ev.device_seconds  # type: ignore[attr-defined]  (any device kind: the spend)
            if not isfinite(gpu):
                return st, NO_ALERTS
            where = f"{ev.device_kind}/{ev.pool}"  # type: ignore[attr-defined]
            usd = st.usd + gpu * _price(p, where) if p.usd_per_gpu_second else 0.0
            return st._replace(gpu_s=st.gpu_s + gpu, usd=usd, usage_seen=True), NO_ALERTS
        step: int = ev.step  # type: ignore[assignment]  (the composite drops step-less)
        r, k = ev.reward_mean, ev.kl_to_ref  # type: ignore[attr-defined]
        quiet = self._quiet(ev, p, st, step, r, k)
        if quiet is not None:
            return quiet, NO_ALERTS
        out: list[AlertEvent] = []
        st = self._fast(ev, cfg, st, step, r, out)
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

    @staticmethod
    def _evidence(ev: EventBase, p: Params, st: DeadRunState, step: int, r: float | None) -> tuple:
        """The step's fast evidence folded into the state's counters: ``(zero_run,
        zero_start, const_run, const_start, last, gpu0, usd0, gpu_c, usd_c, dead)``;
        ``gpu0``/``usd0`` is the spend when the evidence began (what the fault burned is
        the spend since), ``gpu_c``/``usd_c`` the spend when the current run of equal
        reward means began."""
        (_, _, _, _, _, gpu_s, usd, _, _, _, _, was_zero, zero_start, was_const, const_start,
         last, gpu0, usd0, _, _, gpu_c, usd_c) = st  # fmt: skip
        if ev.extra:  # type: ignore[attr-defined]
            frac = zero_std_fraction(ev, p.eps)
        else:  # inlined for the common step: no extra keys, a finite spread
            std = ev.reward_std  # type: ignore[attr-defined]
            frac = (1.0 if std <= p.eps else None) if std is not None and std == std else (
                zero_std_fraction(ev, p.eps)
            )  # fmt: skip
        if frac is not None and frac >= p.zero_std_frac:
            zero_run, zero_start = was_zero + 1, zero_start if was_zero else step
        else:
            zero_run = 0
        const_run = was_const
        if r is not None and isfinite(r):
            if last is not None and abs(r - last) <= p.eps * (abs(r) if abs(r) > 1.0 else 1.0):
                const_run += 1
            else:  # a new value: a run of equal means would start here
                const_run, const_start, gpu_c, usd_c = 1, step, gpu_s, usd
            last = r
        dead = zero_run > 0 or const_run > 1
        if dead and not (was_zero > 0 or was_const > 1):
            gpu0, usd0 = (gpu_c, usd_c) if const_run > 1 else (gpu_s, usd)
        return zero_run, zero_start, const_run, const_start, last, gpu0, usd0, gpu_c, usd_c, dead

    def _quiet(
        self,
        ev: EventBase,
        p: Params,
        st: DeadRunState,
        step: int,
        r: float | None,
        k: float | None,
    ) -> DeadRunState | None:
        """The common step (hot path): nothing to fire, resolve or close; one new record.
        ``None`` when the step needs the full treatment (:meth:`_fast`, :meth:`_close`)."""
        (win, reward, kl, flat, streak_start, gpu_s, usd, usage_seen, gpu_s_at_streak,
         usd_at_streak, episode, _, _, _, _, _, _, _, fast, spread_again, _, _) = st  # fmt: skip
        window = p.window
        if step // window != win or step % window == window - 1:
            return None
        found = self._evidence(ev, p, st, step, r)
        zero_run, zero_start, const_run, const_start, last, gpu0, usd0, gpu_c, usd_c, dead = found
        if episode is None:
            if (zero_run and _by_zero(p, step, zero_run, zero_start)) or (
                const_run > 1 and _by_const(p, step, const_run, const_start)
            ):
                return None
        elif fast and (not dead or spread_again):
            return None  # an open fast episode sees the spread return (or stay)
        if r is not None and isfinite(r):  # Sums.add, inlined (hot path)
            n, sx, sy, sxx, sxy, syy, _ = reward
            reward = record(
                Sums, (n + 1, sx + step, sy + r, sxx + step * step, sxy + step * r, syy + r * r, r)
            )
        if k is not None and isfinite(k):
            n, sx, sy, sxx, sxy, syy, _ = kl
            kl = record(
                Sums, (n + 1, sx + step, sy + k, sxx + step * step, sxy + step * k, syy + k * k, k)
            )
        return record(DeadRunState, (
            win, reward, kl, flat, streak_start, gpu_s, usd, usage_seen, gpu_s_at_streak,
            usd_at_streak, episode, zero_run, zero_start, const_run, const_start, last, gpu0,
            usd0, fast, spread_again, gpu_c, usd_c,
        ))  # fmt: skip

    def _fast(
        self,
        ev: EventBase,
        cfg: Settings[Params],
        st: DeadRunState,
        step: int,
        r: float | None,
        out: list[AlertEvent],
    ) -> DeadRunState:
        """The per-step evidence: groups without reward spread, identical reward means."""
        p = cfg.params
        found = self._evidence(ev, p, st, step, r)
        zero_run, zero_start, const_run, const_start, last, gpu0, usd0, gpu_c, usd_c, dead = found
        frac = zero_std_fraction(ev, p.eps)
        st = st._replace(
            zero_run=zero_run, zero_start=zero_start, const_run=const_run,
            const_start=const_start, last_reward=last, gpu_s_at_zero=gpu0, usd_at_zero=usd0,
            gpu_s_at_const=gpu_c, usd_at_const=usd_c,
        )  # fmt: skip
        if st.episode is not None:
            if not st.fast:
                return st
            spread = 0 if dead else st.spread_again + 1
            if spread < p.resolve_steps:
                return st._replace(spread_again=spread)
            why = f"the reward has spread again for {spread} steps"
            out.append(resolve(ev, cfg, st.episode, why))
            return st._replace(episode=None, fast=False, spread_again=0, flat=0)
        by_zero = _by_zero(p, step, zero_run, zero_start)
        by_const = _by_const(p, step, const_run, const_start)
        if not (by_zero or by_const) or (st.usage_seen and st.gpu_s <= gpu0):
            return st
        start = zero_start if by_zero else const_start
        if by_zero:
            seen = f"{frac:.0%} of the groups" if frac is not None and frac < 1 else "every group"
            evidence = (
                f"{seen} scored without reward spread for {step - start + 1} steps in a row"
                f"{_rows(step - start + 1, zero_run)} (no advantage, no gradient)"
            )
        else:
            evidence = (
                f"the reward mean was exactly {r:.6g} for {step - start + 1} steps in a row"
                f"{_rows(step - start + 1, const_run)}"
            )
        observed = {"reward_mean": r, "frac_reward_zero_std": frac, "steps": step - start + 1}
        thresholds = {"zero_std_frac": p.zero_std_frac, "zero_std_steps": p.zero_std_steps}
        thresholds["constant_steps"] = p.constant_steps
        alert = self._alert(ev, cfg, st, start, step, evidence, observed, thresholds, gpu0, usd0)
        out.append(alert)
        return st._replace(episode=alert.alert_id, fast=True, spread_again=0)

    def _close(
        self, ev: EventBase, cfg: Settings[Params], st: DeadRunState, out: list[AlertEvent]
    ) -> DeadRunState:
        p = cfg.params
        if st.reward.n < p.min_points:
            return st
        flat = _flat(st.reward, p.window, p.reward_flat_abs, p.reward_flat_rel) and (
            st.kl.n == 0 or _flat(st.kl, p.window, p.kl_flat_abs, p.kl_flat_rel)
        )
        if not flat:
            if st.episode is not None and not st.fast:
                why = f"reward moved again (std {st.reward.std:.3g}, slope {st.reward.slope:.3g})"
                out.append(resolve(ev, cfg, st.episode, why))
                return st._replace(flat=0, episode=None)
            return st._replace(flat=0)
        start = st.streak_start if st.flat else st.win * p.window
        at_streak = st.gpu_s_at_streak if st.flat else st.gpu_s
        usd0 = st.usd_at_streak if st.flat else st.usd
        flat_n = st.flat + 1
        accruing = not st.usage_seen or st.gpu_s > at_streak or flat_n == 1
        st = st._replace(
            flat=flat_n, streak_start=start, gpu_s_at_streak=at_streak, usd_at_streak=usd0
        )
        if flat_n < p.windows or not accruing or st.episode is not None:
            return st
        end = (st.win + 1) * p.window - 1
        kl_text = f", KL {st.kl.mean:.4g}" if st.kl.n else ""
        evidence = (
            f"reward {st.reward.mean:.4g}{kl_text} flat within noise for {flat_n} windows "
            f"(steps {start}-{end})"
        )
        observed = {"reward_mean": st.reward.mean, "reward_std": st.reward.std}
        observed |= {"kl_mean": st.kl.mean if st.kl.n else None, "flat_windows": flat_n}
        thresholds = {"windows": p.windows, "reward_flat_abs": p.reward_flat_abs}
        thresholds["kl_flat_abs"] = p.kl_flat_abs
        alert = self._alert(
            ev, cfg, st, start, end, evidence, observed, thresholds, at_streak, usd0
        )
        out.append(alert)
        return st._replace(episode=alert_id(ev.run_id, self.name, start), fast=False)

    def _alert(
        self,
        ev: EventBase,
        cfg: Settings[Params],
        st: DeadRunState,
        start: int,
        end: int,
        evidence: str,
        observed: dict[str, Any],
        thresholds: dict[str, Any],
        gpu0: float,
        usd0: float,
    ) -> AlertEvent:
        p = cfg.params
        since_gpu, since_usd = st.gpu_s - gpu0, st.usd - usd0
        priced = bool(p.usd_per_gpu_second) and st.usage_seen
        if not st.usage_seen:
            spend = "spend unknown (no UsageRecorded for this run) while steps keep committing"
        elif priced:
            spend = (
                f"${since_usd:,.2f} burned since step {start} ({_gpu(since_gpu)}), "
                f"${st.usd:,.2f} in the whole run"
            )
        else:
            spend = f"{_gpu(since_gpu)} burned since step {start} (no price list attached)"
        observed |= {"gpu_hours_since": since_gpu / 3600.0, "gpu_hours": st.gpu_s / 3600.0}
        observed |= {"spend_usd_since": since_usd if priced else None}
        observed["spend_usd"] = st.usd if priced else None
        thresholds["prices_version"] = p.prices_version
        reason = f"{evidence}: no learning signal; {spend}"
        return fire(ev, cfg, first_step=start, window=(start, end), observed=observed,
                    thresholds=thresholds, reason=reason)  # fmt: skip


def _gpu(seconds: float) -> str:
    """Device time as the alert says it (``UsageRecorded`` v3: GPU or CPU seconds)."""
    return f"{seconds / 3600:,.1f} device-hours" if seconds >= 3600 else f"{seconds:,.0f} device-s"


DETECTOR = DeadRun()

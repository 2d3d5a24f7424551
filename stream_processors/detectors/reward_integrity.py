"""Reward integrity (seed 002, step 5): the tenant's scores cannot be trusted.

Reads what the sandbox already publishes per reward batch on ``runwatch.rewards`` and
fires on any of three signals, each booked to the tenant's reward, not to the algorithm
(``observed.booked_to`` says so; the run-state policy gives this detector the
``tenant_code_fault`` class):

- **canary drift**: the held-out probes (``CanaryProbeScored``; known-wrong answers whose
  reference score is ``expected_mean``) score above their reference by more than
  ``canary_tolerance`` (or the sandbox's own ``inflated`` verdict) in ``canary_hits`` of the
  last ``canary_window`` probe groups, or their mean excess over those groups exceeds
  ``drift_abs`` (a slow creep that no single group shows);
- **constant scores**: ``constant_batches`` scored batches in a row with no spread at all
  (``score_max - score_min <= eps``), or the sandbox's ``degenerate`` flag (its own window
  of constant batches): a dead gradient signal and, usually, a bug;
- **non-finite or out-of-range scores**: the schema gate refuses such a batch
  (``RewardBatchFailed``, cause ``tenant_bad_output``; its message says NaN/infinite or
  outside the declared range) — at least ``bad_frac`` of the last ``bad_window`` batch
  outcomes (with ``min_batches`` seen) refused that way.

Other failures (timeouts, crashes) are the reward ledger's business, not integrity: they
neither count nor reset anything here. The episode resolves after ``resolve_batches``
clean outcomes in a row (a scored batch with spread; probes, when present, not inflated).
Windows are counted in reward batches, never in time. Lag: ``canary_hits`` probe verdicts
(the trainer mixes a probe group into every batch and judges those of the last
``reward.canary_every`` batches every ``reward.canary_every``-th), ``constant_batches``
batches, or ``min_batches`` batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import isfinite
from typing import Any, ClassVar, NamedTuple

from events.envelope import EventBase
from stream_processors.detectors.base import (
    NO_ALERTS,
    AlertEvent,
    RunContext,
    Settings,
    fire,
    resolve,
    state_type,
)


@dataclass(frozen=True, slots=True)
class Params:
    canary_tolerance: float = 0.25
    canary_window: int = 4
    canary_hits: int = 2
    drift_abs: float = 0.1
    constant_batches: int = 8
    eps: float = 1e-9
    bad_window: int = 8
    bad_frac: float = 0.5
    min_batches: int = 4
    resolve_batches: int = 8


@state_type
class IntegrityState(NamedTuple):
    #: the last probe groups: (step, excess over the reference, inflated?)
    probes: tuple[tuple[int, float, bool], ...] = ()
    const_run: int = 0
    const_start: int = -1
    #: the last batch outcomes that bear on the output: (step, refused as bad output?)
    outcomes: tuple[tuple[int, bool], ...] = ()
    last_bad: str = ""
    episode: str | None = None
    clean: int = 0


def _bad_kind(message: str) -> str:
    if "NaN" in message or "infinite" in message:
        return "NaN or infinite scores"
    if "outside [" in message:
        return "scores outside the declared range"
    return "malformed scores"


class RewardIntegrity:
    name: ClassVar[str] = "reward_integrity"
    layer: ClassVar = "algorithmic"
    default_routing: ClassVar = "page"
    first_response: ClassVar[str] = (
        "tenant reward: inspect the reward function's outputs on the canary probes and the "
        "refused batches (sandbox logs); pause promotion; evaluation integrity"
    )
    Params: ClassVar[type] = Params
    handles: ClassVar[frozenset[str]] = frozenset(
        {"RewardBatchScored", "RewardBatchFailed", "CanaryProbeScored"}
    )

    def initial(self) -> IntegrityState:
        return IntegrityState()

    def apply(
        self, st: IntegrityState, ev: EventBase, cfg: Settings[Any], ctx: RunContext
    ) -> tuple[IntegrityState, Sequence[AlertEvent]]:
        p: Params = cfg.params
        step = ev.step or 0
        etype = ev.type
        clean = False
        if etype == "CanaryProbeScored":
            excess = ev.score_mean - ev.expected_mean  # type: ignore[attr-defined]
            if not isfinite(excess):
                return st, NO_ALERTS
            inflated = bool(ev.inflated) or excess > p.canary_tolerance  # type: ignore[attr-defined]
            st = st._replace(probes=(*st.probes, (step, excess, inflated))[-p.canary_window :])
            clean = not inflated
        elif etype == "RewardBatchScored":
            spread = ev.score_max - ev.score_min  # type: ignore[attr-defined]
            constant = (isfinite(spread) and spread <= p.eps) or bool(ev.degenerate)  # type: ignore[attr-defined]
            if constant:
                start = st.const_start if st.const_run else step
                st = st._replace(const_run=st.const_run + 1, const_start=start)
            else:
                st = st._replace(const_run=0, const_start=-1)
            outcomes = (*st.outcomes, (step, False))[-p.bad_window :]
            st = st._replace(outcomes=outcomes)
            clean = not constant
        else:  # RewardBatchFailed
            if ev.cause != "tenant_bad_output":  # type: ignore[attr-defined]
                return st, NO_ALERTS
            outcomes = (*st.outcomes, (step, True))[-p.bad_window :]
            st = st._replace(outcomes=outcomes, last_bad=_bad_kind(ev.message))  # type: ignore[attr-defined]
        if st.episode is not None:
            if not clean:
                return st._replace(clean=0), NO_ALERTS
            n = st.clean + 1
            if n < p.resolve_batches:
                return st._replace(clean=n), NO_ALERTS
            why = f"the tenant's scores passed the integrity checks for {n} batches"
            # the evidence that fired is settled: a new episode needs new evidence
            return IntegrityState(), (resolve(ev, cfg, st.episode, why),)
        found = self._evidence(st, p, ev)
        if found is None:
            return st, NO_ALERTS
        first, evidence, observed = found
        alert = fire(
            ev,
            cfg,
            first_step=first,
            window=(first, step),
            observed={"booked_to": "tenant_reward", "signal": evidence[0], **observed},
            thresholds={
                "canary_tolerance": p.canary_tolerance,
                "canary_hits": p.canary_hits,
                "drift_abs": p.drift_abs,
                "constant_batches": p.constant_batches,
                "bad_frac": p.bad_frac,
            },
            reason=f"your reward function {evidence[1]} (the tenant's reward, not the training)",
        )
        return st._replace(episode=alert.alert_id, clean=0), (alert,)

    @staticmethod
    def _evidence(
        st: IntegrityState, p: Params, ev: EventBase
    ) -> tuple[int, tuple[str, str], dict[str, Any]] | None:
        """(first step, (signal, what it did), observed) of the first signal that holds."""
        probes = st.probes
        hits = [x for x in probes if x[2]]
        if len(hits) >= p.canary_hits:
            mean = sum(x[1] for x in probes) / len(probes)
            what = (
                f"scored known-wrong canary probes above their reference in {len(hits)} of "
                f"the last {len(probes)} probe groups (mean excess {mean:+.3g})"
            )
            return hits[0][0], ("canary", what), {"canary_excess_mean": mean}
        if len(probes) >= p.canary_window:
            mean = sum(x[1] for x in probes) / len(probes)
            if mean > p.drift_abs:
                what = (
                    f"scores known-wrong canary probes {mean:+.3g} above their reference on "
                    f"average over the last {len(probes)} probe groups (drift)"
                )
                return probes[0][0], ("canary_drift", what), {"canary_excess_mean": mean}
        if st.const_run >= p.constant_batches:
            what = f"returned the same score for every item of {st.const_run} batches in a row"
            return st.const_start, ("constant", what), {"constant_batches": st.const_run}
        outcomes = st.outcomes
        if len(outcomes) >= p.min_batches:
            bad = [s for s, b in outcomes if b]
            share = len(bad) / len(outcomes)
            if bad and share >= p.bad_frac:
                what = (
                    f"returned {st.last_bad} in {len(bad)} of the last {len(outcomes)} "
                    "batches (refused at the schema gate; no score reached the trainer)"
                )
                return bad[0], ("bad_output", what), {"bad_share": share}
        return None


DETECTOR = RewardIntegrity()

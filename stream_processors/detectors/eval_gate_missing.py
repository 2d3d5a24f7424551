"""Eval gate missing: the reward-hacking detector is blind without held-out scores.

Seed 000, pre-checks: "without [an eval gate], reward hacking is undetectable by
construction". On each ``TrainerStepCompleted``: when ``max_gap_steps`` or more steps
passed since the last ``EvalGateScored`` (or since the run's first step, if it never had
one), fire once (advisory by default). The next eval score resolves it. Lag: the gap.
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
    resolve,
    state_type,
)


@dataclass(frozen=True, slots=True)
class Params:
    max_gap_steps: int = 200


@state_type
class EvalGapState(NamedTuple):
    first_step: int = -1
    last_eval: int = -1
    episode: str | None = None


class EvalGateMissing:
    name: ClassVar[str] = "eval_gate_missing"
    layer: ClassVar = "algorithmic"
    default_routing: ClassVar = "advisory"
    first_response: ClassVar[str] = (
        "wire a held-out eval gate for this run (evaluation integrity); until then reward "
        "hacking is undetectable by construction"
    )
    Params: ClassVar[type] = Params
    handles: ClassVar[frozenset[str]] = frozenset({"TrainerStepCompleted", "EvalGateScored"})

    def initial(self) -> EvalGapState:
        return EvalGapState()

    def apply(
        self, st: EvalGapState, ev: EventBase, cfg: Settings[Params], ctx: RunContext
    ) -> tuple[EvalGapState, Sequence[AlertEvent]]:
        step = ev.step or 0
        if ev.type == "EvalGateScored":
            st = st._replace(last_eval=max(st.last_eval, step))
            if st.episode is None:
                return st, NO_ALERTS
            reason = f"eval gate scored again at step {step}"
            return st._replace(episode=None), (resolve(ev, cfg, st.episode, reason),)
        if st.first_step < 0:
            st = st._replace(first_step=step)
        since = st.last_eval if st.last_eval >= 0 else st.first_step
        if st.episode is not None or step - since < cfg.params.max_gap_steps:
            return st, NO_ALERTS
        what = f"since step {since}" if st.last_eval >= 0 else "since the run started"
        alert = fire(
            ev,
            cfg,
            first_step=step,
            window=(since, step),
            observed={"steps_without_eval": step - since, "last_eval_step": st.last_eval},
            thresholds={"max_gap_steps": cfg.params.max_gap_steps},
            reason=(
                f"no held-out eval score for {step - since} steps {what}: reward hacking "
                f"cannot be detected for this run"
            ),
        )
        return st._replace(episode=alert.alert_id), (alert,)


DETECTOR = EvalGateMissing()

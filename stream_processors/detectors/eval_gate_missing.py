"""Eval gate missing: the reward-hacking detector is blind without held-out scores.

Seed 000, pre-checks: "without [an eval gate], reward hacking is undetectable by
construction". The allowed gap is judged against the run's eval cadence: the configured
one (``RunSubmitted.config``: ``eval_every``, verl's ``test_freq``, TRL's ``eval_steps``,
or runwatch's trainer's ``eval_every``) times ``late_factor`` (at most 2), else the
cadence learned from the run's first two eval points, else ``max_gap_steps``. On each
``TrainerStepCompleted``: when the allowed number of steps passed since the last
``EvalGateScored`` (or since the run's first step, if it never had one), fire once
(advisory by default). The next eval score resolves it. Lag: ``every · (late_factor - 1)``
steps past the eval that was due (``max_gap_steps`` from the start without a cadence).
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
    run_config_int,
    state_type,
)

RUN_CONFIG_KEYS = ("eval_every", "eval_every_steps", "test_freq", "eval_steps")


@dataclass(frozen=True, slots=True)
class Params:
    max_gap_steps: int = 200
    late_factor: float = 1.5


@state_type
class EvalGapState(NamedTuple):
    first_step: int = -1
    last_eval: int = -1
    episode: str | None = None
    #: the configured eval cadence once the run's config was read (-1: none)
    configured: int = 0
    first_eval: int = -1
    learned: int = 0


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
            learned = st.learned
            if not learned and st.first_eval >= 0 and step > st.first_eval:
                learned = step - st.first_eval
            first_eval = st.first_eval if st.first_eval >= 0 else step
            st = st._replace(
                last_eval=max(st.last_eval, step), first_eval=first_eval, learned=learned
            )
            if st.episode is None:
                return st, NO_ALERTS
            reason = f"eval gate scored again at step {step}"
            return st._replace(episode=None), (resolve(ev, cfg, st.episode, reason),)
        if st.first_step < 0:
            st = st._replace(first_step=step)
        if st.configured == 0 and ctx.run_config:
            st = st._replace(configured=run_config_int(ctx, RUN_CONFIG_KEYS) or -1)
        p = cfg.params
        every = st.configured if st.configured > 0 else st.learned
        allowed = every * min(p.late_factor, 2.0) if every else p.max_gap_steps
        since = st.last_eval if st.last_eval >= 0 else st.first_step
        if st.episode is not None or step - since < allowed:
            return st, NO_ALERTS
        what = f"since step {since}" if st.last_eval >= 0 else "since the run started"
        alert = fire(
            ev,
            cfg,
            first_step=step,
            window=(since, step),
            observed={"steps_without_eval": step - since, "last_eval_step": st.last_eval},
            thresholds={"allowed_gap_steps": allowed, "eval_every": every},
            reason=(
                f"no held-out eval score for {step - since} steps {what}: reward hacking "
                f"cannot be detected for this run"
            ),
        )
        return st._replace(episode=alert.alert_id), (alert,)


DETECTOR = EvalGateMissing()

"""Checkpoint cadence missed (run mechanics): no checkpoint for longer than configured.

Expected interval, first that applies: the catalog's ``every_steps``; the run's own
configured cadence (``RunSubmitted.config``: ``checkpoint_every_steps``, verl's
``save_freq``, TRL's ``save_steps``, or runwatch's trainer's ``checkpoint.every``); else it
is learned from the run's first two ``CheckpointWritten`` steps. Until one is known the
detector is not armed (an imported history without checkpoints raises nothing here).

On each ``TrainerStepCompleted``: late when ``step - last_checkpoint_step`` (or the run's
first step, if no checkpoint yet) exceeds ``every · late_factor + delivery_skew_steps``;
that fires. ``late_factor`` (at most 2: a checkpoint twice the cadence late is late
whatever the catalog says) is judged against the configured cadence, not a window.
A ``CheckpointWritten`` moves ``last_checkpoint_step`` (to the highest step written) and
resolves an open alert.

Interleaving assumption: checkpoint facts are on ``runwatch.checkpoints``, a different
topic from the telemetry, so hosts may interleave the two differently (and a producer's
batch reaches the embedded log one topic at a time: a checkpoint lands after the whole
batch's telemetry). The decision only compares *step numbers* (never arrival order), so
the output is the same on every host as long as a checkpoint's event is consumed within
``delivery_skew_steps`` steps of the telemetry of its own step — that parameter is the
allowance.
The trainer publishes a checkpoint's event before the next step's telemetry (and flushes
per step), so 8 steps cover what a host's interleaving can do to it.
Lag: ``every · (late_factor - 1) + delivery_skew_steps`` steps past the due step.
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

RUN_CONFIG_KEYS = ("checkpoint_every_steps", "save_freq", "save_steps", "checkpoint.every")
#: the most ``late_factor`` may say: a checkpoint twice the cadence late is late
MAX_LATE_FACTOR = 2.0


@dataclass(frozen=True, slots=True)
class Params:
    every_steps: int = 0
    late_factor: float = 1.25
    delivery_skew_steps: int = 8


@state_type
class CadenceState(NamedTuple):
    first_step: int = -1
    first_ckpt: int = -1
    last_ckpt: int = -1
    learned_every: int = 0
    episode: str | None = None
    #: the run's configured cadence, once its RunSubmitted config was read (-1: none)
    configured: int = 0


def _every(p: Params, st: CadenceState) -> int:
    if p.every_steps > 0:
        return p.every_steps
    return st.configured if st.configured > 0 else st.learned_every


class CheckpointCadence:
    name: ClassVar[str] = "checkpoint_cadence"
    layer: ClassVar = "run_mechanics"
    default_routing: ClassVar = "ticket"
    first_response: ClassVar[str] = (
        "platform: check the checkpoint writer and storage (checkpoint_write_* metrics); "
        "a crash now loses everything since the last checkpoint"
    )
    Params: ClassVar[type] = Params
    handles: ClassVar[frozenset[str]] = frozenset({"TrainerStepCompleted", "CheckpointWritten"})

    def initial(self) -> CadenceState:
        return CadenceState()

    def apply(
        self, st: CadenceState, ev: EventBase, cfg: Settings[Params], ctx: RunContext
    ) -> tuple[CadenceState, Sequence[AlertEvent]]:
        step = ev.step if ev.step is not None else -1
        if ev.type == "CheckpointWritten":
            if step < 0:
                return st, NO_ALERTS
            learned = st.learned_every
            if st.first_ckpt >= 0 and not learned and step > st.first_ckpt:
                learned = step - st.first_ckpt
            st = st._replace(
                first_ckpt=st.first_ckpt if st.first_ckpt >= 0 else step,
                last_ckpt=max(st.last_ckpt, step),
                learned_every=learned,
            )
            if st.episode is None:
                return st, NO_ALERTS
            reason = f"checkpoint written at step {step}"
            return st._replace(episode=None), (resolve(ev, cfg, st.episode, reason),)
        if st.first_step < 0:
            st = st._replace(first_step=step)
        if st.configured == 0 and ctx.run_config:
            st = st._replace(configured=run_config_int(ctx, RUN_CONFIG_KEYS) or -1)
        every = _every(cfg.params, st)
        if every <= 0 or st.episode is not None:
            return st, NO_ALERTS
        since = st.last_ckpt if st.last_ckpt >= 0 else st.first_step
        late = min(cfg.params.late_factor, MAX_LATE_FACTOR)
        allowed = every * late + cfg.params.delivery_skew_steps
        if step - since <= allowed:
            return st, NO_ALERTS
        what = f"since the checkpoint at step {since}" if st.last_ckpt >= 0 else "since run start"
        alert = fire(
            ev,
            cfg,
            first_step=step,
            window=(since, step),
            observed={"steps_since_checkpoint": step - since, "last_checkpoint_step": since},
            thresholds={
                "every_steps": every,
                "late_factor": late,
                "delivery_skew_steps": cfg.params.delivery_skew_steps,
            },
            reason=(
                f"no checkpoint for {step - since} steps {what} (expected every {every} "
                f"steps, allowed {allowed:g})"
            ),
        )
        return st._replace(episode=alert.alert_id), (alert,)


DETECTOR = CheckpointCadence()

"""RunControllerFold: a paging alert becomes a ``PauseRequested`` (pure fold, per run).

Inputs: ``runwatch.alerts`` (``AlertFired``), ``runwatch.lifecycle`` (the algorithm from
``RunSubmitted``; whether the run is paused or over, from the trainer's own answers) and
``runwatch.control`` (requests already made, by anyone). Key: ``run_id``. Output:
``PauseRequested(actor="controller")`` on ``runwatch.control``, with a deterministic id
(``derived_id(producer, alert event id, "pause")``), the alert's ``ts`` and ``step``, the
alert id and the policy version.

Rules:

- An ``AlertFired`` pauses when :meth:`ControlPolicy.pauses` says so for the run's tenant,
  algorithm, detector and routing (``page`` by default: ``ticket`` and ``advisory`` never
  pause), the run is live (not already pausing, paused or over), and this alert episode
  (``alert_id``) has not paused the run before — a run a person resumed while the same
  alert is still active is not paused again by it; a new episode pauses again.
- A pause request by anyone makes the run "pausing" until the trainer answers
  ``RunPaused``; ``RunResumed`` makes it live again; ``RunCompleted``, ``RunFailed`` and
  ``RunCancelled`` end it (later alerts do nothing).

The fold does not judge people's commands (the API does, against the projected state, and
the trainer ignores what does not apply to it); it only avoids asking twice. Time: event
fields only. State: one small NamedTuple per run.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import NamedTuple

from events.catalog.control import PauseRequested, UnpauseRequested
from events.catalog.derived import AlertFired
from events.catalog.lifecycle import (
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunPaused,
    RunResumed,
    RunSubmitted,
)
from events.envelope import EventBase, derive_envelope
from stream_processors.control.policy import ControlPolicy

PRODUCER = "stream_processors/run_controller"
#: How many alert episodes a run remembers having paused for.
MAX_ACTED = 64


class ControlState(NamedTuple):
    algorithm: str = "default"
    phase: str = "live"  # live | pausing | paused | over
    acted: tuple[str, ...] = ()  # alert ids this controller paused the run for


class RunControllerFold:
    """Implements :class:`events.fold.Fold` for run control."""

    name = "run-controller"
    inputs: tuple[str, ...] = ("runwatch.lifecycle", "runwatch.alerts", "runwatch.control")

    def __init__(self, policy: ControlPolicy | None = None) -> None:
        self.policy = policy or ControlPolicy.load()

    def initial(self) -> ControlState:
        return ControlState()

    def key_of(self, event: EventBase) -> str:
        return event.run_id

    def apply(
        self, state: ControlState, event: EventBase
    ) -> tuple[ControlState, Sequence[EventBase]]:
        t = type(event)
        if t is AlertFired:
            return self._alert(state, event)  # type: ignore[arg-type]
        if state.phase == "over":
            return state, ()
        if t is RunSubmitted:
            return state._replace(algorithm=event.algorithm), ()  # type: ignore[attr-defined]
        if t is PauseRequested and state.phase == "live":
            return state._replace(phase="pausing"), ()
        if t is RunPaused:
            return state._replace(phase="paused"), ()
        if t is RunResumed or (t is UnpauseRequested and state.phase == "pausing"):
            return state._replace(phase="live"), ()
        if t in (RunCompleted, RunFailed, RunCancelled):
            return state._replace(phase="over"), ()
        return state, ()  # CancelRequested: the run ends when the trainer says so

    def _alert(
        self, state: ControlState, ev: AlertFired
    ) -> tuple[ControlState, Sequence[EventBase]]:
        if state.phase != "live" or ev.alert_id in state.acted:
            return state, ()
        if not self.policy.pauses(
            tenant=ev.tenant_id, algorithm=state.algorithm, detector=ev.detector, routing=ev.routing
        ):
            return state, ()
        request = PauseRequested(
            **derive_envelope(ev, PRODUCER, "pause"),
            actor="controller",
            principal=PRODUCER,
            reason=f"{ev.detector} ({ev.routing}): {ev.reason}",
            alert_id=ev.alert_id,
            policy_version=self.policy.version,
        )
        acted = (*state.acted, ev.alert_id)[-MAX_ACTED:]
        return state._replace(phase="pausing", acted=acted), (request,)

    def dump_state(self, state: ControlState) -> bytes:
        return json.dumps([state.algorithm, state.phase, list(state.acted)]).encode()

    def load_state(self, raw: bytes) -> ControlState:
        algorithm, phase, acted = json.loads(raw)
        return ControlState(algorithm, phase, tuple(acted))

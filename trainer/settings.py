"""What a run's resumes changed, rebuilt from its log: the branch its steps are on, and
the settings each step was trained under.

An operator's resume may change the learning rate and the KL penalty's weight (``lr``,
``kl_coef``: :data:`producers.commands.RESUME_OVERRIDES`) and take the run back to a
checkpoint (``rollback_to_step``). The trainer applies them in memory
(:meth:`trainer.loop.Trainer.apply_overrides`); a trainer restarted after a crash, and the
resume gate replaying the steps after a checkpoint, must know them too, or the replay is
another experiment than the one recorded (found by review: after a crash the settings
went back to the submitted config, and after a rollback the gate compared the new
branch's steps with the abandoned branch's records — the resume was refused, or the run
went on under settings nobody asked for).

Nothing of this is stored apart from the log: the ``RunResumed`` facts say which command
each resume answered (``request_id``) and whether it rolled back (``rolled_back_to``);
the answered ``UnpauseRequested`` commands on ``runwatch.control`` carry the overrides.

Assumptions: ``events`` is one run's facts in the order they were appended (the embedded
log's merge order; the trainer appends a ``RunResumed`` before any step it trains after
it); settings hold until a later resume changes them, a rollback included (it restores
the weights and the optimizer of then, not the settings of then). Pure; no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from events.catalog.lifecycle import RunResumed
from events.catalog.trainer import TrainerStepCompleted
from producers.commands import RESUME_OVERRIDES

#: The overrides that are settings (applied from the resume on), not one-off acts.
SETTINGS = ("lr", "kl_coef")

Settings = Mapping[str, float]


def resume_settings(overrides: Mapping[str, object]) -> dict[str, float]:
    """The settings these overrides put in effect, as the trainer applies them: each
    within its bounds (:data:`RESUME_OVERRIDES`), anything else ignored (the API and the
    CLI refuse it before a command is written)."""
    out: dict[str, float] = {}
    for key in SETTINGS:
        value = overrides.get(key)
        _, lo, hi = RESUME_OVERRIDES[key]
        if isinstance(value, int | float) and not isinstance(value, bool) and lo < value < hi:
            out[key] = float(value)
    return out


@dataclass(frozen=True)
class RunHistory:
    """The run's latest branch as its log tells it."""

    #: the recorded metrics per step of the latest branch (a rollback abandons the records
    #: after its step; the first record of a step on a branch wins)
    recorded: dict[int, TrainerStepCompleted] = field(default_factory=dict)
    #: the settings in effect when each of those steps was trained (``{}``: as submitted)
    settings_at: dict[int, dict[str, float]] = field(default_factory=dict)
    #: the settings in effect after the last fact: what a restarted trainer goes on with
    settings: dict[str, float] = field(default_factory=dict)


def run_history(
    events: Iterable[object], overrides_of: Mapping[str, Mapping[str, object]] | None = None
) -> RunHistory:
    """Fold one run's facts (in log order) into its latest branch. ``overrides_of``: the
    answered resumes' overrides by command id (:func:`trainer.publish.run_overrides`); a
    resume whose command is not there changed no setting (the replay of the steps after
    it then deviates, and the gate refuses: never a silent other experiment)."""
    overrides_of = overrides_of or {}
    recorded: dict[int, TrainerStepCompleted] = {}
    settings_at: dict[int, dict[str, float]] = {}
    settings: dict[str, float] = {}
    for ev in events:
        if isinstance(ev, TrainerStepCompleted) and ev.step is not None:
            if ev.step not in recorded:
                recorded[ev.step] = ev
                settings_at[ev.step] = settings
        elif isinstance(ev, RunResumed):
            back = ev.rolled_back_to
            if back is not None:
                for step in [s for s in recorded if s > back]:
                    del recorded[step], settings_at[step]
            if ev.request_id and ev.request_id in overrides_of:
                changed = resume_settings(overrides_of[ev.request_id])
                if changed:
                    settings = {**settings, **changed}
    return RunHistory(recorded, settings_at, settings)

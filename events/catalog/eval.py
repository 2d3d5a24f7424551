"""Held-out evaluation: the gate score the optimizer cannot touch."""

from __future__ import annotations

from typing import ClassVar, Literal

from events.envelope import EventBase, Int


class EvalGateScored(EventBase):
    """Held-out score at ``step`` (envelope), on a split the optimizer never sees."""

    TOPIC: ClassVar[str] = "runwatch.telemetry"
    type: Literal["EvalGateScored"] = "EvalGateScored"
    score: float
    n_items: Int = 0
    split: str = "heldout"

"""Run lifecycle facts, as the scheduler and the trainer report them."""

from __future__ import annotations

from typing import ClassVar, Literal

from events.envelope import Attributes, EventBase

FailureClass = Literal["platform_fault", "tenant_code_fault", "algorithmic_non_convergence"]


class _Lifecycle(EventBase):
    TOPIC: ClassVar[str] = "runwatch.lifecycle"


class RunSubmitted(_Lifecycle):
    """A tenant submitted a run. ``algorithm`` selects per-algorithm detector thresholds."""

    type: Literal["RunSubmitted"] = "RunSubmitted"
    algorithm: str = "grpo"
    config: Attributes = ()


class RunQueued(_Lifecycle):
    type: Literal["RunQueued"] = "RunQueued"


class RunProvisioning(_Lifecycle):
    type: Literal["RunProvisioning"] = "RunProvisioning"


class RunStarted(_Lifecycle):
    type: Literal["RunStarted"] = "RunStarted"


class RunPaused(_Lifecycle):
    type: Literal["RunPaused"] = "RunPaused"
    reason: str = ""


class RunResumed(_Lifecycle):
    type: Literal["RunResumed"] = "RunResumed"
    reason: str = ""


class RunCompleted(_Lifecycle):
    """The trainer finished all its steps (the run may still be judged non-converged)."""

    type: Literal["RunCompleted"] = "RunCompleted"


class RunFailed(_Lifecycle):
    """The run stopped on an error. ``failure_class`` is the producer's best guess; the
    attribution projection has the final word."""

    type: Literal["RunFailed"] = "RunFailed"
    failure_class: FailureClass | None = None
    reason: str


class RunCancelled(_Lifecycle):
    type: Literal["RunCancelled"] = "RunCancelled"
    reason: str = ""

"""Run lifecycle facts, as the scheduler and the trainer report them."""

from __future__ import annotations

from typing import ClassVar, Literal

from events.envelope import Attributes, EventBase, Int

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
    """The trainer stopped after ``step``: checkpoint written, nothing generated or billed
    until it resumes. v2 adds ``checkpoint`` (the pause checkpoint's id) and
    ``request_id`` (the ``PauseRequested`` it answers; '' when the trainer paused itself).
    v3 adds, from that request, ``requested_by`` (its ``actor``: ``controller``,
    ``operator`` or ``customer``; '' when no request) and ``alert_id`` (the alert a
    controller's request named), so whoever reads the pause knows whose it is and why.
    v4 adds ``refuses_stale_resume``: the process holding the pause refuses a resume that
    names another pause (``UnpauseRequested.answers``), so a resume sent to it names the
    pause it answers; False (v3 and earlier, an older trainer or hook): it reads v1
    resumes only, so none is sent a v2 one. A v4 record with it False is written as v3
    (:mod:`events.upcasting`'s downcasters), which older readers still read."""

    SCHEMA_VERSION: ClassVar[int] = 4
    type: Literal["RunPaused"] = "RunPaused"
    schema_version: int = 4
    reason: str = ""
    checkpoint: str = ""
    request_id: str = ""
    requested_by: str = ""
    alert_id: str = ""
    refuses_stale_resume: bool = False


class RunResumed(_Lifecycle):
    """The trainer continues. v2 adds ``request_id``, ``checkpoint`` (resumed from) and
    ``rolled_back_to``: set when the run went back to an earlier checkpoint (that step),
    so the steps after it are trained again and what they showed before is abandoned."""

    SCHEMA_VERSION: ClassVar[int] = 2
    type: Literal["RunResumed"] = "RunResumed"
    schema_version: int = 2
    reason: str = ""
    checkpoint: str = ""
    request_id: str = ""
    rolled_back_to: Int | None = None


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
    """v2 adds ``request_id`` (the ``CancelRequested`` it answers)."""

    SCHEMA_VERSION: ClassVar[int] = 2
    type: Literal["RunCancelled"] = "RunCancelled"
    schema_version: int = 2
    reason: str = ""
    request_id: str = ""

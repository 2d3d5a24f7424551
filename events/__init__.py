"""runwatch's language and log: typed immutable events, topics, the codec, log backends.

This package imports nothing else of runwatch's; every other room imports it.
"""

from events.catalog.checkpoint import (
    CheckpointWritten,
    ResumeCertified,
    ResumeRejected,
    ResumeRequested,
)
from events.catalog.control import (
    CancelRequested,
    CommandRejected,
    PauseRequested,
    UnpauseRequested,
)
from events.catalog.derived import (
    AlertFired,
    AlertResolved,
    RunStateChanged,
    TenantUsageUpdated,
)
from events.catalog.eval import EvalGateScored
from events.catalog.lifecycle import (
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunPaused,
    RunProvisioning,
    RunQueued,
    RunResumed,
    RunStarted,
    RunSubmitted,
)
from events.catalog.notify import (
    NotificationAbandoned,
    NotificationAttempted,
    NotificationDelivered,
)
from events.catalog.profile import StepProfiled, StragglerDetected, WorkerProfiled
from events.catalog.reward import CanaryProbeScored, RewardBatchFailed, RewardBatchScored
from events.catalog.rollout import RolloutBatchCompleted, RolloutTraceRecorded
from events.catalog.trainer import StepPhaseTimed, TrainerStepCompleted, WeightSyncCompleted
from events.catalog.trajectory import (
    ScoredDataGroupAccepted,
    ScoredDataGroupStored,
    TrajectoryBatchServed,
)
from events.catalog.usage import UsageRecorded
from events.codec import EVENT_ADAPTER, Event, decode, decode_or_raise, encode, topic_of
from events.dead_letter import DeadLetter
from events.dedupe import Deduplicator
from events.envelope import EventBase, derive_envelope, derived_id, event_classes

__all__ = [
    "EVENT_ADAPTER",
    "AlertFired",
    "AlertResolved",
    "CanaryProbeScored",
    "CancelRequested",
    "CheckpointWritten",
    "CommandRejected",
    "DeadLetter",
    "Deduplicator",
    "EvalGateScored",
    "Event",
    "EventBase",
    "NotificationAbandoned",
    "NotificationAttempted",
    "NotificationDelivered",
    "PauseRequested",
    "ResumeCertified",
    "ResumeRejected",
    "ResumeRequested",
    "RewardBatchFailed",
    "RewardBatchScored",
    "RolloutBatchCompleted",
    "RolloutTraceRecorded",
    "RunCancelled",
    "RunCompleted",
    "RunFailed",
    "RunPaused",
    "RunProvisioning",
    "RunQueued",
    "RunResumed",
    "RunStarted",
    "RunStateChanged",
    "RunSubmitted",
    "ScoredDataGroupAccepted",
    "ScoredDataGroupStored",
    "StepPhaseTimed",
    "StepProfiled",
    "StragglerDetected",
    "TenantUsageUpdated",
    "TrainerStepCompleted",
    "TrajectoryBatchServed",
    "UnpauseRequested",
    "UsageRecorded",
    "WeightSyncCompleted",
    "WorkerProfiled",
    "decode",
    "decode_or_raise",
    "derive_envelope",
    "derived_id",
    "encode",
    "event_classes",
    "topic_of",
]

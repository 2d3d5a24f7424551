"""Trajectory-buffer facts (seed 004): the Atropos-compatible experience buffer as events.

Two topics:

- ``runwatch.trajectories`` holds what the HTTP API *accepted* for a run: trainer and
  environment registrations, scored groups, batch requests, delivery commits, API
  (re)starts and resets. Every record is keyed by ``run_id``, so one run's buffer is one
  totally ordered partition; the batching fold is a pure function of that sequence, and
  every API instance that folds it reaches the same state (that is how several instances
  share one buffer).
- ``runwatch.trajectory-payloads`` holds the bytes of accepted groups (one record per
  group, exactly as ``/batch`` returns it), keyed by ``run_id``. They are appended
  (acks=all) before the small ``ScoredDataGroupStored`` that points at them, so the
  ordered partition, which every instance folds, carries only metadata.
- ``runwatch.batches`` holds what the batching fold *derived*: batches served, requests
  that found no batch, groups rejected (can never fit, stale), groups not queued because
  they were accepted before (a retried push), batches requeued after a crash. Detectors
  and dashboards read rollout quality from here.

``request_id`` ties a request (``TrajectoryBatchRequested``, ``TrajectoryEnvRegistered``)
to its answer. Envelope ``step`` of a scored group is the trainer step the accepting
API instance saw (the policy version it was generated under, at the latest); of a
served batch, the trainer step it is.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from events.envelope import EventBase, Int

TRAJECTORIES_TOPIC = "runwatch.trajectories"
PAYLOADS_TOPIC = "runwatch.trajectory-payloads"
BATCHES_TOPIC = "runwatch.batches"

RejectReason = Literal["too_large", "empty", "stale", "unbatchable", "size_mismatch"]
UnavailableReason = Literal["not_registered", "not_enough_data"]


class ScoredDataGroupAccepted(EventBase):
    """One scored group accepted by the trajectory API. ``payload`` is the group as
    ``/batch`` returns it (JSON text, every field present, null where absent)."""

    TOPIC: ClassVar[str] = TRAJECTORIES_TOPIC
    type: Literal["ScoredDataGroupAccepted"] = "ScoredDataGroupAccepted"
    group_id: str
    env_id: Int | None = None
    num_sequences: Int
    mean_score: float | None = None
    payload: str


class ScoredDataGroupStored(EventBase):
    """One scored group accepted by the trajectory API, its payload kept off the ordered
    partition: the group as ``/batch`` returns it is the record at ``payload_offset`` of
    partition ``payload_partition`` of ``runwatch.trajectory-payloads``, appended
    (acks=all) before this event. ``payload_bytes`` and ``payload_crc`` (zlib CRC-32)
    let a reader check what it fetched. Successor of :class:`ScoredDataGroupAccepted`
    (inline payload), which folds the same way and is still read.

    v2 adds what makes a retried push exactly once (the batching fold queues a group only
    the first time its identity comes within the window; later ones it reports as
    :class:`TrajectoryGroupDeduplicated`):

    - ``idempotency_key``: the push's ``Idempotency-Key`` header (None: none sent) and
      ``key_index``, the group's place in that push's body: (key, index) is the group's
      identity, so a retry of a push that reached the log only in part stores the rest;
    - ``content_digest``: BLAKE2b-128 (hex) of the payload, set only by a server run with
      ``--dedupe-content``: a byte-identical group is the same group;
    - ``dedupe_window``: how many further accepted groups the fold remembers this
      group's key and digest (the accepting server's setting, carried so that every
      folder of the partition forgets at the same place)."""

    SCHEMA_VERSION: ClassVar[int] = 2
    TOPIC: ClassVar[str] = TRAJECTORIES_TOPIC
    type: Literal["ScoredDataGroupStored"] = "ScoredDataGroupStored"
    schema_version: int = 2
    group_id: str
    env_id: Int | None = None
    num_sequences: Int
    mean_score: float | None = None
    payload_partition: Int
    payload_offset: Int
    payload_bytes: Int
    payload_crc: Int
    idempotency_key: str | None = None
    key_index: Int = 0
    content_digest: str | None = None
    dedupe_window: Int = 0


class TrajectoryTrainerRegistered(EventBase):
    """``POST /register``: a trainer announced its run parameters. Only the first
    registration after a reset configures the buffer (as the reference server does);
    later ones just get a requester id. ``max_off_policy_steps`` is the server default
    staleness bound (None: unbounded)."""

    TOPIC: ClassVar[str] = TRAJECTORIES_TOPIC
    type: Literal["TrajectoryTrainerRegistered"] = "TrajectoryTrainerRegistered"
    requester_uuid: str
    wandb_group: str
    wandb_project: str
    batch_size: Int
    max_token_len: Int
    checkpoint_dir: str
    save_checkpoint_interval: Int
    starting_step: Int
    num_steps: Int
    max_off_policy_steps: Int | None = None


class TrajectoryEnvRegistered(EventBase):
    """``POST /register-env``: a rollout handler joined. Its ``env_id`` is its ordinal
    among registrations since the last reset (so every folder assigns the same id)."""

    TOPIC: ClassVar[str] = TRAJECTORIES_TOPIC
    type: Literal["TrajectoryEnvRegistered"] = "TrajectoryEnvRegistered"
    request_id: str
    max_token_length: Int
    desired_name: str
    weight: float
    group_size: Int
    min_batch_allocation: float | None = None
    max_off_policy_steps: Int | None = None


class TrajectoryEnvDisconnected(EventBase):
    """``POST /disconnect-env``: a rollout handler left (its queued groups stay)."""

    TOPIC: ClassVar[str] = TRAJECTORIES_TOPIC
    type: Literal["TrajectoryEnvDisconnected"] = "TrajectoryEnvDisconnected"
    env_id: Int


class TrajectoryDataReset(EventBase):
    """``GET /reset_data``: forget registration, environments, queue and step."""

    TOPIC: ClassVar[str] = TRAJECTORIES_TOPIC
    type: Literal["TrajectoryDataReset"] = "TrajectoryDataReset"


class TrajectoryBatchRequested(EventBase):
    """``GET /batch``: a trainer asked for a batch. The answer is decided where this
    record sits in the run's order, by the batching fold."""

    TOPIC: ClassVar[str] = TRAJECTORIES_TOPIC
    type: Literal["TrajectoryBatchRequested"] = "TrajectoryBatchRequested"
    request_id: str


class TrajectoryBatchDelivered(EventBase):
    """The API instance that answered ``request_id`` committed the delivery, right before
    writing the response. A served batch without this commit is requeued when its
    instance (same ``producer``) starts again."""

    TOPIC: ClassVar[str] = TRAJECTORIES_TOPIC
    type: Literal["TrajectoryBatchDelivered"] = "TrajectoryBatchDelivered"
    request_id: str


class TrajectoryBatchReleased(EventBase):
    """The API instance that asked for ``request_id`` could not deliver the batch (client
    gone, timeout): its groups go back to the queue."""

    TOPIC: ClassVar[str] = TRAJECTORIES_TOPIC
    type: Literal["TrajectoryBatchReleased"] = "TrajectoryBatchReleased"
    request_id: str


class TrajectoryApiStarted(EventBase):
    """An API instance (``producer``) started: whatever its previous incarnation served
    but never delivered goes back to the queue."""

    TOPIC: ClassVar[str] = TRAJECTORIES_TOPIC
    type: Literal["TrajectoryApiStarted"] = "TrajectoryApiStarted"
    incarnation: str


class TrajectoryBatchServed(EventBase):
    """A batch formed for a request: the groups in it, in arrival order; envelope
    ``step`` is the trainer step it is."""

    TOPIC: ClassVar[str] = BATCHES_TOPIC
    type: Literal["TrajectoryBatchServed"] = "TrajectoryBatchServed"
    batch_id: str
    group_ids: tuple[str, ...]
    num_sequences: Int
    request_id: str = ""
    env_ids: tuple[Int | None, ...] = ()
    mean_score: float | None = None
    max_staleness: Int | None = None


class TrajectoryBatchUnavailable(EventBase):
    """A request found no batch (the client gets ``{"batch": null}``)."""

    TOPIC: ClassVar[str] = BATCHES_TOPIC
    type: Literal["TrajectoryBatchUnavailable"] = "TrajectoryBatchUnavailable"
    request_id: str
    reason: UnavailableReason
    queued_groups: Int = 0
    queued_sequences: Int = 0


class TrajectoryGroupRejected(EventBase):
    """A queued group will never be served: larger than a batch, empty, staler than its
    environment allows, or unbatchable. Reported instead of stalling the queue."""

    TOPIC: ClassVar[str] = BATCHES_TOPIC
    type: Literal["TrajectoryGroupRejected"] = "TrajectoryGroupRejected"
    group_id: str
    env_id: Int | None = None
    num_sequences: Int
    reason: RejectReason
    detail: str = ""


class TrajectoryGroupDeduplicated(EventBase):
    """A scored group the batching fold did not queue because the same group was
    accepted within the window: the same ``Idempotency-Key`` and index (``by`` =
    ``"idempotency_key"``: a retried push), or, with content dedupe on, the same bytes
    (``"content"``). It is never served; the key and index, or the digest, say which
    earlier group it repeats."""

    TOPIC: ClassVar[str] = BATCHES_TOPIC
    type: Literal["TrajectoryGroupDeduplicated"] = "TrajectoryGroupDeduplicated"
    group_id: str
    env_id: Int | None = None
    num_sequences: Int
    by: Literal["idempotency_key", "content"]
    idempotency_key: str | None = None
    key_index: Int = 0
    content_digest: str | None = None


class TrajectoryGroupBuffered(EventBase):
    """A group whose size differs from its env's registered ``group_size`` waits in the
    env's buffer until buffered groups add up to ``group_size`` (the reference server's
    rule); ``buffer_sequences`` is what the buffer holds after this group's turn."""

    TOPIC: ClassVar[str] = BATCHES_TOPIC
    type: Literal["TrajectoryGroupBuffered"] = "TrajectoryGroupBuffered"
    group_id: str
    env_id: Int
    num_sequences: Int
    buffer_sequences: Int


class TrajectoryGroupsAdmitted(EventBase):
    """Buffered groups that now add up to their env's ``group_size`` join the queue."""

    TOPIC: ClassVar[str] = BATCHES_TOPIC
    type: Literal["TrajectoryGroupsAdmitted"] = "TrajectoryGroupsAdmitted"
    env_id: Int
    group_ids: tuple[str, ...]


class TrajectoryBatchRequeued(EventBase):
    """A served batch was never delivered (released, or its instance restarted): its
    groups are back in the queue at their original arrival positions."""

    TOPIC: ClassVar[str] = BATCHES_TOPIC
    type: Literal["TrajectoryBatchRequeued"] = "TrajectoryBatchRequeued"
    batch_id: str
    group_ids: tuple[str, ...]

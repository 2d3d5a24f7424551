"""How one trajectory API instance is configured (:class:`TrajectorySettings`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from producers.trajectory_api.once import DEFAULT_WINDOW_GROUPS
from producers.trajectory_api.request_body import (
    BODY_TIMEOUT_S,
    MAX_BODY_BYTES,
    MAX_INFLIGHT_BODY_BYTES,
)


@dataclass(frozen=True)
class TrajectorySettings:
    tenant_id: str = "default"
    run_id: str = "atropos"
    #: Stable name of this API instance (default ``host:port``): a restart under the same
    #: name requeues what the previous incarnation served but never delivered.
    instance: str = ""
    max_off_policy_steps: int | None = None
    max_queue_groups: int = 50_000
    #: The model's vocabulary size: pushed token ids must be below it (None: unchecked).
    vocab_size: int | None = None
    #: Bearer token every request but ``/health`` must carry (None: no authentication;
    #: the CLI requires one when binding beyond loopback).
    token: str | None = field(default=None, repr=False)
    #: Web origins whose pages may call the API (none by default).
    cors_origins: tuple[str, ...] = ()
    #: Largest request body, plain or gzip-inflated (413 beyond it).
    max_body_bytes: int = MAX_BODY_BYTES
    #: Body bytes all requests in flight may hold together (503 + Retry-After beyond it).
    max_inflight_body_bytes: int = MAX_INFLIGHT_BODY_BYTES
    #: Longest pause in a request body, and the grace before its minimum rate applies
    #: (408 beyond it; :class:`~producers.trajectory_api.RequestBodyMiddleware`).
    body_timeout_s: float = BODY_TIMEOUT_S
    batch_timeout_s: float = 30.0
    gzip_level: int = 1
    #: Where this instance keeps its payload cache and view snapshots (None: a temporary
    #: directory and no snapshots, so a restart replays the run's partition from 0).
    state_dir: str | None = None
    snapshot_every_records: int = 2000
    snapshot_every_s: float = 5.0
    dedupe_window: int = 200_000
    #: Accepted groups after which a push's ``Idempotency-Key`` (and, with
    #: ``dedupe_content``, its groups' digests) is forgotten: a retry later than that is
    #: stored again. Stamped on each keyed group, so every instance forgets alike.
    idempotency_window: int = DEFAULT_WINDOW_GROUPS
    #: Store byte-identical groups once within the window (off: see docs/trajectory-api.md).
    dedupe_content: bool = False


#: Payloads of other instances' groups read ahead of ``/batch`` (at most this many held).
READ_AHEAD_GROUPS = 16

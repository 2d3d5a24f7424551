"""Typed vocabulary of the reward sandbox: tiers, causes, limits, config and results.

Everything that crosses the sandbox's public surface is one of these frozen types. The
sandbox never raises to its caller: every path ends in a result carrying a status enum
(:class:`OutcomeStatus` for a scored batch, :class:`AttemptStatus` for one attempt in a
worker) and, on failure, exactly one :class:`Cause`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Literal, get_args


class ArtifactKind(enum.StrEnum):
    """What a tenant submitted; each step down widens the attack surface."""

    FUNCTION = "function"  # pure function over (prompt, completion) text
    VERIFIER = "verifier"  # runs further code: tests, compilers, checkers
    REWARD_MODEL = "reward_model"  # tenant-uploaded weights
    ENVIRONMENT = "environment"  # stateful, multi-step
    INVALID = "invalid"  # not a reward artifact at all


#: The sandbox tier an artifact kind runs in. ``function`` and ``verifier`` are built;
#: ``reward_model`` (own inference pool, digest pinning) and ``environment`` (per-run
#: isolation with reset/teardown in the contract) are declared so the boundary fits them.
Tier = Literal["function", "verifier", "reward_model", "environment"]
BUILT_TIERS: tuple[Tier, ...] = ("function", "verifier")
#: Tiers whose code is known to run further code: a fresh sandbox per batch. (Every built
#: tier requires the same isolation layers: :data:`sandbox.features.REQUIRED_LAYERS`.)
HOSTILE_TIERS: frozenset[str] = frozenset({"verifier", "environment"})


class Cause(enum.StrEnum):
    """The ledger columns. Every attempt is booked to exactly one of them."""

    OK = "ok"
    TENANT_TIMEOUT = "tenant_timeout"
    TENANT_CRASH = "tenant_crash"
    TENANT_BAD_OUTPUT = "tenant_bad_output"
    TENANT_RESOURCE_EXCEEDED = "tenant_resource_exceeded"
    TENANT_BAD_ARTIFACT = "tenant_bad_artifact"  # not a reward artifact: refused unscored
    PLATFORM_ERROR = "platform_error"
    BAD_INPUT = "bad_input"  # the caller's batch cannot cross the boundary: refused unsent


class AttemptStatus(enum.StrEnum):
    """How one attempt in a worker ended (the SandboxFusion-style status)."""

    FINISHED = "finished"  # scores came back and passed the gate
    FAILED = "failed"  # booked to a tenant or platform cause


class OutcomeStatus(enum.StrEnum):
    """What the caller does with a batch after the failure policy ran."""

    OK = "ok"  # use ``scores``
    FAILED = "failed"  # retries exhausted: no scores; the caller must not train on it
    SKIPPED = "skipped"  # policy ``skip``: exclude the batch from the update
    PAUSED = "paused"  # policy ``pause``: stop the run for tenant action
    #: not run at all: the tier cannot run here (missing kernel feature), the artifact is
    #: refused before scoring (tenant_bad_artifact), or the batch is (bad_input)
    REFUSED = "refused"


#: Failure policies (seed 002, step 2): never a substituted constant.
PolicyName = Literal["retry", "skip", "pause"]

#: Isolation layers the sandbox stacks; the feature probe reports which are usable.
Layer = Literal[
    "unprivileged_uid",
    "empty_env",
    "user_ns",
    "mount_ns",
    "net_ns",
    "pid_ns",
    "own_pid1",
    "proc_masked",
    "seccomp",
    "rlimits",
    "cgroup_pids",
    "cgroup_memory",
    "cgroup_cpu",
    "cgroup_blkio",
    "scratch_tmpfs",
]
#: Every layer, in the order of :data:`Layer` (derived from it: one closed set, said once).
ALL_LAYERS: tuple[Layer, ...] = get_args(Layer)


@dataclass(frozen=True, slots=True)
class ResourceLimits:
    """The resource contract of one worker. Memory caps apply per worker (process tree).

    ``cpu_seconds`` bounds the CPU of the worker's whole tree over its whole life (a
    recycled function-tier worker accumulates CPU across its batches, and so do the
    processes its batches fork): the host reads the tree's cgroup CPU time
    (``cpuacct.usage``) every 0.1 s while a batch or the import runs and after each reply;
    over the limit, the batch fails ``tenant_resource_exceeded`` and the worker is
    retired. RLIMIT_CPU (the same value) bounds each process on top. Without a cpu or
    cpuacct cgroup only RLIMIT_CPU holds: a limit per process, not per tree. The per-batch
    bound is ``deadline_s``, wall clock, measured on the host. ``cpu_cores`` is the rate
    cap (cgroup CFS quota: ``cpu_cores`` x 100 ms of CPU per 100 ms period for the
    worker's whole tree), so a tenant thread left spinning can never take more than that
    share of the host.

    ``disk_read_bps`` and ``disk_read_iops`` cap the tree's reads from every host block
    device (cgroup v1 ``blkio.throttle.read_bps_device``/``read_iops_device``): the
    shared ``/usr`` is the host's disk, so page-cache misses (a tenant streaming ``/usr``
    through its memory cap) would otherwise take the disk's whole bandwidth from the
    trainer's checkpoints and the other tenants (security review, 2026-11-28, second
    round). ``O_DIRECT`` is refused by the seccomp filter on top.
    """

    deadline_s: float = 10.0
    memory_bytes: int = 512 * 1024 * 1024  # RLIMIT_AS and the memory cgroup
    cpu_seconds: int = 120
    cpu_cores: float = 1.0  # cgroup cpu.cfs_quota_us / cpu.cfs_period_us
    open_files: int = 64
    file_size_bytes: int = 16 * 1024 * 1024
    pids: int = 32  # cgroup pids.max, else RLIMIT_NPROC under the worker's own uid
    disk_read_bps: int = 64 * 1024 * 1024  # cgroup blkio read bytes/s per block device
    disk_read_iops: int = 2000  # cgroup blkio read operations/s per block device
    scratch_bytes: int = 64 * 1024 * 1024  # tmpfs size of the private scratch
    max_output_bytes: int = 1024 * 1024  # largest reply frame accepted from the worker
    startup_s: float = 10.0  # spawn + handshake + tenant import


@dataclass(frozen=True, slots=True)
class ScoreRange:
    """Declared range of valid scores (inclusive)."""

    lo: float = -1e6
    hi: float = 1e6


@dataclass(frozen=True, slots=True)
class SandboxConfig:
    """How workers for one tenant artifact are built and recycled.

    ``layers`` lists the isolation layers to apply; the default is all of them. Every
    built tier refuses to start unless each layer without an equivalent fallback is both
    requested and usable on this kernel (see :mod:`sandbox.features`): the tier comes from
    a scan of the tenant's own code, so it picks recycling and the failure policy, never
    how much isolation. Only layers with a fallback (the cgroups) may
    be dropped, and each batch outcome names them. Proofs that one layer alone holds
    (tests) start a :class:`sandbox.worker.SandboxWorker` directly, below the gate.
    """

    tier: Tier = "function"
    limits: ResourceLimits = field(default_factory=ResourceLimits)
    score_range: ScoreRange = field(default_factory=ScoreRange)
    layers: frozenset[str] = frozenset(ALL_LAYERS)
    warm_workers: int = 1  # ready workers kept per pool
    recycle_every: int = 50  # function tier: batches per worker (verifier tier: always 1)
    tenant_concurrency: int = 2  # concurrent batches per tenant, process-wide
    worker_python: str = ""  # interpreter inside the sandbox; "" = auto (/usr/bin/python3)

    def batches_per_worker(self) -> int:
        return 1 if self.tier in HOSTILE_TIERS else max(1, self.recycle_every)


@dataclass(frozen=True, slots=True)
class AttemptResult:
    """One attempt to score one batch in one worker. Never an exception."""

    status: AttemptStatus
    cause: Cause
    scores: tuple[float, ...] | None
    duration_s: float
    message: str = ""
    examples: tuple[str, ...] = ()
    #: not the tenant's attempt: its worker was killed from outside the sandbox (found
    #: dead while stopped, before tenant code could run, or its bubblewrap monitor killed
    #: by a signal, which nothing inside can send), with no cgroup or rlimit evidence
    #: against the tenant. Cause ``platform_error``; the client first retries it on a
    #: fresh worker without booking it
    killed_outside: bool = False

    @property
    def ok(self) -> bool:
        return self.status is AttemptStatus.FINISHED

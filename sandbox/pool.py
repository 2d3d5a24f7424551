"""Warm pools of sandbox workers, one pool per (tenant, artifact); never shared.

A pool keeps ``config.warm_workers`` handshaken workers ready (a background thread
pre-spawns them) so a batch pays only the RPC round trip. Recycling:

- verifier tier (hostile): a worker serves exactly one batch, then the whole sandbox —
  processes, scratch tmpfs, cgroups — is destroyed; the next batch takes a fresh one.
- function tier: a worker serves up to ``config.recycle_every`` batches; between batches
  the host kills any process the tenant left behind and empties scratch.
- any failed attempt retires its worker.

Pre-spawning runs tenant code (the artifact's import), so it stops when no batch is
wanted: :meth:`WarmPool.suspend` (the client's policy pause) retires the ready workers,
calls off the pool's own start-ups in flight and pre-spawns nothing until
:meth:`WarmPool.resume`. Failed background start-ups back off (5 s, 10 s, 20 s, ... at
most 60 s), and after :data:`MAX_BACKGROUND_FAILURES` in a row the pool stops pre-spawning
until a start-up succeeds (a batch's own, inline) or ``resume()``: an artifact whose
import never finishes then runs only when a batch asks for it.

Teardown runs on a reaper thread so it is off the batch's critical path. Per-tenant
concurrency: :func:`tenant_slot` is a process-wide semaphore per tenant (cap taken from the
first config that names the tenant, or set with :func:`set_tenant_cap`); a batch waits for
a slot, so one tenant cannot occupy more than its cap of workers at once.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import queue
import threading
import time
from collections.abc import Iterator

from sandbox.features import KernelFeatures
from sandbox.isolation import ArtifactBundle, reap_stale, unstage_artifact
from sandbox.types import AttemptResult, SandboxConfig
from sandbox.worker import SandboxWorker

log = logging.getLogger("runwatch.sandbox")

_TENANT_LOCK = threading.Lock()
_TENANT_SLOTS: dict[str, threading.BoundedSemaphore] = {}

#: Background start-ups that may fail in a row before the pool stops pre-spawning.
MAX_BACKGROUND_FAILURES = 3
BACKOFF_BASE_S = 5.0
BACKOFF_MAX_S = 60.0


def backoff_s(failures: int) -> float:
    """Seconds to wait before the next background start-up after ``failures`` (>= 1)
    failed in a row: 5, 10, 20, 40, then 60."""
    return min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2 ** max(0, failures - 1))


def set_tenant_cap(tenant_id: str, cap: int) -> None:
    """(Re)define a tenant's concurrency cap; batches already running keep their slots."""
    with _TENANT_LOCK:
        _TENANT_SLOTS[tenant_id] = threading.BoundedSemaphore(max(1, cap))


@contextlib.contextmanager
def tenant_slot(tenant_id: str, cap: int) -> Iterator[None]:
    with _TENANT_LOCK:
        sem = _TENANT_SLOTS.get(tenant_id)
        if sem is None:
            sem = _TENANT_SLOTS[tenant_id] = threading.BoundedSemaphore(max(1, cap))
    sem.acquire()
    try:
        yield
    finally:
        sem.release()


class _Reaper:
    """One daemon thread closing retired workers off the critical path."""

    def __init__(self) -> None:
        self._q: queue.SimpleQueue[SandboxWorker | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._pending = 0

    def submit(self, worker: SandboxWorker) -> None:
        with self._lock:
            self._pending += 1
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="sandbox-reaper", daemon=True
                )
                self._thread.start()
        self._q.put(worker)

    def _run(self) -> None:
        while True:
            w = self._q.get()
            if w is None:
                return
            try:
                w.close()
            finally:
                with self._lock:
                    self._pending -= 1

    def drain(self, timeout: float = 10.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self._lock:
                if self._pending == 0:
                    return
            time.sleep(0.005)


REAPER = _Reaper()


@functools.lru_cache(maxsize=1)
def _reap_once() -> int:
    return reap_stale()


class WarmPool:
    """Ready workers for one tenant artifact. Methods never raise."""

    def __init__(
        self,
        bundle: ArtifactBundle,
        config: SandboxConfig,
        tenant_id: str,
        features: KernelFeatures,
        *,
        prewarm: bool = True,
    ) -> None:
        self.bundle = bundle
        self.config = config
        self.tenant_id = tenant_id
        self.features = features
        self.prewarm = prewarm and config.warm_workers > 0
        self._ready: list[SandboxWorker] = []
        self._spawning = 0
        # busy workers expected back after their batch (function tier): they count
        # towards the warm target, so a reusable worker is not shadowed by a spare one
        self._returning: dict[int, SandboxWorker] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._suspended = False  # suspend(): no pre-spawn, no worker kept, until resume()
        self._backoff_until = 0.0
        self._failed_spawns = 0  # background spawns that failed, and the last failure
        self._last_failure: AttemptResult | None = None
        self._failed_in_a_row = 0  # background spawns failed since the last success
        self._gave_up = False  # too many in a row: no pre-spawn until a start succeeds
        self._starting: set[SandboxWorker] = set()  # background start-ups in flight
        self._thread: threading.Thread | None = None
        self.spawned = 0
        _reap_once()
        if self.prewarm:
            self._thread = threading.Thread(
                target=self._refill, name=f"sandbox-pool-{tenant_id}", daemon=True
            )
            self._thread.start()

    def _spawn(
        self, *, background: bool = False
    ) -> tuple[SandboxWorker | None, AttemptResult | None]:
        """Start one worker. A background one is tracked while it starts, so
        :meth:`suspend` and :meth:`close` can call it off."""
        self.spawned += 1
        created: list[SandboxWorker] = []

        def track(w: SandboxWorker) -> None:
            created.append(w)
            self._track(w)

        worker, failure = SandboxWorker.spawn(
            self.config,
            self.tenant_id,
            self.bundle,
            self.features,
            on_create=track if background else None,
        )
        if created:
            with self._cond:
                self._starting.difference_update(created)
        if failure is not None and any(w.aborted for w in created):
            # called off by suspend() or close(): no failure of the artifact's, whatever
            # the pool's state when it returns (found in CI: a resume() right after the
            # suspend() counted the killed start-up, and the next batch was handed its
            # "worker did not start" as its own failure, booked to the platform)
            return None, None
        return worker, failure

    def _track(self, worker: SandboxWorker) -> None:
        """Note a background start-up; called off at once if the pool stopped meanwhile."""
        with self._cond:
            self._starting.add(worker)
            stop = self._closed or self._suspended
        if stop:
            worker.abort()

    def _wants_spawn(self) -> bool:
        """Whether the refill thread should start a worker now (lock held)."""
        if self._suspended or self._gave_up or time.monotonic() < self._backoff_until:
            return False
        have = len(self._ready) + self._spawning + self._returning_fresh()
        return have < self.config.warm_workers

    def _refill(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._wants_spawn():
                    wait = max(0.0, self._backoff_until - time.monotonic()) or None
                    self._cond.wait(timeout=wait)
                if self._closed:
                    return
                self._spawning += 1
            worker, failure = self._spawn(background=True)
            with self._cond:
                self._spawning -= 1
                stopped = self._closed or self._suspended
                if worker is not None and not stopped:
                    self._ready.append(worker)
                    self._spawn_succeeded()
                    worker = None
                elif failure is not None and not stopped:
                    # e.g. the artifact crashes at import; a caller waiting for this spawn
                    # gets its failure (acquire()). A start-up called off by suspend() or
                    # close() is no failure of the artifact's: not counted
                    self._spawn_failed(failure)
                self._cond.notify_all()
            if worker is not None:
                REAPER.submit(worker)

    def _spawn_succeeded(self) -> None:
        """A start-up worked: pre-spawn again at once (lock held)."""
        self._backoff_until = 0.0
        self._failed_in_a_row = 0
        self._gave_up = False

    def _spawn_failed(self, failure: AttemptResult) -> None:
        """A background start-up failed: back off, and give up after too many (lock held)."""
        self._failed_spawns += 1
        self._last_failure = failure
        self._failed_in_a_row += 1
        self._backoff_until = time.monotonic() + backoff_s(self._failed_in_a_row)
        if self._failed_in_a_row >= MAX_BACKGROUND_FAILURES and not self._gave_up:
            self._gave_up = True
            log.warning(
                "tenant %s: %d start-ups in a row failed (last: %s: %s); no more pre-spawning "
                "until a batch's own start-up succeeds",
                self.tenant_id,
                self._failed_in_a_row,
                failure.cause.value,
                failure.message[-200:],
            )

    def _returning_fresh(self) -> int:
        """Busy workers that will come back with more than half their batches left: a
        worker past half-life no longer counts, so its successor is spawned ahead of time
        and a recycle never stalls a batch."""
        half = self.config.batches_per_worker() // 2
        return sum(
            1
            for w in self._returning.values()
            if self.config.batches_per_worker() - w.batches > half
        )

    def _take(self) -> SandboxWorker:
        """Pop a ready worker (lock held) and note whether it will come back."""
        w = self._ready.pop(0)
        if w.batches + 1 < self.config.batches_per_worker():
            self._returning[id(w)] = w
        self._cond.notify_all()
        return w

    def acquire(self) -> tuple[SandboxWorker | None, AttemptResult | None]:
        """A ready worker, else one spawned inline (its failure is returned, never raised)."""
        with self._cond:
            if self._ready:
                return self._take(), None
            if self._spawning and self.prewarm:
                # a warm worker is on its way: waiting for it beats a second spawn
                failed = self._failed_spawns
                # its start-up deadline, and the teardown of a failed start on top
                end = time.monotonic() + self.config.limits.startup_s + 5.0
                while not self._ready and self._spawning and time.monotonic() < end:
                    self._cond.wait(timeout=end - time.monotonic())
                if self._ready:
                    return self._take(), None
                if self._failed_spawns > failed and self._last_failure is not None:
                    # the spawn waited for failed (an artifact that loops or exits at
                    # import): that is this attempt's failure, not a reason to wait for
                    # a second start-up deadline inline
                    return None, self._last_failure
        worker, failure = self._spawn()
        if worker is not None:
            with self._cond:
                self._spawn_succeeded()
                if worker.batches + 1 < self.config.batches_per_worker():
                    self._returning[id(worker)] = worker
                self._cond.notify_all()
        return worker, failure

    def release(self, worker: SandboxWorker, healthy: bool) -> None:
        """Return a worker after a batch: recycle, keep, or retire it."""
        with self._cond:
            self._returning.pop(id(worker), None)
        keep = (
            healthy
            and not (self._closed or self._suspended)
            and worker.batches < self.config.batches_per_worker()
            and worker.reset_between_batches()
        )
        if keep:
            with self._cond:
                # front: the oldest worker serves first; one spare may wait behind it
                if not (self._closed or self._suspended) and len(self._ready) <= max(
                    1, self.config.warm_workers
                ):
                    self._ready.insert(0, worker)
                    self._cond.notify_all()
                    return
        REAPER.submit(worker)
        with self._cond:
            self._cond.notify_all()

    def suspend(self) -> None:
        """No tenant code runs for this pool until :meth:`resume`: pre-spawning stops, the
        ready workers are retired and the pool's own start-ups in flight are called off
        (their import is tenant code). A batch already running finishes; a worker it
        returns is retired. Never raises."""
        for w in self._stop_workers(suspend=True):
            REAPER.submit(w)

    def _stop_workers(self, *, suspend: bool) -> list[SandboxWorker]:
        """Mark the pool suspended (or closed), call off its start-ups in flight and hand
        the caller its ready workers to retire (taken under the lock, acted on outside)."""
        with self._cond:
            if suspend:
                self._suspended = True
            else:
                self._closed = True
            ready, self._ready = self._ready, []
            starting = list(self._starting)
            self._cond.notify_all()
        for w in starting:
            w.abort()
        return ready

    def resume(self) -> None:
        """Pre-spawn again, from a clean slate (no backoff, no give-up)."""
        with self._cond:
            self._suspended = False
            self._spawn_succeeded()
            self._cond.notify_all()

    @property
    def suspended(self) -> bool:
        return self._suspended

    def close(self) -> None:
        """Stop pre-spawning, destroy every worker, remove the staged artifact."""
        ready = self._stop_workers(suspend=False)
        try:
            if self._thread is not None:
                self._thread.join(timeout=self.config.limits.startup_s + 1)
            for w in ready:
                w.close()
            REAPER.drain()
        finally:
            unstage_artifact(self.bundle)

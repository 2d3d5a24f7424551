"""The trainer's one door to tenant reward code: a typed client over warm sandbox pools.

API (everything the trainer needs; nothing here raises for tenant or kernel trouble)::

    from sandbox.client import RewardClient, FailurePolicy, OutcomeStatus

    client = RewardClient(
        "reward.py",                 # tenant artifact defining reward(batch) -> list[float]
        tenant_id="acme",
        run_id="run-7",              # envelope of the events it builds
        tier=None,                   # None: classify the artifact (function | verifier)
        policy=None,                 # None: tier default; or FailurePolicy("skip"),
                                     #   FailurePolicy("pause"), FailurePolicy("retry",
                                     #   retries=2, then="skip")
        config=None,                 # SandboxConfig: limits, score range, warm workers, layers
        canaries=None,               # CanarySet: held-out probes in every batch, a verdict
                                     #   on those of the last k batches every k-th batch
    )
    outcome = client.score(batch, step=812)   # batch: [{"prompt": str, "completion": str, ...}]
    outcome.status      # OutcomeStatus.OK | SKIPPED | PAUSED | REFUSED
    outcome.scores      # tuple[float, ...] (len(batch), finite, in range) if OK, else None
    outcome.cause       # Cause: ok | tenant_timeout | tenant_crash | tenant_bad_output
                        #        | tenant_resource_exceeded | tenant_bad_artifact
                        #        | platform_error | bad_input (last attempt)
    outcome.duration_s, outcome.message, outcome.attempt, outcome.attempts (per attempt)
    events = client.outcome_events(outcome)   # RewardBatchScored / RewardBatchFailed (one per
                                              # attempt) / CanaryProbeScored: append to the log
    client.ledger.as_dict()                   # per-cause counters of this client
    client.paused / client.resume()           # policy "pause" stops scoring until resume()
    client.close()                            # or: with RewardClient(...) as client: ...

Semantics:

- Tenant code runs only in sandbox workers (see :mod:`sandbox.worker`), never in the
  caller's process; batches cross a length-prefixed JSON boundary.
- A batch's scores are either exactly the tenant's gated scores or ``None``. No constant
  is ever substituted: on failure the policy decides — ``retry`` (up to ``retries`` more
  attempts, then ``then``: skip or pause), ``skip`` (exclude the batch), ``pause`` (stop the
  run for tenant action; later calls return PAUSED without running tenant code, and the
  warm pool is suspended — ready workers retired, no pre-spawn, which would import the
  artifact — until ``resume()``; a call already in flight in another thread finishes).
- A worker killed from outside the sandbox, with no evidence against the tenant (found
  dead while it waited stopped, or bubblewrap's monitor killed by a signal; see
  :mod:`sandbox.worker`), is not the tenant's attempt: the batch goes to a fresh worker,
  unbooked; ``platform_error`` if that happens ``OUTSIDE_KILL_RETRIES`` + 1 times in a row.
- ``REFUSED``: nothing was run, for one of three reasons, each booked to whose it is:
  the artifact is not a reward artifact (does not parse or compile, no ``def reward(batch)``,
  larger than ``MAX_ARTIFACT_BYTES`` or too complex for the bounded parser — classified
  before scoring, :mod:`sandbox.classify`): ``tenant_bad_artifact``; the
  caller's batch cannot cross the JSON boundary (NaN, a non-JSON value, not a list of
  ``{prompt: str, completion: str, ...}``, too large — :mod:`sandbox.batch`): ``bad_input``,
  the caller's, neither the tenant's nor dropped silently; this host cannot run the tier
  safely (a missing isolation layer for a hostile tier, a tier not built, an unreadable
  file): ``platform_error``, logged as an error.
- Text from tenant code (exception messages, tracebacks, offending values) is cleaned at
  this boundary (:func:`sandbox.text.clean_text`: bounded, valid UTF-8, controls and bidi
  characters escaped) in every ``AttemptRecord`` and ``ScoreOutcome``, so it can become an
  event and reach a terminal.
- Defaults per tier: function -> retry 2 then skip, recycle every 50 batches;
  verifier -> skip, fresh sandbox per batch.
- Thread-safe: concurrent ``score`` calls run in parallel up to the tenant's cap.
"""

from __future__ import annotations

import logging
import random
import statistics
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from sandbox.batch import MAX_BATCH_BYTES, validate_batch
from sandbox.classify import ArtifactTooLarge, Classification, classify_path
from sandbox.features import KernelFeatures, probe, tier_gate
from sandbox.integrity import (
    CanaryProbe,
    CanarySet,
    CanaryVerdict,
    DegenerateState,
    apply_degenerate,
    judge_canaries,
    mix_canaries,
    split_canaries,
)
from sandbox.isolation import stage_artifact
from sandbox.ledger import Ledger
from sandbox.pool import WarmPool, tenant_slot
from sandbox.text import EXAMPLE_LIMIT, MESSAGE_LIMIT, clean_text
from sandbox.types import (
    BUILT_TIERS,
    ArtifactKind,
    AttemptResult,
    Cause,
    OutcomeStatus,
    PolicyName,
    SandboxConfig,
    Tier,
)

log = logging.getLogger("runwatch.sandbox")

#: Fresh workers tried, unbooked, for a batch whose worker was killed from outside.
OUTSIDE_KILL_RETRIES = 2

__all__ = [
    "AttemptRecord",
    "Cause",
    "FailurePolicy",
    "OutcomeStatus",
    "RewardClient",
    "ScoreOutcome",
    "default_policy",
]


@dataclass(frozen=True)
class FailurePolicy:
    """What to do when an attempt fails. ``then`` applies once retries are exhausted."""

    name: PolicyName
    retries: int = 2
    then: Literal["skip", "pause"] = "skip"

    def attempts(self) -> int:
        return 1 + max(0, self.retries) if self.name == "retry" else 1

    def final_action(self) -> Literal["skip", "pause"]:
        if self.name == "pause":
            return "pause"
        if self.name == "skip":
            return "skip"
        return self.then


def default_policy(tier: str) -> FailurePolicy:
    return FailurePolicy("retry", retries=2) if tier == "function" else FailurePolicy("skip")


@dataclass(frozen=True)
class AttemptRecord:
    """One attempt as booked. ``message`` and ``examples`` are cleaned on construction
    (:func:`sandbox.text.clean_text`): whatever the tenant said is safe to carry."""

    attempt: int
    cause: Cause
    duration_s: float
    message: str
    action: Literal["ok", "retry", "skip", "pause"]
    examples: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "message", clean_text(self.message, MESSAGE_LIMIT))
        examples = tuple(clean_text(x, EXAMPLE_LIMIT) for x in tuple(self.examples)[:3])
        object.__setattr__(self, "examples", examples)


@dataclass(frozen=True)
class ScoreOutcome:
    """The result of one ``score`` call. See the module docstring."""

    status: OutcomeStatus
    scores: tuple[float, ...] | None
    cause: Cause
    duration_s: float
    message: str
    attempt: int
    batch_id: str
    tier: str
    n: int
    step: int | None = None
    attempts: tuple[AttemptRecord, ...] = ()
    degenerate: bool = False
    constant_rate: float = 0.0
    canary: CanaryVerdict | None = None
    missing_layers: tuple[str, ...] = ()
    ts: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        object.__setattr__(self, "message", clean_text(self.message, MESSAGE_LIMIT))

    @property
    def ok(self) -> bool:
        return self.status is OutcomeStatus.OK


class RewardClient:
    """Scores batches with one tenant artifact in its own warm sandbox pool."""

    def __init__(
        self,
        artifact_path: str | Path,
        tenant_id: str,
        *,
        run_id: str = "",
        tier: Tier | None = None,
        policy: FailurePolicy | None = None,
        config: SandboxConfig | None = None,
        canaries: CanarySet | None = None,
        features: KernelFeatures | None = None,
        producer: str = "sandbox",
        rng: random.Random | None = None,
        prewarm: bool = True,
    ) -> None:
        self.artifact_path = Path(artifact_path)
        self.tenant_id = tenant_id
        self.run_id = run_id
        self.producer = producer
        try:
            self.classification = classify_path(self.artifact_path)
        except Exception as exc:  # classify_path should not raise; never let it escape
            self.classification = Classification(
                ArtifactKind.INVALID, None, "", (f"classification failed: {exc!r}",), False
            )
        chosen: str | None = tier or self.classification.tier
        self.config = replace(config or SandboxConfig(), tier=chosen or "function")
        self.tier: str = chosen or "invalid"
        self.policy = policy or default_policy(self.tier)
        self.canaries = canaries
        self.ledger = Ledger()
        #: where probes are drawn and placed: the system's entropy unless the caller
        #: gives one (a seed the tenant could know would tell it where the probes are)
        self._rng = rng or random.SystemRandom()
        self._canary_scores: tuple[float, ...] = ()
        self._canary_probes: tuple[CanaryProbe, ...] = ()
        self._canary_batches = 0
        self._lock = threading.Lock()
        from events.envelope import Stamper

        #: the envelopes of this scorer's facts (``events.envelope.Stamper``, what the
        #: emitter SDK stamps with: the sandbox may not import ``producers``); seq from 1
        self._stamper = Stamper(tenant_id=tenant_id, run_id=run_id, producer=producer, first_seq=1)
        self._batches = 0
        self._degenerate = DegenerateState()
        self._paused: AttemptRecord | None = None
        self._pool: WarmPool | None = None
        self._refusal = ""
        self._refusal_cause = Cause.PLATFORM_ERROR
        self.missing_layers: tuple[str, ...] = ()
        self.artifact_digest = self.classification.digest
        try:
            self._open(features, prewarm)
        except Exception as exc:
            self._refusal = clean_text(f"sandbox could not start: {exc!r}")
            self._refusal_cause = Cause.PLATFORM_ERROR
            log.error("%s", self._refusal)

    def _open(self, features: KernelFeatures | None, prewarm: bool) -> None:
        if self.classification.kind is ArtifactKind.INVALID:
            # classified before scoring: the tenant's file is not a reward artifact (an
            # explicit tier does not make it one); a file the platform could not read
            # is the platform's
            why = "; ".join(self.classification.reasons)
            self._refusal = clean_text(f"invalid artifact: {why}")
            self._refusal_cause = (
                Cause.TENANT_BAD_ARTIFACT if self.classification.readable else Cause.PLATFORM_ERROR
            )
            log.warning("SANDBOX REFUSED the artifact: %s", self._refusal)
            return
        if self.tier not in BUILT_TIERS:
            self._refusal = f"tier {self.tier!r} is not built yet (function and verifier are)"
            return
        if self.tier == "function" and self.classification.tier == "verifier":
            log.warning("artifact classified verifier but run in the function tier as asked")
        feats = features or probe()
        gate = tier_gate(feats, self.tier, self.config.layers)
        self.missing_layers = gate.missing
        if not gate.allowed:
            self._refusal = gate.message
            log.error("SANDBOX REFUSED: %s", gate.message)
            return
        if gate.message:
            log.warning("SANDBOX DEGRADED: %s", gate.message)
        try:
            bundle = stage_artifact(self.artifact_path)
        except ArtifactTooLarge as exc:  # it grew after it was classified: still the tenant's
            self._refusal = clean_text(f"invalid artifact: {exc}")
            self._refusal_cause = Cause.TENANT_BAD_ARTIFACT
            log.warning("SANDBOX REFUSED the artifact: %s", self._refusal)
            return
        self.artifact_digest = bundle.digest
        self._pool = WarmPool(bundle, self.config, self.tenant_id, feats, prewarm=prewarm)

    # -- scoring ------------------------------------------------------------------------

    @property
    def paused(self) -> bool:
        return self._paused is not None

    @property
    def refused(self) -> str:
        """Why this client refuses to run tenant code ("" when it runs)."""
        return self._refusal

    def resume(self) -> None:
        """Lift a policy pause (after the tenant fixed their artifact, say): the warm pool
        pre-spawns again."""
        self._paused = None
        if self._pool is not None:
            self._pool.resume()

    def score(
        self, batch: list[dict[str, Any]], *, batch_id: str | None = None, step: int | None = None
    ) -> ScoreOutcome:
        """Score one batch. Never raises; see :class:`ScoreOutcome`."""
        started = time.monotonic()
        batch_id = batch_id or uuid.uuid4().hex
        n = len(batch) if isinstance(batch, list) else 0
        base = dict(
            batch_id=batch_id, tier=self.tier, n=n, step=step, missing_layers=self.missing_layers
        )
        try:
            return self._score(batch, started, base)
        except Exception as exc:
            self.ledger.book(Cause.PLATFORM_ERROR)
            rec = AttemptRecord(
                1, Cause.PLATFORM_ERROR, time.monotonic() - started, f"sandbox bug: {exc!r}", "skip"
            )
            return ScoreOutcome(
                OutcomeStatus.SKIPPED,
                None,
                Cause.PLATFORM_ERROR,
                time.monotonic() - started,
                rec.message,
                1,
                attempts=(rec,),
                **base,
            )

    def _refused(
        self,
        cause: Cause,
        msg: str,
        started: float,
        base: dict[str, Any],
        examples: tuple[str, ...] = (),
    ) -> ScoreOutcome:
        """Nothing ran: one attempt record (the event's), booked to ``cause``."""
        self.ledger.book(cause)
        rec = AttemptRecord(1, cause, 0.0, msg, "skip", examples)
        return ScoreOutcome(
            OutcomeStatus.REFUSED,
            None,
            cause,
            time.monotonic() - started,
            msg,
            0,
            attempts=(rec,),
            **base,
        )

    def _score(self, batch: Any, started: float, base: dict[str, Any]) -> ScoreOutcome:
        if self._refusal or self._pool is None:
            cause = self._refusal_cause if self._refusal else Cause.PLATFORM_ERROR
            examples = self.classification.reasons if cause is Cause.TENANT_BAD_ARTIFACT else ()
            return self._refused(cause, self._refusal or "sandbox closed", started, base, examples)
        if self._paused is not None:
            p = self._paused
            msg = f"run paused by the failure policy after {p.cause.value}: {p.message}"
            return ScoreOutcome(
                OutcomeStatus.PAUSED,
                None,
                p.cause,
                time.monotonic() - started,
                msg[:2000],
                0,
                **base,
            )
        # the whole batch, before anything is sent: one the platform cannot encode is the
        # caller's bad input, never a dead worker booked to the tenant
        bad = validate_batch(batch, max_bytes=self._max_batch_bytes())
        if bad:
            return self._refused(Cause.BAD_INPUT, f"invalid batch: {bad}", started, base)
        with self._lock:
            self._batches += 1
            # every batch carries probes (a batch one group longer only now and then is
            # a canary batch to any reward that counts its items); the verdict comes every
            # ``every``-th batch, over the probes of the batches since the last one
            use_canaries = self.canaries is not None and (
                bool(self.canaries.probes) or self.canaries.draw is not None
            )
            positions: tuple[int, ...] = ()
            probes: tuple[CanaryProbe, ...] = ()
            sent = batch
            if use_canaries:
                assert self.canaries is not None
                try:
                    probes = self.canaries.probes_for(batch, self._rng)
                except Exception as exc:  # the caller's probe source: score without
                    log.error("canary probes not drawn: %r", exc)
            if probes:
                assert self.canaries is not None
                sent, positions = mix_canaries(batch, probes, self._rng, self.canaries.group)
        if positions and validate_batch(sent, max_bytes=self._max_batch_bytes()):
            # the platform's own probes do not encode: score the batch without them
            log.error("canary probes dropped: %s", validate_batch(sent))
            sent, positions, probes = batch, (), ()

        records: list[AttemptRecord] = []
        result: AttemptResult | None = None
        max_attempts = self.policy.attempts()
        with tenant_slot(self.tenant_id, self.config.tenant_concurrency):
            for attempt in range(1, max_attempts + 1):
                result = self._attempt(sent)
                self.ledger.book(result.cause)
                if result.ok:
                    records.append(AttemptRecord(attempt, Cause.OK, result.duration_s, "", "ok"))
                    break
                action: Literal["retry", "skip", "pause"] = (
                    "retry" if attempt < max_attempts else self.policy.final_action()
                )
                records.append(
                    AttemptRecord(
                        attempt,
                        result.cause,
                        result.duration_s,
                        result.message,
                        action,
                        result.examples or _input_examples(batch, result.cause),
                    )
                )
        assert result is not None
        duration = time.monotonic() - started
        last = records[-1]
        if not result.ok or result.scores is None:
            status = OutcomeStatus.PAUSED if last.action == "pause" else OutcomeStatus.SKIPPED
            if status is OutcomeStatus.PAUSED:
                self._pause(last)
            return ScoreOutcome(
                status,
                None,
                last.cause,
                duration,
                last.message,
                last.attempt,
                attempts=tuple(records),
                **base,
            )
        scores = result.scores
        verdict: CanaryVerdict | None = None
        if positions:
            scores, probe_scores = split_canaries(scores, positions)
            verdict = self._canary_verdict(probe_scores, probes)
        with self._lock:
            self._degenerate, report = apply_degenerate(self._degenerate, scores)
        if report.flagged:
            log.warning(
                "tenant %s: degenerate rewards (constant for %d batches)",
                self.tenant_id,
                self._degenerate.window,
            )
        return ScoreOutcome(
            OutcomeStatus.OK,
            scores,
            Cause.OK,
            duration,
            "",
            last.attempt,
            attempts=tuple(records),
            degenerate=report.flagged,
            constant_rate=report.constant_rate,
            canary=verdict,
            **base,
        )

    def _canary_verdict(
        self, probe_scores: tuple[float, ...], probes: tuple[CanaryProbe, ...]
    ) -> CanaryVerdict | None:
        """This batch's probe scores added to those since the last verdict; a verdict on
        all of them every ``canaries.every``-th scored batch, None in between. (A batch
        that failed carried its probes nowhere: they are not counted.)"""
        assert self.canaries is not None
        with self._lock:
            self._canary_scores += probe_scores
            self._canary_probes += probes
            self._canary_batches += 1
            if self._canary_batches < max(1, self.canaries.every):
                return None
            scores, used = self._canary_scores, self._canary_probes
            self._canary_scores, self._canary_probes, self._canary_batches = (), (), 0
        return judge_canaries(self.canaries, scores, used)

    def _pause(self, last: AttemptRecord) -> None:
        """Pause by policy: no tenant code runs until :meth:`resume` (the pool would
        otherwise keep importing the artifact to pre-spawn)."""
        self._paused = last
        if self._pool is not None:
            self._pool.suspend()

    def _max_batch_bytes(self) -> int:
        """A batch must fit the frame and, decoded, the worker's memory."""
        return max(1, min(MAX_BATCH_BYTES, self.config.limits.memory_bytes // 16))

    def _attempt(self, batch: list[dict[str, Any]]) -> AttemptResult:
        """One booked attempt. A worker killed from outside the sandbox with no evidence
        against the tenant (``killed_outside``: at its start or with this batch) is not
        an attempt: the batch goes to a fresh worker without a booking; after
        ``OUTSIDE_KILL_RETRIES`` more, it is the platform's error."""
        assert self._pool is not None
        result: AttemptResult | None = None
        for _ in range(1 + OUTSIDE_KILL_RETRIES):
            worker, failure = self._pool.acquire()
            if worker is None:
                assert failure is not None
                result = failure
            else:
                result = worker.score(batch)
                self._pool.release(worker, result.ok)
            if not result.killed_outside:
                return result
            log.warning(
                "tenant %s: %s; the batch goes to a fresh worker (not booked to the tenant)",
                self.tenant_id,
                result.message,
            )
        assert result is not None
        return result

    # -- publishing ---------------------------------------------------------------------

    def outcome_events(
        self, outcome: ScoreOutcome, *, run_id: str | None = None, step: int | None = None
    ) -> list[Any]:
        """The reward events of one outcome, in order: one ``RewardBatchFailed`` per failed
        attempt (cause + the action taken), then ``RewardBatchScored`` if it succeeded, then
        ``CanaryProbeScored`` if probes rode along. The caller appends them to the log."""
        from events.catalog.reward import (
            CanaryProbeScored,
            RewardBatchFailed,
            RewardBatchScored,
        )

        run = self.run_id if run_id is None else run_id
        st = outcome.step if step is None else step

        def env() -> dict[str, Any]:
            return self._stamper.stamp(step=st, ts=outcome.ts, run_id=run)

        out: list[Any] = []
        for rec in outcome.attempts:
            if rec.cause is Cause.OK:
                continue
            out.append(
                RewardBatchFailed(
                    **env(),
                    batch_id=outcome.batch_id,
                    tier=outcome.tier,
                    n=outcome.n,
                    cause=rec.cause.value,
                    message=rec.message[:2000],
                    action="skip" if rec.action == "ok" else rec.action,
                    duration_s=rec.duration_s,
                    attempt=rec.attempt,
                    examples=rec.examples,
                    artifact_digest=self.artifact_digest,
                )
            )
        if outcome.ok and outcome.scores is not None:
            s = outcome.scores
            out.append(
                RewardBatchScored(
                    **env(),
                    batch_id=outcome.batch_id,
                    tier=outcome.tier,
                    n=len(s),
                    score_mean=statistics.fmean(s),
                    score_std=statistics.pstdev(s),
                    score_min=min(s),
                    score_max=max(s),
                    duration_s=outcome.duration_s,
                    attempt=outcome.attempt,
                    degenerate=outcome.degenerate,
                    artifact_digest=self.artifact_digest,
                )
            )
        if outcome.canary is not None:
            c = outcome.canary
            out.append(
                CanaryProbeScored(
                    **env(),
                    n=c.n,
                    score_mean=c.score_mean,
                    expected_mean=c.expected_mean,
                    batch_id=outcome.batch_id,
                    tier=outcome.tier,
                    inflated=c.inflated,
                )
            )
        return out

    # -- life cycle ---------------------------------------------------------------------

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    def __enter__(self) -> RewardClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _input_examples(batch: Sequence[Mapping[str, Any]], cause: Cause) -> tuple[str, ...]:
    """For a tenant-side failure with no offending output to show (a timeout, a crash, a
    resource limit), the first inputs of the batch: what the customer needs to reproduce
    it. Platform errors attach nothing (the tenant's inputs are not the problem)."""
    if cause in (Cause.OK, Cause.PLATFORM_ERROR, Cause.BAD_INPUT):
        return ()
    out = []
    for item in list(batch)[:3]:
        prompt = str(item.get("prompt", ""))[:200]
        completion = str(item.get("completion", ""))[:200]
        out.append(f"prompt={prompt!r} completion={completion!r}")
    return tuple(out)

"""The resume gate (seed 001): a resumed run must be the same experiment, or not run.

For each candidate, newest checkpoint first (then the run's initial state, which the
config and seed reproduce exactly, as the last resort)::

    ResumeRequested
    schema != this trainer's          -> ResumeRejected(schema_mismatch)   stop: never loaded
    metadata/data digest or size bad  -> ResumeRejected(corrupt)           fall back one
    another run's / tenant's          -> ResumeRejected(corrupt, "not this run's checkpoint:
                                         ...")                             fall back one
    a pin differs from the run's      -> ResumeRejected(pin_mismatch, names the pin)  stop
    recorded metrics do not reach it  -> ResumeRejected(missing)           fall back one
    nothing recorded after it         -> ResumeRejected(no_overlap)        fall back one
    restore every part, replay steps checkpoint+1 .. last recorded step silently, compare
    with the TrainerStepCompleted records read back from the event log:
        within tolerance              -> ResumeCertified(window, tier, tolerance, max dev)
        otherwise                     -> ResumeRejected(deviation, max dev) fall back one

Whose checkpoint: the metadata's run id, tenant and submission (the run's ``RunSubmitted``
event id) must be this run's (:func:`trainer.checkpoint.identity_mismatch`; a checkpoint of
an earlier release, which records no tenant, is taken on its run id unless it was created
before this run was submitted). Another run's is never loaded nor moved: two runs sharing
one run directory (an explicit ``run_dir``; ``runwatch train``'s default is unique per log)
must not steer each other. The event's ``reason`` codes are the event catalog's; the
identity refusal uses ``corrupt`` (the checkpoint is not what this run's record says) and
its ``detail`` starts with :data:`NOT_THIS_RUN`.

What is compared, and under which settings (:mod:`trainer.settings`): the recorded steps
of the run's latest branch (a rollback abandons the records after its step), each
replayed under the settings an operator's resumes had put in effect when it was trained
(``lr``, ``kl_coef``, read from the answered commands), and the run goes on under the
settings in effect at the end of its record, not the submitted config's.

Rejected checkpoints of this run are set aside once the gate certifies an older one: every
checkpoint it fell back from (corrupt, missing, no_overlap, deviation) moves to
``<run_dir>/rejected/resume-<ns>/`` (kept for the audit), so the run never names one again
(a pause's checkpoint, the completed run's final checkpoint) and re-trained steps write
theirs fresh. Nothing is moved when the gate certifies nothing: a host that replays
differently (deviation everywhere) must not cost a later resume its checkpoints.

Tiers: ``bitwise`` compares every metric exactly (tolerance 0; deterministic CPU
kernels; vLLM on CPU samples bitwise the same for the same weights, seeds and batch, so
the vLLM engine keeps this tier there; on a GPU it does not promise that, and a run asking
for ``bitwise`` there is gated at ``statistical``, which the certification event says);
``statistical`` divides each metric's deviation by that metric's own step-to-step noise
(std of first differences over the recorded series / sqrt 2) and certifies while the
largest stays within ``band_k``; a metric with no noise at all must match exactly.

After certification the staleness rules run (rollouts not from the restored policy
version are discarded from the buffer; the fleet is re-synced and WeightSyncCompleted
published before the first new generation), then RunResumed, then training continues
past the crash point. Replayed steps are never re-published: the log keeps exactly one
record per step. Nothing here reads a clock except to time the replay for the usage
record.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from events.catalog.checkpoint import ResumeCertified, ResumeRejected, ResumeRequested
from events.catalog.lifecycle import (
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunResumed,
    RunSubmitted,
)
from events.catalog.trainer import TrainerStepCompleted, WeightSyncCompleted
from events.catalog.usage import UsageRecorded
from events.envelope import EventBase
from events.pauses import pause_in_effect
from producers.commands import (
    CommandFeed,
    answered_requests,
    first_cancel,
    last_answered,
    paused_reason,
)
from producers.emitter import Emitter
from producers.sinks import EventSink
from trainer import checkpoint as ckpt
from trainer.config import TrainerConfig
from trainer.device import DeviceUnavailable, check_device
from trainer.engines import effective_tier, engine_pin, resolve_backend
from trainer.loop import METRIC_FIELDS, RunLock, Trainer
from trainer.policy import weights_hash
from trainer.publish import (
    make_emitter,
    producer_name,
    recorded_steps,
    run_events,
    run_overrides,
)
from trainer.settings import run_history

INITIAL = "<initial state>"
#: how an identity refusal's ``detail`` begins
NOT_THIS_RUN = "not this run's checkpoint: "
#: the fall-back rejections whose checkpoints are set aside once the gate certifies
SET_ASIDE = frozenset({"corrupt", "missing", "no_overlap", "deviation"})


class ResumeError(Exception):
    """The run cannot be resumed at all (unknown run, no config, already completed)."""


@dataclass(frozen=True)
class GateResult:
    certified: bool
    checkpoint: str | None
    checkpoint_step: int
    window: tuple[int, int]
    tier: str
    tolerance: float
    max_deviation: float
    replay_s: float
    replay_steps: int
    rejections: tuple[tuple[str, str, str], ...]  # (checkpoint, reason, detail)
    #: Whole gate, start to verdict: reads, digest checks, restores, replays, fallbacks.
    gate_s: float = 0.0
    #: where this run's rejected checkpoints were moved (certified gates only)
    set_aside: tuple[str, ...] = ()


def metric_vector(fields: dict[str, Any]) -> dict[str, float]:
    """The compared metrics of one step as name -> float (``extra.*`` included)."""
    out = {k: float(fields[k]) for k in METRIC_FIELDS if fields.get(k) is not None}
    extra = fields.get("extra") or {}
    items = extra.items() if isinstance(extra, dict) else extra
    for k, v in items:
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[f"extra.{k}"] = float(v)
    return out


def recorded_vector(ev: TrainerStepCompleted) -> dict[str, float]:
    return metric_vector({**ev.model_dump(), "extra": ev.extra})


def noise_bands(recorded: dict[int, TrainerStepCompleted]) -> dict[str, float]:
    """Per metric: the run's own step-to-step noise, std(diff)/sqrt(2)."""
    series: dict[str, list[float]] = {}
    for step in sorted(recorded):
        for k, v in recorded_vector(recorded[step]).items():
            series.setdefault(k, []).append(v)
    bands = {}
    for k, vs in series.items():
        arr = np.asarray([v for v in vs if math.isfinite(v)])
        bands[k] = float(np.std(np.diff(arr)) / math.sqrt(2)) if arr.size > 2 else 0.0
    return bands


def deviation(
    recorded: dict[str, float], replayed: dict[str, float], bands: dict[str, float] | None
) -> float:
    """Largest deviation of one step: absolute (bands None) or in noise units."""
    worst = 0.0
    for k in set(recorded) | set(replayed):
        a, b = recorded.get(k), replayed.get(k)
        if a is None or b is None:
            return math.inf
        if (math.isnan(a) and math.isnan(b)) or a == b:
            continue
        d = abs(a - b)
        if bands is not None:
            band = bands.get(k, 0.0)
            d = d / band if band > 0 else math.inf
        worst = max(worst, d if not math.isnan(d) else math.inf)
    return worst


def load_run(log_dir: Path, run_id: str) -> tuple[TrainerConfig, Path, list[EventBase]]:
    """The run's config and run directory from its RunSubmitted event, and its events."""
    events = list(run_events(log_dir, run_id))
    sub = next((e for e in events if isinstance(e, RunSubmitted)), None)
    if sub is None:
        raise ResumeError(f"run {run_id!r} has no RunSubmitted event in {log_dir}")
    attrs = dict(sub.config)
    try:
        cfg = TrainerConfig.model_validate_json(str(attrs["config_json"]))
        run_dir = Path(str(attrs["run_dir"]))
    except (KeyError, ValueError) as exc:
        raise ResumeError(f"run {run_id!r}: RunSubmitted has no usable config: {exc}") from None
    return cfg, run_dir, events


class ResumeGate:
    """Runs the gate for one run and, once certified, leaves a trainer ready to go on."""

    def __init__(
        self,
        cfg: TrainerConfig,
        run_dir: Path,
        events: Sequence[EventBase],
        emitter: Emitter,
        progress: Callable[[str], None] | None = None,
        overrides_of: Mapping[str, Mapping[str, object]] | None = None,
    ) -> None:
        """``overrides_of``: the run's resume commands' overrides by command id
        (:func:`trainer.publish.run_overrides`): the settings its steps were trained under
        (:mod:`trainer.settings`); none: every step as submitted."""
        self.cfg = cfg
        self.run_dir = run_dir
        self.emitter = emitter
        self.say = progress or (lambda _m: None)
        self.history = run_history(_emission_order(events, cfg.run_id), overrides_of)
        self.recorded = self.history.recorded
        self.last = max(self.recorded, default=0)
        submitted = [e for e in events if isinstance(e, RunSubmitted)]
        pins = dict(submitted[0].config)
        self.run_pins = {k[4:]: str(v) for k, v in pins.items() if k.startswith("pin.")}
        #: the run's own RunSubmitted: the submission its checkpoints must name
        self.submitted_id = str(submitted[0].event_id)
        self.submitted_ts = float(submitted[0].ts)

    def _new_trainer(self) -> Trainer:
        trainer = Trainer(self.cfg, self.run_dir, self.emitter, self.say)
        trainer.submitted_id = self.submitted_id  # the checkpoints it writes name it
        return trainer

    def _reject(
        self,
        path: str,
        step: int,
        reason: str,
        detail: str,
        fell_back_to: str | None,
        max_dev: float | None = None,
    ) -> None:
        self.say(f"resume rejected {path}: {reason}: {detail}")
        self.emitter.emit(
            ResumeRejected,
            step=step,
            checkpoint_path=path,
            checkpoint_step=step,
            reason=reason,
            detail=detail,
            max_deviation=max_dev,
            fell_back_to=fell_back_to,
        )
        self.emitter.flush()

    def run(self) -> tuple[GateResult, Trainer | None]:
        cfg = self.cfg
        self._t_gate = time.perf_counter()
        tier = effective_tier(cfg)
        bands = noise_bands(self.recorded) if tier == "statistical" else None
        tolerance = 0.0 if tier == "bitwise" else cfg.resume.band_k
        candidates: list[Path | None] = [*ckpt.list_checkpoints(self.run_dir / "checkpoints"), None]
        rejections: list[tuple[str, str, str]] = []
        reason = "resume requested"
        for i, cand in enumerate(candidates):
            older = candidates[i + 1] if i + 1 < len(candidates) else "none"
            older_name = None if older == "none" else (str(older) if older else INITIAL)
            name = str(cand) if cand is not None else INITIAL
            guess = _step_of(cand)
            self.emitter.emit(
                ResumeRequested,
                step=guess,
                checkpoint_path=name,
                checkpoint_step=guess,
                reason=reason,
            )
            trainer = self._new_trainer()
            info_step = 0
            if cand is not None:
                try:
                    # whose it is first (the metadata verifies itself): another run's is
                    # neither loaded nor, when its data is damaged, set aside as ours
                    info = ckpt.read_metadata(cand)
                    foreign = ckpt.identity_mismatch(
                        info, cfg.run_id, cfg.tenant_id, self.submitted_id, self.submitted_ts
                    )
                    if not foreign:
                        info, parts = ckpt.read_checkpoint(cand)
                except ckpt.SchemaMismatch as exc:
                    self._reject(name, guess, "schema_mismatch", str(exc), None)
                    rejections.append((name, "schema_mismatch", str(exc)))
                    return self._failed(rejections, tier, tolerance), None
                except ckpt.CorruptCheckpoint as exc:
                    self._reject(name, guess, "corrupt", str(exc), older_name)
                    rejections.append((name, "corrupt", str(exc)))
                    reason = f"fall back after corrupt {cand.name}"
                    continue
                if foreign:  # before the pins: another run's pins say nothing of this one
                    detail = NOT_THIS_RUN + foreign
                    self._reject(name, info.step, "corrupt", detail, older_name)
                    rejections.append((name, "corrupt", detail))
                    reason = f"fall back after {cand.name}, another run's checkpoint"
                    continue
                bad = self._pin_mismatch(info.pins, trainer)
                if bad:
                    self._reject(name, info.step, "pin_mismatch", bad, None)
                    rejections.append((name, "pin_mismatch", bad))
                    return self._failed(rejections, tier, tolerance), None
                try:
                    trainer.load_parts(parts)
                except (KeyError, ValueError, RuntimeError, TypeError) as exc:
                    detail = f"state does not load: {exc}"
                    self._reject(name, info.step, "missing", detail, older_name)
                    rejections.append((name, "missing", detail))
                    reason = f"fall back after unloadable {cand.name}"
                    continue
                if weights_hash(trainer.reference) != trainer.pins["kl_reference"]:
                    detail = "pin kl_reference: restored reference weights hash differs"
                    self._reject(name, info.step, "pin_mismatch", detail, None)
                    rejections.append((name, "pin_mismatch", detail))
                    return self._failed(rejections, tier, tolerance), None
                info_step = info.step
            else:
                bad = self._pin_mismatch(self.run_pins, trainer)
                if bad:
                    self._reject(name, 0, "pin_mismatch", bad, None)
                    rejections.append((name, "pin_mismatch", bad))
                    return self._failed(rejections, tier, tolerance), None
            gaps = [s for s in range(info_step + 1, self.last + 1) if s not in self.recorded]
            if info_step > self.last or gaps:
                detail = (
                    f"recorded metrics end at step {self.last}, checkpoint is at {info_step}"
                    if info_step > self.last
                    else f"recorded metrics missing for steps {gaps[:5]}"
                )
                self._reject(name, info_step, "missing", detail, older_name)
                rejections.append((name, "missing", detail))
                reason = "fall back after missing metrics"
                continue
            if info_step == self.last and cand is not None:
                # nothing recorded after this checkpoint: an empty overlap window proves
                # nothing (a state part could be lost), so verify from the one before;
                # at step 0 that is the run's initial state, which its config reproduces
                detail = (
                    f"no recorded step after checkpoint step {info_step}: an empty overlap "
                    "window cannot certify it"
                )
                self._reject(name, info_step, "no_overlap", detail, older_name)
                rejections.append((name, "no_overlap", detail))
                reason = f"fall back after {name} had no overlap window"
                continue
            self.say(f"replaying steps {info_step + 1}..{self.last} from {name}")
            t0 = time.perf_counter()
            worst = 0.0
            for step in range(info_step + 1, self.last + 1):
                trainer.use_settings(self.history.settings_at[step])  # as it was trained
                rec = trainer.train_step()
                trainer.reward.drain_events()  # replayed steps are never re-published
                dev = deviation(
                    recorded_vector(self.recorded[step]), metric_vector(rec.metrics), bands
                )
                worst = max(worst, dev)
                if worst > tolerance:
                    break  # diverged: no need to finish the window
            replay_s = time.perf_counter() - t0
            window = (info_step + 1, self.last)
            if worst <= tolerance:
                trainer.use_settings(self.history.settings)  # what it goes on with
                self.emitter.emit(
                    ResumeCertified,
                    step=self.last,
                    checkpoint_path=name,
                    checkpoint_step=info_step,
                    window_start=window[0],
                    window_end=window[1],
                    tier=tier,
                    tolerance=tolerance,
                    max_deviation=worst,
                    rollout_engine=engine_pin(resolve_backend(cfg)),
                )
                self.emitter.emit(
                    UsageRecorded,
                    step=self.last,
                    pool="trainer",
                    phase="resume_replay",
                    device_kind=trainer.trainer_device_kind,
                    device_seconds=replay_s,
                )
                self.emitter.flush()
                aside = self._set_aside_rejected(rejections)
                result = GateResult(
                    True,
                    name,
                    info_step,
                    window,
                    tier,
                    tolerance,
                    worst,
                    replay_s,
                    self.last - info_step,
                    tuple(rejections),
                    time.perf_counter() - self._t_gate,
                    aside,
                )
                return result, trainer
            detail = (
                f"replayed window {window[0]}..{window[1]} deviates by {worst:.6g} "
                f"(tier {tier}, tolerance {tolerance:g})"
            )
            self._reject(name, info_step, "deviation", detail, older_name, _finite(worst))
            rejections.append((name, "deviation", detail))
            reason = f"fall back after deviation at {name}"
        return self._failed(rejections, tier, tolerance), None

    def _set_aside_rejected(self, rejections: list[tuple[str, str, str]]) -> tuple[str, ...]:
        """Move this run's checkpoints the gate fell back from (see the module docstring)
        to ``<run_dir>/rejected/resume-<ns>/``; another run's stay where they are."""
        mine = [
            Path(c)
            for c, r, d in rejections
            if c != INITIAL and r in SET_ASIDE and not d.startswith(NOT_THIS_RUN)
        ]
        into = self.run_dir / "rejected" / f"resume-{time.time_ns()}"
        moved = ckpt.set_aside(mine, into)
        if moved:
            self.say(f"set aside {len(moved)} rejected checkpoint(s) in {into}")
        return tuple(str(p) for p in moved)

    def _pin_mismatch(self, pins: dict[str, str], trainer: Trainer) -> str:
        for pin, current in trainer.pins.items():
            if pin in pins and pins[pin] != current:
                return f"pin {pin}: checkpoint has {pins[pin]}, this run now has {current}"
        for pin in trainer.pins:
            if pin not in pins:
                return f"pin {pin}: absent from the checkpoint"
        return ""

    def _failed(self, rejections: list[tuple[str, str, str]], tier: str, tol: float) -> GateResult:
        return GateResult(
            False,
            None,
            0,
            (0, 0),
            tier,
            tol,
            math.inf,
            0.0,
            0,
            tuple(rejections),
            time.perf_counter() - self._t_gate,
        )


def _emission_order(events: Sequence[EventBase], run_id: str) -> list[EventBase]:
    """The run's trainer's own facts in the order it emitted them: by ``seq``, which every
    trainer process of the run continues (``first_seq``), where those are unique; else in
    log order. The log merges topics by append time, so a clock that stepped back across a
    restart could put a new branch's steps before the rollback's ``RunResumed`` (review,
    reasoned); other producers' facts are not this run's record."""
    own = producer_name(run_id)
    mine = list({str(e.event_id): e for e in events if e.producer == own}.values())
    if len({e.seq for e in mine}) == len(mine):  # (a record appended twice counted once)
        mine.sort(key=lambda e: e.seq)
    return mine


def _step_of(path: Path | None) -> int:
    if path is None:
        return 0
    try:
        return int(path.name.split("-")[-1])
    except ValueError:
        return 0


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


#: how a restarted trainer's RunPaused begins (the pause's own reason follows)
STILL_PAUSED = "still paused after its trainer restarted: "


def continue_run(
    gate: GateResult, trainer: Trainer, max_staleness: int, paused: str | None = None
) -> None:
    """Staleness rules, re-sync, then train to the configured end: ``RunResumed`` first, or,
    for a run that was ``paused`` when its trainer died (the pause's reason), ``RunPaused``
    again and a wait for an unpause or a cancel (only a person's command continues a paused
    run, not a restart). Commands that came while the trainer was down (in
    ``trainer.commands_due``) are acted on before the first step is trained."""
    dropped = trainer.buffer.discard_stale(trainer.step, max_staleness)
    t0 = time.perf_counter()
    frozen = trainer.cfg.faults.freeze_weight_sync_after
    if frozen is None or trainer.step <= frozen:
        trainer.engine.sync_weights(trainer.policy, trainer.step)
        trainer._emit(
            WeightSyncCompleted,
            step=trainer.step,
            policy_version=trainer.engine.policy_version,  # read back from the engine
            duration_s=time.perf_counter() - t0,
        )
    certified = (
        f"certified from {gate.checkpoint} (window {gate.window[0]}..{gate.window[1]}, "
        f"{gate.tier}, max deviation {gate.max_deviation:.3g}); "
        f"{dropped} stale rollout batch(es) discarded"
    )
    if paused is not None:  # (the gate's outcome is on ResumeCertified; once said is enough)
        original = paused.removeprefix(STILL_PAUSED)  # a second restart says it once
        if trainer.hold_paused(STILL_PAUSED + original, trainer.checkpoint_here()):
            return  # cancelled: RunCancelled is the run's last lifecycle fact
    else:
        trainer._emit(RunResumed, step=trainer.step, reason=certified)
        trainer._flush()
        trainer._last_cut = time.perf_counter()
    if trainer.follow_commands():
        return
    if trainer.step >= trainer.cfg.steps:
        # the final checkpoint: a valid one of this run, written now when it is absent
        # (crashed between the last step and its checkpoint) or does not verify
        trainer.checkpoint_here()
    trainer.run_until(trainer.cfg.steps)
    trainer.finish()


def resume(
    log_dir: Path,
    run_id: str,
    *,
    sink: EventSink | None = None,
    progress: Callable[[str], None] | None = None,
    run_dir: Path | None = None,
) -> tuple[GateResult, Trainer | None]:
    """Gate and, if certified, finish the run. Publishes RunFailed if no candidate passes.

    ``run_dir`` overrides the directory recorded in RunSubmitted (a moved or copied run).
    """
    cfg, recorded_dir, events = load_run(log_dir, run_id)
    run_dir = run_dir or recorded_dir
    lock = RunLock(run_dir).acquire()  # RunBusy while the run's trainer is still alive
    try:
        return _resume_locked(log_dir, run_id, cfg, run_dir, events, sink, progress)
    finally:
        lock.release()


def _resume_locked(
    log_dir: Path,
    run_id: str,
    cfg: TrainerConfig,
    run_dir: Path,
    events: list[EventBase],
    sink: EventSink | None,
    progress: Callable[[str], None] | None,
) -> tuple[GateResult, Trainer | None]:
    # re-read under the lock (the final record), the config's tenant's only
    events = list(run_events(log_dir, run_id, cfg.tenant_id))
    if any(isinstance(e, RunCompleted) for e in events):
        raise ResumeError(f"run {run_id!r} already completed; nothing to resume")
    if any(isinstance(e, RunCancelled) for e in events):
        raise ResumeError(f"run {run_id!r} was cancelled; nothing to resume")
    try:  # before anything is published: the run's device on this host
        check_device(cfg.device)
    except DeviceUnavailable as exc:
        raise ResumeError(f"run {run_id!r} cannot resume here: {exc}") from None
    seqs = [e.seq for e in events if e.producer == producer_name(run_id)]
    emitter = make_emitter(
        run_id, cfg.tenant_id, log_dir=log_dir, sink=sink, first_seq=max(seqs, default=-1) + 1
    )
    # the commands this run already answered are not applied twice after a restart; the
    # others came while it was down: a cancel is answered now, the rest by the trainer
    answered, last = answered_requests(events), last_answered(events)
    feed = CommandFeed(
        emitter.sink, run_id, answered=answered, tenant_id=cfg.tenant_id, superseded=last
    )
    due = feed.poll()
    cancel = first_cancel(due)
    if cancel is not None:
        emitter.emit(
            RunCancelled,
            step=max(recorded_steps(events), default=0),
            reason=f"cancelled by {cancel.actor} while its trainer was down: {cancel.reason}"
            .rstrip(": "),
            request_id=str(cancel.event_id),
        )  # fmt: skip
        emitter.flush()
        raise ResumeError(
            f"run {run_id!r} was cancelled by {cancel.actor} while its trainer was down; "
            "the cancel is answered (RunCancelled), nothing to resume"
        )
    overrides_of = run_overrides(log_dir, run_id, cfg.tenant_id)
    gate = ResumeGate(cfg, run_dir, events, emitter, progress, overrides_of)
    result, trainer = gate.run()
    if not result.certified or trainer is None:
        why = "; ".join(f"{Path(c).name}: {r}" for c, r, _ in result.rejections) or "none"
        emitter.emit(
            RunFailed,
            step=gate.last,
            failure_class="platform_fault",
            reason=f"non-resumable: no checkpoint passed the resume gate ({why})",
        )
        emitter.flush()
        return result, None
    trainer.commands = feed
    trainer.commands_due.extend(due)
    pause = pause_in_effect(events)
    trainer.pause_in_effect = pause.id if pause is not None else None
    try:
        continue_run(result, trainer, cfg.resume.max_staleness, paused_reason(events))
    except BaseException as exc:
        if not isinstance(exc, KeyboardInterrupt):
            trainer.fail(exc)
        raise
    finally:
        trainer.reward.close()
    return result, trainer


def describe(result: GateResult) -> dict[str, Any]:
    return json.loads(
        json.dumps(
            {
                "certified": result.certified,
                "checkpoint": result.checkpoint,
                "checkpoint_step": result.checkpoint_step,
                "window": list(result.window),
                "tier": result.tier,
                "tolerance": result.tolerance,
                "max_deviation": result.max_deviation
                if math.isfinite(result.max_deviation)
                else None,
                "replay_s": round(result.replay_s, 4),
                "gate_s": round(result.gate_s, 4),
                "replay_steps": result.replay_steps,
                "set_aside": list(result.set_aside),
                "rejections": [
                    {"checkpoint": c, "reason": r, "detail": d} for c, r, d in result.rejections
                ],
            }
        )
    )

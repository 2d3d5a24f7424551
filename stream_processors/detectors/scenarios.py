"""Synthetic runs for detector tests, the quality benchmark and canaries.

:func:`synthetic_run` builds one run's full telemetry (what a production-shaped GRPO
run emits) from a seed: reward rising on a logistic curve with AR(1) noise, a held-out
eval that tracks it, KL to the reference growing towards a plateau, entropy declining
slowly, log-normal grad norms, one rollout batch per step with slowly growing length,
weight syncs, phase timings, GPU usage and periodic checkpoints. Every level, trend and
noise scale is drawn per run, so 200 seeds are 200 different healthy runs.

``shape`` picks one of the healthy run shapes of :data:`SHAPES` (what the false-page rates
are measured on): the default rising reward, a plateau, a noisy run, a run whose entropy
declines a lot (slowly, as real GRPO runs' does), a long-reasoning run whose responses
grow 2-4x longer, and runs with an eval gate every 10, 50 or 100 steps. Half the runs
report TRL's ``frac_reward_zero_std`` (in ``extra``), the rest only ``reward_std``.

``fault`` injects one trainer fault from ``fault_step`` on (see :data:`FAULTS`), shaped
like the seed's canaries: an oversized LR (KL blowup), a constant reward (dead run), a
gameable reward (hacking), a frozen weight sync (staleness), and the rest of the catalog.
The randomness lives here, in the generator; the folds it feeds stay pure.
"""

from __future__ import annotations

import math
import uuid
from typing import Any

import numpy as np

from events import (
    CheckpointWritten,
    EvalGateScored,
    RolloutBatchCompleted,
    RunSubmitted,
    StepPhaseTimed,
    TrainerStepCompleted,
    UsageRecorded,
    WeightSyncCompleted,
)
from events.envelope import EventBase

NAMESPACE = uuid.UUID("7b0c51a2-3f7e-4f55-9a51-1c2d3e4f5a6b")

#: fault name -> the detector that must catch it.
FAULTS: dict[str, str] = {
    "oversized_lr": "kl_blowup",
    "constant_reward": "dead_run",
    "gameable_reward": "reward_hacking",
    "entropy_collapse": "entropy_collapse",
    "reward_collapse": "reward_explosion_collapse",
    "reward_explosion": "reward_explosion_collapse",
    "grad_spikes": "grad_norm_spike",
    "stop_token_broken": "rollout_drift",
    "nan_loss": "nan_metric",
    "frozen_weight_sync": "weight_sync_staleness",
    "starved_trainer": "trainer_idle",
    "checkpoint_writer_stuck": "checkpoint_cadence",
    "no_eval_gate": "eval_gate_missing",
}


#: healthy shape -> what it is (each measured on its own healthy runs in ``QUALITY.md``).
SHAPES: dict[str, str] = {
    "rising": "reward rises on a logistic curve; eval every 5-20 steps",
    "plateau": "reward and eval flat from the start (the run has little left to learn)",
    "noisy": "2-3x the noise on reward, eval, KL, entropy and grad norms",
    "entropy_decline": "entropy falls 40-75% over the run, fast early and slowing",
    "long_reasoning": "responses grow 2-4x longer, truncation creeps up, as in R1-style GRPO",
    "eval_10": "rising reward, eval gate every 10 steps",
    "eval_50": "rising reward, eval gate every 50 steps",
    "eval_100": "rising reward, eval gate every 100 steps",
}


def synthetic_run(
    seed: int,
    *,
    steps: int = 400,
    fault: str | None = None,
    fault_step: int = 200,
    run_id: str | None = None,
    tenant_id: str = "tenant-synth",
    algorithm: str = "grpo",
    eval_every: int | None = None,
    checkpoint_every: int = 50,
    shape: str = "rising",
) -> list[EventBase]:
    """One run's events in emission order (see the module docstring)."""
    if fault is not None and fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; known: {sorted(FAULTS)}")
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; known: {sorted(SHAPES)}")
    rng = np.random.default_rng(seed)
    # draws the original rising shape did not make come from their own generator, so a
    # seed's rising run is the same run it always was
    aux = np.random.default_rng([seed, 17])
    eval_every = eval_every or int(rng.choice([5, 10, 10, 20]))
    if shape.startswith("eval_"):
        eval_every = int(shape[5:])
    run_id = run_id or f"synth-{seed}" + (f"-{fault}" if fault else "")
    u = rng.uniform
    t = np.arange(steps, dtype=np.float64)
    # reward: logistic rise plus AR(1) noise (batch means wander a little)
    r0, gain = u(0.1, 0.4), u(0.05, 0.45)
    mid, width = u(0.2, 0.8) * steps, u(0.1, 0.3) * steps
    trend = r0 + gain / (1 + np.exp(-(t - mid) / width))
    noise = np.zeros(steps)
    sigma, phi, tail = u(0.008, 0.03), u(0.0, 0.5), u(4.0, 10.0)
    shocks = sigma * rng.standard_t(tail, steps) / math.sqrt(tail / (tail - 2))  # fat tails
    for i in range(1, steps):
        noise[i] = phi * noise[i - 1] + shocks[i]
    reward = trend + noise
    evals = u(0.2, 0.4) + (trend - r0) * u(0.3, 0.9) + rng.normal(0, u(0.005, 0.02), steps)
    kl = u(0.01, 0.15) * (1 - np.exp(-t / u(50, 200))) * np.exp(rng.normal(0, 0.08, steps))
    h0 = u(0.6, 2.0)
    entropy = h0 * (1 - u(0.05, 0.3) * t / steps) + rng.normal(0, h0 * u(0.01, 0.025), steps)
    warmup = 1 + u(0.5, 2.0) * np.exp(-t / u(5, 20))  # grad norms settle after LR warmup
    log_noise = u(0.08, 0.25) * rng.standard_t(6, steps) / math.sqrt(1.5)
    grad = u(0.2, 2.0) * warmup * (1 - 0.3 * t / steps) * np.exp(log_noise)
    clip_norm = float(np.quantile(grad, 0.99) * 1.5)
    length = u(200, 800) * (1 + u(0.0, 0.6) * t / steps) * np.exp(rng.normal(0, 0.03, steps))
    trunc = np.clip(u(0.0, 0.05) + rng.normal(0, 0.01, steps), 0, 1)
    unparse = np.clip(u(0.0, 0.03) + rng.normal(0, 0.005, steps), 0, 1)
    wall = u(10, 60) * np.exp(rng.normal(0, 0.05, steps))
    idle = np.clip(u(0.05, 0.35) + rng.normal(0, 0.04, steps), 0, 0.95) * wall
    versions = t.astype(int) - rng.choice([0, 1], steps, p=[0.8, 0.2])
    reward, evals, kl, entropy, grad, length, trunc = _shaped(
        shape, aux, t, steps, reward, evals, kl, entropy, grad, length, trunc
    )
    reward_std = np.abs(0.3 + 0.02 * aux.standard_normal(steps))
    # TRL's frac_reward_zero_std: groups with no reward spread (all wrong early, all right
    # late), reported by half the runs
    zero_std = np.clip(
        aux.uniform(0.05, 0.5) + 0.25 * np.cos(np.pi * t / steps) ** 2
        + aux.normal(0, 0.05, steps), 0.0, 0.92,
    )  # fmt: skip
    reports_zero_std = seed % 2 == 0
    f = fault_step
    nan_step = -1
    if fault == "oversized_lr":
        kl[f:] = kl[f] + 0.05 * (np.exp((t[f:] - f) / 8.0) - 1)
        entropy[f:] = entropy[f:] * np.exp(-(t[f:] - f) / 30.0)
    elif fault == "constant_reward":
        reward[f:] = round(float(reward[f]), 2)
        reward_std[f:] = 0.0  # every completion scores the same
        zero_std[f:] = 1.0  # so does every group
        kl[f:] = kl[f]  # zero advantages: the policy stops moving
    elif fault == "gameable_reward":
        reward[f:] = reward[f] + 0.004 * (t[f:] - f) + rng.normal(0, sigma, steps - f)
        evals[f:] = evals[f] - 0.004 * (t[f:] - f) + rng.normal(0, 0.01, steps - f)
    elif fault == "entropy_collapse":
        entropy[f:] = entropy[f] * np.exp(-(t[f:] - f) / 40.0) + rng.normal(0, 0.01, steps - f)
    elif fault == "reward_collapse":
        reward[f:] = rng.normal(0.01, 0.005, steps - f)
    elif fault == "reward_explosion":
        reward[f:] = reward[f:] * 10.0
    elif fault == "grad_spikes":
        grad[f::7] *= 30.0
    elif fault == "stop_token_broken":
        trunc[f:] = np.clip(0.5 + rng.normal(0, 0.03, steps - f), 0, 1)
        length[f:] *= 2.0
    elif fault == "nan_loss":
        nan_step = f
    elif fault == "starved_trainer":
        idle[f:] = 0.85 * wall[f:]
    emit = _Emitter(run_id, tenant_id, seed)
    ckpt_config = {"checkpoint_every_steps": checkpoint_every, "eval_every": eval_every}
    out: list[EventBase] = [emit(RunSubmitted, None, algorithm=algorithm, config=ckpt_config)]
    for s in range(steps):
        frozen = fault == "frozen_weight_sync" and s >= f
        out.append(
            emit(
                RolloutBatchCompleted,
                s,
                policy_version=int(min(versions[s], f - 1) if frozen else versions[s]),
                num_sequences=256,
                mean_length=float(length[s]),
                truncation_rate=float(trunc[s]),
                unparseable_rate=float(unparse[s]),
                tokens_generated=int(256 * length[s]),
            )
        )
        out.append(
            emit(
                TrainerStepCompleted,
                s,
                algorithm=algorithm,
                reward_mean=float(reward[s]),
                reward_std=_reported_std(rng, float(reward_std[s])),
                kl_to_ref=float(kl[s]),
                entropy=float(entropy[s]),
                grad_norm=float(grad[s]),
                grad_clip_threshold=clip_norm,
                clip_fraction=float(u(0.001, 0.05)),
                loss=math.nan if s == nan_step else float(rng.normal(0, 0.05)),
                lr=1e-6,
                tokens_trained=int(256 * length[s]),
                extra={"frac_reward_zero_std": float(zero_std[s])} if reports_zero_std else {},
            )
        )
        out.append(
            emit(
                StepPhaseTimed,
                s,
                wall_s=float(wall[s]),
                idle_s=float(idle[s]),
                rollout_s=float(idle[s]),
                optim_s=float(wall[s] - idle[s]),
            )
        )
        out.append(
            emit(
                UsageRecorded,
                s,
                pool="trainer",
                phase="optim",
                device_kind="gpu",
                device_seconds=8 * wall[s],
            )
        )
        if not frozen:
            out.append(emit(WeightSyncCompleted, s, policy_version=s, duration_s=1.0))
        if s % eval_every == eval_every - 1 and fault != "no_eval_gate":
            out.append(emit(EvalGateScored, s, score=float(evals[s]), n_items=500))
        stuck = fault == "checkpoint_writer_stuck" and s >= f
        if s % checkpoint_every == checkpoint_every - 1 and not stuck:
            out.append(
                emit(CheckpointWritten, s, path=f"ckpt/{s}", checkpoint_schema=1, digest="0" * 64)
            )
    return out


def _reported_std(rng: np.random.Generator, value: float) -> float:
    """The step's reward spread; the draw keeps the base generator's sequence as it was."""
    drawn = abs(float(rng.normal(0.3, 0.02)))
    return 0.0 if value == 0.0 else drawn


def _shaped(
    shape: str,
    aux: np.random.Generator,
    t: np.ndarray,
    steps: int,
    reward: np.ndarray,
    evals: np.ndarray,
    kl: np.ndarray,
    entropy: np.ndarray,
    grad: np.ndarray,
    length: np.ndarray,
    trunc: np.ndarray,
) -> tuple[np.ndarray, ...]:
    """The rising run's series bent into ``shape`` (healthy in every case)."""
    u = aux.uniform
    if shape == "plateau":
        reward = u(0.3, 0.8) + (reward - _smooth(reward))
        evals = u(0.3, 0.7) + (evals - _smooth(evals))
    elif shape == "noisy":
        scale = u(2.0, 3.0)
        reward = _smooth(reward) + (reward - _smooth(reward)) * scale
        evals = _smooth(evals) + (evals - _smooth(evals)) * scale
        kl = kl * np.exp(aux.normal(0, 0.12, steps))
        entropy = _smooth(entropy) + (entropy - _smooth(entropy)) * scale
        grad = grad * np.exp(aux.normal(0, 0.2, steps))
    elif shape == "entropy_decline":
        h0, keep, tau = entropy[0], u(0.25, 0.6), u(0.15, 0.5) * steps
        curve = h0 * (keep + (1 - keep) * np.exp(-t / tau))
        entropy = curve + (entropy - _smooth(entropy)) * curve / h0
    elif shape == "long_reasoning":
        growth = u(2.0, 4.0)
        ramp = 1 + (growth - 1) / (1 + np.exp(-(t - u(0.3, 0.6) * steps) / (u(0.15, 0.3) * steps)))
        length = length * ramp / ramp[0]
        trunc = np.clip(trunc + u(0.02, 0.08) * t / steps, 0, 1)
        entropy = entropy * (1 + u(0.0, 0.15) * t / steps)  # longer answers, more tokens
    return reward, evals, kl, entropy, grad, length, trunc


def _smooth(x: np.ndarray, width: int = 15) -> np.ndarray:
    """A centred moving average (edges padded with the end values): the series' trend."""
    pad = np.concatenate([np.full(width, x[0]), x, np.full(width, x[-1])])
    kernel = np.ones(2 * width + 1) / (2 * width + 1)
    return np.convolve(pad, kernel, mode="same")[width:-width]


class _Emitter:
    """Envelopes with deterministic ids and a synthetic clock (10 s per event)."""

    def __init__(self, run_id: str, tenant_id: str, seed: int) -> None:
        self.run_id, self.tenant_id, self.seed, self.seq = run_id, tenant_id, seed, 0

    def __call__(self, cls: type[EventBase], step: int | None, **payload: Any) -> Any:
        self.seq += 1
        return cls(
            event_id=uuid.uuid5(NAMESPACE, f"{self.run_id}/{self.seed}/{self.seq}"),
            tenant_id=self.tenant_id,
            run_id=self.run_id,
            step=step,
            ts=1_800_000_000.0 + 10.0 * self.seq,
            producer="synthetic",
            seq=self.seq,
            **payload,
        )

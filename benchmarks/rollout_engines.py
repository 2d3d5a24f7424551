"""Rollout engines side by side (issue 15): vLLM vs the torch sampler, same policy, same batch.

    ~/.cache/runwatch/venv/bin/python benchmarks/rollout_engines.py [--reps 10] [--steps 20]

1. Rollout throughput: generated tokens per second of wall time of one ``generate`` call
   (the trainer's wait: request to finished batch), for the same policy weights and the
   same prompts, the two engines interleaved rep by rep. Two shapes: the task's batch
   (``trainer/configs/test.yaml``: 32 prompts x 8 completions, at most 5 tokens each, a
   warm-started 2-layer hidden-64 policy) and a long one (8 prompts x 16 completions x 64
   tokens, no stop token, a hidden-128 4-head policy: the shape of
   ``../shared/notes/vllm-cpu.md``). Figure: vLLM tokens/s; anchor: torch tokens/s; ratio.
2. Weight sync per step: pushing the trainer's state dict into the engine in place and
   reading its version back (vLLM: ``collective_rpc`` -> the worker's ``reload_weights``;
   torch: a parameter copy), median over ``--reps``.
3. Trainer step time split by phase: ``--steps`` steps of the test config per engine
   (``StepPhaseTimed`` medians: rollout, idle, score, optim, sync, other, wall).

Every figure is printed beside its anchor (the torch sampler) measured in the same run.
No GPU: on a GPU host run it with the regular ``vllm`` package and ``--device cuda``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from events.catalog.trainer import StepPhaseTimed
from producers.sinks import MemorySink
from trainer.config import EngineConfig, ModelConfig, load_config
from trainer.engines import make_engine
from trainer.loop import Trainer, train
from trainer.policy import build_policy
from trainer.publish import make_emitter

CONFIG = Path(__file__).resolve().parents[1] / "trainer" / "configs" / "test.yaml"
PHASES = ("rollout_s", "idle_s", "score_s", "optim_s", "sync_s", "other_s", "wall_s")


def _engines(cfg, policy, vocab: int):  # type: ignore[no-untyped-def]
    vllm = make_engine(cfg.with_overrides(rollout_backend="vllm"), policy, vocab, 0)
    torch_ = make_engine(cfg.with_overrides(rollout_backend="torch"), policy, vocab, 0)
    return {"vllm": vllm, "torch": torch_}


def bench_throughput(cfg, policy, prompts, n: int, max_new: int, reps: int) -> dict:  # type: ignore[no-untyped-def]
    vocab = policy.config.vocab_size
    engines = _engines(cfg, policy, vocab)
    for e in engines.values():  # warm-up (vLLM's first batch allocates; not counted)
        e.generate(prompts, n, max_new, 1.0)
    rates: dict[str, list[float]] = {k: [] for k in engines}
    for _ in range(reps):
        for name, e in engines.items():
            t0 = time.perf_counter()
            batch = e.generate(prompts, n, max_new, 1.0)
            rates[name].append(float(batch.mask.sum()) / (time.perf_counter() - t0))
    out = {f"{k}_tokens_per_s": statistics.median(v) for k, v in rates.items()}
    out["ratio"] = out["vllm_tokens_per_s"] / out["torch_tokens_per_s"]
    out["sequences"] = int(prompts.shape[0]) * n
    return out


def bench_sync(cfg, policy, reps: int) -> dict:  # type: ignore[no-untyped-def]
    engines = _engines(cfg, policy, policy.config.vocab_size)
    times: dict[str, list[float]] = {k: [] for k in engines}
    for version in range(1, reps + 1):
        with torch.no_grad():
            for p in policy.parameters():
                p.add_(1e-4)  # an optimizer step's worth of change
        for name, e in engines.items():
            t0 = time.perf_counter()
            e.sync_weights(policy, version)
            assert e.policy_version == version  # read back from the engine
            times[name].append(time.perf_counter() - t0)
    out = {f"{k}_sync_ms": 1000 * statistics.median(v) for k, v in times.items()}
    out["ratio"] = out["vllm_sync_ms"] / out["torch_sync_ms"]
    return out


def bench_phases(tmp: Path, steps: int, backend: str) -> dict:
    cfg = load_config(CONFIG, run_id=f"phases-{backend}", steps=steps, rollout_backend=backend)
    cfg = cfg.with_overrides(eval_every=10_000)
    sink = MemorySink()
    train(cfg, tmp / backend, make_emitter(cfg.run_id, cfg.tenant_id, sink=sink))
    rows = [e for e in sink.events if isinstance(e, StepPhaseTimed)][1:]  # step 1: warm-up
    return {f: statistics.median(getattr(r, f) for r in rows) for f in PHASES}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--device", default="cpu")
    ap.add_argument(
        "--long-hidden", type=int, default=128, help="hidden size of the long batch's policy"
    )
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = load_config(CONFIG, device=args.device)
    tr = Trainer(cfg.with_overrides(rollout_backend="torch"), Path(tempfile.mkdtemp()))
    ds = tr.dataset
    idx = tr.sampler.next_indices(cfg.grpo.prompts_per_step)
    task_prompts = torch.tensor([ds.prompt_tokens(ds.train[i]) for i in idx])
    n = cfg.grpo.group_size
    task = bench_throughput(cfg, tr.policy, task_prompts, n, tr.max_new, args.reps)

    # a 1,024-token vocabulary: a random policy then rarely samples the stop token (id 3),
    # so nearly every sequence runs its 64 tokens (only generated tokens are counted)
    h = args.long_hidden
    big = ModelConfig(hidden=h, heads=h // 32, layers=2, intermediate=2 * h, max_positions=96)
    long_cfg = cfg.with_overrides(model=big.model_dump(), engine=EngineConfig().model_dump())
    long_policy = build_policy(1024, big, seed=1)
    long_prompts = torch.randint(4, 1024, (8, 8))
    long = bench_throughput(long_cfg, long_policy, long_prompts, 16, 64, max(3, args.reps // 3))
    sync = bench_sync(cfg, tr.policy, args.reps)
    with tempfile.TemporaryDirectory() as d:
        phases = {b: bench_phases(Path(d), args.steps, b) for b in ("vllm", "torch")}
    result = {
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "device": args.device,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "throughput_task_batch": task,
        "throughput_long_batch": long,
        "weight_sync": sync,
        "step_phases_median_s": phases,
    }
    print(json.dumps(result, indent=2))
    print()
    print(f"{'figure':<46} {'vLLM':>12} {'torch (anchor)':>15} {'ratio':>8}")
    for name, r in (("rollout tokens/s, task batch (256 x <=5)", task),
                    (f"rollout tokens/s, long batch (128 x 64, h{h})", long)):  # fmt: skip
        print(f"{name:<46} {r['vllm_tokens_per_s']:>12,.0f} {r['torch_tokens_per_s']:>15,.0f}"
              f" {r['ratio']:>8.2f}")  # fmt: skip
    print(f"{'weight sync per step (ms)':<46} {sync['vllm_sync_ms']:>12.2f}"
          f" {sync['torch_sync_ms']:>15.2f} {sync['ratio']:>8.2f}")  # fmt: skip
    for f in PHASES:
        v, t = phases["vllm"][f], phases["torch"][f]
        print(f"{'step phase ' + f + ' (median s)':<46} {v:>12.4f} {t:>15.4f}"
              f" {v / t if t else float('nan'):>8.2f}")  # fmt: skip


if __name__ == "__main__":
    main()

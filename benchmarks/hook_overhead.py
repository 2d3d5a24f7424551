"""Live-hook overhead per training step, beside the same loop without the hook, same run.

Two loops, each run in alternating blocks (A B A B ...) so both see the same machine load:

1. ``torch`` (default): a real optimizer step of a small Llama built from a config (CPU,
   forward + backward + AdamW) — the anchor — and the same step followed by what the TRL
   callback does per step: ``hook.step_done(step)`` and ``hook.log(row, step)`` with a
   GRPO log row of 25 keys, plus ``hook.checkpoint`` every 50 steps, then
   ``hook.obey(step)`` (the run's commands and the out-of-touch guard, as the README's
   loop does; nothing pauses here).
2. ``--trainer``: a real ``transformers.Trainer`` (logging_steps=1) with and without
   ``RunwatchCallback``, timed per step by a probe callback.

Figures per step: the hook's time on the training thread (p50 / p99 / max, measured
around the hook calls), the step-time difference (median with hook - median without:
what the training loop really lost, the worker thread's GIL share included), and the CPU
time per step of the training thread inside the hook and of the worker thread (each
thread's own clock: these move little with the machine's load; wall-clock figures do).
Goal: overhead <= max(1 % of the step, 1 ms), judged on the step-time difference and the
training thread's CPU time in the hook. The hook writes to an embedded log in a temporary
directory (``--kafka BOOTSTRAP``: to Kafka).

``--device cuda`` runs either loop on a GPU (the torch loop reads its loss each step, the
sync a real loop's logging makes; a GPU step is short, so the hook's share is larger).

Usage: ``python benchmarks/hook_overhead.py [--steps 400] [--blocks 8] [--trainer]
[--device cuda] [--kafka HOST:PORT] [--json]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from producers.hooks import RunwatchHook

ROW = {  # a GRPO log row as TRL 1.16 writes it
    "loss": 0.0123,
    "grad_norm": 0.61,
    "learning_rate": 1e-3,
    "num_tokens": 133.0,
    "completions/mean_length": 5.25,
    "completions/min_length": 3.0,
    "completions/max_length": 6.0,
    "completions/clipped_ratio": 0.75,
    "completions/mean_terminated_length": 3.0,
    "completions/min_terminated_length": 3.0,
    "completions/max_terminated_length": 3.0,
    "rewards/count_a/mean": 0.5,
    "rewards/count_a/std": 0.5,
    "reward": 0.5,
    "reward_std": 0.5,
    "frac_reward_zero_std": 0.25,
    "kl": 1e-4,
    "entropy": 2.94,
    "clip_ratio/low_mean": 0.0,
    "clip_ratio/high_mean": 0.0,
    "clip_ratio/region_mean": 0.0,
    "clip_ratio/low_min": 0.0,
    "clip_ratio/high_max": 0.0,
    "step_time": 0.7,
    "epoch": 0.125,
}


def _model(hidden: int, layers: int) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=512,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=128,
    )
    return LlamaForCausalLM(config)


def torch_loop(args: argparse.Namespace, hook: RunwatchHook, ckpt: Path) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    model = _model(args.hidden, args.layers).to(args.device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = torch.randint(0, 512, (args.batch, args.seq), device=args.device)

    def step() -> None:
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        float(loss.item())  # a loop logs its loss each step: on a GPU, the step's sync

    for _ in range(10):  # warm-up
        step()
    plain: list[float] = []
    hooked: list[float] = []
    in_hook: list[float] = []
    in_hook_cpu = 0.0
    worker_clock = time.pthread_getcpuclockid(hook.publisher._thread.ident)
    worker_cpu0 = time.clock_gettime(worker_clock)
    n = 0
    per_block = max(1, args.steps // args.blocks)
    for _block in range(args.blocks):
        for _ in range(per_block):
            t0 = time.perf_counter()
            step()
            plain.append(time.perf_counter() - t0)
        for _ in range(per_block):
            n += 1
            t0 = time.perf_counter()
            step()
            t1 = time.perf_counter()
            c1 = time.thread_time()
            hook.step_done(n)
            hook.log(ROW, step=n)
            if n % 50 == 0:
                hook.checkpoint(ckpt, n)
            hook.obey(n)  # the run's commands, and the out-of-touch guard (never paused here)
            in_hook_cpu += time.thread_time() - c1
            t2 = time.perf_counter()
            in_hook.append(t2 - t1)
            hooked.append(t2 - t0)
    hook.flush(60)
    worker_cpu = time.clock_gettime(worker_clock) - worker_cpu0
    return {
        "plain": plain,
        "hooked": hooked,
        "in_hook": in_hook,
        "in_hook_cpu_per_step": in_hook_cpu / n,
        "worker_cpu_per_step": worker_cpu / n,
    }


def trainer_loop(args: argparse.Namespace, hook_kwargs: dict[str, Any], tmp: Path) -> dict:
    import torch
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from producers.hooks import RunwatchCallback

    torch.set_num_threads(1)
    data = [{"input_ids": torch.randint(0, 512, (args.seq,))} for _ in range(64)]
    for d in data:
        d["labels"] = d["input_ids"]

    class Probe(TrainerCallback):
        def __init__(self) -> None:
            self.times: list[float] = []
            self.t = 0.0

        def on_step_begin(self, *a: Any, **k: Any) -> None:
            self.t = time.perf_counter()

        def on_substep_end(self, *a: Any, **k: Any) -> None:
            pass

        def on_log(self, *a: Any, **k: Any) -> None:  # after RunwatchCallback's on_log
            self.times.append(time.perf_counter() - self.t)

    out: dict[str, list[float]] = {"plain": [], "hooked": []}
    per_block = max(1, args.steps // args.blocks)
    for block in range(args.blocks * 2):
        hooked = block % 2 == 1
        probe = Probe()
        callbacks: list[Any] = [probe]
        if hooked:
            callbacks.insert(
                0,
                RunwatchCallback(
                    run_id=f"bench-trainer-{block}", close_on_end=False, **hook_kwargs
                ),
            )
        targs = TrainingArguments(
            output_dir=str(tmp / f"t{block}"),
            max_steps=per_block,
            logging_steps=1,
            per_device_train_batch_size=args.batch,
            report_to=[],
            save_strategy="no",
            use_cpu=args.device == "cpu",
            disable_tqdm=True,
        )
        trainer = Trainer(
            model=_model(args.hidden, args.layers),
            args=targs,
            train_dataset=data,
            callbacks=callbacks,
        )
        trainer.train()
        out["hooked" if hooked else "plain"].extend(probe.times[2:])  # skip warm-up steps
        if hooked:
            callbacks[0].hook.close()
    return out


def _q(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=400, help="hooked steps (as many plain)")
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--trainer", action="store_true", help="transformers.Trainer + callback")
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    ap.add_argument("--kafka", help="publish to this Kafka bootstrap instead of a temp log")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        kwargs: dict[str, Any] = {"spool": tmp / "spool", "install_exit_hooks": False}
        kwargs.update({"kafka": args.kafka} if args.kafka else {"log": tmp / "log"})
        ckpt = tmp / "ckpt"
        ckpt.mkdir()
        (ckpt / "model.safetensors").write_bytes(os.urandom(1 << 20))
        if args.trainer:
            res = trainer_loop(args, kwargs, tmp)
            stats: dict[str, Any] = {}
        else:
            hook = RunwatchHook("bench-torch", **kwargs)
            hook.start({"bench": "hook_overhead"})
            res = torch_loop(args, hook, ckpt)
            stats = hook.close().as_dict()
    plain_p50 = statistics.median(res["plain"])
    hooked_p50 = statistics.median(res["hooked"])
    diff = hooked_p50 - plain_p50
    budget = max(0.01 * plain_p50, 1e-3)
    out: dict[str, Any] = {
        "mode": "trainer" if args.trainer else "torch",
        "device": args.device,
        "steps_each": len(res["plain"]),
        "step_p50_ms_without_hook": plain_p50 * 1e3,
        "step_p50_ms_with_hook": hooked_p50 * 1e3,
        "step_diff_ms": diff * 1e3,
        "step_diff_pct": 100 * diff / plain_p50,
        "budget_ms": budget * 1e3,
    }
    if "in_hook" in res:
        out.update(
            in_hook_p50_us=_q(res["in_hook"], 0.5) * 1e6,
            in_hook_p99_us=_q(res["in_hook"], 0.99) * 1e6,
            in_hook_max_us=max(res["in_hook"]) * 1e6,
            in_hook_pct_of_step=100 * _q(res["in_hook"], 0.5) / plain_p50,
            in_hook_cpu_us_per_step=res["in_hook_cpu_per_step"] * 1e6,
            worker_cpu_us_per_step=res["worker_cpu_per_step"] * 1e6,
            events=stats.get("written", 0) + stats.get("spooled", 0),
        )
    # the goal on what the hook costs: the step-time difference and the training thread's
    # CPU in the hook; the wall-clock p99 in the hook is printed but includes the thread
    # being preempted by other processes on a shared box
    out["goal_met"] = diff <= budget and out.get("in_hook_cpu_us_per_step", 0) <= budget * 1e6
    if args.json:
        print(json.dumps(out))
        return
    print(
        f"mode {out['mode']}: {out['steps_each']} steps with and without the hook, "
        f"interleaved in {args.blocks} blocks"
    )
    print(f"  anchor: step without hook p50 {out['step_p50_ms_without_hook']:.2f} ms")
    print(
        f"  step with hook p50 {out['step_p50_ms_with_hook']:.2f} ms -> difference "
        f"{out['step_diff_ms']:+.3f} ms ({out['step_diff_pct']:+.2f} % of a step)"
    )
    if "in_hook" in res:
        print(
            f"  on the training thread: p50 {out['in_hook_p50_us']:.1f} us, p99 "
            f"{out['in_hook_p99_us']:.1f} us, max {out['in_hook_max_us']:.1f} us "
            f"({out['in_hook_pct_of_step']:.3f} % of a step); {out['events']} events"
        )
        print(
            f"  CPU per step: training thread in the hook {out['in_hook_cpu_us_per_step']:.1f}"
            f" us, worker thread {out['worker_cpu_us_per_step']:.1f} us (building, encoding,"
            " writing: off the training thread)"
        )
    print(
        f"  budget max(1 % of step, 1 ms) = {out['budget_ms']:.2f} ms -> goal "
        f"{'met' if out['goal_met'] else 'NOT met'}"
    )


if __name__ == "__main__":
    main()

"""Trainer figures (issue 5): CPU steps/s, checkpoint digest overhead, resume-gate cost.

    ~/.cache/runwatch/venv/bin/python benchmarks/trainer_bench.py [--steps 60] [--reps 30]

1. Steps/s on the test config (trainer/configs/test.yaml): training only (events to a
   MemorySink) and end to end (embedded log with fsync, checkpoints every 10 steps), with
   the median phase breakdown and how much of the step wall-clock the phases cover.
2. Checkpoint save time with and without sentinel digests (same state, ``--reps`` saves
   each, interleaved), and the digest share of the save; goal <= 2 %.
3. The resume gate: a run stopped after step 25 / 29 with its newest checkpoint at 20,
   resumed; gate cost in replayed steps and seconds (read + verify + restore + replay),
   next to the plain step time measured in the same run.

Every figure is printed next to its anchor from the same process. ``--device cuda`` runs
the same on a GPU where one is present (``scripts/device_check.sh`` runs both devices on
one machine, where the CPU run is the GPU run's anchor); ``--hidden/--heads/--layers``
change the test config's model (a GPU pays off only once a step's kernels are large).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from events.catalog.trainer import StepPhaseTimed
from producers.sinks import MemorySink
from trainer import checkpoint as ckpt
from trainer.config import load_config
from trainer.loop import Trainer, train
from trainer.publish import make_emitter
from trainer.resume import resume

CONFIG = Path(__file__).resolve().parents[1] / "trainer" / "configs" / "test.yaml"


def bench_steps(tmp: Path, steps: int, over: dict[str, Any]) -> dict[str, float]:
    cfg = load_config(CONFIG, run_id="bench-mem", steps=steps, **over)
    tr = Trainer(cfg, tmp / "mem")
    tr.train_step()  # warm-up, not counted
    t0 = time.perf_counter()
    for _ in range(steps - 1):
        tr.train_step()
    train_only = (steps - 1) / (time.perf_counter() - t0)

    cfg = load_config(CONFIG, run_id="bench-e2e", steps=steps, **over)
    sink = MemorySink()
    t0 = time.perf_counter()
    train(cfg, tmp / "e2e-mem", make_emitter(cfg.run_id, cfg.tenant_id, sink=sink))
    mem_s = time.perf_counter() - t0
    log = tmp / "log"
    t0 = time.perf_counter()
    train(cfg, tmp / "e2e", make_emitter(cfg.run_id, cfg.tenant_id, log_dir=log))
    e2e_s = time.perf_counter() - t0
    phases = [e for e in sink.events if isinstance(e, StepPhaseTimed)][1:]

    def med(f: str) -> float:
        return statistics.median(getattr(p, f) for p in phases)

    cover = [
        (p.rollout_s + p.score_s + p.sync_s + p.optim_s + p.idle_s + p.other_s) / p.wall_s
        for p in phases
    ]
    return {
        "steps_per_s_train_only": train_only,
        "steps_per_s_run_memory_sink": steps / mem_s,
        "steps_per_s_run_embedded_log": steps / e2e_s,
        "run_s_embedded_log": e2e_s,
        "median_wall_s": med("wall_s"),
        "median_rollout_s": med("rollout_s"),
        "median_score_s": med("score_s"),
        "median_optim_s": med("optim_s"),
        "median_sync_s": med("sync_s"),
        "median_other_s": med("other_s"),
        "phase_coverage_median": statistics.median(cover),
        "phase_coverage_min": min(cover),
    }


def bench_checkpoint(tmp: Path, reps: int, over: dict[str, Any]) -> dict[str, float]:
    """Saves of one state with crc32 sentinels (default), sha256 sentinels and none,
    interleaved in rotating order; every save includes its three fsyncs."""
    cfg = load_config(CONFIG, run_id="bench-ckpt", steps=10, **over)
    tr = Trainer(cfg, tmp / "ckpt")
    for _ in range(3):
        tr.train_step()
    times: dict[str, list[float]] = {"crc32": [], "sha256": [], "none": []}
    digest_s: dict[str, list[float]] = {"crc32": [], "sha256": []}
    size = 0
    algos = ("crc32", "sha256", "none")
    for i in range(reps):
        for algo in algos[i % 3 :] + algos[: i % 3]:
            d = tmp / "saves" / f"{i}-{algo}"
            res = ckpt.write_checkpoint(
                d, step=3, run_id="b", state=tr.parts(), pins=tr.pins, digest=algo
            )
            times[algo].append(res.total_s)
            if algo != "none":
                digest_s[algo].append(res.digest_s)
            size = res.info.size_bytes
            shutil.rmtree(d)
    med = {a: statistics.median(v) for a, v in times.items()}
    low = {a: min(v) for a, v in times.items()}
    out: dict[str, float] = {"checkpoint_bytes": size}
    for algo in ("crc32", "sha256"):
        dmed = statistics.median(digest_s[algo])
        out |= {
            f"save_s_median_{algo}": med[algo],
            f"save_s_min_{algo}": low[algo],
            f"digest_s_median_{algo}": dmed,
            f"digest_s_min_{algo}": min(digest_s[algo]),
            # the digest's own time inside each save, over that save's total
            f"digest_pct_of_save_{algo}": 100
            * statistics.median(x / t for x, t in zip(digest_s[algo], times[algo])),
            f"digest_pct_by_diff_of_medians_{algo}": 100 * (med[algo] - med["none"]) / med[algo],
            f"digest_pct_by_diff_of_minima_{algo}": 100 * (low[algo] - low["none"]) / low[algo],
        }
    out |= {"save_s_median_none": med["none"], "save_s_min_none": low["none"]}
    d = tmp / "saves" / "verify"
    ckpt.write_checkpoint(d, step=3, run_id="b", state=tr.parts(), pins=tr.pins)
    t0 = time.perf_counter()
    for _ in range(reps):
        ckpt.read_checkpoint(d)
    out["read_and_verify_s"] = (time.perf_counter() - t0) / reps
    return out


def bench_gate(tmp: Path, over: dict[str, Any], stops: tuple[int, ...] = (25, 29)) -> list[dict]:
    out = []
    for stop in stops:
        base = tmp / f"gate-{stop}"
        cfg = load_config(CONFIG, run_id="gate", steps=stop + 1, **over)
        log = base / "log"
        tr = Trainer(cfg, base / "run", make_emitter("gate", cfg.tenant_id, log_dir=log))
        tr.start()
        t0 = time.perf_counter()
        tr.run_until(stop)
        step_s = (time.perf_counter() - t0) / stop
        seen: list[str] = []
        t0 = time.perf_counter()
        result, _ = resume(log, "gate", progress=seen.append)
        total = time.perf_counter() - t0
        out.append(
            {
                "stopped_after": stop,
                "checkpoint_step": result.checkpoint_step,
                "replayed_steps": result.replay_steps,
                "replay_s": result.replay_s,
                "gate_s": result.gate_s,
                "certified": result.certified,
                "max_deviation": result.max_deviation,
                "resume_total_s": total,
                "mean_step_s_same_run": step_s,
            }
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--hidden", type=int, help="override the test config's model.hidden")
    ap.add_argument("--heads", type=int, help="override model.heads")
    ap.add_argument("--layers", type=int, help="override model.layers")
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--only", choices=("steps", "checkpoint", "gate"), help="run one section (default: all)"
    )
    args = ap.parse_args()
    model = load_config(CONFIG).model.model_dump()
    for key in ("hidden", "heads", "layers"):
        if getattr(args, key) is not None:
            model[key] = getattr(args, key)
    over: dict[str, Any] = {"device": args.device, "model": model}
    tmp = Path(tempfile.mkdtemp(prefix="trainer-bench-"))
    try:
        env = {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "device": args.device,
            "cpu_threads": 1,
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "model": {k: model[k] for k in ("hidden", "heads", "layers")},
        }
        want = {args.only} if args.only else {"steps", "checkpoint", "gate"}
        steps = bench_steps(tmp, args.steps, over) if "steps" in want else None
        saves = bench_checkpoint(tmp, args.reps, over) if "checkpoint" in want else None
        gate = bench_gate(tmp, over) if "gate" in want else []
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report = {"env": env, "steps": steps, "checkpoint": saves, "resume_gate": gate}
    if args.json:
        print(json.dumps(report))
        return
    print(f"env: {env}")
    if steps is not None:
        s = steps
        print(
            f"steps/s, test config, {args.device}: training only "
            f"{s['steps_per_s_train_only']:.1f}; "
            f"whole run to MemorySink {s['steps_per_s_run_memory_sink']:.1f}; whole run to the "
            f"embedded log (fsync) + checkpoints {s['steps_per_s_run_embedded_log']:.1f} "
            f"({args.steps} steps in {s['run_s_embedded_log']:.1f}s)"
        )
        print(
            f"  median step {1000 * s['median_wall_s']:.1f} ms = rollout "
            f"{1000 * s['median_rollout_s']:.1f} + score {1000 * s['median_score_s']:.1f} + optim "
            f"{1000 * s['median_optim_s']:.1f} + sync {1000 * s['median_sync_s']:.2f} + other "
            f"{1000 * s['median_other_s']:.1f}; phases cover "
            f"{100 * s['phase_coverage_median']:.1f}% "
            f"of wall (min {100 * s['phase_coverage_min']:.1f}%)"
        )
    if saves is not None:
        c = saves
        print(
            f"checkpoint ({c['checkpoint_bytes']} bytes, {args.reps} saves per mode, each with "
            f"3 fsyncs): median save {1000 * c['save_s_median_none']:.2f} ms without digests "
            f"(fastest {1000 * c['save_s_min_none']:.2f})"
        )
        for algo in ("crc32", "sha256"):
            print(
                f"  {algo} sentinels: digest {1000 * c[f'digest_s_median_{algo}']:.3f} ms "
                f"(fastest {1000 * c[f'digest_s_min_{algo}']:.3f}) = "
                f"{c[f'digest_pct_of_save_{algo}']:.2f}% of the save (median of per-save "
                f"shares; goal <= 2%); save {1000 * c[f'save_s_median_{algo}']:.2f} ms median, "
                f"{c[f'digest_pct_by_diff_of_medians_{algo}']:.1f}% by difference of medians, "
                f"{c[f'digest_pct_by_diff_of_minima_{algo}']:.1f}% by difference of minima "
                f"(end to end; fsync and CPU-share noise)"
            )
        print(f"  read + verify every digest on load: {1000 * c['read_and_verify_s']:.2f} ms")
    for g in gate:
        print(
            f"resume gate, stopped after step {g['stopped_after']}, checkpoint "
            f"{g['checkpoint_step']}: replayed {g['replayed_steps']} steps in "
            f"{g['replay_s']:.3f}s (certified={g['certified']}, max dev {g['max_deviation']}); "
            f"whole gate (read+verify+restore+replay) {g['gate_s']:.3f}s; resume incl. finishing "
            f"the run {g['resume_total_s']:.2f}s; a plain step "
            f"in the same run {1000 * g['mean_step_s_same_run']:.1f} ms"
        )


if __name__ == "__main__":
    main()

"""What a multi-process run pays per step for obeying its commands: the verdict broadcast.

    python benchmarks/hook_verdict.py [--procs 2] [--steps 2000]

Launches itself under ``torchrun`` (``--procs`` CPU processes, gloo) and times, per step,
:meth:`producers.hooks.ranks.WorldVerdict.share` with nothing to obey (process zero says
GO, the others take it) against the anchor measured in the same processes: a gloo
``barrier`` (the cheapest collective a step boundary could add). Prints both and the
ratio. On GPUs the broadcast goes over NCCL (not measured here: this box has none).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def measure(steps: int) -> None:
    import torch.distributed as dist

    sys.path.insert(0, str(ROOT))
    from producers.hooks.ranks import WorldVerdict

    dist.init_process_group("gloo")
    verdict = WorldVerdict(1800.0)
    for _ in range(50):  # warm up
        verdict.share(lambda keepalive: False)
        dist.barrier()
    t0 = time.perf_counter()
    for _ in range(steps):
        verdict.share(lambda keepalive: False)
    share_s = (time.perf_counter() - t0) / steps
    t0 = time.perf_counter()
    for _ in range(steps):
        dist.barrier()
    barrier_s = (time.perf_counter() - t0) / steps
    if dist.get_rank() == 0:
        print(
            f"{dist.get_world_size()} processes (gloo), {steps} steps: verdict "
            f"{share_s * 1e6:.0f} us per step; anchor: a barrier {barrier_s * 1e6:.0f} us; "
            f"ratio {share_s / barrier_s:.2f} (the hooks' goal: max(1 %, 1 ms) a step)"
        )
    dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--steps", type=int, default=2000)
    args = ap.parse_args()
    if "RANK" in os.environ:
        measure(args.steps)
        return 0
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc_per_node={args.procs}", __file__, "--steps", str(args.steps),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.call(cmd, env=env)


if __name__ == "__main__":
    raise SystemExit(main())

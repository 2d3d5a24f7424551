"""Per-batch overhead of the reward sandbox over an in-process call, side by side.

Executors, all scoring the same batches with the same reward function in the same run:

1. ``in-process``: the reward imported into this process (the anchor; what the sandbox
   forbids in production).
2. ``sandbox warm (function tier)``: ``RewardClient`` with a warm pool, worker reused for
   ``recycle_every`` batches, scratch emptied and strays killed after every batch.
3. ``sandbox warm (verifier tier)``: a fresh sandbox per batch, pre-spawned by the pool
   (back-to-back batches: the pool has only the previous batch's time to spawn the next).
4. ``fresh sandbox per call``: a full sandbox spawned, handshaken and torn down per batch.
5. ``fresh process per call``: seed 002's executor in miniature (``multiprocessing.Process``
   per batch, fork, no isolation).

Overhead per batch = executor latency - the in-process latency of the same batch (measured
interleaved, so both see the same machine load). Prints p50/p99 overhead and batches/s.

Usage: ``python benchmarks/sandbox_overhead.py [--batches 300] [--batch-size 64] [--json]``
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing as mp
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sandbox.client import FailurePolicy, RewardClient
from sandbox.features import probe, tier_gate
from sandbox.types import SandboxConfig

REWARD = """
def reward(batch):
    out = []
    for item in batch:
        words = item["completion"].split()
        uniq = len(set(words)) / max(1, len(words))
        has_answer = 1.0 if "answer" in item["completion"] else 0.0
        out.append(0.5 * uniq + 0.5 * has_answer)
    return out
"""

GOAL_P50_MS = 5.0


def make_batch(i: int, size: int) -> list[dict[str, str]]:
    return [
        {
            "prompt": f"Question {i}-{j}: what is {j} times {i}? Explain step by step.",
            "completion": f"Step one, we multiply {j} by {i}. " * 4 + f"The answer is {i * j}.",
        }
        for j in range(size)
    ]


def load_in_process(path: Path) -> Callable[[list[dict[str, Any]]], list[float]]:
    spec = importlib.util.spec_from_file_location("bench_reward", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.reward


def _mp_worker(path: str, batch: list[dict[str, Any]], q: Any) -> None:
    q.put(load_in_process(Path(path))(batch))


def fresh_process_call(path: Path, batch: list[dict[str, Any]]) -> list[float]:
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_mp_worker, args=(str(path), batch, q), daemon=True)
    p.start()
    out = q.get(timeout=10)
    p.join()
    return out


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))]


def measure(
    name: str,
    call: Callable[[list[dict[str, Any]]], Any],
    inproc: Callable[[list[dict[str, Any]]], Any],
    batches: list[list[dict[str, Any]]],
    expected: list[list[float]],
    gap_s: float = 0.0,
) -> dict[str, Any]:
    over: list[float] = []
    lat: list[float] = []
    t_all = time.perf_counter()
    for b, exp in zip(batches, expected):
        if gap_s:
            time.sleep(gap_s)  # the trainer's step between two reward batches
        t0 = time.perf_counter()
        inproc(b)
        t1 = time.perf_counter()
        got = call(b)
        t2 = time.perf_counter()
        if [round(x, 9) for x in got] != [round(x, 9) for x in exp]:
            raise SystemExit(f"{name}: wrong scores")
        lat.append(t2 - t1)
        over.append((t2 - t1) - (t1 - t0))
    wall = time.perf_counter() - t_all
    in_total = sum(lat[i] - over[i] for i in range(len(lat)))
    return {
        "executor": name,
        "batches": len(batches),
        "latency_p50_ms": pct(lat, 50) * 1e3,
        "latency_p99_ms": pct(lat, 99) * 1e3,
        "overhead_p50_ms": pct(over, 50) * 1e3,
        "overhead_p99_ms": pct(over, 99) * 1e3,
        "batches_per_s": None if gap_s else len(batches) / max(1e-9, wall - in_total),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=300)
    ap.add_argument("--fresh-batches", type=int, default=40, help="batches for fresh executors")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--gap-ms", type=float, default=250.0, help="paced verifier run: step gap")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    gate = tier_gate(probe(), "verifier")
    if not gate.allowed:
        print(f"sandbox unavailable: {gate.message}", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="rw-bench-"))
    path = tmp / "reward.py"
    path.write_text(REWARD)
    inproc = load_in_process(path)
    batches = [make_batch(i, args.batch_size) for i in range(args.batches)]
    expected = [inproc(b) for b in batches]
    fresh_b, fresh_e = batches[: args.fresh_batches], expected[: args.fresh_batches]

    def via(client: RewardClient) -> Callable[[list[dict[str, Any]]], list[float]]:
        def call(b: list[dict[str, Any]]) -> list[float]:
            out = client.score(b)
            if not out.ok or out.scores is None:
                raise SystemExit(f"sandbox failed: {out.cause.value}: {out.message}")
            return list(out.scores)

        return call

    results = [measure("in-process (anchor)", inproc, inproc, batches[:50], expected[:50])]
    skip = FailurePolicy("skip")
    fn_cfg = SandboxConfig(tier="function", recycle_every=50, warm_workers=1)
    with RewardClient(path, "bench-fn", tier="function", policy=skip, config=fn_cfg) as c:
        time.sleep(0.3)
        results.append(measure("sandbox warm, function tier", via(c), inproc, batches, expected))
    vf_cfg = SandboxConfig(tier="verifier", warm_workers=2)
    with RewardClient(path, "bench-vf", tier="verifier", policy=skip, config=vf_cfg) as c:
        time.sleep(0.3)
        results.append(
            measure("sandbox warm, verifier tier, back-to-back", via(c), inproc, fresh_b, fresh_e)
        )
        results.append(
            measure(
                f"sandbox warm, verifier tier, {args.gap_ms:.0f} ms apart",
                via(c),
                inproc,
                fresh_b,
                fresh_e,
                gap_s=args.gap_ms / 1e3,
            )
        )
    cold_cfg = SandboxConfig(tier="verifier", warm_workers=0)
    with RewardClient(
        path, "bench-cold", tier="verifier", policy=skip, config=cold_cfg, prewarm=False
    ) as c:
        results.append(measure("fresh sandbox per call", via(c), inproc, fresh_b, fresh_e))
    results.append(
        measure(
            "fresh process per call (no isolation)",
            lambda b: fresh_process_call(path, b),
            inproc,
            fresh_b,
            fresh_e,
        )
    )

    warm = results[1]
    verdict = "MET" if warm["overhead_p50_ms"] <= GOAL_P50_MS else "MISSED"
    if args.json:
        print(
            json.dumps(
                {
                    "batch_size": args.batch_size,
                    "goal_p50_ms": GOAL_P50_MS,
                    "verdict": verdict,
                    "results": results,
                },
                indent=2,
            )
        )
        return 0
    print(f"reward sandbox overhead, batch of {args.batch_size} (prompt, completion) pairs")
    hdr = (
        f"{'executor':<44} {'n':>5} {'lat p50':>9} {'lat p99':>9} {'ovh p50':>9} "
        f"{'ovh p99':>9} {'batch/s':>9}"
    )
    print(hdr)
    print("-" * len(hdr))
    for r in results:
        print(
            f"{r['executor']:<44} {r['batches']:>5} {r['latency_p50_ms']:>8.2f}m "
            f"{r['latency_p99_ms']:>8.2f}m {r['overhead_p50_ms']:>8.2f}m "
            f"{r['overhead_p99_ms']:>8.2f}m "
            + (f"{r['batches_per_s']:>9.1f}" if r["batches_per_s"] is not None else f"{'-':>9}")
        )
    print(
        f"goal: warm-pool overhead p50 <= {GOAL_P50_MS} ms -> {verdict} "
        f"({warm['overhead_p50_ms']:.2f} ms); times in ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""reward_hacking's false-alarm budget and its speed limit, on seeds its design never saw.

    python benchmarks/reward_hacking_budget.py [--runs 400] [--baseline FILE]

1. **False pages** of ``reward_hacking`` alone on fresh healthy synthetic runs (seeds
   1000 .. 1000+runs; ``detector_quality.py`` uses 0-199) of four shapes (``rising``,
   ``noisy``, ``plateau``, ``eval_10``), and on a stress shape the quality benchmark lacks:
   ``decoupled``, the rising run's reward with the plateau run's eval (same seed, same eval
   cadence) — a reward that climbs while the eval holds, where only the eval's own
   threshold guards (the budget's worst case, see ``reward_hacking.py``).
2. **The bound**: for the gameable-reward runs of ``detector_quality.py`` (same seeds and
   injection steps), each eval point's fall below the mean of the 8 eval points before it,
   in units of the run's eval noise (second differences of the evals before the
   injection) times ``sqrt(1 + 1/8)`` — the reward ignored, so what the eval alone shows.
   At an eval every 10 steps: the largest fall within two intervals; at an eval every 5-20
   (the fault table's runs): the p90 lag to the first point fallen ``z`` units. A run
   whose eval has fallen two units cannot be called by a rule that keeps healthy runs
   quiet (a healthy eval point falls that far by chance 2 % of the time).

3. **Cost**: CPU per step event and per eval event of the detector alone over the first 100
   fresh ``rising`` runs: all their events folded, then only their steps; the difference
   over the eval events is an eval event's cost.

Anchor: ``--baseline FILE`` is another version of ``reward_hacking.py`` (e.g. the one
before #17 round two: ``git show 78d02b2:stream_processors/detectors/reward_hacking.py >
/tmp/rh_before.py``) folded over the same runs with its own default params; the table
prints both and their ratio. Deterministic (fixed seeds, pure folds).
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from events.envelope import EventBase
from stream_processors.detectors import base, load_catalog
from stream_processors.detectors import reward_hacking as packaged
from stream_processors.detectors.base import RunContext, Settings
from stream_processors.detectors.scenarios import FAULTS, synthetic_run

SHAPES = ("rising", "noisy", "plateau", "eval_10")
CTX = RunContext(run_id="r", tenant_id="tenant-synth", algorithm="grpo")


def load_module(path: Path) -> Any:
    """A reward_hacking module from a file; its state records registered apart."""
    spec = importlib.util.spec_from_file_location("reward_hacking_baseline", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    saved = dict(base.STATE_TYPES)
    base.STATE_TYPES.clear()  # the baseline may reuse the packaged record names
    try:
        spec.loader.exec_module(module)
    finally:
        base.STATE_TYPES.clear()
        base.STATE_TYPES.update(saved)
    return module


def settings(module: Any, params: Any) -> Settings[Any]:
    return Settings("reward_hacking", "algorithmic", "page", "-", params, "bench")


def fires(module: Any, cfg: Settings[Any], events: list[EventBase], after: int = -1) -> int:
    """The step of the first AlertFired at or after ``after``; -1 if none."""
    det = module.DETECTOR
    st = det.initial()
    for ev in events:
        if ev.type in det.handles:
            st, out = det.apply(st, ev, cfg, CTX)
            if any(a.type == "AlertFired" for a in out) and (ev.step or 0) >= after:
                return ev.step or 0
    return -1


def decoupled(rising: list[EventBase], plateau: list[EventBase]) -> list[EventBase]:
    """The rising run's steps with the plateau run's evals (same seed: same cadence)."""
    evals = {e.step: e for e in plateau if e.type == "EvalGateScored"}
    out: list[EventBase] = []
    for ev in rising:
        if ev.type == "EvalGateScored":
            out.append(evals[ev.step])
        elif ev.type == "TrainerStepCompleted":
            out.append(ev)
    return out


def falls(events: list[EventBase], at: int) -> list[tuple[int, float]]:
    """(step, fall) for each eval point at or after ``at``: how far below the mean of the 8
    eval points before it, in noise units x sqrt(1 + 1/8) (noise: second differences of
    the evals before ``at``)."""
    points = [(e.step or 0, e.score) for e in events if e.type == "EvalGateScored"]
    before = np.array([s for st, s in points if st < at])
    d2 = before[2:] - 2 * before[1:-1] + before[:-2]
    sigma = math.sqrt(float(np.mean(d2 * d2)) / 6.0)
    out = []
    for i, (st, score) in enumerate(points):
        if st >= at and i >= 8:
            level = float(np.mean([s for _, s in points[i - 8 : i]]))
            out.append((st, (level - score) / (sigma * math.sqrt(1 + 1 / 8))))
    return out


def gameable_runs(shape: str, steps: int, skip: int) -> list[tuple[int, list[EventBase]]]:
    """The gameable-reward runs of ``detector_quality.py`` (same seeds, same injection
    steps: its generator skips ``skip`` draws for the faults listed before this one)."""
    rng = np.random.default_rng(2026)
    rng.integers(150, 250, size=skip)
    out = []
    for i in range(40):
        at = int(rng.integers(150, 250))
        out.append((at, synthetic_run(10_000 + i, steps=steps, fault="gameable_reward",
                                      fault_step=at, shape=shape)))  # fmt: skip
    return out


def costs(module: Any, cfg: Settings[Any], runs: list[list[EventBase]]) -> tuple[float, float]:
    """(us per step event, us per eval event) of ``module``'s detector, best of 3."""
    handled = [[e for e in ev if e.type in module.DETECTOR.handles] for ev in runs]
    steps = [[e for e in ev if e.type == "TrainerStepCompleted"] for ev in handled]
    n_steps = sum(map(len, steps))
    n_evals = sum(map(len, handled)) - n_steps

    def cpu(batches: list[list[EventBase]]) -> float:
        best = math.inf
        for _ in range(3):
            t0 = time.process_time()
            for events in batches:
                fires(module, cfg, events)
            best = min(best, time.process_time() - t0)
        return best

    all_s, step_s = cpu(handled), cpu(steps)
    return step_s / n_steps * 1e6, (all_s - step_s) / n_evals * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=400)
    ap.add_argument("--baseline", type=Path, help="another reward_hacking.py to compare")
    args = ap.parse_args()
    catalog = load_catalog()
    rules = {"this catalog": (packaged, catalog.settings(packaged.DETECTOR, "t", "grpo"))}
    if args.baseline:
        old = load_module(args.baseline)
        rules["baseline"] = (old, settings(old, old.Params()))
    started = time.perf_counter()
    counts = {name: dict.fromkeys((*SHAPES, "decoupled"), 0) for name in rules}
    for seed in range(1000, 1000 + args.runs):
        runs = {shape: synthetic_run(seed, steps=400, shape=shape) for shape in SHAPES}
        runs["decoupled"] = decoupled(runs["rising"], runs["plateau"])
        for name, (module, cfg) in rules.items():
            for shape, events in runs.items():
                counts[name][shape] += fires(module, cfg, events) >= 0
    rising = [synthetic_run(seed, steps=400) for seed in range(1000, 1100)]
    cost = {name: costs(module, cfg, rising) for name, (module, cfg) in rules.items()}
    best, caught = [], dict.fromkeys(rules, 0)
    for at, events in gameable_runs("eval_10", 800, 0):  # the cadence table's runs
        best.append(max((f for st, f in falls(events, at) if st <= at + 20), default=-9.0))
        for name, (module, cfg) in rules.items():
            caught[name] += 0 <= fires(module, cfg, events, after=at) - at <= 20
    skip = 40 * list(FAULTS).index("gameable_reward")
    bound_lags: dict[float, list[int]] = {z: [] for z in (2.0, 2.5, 3.0)}
    rule_lags: dict[str, list[int]] = {name: [] for name in rules}
    for at, events in gameable_runs("rising", 400, skip):  # the fault table's runs
        fallen = falls(events, at)
        for z, lags in bound_lags.items():
            lags.append(next((st - at for st, f in fallen if f >= z), 400))
        for name, (module, cfg) in rules.items():
            rule_lags[name].append(fires(module, cfg, events, after=at) - at)
    seconds = time.perf_counter() - started

    print(f"reward_hacking false pages, {args.runs} fresh healthy runs per shape (seeds 1000+),"
          f" catalog {catalog.version} ({seconds:.0f} s)")  # fmt: skip
    head = f"{'rule':14s}" + "".join(f"{s:>11s}" for s in (*SHAPES, "decoupled"))
    print(head)
    for name, row in counts.items():
        print(f"{name:14s}" + "".join(f"{row[s]:>11d}" for s in (*SHAPES, "decoupled")))
    if args.baseline:
        total = {name: sum(row.values()) for name, row in counts.items()}
        ratio = total["this catalog"] / max(total["baseline"], 1)
        print(f"all shapes: {total['this catalog']} vs baseline {total['baseline']} "
              f"(ratio {ratio:.2f})")  # fmt: skip
    print()
    for name, (per_step, per_eval) in cost.items():
        print(f"cost ({name}): {per_step:.2f} us per step event, {per_eval:.1f} us per eval "
              "event (the detector alone)")  # fmt: skip
    print()
    print("gameable reward, eval every 10 (the 40 runs of QUALITY.md's cadence table): the "
          "largest fall within two intervals, eval only")  # fmt: skip
    for z in (1.5, 2.0, 2.5, 3.0):
        print(f"  runs with a fall >= {z} units: {sum(f >= z for f in best)}/40")
    for name, n in caught.items():
        print(f"  {name}: caught within two intervals {n}/40")
    order = sorted(range(40), key=lambda k: best[k])
    print("  weakest runs (run: best fall): "
          + ", ".join(f"{k}: {best[k]:.1f}" for k in order[:6]))  # fmt: skip
    print("gameable reward, eval every 5-20 (the 40 runs of QUALITY.md's fault table): lag p90 "
          "to the first eval point that has fallen z units, eval only")  # fmt: skip
    for z, lags in bound_lags.items():
        print(f"  z = {z}: p90 {np.percentile(lags, 90):.0f} steps")
    for name, lags in rule_lags.items():
        print(f"  {name}: p90 {np.percentile(lags, 90):.0f} steps")


if __name__ == "__main__":
    main()

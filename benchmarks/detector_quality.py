"""Detector quality: false pages on healthy runs of several shapes, detection lag on faults,
and the money each fault burns before its alert.

    python benchmarks/detector_quality.py [--healthy 200] [--faulty 40] [--steps 400] [--canaries]

Healthy runs: ``stream_processors.detectors.scenarios.synthetic_run(seed, shape=...)`` for
``--healthy`` seeds of every shape in ``scenarios.SHAPES`` (rising reward, plateau, noisy,
large slow entropy decline, long-reasoning length growth, eval every 10 / 50 / 100 steps;
the sparse-eval shapes run twice as long so they hold enough eval points). Each run has
its own reward curve, eval gate, KL growth, entropy decline, grad norms, generation
length, phase timings, usage and checkpoints. False positive = any ``AlertFired`` on a
healthy run; the figure that matters is the *paging* one (must be 0).

Faulty runs: every fault of ``scenarios.FAULTS`` injected at a step drawn in [150, 250)
into ``--faulty`` runs of the default (rising) shape; detection = the fault's own
detector fired at or after the injection; lag = steps from the fault becoming detectable
to that AlertFired: the injection, except for a stuck checkpoint writer (from the first
checkpoint that was due and not written) and a run without an eval gate (from the first
eval that was due). "Also fired" lists the other detectors that fired on those runs (an
oversized LR is expected to collapse entropy too).

Reward hacking by eval cadence: the gameable fault in runs with an eval every 10, 50 and
100 steps, lag also counted in eval intervals (goal: within two intervals).

Money before detection: the synthetic runs bill 8 GPUs x each step's wall time (10-60 s)
as ``UsageRecorded``; the GPU-seconds from the fault to its alert are priced at the
trainer pool's price in ``stream_processors/accounting/prices.yaml`` (the same list the bill and the
dead-run alert use). The ``8 GPUs, 1 step/min`` column prices the p90 lag for a run of
that shape instead.

``--canaries`` also runs the seed's canaries on the real GRPO trainer (``runwatch train``
with ``trainer/configs/canary-*.yaml`` and the healthy ``default.yaml`` / ``test.yaml``,
a Llama policy with vLLM rollouts on CPU, a few minutes) and lists which alerts each run
raised, at which step.

Writes ``stream_processors/detectors/QUALITY.md`` (beside the catalog) and prints it.
Deterministic: seeds are fixed, the folds are pure.
"""

from __future__ import annotations

import argparse
import collections
import time
from pathlib import Path
from typing import Any

import numpy as np

from stream_processors.accounting import Prices
from stream_processors.detectors import DETECTORS, RunHealthFold, load_catalog
from stream_processors.detectors.scenarios import FAULTS, SHAPES, synthetic_run

OUT = Path(__file__).resolve().parents[1] / "stream_processors" / "detectors" / "QUALITY.md"
#: the stated price for the per-step column: 8 GPUs at one step a minute
GPUS, STEP_S = 8, 60.0


def fold_run(fold: RunHealthFold, events: list) -> list:
    state, alerts = fold.initial(), []
    for ev in events:
        state, out = fold.apply(state, ev)
        alerts.extend(a for a in out if a.type == "AlertFired" and not a.escalated)
    return alerts


def shape_steps(shape: str, steps: int) -> int:
    return 2 * steps if shape in ("eval_50", "eval_100") else steps


def healthy_table(fold: RunHealthFold, n: int, steps: int) -> tuple[list[str], dict[str, int]]:
    routing = {d.name: fold.catalog.settings(d, "tenant-synth", "grpo").routing for d in DETECTORS}
    runs: dict[str, collections.Counter[str]] = {}
    pages: dict[str, int] = {}
    for shape in SHAPES:
        fired: collections.Counter[str] = collections.Counter()
        paged = 0
        for seed in range(n):
            alerts = fold_run(fold, synthetic_run(seed, steps=shape_steps(shape, steps),
                                                  shape=shape))  # fmt: skip
            fired.update({a.detector for a in alerts})
            paged += any(a.routing == "page" for a in alerts)
        runs[shape], pages[shape] = fired, paged
    head = "| detector | routing | " + " | ".join(SHAPES) + " |"
    lines = [head, "| --- | --- | " + " | ".join("---:" for _ in SHAPES) + " |"]
    for det in DETECTORS:
        cells = " | ".join(f"{runs[s][det.name]}" for s in SHAPES)
        lines.append(f"| {det.name} | {routing[det.name]} | {cells} |")
    pages_row = " | ".join(f"**{pages[s]}**" for s in SHAPES)
    lines.append(f"| **runs with any page** | | {pages_row} |")
    return lines, pages


def _onset(fault: str, at: int, events: list) -> int:
    """The step from which the fault is detectable (see the module docstring)."""
    if fault == "checkpoint_writer_stuck":
        return _next_due(events, at)
    if fault == "no_eval_gate":
        config = dict(next(e for e in events if e.type == "RunSubmitted").config)
        return int(config["eval_every"]) - 1
    return at


def _next_due(events: list, at: int) -> int:
    config = dict(next(e for e in events if e.type == "RunSubmitted").config)
    every = int(config["checkpoint_every_steps"])
    written = [e.step for e in events if e.type == "CheckpointWritten" and e.step < at]
    return (written[-1] if written else -1) + every


def _spend(events: list, after: int, upto: int, price: float) -> float:
    return price * sum(
        e.device_seconds for e in events if e.type == "UsageRecorded" and after <= e.step <= upto
    )


def fault_rows(
    fold: RunHealthFold, n: int, steps: int, price: float
) -> list[tuple[str, str, list[int], list[float], collections.Counter[str]]]:
    rng = np.random.default_rng(2026)
    rows = []
    for fault, detector in FAULTS.items():
        lags: list[int] = []
        money: list[float] = []
        collateral: collections.Counter[str] = collections.Counter()
        for i in range(n):
            at = int(rng.integers(150, 250))
            events = synthetic_run(10_000 + i, steps=steps, fault=fault, fault_step=at)
            fired = fold_run(fold, events)
            onset = _onset(fault, at, events)
            floor = 0 if fault == "no_eval_gate" else at
            hit = [a.step for a in fired if a.detector == detector and a.step >= floor]
            if hit:
                lags.append(hit[0] - onset)
                money.append(_spend(events, onset, hit[0], price))
            collateral.update({a.detector for a in fired if a.detector != detector})
        rows.append((fault, detector, lags, money, collateral))
    return rows


def hacking_by_cadence(fold: RunHealthFold, n: int, steps: int) -> list[str]:
    lines = [
        "| eval every | detected | lag p50 | lag p90 | lag max | p90 in eval intervals "
        "| within 2 intervals | fired at eval point p90 / max | within 2 intervals of the "
        "first eval after it |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for every in (10, 50, 100):
        rng = np.random.default_rng(2026)
        lags, points = [], []
        for i in range(n):
            at = int(rng.integers(150, 250))
            events = synthetic_run(10_000 + i, steps=2 * steps, fault="gameable_reward",
                                   fault_step=at, shape=f"eval_{every}")  # fmt: skip
            hit = [a.step for a in fold_run(fold, events)
                   if a.detector == "reward_hacking" and a.step >= at]  # fmt: skip
            if hit:
                lags.append(hit[0] - at)
                # evals land at steps s % every == every - 1; the first at or after ``at``
                # is point 1 (it shows at most one interval of the fall)
                first_eval = at + (every - 1 - at) % every
                points.append((hit[0] - first_eval) // every + 1)
        within = sum(1 for lag in lags if lag <= 2 * every)
        p50, p90, mx = (np.percentile(lags, q) for q in (50, 90, 100)) if lags else (0, 0, 0)
        by_point = sum(1 for k in points if k <= 3)
        lines.append(
            f"| {every} | {len(lags)}/{n} | {p50:.0f} | {p90:.0f} | {mx:.0f} | "
            f"{p90 / every:.1f} | {within}/{n} | {_pct(points, 90)} / {_pct(points, 100)} | "
            f"{by_point}/{n} |"
        )
    return lines


def canary_table() -> list[str]:
    """Run the real trainer's canaries into a fresh log and tabulate the alerts."""
    import subprocess
    import sys
    import tempfile

    from events.log.embedded import EmbeddedLog

    configs = Path(__file__).resolve().parents[1] / "trainer" / "configs"
    names = ["canary-oversized-lr", "canary-constant-reward", "canary-gameable-reward",
             "canary-frozen-sync", "default", "test"]  # fmt: skip
    run_ids = {"default": "demo-healthy", "test": "test-run"}
    with tempfile.TemporaryDirectory() as tmp:
        log_dir = Path(tmp) / "log"
        cli = [sys.executable, "-m", "runwatch.cli.main"]
        for name in names:
            subprocess.run(
                [*cli, "train", "--config", str(configs / f"{name}.yaml"), "--log",
                 str(log_dir), "--runs", str(Path(tmp) / "runs"), "--quiet"],
                check=True, capture_output=True,
            )  # fmt: skip
        subprocess.run([*cli, "process", "--log", str(log_dir), "--once"], check=True)
        log = EmbeddedLog(log_dir, readonly=True)
        log.open_sync()
        fired: dict[str, list[str]] = collections.defaultdict(list)
        for ev in log.iter_events(["runwatch.alerts"]):
            if ev.type == "AlertFired":
                fired[ev.run_id].append(f"{ev.detector} @ step {ev.step} ({ev.routing})")
        steps = collections.Counter(
            e.run_id for e in log.iter_events(["runwatch.telemetry"])
            if e.type == "TrainerStepCompleted"
        )  # fmt: skip
    out = [
        "## Canaries on the real GRPO trainer (`runwatch train`: Llama policy, vLLM rollouts, CPU)",
        "",
        "| config | steps | alerts fired | before #17 (recorded, not re-run: the GRU trainer) |",
        "| --- | ---: | --- | --- |",
    ]
    #: the same configs before issue 17, on the GRU policy trainer that issue 15 replaced:
    #: recorded from that session's run of this benchmark, kept for comparison only
    before = {
        "canary-oversized-lr": "kl_blowup @ 3",
        "canary-constant-reward": "dead_run @ 99",
        "canary-gameable-reward": "kl_blowup @ 11; reward_hacking @ 50",
        "canary-frozen-sync": "weight_sync_staleness @ 26",
        "default": "none",
        "test": "none",
    }
    for name in names:
        run_id = run_ids.get(name, name)
        got = "; ".join(fired[run_id]) or "none"
        out.append(f"| {name} | {steps[run_id]} | {got} | {before[name]} |")
    return [*out, ""]


def _pct(values: list[Any], q: float, fmt: str = ".0f") -> str:
    return format(float(np.percentile(values, q)), fmt) if values else "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--healthy", type=int, default=200)
    ap.add_argument("--faulty", type=int, default=40)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--canaries", action="store_true", help="also run the real trainer")
    args = ap.parse_args()
    prices = Prices.load()
    price = prices.gpu_price("trainer")
    fold = RunHealthFold(load_catalog().with_prices(prices.usd_per_gpu_second, prices.version))
    started = time.perf_counter()
    healthy, pages = healthy_table(fold, args.healthy, args.steps)
    faults = fault_rows(fold, args.faulty, args.steps, price)
    cadence = hacking_by_cadence(fold, args.faulty, args.steps)
    seconds = time.perf_counter() - started
    per_step = GPUS * STEP_S * price

    lines = [
        "# Run-health detectors: measured quality",
        "",
        f"Generated by `python benchmarks/detector_quality.py --healthy {args.healthy} "
        f"--faulty {args.faulty} --steps {args.steps}{' --canaries' if args.canaries else ''}` "
        f"with catalog `{fold.catalog.version}` and prices `{prices.version}` ({seconds:.0f} s "
        "for the synthetic runs). Synthetic runs from `stream_processors/detectors/"
        "scenarios.py`; thresholds in `catalog.yaml`.",
        "",
        f"## False positives on {args.healthy} healthy runs of each shape",
        "",
        "Runs (of each shape's runs) on which each detector fired at least once. Shapes "
        f"(`scenarios.SHAPES`), {args.steps} steps each ({2 * args.steps} for eval every 50 / "
        "100):",
        "",
        *(f"- `{name}`: {what}" for name, what in SHAPES.items()),
        "",
        *healthy,
        "",
        f"Paging false positives: **{sum(pages.values())}** in "
        f"{args.healthy * len(SHAPES)} healthy runs.",
        "",
        f"## Detection lag and money on injected faults ({args.faulty} runs each, injected "
        "at a step in [150, 250))",
        "",
        "| fault | detector | detected | lag p50 | lag p90 | lag max | $ before alert p50 "
        f"| p90 | p90 lag at {GPUS} GPUs, 1 step/min | also fired (runs) |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for fault, detector, lags, money, collateral in faults:
        also = ", ".join(f"{d} ({k})" for d, k in collateral.most_common()) or "-"
        p90_usd = float(np.percentile(lags, 90)) * per_step if lags else 0.0
        lines.append(
            f"| {fault} | {detector} | {len(lags)}/{args.faulty} | {_pct(lags, 50)} | "
            f"{_pct(lags, 90)} | {_pct(lags, 100)} | ${_pct(money, 50, ',.2f')} | "
            f"${_pct(money, 90, ',.2f')} | ${p90_usd:,.2f} | {also} |"
        )
    lines += [
        "",
        "Lag is in training steps (windows and cadences are counted in steps, never "
        "wall-clock), from the step the fault became detectable: the injection, or for "
        "`checkpoint_writer_stuck` the first checkpoint that was due and not written, and "
        "for `no_eval_gate` the first eval that was due. Money: the run's own usage (8 GPUs "
        f"x the step's wall time) from that step to the alert, at the trainer pool's "
        f"${price:g}/GPU-s (`stream_processors/accounting/prices.yaml`); the last money "
        f"column is the p90 lag at {GPUS} GPUs and one step a minute (${per_step:.2f} a step).",
        "",
        "## Reward hacking by eval cadence (gameable reward, "
        f"{args.faulty} runs each, {2 * args.steps} steps)",
        "",
        *cadence,
        "",
        "The eval falls 0.004 a step after the injection while its noise is 0.005-0.02 a "
        "point, from the one noisy eval value at the injection step. `reward_hacking` fires "
        "at the first eval point a Student-t threshold below the mean of the 8 before it "
        "(the threshold from the catalog's `fa_per_run` and the run's eval cadence) while "
        "the reward's autocorrelation-corrected rise holds. At an eval every 10 steps two "
        "intervals hold one informative eval point (0.04-0.08 below the level); in the runs "
        "caught later it lies less than about three noise units below the level (1.2-1.5 in "
        "the three weakest), which no threshold that keeps healthy runs quiet can call "
        "(`benchmarks/reward_hacking_budget.py` measures this bound and the false pages on "
        "fresh seeds). The last two columns count in eval points: point 1 is the first eval "
        "at or after the injection (it shows at most one interval of the fall, none when the "
        'injection lands just before it), and "within 2 intervals of the first eval after '
        'it" is an alert by point 3.',
        "",
    ]
    if args.canaries:
        lines += canary_table()
    text = "\n".join(lines)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()

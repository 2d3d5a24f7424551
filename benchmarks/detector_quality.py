"""Detector quality: false-positive rate on healthy runs and detection lag on faults.

    python benchmarks/detector_quality.py [--healthy 200] [--faulty 40] [--steps 400]

Healthy runs: ``stream_processors.detectors.scenarios.synthetic_run(seed)`` for
``--healthy`` seeds — each with its own reward curve (logistic, AR(1) noise), eval gate,
KL growth, entropy decline, log-normal grad norms, growing generation length, phase
timings, usage and checkpoints. False positive = any ``AlertFired`` on a healthy run;
reported per detector as the share of runs that fired and per 1,000 steps.

Faulty runs: every fault of ``scenarios.FAULTS`` injected at a step drawn in
[150, 250) into ``--faulty`` runs; detection = the fault's own detector fired at or
after the injection; lag = steps from injection to that AlertFired (percentiles over the
detected runs). "Also fired" lists the other detectors that fired on those runs (an
oversized LR is expected to collapse entropy too).

``--canaries`` also runs the seed's canaries on the real GRPO trainer (``runwatch train``
with ``trainer/configs/canary-*.yaml`` and the healthy ``default.yaml``, torch on CPU,
about two minutes) and lists which alerts each run raised, at which step.

Writes ``stream_processors/detectors/QUALITY.md`` (beside the catalog) and prints it.
Deterministic: seeds are fixed, the folds are pure.
"""

from __future__ import annotations

import argparse
import collections
import time
from pathlib import Path

import numpy as np

from stream_processors.detectors import DETECTORS, RunHealthFold
from stream_processors.detectors.scenarios import FAULTS, synthetic_run

OUT = Path(__file__).resolve().parents[1] / "stream_processors" / "detectors" / "QUALITY.md"


def fold_run(fold: RunHealthFold, events: list) -> list:
    state, alerts = fold.initial(), []
    for ev in events:
        state, out = fold.apply(state, ev)
        alerts.extend(a for a in out if a.type == "AlertFired" and not a.escalated)
    return alerts


def canary_table() -> list[str]:
    """Run the real trainer's canaries into a fresh log and tabulate the alerts."""
    import subprocess
    import sys
    import tempfile

    from events.log.embedded import EmbeddedLog

    configs = Path(__file__).resolve().parents[1] / "trainer" / "configs"
    names = ["canary-oversized-lr", "canary-constant-reward", "canary-gameable-reward",
             "canary-frozen-sync", "default"]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        log_dir = Path(tmp) / "log"
        for name in names:
            cli = [sys.executable, "-m", "runwatch.cli.main"]
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
        "## Canaries on the real GRPO trainer (`runwatch train`, torch on CPU)",
        "",
        "| config | steps | alerts fired |",
        "| --- | ---: | --- |",
    ]
    for name in names:
        run_id = "demo-healthy" if name == "default" else name
        out.append(f"| {name} | {steps[run_id]} | {'; '.join(fired[run_id]) or 'none'} |")
    return [*out, ""]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--healthy", type=int, default=200)
    ap.add_argument("--faulty", type=int, default=40)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--canaries", action="store_true", help="also run the real trainer")
    args = ap.parse_args()
    fold = RunHealthFold()
    started = time.perf_counter()

    fp_runs: collections.Counter[str] = collections.Counter()
    fp_alerts: collections.Counter[str] = collections.Counter()
    for seed in range(args.healthy):
        fired = fold_run(fold, synthetic_run(seed, steps=args.steps))
        fp_alerts.update(a.detector for a in fired)
        fp_runs.update({a.detector for a in fired})
    kilo_steps = args.healthy * args.steps / 1000

    rng = np.random.default_rng(2026)
    lag_rows = []
    for fault, detector in FAULTS.items():
        lags, collateral = [], collections.Counter()
        for i in range(args.faulty):
            at = int(rng.integers(150, 250))
            fired = fold_run(
                fold, synthetic_run(10_000 + i, steps=args.steps, fault=fault, fault_step=at)
            )
            hit = [a.step for a in fired if a.detector == detector and a.step >= at]
            if fault == "no_eval_gate":  # nothing is injected mid-run: the gap is from start
                hit = [a.step + at for a in fired if a.detector == detector]
            if hit:
                lags.append(hit[0] - at)
            collateral.update({a.detector for a in fired if a.detector != detector})
        lag_rows.append((fault, detector, lags, collateral))
    seconds = time.perf_counter() - started

    lines = [
        "# Run-health detectors: measured quality",
        "",
        f"Generated by `python benchmarks/detector_quality.py --healthy {args.healthy} "
        f"--faulty {args.faulty} --steps {args.steps}{' --canaries' if args.canaries else ''}` "
        "with catalog "
        f"`{fold.catalog.version}` ({seconds:.0f} s). Synthetic runs from "
        "`stream_processors/detectors/scenarios.py`; thresholds in `catalog.yaml`.",
        "",
        f"## False positives on {args.healthy} healthy runs of {args.steps} steps",
        "",
        "| detector | layer | routing | runs that fired | FP rate (runs) | alerts / 1k steps |",
        "| --- | --- | --- | ---: | ---: | ---: |",
    ]
    for det in DETECTORS:
        s = fold.catalog.settings(det, "tenant-synth", "grpo")
        n = fp_runs[det.name]
        lines.append(
            f"| {det.name} | {det.layer} | {s.routing} | {n} | {n / args.healthy:.1%} "
            f"| {fp_alerts[det.name] / kilo_steps:.3f} |"
        )
    lines += [
        "",
        f"## Detection lag on injected faults ({args.faulty} runs each, injected at a step "
        "in [150, 250))",
        "",
        "| fault | detector | detected | lag p50 | lag p90 | lag max | also fired (runs) |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for fault, detector, lags, collateral in lag_rows:
        if lags:
            p50, p90, mx = (f"{np.percentile(lags, q):.0f}" for q in (50, 90, 100))
        else:
            p50 = p90 = mx = "-"
        also = ", ".join(f"{d} ({n})" for d, n in collateral.most_common()) or "-"
        lines.append(
            f"| {fault} | {detector} | {len(lags)}/{args.faulty} | {p50} | {p90} | {mx} | {also} |"
        )
    lines += [
        "",
        "Lag is in training steps (windows are counted in steps, never wall-clock). "
        "`no_eval_gate` counts from run start (there is nothing to inject mid-run). "
        "Healthy-run noise, trends and scales are drawn per run; see `scenarios.py`.",
        "",
    ]
    if args.canaries:
        lines += canary_table()
    text = "\n".join(lines)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()

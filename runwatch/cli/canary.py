"""``runwatch canary [--json]``: inject seed 000's four faults; fail unless every alert fires.

Trains four real short runs (frozen weight sync, constant reward, oversized LR, gameable
reward) on a fresh embedded log, folds them through the stream processors and the
projections, and prints per fault: the expected alert, the step it fired at (and the
detection lag), the customer state reached. Exit 0 only if every canary passed.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from runwatch.cli.counts import at_least_one
from runwatch.cli.outdir import fresh_out_dir
from runwatch.cli.terminal import Terminal

HELP = "inject the four canary faults; fail unless alerts fire"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", help="keep the log and process logs here (default: temp)")
    parser.add_argument("--parallel", type=at_least_one, default=2, help="trainers at once")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")


def run_facts(log_dir: Path) -> dict[str, list]:  # type: ignore[type-arg]
    """Each run's pauses, resumes, cancels, pause requests and usage, in log order."""
    from events.envelope import EventBase
    from events.log.embedded import EmbeddedLog

    reader = EmbeddedLog(log_dir, readonly=True)
    reader.open_sync()
    wanted = ("runwatch.lifecycle", "runwatch.telemetry", "runwatch.control")
    topics = [t for t in wanted if t in reader.topic_names()]
    kinds = {"RunPaused", "RunResumed", "UsageRecorded", "RunCancelled", "PauseRequested"}
    out: dict[str, list] = {}  # type: ignore[type-arg]
    for ev in reader.iter_events(topics):
        if isinstance(ev, EventBase) and ev.type in kinds:
            out.setdefault(ev.run_id, []).append(ev)
    return out


def run(args: argparse.Namespace, term: Terminal) -> int:
    from runwatch.demo.canary import canaries, judge
    from runwatch.demo.orchestrate import Orchestrator
    from runwatch.demo.plane import EmbeddedPlane

    tmp = None
    if args.out:
        out = fresh_out_dir(Path(args.out), "canary")
    else:
        tmp = tempfile.mkdtemp(prefix="runwatch-canary-")
        out = Path(tmp)
    try:
        chosen = canaries()
        log_dir = out / "log"
        plane = EmbeddedPlane(log_dir)
        say = (lambda _m: None) if args.json else term.progress
        # the processors (detectors + run controller) follow the log while the runs train
        Orchestrator(out, log_dir, say, args.parallel).run_all(
            [c.scenario for c in chosen], plane.process
        )
        plane.tick(final=True)
        views = {v.run_id: v for v in plane.views.values()}
        facts = run_facts(log_dir)
        results = [
            judge(c, views.get(c.scenario.run_id), plane.derived, facts.get(c.scenario.run_id, []))
            for c in chosen
        ]
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        term.json(
            {"passed": all(r.passed for r in results), "canaries": [r.as_dict() for r in results]}
        )
    else:
        term.table(
            [
                (
                    r.fault,
                    r.expected_alert,
                    r.fired_at_step,
                    r.detection_lag_steps,
                    r.state_reached,
                    "-" if r.paused_at_step is None else r.paused_at_step,
                    "-" if r.pause_lag_s is None else f"{r.pause_lag_steps} / {r.pause_lag_s:.2f}s",
                    "-" if r.billed_after_pause_s is None else f"{r.billed_after_pause_s:.3f}",
                    "PASS" if r.passed else "FAIL",
                )
                for r in results
            ],
            [
                "fault",
                "expected alert",
                "fired at step",
                "lag (steps)",
                "state reached",
                "paused at",
                "alert->pause (steps / s)",
                "billed after pause (s)",
                "",
            ],
        )
        for r in results:
            for p in r.problems:
                term.info(f"{r.fault}: {p}")
    return 0 if all(r.passed for r in results) else 1

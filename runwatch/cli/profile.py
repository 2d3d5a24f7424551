"""``runwatch profile LOG|DIR``: rollout profiles (seed 003) as tables, JSON and PNG plots.

``SOURCE`` is either a trace directory in seed 003's layout (``step_<N>/worker_<R>.jsonl``,
read through the importer: bad lines are reported and skipped) or an embedded log
directory (its ``runwatch.traces`` topic; a log holding only ``runwatch.profiles``
- derived events exported from a live deployment - is shown as it is), opened read-only:
a torn tail is skipped, left in place and reported (stderr, ``torn_tails``). The profiling
fold runs over the traces, one state per run, and is flushed at the end of the input,
so every step is finalized (see :mod:`stream_processors.profiling.fold`).

Prints per run: the steps (long tail, barrier wait, stragglers), the event-share table,
turns, the workers of one step, rollout quality; ``--json`` prints one document instead.
Plots go to ``--out`` (one subdirectory per run when there are several) unless
``--no-plots``.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from events.catalog.rollout import RolloutTraceRecorded
from events.dead_letter import DeadLetter
from events.dedupe import Deduplicator
from events.envelope import EventBase
from runwatch.cli.ids import identifier
from runwatch.cli.terminal import Abort, Terminal

TRACES = "runwatch.traces"
PROFILES = "runwatch.profiles"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", metavar="LOG|DIR", help="embedded log or trace directory")
    parser.add_argument(
        "--run-id", type=identifier, help="only this run (a trace directory: its run id)"
    )
    parser.add_argument(
        "--tenant", type=identifier, default="local", help="tenant id for a trace directory"
    )
    parser.add_argument("--out", default="runwatch-profile", help="directory for the PNG plots")
    parser.add_argument("--no-plots", action="store_true", help="write no plots")
    parser.add_argument(
        "--step",
        type=int,
        help="step of the per-worker view (default: the step with the most barrier wait)",
    )
    parser.add_argument(
        "--straggler-k",
        type=float,
        default=2.0,
        help="a worker beyond k x the median worker is a straggler",
    )
    parser.add_argument(
        "--min-gap-s",
        type=float,
        default=1.0,
        help="... and at least this many seconds behind the median",
    )
    parser.add_argument(
        "--lateness-steps",
        type=int,
        default=0,
        help="keep a step open until this many later steps started",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")


def run(args: argparse.Namespace, term: Terminal) -> int:
    from stream_processors.profiling import ProfilingConfig, ProfilingFold
    from stream_processors.profiling.report import build_report

    if args.straggler_k <= 1.0:
        raise Abort("--straggler-k must be greater than 1")
    if args.lateness_steps < 0:
        raise Abort("--lateness-steps must be >= 0")
    cfg = ProfilingConfig(
        straggler_k=args.straggler_k,
        straggler_min_gap_s=args.min_gap_s,
        lateness_steps=args.lateness_steps,
    )
    fold = ProfilingFold(cfg)
    source = Path(args.source)
    info: dict[str, Any] = {"source": str(source)}
    derived: dict[str, list[EventBase]] = {}
    import_report = None
    if _is_trace_dir(source):
        from producers.trace_import import ImportReport

        info["kind"] = "trace-dir"
        import_report = ImportReport()
        events = _from_trace_dir(source, args, import_report)
    else:
        info["kind"] = "log"
        events = _from_log(source, args, info, derived, term)
    states: dict[str, Any] = {}
    dedupe = Deduplicator()
    owners: dict[str, str] = {}  # a run id is its first tenant's, as in the processors
    foreign = 0
    for ev in events:
        if args.run_id and ev.run_id != args.run_id:
            continue
        if owners.setdefault(ev.run_id, ev.tenant_id) != ev.tenant_id:
            foreign += 1
            continue
        if not dedupe.first_time(ev.event_id):
            continue
        key = fold.key_of(ev)
        state, out = fold.apply(states.get(key) or fold.initial(), ev)
        states[key] = state
        if out:
            derived.setdefault(key, []).extend(out)
    for key, state in states.items():
        _, out = fold.flush(state)
        derived.setdefault(key, []).extend(out)
        if state.late_events or state.unstepped_events:
            term.warn(
                f"run {key}: {state.late_events} late and {state.unstepped_events} "
                "step-less trace event(s) were not profiled"
            )
    info["duplicates"] = dedupe.duplicates
    info["foreign"] = foreign
    if foreign:
        term.warn(f"{foreign} trace event(s) of another tenant on a run id were not profiled")
    if import_report is not None:
        info["import"] = import_report.as_dict()
        for issue in import_report.issues[:10]:
            term.warn(f"{issue} ({'line skipped' if issue.skipped else 'line kept'})")
        if import_report.issue_counts:
            term.warn(
                f"{import_report.skipped} trace line(s) skipped; issues by kind: "
                f"{import_report.issue_counts}"
            )
    if not derived:
        which = f" of run {args.run_id}" if args.run_id else ""
        raise Abort(f"no rollout traces{which} in {source}")
    reports = [build_report(run_id, evs) for run_id, evs in sorted(derived.items())]
    for rep in reports:
        if args.step is not None and args.step not in rep.workers:
            raise Abort(
                f"run {rep.run_id} has no step {args.step}; steps: "
                f"{', '.join(str(s.step) for s in rep.steps)}"
            )
    plots: dict[str, list[str]] = {}
    if not args.no_plots:
        from stream_processors.profiling.plots import write_plots

        for rep in reports:
            out_dir = Path(args.out) / rep.run_id if len(reports) > 1 else Path(args.out)
            # event run ids are one path component (events.identity.check_id); said again
            # here, where a tenant's string becomes a directory
            if len(reports) > 1 and out_dir.resolve().parent != Path(args.out).resolve():
                raise Abort(f"run id {rep.run_id!r} is not a directory name under {args.out}")
            plots[rep.run_id] = [str(p) for p in write_plots(rep, out_dir, args.step)]
    if args.json:
        term.json(
            {
                **info,
                "runs": [{**rep.as_json(), "plots": plots.get(rep.run_id, [])} for rep in reports],
            }
        )
        return 0
    for rep in reports:
        _print_report(rep, term, args.step)
        for path in plots.get(rep.run_id, []):
            term.info(f"plot: {path}")
    return 0


def _is_trace_dir(path: Path) -> bool:
    return path.is_dir() and any(p.name.startswith("step_") and p.is_dir() for p in path.iterdir())


def _from_trace_dir(
    source: Path, args: argparse.Namespace, report: Any
) -> Iterator[RolloutTraceRecorded]:
    from producers.trace_import import iter_trace_events

    run_id = args.run_id or source.resolve().name
    try:
        yield from iter_trace_events(source, run_id=run_id, tenant_id=args.tenant, report=report)
    except (FileNotFoundError, ValueError) as exc:
        raise Abort(str(exc)) from None


def _from_log(
    source: Path,
    args: argparse.Namespace,
    info: dict[str, Any],
    derived: dict[str, list[EventBase]],
    term: Terminal,
) -> Iterator[EventBase]:
    from events.log.embedded import EmbeddedLog
    from runwatch.cli.log import warn_torn

    log = EmbeddedLog(source, readonly=True)
    try:
        log.open_sync()
    except FileNotFoundError:
        raise Abort(
            f"{source} is neither an embedded log nor a step_<N>/ trace directory"
        ) from None
    topics = log.topic_names()
    read = [TRACES] if TRACES in topics else [PROFILES, "runwatch.telemetry"]
    tails = log.torn_tails([t for t in read if t in topics])
    warn_torn(tails, term)
    info["torn_tails"] = [t.as_dict() for t in tails]
    if TRACES not in topics and PROFILES in topics:
        info["kind"] = "log-profiles"
        for ev in log.iter_events(
            [PROFILES, "runwatch.telemetry"] if "runwatch.telemetry" in topics else [PROFILES]
        ):
            if isinstance(ev, EventBase) and (not args.run_id or ev.run_id == args.run_id):
                derived.setdefault(ev.run_id, []).append(ev)
        return
    if TRACES not in topics:
        raise Abort(f"no {TRACES} topic in {source} (topics: {', '.join(topics) or 'none'})")
    bad = 0
    for ev in log.iter_events([TRACES]):
        if isinstance(ev, DeadLetter):
            bad += 1
            continue
        yield ev
    info["dead_letters"] = bad


def _print_report(rep: Any, term: Terminal, step: int | None) -> None:
    term.info(f"run {rep.run_id}: {len(rep.steps)} step(s) profiled")
    term.table(
        [
            [
                s.step,
                s.requests,
                _pct(s.aborted_share),
                s.rollout_s,
                _pct(s.done_by_40pct),
                s.t80_s,
                _pct(s.t80_frac),
                s.slowest_request_s,
                f"{s.slowest_worker} ({_num(s.slowest_worker_s)})",
                s.median_worker_s,
                s.barrier_wait_total_s,
                ",".join(s.straggler_workers) or "-",
                "SLOW" if s.slow_step else "",
            ]
            for s in rep.steps
        ],
        [
            "step",
            "reqs",
            "aborted",
            "rollout s",
            "done@40%",
            "t80 s",
            "t80/rollout",
            "slowest req s",
            "slowest worker (s)",
            "median worker s",
            "barrier wait s",
            "stragglers",
            "outlier",
        ],
    )
    term.info("event share of total time (mean over steps)")
    term.table(
        [[name, _pct(share)] for name, share in rep.event_share_avg.items()],
        ["event", "avg % of total time"],
    )
    if rep.stragglers:
        term.info("straggler workers")
        term.table(
            [
                [
                    s.step,
                    s.worker,
                    s.worker_s,
                    s.median_worker_s,
                    f"{s.ratio:.1f}x",
                    s.barrier_wait_imposed_s,
                    s.slowest_request_id,
                ]
                for s in rep.stragglers
            ],
            [
                "step",
                "worker",
                "worker s",
                "median s",
                "ratio",
                "wait imposed s",
                "slowest request",
            ],
        )
    if rep.turn_histogram:
        total = sum(rep.turn_histogram.values())
        term.info("turns")
        term.table(
            [
                [n, c, _pct(c / total), rep.request_s_by_turns.get(n), rep.engine_s_by_turn.get(n)]
                for n, c in rep.turn_histogram.items()
            ],
            ["turns", "requests", "share", "mean request s (n turns)", "mean engine s (turn n)"],
        )
    focus = rep.focus_step if step is None else step
    if focus in rep.workers:
        term.info(f"workers of step {focus}")
        term.table(
            [
                [
                    w.worker,
                    w.requests,
                    w.aborted_requests,
                    w.completion_s,
                    w.barrier_wait_s,
                    w.busy_s,
                ]
                for w in rep.workers[focus]
            ],
            ["worker", "reqs", "aborted", "done at s", "barrier wait s", "busy s"],
        )
    if rep.batches:
        term.info("rollout quality (RolloutBatchCompleted, the detectors' drift input)")
        term.table(
            [
                [
                    b.step,
                    b.num_sequences,
                    b.mean_length,
                    b.max_length,
                    _pct(b.truncation_rate),
                    _pct(b.unparseable_rate),
                ]
                for b in rep.batches
            ],
            ["step", "sequences", "mean length", "max length", "truncated", "unparseable"],
        )


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}%"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"

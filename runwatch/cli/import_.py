"""``runwatch import``: bring facts recorded elsewhere into a log.

- ``runwatch import traces DIR --run-id R --tenant T [--to LOG | --kafka HOST:PORT]``:
  verl multi-turn rollout traces in seed 003's layout (``DIR/step_<N>/worker_<R>.jsonl``)
  become ``RolloutTraceRecorded`` events (:mod:`producers.trace_import`). Bad lines are
  reported with file and line and skipped; the import never stops on them (``--strict``
  makes the exit status 1 when any line was skipped). Re-importing a directory yields the
  same event ids, which every consumer deduplicates.
- ``runwatch import metrics ...``: trainer metrics (:mod:`producers.metrics_import`,
  owned by the detectors work; imported only when used).

``--to`` defaults to the embedded log of :func:`runwatch.settings.log_dir`.
"""

from __future__ import annotations

import argparse
import importlib
import os
from typing import Any

from runwatch import settings
from runwatch.cli.counts import gpu_count
from runwatch.cli.ids import identifier
from runwatch.cli.terminal import Abort, Terminal

#: Issues printed in full before the rest are only counted.
SHOWN_ISSUES = 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="import_command", metavar="SUBCOMMAND", required=True)
    tr = sub.add_parser("traces", help="verl rollout traces: DIR/step_<N>/worker_<R>.jsonl")
    tr.add_argument("dir", help="trace directory (holding step_<N>/ folders)")
    _common(tr)
    tr.add_argument("--batch-size", type=int, default=4096, help="events per append")
    tr.add_argument("--strict", action="store_true", help="exit 1 if any line was skipped")
    me = sub.add_parser("metrics", help="trainer metrics (verl / TRL keys as they are)")
    me.add_argument("path", help="metrics file: CSV, JSONL or verl file-logger lines")
    _common(me)
    me.add_argument("--algorithm", default="grpo", help="selects per-algorithm thresholds")
    me.add_argument("--eval-file", help="held-out eval scores (step + score), CSV or JSONL")
    me.add_argument("--gpus", type=gpu_count, help="GPUs of the run: timing_s/step x GPUs = usage")
    me.add_argument(
        "--ended",
        choices=("completed", "failed"),
        help="the history is of a run that ended so (default: a run still going)",
    )


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run-id", type=identifier, required=True, help="run the facts belong to")
    p.add_argument("--tenant", type=identifier, required=True, help="tenant owning the run")
    p.add_argument("--to", help="embedded log directory (default: $RUNWATCH_LOG_DIR)")
    p.add_argument("--kafka", help="append to this Kafka bootstrap instead of a directory")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")


def _sink(args: argparse.Namespace) -> Any:
    if args.kafka:
        from producers.sinks import KafkaSink

        return KafkaSink(args.kafka)
    from producers.sinks import EmbeddedSink

    return EmbeddedSink(settings.log_dir(args.to))


def run(args: argparse.Namespace, term: Terminal) -> int:
    if args.import_command == "traces":
        return _traces(args, term)
    return _metrics(args, term)


def _traces(args: argparse.Namespace, term: Terminal) -> int:
    from producers.trace_import import ImportReport, find_trace_files, import_traces

    if args.batch_size < 1:
        raise Abort("--batch-size must be at least 1")
    try:
        find_trace_files(args.dir)
    except (FileNotFoundError, ValueError) as exc:
        raise Abort(str(exc)) from None
    sink = _sink(args)
    report = ImportReport()
    try:
        import_traces(
            args.dir,
            run_id=args.run_id,
            tenant_id=args.tenant,
            write=sink.write,
            batch_size=args.batch_size,
            report=report,
        )
    finally:
        sink.close()
    target = f"kafka {args.kafka}" if args.kafka else str(settings.log_dir(args.to))
    if args.json:
        term.json({"to": target, **report.as_dict()})
    else:
        term.info(
            f"imported {report.imported} trace events from {report.files} files "
            f"({report.lines} lines, {report.skipped} skipped) into {target}"
        )
        for issue in report.issues[:SHOWN_ISSUES]:
            term.warn(f"{issue} ({'line skipped' if issue.skipped else 'line kept'})")
        hidden = sum(report.issue_counts.values()) - min(len(report.issues), SHOWN_ISSUES)
        if hidden > 0:
            term.warn(f"... and {hidden} more issue(s): {report.issue_counts} (--json lists them)")
    return 1 if args.strict and report.skipped else 0


def _metrics(args: argparse.Namespace, term: Terminal) -> int:
    try:
        metrics_import: Any = importlib.import_module("producers.metrics_import")
    except ModuleNotFoundError:
        raise Abort("metrics import is not available in this build") from None
    for name in ("path", "eval_file"):
        value = getattr(args, name)
        if value is not None and not os.path.isfile(value):
            raise Abort(f"no such file: {value}")
    sink = _sink(args)
    try:
        report = metrics_import.import_metrics(
            args.path,
            run_id=args.run_id,
            tenant_id=args.tenant,
            write=sink.write,
            algorithm=args.algorithm,
            eval_file=args.eval_file,
            gpus=args.gpus,
            ended=args.ended,
        )
    except ValueError as exc:  # not UTF-8 text, or no row with a step: nothing written
        raise Abort(str(exc)) from None
    finally:
        sink.close()
    target = f"kafka {args.kafka}" if args.kafka else str(settings.log_dir(args.to))
    summary = {"to": target, **report.as_dict()}
    if args.json:
        term.json(summary)
    else:
        term.info(
            f"imported {report.rows} {report.format} rows from {args.path} into {target}: "
            f"{summary['events']}; {report.skipped} skipped"
        )
        for issue in report.issues[:SHOWN_ISSUES]:
            term.warn(f"{issue} (row skipped)")
    return 0

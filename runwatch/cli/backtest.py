"""``runwatch backtest FILE|LOG``: replay a historical run through the current catalog.

Seed 000's verification step, "the silent-failure replay passes": the run's recorded
metrics go through the run-health detectors exactly as a live run's would, and the
command prints, per detector, the first step it would have fired — against the step at
which the incident was actually noticed (``--incident-step``). With an incident step it
exits 1 unless a *paging* detector would have fired before it; 0 otherwise.

The source is either

- a metrics file in any format ``runwatch import metrics`` reads (CSV, JSONL, verl's file
  logger; verl / TRL keys as they are; ``--eval-file`` for held-out scores kept apart,
  ``--gpus`` to turn ``timing_s/step`` into GPU spend), read into memory and never
  written anywhere; or
- an embedded log directory (a ``runwatch log export``, a demo's log), opened read-only;
  ``--run-id`` picks one run when it holds several.

Spend before the first page, and between it and the incident, is priced from the
accounting price list (``--prices``, default the packaged one). ``--catalog`` replays
against another threshold catalog (a candidate change, say) instead of the packaged one.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from runwatch.cli.counts import gpu_count
from runwatch.cli.ids import identifier
from runwatch.cli.terminal import Abort, Terminal

HELP = "replay a recorded run through the detectors: which would have fired, and when"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help="metrics file (CSV, JSONL, verl log) or embedded log dir")
    parser.add_argument(
        "--incident-step",
        type=int,
        help="the step the incident was actually noticed; exit 1 unless a page came first",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--run-id", type=identifier, help="the run (a log with several runs; a file's name)"
    )
    parser.add_argument(
        "--tenant", type=identifier, default="backtest", help="tenant of a metrics file's run"
    )
    parser.add_argument("--algorithm", default="grpo", help="selects per-algorithm thresholds")
    parser.add_argument("--eval-file", help="held-out eval scores (step + score), CSV or JSONL")
    parser.add_argument("--gpus", type=gpu_count, help="GPUs of the run: timing_s/step x GPUs")
    parser.add_argument("--catalog", help="detector threshold catalog (default: packaged)")
    parser.add_argument("--prices", help="prices YAML (default: packaged)")


def run(args: argparse.Namespace, term: Terminal) -> int:
    from stream_processors.accounting import Prices
    from stream_processors.detectors import CatalogError, RunHealthFold, load_catalog
    from stream_processors.detectors.backtest import backtest

    if args.incident_step is not None and args.incident_step < 0:
        raise Abort("--incident-step must be a step number (0 or more)")
    try:
        prices = Prices.load(args.prices)
        catalog = load_catalog(args.catalog).with_prices(prices.by_kind_and_pool(), prices.version)
    except (CatalogError, ValueError) as exc:
        raise Abort(str(exc)) from None
    fold = RunHealthFold(catalog)
    events, what = _events(args, fold.inputs, term)
    reports = backtest(events, fold)
    if args.run_id and os.path.isdir(args.source):
        reports = {k: v for k, v in reports.items() if k == args.run_id}
    steps = {k: v for k, v in reports.items() if v.first_step is not None}
    if not steps:
        raise Abort(f"{what}: no trainer steps{f' for run {args.run_id}' if args.run_id else ''}")
    if args.incident_step is not None and len(steps) > 1:
        names = ", ".join(sorted(steps)[:10])
        raise Abort(f"{what} holds {len(steps)} runs ({names}); pick one with --run-id")
    price = prices.by_kind_and_pool()
    docs = [r.as_dict(args.incident_step, price) for r in steps.values()]
    failed = any(d["passed"] is False for d in docs)
    if args.json:
        term.json({"source": what, "runs": docs, "passed": None if args.incident_step is None
                   else not failed})  # fmt: skip
    else:
        for doc in docs:
            _print(term, what, doc)
    return 1 if failed else 0


def _events(
    args: argparse.Namespace, inputs: tuple[str, ...], term: Terminal
) -> tuple[list[Any], str]:
    """The run's events in log order, and what they were read from."""
    source = Path(args.source)
    if source.is_dir():
        from events.dead_letter import DeadLetter
        from runwatch.cli.log import open_readonly, warn_torn

        log = open_readonly(str(source))
        warn_torn(log.torn_tails(), term)
        events = [e for e in log.iter_events(list(inputs)) if not isinstance(e, DeadLetter)]
        return events, f"log {source}"
    if not source.is_file():
        raise Abort(f"no such file or directory: {source}")
    if args.eval_file is not None and not os.path.isfile(args.eval_file):
        raise Abort(f"no such file: {args.eval_file}")
    from producers.metrics_import import import_metrics

    events: list[Any] = []
    try:
        report = import_metrics(
            source,
            run_id=args.run_id or source.stem,
            tenant_id=args.tenant,
            write=events.extend,
            algorithm=args.algorithm,
            eval_file=args.eval_file,
            gpus=args.gpus,
        )
    except ValueError as exc:  # not text, no row with a step, a run id the name cannot make
        raise Abort(str(exc)) from None
    return events, f"{report.format} {source}"


def _print(term: Terminal, what: str, doc: dict[str, Any]) -> None:
    first, last = doc["steps"]
    incident = doc["incident_step"]
    term.info(
        f"backtest of run {doc['run_id']} ({what}), steps {first}-{last}, "
        f"catalog {doc['config_version']}"
    )
    rows = []
    for d in doc["detectors"]:
        lead = "" if d["lead_steps"] is None else f"{d['lead_steps']:+d}"
        window = f"{d['window'][0]}-{d['window'][1]}"
        rows.append([d["detector"], d["routing"], d["fired_at_step"], window, lead, d["reason"]])
    if rows:
        columns = ["detector", "routing", "fires at step", "window", "before incident", "reason"]
        term.table(rows, columns)
    else:
        term.info("no detector would have fired")
    spend = doc.get("spend_usd")
    page = doc["first_page"]
    if page is None:
        term.info("no paging detector would have fired")
    else:
        text = f"first page: {page['detector']} at step {page['step']}"
        if spend is not None:
            text += f"; ${spend['before_first_page']:,.2f} spent before it"
            if spend["first_page_to_incident"] is not None:
                text += f", ${spend['first_page_to_incident']:,.2f} between it and the incident"
        term.info(text)
    if incident is not None:
        verdict = "PASS: a page before" if doc["passed"] else "FAIL: no page before"
        term.info(f"{verdict} the incident at step {incident}")

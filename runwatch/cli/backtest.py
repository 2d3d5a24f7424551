"""``runwatch backtest FILE|LOG``: replay a historical run through the current catalog.

Seed 000's verification step, "the silent-failure replay passes": the run's recorded
metrics go through the run-health detectors exactly as a live run's would, and the
command prints, per detector, the first step it would have fired — against the step at
which the incident was actually noticed (``--incident-step``). With an incident step it
exits 1 unless a *paging* detector would have fired before it; 0 otherwise. A backtest
that cannot be run (no such file, not a metrics file, no trainer steps, a bad option)
exits 2, so a script can tell "no page came first" from "no answer".

Rows are folded in the source's order, as a live run's events are: a trainer step at or
below one already folded is late or repeated and the detectors drop it (a run resumed
from an earlier checkpoint logs its steps again). The report says how many were dropped
and which steps the detectors saw, and warns; ``--sort-steps`` folds a metrics file in
step order instead (a file exported newest first, or shuffled: its order means nothing).

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
    parser.add_argument(
        "--sort-steps",
        action="store_true",
        help="fold a metrics file's rows in step order, not file order (a file exported "
        "newest first, or shuffled)",
    )


#: exit codes: a page came first (or no incident step), no page came first, no answer
PASSED, FAILED, ERROR = 0, 1, 2


def run(args: argparse.Namespace, term: Terminal) -> int:
    """The backtest; every refusal exits :data:`ERROR`, never :data:`FAILED`'s 1."""
    from runwatch.settings import NotALogDir

    try:
        return _run(args, term)
    except Abort as exc:
        raise Abort(str(exc), code=ERROR) from None
    except NotALogDir as exc:
        raise Abort(str(exc), code=ERROR) from None


def _run(args: argparse.Namespace, term: Terminal) -> int:
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
    steps = {k: v for k, v in reports.items() if v.input_steps[0] is not None}
    if not steps:
        raise Abort(f"{what}: no trainer steps{f' for run {args.run_id}' if args.run_id else ''}")
    if args.incident_step is not None and len(steps) > 1:
        names = ", ".join(sorted(steps)[:10])
        raise Abort(f"{what} holds {len(steps)} runs ({names}); pick one with --run-id")
    price = prices.by_kind_and_pool()
    docs = [r.as_dict(args.incident_step, price) for r in steps.values()]
    failed = any(d["passed"] is False for d in docs)
    if args.json:  # (the text report says it on stdout, beside the span)
        for doc in docs:
            if doc["late"]["steps"]:
                term.warn(_late_note(doc, args.sort_steps or source_is_log(args)))
        term.json({"source": what, "runs": docs, "passed": None if args.incident_step is None
                   else not failed, "sorted_steps": bool(args.sort_steps)})  # fmt: skip
    else:
        for doc in docs:
            _print(term, what, doc, args.sort_steps or source_is_log(args))
    return FAILED if failed else PASSED


def source_is_log(args: argparse.Namespace) -> bool:
    return os.path.isdir(args.source)


def _late_note(doc: dict[str, Any], sorted_or_log: bool) -> str:
    """What the fold dropped as late or repeated, and what to do about it."""
    (first, last), (lo, hi) = doc["steps"], doc["steps_in_input"]
    late = doc["late"]
    text = (
        f"run {doc['run_id']}: {late['steps']} trainer step(s) came below a step already "
        f"folded and were not folded (out of step order; {late['events']} event(s) dropped "
        f"in all): the detectors saw steps {first}-{last} of {lo}-{hi} in the input"
    )
    if not sorted_or_log:
        text += (
            "; rows are folded in file order, as a live run's (a resumed run logs its steps "
            "again): a file exported newest first or shuffled needs --sort-steps"
        )
    return text


def _events(
    args: argparse.Namespace, inputs: tuple[str, ...], term: Terminal
) -> tuple[list[Any], str]:
    """The run's events in log order, and what they were read from."""
    source = Path(args.source)
    if source.is_dir():
        if args.sort_steps:
            raise Abort("--sort-steps sorts a metrics file; a log is folded in its own order")
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
    if args.sort_steps:  # stable: a row's events, and its evals, keep their order
        events.sort(key=lambda e: -1 if e.step is None else e.step)
    return events, f"{report.format} {source}"


def _print(term: Terminal, what: str, doc: dict[str, Any], sorted_or_log: bool) -> None:
    first, last = doc["steps"]
    incident = doc["incident_step"]
    late = doc["late"]["steps"]
    lo, hi = doc["steps_in_input"]
    span = (
        f"steps {first}-{last}"
        if not late
        else f"steps {first}-{last} folded ({lo}-{hi} in the input)"
    )
    term.info(f"backtest of run {doc['run_id']} ({what}), {span}, catalog {doc['config_version']}")
    if late:
        term.info("warning: " + _late_note(doc, sorted_or_log))
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

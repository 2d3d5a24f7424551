"""``runwatch replay LOG``: rebuild every derived event (and the read model) from a log.

The log is opened read-only and read once (:func:`runwatch.hosting.replay.replay_log`):
the folds of :func:`runwatch.folds.processor_folds` run from offset 0 in memory, and the
read model is rebuilt beside them. Every event derived is printed, the processors' fold by
fold, then the read model's: with ``--json`` one JSON object per line (the event exactly
as the codec writes it), else one summary line each. Nothing is written (``--store``
aside, which is not in the log), so replaying twice prints the same bytes twice — the
audit story — and ``--workers N`` prints the same bytes as one process. A torn tail is
skipped, left in place and reported: on stderr, and with ``--json`` as a last
``{"torn_tail": {...}}`` line per topic (topic, offset, bytes).
"""

from __future__ import annotations

import argparse
import json
from concurrent.futures.process import BrokenProcessPool

from runwatch.cli.terminal import Abort, Terminal

HELP = "rebuild every derived event (and projection) from a log"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("log", help="embedded log directory")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.add_argument("--catalog", help="detector threshold catalog (default: packaged)")
    parser.add_argument(
        "--store", help="also write the rebuilt projections to this SQLite read model"
    )
    parser.add_argument("--policy", help="run-state policy YAML (default: packaged)")
    parser.add_argument("--prices", help="prices YAML (default: packaged)")
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="replay with N key-sharded processes (default 1)",
    )


def run(args: argparse.Namespace, term: Terminal) -> int:
    from events.codec import encode
    from projections.policy import RunStatePolicy
    from projections.sqlite_store import SqliteReadModel
    from runwatch.cli.log import open_readonly, warn_torn
    from runwatch.folds import processor_folds
    from runwatch.hosting.replay import replay_log
    from stream_processors.accounting import Prices
    from stream_processors.detectors import CatalogError

    if args.workers < 1:
        raise Abort("--workers must be at least 1")
    log = open_readonly(args.log)
    tails = log.torn_tails()
    warn_torn(tails, term)
    try:
        policy, prices = RunStatePolicy.load(args.policy), Prices.load(args.prices)
        folds = processor_folds(args.catalog, prices=prices)
    except (CatalogError, ValueError) as exc:
        raise Abort(str(exc)) from None
    workers = args.workers
    try:
        store = SqliteReadModel(args.store) if args.store else None
    except ValueError as exc:
        raise Abort(str(exc)) from None
    if workers > 1 and store is not None and store.positions():
        workers = 1  # a store that already holds a projection resumes in one process
    try:
        result = replay_log(
            log,
            processors=folds,
            store_path=args.store,
            policy=policy,
            prices=prices,
            workers=workers,
        )
    except (ValueError, BrokenProcessPool) as exc:
        raise Abort(str(exc) or f"a replay worker died ({type(exc).__name__})") from None
    count = 0
    for event in [*result.processor_events(), *result.derived]:
        count += 1
        if args.json:
            term.out.write(encode(event).decode() + "\n")
        else:
            term.line(_summary(event))
    if args.json:
        for tail in tails:
            term.json({"torn_tail": tail.as_dict()})
    else:
        term.info(f"{count} derived events from {args.log}")
        term.info(f"projections: {json.dumps(result.summary())}")
    return 0


def _summary(event: object) -> str:
    doc = json.loads(event.model_dump_json())  # type: ignore[attr-defined]
    parts = [doc["type"], doc["run_id"], f"step={doc.get('step')}"]
    for key in ("detector", "routing", "to_state", "reason"):
        if key in doc:
            parts.append(f"{key}={doc[key]}")
    return "  ".join(str(p) for p in parts)

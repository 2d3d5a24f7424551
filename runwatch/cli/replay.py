"""``runwatch replay LOG``: rebuild every derived event from an embedded log.

The log is opened read-only; the folds of :func:`runwatch.folds.processor_folds` run from
offset 0 in memory and every event they derive (alerts, and whatever later folds add) is
printed: with ``--json`` one JSON object per line (the event exactly as the codec writes
it), else one summary line each. Nothing is written (``--store`` aside, which is not in
the log), so replaying twice prints the same bytes twice — the audit story. A torn tail
is skipped, left in place and reported: on stderr, and with ``--json`` as a last
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
        help="rebuild the projections with N key-sharded processes (default 1)",
    )


def run(args: argparse.Namespace, term: Terminal) -> int:
    from events.codec import encode
    from runwatch.cli.log import open_readonly, warn_torn
    from runwatch.folds import processor_folds
    from runwatch.hosting.embedded import replay
    from stream_processors.detectors import CatalogError

    if args.workers < 1:
        raise Abort("--workers must be at least 1")
    log = open_readonly(args.log)
    tails = log.torn_tails()
    warn_torn(tails, term)
    try:
        folds = processor_folds(args.catalog, prices=args.prices)
    except (CatalogError, ValueError) as exc:
        raise Abort(str(exc)) from None
    count = 0
    for event in replay(log, folds):
        count += 1
        if args.json:
            term.out.write(encode(event).decode() + "\n")
        else:
            term.info(_summary(event))
    # the projections (run states, accounting) from the same log: projections/replay.py
    from projections.replay import replay_projections

    try:
        projected = replay_projections(
            args.log, args.store, args.policy, args.prices, workers=args.workers
        )
    except (ValueError, BrokenProcessPool) as exc:
        raise Abort(str(exc) or f"a replay worker died ({type(exc).__name__})") from None
    for event in projected.derived:
        count += 1
        if args.json:
            term.out.write(encode(event).decode() + "\n")
        else:
            term.info(_summary(event))
    if args.json:
        for tail in tails:
            term.json({"torn_tail": tail.as_dict()})
    else:
        term.info(f"{count} derived events from {args.log}")
        term.info(f"projections: {json.dumps(projected.summary())}")
    return 0


def _summary(event: object) -> str:
    doc = json.loads(event.model_dump_json())  # type: ignore[attr-defined]
    parts = [doc["type"], doc["run_id"], f"step={doc.get('step')}"]
    for key in ("detector", "routing", "to_state", "reason"):
        if key in doc:
            parts.append(f"{key}={doc[key]}")
    return "  ".join(str(p) for p in parts)

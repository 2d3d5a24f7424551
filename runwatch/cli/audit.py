"""``runwatch audit verify``: compare a live projection with a from-scratch replay.

``runwatch audit verify --store PROJECTIONS.sqlite --log LOG`` replays the embedded log
(``runwatch log export`` output, or the live embedded log itself) from offset 0 up to the
positions the store says it has consumed, and compares the two projections (every run
view, every series point, fleet aggregates, tenant totals). Exit 0 when identical; exit 1
with the first difference (its JSON path and both values) otherwise. The log is opened
read-only: a torn tail is skipped, left in place and reported (stderr, ``torn_tails``).
"""

from __future__ import annotations

import argparse
import asyncio
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from runwatch import settings
from runwatch.cli.broker_flag import kafka_flag
from runwatch.cli.terminal import Abort, Terminal

HELP = "verify a live projection against a from-scratch replay"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="audit_command", metavar="ACTION", required=True)
    v = sub.add_parser("verify", help="replay the log and compare with the live projection")
    v.add_argument("--store", required=True, help="the live projection (SQLite read model)")
    v.add_argument("--log", help="embedded log directory (default: $RUNWATCH_LOG_DIR)")
    v.add_argument(
        "--kafka",
        nargs="?",
        const="",
        metavar="BOOTSTRAP",
        help="replay from the broker's topics instead (for a store fed from Kafka)",
    )
    v.add_argument("--policy", help="run-state policy YAML the live projection uses")
    v.add_argument("--prices", help="prices YAML the live projection uses")
    v.add_argument(
        "--workers",
        type=int,
        default=1,
        help="replay with N key-sharded processes (embedded log only; default 1)",
    )
    v.add_argument("--json", action="store_true", help="one JSON object on stdout")


async def _verify_kafka(live, bootstrap, policy, prices):  # type: ignore[no-untyped-def]
    from events.log.kafka import KafkaLog
    from runwatch.hosting.audit import verify_backend

    backend = KafkaLog(bootstrap, client_id="runwatch-audit", create_registry_topics=False)
    await backend.start()
    try:
        return await verify_backend(live, backend, policy=policy, prices=prices)
    finally:
        await backend.close()


def run(args: argparse.Namespace, term: Terminal) -> int:
    from projections.policy import RunStatePolicy
    from projections.sqlite_store import SqliteReadModel
    from stream_processors.accounting import Prices

    store_path = Path(args.store)
    if not store_path.is_file():
        raise Abort(f"no projection store at {store_path}")
    try:
        policy, prices = RunStatePolicy.load(args.policy), Prices.load(args.prices)
    except ValueError as exc:
        raise Abort(str(exc)) from None
    if args.workers < 1:
        raise Abort("--workers must be at least 1")
    try:
        live = SqliteReadModel(store_path)
    except ValueError as exc:
        raise Abort(str(exc)) from None
    tails: list[dict[str, object]] = []
    if args.kafka is not None:
        if args.workers > 1:
            raise Abort("--workers applies to an embedded log; a Kafka replay is one process")
        bootstrap = kafka_flag(args.kafka)
        result = asyncio.run(_verify_kafka(live, bootstrap, policy, prices))
    else:
        result, tails = _verify_log(args, term, live, policy, prices)
    return _report(args, term, result, tails)


def _verify_log(args, term, live, policy, prices):  # type: ignore[no-untyped-def]
    """:func:`runwatch.hosting.audit.verify` against the embedded log (read-only); the
    verification and the torn tails it skipped."""
    from runwatch.cli.log import open_readonly, warn_torn
    from runwatch.hosting.audit import verify

    log_dir = settings.log_dir(args.log)
    if not log_dir.is_dir():
        raise Abort(f"no embedded log at {log_dir}")
    if any(not key.endswith(":0") for key in live.positions()):
        raise Abort("this store was fed from Kafka (partitioned positions): use --kafka BOOTSTRAP")
    log = open_readonly(log_dir)
    found = log.torn_tails()
    warn_torn(found, term)
    try:
        result = verify(live, log, policy=policy, prices=prices, workers=args.workers)
    except (ValueError, BrokenProcessPool) as exc:
        raise Abort(f"replay failed: {exc}") from None
    return result, [t.as_dict() for t in found]


def _report(args, term, result, tails) -> int:  # type: ignore[no-untyped-def]
    report = {
        "identical": result.identical,
        "records_replayed": result.replay.records,
        "runs": len(result.replay.host.view.views),
        "positions": result.positions,
        "first_difference": None,
        "torn_tails": tails,
    }
    if result.difference:
        path, got, want = result.difference
        report["first_difference"] = {"path": path, "live": got, "replay": want}
    if args.json:
        term.json(report)
    elif result.identical:
        term.info(
            f"identical: {report['runs']} runs, {report['records_replayed']} records replayed "
            f"up to the live positions"
        )
    else:
        d = report["first_difference"]
        term.info(f"DIFFERENT at {d['path']}\n  live:   {d['live']!r}\n  replay: {d['replay']!r}")
    return 0 if result.identical else 1

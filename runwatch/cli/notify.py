"""``runwatch notify``: deliver customer-visible alerts and state changes to tenant webhooks.

::

    runwatch notify --log DIR --keys keys.yaml            # the embedded log
    runwatch notify --kafka [BOOTSTRAP] --keys keys.yaml  # Kafka (its own consumer group)

Webhooks are read from the keys file the query API uses (``tenants.<id>.webhook``: ``url``
and ``secret_file`` or ``secret``; a malformed one refuses to start, exit 2). The file is
watched. Runs until SIGINT/SIGTERM; its state (positions, pending retries) is
``DIR/_groups/<group>.state.json`` on the embedded log, ``--state`` (default
``runwatch-data/notifier/<group>.state.json``) on Kafka. docs/notifications.md.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from pathlib import Path

from runwatch import settings
from runwatch.cli.broker_flag import kafka_flag
from runwatch.cli.terminal import Abort, Terminal

HELP = "deliver customer alerts and state changes to tenant webhooks (signed, retried)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--log", metavar="DIR", help="embedded log (default: $RUNWATCH_LOG_DIR)")
    target.add_argument(
        "--kafka", nargs="?", const="", metavar="BOOTSTRAP", help="Kafka bootstrap servers"
    )
    parser.add_argument(
        "--keys", required=True, metavar="FILE", help="keys file with tenants' webhooks"
    )
    parser.add_argument("--state", metavar="FILE", help="state file (positions, pending retries)")
    parser.add_argument("--group", default="runwatch-notifier", help="consumer group id")
    parser.add_argument(
        "--start",
        choices=("earliest", "latest"),
        default="earliest",
        help="first start (no state yet): notify every retained fact, or only new ones",
    )
    parser.add_argument("--max-attempts", type=int, default=10, help="give up after N attempts")
    parser.add_argument("--backoff-base-s", type=float, default=1.0, help="first retry wait")
    parser.add_argument("--backoff-factor", type=float, default=3.0, help="wait multiplier")
    parser.add_argument("--backoff-max-s", type=float, default=3600.0, help="longest wait")
    parser.add_argument("--jitter", type=float, default=0.2, help="wait shortened by up to this")
    parser.add_argument("--timeout-s", type=float, default=10.0, help="per attempt")
    parser.add_argument("--max-in-flight", type=int, default=32, help="POSTs at once")
    parser.add_argument(
        "--per-tenant-in-flight", type=int, default=4, help="POSTs at once per tenant"
    )
    parser.add_argument(
        "--allow-private-webhooks",
        action="store_true",
        help="also POST to webhooks on private, loopback or link-local addresses",
    )
    parser.add_argument(
        "--metrics-port", type=int, help="serve Prometheus metrics (what was told to nobody)"
    )
    parser.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        help="address the metrics port binds (default 127.0.0.1: this host only)",
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def run(args: argparse.Namespace, term: Terminal) -> int:
    from runwatch.notifier import Notifier, NotifierSettings, WebhookBook
    from stream_processors.notify import NotifyPolicy

    try:
        book = WebhookBook(args.keys)
    except ValueError as exc:
        raise Abort(f"webhooks: {exc}", code=2) from None
    try:
        policy = NotifyPolicy(
            max_attempts=args.max_attempts,
            backoff_base_s=args.backoff_base_s,
            backoff_factor=args.backoff_factor,
            backoff_max_s=args.backoff_max_s,
            jitter=args.jitter,
        )
    except ValueError as exc:
        raise Abort(str(exc), code=2) from None
    if args.timeout_s <= 0 or args.max_in_flight < 1 or args.per_tenant_in_flight < 1:
        raise Abort("--timeout-s, --max-in-flight and --per-tenant-in-flight must be positive", 2)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="notifier: %(message)s",
    )

    if args.kafka is not None:
        bootstrap = kafka_flag(args.kafka)
        from events.log.kafka import KafkaLog

        backend = KafkaLog(bootstrap, client_id="runwatch-notifier")
        state = Path(args.state or Path("runwatch-data") / "notifier" / f"{args.group}.state.json")
        where = f"Kafka at {bootstrap}"
    else:
        from events.log.embedded import GROUPS_DIR, EmbeddedLog

        root = settings.log_dir(args.log)
        backend = EmbeddedLog(root)
        state = Path(args.state) if args.state else root / GROUPS_DIR / f"{args.group}.state.json"
        where = f"embedded log {root}"
    config = NotifierSettings(
        group_id=args.group,
        state_path=state,
        timeout_s=args.timeout_s,
        max_in_flight=args.max_in_flight,
        per_tenant_in_flight=args.per_tenant_in_flight,
        start=args.start,
        allow_private=args.allow_private_webhooks,
    )
    from runwatch.hosting.state_journal import DamagedState

    try:
        notifier = Notifier(backend, book, policy=policy, settings=config)
    except DamagedState as exc:
        raise Abort(str(exc)) from None
    if args.metrics_port is not None:
        from runwatch.notifier import start_metrics

        try:
            start_metrics(notifier, args.metrics_port, args.metrics_host)
        except OSError as exc:
            raise Abort(f"metrics port {args.metrics_host}:{args.metrics_port}: {exc}") from None
        term.progress(
            f"notifier: Prometheus metrics on "
            f"http://{args.metrics_host}:{args.metrics_port}/metrics"
        )
    tenants = ", ".join(sorted(book.hooks)) or "none"
    term.progress(f"notifier on {where}: webhooks for {tenants} (Ctrl-C to stop)")

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await backend.start()
        try:
            await notifier.run(stop)
        finally:
            await backend.close()

    asyncio.run(main())
    stats = notifier.stats.as_dict()
    if args.json:
        term.json(stats)
    else:
        term.info(
            f"notifier: {stats['attempts']} attempts, {stats['delivered']} delivered, "
            f"{stats['abandoned']} abandoned, {notifier.pending()} pending"
        )
    return 0

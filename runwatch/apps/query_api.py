"""``runwatch serve api``: the projections' query API, its follower and the exporter.

Assembly only (no domain logic): a durable SQLite read model, a follower thread that
tails the input topics (embedded log or Kafka) into the projection engine and commits
view + offsets together, the FastAPI app on ``--host/--port`` and, with
``--metrics-port``, the Prometheus exporter on its own port (kept off the API port so the
bounded tenant labels are only visible to whoever can reach the scrape port).
"""

from __future__ import annotations

import argparse
import asyncio
import threading
from pathlib import Path

from runwatch import settings
from runwatch.cli.terminal import Abort, Terminal

DEFAULT_STORE = Path("runwatch-data") / "projections.sqlite"


def add_api_arguments(api: argparse.ArgumentParser) -> None:
    """Options of ``serve api`` beyond host/port/--kafka/--log (serve.py adds those)."""
    api.add_argument("--keys", required=True, help="API keys file (YAML: key -> tenant/operator)")
    api.add_argument("--store", default=str(DEFAULT_STORE), help="SQLite read model file")
    api.add_argument("--policy", help="run-state policy YAML (default: packaged)")
    api.add_argument("--prices", help="prices YAML (default: packaged)")
    api.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    api.add_argument("--top-tenants", type=int, default=10, help="tenant label bound (+ other)")
    api.add_argument("--no-follow", action="store_true", help="serve the store, do not tail")
    api.add_argument("--publish", action="store_true", help="append derived events to the log")
    api.add_argument("--settle-s", type=float, default=1.0, help="terminal-barrier settle time")
    api.add_argument(
        "--group", help="consumer group (default: derived from the store, one group per store)"
    )


def _open_backend(kafka: str | None, log_dir: str | None):  # type: ignore[no-untyped-def]
    if kafka:
        from events.log.kafka import KafkaLog

        return KafkaLog(kafka, client_id="runwatch-projections")
    from events.log.embedded import EmbeddedLog

    return EmbeddedLog(settings.log_dir(log_dir))


def start_follower(backend, engine, settle_s, publish, term, group_id):  # type: ignore[no-untyped-def]
    """Run :func:`projections.feed.follow` on a thread of its own; returns (thread, stop)."""
    from projections.feed import follow

    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    async def main() -> None:
        await backend.start()
        try:
            await follow(
                backend,
                engine,
                stop,
                group_id=group_id,
                publish_to=backend if publish else None,
                settle_s=settle_s,
            )
        finally:
            await backend.close()

    def target() -> None:
        try:
            loop.run_until_complete(main())
        except Exception as exc:  # the API keeps serving the last committed view
            term.error(f"projection follower stopped: {exc!r}")

    thread = threading.Thread(target=target, name="projection-follower", daemon=True)
    thread.start()

    def request_stop() -> None:
        loop.call_soon_threadsafe(stop.set)

    return thread, request_stop


def serve(args: argparse.Namespace, term: Terminal) -> int:
    import uvicorn
    from prometheus_client import start_http_server

    from projections.api import create_app
    from projections.engine import ProjectionEngine
    from projections.exporter import make_registry
    from projections.keys import ApiKeys
    from projections.policy import Prices, RunStatePolicy
    from projections.store import SqliteReadModel

    try:
        keys = ApiKeys.load(args.keys)
        policy = RunStatePolicy.load(args.policy)
        prices = Prices.load(args.prices)
    except ValueError as exc:
        raise Abort(str(exc)) from None
    store = SqliteReadModel(args.store)
    stop_follower = None
    if not args.no_follow:
        kafka = None
        if args.kafka is not None:
            kafka = settings.kafka_bootstrap(args.kafka or None)
            if not kafka:
                raise Abort("--kafka given but no broker configured (pass BOOTSTRAP)")
        engine = ProjectionEngine(SqliteReadModel(args.store), policy, prices)
        backend = _open_backend(kafka, args.log)
        where = f"Kafka at {kafka}" if kafka else f"embedded log {settings.log_dir(args.log)}"
        term.progress(f"projections: following {where} into {args.store}")
        group = args.group or f"runwatch-projections-{store.instance_id()[:12]}"
        _, stop_follower = start_follower(backend, engine, args.settle_s, args.publish, term, group)
    if args.metrics_port is not None:
        start_http_server(args.metrics_port, registry=make_registry(store, args.top_tenants))
        term.progress(f"projections: Prometheus metrics on :{args.metrics_port}/metrics")
    term.progress(f"query API on http://{args.host}:{args.port} (OpenAPI at /docs)")
    try:
        uvicorn.run(create_app(store, keys), host=args.host, port=args.port, log_level="warning")
    finally:
        if stop_follower:
            stop_follower()
    return 0

"""``runwatch serve api``: the projections' query API, its follower and the exporter.

Assembly only (no domain logic): a durable SQLite read model, a follower thread that
tails the input topics (embedded log or Kafka) into the projection engine and commits
view + offsets together, the FastAPI app on ``--host/--port`` and, with
``--metrics-port``, the Prometheus exporter on its own port (kept off the API port so the
bounded tenant labels are only visible to whoever can reach the scrape port): on
``--metrics-host`` (default 127.0.0.1, like the API; bind wider only on purpose) and, with
``--metrics-token-file``, only for ``Authorization: Bearer <token>``.

The keys file is watched (see :mod:`projections.keys`): an edit applies at the next
request; SIGHUP reads it at once and says so on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import signal
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
    api.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        help="address the metrics port binds (default 127.0.0.1: this host only; tenant names "
        "and spend are in the series, so bind wider, e.g. 0.0.0.0, only on purpose)",
    )
    api.add_argument(
        "--metrics-token-file",
        help="require 'Authorization: Bearer <token>' on the metrics port; the token is the "
        "file's first line (Prometheus: authorization.credentials_file)",
    )
    api.add_argument("--top-tenants", type=int, default=10, help="tenant label bound (+ other)")
    api.add_argument("--no-follow", action="store_true", help="serve the store, do not tail")
    api.add_argument("--publish", action="store_true", help="append derived events to the log")
    api.add_argument(
        "--no-commands",
        dest="commands",
        action="store_false",
        help="refuse pause/resume/cancel (by default they are written to the log's control "
        "topic: customers resume/cancel their own runs, operators any run)",
    )
    api.add_argument("--settle-s", type=float, default=1.0, help="terminal-barrier settle time")
    api.add_argument(
        "--group", help="consumer group (default: derived from the store, one group per store)"
    )


def _open_backend(kafka: str | None, log_dir: str | None, readonly: bool = False):  # type: ignore[no-untyped-def]
    if kafka:
        from events.log.kafka import KafkaLog

        return KafkaLog(kafka, client_id="runwatch-projections")
    from events.log.embedded import EmbeddedLog

    # a follower that does not --publish only reads: it never repairs nor writes the log
    return EmbeddedLog(settings.log_dir(log_dir), readonly=readonly)


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


def read_token(path: str) -> str:
    """The bearer token: the first line of ``path`` (a ``ValueError`` if none)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ValueError(f"metrics token file not readable: {path} ({exc.strerror})") from None
    token = text.splitlines()[0].strip() if text.strip() else ""
    if not token:
        raise ValueError(f"metrics token file is empty: {path}")
    return token


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def watch_keys(keys, term: Terminal) -> None:  # type: ignore[no-untyped-def]
    """Report key-file reloads on stderr, and read the file again on SIGHUP."""
    logger = logging.getLogger("runwatch.keys")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("keys: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False

    def reload_now() -> None:
        changed = keys.reload()
        if keys.error:
            term.error(f"SIGHUP: API keys not reloaded: {keys.error}; keeping the previous keys")
        else:
            term.progress(f"SIGHUP: API keys {'reloaded' if changed else 'unchanged'}")

    def on_hup(signum, frame):  # type: ignore[no-untyped-def]
        keys.request_reload()
        # never take the keys' lock inside the handler: it may have interrupted a holder
        threading.Thread(target=reload_now, name="keys-reload", daemon=True).start()

    if hasattr(signal, "SIGHUP") and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGHUP, on_hup)


def _command_sink(args: argparse.Namespace, term: Terminal):  # type: ignore[no-untyped-def]
    """Where the API writes commands: the followed log's control topic."""
    if args.kafka is not None:
        from producers.sinks import KafkaSink

        kafka = settings.kafka_bootstrap(args.kafka or None)
        term.progress(f"commands: written to runwatch.control on Kafka at {kafka}")
        return KafkaSink(str(kafka))
    from events.log.embedded import EmbeddedLog
    from producers.sinks import EmbeddedSink

    log_dir = settings.log_dir(args.log)
    term.progress(f"commands: written to runwatch.control in {log_dir}")
    # an unopened writable log: appends touch (and lock) only the control topic
    return EmbeddedSink(EmbeddedLog(log_dir))


def build_app(store, keys, commands=None):  # type: ignore[no-untyped-def]
    """The query API app as served: :func:`projections.api.create_app` with the 422
    handler that renders any input (:mod:`runwatch.apps.http_errors`)."""
    from projections.api import create_app
    from runwatch.apps.http_errors import install

    return install(create_app(store, keys, commands=commands))


def serve(args: argparse.Namespace, term: Terminal) -> int:
    import uvicorn

    from projections.engine import ProjectionEngine
    from projections.exporter import make_registry, start_metrics_server
    from projections.keys import ApiKeys
    from projections.policy import Prices, RunStatePolicy
    from projections.store import SqliteReadModel

    try:
        keys = ApiKeys.load(args.keys)
        policy = RunStatePolicy.load(args.policy)
        prices = Prices.load(args.prices)
        token = read_token(args.metrics_token_file) if args.metrics_token_file else None
    except ValueError as exc:
        raise Abort(str(exc)) from None
    watch_keys(keys, term)
    store = SqliteReadModel(args.store)
    stop_follower = None
    if not args.no_follow:
        kafka = None
        if args.kafka is not None:
            kafka = settings.kafka_bootstrap(args.kafka or None)
            if not kafka:
                raise Abort("--kafka given but no broker configured (pass BOOTSTRAP)")
        engine = ProjectionEngine(SqliteReadModel(args.store), policy, prices)
        backend = _open_backend(kafka, args.log, readonly=not args.publish)
        for tail in [] if kafka else backend.torn_tails():  # skipped by the follower, kept
            term.warn(tail.describe())
        where = f"Kafka at {kafka}" if kafka else f"embedded log {settings.log_dir(args.log)}"
        term.progress(f"projections: following {where} into {args.store}")
        group = args.group or f"runwatch-projections-{store.instance_id()[:12]}"
        _, stop_follower = start_follower(backend, engine, args.settle_s, args.publish, term, group)
    if args.metrics_port is not None:
        registry = make_registry(store, args.top_tenants)
        try:
            start_metrics_server(registry, args.metrics_port, args.metrics_host, token)
        except OSError as exc:
            if stop_follower:
                stop_follower()
            raise Abort(f"metrics port {args.metrics_host}:{args.metrics_port}: {exc}") from None
        auth = "bearer token required" if token else "no auth"
        term.progress(
            f"projections: Prometheus metrics on "
            f"http://{args.metrics_host}:{args.metrics_port}/metrics ({auth})"
        )
        if token is None and not is_loopback(args.metrics_host):
            term.warn(
                f"metrics bound to {args.metrics_host} without --metrics-token-file: whoever "
                "reaches that port reads tenant names and spend"
            )
    commands = _command_sink(args, term) if args.commands and not args.no_follow else None
    term.progress(f"query API on http://{args.host}:{args.port} (OpenAPI at /docs)")
    try:
        app = build_app(store, keys, commands=commands)
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    finally:
        if stop_follower:
            stop_follower()
    return 0

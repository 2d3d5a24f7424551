"""``runwatch serve api``: the projections' query API, its follower and the exporter.

A durable SQLite read model, a follower thread that tails the input topics (embedded log
or Kafka) into it (views + offsets committed together), the FastAPI app on
``--host/--port`` and, with ``--metrics-port``, the Prometheus exporter on its own port
(kept off the API port so the bounded tenant labels are only visible to whoever can reach
the scrape port): on ``--metrics-host`` (default 127.0.0.1, like the API; bind wider only
on purpose) and, with ``--metrics-token-file``, only for ``Authorization: Bearer
<token>``. The pieces are :mod:`runwatch.apps.query_api`'s.

The keys file is watched (see :mod:`projections.keys`): an edit applies at the next
request; SIGHUP reads it at once and says so on stderr.

The follower retries whatever stops it (a full descriptor table, a broker away, a locked
store), logging each failure, and ``/healthz`` answers 503 once it made no progress for
``--follower-stall-s`` seconds. Connections are bounded as for every runwatch server
(:mod:`runwatch.apps.serving`: ``--limit-concurrency``, ``--header-timeout-s``,
``--keep-alive-s``; the open-files limit raised at startup); request bodies need a valid
key and stay under 64 KiB; each principal's commands are rate-limited (``--command-rate``,
``--command-burst``), and each tenant's reads (``--read-rate``, ``--read-burst``: read
tokens, a token a request plus one per 30 runs it loads; :mod:`projections.api`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from runwatch import settings
from runwatch.cli.broker_flag import kafka_flag
from runwatch.cli.terminal import Abort, Terminal

DEFAULT_STORE = Path("runwatch-data") / "projections.sqlite"
#: Defaults shown in --help (the same figures as projections.api's and the follower's,
#: kept here so parsing the command line imports neither).
STALL_S = 30.0
COMMAND_RATE = 10.0
COMMAND_BURST = 20
READ_RATE = 100.0
READ_BURST = 1_000


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
    api.add_argument(
        "--follower-stall-s",
        type=float,
        default=STALL_S,
        metavar="S",
        help=f"/healthz answers 503 once the follower made no progress this long (default "
        f"{STALL_S:g})",
    )
    api.add_argument(
        "--command-rate",
        type=float,
        default=COMMAND_RATE,
        metavar="PER_S",
        help=f"commands per second each tenant or operator key may send, sustained; 429 "
        f"beyond (default {COMMAND_RATE:g}; 0: no limit)",
    )
    api.add_argument(
        "--command-burst",
        type=int,
        default=COMMAND_BURST,
        metavar="N",
        help=f"commands each tenant or operator key may send at once (default {COMMAND_BURST})",
    )
    api.add_argument(
        "--read-rate",
        type=float,
        default=READ_RATE,
        metavar="PER_S",
        help=f"read tokens per second each tenant may spend, sustained (a token a request, "
        f"plus one per 30 runs it loads: ~1 ms of the event loop each); 429 beyond "
        f"(default {READ_RATE:g}; 0: no limit)",
    )
    api.add_argument(
        "--read-burst",
        type=int,
        default=READ_BURST,
        metavar="N",
        help=f"read tokens each tenant may spend at once (default {READ_BURST})",
    )
    from runwatch.apps.serving import add_arguments as add_serving_arguments

    add_serving_arguments(api)


def serve(args: argparse.Namespace, term: Terminal) -> int:
    from projections.keys import ApiKeys
    from projections.policy import RunStatePolicy
    from projections.sqlite_store import SqliteReadModel
    from runwatch.apps import serving
    from runwatch.apps.query_api import build_app, read_token, watch_keys
    from stream_processors.accounting import Prices

    if args.follower_stall_s <= 0:
        raise Abort("--follower-stall-s must be positive")
    if args.command_rate < 0 or args.command_burst < 1:
        raise Abort("--command-rate must be at least 0 and --command-burst at least 1")
    if args.read_rate < 0 or args.read_burst < 1:
        raise Abort("--read-rate must be at least 0 and --read-burst at least 1")
    try:
        keys = ApiKeys.load(args.keys)
        policy, prices = RunStatePolicy.load(args.policy), Prices.load(args.prices)
        token = read_token(args.metrics_token_file) if args.metrics_token_file else None
    except ValueError as exc:
        raise Abort(str(exc)) from None
    watch_keys(keys, term.progress, term.error)
    try:
        store = SqliteReadModel(args.store)
    except ValueError as exc:
        raise Abort(str(exc)) from None
    follower = None if args.no_follow else _follow(args, term, store, (policy, prices))
    try:
        if args.metrics_port is not None:
            _metrics(args, term, store, token)
        commands = _command_sink(args, term) if args.commands and not args.no_follow else None
        term.progress(f"query API on http://{args.host}:{args.port} (OpenAPI at /docs)")
        app = build_app(
            store,
            keys,
            commands=commands,
            health=follower.health.problem if follower is not None else None,
            command_rate=args.command_rate or None,
            command_burst=args.command_burst,
            read_rate=args.read_rate or None,
            read_burst=args.read_burst,
        )
        serving.serve(
            app, args.host, args.port, args, term.progress, term.warn, log_level="warning"
        )
    finally:
        if follower is not None:
            follower.stop()
    return 0


def _follow(args: argparse.Namespace, term: Terminal, store: object, config: tuple):  # type: ignore[no-untyped-def,type-arg]
    """The follower thread of the store (``config``: the policy and the prices): a
    :class:`runwatch.apps.query_api.Follower`."""
    from projections.sqlite_store import SqliteReadModel
    from runwatch.apps.query_api import open_backend, start_follower
    from runwatch.hosting.read_model import read_model_host

    policy, prices = config
    kafka = kafka_flag(args.kafka)
    log_dir = settings.log_dir(args.log)
    if not kafka:  # what the follower skips, and keeps
        for tail in open_backend(None, log_dir, readonly=not args.publish).torn_tails():
            term.warn(tail.describe())
    where = f"Kafka at {kafka}" if kafka else f"embedded log {log_dir}"
    term.progress(f"projections: following {where} into {args.store}")
    group = args.group or f"runwatch-projections-{store.instance_id()[:12]}"  # type: ignore[attr-defined]
    # the first host here, so a store or policy that cannot be folded stops the command;
    # a retry resumes a fresh one from the store's last commit
    hosts = [read_model_host(SqliteReadModel(args.store), policy, prices)]

    def open_host():  # type: ignore[no-untyped-def]
        return (
            hosts.pop() if hosts else read_model_host(SqliteReadModel(args.store), policy, prices)
        )

    return start_follower(
        lambda: open_backend(kafka, log_dir, readonly=not args.publish),
        open_host,
        args.settle_s,
        args.publish,
        group,
        term.error,
        term.progress,
        stall_s=args.follower_stall_s,
    )


def _metrics(args: argparse.Namespace, term: Terminal, store: object, token: str | None) -> None:
    from projections.exporter import make_registry, start_metrics_server
    from runwatch.apps.query_api import is_loopback

    registry = make_registry(store, args.top_tenants)
    try:
        start_metrics_server(registry, args.metrics_port, args.metrics_host, token)
    except OSError as exc:
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


def _command_sink(args: argparse.Namespace, term: Terminal):  # type: ignore[no-untyped-def]
    """Where the API writes commands: the followed log's control topic."""
    from runwatch.apps.query_api import command_sink

    if args.kafka is not None:
        kafka = settings.kafka_bootstrap(args.kafka or None)
        term.progress(f"commands: written to runwatch.control on Kafka at {kafka}")
        return command_sink(str(kafka), settings.log_dir(args.log))
    log_dir = settings.log_dir(args.log)
    term.progress(f"commands: written to runwatch.control in {log_dir}")
    return command_sink(None, log_dir)

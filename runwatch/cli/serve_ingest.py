"""``runwatch serve ingest``: the ingest gateway for customers' hooks.

``runwatch serve ingest --keys keys.yaml [--kafka [BOOTSTRAP] | --log DIR] [--host H]
[--port P]``: the app of :mod:`runwatch.apps.ingest_app` on ``--host/--port`` (default
127.0.0.1:8790), appending to Kafka or the embedded log. Hooks then take
``gateway=http://H:P`` and a tenant's API key instead of broker credentials
(``docs/hooks.md``). Each tenant's writes and reads are rate-limited (``--record-rate``,
``--record-burst``, ``--byte-rate``, ``--byte-burst``, ``--read-rate``, ``--read-burst``:
429 with ``Retry-After`` beyond; a burst holds at least one whole request).
``--cursor-secret-file F``: the secret that seals read cursors (its bytes, 16 to 4096, a
final newline dropped;
every replica serving the same hooks needs the same; without it a fresh one each start,
and hooks read from the start again after a restart).
The keys file is watched as the query API's is (an edit applies at the next request;
SIGHUP reads it at once). Connections are bounded as for every runwatch server
(:mod:`runwatch.apps.serving`).
"""

from __future__ import annotations

import argparse

from runwatch import settings
from runwatch.cli.broker_flag import kafka_flag
from runwatch.cli.terminal import Abort, Terminal


def add_ingest_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``serve ingest`` (argparse only: imports nothing heavy)."""
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8790)
    parser.add_argument(
        "--kafka", nargs="?", const="", metavar="BOOTSTRAP", help="Kafka (default: embedded)"
    )
    parser.add_argument("--log", help="embedded log directory (default: $RUNWATCH_LOG_DIR)")
    parser.add_argument("--keys", required=True, help="API keys file (YAML: key -> tenant)")
    parser.add_argument(
        "--record-rate", type=float, default=5000.0, help="records a tenant may write a second"
    )
    parser.add_argument(
        "--record-burst", type=int, default=50_000, help="records a tenant may write at once"
    )
    parser.add_argument(
        "--byte-rate", type=float, default=float(5 << 20), help="bytes a tenant may write a second"
    )
    parser.add_argument(
        "--byte-burst", type=int, default=50 << 20, help="bytes a tenant may write at once"
    )
    parser.add_argument(
        "--read-rate", type=float, default=100.0, help="read requests a tenant may make a second"
    )
    parser.add_argument(
        "--read-burst", type=int, default=1000, help="read requests a tenant may make at once"
    )
    parser.add_argument(
        "--cursor-secret-file",
        help="file whose bytes seal read cursors (shared by replicas; default: fresh each start)",
    )
    from runwatch.apps.serving import add_arguments as add_serving_arguments

    add_serving_arguments(parser)


def serve(args: argparse.Namespace, term: Terminal) -> int:
    from projections.keys import ApiKeys
    from runwatch.apps import serving
    from runwatch.apps.http_errors import install
    from runwatch.apps.ingest_app import create_app
    from runwatch.apps.query_api import open_backend, watch_keys

    try:
        keys = ApiKeys.load(args.keys)
    except ValueError as exc:
        raise Abort(str(exc)) from None
    if min(args.record_rate, args.byte_rate, args.read_rate) <= 0 or args.read_burst < 1:
        raise Abort("the rates must be positive and the read burst at least 1")
    secret = _cursor_secret(args.cursor_secret_file)
    watch_keys(keys, term.progress, term.error)
    kafka = kafka_flag(args.kafka)
    log_dir = settings.log_dir(args.log)
    where = f"Kafka at {kafka}" if kafka else f"embedded log {log_dir}"
    term.progress(f"ingest gateway on http://{args.host}:{args.port}, appending to {where}")
    limits = {
        "record_rate": args.record_rate,
        "record_burst": args.record_burst,
        "byte_rate": args.byte_rate,
        "byte_burst": args.byte_burst,
        "read_rate": args.read_rate,
        "read_burst": args.read_burst,
        "cursor_secret": secret,
    }
    try:
        app = install(create_app(lambda: open_backend(kafka, log_dir), keys, **limits))
    except ValueError as exc:  # a burst below one whole request
        raise Abort(str(exc)) from None
    serving.serve(app, args.host, args.port, args, term.progress, term.warn, log_level="warning")
    return 0


def _cursor_secret(path: str | None) -> bytes | None:
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            secret = f.read((1 << 12) + 1)
    except OSError as exc:
        raise Abort(f"cannot read the cursor secret {path}: {exc.strerror}") from None
    if len(secret) > 1 << 12:
        raise Abort(f"the cursor secret in {path} is over 4 KiB: give 16 to 4096 bytes")
    secret = secret.removesuffix(b"\n")  # a text file's newline; the rest is taken as is
    if len(secret) < 16:
        raise Abort(f"the cursor secret in {path} has {len(secret)} bytes: it needs 16 or more")
    return secret

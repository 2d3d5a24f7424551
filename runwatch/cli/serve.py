"""``runwatch serve``: run an HTTP API.

- ``runwatch serve trajectories [--host H] [--port P] [--kafka [BOOTSTRAP]] [--log DIR]``:
  the Atropos-compatible trajectory API (seed 004), durable on the embedded log (default)
  or on Kafka. Several instances on one broker share one buffer; give each a distinct
  ``--instance`` (default ``host:port``) and keep it across restarts, so a restarted
  instance requeues the batches it served but never delivered. Beyond loopback it needs
  a bearer token (``--token-file`` or ``$RUNWATCH_TRAJECTORY_TOKEN``); web pages may call
  it only from ``--cors-origin`` origins (docs/trajectory-api.md, threat model).
- ``runwatch serve api``: the query API of the projections (when this build has it).
- ``runwatch serve ingest --keys FILE``: the ingest gateway through which customers' hooks
  publish and follow their runs with a tenant key, no broker credentials
  (:mod:`runwatch.cli.serve_ingest`).
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
from pathlib import Path

from runwatch import settings
from runwatch.cli.ids import identifier
from runwatch.cli.terminal import Abort, Terminal


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="serve_command", metavar="API", required=True)
    api = sub.add_parser("api", help="the projections' query API")
    api.add_argument("--host", default="127.0.0.1")
    api.add_argument("--port", type=int, default=8080)
    api.add_argument("--kafka", nargs="?", const="", help="Kafka bootstrap (default: embedded)")
    api.add_argument("--log", help="embedded log directory")
    from runwatch.cli.serve_api import add_api_arguments  # light: argparse only

    add_api_arguments(api)

    ingest = sub.add_parser("ingest", help="the ingest gateway for customers' hooks")
    from runwatch.cli.serve_ingest import add_ingest_arguments  # light: argparse only

    add_ingest_arguments(ingest)

    t = sub.add_parser("trajectories", help="the Atropos-compatible trajectory API")
    t.add_argument("--host", default="127.0.0.1")
    t.add_argument("--port", type=int, default=8000)
    t.add_argument(
        "--kafka",
        nargs="?",
        const="",
        metavar="BOOTSTRAP",
        help="use Kafka (bootstrap, or the configured broker if omitted); default: embedded",
    )
    t.add_argument("--log", help="embedded log directory (default: $RUNWATCH_LOG_DIR)")
    t.add_argument("--tenant", type=identifier, default="default", help="tenant id of the events")
    t.add_argument(
        "--run-id", type=identifier, default="atropos", help="run id: the buffer's partition key"
    )
    t.add_argument("--instance", help="stable name of this instance (default host:port)")
    t.add_argument(
        "--max-off-policy-steps",
        type=int,
        help="default staleness bound in trainer steps (envs may set their own)",
    )
    t.add_argument(
        "--max-queue-groups",
        type=int,
        default=50_000,
        help="queue cap; pushes beyond it get 503 + Retry-After",
    )
    t.add_argument(
        "--state-dir",
        help="this instance's payload cache and snapshots, so a restart resumes instead of "
        "replaying the partition (default: ./runwatch-data/trajectories/RUN/INSTANCE; "
        "'none': a temporary cache, replay on restart)",
    )
    t.add_argument(
        "--snapshot-every-s", type=float, default=5.0, help="snapshot interval (seconds)"
    )
    t.add_argument("--gzip-level", type=int, default=1, help="response gzip level (1-9)")
    t.add_argument(
        "--token-file",
        metavar="FILE",
        help=f"bearer token (the file's text) every request but /health must carry; or set "
        f"${TOKEN_ENV}. Required when --host is not loopback",
    )
    t.add_argument(
        "--cors-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="a web origin (scheme://host[:port]) whose pages may call the API; repeatable "
        "(default: none, and requests from other sites' pages are refused)",
    )
    t.add_argument(
        "--max-body-bytes",
        type=byte_size,
        metavar="SIZE",
        help="largest request body, plain or gzip-inflated (413 beyond it); K/M/G suffixes "
        "are binary (default 64M)",
    )
    t.add_argument(
        "--max-inflight-body-bytes",
        type=byte_size,
        metavar="SIZE",
        help="body bytes all requests in flight may hold together (503 + Retry-After beyond "
        "it; default 128M)",
    )
    t.add_argument(
        "--body-timeout-s",
        type=float,
        metavar="S",
        help="a request body may pause at most this long, and must arrive at 256 KiB/s "
        "beyond it (408 otherwise; default 30)",
    )
    t.add_argument(
        "--vocab-size",
        type=int,
        help="the model's vocabulary size: pushed token ids must be below it (default: "
        "only negative ids are refused)",
    )
    t.add_argument(
        "--idempotency-window",
        type=int,
        default=100_000,
        metavar="GROUPS",
        help="a push's Idempotency-Key (and, with --dedupe-content, its digests) is "
        "remembered until this many more groups were accepted; a retry within it is "
        "answered with the first push's answer and stores nothing (default 100000)",
    )
    t.add_argument(
        "--dedupe-content",
        action="store_true",
        help="store a group byte-identical to one accepted within the window once, and "
        "answer the repeat as a duplicate (for clients that send no Idempotency-Key; off "
        "by default: it also drops real repeats, see docs/trajectory-api.md)",
    )
    from runwatch.apps.serving import add_arguments as add_serving_arguments  # argparse only

    add_serving_arguments(t)  # --limit-concurrency, --keep-alive-s, --header-timeout-s


#: Environment variable holding the trajectory API's token (when --token-file is not given).
TOKEN_ENV = "RUNWATCH_TRAJECTORY_TOKEN"


def byte_size(text: str) -> int:
    """``65536``, ``64K``, ``64M``, ``1G`` (binary multiples) as bytes."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    scale = units.get(t[-1:], 1)
    try:
        value = int(t[:-1] if t[-1:] in units else t) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return value


def run(args: argparse.Namespace, term: Terminal) -> int:
    if args.serve_command == "trajectories":
        return _trajectories(args, term)
    if args.serve_command == "ingest":
        from runwatch.cli.serve_ingest import serve

        return serve(args, term)
    try:
        module = importlib.import_module("runwatch.cli.serve_api")
    except ImportError as exc:
        raise Abort(f"the query API is not part of this build ({exc})") from None
    return int(module.serve(args, term) or 0)


def _trajectories(args: argparse.Namespace, term: Terminal) -> int:
    from producers.trajectory_api.request_body import (
        BODY_TIMEOUT_S,
        MAX_BODY_BYTES,
        MAX_INFLIGHT_BODY_BYTES,
    )
    from runwatch.apps import serving
    from runwatch.apps.trajectories import TrajectoryHost, TrajectorySettings
    from runwatch.apps.trajectory_app import build_app, open_backend

    kafka = None
    if args.kafka is not None:
        kafka = settings.kafka_bootstrap(args.kafka or None)
        if not kafka:
            raise Abort(
                "--kafka given but no broker configured (pass BOOTSTRAP or run `runwatch kafka up`)"
            )
    if not 1 <= args.gzip_level <= 9:
        raise Abort("--gzip-level must be 1..9")
    max_body = args.max_body_bytes or MAX_BODY_BYTES
    max_inflight = args.max_inflight_body_bytes or max(MAX_INFLIGHT_BODY_BYTES, max_body)
    if max_inflight < max_body:
        raise Abort("--max-inflight-body-bytes must be at least --max-body-bytes")
    body_timeout_s = BODY_TIMEOUT_S if args.body_timeout_s is None else args.body_timeout_s
    if not (body_timeout_s > 0 and math.isfinite(body_timeout_s)):
        raise Abort("--body-timeout-s must be a positive number")
    if args.vocab_size is not None and args.vocab_size < 1:
        raise Abort("--vocab-size must be at least 1")
    if args.idempotency_window < 1:
        raise Abort("--idempotency-window must be at least 1")
    token = _trajectory_token(args)
    instance = args.instance or f"{args.host}:{args.port}"
    state_dir = args.state_dir
    if state_dir is None:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in instance)
        state_dir = str(Path("runwatch-data") / "trajectories" / args.run_id / safe)
    config = TrajectorySettings(
        tenant_id=args.tenant,
        run_id=args.run_id,
        instance=instance,
        max_off_policy_steps=args.max_off_policy_steps,
        max_queue_groups=args.max_queue_groups,
        vocab_size=args.vocab_size,
        token=token,
        cors_origins=tuple(args.cors_origin),
        max_body_bytes=max_body,
        max_inflight_body_bytes=max_inflight,
        body_timeout_s=body_timeout_s,
        state_dir=None if state_dir == "none" else state_dir,
        gzip_level=args.gzip_level,
        snapshot_every_s=args.snapshot_every_s,
        idempotency_window=args.idempotency_window,
        dedupe_content=args.dedupe_content,
    )
    backend = open_backend(kafka, args.log)
    where = f"Kafka at {kafka}" if kafka else f"embedded log {settings.log_dir(args.log)}"
    term.progress(
        f"trajectory API on http://{args.host}:{args.port} ({where}, run {args.run_id}, "
        f"instance {config.instance}, {'bearer token required' if token else 'no token'})"
    )
    app = build_app(TrajectoryHost(backend, config))
    serving.serve(
        app, args.host, args.port, args, term.progress, term.warn,
        log_level="warning", access_log=False,
    )  # fmt: skip
    return 0


def _trajectory_token(args: argparse.Namespace) -> str | None:
    """The token from --token-file or $RUNWATCH_TRAJECTORY_TOKEN; refuses to go on
    without one when the API would be reachable from other machines."""
    from producers.trajectory_api.access import check_token, is_loopback

    env = os.environ.get(TOKEN_ENV)
    if args.token_file and env:
        raise Abort(f"both --token-file and ${TOKEN_ENV} are set; give one")
    token = None
    if args.token_file:
        try:
            token = Path(args.token_file).read_text()
        except OSError as exc:
            raise Abort(f"cannot read --token-file: {exc}") from None
    elif env:
        token = env
    if token is not None:
        try:
            return check_token(token)
        except ValueError as exc:
            raise Abort(str(exc)) from None
    if not is_loopback(args.host):
        raise Abort(
            f"refusing to serve the trajectory API on {args.host} without a token: anyone who "
            "can reach the port could read, inject or wipe trajectories. Give --token-file "
            f"FILE (or set ${TOKEN_ENV}), or bind loopback (--host 127.0.0.1)"
        )
    return None

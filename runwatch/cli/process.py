"""``runwatch process``: run the stream processors.

- ``--log DIR`` (default ``$RUNWATCH_LOG_DIR``): the embedded host over a local log;
  ``--once`` processes what is there and exits, otherwise it follows the log until
  interrupted, printing each alert and run state change it derives as it happens (one
  line each; not with ``--json``). State and positions live in
  ``DIR/_groups/<fold>.state.json`` and the journal of commits beside it.
- ``--kafka BOOTSTRAP``: the faust-streaming app (one agent per fold, tables keyed by
  run id) as a worker on that broker, until interrupted; a static member of its consumer
  group with a 10 s session (``--instance-id``, ``--session-timeout``;
  :mod:`runwatch.hosting.membership`), so a worker killed and restarted takes its
  partitions back in seconds.

Either host serves its liveness with ``--metrics-port P`` (``--metrics-host``, default
loopback): last progress, records read, lag (:mod:`runwatch.hosting.progress`).
"""

from __future__ import annotations

import argparse
import signal
import threading
from typing import Any

from runwatch import settings
from runwatch.cli.terminal import Abort, Terminal

HELP = "run the stream processors (embedded or faust on Kafka)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--kafka", metavar="BOOTSTRAP", help="run the faust app on this broker")
    target.add_argument("--log", metavar="DIR", help="embedded log directory")
    parser.add_argument("--once", action="store_true", help="embedded: drain, then exit")
    parser.add_argument("--catalog", help="detector threshold catalog (default: packaged)")
    parser.add_argument(
        "--prices",
        help="price list the bills (and the dead-run alert's money) are priced with "
        "(default: the packaged stream_processors/accounting/prices.yaml; give the one "
        "`serve api --prices` is given, so bills and views agree)",
    )
    control = parser.add_mutually_exclusive_group()
    control.add_argument(
        "--control",
        default=True,
        metavar="POLICY",
        help="run-control policy: which alerts pause runs (default: the packaged "
        "stream_processors/control/policy.yaml)",
    )
    control.add_argument(
        "--no-control",
        dest="control",
        action="store_false",
        help="no run controller: alerts inform, nothing pauses",
    )
    parser.add_argument("--app-id", default="runwatch-processors", help="faust app id")
    parser.add_argument(
        "--instance-id",
        metavar="NAME",
        help="faust: static group membership under this id, unique among the app's live "
        "workers and kept across restarts, so a restarted worker takes its partitions back "
        "at once (default: <host>-<n>, the first slot free on this host; '' for a dynamic "
        "member)",
    )
    parser.add_argument(
        "--session-timeout",
        type=float,
        metavar="S",
        help="faust: seconds without a heartbeat before the group drops a worker (default 10)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        help="serve Prometheus metrics (last progress, records read, lag) on this port "
        "(embedded and faust)",
    )
    parser.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        help="address the metrics port binds (default 127.0.0.1: this host only)",
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def run(args: argparse.Namespace, term: Terminal) -> int:
    from runwatch.folds import processor_folds
    from stream_processors.detectors import CatalogError

    try:
        folds = processor_folds(args.catalog, control=args.control, prices=args.prices)
    except (CatalogError, ValueError) as exc:
        raise Abort(str(exc)) from None
    if args.kafka:
        from runwatch.hosting.faust_host import MetricsPortError, run_worker

        term.progress(f"faust worker {args.app_id} on {args.kafka}: {[f.name for f in folds]}")
        metrics = None if args.metrics_port is None else (args.metrics_host, args.metrics_port)
        try:
            run_worker(
                folds,
                args.kafka,
                app_id=args.app_id,
                instance_id=args.instance_id,
                session_timeout_s=args.session_timeout,
                metrics=metrics,
                on_metrics=lambda host, port: term.progress(
                    f"processors: Prometheus metrics on http://{host}:{port}/metrics"
                ),
            )
        except MetricsPortError as exc:
            raise Abort(str(exc)) from None
        return 0
    from events.log.embedded import EmbeddedLog
    from runwatch.hosting.embedded import EmbeddedHost
    from runwatch.hosting.state_journal import DamagedState

    log = EmbeddedLog(settings.log_dir(args.log))
    log.open_sync()
    try:
        host = EmbeddedHost(log, folds)
    except DamagedState as exc:
        raise Abort(str(exc)) from None
    if args.metrics_port is not None:
        from projections.exporter import start_metrics_server
        from runwatch.hosting.progress import make_registry

        try:
            start_metrics_server(
                make_registry(host, args.app_id, log.root), args.metrics_port, args.metrics_host
            )
        except OSError as exc:
            raise Abort(f"metrics port {args.metrics_host}:{args.metrics_port}: {exc}") from None
        term.progress(
            f"processors: Prometheus metrics on "
            f"http://{args.metrics_host}:{args.metrics_port}/metrics"
        )
    if args.once:
        stats = host.run_once()
    else:
        stop = threading.Event()
        host.stop = stop  # a pass ends after its batch is committed: SIGTERM within a batch
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        term.progress(f"processing {log.root} (Ctrl-C to stop)")
        try:
            stats = _follow(host, log, stop, None if args.json else term)
        except KeyboardInterrupt:
            stats = host.stats
    if args.json:
        term.json(stats.as_dict())
    else:
        term.info(
            f"processed {stats.records} records ({stats.duplicates} duplicates, "
            f"{stats.dead_letters} dead letters); derived {stats.derived}"
        )
    return 0


#: Topics whose new records ``process`` prints while it follows a log.
LIVE_TOPICS = ("runwatch.alerts", "runwatch.run-states")


def _follow(host: Any, log: Any, stop: threading.Event, term: Terminal | None) -> Any:
    """Run the host until ``stop``; print the alerts and state changes derived meanwhile
    (those already on the log when it starts are not repeated)."""
    from events.codec import decode
    from events.envelope import EventBase

    positions = {t: log.end_offset_sync(t) if (log.root / t).is_dir() else 0 for t in LIVE_TOPICS}
    while not stop.is_set():
        host.run_once()
        if term is not None:
            for topic in LIVE_TOPICS:
                if not (log.root / topic).is_dir():
                    continue
                for rec in log.read_sync(topic, positions[topic]):
                    positions[topic] = rec.offset + 1
                    ev = decode(rec.value)
                    if isinstance(ev, EventBase):
                        term.line(_live_line(ev))
                term.out.flush()
        stop.wait(0.2)
    return host.stats


def _live_line(ev: Any) -> str:
    at = f"step {ev.step}" if ev.step is not None else "-"
    if ev.type == "AlertFired":
        return f"ALERT    {ev.routing:<8} {ev.detector} run {ev.run_id} {at}: {ev.reason}"
    if ev.type == "AlertResolved":
        return f"RESOLVED {ev.detector} run {ev.run_id} {at}: {ev.reason}"
    if ev.type == "RunStateChanged":
        return f"STATE    {ev.from_state} -> {ev.to_state} run {ev.run_id} {at}: {ev.reason}"
    return f"{ev.type} run {ev.run_id} {at}"

"""The faust host: the processors' folds as a faust worker over Kafka (the production engine).

:func:`run_worker` declares the topics and every table's changelog, assembles the topology
(:mod:`runwatch.hosting.faust_topology`: topics -> agents -> tables -> sinks; each agent
is :mod:`runwatch.hosting.faust_agent`'s) and runs it as a static member of its consumer
group (:mod:`runwatch.hosting.membership`). With ``metrics`` it serves the worker's
liveness on ``/metrics`` (:mod:`runwatch.hosting.progress`) from a thread of its own, bound
before the worker starts; faust's own web server stays off (``web_enabled=False``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from events.fold import Fold


def run_worker(
    folds: list[Fold[Any]],
    bootstrap: str,
    app_id: str,
    instance_id: str | None = None,
    session_timeout_s: float | None = None,
    metrics: tuple[str, int] | None = None,
    on_metrics: Callable[[str, int], None] | None = None,
) -> None:
    """Run the processors as a faust worker until SIGINT/SIGTERM (blocks).

    Group membership (:mod:`runwatch.hosting.membership`): static, under
    ``instance_id`` (None: ``<host>-<slot>``, see :func:`membership.instance_id`; "":
    a dynamic member), with a ``session_timeout_s`` session (None: 10 s).

    ``metrics``: (host, port) to serve Prometheus metrics on (last progress, records,
    lag; :class:`~runwatch.hosting.progress.FaustProgress`); :class:`MetricsPortError`
    if it cannot be bound, before the worker starts. ``on_metrics(host, port)`` is told
    once it serves."""
    import faust

    from runwatch.hosting import membership
    from runwatch.hosting.faust_topology import build_topology, datadir

    if instance_id is None:
        instance_id = membership.instance_id(app_id, Path(datadir(app_id)).parent / "slots")
    group = membership.group_settings(
        instance_id, session_timeout_s or membership.SESSION_TIMEOUT_S
    )
    ensure_topics(folds, bootstrap, app_id)
    topo = build_topology(folds, bootstrap, app_id, **group)
    if metrics is not None:
        from projections.exporter import start_metrics_server
        from runwatch.hosting.progress import make_faust_registry

        host, port = metrics
        try:
            start_metrics_server(make_faust_registry(topo.progress, app_id), port, host)
        except OSError as exc:
            raise MetricsPortError(f"metrics port {host}:{port}: {exc}") from None
        if on_metrics is not None:
            on_metrics(host, port)
    # $RUNWATCH_FAUST_LOGLEVEL=INFO shows faust's rebalances, seeks and recoveries
    loglevel = os.environ.get("RUNWATCH_FAUST_LOGLEVEL", "WARNING")
    worker = faust.Worker(topo.app, loglevel=loglevel, quiet=True)
    worker.execute_from_commandline()


class MetricsPortError(Exception):
    """The metrics port could not be bound (in use, no such address)."""


def ensure_topics(folds: list[Fold[Any]], bootstrap: str, app_id: str) -> None:
    """Create the registry topics and every table's changelog topic (compacted, with its
    source topic's partition count) and wait until the cluster shows them.

    faust would declare the changelogs itself, but asynchronously: on a fresh broker the
    first table write can then find a changelog with no partitions yet and the worker
    dies (``PartitionsMismatch``). Creating them up front removes that race."""
    import asyncio

    from events.log.kafka import KafkaLog
    from events.topics import TopicSpec, spec

    changelogs = [
        TopicSpec(
            f"{app_id}-{fold.name}-state-changelog",
            spec(fold.inputs[0]).partitions,
            "compacted",
            f"faust changelog of the {fold.name} table",
        )
        for fold in folds
    ]

    async def create() -> None:
        async with KafkaLog(bootstrap, extra_topics=changelogs):
            pass

    asyncio.run(create())

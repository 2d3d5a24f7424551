"""The faust host: the processors' folds as a faust worker over Kafka (the production engine).

:func:`run_worker` declares the topics and every table's changelog, assembles the topology
(:mod:`runwatch.hosting.faust_topology`: topics -> agents -> tables -> sinks; each agent
is :mod:`runwatch.hosting.faust_agent`'s) and runs it as a static member of its consumer
group (:mod:`runwatch.hosting.membership`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from events.fold import Fold


def run_worker(
    folds: list[Fold[Any]],
    bootstrap: str,
    app_id: str,
    instance_id: str | None = None,
    session_timeout_s: float | None = None,
) -> None:
    """Run the processors as a faust worker until SIGINT/SIGTERM (blocks).

    Group membership (:mod:`runwatch.hosting.membership`): static, under
    ``instance_id`` (None: ``<host>-<slot>``, see :func:`membership.instance_id`; "":
    a dynamic member), with a ``session_timeout_s`` session (None: 10 s)."""
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
    # $RUNWATCH_FAUST_LOGLEVEL=INFO shows faust's rebalances, seeks and recoveries
    loglevel = os.environ.get("RUNWATCH_FAUST_LOGLEVEL", "WARNING")
    worker = faust.Worker(topo.app, loglevel=loglevel, quiet=True)
    worker.execute_from_commandline()


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

"""The faust topology of the processors: topics -> fold agents -> tables -> sinks.

Built by a function apart from any ``main`` (Kafka Streams' ``createWordCountStream``
idea), so tests and the CLI assemble the same graph:

- the folds grouped by their inputs' partition count (faust needs co-partitioning: the
  registry gives every run-keyed input of a fold the same count): the run-health
  detectors, the run controller and tenant accounting (3 partitions) form one group,
  profiling (the 6 trace partitions) another;
- one source channel per group over its folds' input topics (raw bytes; the runwatch
  codec decodes, once per record whatever the number of folds reading it, so a bad
  record becomes one dead letter instead of a faust error);
- one table per fold, ``<app>-<fold>-state``, keyed by run id (raw bytes), holding the
  key's slot (:mod:`runwatch.hosting.core`), with its group's partitions;
- one agent per group (:func:`runwatch.hosting.faust_agent.fold_agent`), its input topics
  guarded against faust's restart race (:mod:`runwatch.hosting.faust_holes`: records it
  skipped after a seek are fetched again, in order, instead of committed past);
- one sink topic per output topic, raw bytes, keyed by run id;
- the worker's liveness (:class:`runwatch.hosting.progress.FaustProgress`, ``progress``):
  stamped by the agents per record and by a timer every ``CHECK_S`` that finds the
  assigned input partitions caught up; ``runwatch process --metrics-port`` exports it.

Guarantee: at-least-once (``processing_guarantee``); consumers dedupe by event id.
Stores are in memory and restored from the changelog topics on start.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import faust

from events.fold import Fold
from events.topics import DEAD_LETTER_TOPIC, TOPICS, spec
from runwatch.hosting import faust_holes
from runwatch.hosting.faust_agent import SlotCache, fold_agent
from runwatch.hosting.progress import CHECK_S, FaustProgress


@dataclass
class Topology:
    app: faust.App
    tables: dict[str, Any] = field(default_factory=dict)
    agents: dict[str, Any] = field(default_factory=dict)
    sinks: dict[str, Any] = field(default_factory=dict)
    progress: FaustProgress = field(default_factory=lambda: FaustProgress(frozenset()))


def datadir(app_id: str) -> str:
    """faust's local data directory (stores are in memory; it still writes metadata),
    kept out of the working directory: ``$RUNWATCH_FAUST_DIR`` or the user cache."""
    root = os.environ.get("RUNWATCH_FAUST_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "runwatch", "faust"
    )
    os.makedirs(root, exist_ok=True)
    return os.path.join(root, f"{app_id}-data")


def build_app(bootstrap: str, app_id: str, **conf: Any) -> faust.App:
    conf.setdefault("datadir", datadir(app_id))
    return faust.App(
        app_id,
        broker=f"kafka://{bootstrap}",
        store="memory://",
        processing_guarantee="at_least_once",
        topic_replication_factor=1,
        topic_allow_declare=True,
        key_serializer="raw",
        value_serializer="raw",
        web_enabled=False,
        broker_commit_every=100,
        broker_commit_interval=0.5,
        stream_buffer_maxsize=1024,
        **conf,
    )


def build_topology(folds: list[Fold[Any]], bootstrap: str, app_id: str, **conf: Any) -> Topology:
    app = build_app(bootstrap, app_id, **conf)
    topo = Topology(app, progress=FaustProgress(frozenset(t for f in folds for t in f.inputs)))
    topo.sinks = {
        name: app.topic(name, key_type=bytes, value_type=bytes, partitions=spec(name).partitions)
        for name in TOPICS
    }
    topo.sinks.setdefault(DEAD_LETTER_TOPIC, app.topic(DEAD_LETTER_TOPIC))
    groups: dict[int, list[Fold[Any]]] = {}
    for fold in folds:
        counts = {spec(t).partitions for t in fold.inputs}
        if len(counts) != 1:
            raise ValueError(f"fold {fold.name}: inputs {fold.inputs} differ in partitions")
        groups.setdefault(counts.pop(), []).append(fold)
    for partitions, group in groups.items():
        hosted = []
        for fold in group:
            table = app.Table(
                f"{fold.name}-state",
                default=None,
                partitions=partitions,
                key_type=bytes,
                value_type=bytes,
                help=f"slot (fold state + recent event ids) of {fold.name}, by run id",
            )
            topo.tables[fold.name] = table
            hosted.append((fold, table, SlotCache()))
        topics = sorted({t for fold in group for t in fold.inputs})
        source = app.topic(*topics, key_type=bytes, value_type=bytes)
        faust_holes.enable(app, faust_holes.Holes(frozenset(topics)))
        agent = fold_agent(app, hosted, source, topo.sinks, topo.progress)
        for fold in group:
            topo.agents[fold.name] = agent
    progress = topo.progress

    @app.timer(CHECK_S, name="runwatch.progress")
    async def check_progress() -> None:  # on the worker's loop: a wedged loop stamps nothing
        progress.check(app)

    return topo

"""The faust topology of the processors: topics -> fold agents -> tables -> sinks.

Built by a function apart from any ``main`` (Kafka Streams' ``createWordCountStream``
idea), so tests and the CLI assemble the same graph:

- one source channel per fold over its input topics (raw bytes; the runwatch codec
  decodes, so a bad record becomes a dead letter instead of a faust error);
- one table per fold, ``<app>-<fold>-state``, keyed by run id (raw bytes), holding the
  key's slot (:mod:`runwatch.hosting.core`); its partitions equal the inputs' (faust needs
  co-partitioning: the registry gives every run-keyed input the same count);
- one agent per fold (:func:`runwatch.hosting.faust_agent.fold_agent`);
- one sink topic per output topic, raw bytes, keyed by run id.

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
from runwatch.hosting.faust_agent import fold_agent


@dataclass
class Topology:
    app: faust.App
    tables: dict[str, Any] = field(default_factory=dict)
    agents: dict[str, Any] = field(default_factory=dict)
    sinks: dict[str, Any] = field(default_factory=dict)


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
    topo = Topology(app)
    topo.sinks = {
        name: app.topic(name, key_type=bytes, value_type=bytes, partitions=spec(name).partitions)
        for name in TOPICS
    }
    topo.sinks.setdefault(DEAD_LETTER_TOPIC, app.topic(DEAD_LETTER_TOPIC))
    for fold in folds:
        counts = {spec(t).partitions for t in fold.inputs}
        if len(counts) != 1:
            raise ValueError(f"fold {fold.name}: inputs {fold.inputs} differ in partitions")
        source = app.topic(*fold.inputs, key_type=bytes, value_type=bytes)
        table = app.Table(
            f"{fold.name}-state",
            default=None,
            partitions=counts.pop(),
            key_type=bytes,
            value_type=bytes,
            help=f"slot (fold state + recent event ids) of {fold.name}, by run id",
        )
        topo.tables[fold.name] = table
        topo.agents[fold.name] = fold_agent(app, fold, source, table, topo.sinks)
    return topo

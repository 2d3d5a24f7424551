"""The processors' liveness for Prometheus: ``runwatch process --metrics-port``.

Read at scrape time from the host (never from a fold): the wall clock of its last progress
(:attr:`~runwatch.hosting.embedded.EmbeddedHost.progress_ts`: a batch committed, or a pass
that found the log read to its end) and how far its read positions are behind the end of
each input topic (read through a read-only log of its own, never the host's objects). A
host that is dead is an ``up == 0`` target; one that is alive but stuck (a hung batch, a
wedged disk) shows an old timestamp and a growing lag: ``RunwatchProcessorsStalled``.

The faust worker (``runwatch process --kafka B --metrics-port P``) exports the same three
series from :class:`FaustProgress`: its agents stamp each record folded (a counter and a
timestamp, nothing else per record), a timer on the worker's event loop stamps a check that
found every assigned input partition committed to its high watermark, and the lag is read
at scrape time from the faust consumer's state (per assigned input partition: the high
watermark it last fetched less the group's committed offset), on the metrics thread.

Labels: ``app`` (one per process) and ``topic`` (the folds' input topics: a closed set).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import CollectorRegistry


class ProcessorCollector:
    def __init__(self, host: Any, app: str, log_root: str | Path) -> None:
        self.host = host  # an EmbeddedHost
        self.app = app
        self.root = Path(log_root)
        self._ends: Any = None  # a read-only EmbeddedLog, opened at the first scrape
        self._positions: dict[Any, int] = {}

    def describe(self) -> list[Metric]:
        return []

    def _end(self, topic: str) -> int:
        from events.log.embedded import EmbeddedLog

        if self._ends is None:
            self._ends = EmbeddedLog(self.root, readonly=True)
            self._ends.open_sync()
        return int(self._ends.end_offset_sync(topic))

    def collect(self) -> Iterator[Metric]:
        host = self.host
        # the host's thread moves its positions meanwhile: on a clash, the last good copy
        with contextlib.suppress(RuntimeError):
            self._positions = dict(host.host.positions)
        behind: dict[str, int] = {}
        for (topic, _partition), at in sorted(self._positions.items()):
            behind[topic] = behind.get(topic, 0) - at
        for topic in host.host.folds.topics:
            behind[topic] = behind.get(topic, 0) + self._end(topic)
        yield from liveness_series(
            self.app,
            host.progress_ts,
            host.stats.records,
            {topic: max(0, n) for topic, n in behind.items()},
            progress_help="a batch committed, or a pass that found the log read to its end",
            lag_help="Records on the processors' input topics not read yet.",
        )


def liveness_series(
    app: str,
    progress_ts: float | None,
    records: int,
    lag: dict[str, int] | None,
    *,
    progress_help: str,
    lag_help: str,
) -> Iterator[Metric]:
    """The processors' three series, one shape for both hosts: the last progress (absent
    until the first), the records read, the lag per input topic (absent when unknown)."""
    if progress_ts is not None:
        g = GaugeMetricFamily(
            "runwatch_processor_last_progress_timestamp_seconds",
            f"Wall clock of the processors' last progress: {progress_help}.",
            labels=["app"],
        )
        g.add_metric([app], progress_ts)
        yield g
    c = CounterMetricFamily(
        "runwatch_processor_records", "Records the processors read.", labels=["app"]
    )
    c.add_metric([app], records)
    yield c
    if lag is not None:
        g = GaugeMetricFamily("runwatch_processor_lag_records", lag_help, labels=["app", "topic"])
        for topic, n in sorted(lag.items()):
            g.add_metric([app, topic], n)
        yield g


def make_registry(host: Any, app: str, log_root: str | Path) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ProcessorCollector(host, app, log_root))  # type: ignore[arg-type]
    return registry


# ---- the faust worker (`runwatch process --kafka B --metrics-port P`) -----------------------

#: seconds between the worker's caught-up checks (on its own event loop)
CHECK_S = 1.0


def consumer_lag(consumer: Any, topics: frozenset[str]) -> tuple[dict[str, int], int, bool]:
    """Records on ``topics``' partitions assigned to ``consumer`` (a faust consumer) not
    committed yet: per topic, the broker's high watermark as the consumer last fetched it
    less the group's committed offset (the next record to fold). Also the number of those
    partitions assigned, and whether every one's high watermark is known (a partition not
    fetched from yet has none)."""
    behind = dict.fromkeys(topics, 0)
    assigned = 0
    known = True
    committed = consumer._committed_offset  # a defaultdict: .get, never [] (it inserts)
    for tp in consumer.assignment():
        if tp.topic not in topics:
            continue  # changelogs, sinks: not the folds' input
        assigned += 1
        high = consumer.highwater(tp)
        if high is None:
            known = False
            continue
        behind[tp.topic] += max(0, high - (committed.get(tp) or 0))
    return behind, assigned, known


class FaustProgress:
    """A faust worker's liveness, stamped on its own event loop and read at scrape time.

    Per record folded (:func:`runwatch.hosting.faust_agent.fold_agent`): one counter
    increment and one timestamp store (:meth:`folded`). Every :data:`CHECK_S` a timer on
    the worker's loop (:meth:`check`) stamps the wall clock when every input partition
    assigned to it is read and committed to its high watermark: caught up, nothing to
    read. A worker whose loop is wedged stamps nothing; one that folds nothing while
    records wait stamps nothing either, and its lag shows them."""

    def __init__(self, topics: frozenset[str]) -> None:
        self.topics = topics
        self.records = 0
        self.progress_ts: float | None = None
        #: the app's consumer, captured by :meth:`check` on the worker's loop (the
        #: collector never touches ``app.consumer``: that property creates one)
        self.consumer: Any = None
        self._lag: dict[str, int] | None = None  # the last lag read whole

    def folded(self) -> None:
        self.records += 1
        self.progress_ts = time.time()

    def check(self, app: Any) -> None:
        self.consumer = app.consumer
        if app.rebalancing:
            return
        with contextlib.suppress(Exception):  # a rebalance under our feet: next time
            behind, assigned, known = consumer_lag(self.consumer, self.topics)
            if assigned and known and not any(behind.values()):
                self.progress_ts = time.time()

    def lag(self) -> dict[str, int] | None:
        """Per input topic, records not committed yet (read from the consumer's thread's
        state at this moment; on a clash with a rebalance, the last good reading; None
        before the worker's consumer exists)."""
        if self.consumer is None:
            return None
        # the assignment changing (a rebalance), the consumer not started yet or stopping
        with contextlib.suppress(Exception):
            self._lag = consumer_lag(self.consumer, self.topics)[0]
        return self._lag


class FaustProgressCollector:
    def __init__(self, progress: FaustProgress, app: str) -> None:
        self.progress = progress
        self.app = app

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        p = self.progress
        yield from liveness_series(
            self.app,
            p.progress_ts,
            p.records,
            p.lag(),
            progress_help="a record folded, or a check that found every assigned input "
            "partition read to its end",
            lag_help="Records on the processors' input topics (their partitions assigned "
            "to this worker) not read and committed yet.",
        )


def make_faust_registry(progress: FaustProgress, app: str) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FaustProgressCollector(progress, app))  # type: ignore[arg-type]
    return registry

"""The processors' liveness for Prometheus: ``runwatch process --metrics-port`` (embedded).

Read at scrape time from the host (never from a fold): the wall clock of its last progress
(:attr:`~runwatch.hosting.embedded.EmbeddedHost.progress_ts`: a batch committed, or a pass
that found the log read to its end) and how far its read positions are behind the end of
each input topic (read through a read-only log of its own, never the host's objects). A
host that is dead is an ``up == 0`` target; one that is alive but stuck (a hung batch, a
wedged disk) shows an old timestamp and a growing lag: ``RunwatchProcessorsStalled``.

Labels: ``app`` (one per process) and ``topic`` (the folds' input topics: a closed set).
"""

from __future__ import annotations

import contextlib
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
        if host.progress_ts is not None:
            g = GaugeMetricFamily(
                "runwatch_processor_last_progress_timestamp_seconds",
                "Wall clock of the processors' last progress: a batch committed, or a pass "
                "that found the log read to its end.",
                labels=["app"],
            )
            g.add_metric([self.app], host.progress_ts)
            yield g
        c = CounterMetricFamily(
            "runwatch_processor_records", "Records the processors read.", labels=["app"]
        )
        c.add_metric([self.app], host.stats.records)
        yield c
        # the host's thread moves its positions meanwhile: on a clash, the last good copy
        with contextlib.suppress(RuntimeError):
            self._positions = dict(host.host.positions)
        behind: dict[str, int] = {}
        for (topic, _partition), at in sorted(self._positions.items()):
            behind[topic] = behind.get(topic, 0) - at
        for topic in host.host.folds.topics:
            behind[topic] = behind.get(topic, 0) + self._end(topic)
        g = GaugeMetricFamily(
            "runwatch_processor_lag_records",
            "Records on the processors' input topics not read yet.",
            labels=["app", "topic"],
        )
        for topic, n in sorted(behind.items()):
            g.add_metric([self.app, topic], max(0, n))
        yield g


def make_registry(host: Any, app: str, log_root: str | Path) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ProcessorCollector(host, app, log_root))  # type: ignore[arg-type]
    return registry

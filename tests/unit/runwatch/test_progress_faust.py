"""The faust worker's liveness (``runwatch/hosting/progress.py`` FaustProgress): the same
series, names and labels as the embedded host's, and the lag and caught-up arithmetic over
a consumer's assignment (high watermark less committed offset, input topics only).

The consumer here is a stand-in with faust's consumer surface (``assignment()``,
``highwater(tp)``, ``_committed_offset``); the real one is scraped on a real broker in
``tests/integration/test_processor_metrics_kafka.py``."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import NamedTuple

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from runwatch.hosting.progress import FaustProgress, consumer_lag, make_faust_registry
from tests.unit.runwatch.test_liveness_series import liveness_series

INPUTS = frozenset({"runwatch.trainer", "runwatch.telemetry"})


class TP(NamedTuple):
    topic: str
    partition: int


class Consumer:
    def __init__(self, high: dict[TP, int | None], committed: dict[TP, int | None]) -> None:
        self.high = high
        self._committed_offset: defaultdict[TP, int | None] = defaultdict(lambda: None)
        self._committed_offset.update(committed)

    def assignment(self) -> set[TP]:
        return set(self.high)

    def highwater(self, tp: TP) -> int | None:
        return self.high[tp]


class App:
    rebalancing = False

    def __init__(self, consumer: Consumer) -> None:
        self.consumer = consumer


def _samples(progress: FaustProgress) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(make_faust_registry(progress, "procs")).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def test_lag_is_highwater_less_committed_on_assigned_input_partitions() -> None:
    c = Consumer(
        high={
            TP("runwatch.trainer", 0): 10,
            TP("runwatch.trainer", 1): 5,
            TP("runwatch.telemetry", 0): 7,
            TP("procs-run-health-state-changelog", 0): 99,  # not an input
        },
        committed={TP("runwatch.trainer", 0): 4, TP("runwatch.trainer", 1): 5},
    )
    behind, assigned, known = consumer_lag(c, INPUTS)
    # never committed: from offset 0
    assert behind == {"runwatch.trainer": 6, "runwatch.telemetry": 7}
    assert assigned == 3 and known
    assert TP("runwatch.telemetry", 0) not in c._committed_offset  # read, never inserted


def test_a_caught_up_check_stamps_progress_only_when_every_partition_is_read() -> None:
    tp = TP("runwatch.trainer", 0)
    c = Consumer(high={tp: None}, committed={})
    p = FaustProgress(INPUTS)
    assert p.lag() is None  # no consumer yet: no lag series
    p.check(App(c))
    assert p.progress_ts is None  # high watermark unknown: not known to be caught up
    c.high[tp] = 3
    p.check(App(c))
    assert p.progress_ts is None  # 3 records waiting
    c._committed_offset[tp] = 3
    p.check(App(c))
    assert p.progress_ts is not None
    stamped = p.progress_ts
    rebalancing = App(c)
    rebalancing.rebalancing = True
    p.check(rebalancing)
    assert p.progress_ts == stamped
    # nothing assigned (more workers than partitions, or between assignments): no stamp
    idle = FaustProgress(INPUTS)
    idle.check(App(Consumer(high={}, committed={})))
    assert idle.progress_ts is None


def test_series_match_the_embedded_hosts(tmp_path: Path) -> None:
    tp = TP("runwatch.trainer", 0)
    c = Consumer(high={tp: 12}, committed={tp: 2})
    p = FaustProgress(INPUTS)
    m = _samples(p)
    assert m == {("runwatch_processor_records_total", (("app", "procs"),)): 0.0}
    p.check(App(c))
    p.folded()
    p.folded()
    m = _samples(p)
    assert m[("runwatch_processor_records_total", (("app", "procs"),))] == 2
    lag = "runwatch_processor_lag_records"
    assert m[(lag, (("app", "procs"), ("topic", tp.topic)))] == 10
    assert m[(lag, (("app", "procs"), ("topic", "runwatch.telemetry")))] == 0
    # same names and label sets as `runwatch process --log DIR --metrics-port`
    embedded = liveness_series(tmp_path)
    for name, labels in m:
        assert embedded[name] == {k for k, _ in labels}, name
    # a consumer that raises mid-rebalance: the last good reading
    c.high = {tp: 12, TP("runwatch.telemetry", 0): 1}
    del c._committed_offset[tp]

    def boom(_: TP) -> int:
        raise AssertionError("Partition is not assigned")

    c.highwater = boom  # type: ignore[method-assign]
    assert p.lag() == {"runwatch.trainer": 10, "runwatch.telemetry": 0}
